//! Garbage collection of WAL objects, in two phases: a stream's delete (explicit,
//! TTL or Expires-At) removes its index rows when it is applied (unreachable in
//! metadata), and this pass later deletes the bytes of every WAL object that no
//! index row points into any more and that no restore can need.
//!
//! "No restore can need" is the checkpoint floor: the watermark of the *oldest* kept
//! checkpoint (see `checkpoint`). Recovery always starts from a checkpoint at or past
//! the floor, so a WAL object below it is read only through the index. A cluster
//! member (Postgres, the metadata of record, never restored) judges its own log
//! below what it indexed and the logs of finished members ([`Scope::Member`]). Seals
//! are never deleted: they fence zombie writers of older epochs for ever.
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

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use super::checkpoint;
use crate::error::Result;
use crate::layout;
use crate::meta::{Meta, Watermark};
use crate::metrics::{Counter, Desc, Exposition, Source};
use crate::store::instrumented::StoreStats;
use crate::wal::format::SEAL_MAGIC;

/// Seal objects are a line of text; anything this small is checked for the seal
/// magic before it is deleted.
pub(crate) const SEAL_BYTES_MAX: u64 = 128;

static PASSES: Desc = Desc::counter(
    "picomq_gc_passes_total",
    "Garbage-collection passes completed.",
);
static FAILURES: Desc = Desc::counter(
    "picomq_gc_failures_total",
    "Garbage-collection passes that failed (retried at the next interval).",
);
static OBJECTS_DELETED: Desc = Desc::counter(
    "picomq_gc_objects_deleted_total",
    "WAL and compacted objects deleted by garbage collection (nothing pointed into them).",
);
static BYTES_DELETED: Desc = Desc::counter(
    "picomq_gc_bytes_deleted_total",
    "Bytes of the WAL objects deleted by garbage collection.",
);

pub struct GcStats {
    pub passes: Counter,
    pub failures: Counter,
    pub objects_deleted: Counter,
    pub bytes_deleted: Counter,
}

impl Default for GcStats {
    fn default() -> Self {
        GcStats {
            passes: Counter::new(&PASSES),
            failures: Counter::new(&FAILURES),
            objects_deleted: Counter::new(&OBJECTS_DELETED),
            bytes_deleted: Counter::new(&BYTES_DELETED),
        }
    }
}

impl Source for GcStats {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.passes)
            .counter(&self.failures)
            .counter(&self.objects_deleted)
            .counter(&self.bytes_deleted);
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub examined: u64,
    pub deleted: u64,
    pub bytes: u64,
}

/// Which objects a pass may judge.
#[derive(Clone, Debug)]
pub enum Scope {
    /// One node: every object below the checkpoint floor.
    Checkpointed,
    /// A cluster member (whose index is of record, without checkpoints): the
    /// objects of its own log below what it indexed (its compaction and packer
    /// commit under its maintenance lock, as on one node), and the objects of
    /// `finished` members, whose logs are sealed and fully indexed. Each object
    /// belongs to one log, so each is judged by one member.
    Member {
        epoch: u64,
        indexed_below: u64,
        finished: Vec<u64>,
    },
}

/// One pass: deletes every unreferenced, non-seal object in `scope`. On one node
/// without a checkpoint there is no floor and nothing is deleted.
pub async fn collect(store: &dyn ObjectStore, meta: &Meta, scope: &Scope) -> Result<Pass> {
    let mut pass = Pass::default();
    match scope {
        Scope::Checkpointed => {
            let Some(floor) = checkpoint::floor(store).await? else {
                return Ok(pass);
            };
            for prefix in [layout::WAL, layout::SEGMENTS] {
                collect_under(store, meta, prefix, floor, &mut pass).await?;
            }
        }
        Scope::Member {
            epoch,
            indexed_below,
            finished,
        } => {
            let own = Watermark {
                epoch: *epoch,
                next_seq: *indexed_below,
            };
            let all = Watermark {
                epoch: u64::MAX,
                next_seq: 0,
            };
            let logs = std::iter::once((*epoch, own)).chain(finished.iter().map(|e| (*e, all)));
            for (e, floor) in logs {
                for prefix in [layout::wal_epoch_prefix(e), layout::segments_of(e)] {
                    collect_under(store, meta, &prefix, floor, &mut pass).await?;
                }
            }
        }
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
            layout::parse_wal_key(key).or_else(|| layout::parse_segment_key(key))
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

pub(crate) async fn is_seal(store: &dyn ObjectStore, location: &Path) -> Result<bool> {
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

/// The collector the scheduler runs (exclusive: it holds the maintenance lock,
/// which a compaction round holds from its write to its commit).
pub struct Collector {
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    /// The store holding the WAL, whose storage estimate deletions lower.
    store_stats: Option<Arc<StoreStats>>,
    pub stats: GcStats,
}

impl Collector {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        store_stats: Option<Arc<StoreStats>>,
    ) -> Collector {
        Collector {
            store,
            meta,
            store_stats,
            stats: GcStats::default(),
        }
    }

    pub async fn pass(&self, scope: &Scope) {
        match collect(&*self.store, &self.meta, scope).await {
            Ok(pass) => {
                self.stats.passes.inc();
                self.stats.objects_deleted.add(pass.deleted);
                self.stats.bytes_deleted.add(pass.bytes);
                if let Some(s) = &self.store_stats {
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
                self.stats.failures.inc();
                tracing::warn!(error = %e, "garbage collection pass failed; will retry");
            }
        }
    }
}
