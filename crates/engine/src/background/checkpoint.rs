//! Metadata checkpoints: a consistent copy of the metadata database, written into
//! the object store, so a node with an empty data directory (or one too far behind
//! what the WAL still holds) restores the index from one object and replays only the
//! WAL written after it.
//!
//! Object format (all integers little-endian), key
//! `checkpoints/{epoch:010}-{next_seq:012}-{written_ms:013}.ckpt`: named by the
//! watermark it reflects, then by when it was written (writes that are not in the WAL,
//! such as tokens, change the database without moving the watermark), so the newest
//! sorts last:
//!
//! ```text
//! magic "PMQC" | version:u8 = 1 | reserved:[u8; 3]
//! watermark epoch:u64 | watermark next_seq:u64 | schema version:u64
//! database length:u64 | database bytes (an SQLite file)
//! crc32c:u32 of everything before it
//! ```
//!
//! Written create-only: a key is never overwritten; `AlreadyExists` (two writes in
//! one millisecond) just means a checkpoint of that moment is there. See docs/object-storage.md.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::layout::{self, CheckpointKey};
use crate::meta::{LocalIndex, Meta, Watermark, SCHEMA_VERSION};
use crate::metrics::{Counter, Desc, Exposition, Gauge, Source};

const MAGIC: &[u8; 4] = b"PMQC";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 4 + 8 * 4;
/// Checkpoints kept: the newest, and one before it in case the newest is unreadable.
const KEEP: usize = 2;

static WRITTEN: Desc = Desc::counter(
    "picomq_checkpoints_total",
    "Metadata checkpoints written into the object store.",
);
static FAILURES: Desc = Desc::counter(
    "picomq_checkpoint_failures_total",
    "Metadata checkpoints that failed to write (retried at the next interval).",
);
static LAST_BYTES: Desc = Desc::gauge(
    "picomq_checkpoint_bytes",
    "Size of the last metadata checkpoint written, in bytes.",
);
static LAST_WRITTEN: Desc = Desc::gauge(
    "picomq_checkpoint_last_timestamp_seconds",
    "When the last metadata checkpoint was written (Unix time; 0 = none yet).",
);

pub struct CheckpointStats {
    pub written: Counter,
    pub failures: Counter,
    /// Size of the last checkpoint written, in bytes.
    pub last_bytes: Gauge,
    /// Milliseconds since the Unix epoch of the last checkpoint written.
    pub last_written_ms: Gauge,
}

impl Default for CheckpointStats {
    fn default() -> Self {
        CheckpointStats {
            written: Counter::new(&WRITTEN),
            failures: Counter::new(&FAILURES),
            last_bytes: Gauge::new(&LAST_BYTES),
            last_written_ms: Gauge::new(&LAST_WRITTEN),
        }
    }
}

impl Source for CheckpointStats {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.written)
            .counter(&self.failures)
            .gauge(&self.last_bytes)
            .value(
                &LAST_WRITTEN,
                &[],
                self.last_written_ms.get() as f64 / 1000.0,
            );
    }
}

/// Checkpoints are of a local index; a store of record has none to take.
fn local_index(meta: &Meta) -> Result<&dyn LocalIndex> {
    meta.local_index().ok_or_else(|| {
        EngineError::Internal("this metadata store is not a local index: no checkpoints".into())
    })
}

fn local_writes(meta: &Meta) -> u64 {
    meta.local_index().map_or(0, |i| i.local_writes())
}

/// A checkpoint's key (see `layout`), read as the watermark it reflects.
fn key_of(watermark: Watermark, written_ms: u64) -> CheckpointKey {
    CheckpointKey {
        epoch: watermark.epoch,
        next_seq: watermark.next_seq,
        written_ms,
    }
}

fn watermark_of(key: &CheckpointKey) -> Watermark {
    Watermark {
        epoch: key.epoch,
        next_seq: key.next_seq,
    }
}

pub fn encode(w: Watermark, schema_version: i64, database: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + database.len() + 4);
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_bytes(0, 3);
    out.put_u64_le(w.epoch);
    out.put_u64_le(w.next_seq);
    out.put_u64_le(schema_version as u64);
    out.put_u64_le(database.len() as u64);
    out.put_slice(database);
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

pub struct Decoded {
    pub watermark: Watermark,
    pub schema_version: i64,
    pub database: Bytes,
}

pub fn decode(bytes: &Bytes) -> std::result::Result<Decoded, String> {
    if bytes.len() < HEADER_LEN + 4 || &bytes[..4] != MAGIC {
        return Err("not a checkpoint (bad magic or too short)".into());
    }
    if bytes[4] != VERSION {
        return Err(format!("unknown checkpoint version {}", bytes[4]));
    }
    let body_len = bytes.len() - 4;
    let crc = u32::from_le_bytes(bytes[body_len..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..body_len]) != crc {
        return Err("checksum mismatch".into());
    }
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let db_len = u64_at(32) as usize;
    if HEADER_LEN + db_len != body_len {
        return Err(format!(
            "database length {db_len} does not match the object size"
        ));
    }
    Ok(Decoded {
        watermark: Watermark {
            epoch: u64_at(8),
            next_seq: u64_at(16),
        },
        schema_version: u64_at(24) as i64,
        database: bytes.slice(HEADER_LEN..body_len),
    })
}

/// A file in the temp directory, removed when dropped (also when the task writing it
/// is aborted).
struct TempFile(PathBuf);

impl TempFile {
    fn new(what: &str) -> TempFile {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(remove_dead_processes_files);
        TempFile(std::env::temp_dir().join(format!(
            "picomq-{what}-{}-{:016x}.sqlite",
            std::process::id(),
            fastrand::u64(..)
        )))
    }
}

/// Removes the temp files of processes that no longer run: a node killed while it
/// wrote or restored a checkpoint never dropped its [`TempFile`]. Linux only (a
/// process is alive while `/proc/PID` exists); elsewhere nothing is removed.
fn remove_dead_processes_files() {
    let (Ok(entries), true) = (
        std::fs::read_dir(std::env::temp_dir()),
        std::path::Path::new("/proc/self").exists(),
    ) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("picomq-")) else {
            continue;
        };
        let Some(rest) = ["checkpoint-", "restore-"]
            .iter()
            .find_map(|what| rest.strip_prefix(what))
        else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid.filter(|&p| p != std::process::id()) {
            if rest.contains(".sqlite") && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Writes a checkpoint of `meta`; returns its watermark (`0/0` if no WAL object is
/// applied yet: a database holding only tokens) and its size.
pub async fn write(store: &dyn ObjectStore, meta: &Meta, now_ms: u64) -> Result<(Watermark, u64)> {
    let file = TempFile::new("checkpoint");
    let watermark = local_index(meta)?
        .snapshot_into(&file.0)
        .await?
        .unwrap_or_default();
    let database = tokio::fs::read(&file.0)
        .await
        .map_err(|e| EngineError::Internal(format!("reading the metadata snapshot: {e}")))?;
    drop(file);
    let object = encode(watermark, SCHEMA_VERSION, &database);
    let size = object.len() as u64;
    let key = key_of(watermark, now_ms);
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store
        .put_opts(&Path::from(key.name()), PutPayload::from(object), opts)
        .await
    {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    prune(store).await?;
    Ok((watermark, size))
}

/// Checkpoint watermarks in the store, oldest first.
async fn list(store: &dyn ObjectStore) -> Result<Vec<CheckpointKey>> {
    let mut found: Vec<CheckpointKey> = store
        .list(Some(&Path::from(layout::CHECKPOINTS)))
        .try_filter_map(|o| async move { Ok(CheckpointKey::parse(o.location.as_ref())) })
        .try_collect()
        .await?;
    found.sort();
    Ok(found)
}

/// Deletes all but the newest [`KEEP`] checkpoints.
async fn prune(store: &dyn ObjectStore) -> Result<()> {
    let found = list(store).await?;
    for old in found.iter().rev().skip(KEEP) {
        match store.delete(&Path::from(old.name())).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Restores `meta` from the newest readable checkpoint whose watermark is past
/// `after` (any, if `None`: the database is empty). Returns the restored watermark, or `None` if there is
/// no such checkpoint. Unreadable checkpoints are skipped with a warning; if every
/// candidate is unreadable this fails: the WAL below a checkpoint may be deleted, so
/// replaying without one could silently skip data.
pub async fn restore_newest(
    store: &dyn ObjectStore,
    meta: &Meta,
    after: Option<Watermark>,
) -> Result<Option<Watermark>> {
    let mut unreadable = Vec::new();
    for candidate in list(store).await?.into_iter().rev() {
        let watermark = watermark_of(&candidate);
        if after.is_some_and(|a| watermark <= a) {
            break;
        }
        let key = candidate.name();
        let bytes = match store.get(&Path::from(key.as_str())).await {
            Ok(got) => got.bytes().await?,
            // Pruned by another process between the listing and now.
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let decoded = match decode(&bytes) {
            Ok(d) if d.watermark == watermark => d,
            Ok(_) => {
                tracing::warn!(key, "checkpoint watermark does not match its key; skipped");
                unreadable.push(key);
                continue;
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "unreadable checkpoint; skipped");
                unreadable.push(key);
                continue;
            }
        };
        if decoded.schema_version > SCHEMA_VERSION {
            return Err(EngineError::Internal(format!(
                "checkpoint {key} has metadata schema {} but this binary knows only up to {SCHEMA_VERSION}: upgrade PicoMQ",
                decoded.schema_version
            )));
        }
        let file = TempFile::new("restore");
        tokio::fs::write(&file.0, &decoded.database)
            .await
            .map_err(|e| EngineError::Internal(format!("writing {key} to a temp file: {e}")))?;
        let restored = local_index(meta)?.restore_from(&file.0).await?;
        if restored.unwrap_or_default() != watermark {
            return Err(EngineError::Internal(format!(
                "checkpoint {key} restored to watermark {restored:?}, expected {watermark:?}"
            )));
        }
        tracing::info!(
            key,
            bytes = bytes.len(),
            "metadata restored from checkpoint"
        );
        return Ok(Some(watermark));
    }
    if !unreadable.is_empty() {
        return Err(EngineError::Internal(format!(
            "no readable metadata checkpoint (unreadable: {}); refusing to rebuild from a WAL that may be partly garbage-collected",
            unreadable.join(", ")
        )));
    }
    Ok(None)
}

/// The oldest checkpoint's watermark: WAL objects below it are needed by no restore
/// (every kept checkpoint is past them), so GC may delete the unreferenced ones.
pub async fn floor(store: &dyn ObjectStore) -> Result<Option<Watermark>> {
    Ok(list(store)
        .await?
        .into_iter()
        .next()
        .map(|k| watermark_of(&k)))
}

/// What the checkpoints in the store hold, as far as this node knows: the newest one's
/// state (watermark, count of local writes), and whether the one before it holds the
/// same state.
#[derive(Clone, Copy)]
struct Written {
    state: (Watermark, u64),
    twice: bool,
}

/// Writes a checkpoint at each pass while the database has changed since the last
/// one (the WAL watermark moved, or a write not derived from the WAL happened). Once
/// it stops changing, one more checkpoint of the same state: GC's floor is the older
/// of the two kept, and without it a node gone quiet would keep the WAL objects of
/// its last interval until it next wrote. The scheduler runs it only while this
/// node is the bucket's writer.
pub struct Checkpointer {
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    clock: Clock,
    written: std::sync::Mutex<Written>,
    pub stats: CheckpointStats,
}

impl Checkpointer {
    /// `last`: the watermark of the database as this node starts.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        clock: Clock,
        last: Option<Watermark>,
    ) -> Checkpointer {
        let written = std::sync::Mutex::new(Written {
            state: (last.unwrap_or_default(), local_writes(&meta)),
            twice: false,
        });
        Checkpointer {
            store,
            meta,
            clock,
            written,
            stats: CheckpointStats::default(),
        }
    }

    pub async fn pass(&self) {
        let previous = *self.written.lock().expect("checkpoint state lock");
        let local = local_writes(&self.meta);
        match self.meta.watermark().await {
            Ok(current) if (current.unwrap_or_default(), local) != previous.state => {}
            Ok(_) if !previous.twice => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "reading the metadata watermark failed");
                return;
            }
        }
        let now_ms = self.clock.now_ms();
        match write(&*self.store, &self.meta, now_ms).await {
            Ok((w, size)) => {
                let state = (w, local);
                *self.written.lock().expect("checkpoint state lock") = Written {
                    state,
                    twice: state == previous.state,
                };
                self.stats.written.inc();
                self.stats.last_bytes.set(size);
                self.stats.last_written_ms.set(now_ms);
                tracing::debug!(?w, bytes = size, "metadata checkpoint written");
            }
            Err(e) => {
                self.stats.failures.inc();
                tracing::warn!(error = %e, "writing a metadata checkpoint failed; will retry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn temp_files_of_dead_processes_are_removed_and_live_ones_kept() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("reap");
        let tmp = std::env::temp_dir();
        let name = |pid: u32, what: &str, suffix: &str| {
            tmp.join(format!(
                "picomq-{what}-{pid}-00000000deadbeef.sqlite{suffix}"
            ))
        };
        let gone = [
            name(dead, "checkpoint", ""),
            name(dead, "checkpoint", "-journal"),
            name(dead, "restore", "-wal"),
        ];
        // This process's own (an export under way) and a name not ours.
        let kept = [
            name(std::process::id(), "checkpoint", ""),
            tmp.join(format!("picomq-other-{dead}-1.sqlite")),
        ];
        for p in gone.iter().chain(&kept) {
            std::fs::write(p, b"x").unwrap();
        }
        remove_dead_processes_files();
        for p in &gone {
            assert!(!p.exists(), "{} should be removed", p.display());
        }
        for p in &kept {
            assert!(p.exists(), "{} should be kept", p.display());
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn encode_decode_round_trip_and_corruption_is_detected() {
        let w = Watermark {
            epoch: 3,
            next_seq: 17,
        };
        let bytes = encode(w, 1, b"sqlite bytes");
        let d = decode(&bytes).expect("decodes");
        assert_eq!(d.watermark, w);
        assert_eq!(d.schema_version, 1);
        assert_eq!(&d.database[..], b"sqlite bytes");
        for i in [0, 5, 9, 33, 45, bytes.len() - 1] {
            let mut bad = bytes.to_vec();
            bad[i] ^= 0x40;
            assert!(decode(&Bytes::from(bad)).is_err(), "flip at {i} undetected");
        }
        assert!(decode(&bytes.slice(..bytes.len() - 3)).is_err());
    }

    #[tokio::test]
    async fn restore_refuses_when_every_checkpoint_is_unreadable() {
        let store = object_store::memory::InMemory::new();
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        assert_eq!(restore_newest(&store, &meta, None).await.unwrap(), None);
        let w = Watermark {
            epoch: 1,
            next_seq: 4,
        };
        let mut bad = encode(w, SCHEMA_VERSION, b"not a database").to_vec();
        bad[45] ^= 1;
        store
            .put(&Path::from(key_of(w, 1).name()), PutPayload::from(bad))
            .await
            .unwrap();
        let err = restore_newest(&store, &meta, None).await.unwrap_err();
        assert!(
            err.to_string().contains("no readable metadata checkpoint"),
            "{err}"
        );
        // One already past it locally needs no checkpoint at all.
        let ahead = Watermark {
            epoch: 2,
            next_seq: 0,
        };
        assert_eq!(
            restore_newest(&store, &meta, Some(ahead)).await.unwrap(),
            None
        );
    }

    #[test]
    fn keys_sort_by_watermark_and_parse_back() {
        let a = Watermark {
            epoch: 2,
            next_seq: 999,
        };
        let b = Watermark {
            epoch: 10,
            next_seq: 0,
        };
        let k = key_of;
        assert!(k(a, 5).name() < k(b, 1).name());
        assert!(k(a, 5).name() < k(a, 10).name());
        assert!(k(a, 5) < k(a, 10) && k(a, 10) < k(b, 1));
        assert_eq!(CheckpointKey::parse(&k(a, 7).name()), Some(k(a, 7)));
        assert_eq!(watermark_of(&k(a, 7)), a);
    }
}
