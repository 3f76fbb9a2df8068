//! Taking over a member whose lease lapsed: seal its log in the bucket, index what
//! it wrote and had not indexed, then free its slots.
//!
//! Why nothing it acknowledged is lost: it acknowledged object N only after every
//! object before N was durable, and only while its lease held. The taker lists the
//! log, indexes from the member's watermark on, and writes a seal create-only at
//! the first missing number. If the member's upload of that number lands first, the
//! seal finds the key taken and the taker indexes that object too and tries the
//! next number. Once a seal is written the gap is permanent: the member's later
//! uploads at or after it are never acknowledged (the one at the seal fails; the
//! ones after it wait for it forever), and the taker indexed everything before it.
//!
//! Why a zombie cannot write the index: the store marks the member `Sealing` by the
//! taker before the taker reads its log, and applies a member's objects only while
//! it is running, or for its sealer.
//!
//! A taker that dies halfway leaves the member `Sealing`; once the taker's own lease
//! lapses another member starts over (every step is idempotent).

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::Cluster;
use crate::error::Result;
use crate::indexer::OnApplied;
use crate::layout;
use crate::meta::Meta;
use crate::recovery;
use crate::wal::format::SEAL_MAGIC;

/// Objects indexed per metadata transaction during a takeover.
const APPLY_BATCH: usize = 64;
/// WAL objects fetched at once while the log is replayed.
const FETCH_AHEAD: usize = 16;

pub(crate) struct Takeover {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) meta: Meta,
    /// Told about the objects indexed (the packer packs them like its own).
    pub(crate) on_applied: OnApplied,
    /// Reads a log's recent history back into this node's cache and packer (set
    /// once the node runs; see `Packer::warm`). The answer comes once it is cached.
    pub(crate) warm: std::sync::OnceLock<Warm>,
}

/// Starts a warm-up of the recent history of log `epoch` (`WarmFrom::log`); the
/// receiver answers once it is in the cache.
pub(crate) type Warm = Box<dyn Fn(u64) -> tokio::sync::oneshot::Receiver<()> + Send + Sync>;

impl Takeover {
    /// Takes `dead` over if it is still up for it; the objects indexed, or `None`
    /// when another member is on it or it recovered.
    pub(crate) async fn run(&self, node_id: &str, dead: u64) -> Result<Option<u64>> {
        let c = &self.cluster;
        let Some(applied) = c.coord.begin_takeover(c.epoch, dead).await? else {
            return Ok(None);
        };
        tracing::info!(
            node = node_id,
            epoch = dead,
            from_seq = applied,
            "taking over a member: sealing its log"
        );
        let started = std::time::Instant::now();
        let listed = self.list(dead, applied).await?;
        let listed_ms = started.elapsed().as_millis() as u64;
        // The listed run from `applied` on is fetched FETCH_AHEAD at a time, in order.
        let run: Vec<_> = (applied..)
            .take_while(|s| listed.contains(s))
            .map(|seq| self.fetch(dead, seq))
            .collect();
        let mut fetched = futures::stream::iter(run).buffered(FETCH_AHEAD);
        let mut seq = applied;
        let mut batch = Vec::with_capacity(APPLY_BATCH);
        let mut indexed = 0;
        loop {
            let key = layout::wal_key(dead, seq);
            let bytes = match fetched.next().await {
                Some(bytes) => bytes?,
                None => {
                    if recovery::seal(&*self.store, &key, c.epoch).await? {
                        break;
                    }
                    // It landed while we tried to seal.
                    self.fetch(dead, seq).await?
                }
            };
            if bytes.starts_with(SEAL_MAGIC) {
                break;
            }
            batch.push(recovery::decode(&key, &bytes)?);
            if batch.len() == APPLY_BATCH {
                indexed += self.apply(&mut batch).await?;
            }
            seq += 1;
        }
        indexed += self.apply(&mut batch).await?;
        // The member's recent history (its newest packs, what it had not packed)
        // into this node's cache before its slots are freed, for a little while at
        // most: the first reads of its streams through this node find it there, and
        // its WAL data is packed at once.
        if let Some(warm) = self.warm.get() {
            let _ = tokio::time::timeout(crate::node::WARM_WAIT, warm(dead)).await;
        }
        c.coord.finish_takeover(c.epoch, dead).await?;
        c.stats.takeovers.inc();
        c.stats.takeover_objects.add(indexed);
        tracing::info!(
            node = node_id,
            epoch = dead,
            objects = indexed,
            listed_ms,
            total_ms = started.elapsed().as_millis() as u64,
            "took over a member whose lease lapsed: its log is sealed and indexed"
        );
        Ok(Some(indexed))
    }

    /// The bytes of object `seq` of `epoch`'s log.
    async fn fetch(&self, epoch: u64, seq: u64) -> Result<bytes::Bytes> {
        let key = Path::from(layout::wal_key(epoch, seq));
        Ok(self.store.get(&key).await?.bytes().await?)
    }

    async fn apply(&self, batch: &mut Vec<crate::wal::FlushedObject>) -> Result<u64> {
        if batch.is_empty() {
            return Ok(0);
        }
        self.meta.apply(batch).await?;
        (self.on_applied)(batch);
        let n = batch.len() as u64;
        batch.clear();
        Ok(n)
    }

    /// The sequence numbers in `epoch`'s log from `from` on. The listing starts
    /// there (keys sort by number): a log keeps its indexed objects until they are
    /// packed and collected, thousands for a busy node, and the takeover must cost
    /// what is left to index, not what the log ever held.
    async fn list(&self, epoch: u64, from: u64) -> Result<BTreeSet<u64>> {
        let prefix = Path::from(layout::wal_epoch_prefix(epoch));
        let mut seqs = BTreeSet::new();
        let mut listing = match from.checked_sub(1) {
            Some(before) => self
                .store
                .list_with_offset(Some(&prefix), &Path::from(layout::wal_key(epoch, before))),
            None => self.store.list(Some(&prefix)),
        };
        while let Some(object) = listing.try_next().await? {
            if let Some((e, seq)) = layout::parse_wal_key(object.location.as_ref()) {
                if e == epoch && seq >= from {
                    seqs.insert(seq);
                }
            }
        }
        Ok(seqs)
    }
}
