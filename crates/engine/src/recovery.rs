//! Recovery: claim an epoch, bring the metadata store up to date with the bucket,
//! then seal what the previous incarnations left open.
//!
//! WAL objects are replayed in key order, from the metadata watermark on. Within an
//! incarnation (epoch) objects are numbered without gaps while that process lived,
//! and it acknowledged object N only after every object before N was durable. So the
//! first missing number ends the epoch: anything after the gap was never
//! acknowledged and is ignored. Recovery then writes a seal object at that number,
//! create-only, so the gap stays a gap forever: a late upload from the old process
//! (a zombie) fails with AlreadyExists and that process learns it is fenced.
//! Epochs that were claimed (see `fencing`) but never wrote are sealed at 0.
//!
//! A node whose metadata database is empty, or older than the newest metadata
//! checkpoint in the bucket (see `checkpoint`), first restores that checkpoint and
//! replays only the WAL after it. That is what makes deleting WAL objects below a
//! durable checkpoint safe: replay never starts below the newest checkpoint.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::background::checkpoint;
use crate::error::{EngineError, Result};
use crate::fencing;
use crate::layout;
use crate::meta::{Meta, Watermark};
use crate::wal::format::{self, SEAL_MAGIC};
use crate::wal::{FlushedChunk, FlushedObject};

pub struct Recovered {
    /// The epoch this incarnation writes under (claimed in the bucket).
    pub epoch: u64,
    pub objects_replayed: u64,
    /// Total size of the WAL objects listed, for the storage-cost estimate.
    pub listed_bytes: u64,
    /// The checkpoint the metadata was restored from, if it was.
    pub restored_from: Option<Watermark>,
}

pub async fn recover(store: &dyn ObjectStore, meta: &Meta) -> Result<Recovered> {
    // Claim first, list after: every epoch below ours is then visible to us.
    let mut epoch = fencing::claim(store, meta.node_epoch().await? + 1).await?;
    let (epochs, listed_bytes) = loop {
        let mut epochs: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        let mut listed_bytes = 0;
        let mut listing = store.list(Some(&Path::from(layout::WAL)));
        while let Some(object) = listing.try_next().await? {
            if let Some((e, seq)) = layout::parse_wal_key(object.location.as_ref()) {
                epochs.entry(e).or_default().insert(seq);
                listed_bytes += object.size;
            }
        }
        // Claimed epochs that never wrote an object get sealed at 0 like any other.
        for claimed in fencing::list_claims(store).await? {
            if claimed < epoch {
                epochs.entry(claimed).or_default();
            }
        }
        match epochs.keys().next_back() {
            // A log written without a claim (by an older version): claim above it.
            Some(&highest) if highest >= epoch => {
                epoch = fencing::claim(store, highest + 1).await?;
            }
            _ => break (epochs, listed_bytes),
        }
    };
    // A checkpoint past our own watermark describes everything before it, and is the
    // only description once the WAL below it is deleted: start from it. An empty
    // database takes the newest checkpoint whatever its watermark (it may hold only
    // tokens, which older versions did not log). A store of record has none.
    let mut watermark = meta.watermark().await?;
    let mut restored_from = None;
    if let Some(index) = meta.local_index() {
        let after = if index.is_empty().await? {
            None
        } else {
            Some(watermark.unwrap_or_default())
        };
        restored_from = checkpoint::restore_newest(store, meta, after).await?;
        if restored_from.is_some() {
            watermark = restored_from;
        }
    }
    let mut replayed = 0;
    for (&e, seqs) in &epochs {
        let mut seq = match watermark {
            Some(w) if e < w.epoch => continue,
            Some(w) if e == w.epoch => w.next_seq,
            _ => 0,
        };
        loop {
            // The listed objects from `seq` on without a gap, fetched several at
            // once and applied in order, a batch at a time; then the first missing
            // number is sealed (or, having appeared meanwhile, replayed).
            let listed = seqs
                .range(seq..)
                .zip(seq..)
                .take_while(|(s, n)| *s == n)
                .count();
            let to = if listed == 0 {
                let key = layout::wal_key(e, seq);
                if seal(store, &key, epoch).await? {
                    break;
                }
                seq + 1
            } else {
                seq + listed as u64
            };
            let (applied, sealed) = replay(store, meta, e, seq..to).await?;
            replayed += applied;
            seq += applied;
            if sealed {
                break;
            }
        }
    }
    meta.set_node_epoch(epoch).await?;
    Ok(Recovered {
        epoch,
        objects_replayed: replayed,
        listed_bytes,
        restored_from,
    })
}

/// WAL objects recovery fetches at once, and applies to the metadata in one batch
/// (at most, and at most about [`REPLAY_BATCH_BYTES`] of them).
const REPLAY_AT_ONCE: usize = 16;
const REPLAY_BATCH: usize = 64;
const REPLAY_BATCH_BYTES: usize = 32 << 20;

/// Replays the objects `seqs` of `epoch`'s log, in order; how many it applied, and
/// whether it met a seal (the log ends there).
async fn replay(
    store: &dyn ObjectStore,
    meta: &Meta,
    epoch: u64,
    seqs: std::ops::Range<u64>,
) -> Result<(u64, bool)> {
    use futures::StreamExt;
    let fetched = futures::stream::iter(seqs)
        .map(|seq| async move {
            let key = layout::wal_key(epoch, seq);
            let bytes = store.get(&Path::from(key.as_str())).await?.bytes().await?;
            Ok::<_, EngineError>((key, bytes))
        })
        .buffered(REPLAY_AT_ONCE);
    futures::pin_mut!(fetched);
    let (mut applied, mut batch, mut batch_bytes) = (0, Vec::new(), 0);
    let mut sealed = false;
    while let Some(got) = fetched.next().await {
        let (key, bytes) = got?;
        if bytes.starts_with(SEAL_MAGIC) {
            sealed = true;
            break;
        }
        batch.push(decode(&key, &bytes)?);
        batch_bytes += bytes.len();
        if batch.len() == REPLAY_BATCH || batch_bytes >= REPLAY_BATCH_BYTES {
            meta.apply(&batch).await?;
            applied += batch.len() as u64;
            (batch, batch_bytes) = (Vec::new(), 0);
        }
    }
    if !batch.is_empty() {
        meta.apply(&batch).await?;
        applied += batch.len() as u64;
    }
    Ok((applied, sealed))
}

/// Writes the seal at `key`; `false` if the key already exists.
pub(crate) async fn seal(store: &dyn ObjectStore, key: &str, by_epoch: u64) -> Result<bool> {
    // Unique bytes per sealer, so two seals never look alike.
    let body = format!(
        "PMQS sealed by epoch {by_epoch} nonce {}",
        fastrand::u64(..)
    );
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store
        .put_opts(&Path::from(key), PutPayload::from(Bytes::from(body)), opts)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn decode(key: &str, bytes: &Bytes) -> Result<FlushedObject> {
    let (header, chunks) = format::decode_object(bytes)
        .map_err(|e| EngineError::Internal(format!("WAL object {key}: {e}")))?;
    Ok(FlushedObject {
        key: key.to_string(),
        epoch: header.epoch,
        seq: header.seq,
        chunks: chunks
            .into_iter()
            .map(|c| FlushedChunk {
                stream_id: c.stream_id,
                range: c.range.start as u64..c.range.end as u64,
                ops: c.ops.into_iter().map(|op| (0, op)).collect(),
                listener: None,
            })
            .collect(),
        bytes: None,
    })
}
