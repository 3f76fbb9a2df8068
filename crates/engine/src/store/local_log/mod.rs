//! The local store's WAL: objects packed into preallocated log files.
//!
//! A `file://` store keeps most objects one file per key (object_store's
//! `LocalFileSystem`). WAL objects are different: one is written per group commit and
//! an append waits for it, so its write is the floor of every append's latency. As a
//! file per key it costs an inode, a staging name, a link and two fsyncs (file and
//! directory): 0.5-0.6 ms on the benchmark VM, more under load, and ext4 without a
//! journal then also scans recently deleted inodes on every create. Here a WAL object
//! is one `pwrite` into a log file that already exists (with its name synced), then
//! one `fdatasync`: 0.27-0.28 ms on the same disk (docs/storage.md, "The local WAL
//! log").
//!
//! Layout: `DIR/{id:020}.log`, each `segment_bytes` long (an object too large for one
//! gets a log file of its own), made ahead of need by a background thread: from an
//! emptied log kept for reuse (`DIR/{id:020}.free`, at most [`FREE_MAX`]) when there is
//! one, else a new sparse file.
//!
//! ```text
//! log    = header(64 bytes) entry* (zeros, or a reused log's old entries)
//! header = "PMQLOG02" id:u64 sealed:u8 0*7 salt:u64 zero-padding
//! entry  = "PMQE" state:u8 key_len:u16 0:u8 log_id:u64 data_len:u64 written_ms:u64
//!          data_crc:u32 header_crc:u32 key data padding-to-8
//! state  = 1 live | 2 deleted
//! ```
//!
//! `header_crc` is crc32c of the log's salt, then the entry's bytes 5..36 and its key
//! (everything but the magic, the state byte and itself); `data_crc` covers the data.
//! A log gets a new random salt whenever it is made or reused, so the old entries
//! behind a reused log's new ones (or entry-like bytes inside an object's data) never
//! read as its entries. Logs of format 1 (`PMQLOG01`, before reuse) have no salt and
//! are read as before. An entry is
//! acknowledged only after the `fdatasync` that follows its `pwrite`, and entries are
//! written in offset order under one lock, so a sync also covers every entry before
//! it. A crash can therefore only tear entries at the tail of a log, after the last
//! acknowledged one; opening stops reading a log at its first invalid entry, and
//! checks data checksums in logs that were not sealed (every log a process stopped
//! writing to is sealed once its writes are synced; the one written at a crash is
//! not). A delete rewrites the entry's state byte in place and syncs; a log whose
//! entries are all deleted is freed for reuse (or removed). Entries carry their log's
//! id, so a log file can never be mistaken for another. A read checks the entry's
//! header before and after reading its data: a log reused under a read (a delete
//! racing it, or another process writing the directory) reads as "not found", never as
//! another object's bytes.
//!
//! One process writes a log directory (`DIR/LOCK`, taken when the store opens, or at
//! its first write if another process held it then, reading the directory afresh);
//! others may open it to read, and see the objects durable when they opened it. Objects
//! written as files by earlier versions (`legacy`) stay readable, listable and
//! deletable: they are listed once when the store opens.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};

mod entry;
mod files;
#[cfg(test)]
mod tests;

use entry::*;
use files::*;

const STORE: &str = "LocalLog";
/// Logs written before recycling: entries' `header_crc` has no salt.
const LOG_MAGIC_V1: &[u8; 8] = b"PMQLOG01";
const LOG_MAGIC: &[u8; 8] = b"PMQLOG02";
const LOG_HEADER: u64 = 64;
const SEALED_AT: u64 = 16;
const SALT_AT: usize = 24;
/// Emptied logs kept for reuse (`{id}.free`); more are removed.
const FREE_MAX: usize = 4;
const ENTRY_MAGIC: &[u8; 4] = b"PMQE";
const ENTRY_HEADER: u64 = 40;
const STATE_AT: u64 = 4;
const LIVE: u8 = 1;
const DELETED: u8 = 2;
/// Keys longer than this are refused (WAL keys are ~34 bytes).
const MAX_KEY: usize = 1024;
/// How long a first write waits for another holder of the write lock to let go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Default size of one log file.
pub const SEGMENT_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy, Debug)]
struct Loc {
    log: u64,
    entry_at: u64,
    len: u64,
    written_ms: i64,
}

impl Loc {
    fn data_at(&self, key_len: usize) -> u64 {
        self.entry_at + ENTRY_HEADER + key_len as u64
    }
}

struct Log {
    file: Arc<File>,
    capacity: u64,
    /// Mixed into every entry's `header_crc` (`None`: a log of format 1). A log is
    /// given a fresh random salt each time it is made or recycled.
    salt: Option<u64>,
    /// Next entry's offset (for the log being written).
    write_at: u64,
    live: usize,
    /// Entries written but not yet synced.
    in_flight: usize,
    sealed: bool,
    /// No longer written: sealed once `in_flight` is 0, removed once `live` is 0.
    retired: bool,
    /// A sync failed: what is on disk is unknown, so the log is never sealed and the
    /// next open checks every entry's data.
    poisoned: bool,
}

struct State {
    index: BTreeMap<Path, Loc>,
    /// Keys being written (a concurrent create of the same key fails).
    pending: HashSet<Path>,
    logs: HashMap<u64, Log>,
    active: Option<u64>,
    /// A log made in the background, not yet named: the writer names it when it
    /// takes it (only the writer decides which ids exist, and the background thread
    /// must not hold the store, and so its write lock, while it works).
    spare: Option<(u64, u64, NewLog)>,
    preparing: bool,
    /// Emptied logs, renamed `{id}.free`, kept to be made into new logs: their blocks
    /// are allocated and written, so a write into one changes no file metadata and
    /// its `fdatasync` flushes data only, and no delete discards 64 MiB meanwhile.
    free: Vec<PathBuf>,
    next_id: u64,
    /// Older copies of keys written twice, found when opening: marked deleted on the
    /// first write.
    stale: Vec<Loc>,
    /// WAL objects that earlier versions wrote as files under the store's root, read
    /// through `legacy`. Listed once when opening: a create checks them without I/O.
    legacy: BTreeMap<Path, ObjectMeta>,
    /// The write lock on `DIR/LOCK`, once this process has written.
    writer: Option<File>,
}

struct Inner {
    dir: PathBuf,
    segment_bytes: u64,
    legacy: Arc<dyn ObjectStore>,
    legacy_root: PathBuf,
    state: Mutex<State>,
}

#[derive(Clone)]
pub struct LocalLogStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for LocalLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalLogStore({})", self.inner.dir.display())
    }
}

impl fmt::Display for LocalLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalLog({})", self.inner.dir.display())
    }
}

fn generic(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: e.into(),
    }
}

fn not_found(path: &Path) -> object_store::Error {
    object_store::Error::NotFound {
        path: path.to_string(),
        source: "no such object".into(),
    }
}

fn now_ms() -> i64 {
    crate::clock::Clock::system().now_ms() as i64
}

impl LocalLogStore {
    /// Opens (creating if missing) the log directory `dir`, reading every log in it.
    /// `legacy` is where WAL objects were files before (the store's root).
    pub fn open(
        dir: &FsPath,
        legacy: Arc<dyn ObjectStore>,
        legacy_root: &FsPath,
    ) -> std::io::Result<LocalLogStore> {
        LocalLogStore::open_with(dir, legacy, legacy_root, SEGMENT_BYTES)
    }

    pub fn open_with(
        dir: &FsPath,
        legacy: Arc<dyn ObjectStore>,
        legacy_root: &FsPath,
        segment_bytes: u64,
    ) -> std::io::Result<LocalLogStore> {
        assert!(segment_bytes > LOG_HEADER + ENTRY_HEADER);
        std::fs::create_dir_all(dir)?;
        // The write lock first, when free, so that what is read next is not changed
        // by another writer before this process writes.
        let lock = try_lock(dir)?;
        let mut state = load(dir, legacy_root)?;
        let store = LocalLogStore {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                segment_bytes,
                legacy,
                legacy_root: legacy_root.to_path_buf(),
                state: Mutex::new(State::empty()),
            }),
        };
        if let Some(lock) = lock {
            store.take_over(&mut state, lock)?;
        }
        *store.state() = state;
        Ok(store)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn meta(path: &Path, loc: &Loc) -> ObjectMeta {
        ObjectMeta {
            location: path.clone(),
            last_modified: chrono::DateTime::from_timestamp_millis(loc.written_ms)
                .unwrap_or_default(),
            size: loc.len,
            e_tag: Some(format!("\"{:x}-{:x}\"", loc.log, loc.entry_at)),
            version: None,
        }
    }

    /// The state, with this store as the directory's writer. If this process opened
    /// the store while another was writing it, takes the write lock now (waiting a
    /// moment for a holder that is letting go, without holding the state, so reads
    /// go on meanwhile), reads the directory afresh (the other may have written
    /// since), then takes over.
    fn writer_state(&self) -> object_store::Result<MutexGuard<'_, State>> {
        let state = self.state();
        if state.writer.is_some() {
            return Ok(state);
        }
        drop(state);
        let deadline = Instant::now() + LOCK_WAIT;
        let lock = loop {
            // Another write of this store may have taken over meanwhile.
            let state = self.state();
            if state.writer.is_some() {
                return Ok(state);
            }
            drop(state);
            if let Some(lock) = try_lock(&self.inner.dir).map_err(generic)? {
                break lock;
            }
            if Instant::now() >= deadline {
                return Err(generic(format!(
                    "{} is being written by another process",
                    self.inner.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut state = self.state();
        // The lock is per open file: no other write of this store can hold it too,
        // so the state is still a reader's.
        *state = load(&self.inner.dir, &self.inner.legacy_root).map_err(generic)?;
        self.take_over(&mut state, lock).map_err(generic)?;
        Ok(state)
    }

    /// Becomes the directory's writer: removes what a crashed writer left half done
    /// (logs being prepared, the older copy of a key written twice), frees logs
    /// with nothing live, and seals the logs it left unsealed.
    fn take_over(&self, state: &mut State, lock: File) -> std::io::Result<()> {
        state.writer = Some(lock);
        for entry in std::fs::read_dir(&self.inner.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().contains(".log.tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        for stale in std::mem::take(&mut state.stale) {
            let log = &state.logs[&stale.log];
            log.file
                .write_all_at(&[DELETED], stale.entry_at + STATE_AT)
                .and_then(|()| log.file.sync_data())?;
        }
        while state.free.len() > FREE_MAX {
            let _ = std::fs::remove_file(state.free.pop().unwrap());
        }
        let mut ids: Vec<u64> = state.logs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let log = &state.logs[&id];
            if log.live == 0 {
                self.remove_log(state, id);
            } else if !log.sealed {
                // Checked entry by entry when opened, up to its first invalid entry
                // (a write torn by a crash). Its magic is cleared first, so that once
                // sealed (headers only are read) it still ends the log.
                if log.write_at + 4 <= log.capacity {
                    log.file.write_all_at(&[0; 4], log.write_at)?;
                }
                seal(log)?;
                state.logs.get_mut(&id).unwrap().sealed = true;
            }
        }
        Ok(())
    }

    /// Starts preparing the next log in the background, unless one is ready or
    /// being made.
    fn prepare_spare(&self, state: &mut State) {
        if state.spare.is_some() || state.preparing {
            return;
        }
        state.preparing = true;
        let (id, capacity) = next_log(state, self.inner.segment_bytes, 0);
        let free = state.free.pop();
        let unused = free.clone();
        // Weak: a store dropped meanwhile (its write lock released) stays dropped.
        let inner = Arc::downgrade(&self.inner);
        let dir = self.inner.dir.clone();
        let spawned = std::thread::Builder::new()
            .name("picomq-wal-log".into())
            .spawn(move || {
                let made = make_log(&dir, id, capacity, free);
                let Some(inner) = inner.upgrade() else {
                    // The store is gone, its write lock with it: another store may
                    // be writing the directory now, and it decides which ids exist.
                    if let Ok(new) = made {
                        let _ = std::fs::remove_file(new.tmp);
                    }
                    return;
                };
                let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
                state.preparing = false;
                match made {
                    Ok(new) => state.spare = Some((id, capacity, new)),
                    Err(e) => tracing::warn!(error = %e, "preparing a WAL log file failed"),
                }
            });
        if spawned.is_err() {
            state.preparing = false;
            state.free.extend(unused);
        }
    }

    /// Writes `data` as `path` and syncs it. Blocking.
    fn put_blocking(&self, path: &Path, data: &[u8], mode: &PutMode) -> object_store::Result<Loc> {
        let key = path.as_ref();
        if key.len() > MAX_KEY {
            return Err(generic(format!("key longer than {MAX_KEY} bytes")));
        }
        let len = entry_len(key.len(), data.len() as u64);
        // Before the lock: the checksum of a large object takes a while.
        let data_crc = crc32c::crc32c(data);
        let mut state = self.writer_state()?;
        if matches!(mode, PutMode::Create)
            && (state.index.contains_key(path)
                || state.pending.contains(path)
                || state.legacy.contains_key(path))
        {
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "the object exists".into(),
            });
        }
        if LOG_HEADER + len > self.inner.segment_bytes || kept_forever(key, data) {
            // Too large for a log, or never deleted: a log file of its own.
            drop(state);
            return self.put_alone(path, data, data_crc, mode);
        }
        let id = loop {
            if let Some(id) = state.active {
                let log = &state.logs[&id];
                if log.write_at + len <= log.capacity {
                    break id;
                }
                self.retire(&mut state, id)?;
            }
            match state.spare.take() {
                Some((id, capacity, new)) => {
                    let (file, salt) = publish(&self.inner.dir, id, new).map_err(generic)?;
                    state.logs.insert(id, new_log(file, capacity, salt));
                    state.active = Some(id);
                    self.prepare_spare(&mut state);
                }
                None => {
                    // Nothing prepared (the first write, or writes outran the
                    // preparation): make one here.
                    let (id, capacity) = next_log(&mut state, self.inner.segment_bytes, len);
                    let free = state.free.pop();
                    let (file, salt) =
                        create_log(&self.inner.dir, id, capacity, free).map_err(generic)?;
                    state.logs.insert(id, new_log(file, capacity, salt));
                    state.active = Some(id);
                    self.prepare_spare(&mut state);
                }
            }
        };
        let written_ms = now_ms();
        let log = state.logs.get_mut(&id).unwrap();
        let head = encode_head(id, log.salt, key, data.len() as u64, data_crc, written_ms);
        let at = log.write_at;
        // Written under the lock, so entries reach the file in offset order and a
        // sync covers every entry before the one it follows.
        write_entry(&log.file, at, &head, data).map_err(generic)?;
        log.write_at += len;
        log.in_flight += 1;
        let file = log.file.clone();
        state.pending.insert(path.clone());
        drop(state);

        let synced = file.sync_data();
        let loc = Loc {
            log: id,
            entry_at: at,
            len: data.len() as u64,
            written_ms,
        };
        let mut state = self.state();
        state.pending.remove(path);
        let log = state.logs.get_mut(&id).unwrap();
        log.in_flight -= 1;
        if let Err(e) = synced {
            log.poisoned = true;
            if state.active == Some(id) {
                self.retire(&mut state, id)?;
            }
            return Err(generic(e));
        }
        log.live += 1;
        if log.retired && log.in_flight == 0 && !log.sealed && !log.poisoned {
            seal(log).map_err(generic)?;
            log.sealed = true;
        }
        if let Some(old) = state.index.insert(path.clone(), loc) {
            let file = self.delete_entry(&mut state, old)?;
            drop(state);
            file.sync_data().map_err(generic)?;
        }
        Ok(loc)
    }

    /// A log file holding one object.
    fn put_alone(
        &self,
        path: &Path,
        data: &[u8],
        data_crc: u32,
        mode: &PutMode,
    ) -> object_store::Result<Loc> {
        let key = path.as_ref();
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.pending.insert(path.clone());
        drop(state);
        let written_ms = now_ms();
        let capacity = LOG_HEADER + entry_len(key.len(), data.len() as u64);
        let made = create_log(&self.inner.dir, id, capacity, None).and_then(|(file, salt)| {
            let head = encode_head(id, Some(salt), key, data.len() as u64, data_crc, written_ms);
            write_entry(&file, LOG_HEADER, &head, data)?;
            file.sync_data()?;
            Ok((file, salt))
        });
        let mut state = self.state();
        state.pending.remove(path);
        let (file, salt) = made.map_err(generic)?;
        if matches!(mode, PutMode::Create) && state.index.contains_key(path) {
            drop(state);
            let _ = std::fs::remove_file(log_path(&self.inner.dir, id));
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "the object exists".into(),
            });
        }
        let mut log = new_log(file, capacity, salt);
        log.write_at = log.capacity;
        log.live = 1;
        log.retired = true;
        seal(&log).map_err(generic)?;
        log.sealed = true;
        state.logs.insert(id, log);
        let loc = Loc {
            log: id,
            entry_at: LOG_HEADER,
            len: data.len() as u64,
            written_ms,
        };
        if let Some(old) = state.index.insert(path.clone(), loc) {
            let file = self.delete_entry(&mut state, old)?;
            drop(state);
            file.sync_data().map_err(generic)?;
        }
        Ok(loc)
    }

    /// Stops writing log `id`; seals it if nothing is in flight on it.
    fn retire(&self, state: &mut State, id: u64) -> object_store::Result<()> {
        state.active = None;
        let log = state.logs.get_mut(&id).unwrap();
        log.retired = true;
        if log.in_flight == 0 && !log.sealed && !log.poisoned {
            seal(log).map_err(generic)?;
            log.sealed = true;
        }
        if log.live == 0 && log.in_flight == 0 {
            self.remove_log(state, id);
        }
        Ok(())
    }

    /// Marks `loc` deleted on disk and removes its log once nothing in it is live.
    /// Returns the log file, for the caller to sync once it has let go of the state
    /// (a sync under the lock would hold up every write). Blocking.
    fn delete_entry(&self, state: &mut State, loc: Loc) -> object_store::Result<Arc<File>> {
        let log = state.logs.get_mut(&loc.log).unwrap();
        log.file
            .write_all_at(&[DELETED], loc.entry_at + STATE_AT)
            .map_err(generic)?;
        log.live -= 1;
        let file = log.file.clone();
        if log.live == 0 && log.retired && log.in_flight == 0 {
            self.remove_log(state, loc.log);
        }
        Ok(file)
    }

    /// Lets go of emptied log `id`: kept as `{id}.free` to be made into a later log
    /// while fewer than [`FREE_MAX`] are, else removed. (Renamed without a directory
    /// sync: after a crash it may be back under its old name, empty, and is freed
    /// again.)
    fn remove_log(&self, state: &mut State, id: u64) {
        let Some(log) = state.logs.remove(&id) else {
            return;
        };
        let path = log_path(&self.inner.dir, id);
        if log.capacity == self.inner.segment_bytes && state.free.len() < FREE_MAX {
            let free = free_path(&self.inner.dir, id);
            match std::fs::rename(&path, &free) {
                Ok(()) => return state.free.push(free),
                Err(e) => tracing::warn!(error = %e, id, "keeping an emptied WAL log failed"),
            }
        }
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(error = %e, id, "removing an emptied WAL log file failed");
        }
    }

    /// Deletes `path` from the logs; `true` if it is (also) a legacy file, which the
    /// caller deletes through `legacy`.
    fn delete_blocking(&self, path: &Path) -> object_store::Result<bool> {
        let mut state = self.writer_state()?;
        let legacy = state.legacy.remove(path).is_some();
        let Some(loc) = state.index.remove(path) else {
            return Ok(legacy);
        };
        let file = self.delete_entry(&mut state, loc)?;
        drop(state);
        file.sync_data().map_err(generic)?;
        Ok(legacy)
    }

    fn read_blocking(
        &self,
        path: &Path,
        range: Option<Range<u64>>,
    ) -> Option<std::io::Result<(ObjectMeta, Range<u64>, Bytes)>> {
        let state = self.state();
        let loc = *state.index.get(path)?;
        let log = &state.logs[&loc.log];
        let (file, salt) = (log.file.clone(), log.salt);
        drop(state);
        let meta = Self::meta(path, &loc);
        let range = range.unwrap_or(0..loc.len);
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        let at = loc.data_at(path.as_ref().len()) + range.start;
        // The log may be emptied and made into a new one while this reads (a delete
        // that raced the read, or another process writing the directory this one
        // reads): the entry's header, read before and after its data, must be this
        // object's both times, or the object is gone.
        let mut read = || -> std::io::Result<Option<Bytes>> {
            let Some(before) = entry_head(&file, &loc, salt, path)? else {
                return Ok(None);
            };
            file.read_exact_at(&mut buf, at)?;
            let after = entry_head(&file, &loc, salt, path)?;
            Ok((after.as_ref() == Some(&before)).then(|| Bytes::from(std::mem::take(&mut buf))))
        };
        match read() {
            Ok(Some(data)) => Some(Ok((meta, range, data))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Objects under `prefix`, in key order: the logs', then legacy files not
    /// overwritten in a log.
    fn listed(&self, prefix: Option<&Path>) -> Vec<ObjectMeta> {
        let under = |k: &Path| prefix.is_none_or(|p| k.prefix_match(p).is_some());
        let state = self.state();
        let mut all: Vec<ObjectMeta> = state
            .index
            .iter()
            .filter(|(k, _)| under(k))
            .map(|(k, loc)| Self::meta(k, loc))
            .collect();
        all.extend(
            state
                .legacy
                .iter()
                .filter(|(k, _)| under(k) && !state.index.contains_key(*k))
                .map(|(_, meta)| meta.clone()),
        );
        all.sort_by(|a, b| a.location.cmp(&b.location));
        all
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> object_store::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| object_store::Error::JoinError { source })?
}

#[async_trait]
impl ObjectStore for LocalLogStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if let PutMode::Update(_) = opts.mode {
            return Err(object_store::Error::NotImplemented {
                operation: "put with PutMode::Update".into(),
                implementer: STORE.into(),
            });
        }
        // On the caller only while this store is the directory's writer: taking the
        // lock from another process may wait for it, which must not hold a worker.
        let on_caller = opts.extensions.get::<super::WriteOnCaller>().is_some()
            && self.state().writer.is_some();
        let loc = if on_caller {
            let data: Bytes = payload.into();
            self.put_blocking(location, &data, &opts.mode)?
        } else {
            let this = self.clone();
            let path = location.clone();
            blocking(move || {
                let data: Bytes = payload.into();
                this.put_blocking(&path, &data, &opts.mode)
            })
            .await?
        };
        Ok(PutResult {
            e_tag: Self::meta(location, &loc).e_tag,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(object_store::Error::NotImplemented {
            operation: "multipart upload".into(),
            implementer: STORE.into(),
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let (meta, legacy) = {
            let state = self.state();
            (
                state
                    .index
                    .get(location)
                    .map(|loc| Self::meta(location, loc)),
                state.legacy.contains_key(location),
            )
        };
        let Some(meta) = meta else {
            if legacy {
                return self.inner.legacy.get_opts(location, options).await;
            }
            return Err(not_found(location));
        };
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(r) => {
                Some(
                    r.as_range(meta.size)
                        .map_err(|source| object_store::Error::Generic {
                            store: STORE,
                            source: Box::new(source),
                        })?,
                )
            }
            None => None,
        };
        let (meta, range, data) = if options.head {
            let range = range.unwrap_or(0..meta.size);
            (meta, range, Bytes::new())
        } else {
            let this = self.clone();
            let path = location.clone();
            blocking(move || match this.read_blocking(&path, range) {
                Some(r) => r.map_err(generic),
                None => Err(not_found(&path)),
            })
            .await?
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(data) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        locations
            .then(move |location| {
                let this = this.clone();
                async move {
                    let location = location?;
                    let path = location.clone();
                    let inner = this.clone();
                    let legacy = blocking(move || inner.delete_blocking(&path)).await?;
                    if legacy {
                        this.inner.legacy.delete(&location).await?;
                    }
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        stream::iter(self.listed(prefix).into_iter().map(Ok)).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let root = Path::default();
        let base = prefix.unwrap_or(&root);
        let mut common_prefixes = std::collections::BTreeSet::new();
        let mut objects = Vec::new();
        for meta in self.listed(prefix) {
            let nested = {
                let Some(mut parts) = meta.location.prefix_match(base) else {
                    continue;
                };
                let Some(first) = parts.next() else {
                    continue;
                };
                parts.next().is_some().then(|| base.clone().join(first))
            };
            match nested {
                Some(dir) => {
                    common_prefixes.insert(dir);
                }
                None => objects.push(meta),
            }
        }
        Ok(ListResult {
            common_prefixes: common_prefixes.into_iter().collect(),
            objects,
            extensions: Default::default(),
        })
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let data = self.get(from).await?.bytes().await?;
        let mode = match options.mode {
            CopyMode::Overwrite => PutMode::Overwrite,
            CopyMode::Create => PutMode::Create,
        };
        self.put_opts(to, data.into(), mode.into()).await?;
        Ok(())
    }
}
