//! Garbage collection of WAL objects, in two phases: a stream's delete (explicit,
//! TTL or Expires-At) removes its index rows when it is applied (unreachable in
//! metadata), and this pass later deletes the bytes of every WAL object that no
//! index row points into any more and that no restore can need.
//!
//! "No restore can need" is the checkpoint floor: the watermark of the *oldest* kept
//! checkpoint (see `checkpoint`). Recovery always starts from a checkpoint at or past
//! the floor, so a WAL object below it is read only through the index. Seals are
//! never deleted: they fence zombie writers of older epochs for ever.
//!
//! Compacted objects (`seg/`, see `compaction`) follow the same rule: their keys
//! carry the WAL position they were written at, and the relocation that references
//! one is logged at that position or later. Every change to the index is a WAL op,
//! so a restore from any kept checkpoint replays to the same index this pass
//! consulted: an object unreferenced now and below the floor is never referenced
//! again. Passes hold the maintenance lock, which a compaction round holds from its
//! write to its commit, so a new object is never judged before its relocation.
//!
//! The pass is a scan (list `wal/` and `seg/`, look each candidate up in the index),
//! so a crash anywhere leaks nothing for long: the next pass finds what this one
//! missed. A WAL object still shared with a live stream stays until compaction
//! copies that stream's data out of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use tokio::sync::watch;

use crate::checkpoint;
use crate::compaction;
use crate::error::Result;
use crate::meta::{Meta, Watermark};
use crate::store::instrumented::StoreStats;
use crate::wal::format::{self, SEAL_MAGIC};
use crate::wal::WalHealth;

/// Seal objects are a line of text; anything this small is checked for the seal
/// magic before it is deleted.
const SEAL_BYTES_MAX: u64 = 128;

#[derive(Default)]
pub struct GcStats {
    pub passes: AtomicU64,
    pub failures: AtomicU64,
    pub objects_deleted: AtomicU64,
    pub bytes_deleted: AtomicU64,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub examined: u64,
    pub deleted: u64,
    pub bytes: u64,
}

/// One pass: deletes every unreferenced, non-seal WAL object below the checkpoint
/// floor. Without a checkpoint there is no floor and nothing is deleted.
pub async fn collect(store: &dyn ObjectStore, meta: &Meta) -> Result<Pass> {
    let mut pass = Pass::default();
    let Some(floor) = checkpoint::floor(store).await? else {
        return Ok(pass);
    };
    for prefix in ["wal", "seg"] {
        collect_under(store, meta, prefix, floor, &mut pass).await?;
    }
    Ok(pass)
}

async fn collect_under(
    store: &dyn ObjectStore,
    meta: &Meta,
    prefix: &str,
    floor: Watermark,
    pass: &mut Pass,
) -> Result<()> {
    let mut listing = store.list(Some(&Path::from(prefix)));
    while let Some(object) = listing.try_next().await? {
        let key = object.location.as_ref();
        let Some((epoch, seq)) =
            format::parse_object_key(key).or_else(|| compaction::parse_segment_key(key))
        else {
            continue;
        };
        if (epoch, seq) >= (floor.epoch, floor.next_seq) {
            continue;
        }
        pass.examined += 1;
        if meta.object_referenced(key).await? {
            continue;
        }
        if object.size <= SEAL_BYTES_MAX && is_seal(store, &object.location).await? {
            continue;
        }
        match store.delete(&object.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        pass.deleted += 1;
        pass.bytes += object.size;
        crate::failpoint::hit("gc-after-delete");
    }
    Ok(())
}

async fn is_seal(store: &dyn ObjectStore, location: &Path) -> Result<bool> {
    let opts = GetOptions {
        range: Some(GetRange::Bounded(0..SEAL_MAGIC.len() as u64)),
        ..Default::default()
    };
    match store.get_opts(location, opts).await {
        Ok(got) => Ok(got.bytes().await?.starts_with(SEAL_MAGIC)),
        // Already gone: nothing to decide.
        Err(object_store::Error::NotFound { .. }) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Runs a pass every `interval` for as long as this node is the bucket's writer.
pub async fn run(
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    interval: Duration,
    health: watch::Receiver<WalHealth>,
    stats: Arc<GcStats>,
    store_stats: Option<Arc<StoreStats>>,
    maintenance: Arc<tokio::sync::Mutex<()>>,
) {
    crate::wal::while_writer(interval, health, || async {
        let _maintenance = maintenance.lock().await;
        match collect(&*store, &meta).await {
            Ok(pass) => {
                stats.passes.fetch_add(1, Ordering::Relaxed);
                stats
                    .objects_deleted
                    .fetch_add(pass.deleted, Ordering::Relaxed);
                stats.bytes_deleted.fetch_add(pass.bytes, Ordering::Relaxed);
                if let Some(s) = &store_stats {
                    s.sub_stored_bytes(pass.bytes);
                }
                if pass.deleted > 0 {
                    tracing::info!(
                        examined = pass.examined,
                        deleted = pass.deleted,
                        bytes = pass.bytes,
                        "garbage-collected unreferenced objects"
                    );
                }
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "garbage collection pass failed; will retry");
            }
        }
    })
    .await;
}
