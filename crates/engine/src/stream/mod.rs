//! The stream service: the registry of names and one sequencer per active stream.
//! It validates requests against stream state (producers, Stream-Seq, close, content
//! type), assigns offsets, hands ops to the WAL and waits for durability outside any
//! lock, so pipelined appends on one stream share flushes. Reads come from the tail
//! cache or, for older data, from the object store through the index.

pub mod handle;
mod json_scan;
mod names;
pub mod producer;
pub mod registry;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use self::handle::{DurableView, Lifecycle, StreamConfig, StreamHandle};
use self::producer::{ProducerState, Verdict};
use self::registry::Registry;
use crate::block_cache::BlockCache;
use crate::checkpoint::CheckpointStats;
use crate::compaction::{Compactor, PassReport};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::gc::GcStats;
use crate::indexer::{self, IndexerProgress};
use crate::meta::{ChunkRow, Meta, StreamRow};
use crate::metrics::{Exposition, Histogram, LATENCY_BOUNDS_S};
use crate::offset::Offset;
use crate::store::instrumented::{InstrumentedStore, StoreStats};
use crate::wal::format::{
    self, AppendOp, CreateOp, ForkOrigin, Op, ProducerStamp, Record, RECORD_BATCH_START,
};
use crate::wal::{Submission, Wal, WalStats};

/// Index rows one cold read looks up at once (readahead spans up to this many).
const COLD_ROWS: u32 = 64;
/// Ranged GETs one cold read issues in parallel, at most (see `chunk_bytes`).
const READAHEAD_WINDOWS: usize = 4;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The media type of a Content-Type value: lowercased, parameters dropped.
pub fn media_type(content_type: &str) -> String {
    media_essence(content_type).to_ascii_lowercase()
}

/// Whether two Content-Type values name the same media type (`media_type` equality
/// without allocating: every append checks it).
pub fn same_media_type(a: &str, b: &str) -> bool {
    media_essence(a).eq_ignore_ascii_case(media_essence(b))
}

fn media_essence(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// Parses an RFC 3339 timestamp into milliseconds since the Unix epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[derive(Clone, Debug)]
pub struct ForkRequest {
    pub source: String,
    pub offset: Option<Offset>,
    pub sub_offset: u64,
}

#[derive(Clone, Debug, Default)]
pub struct CreateRequest {
    pub name: String,
    /// `None`: `application/octet-stream`, or the source's type for a fork.
    pub content_type: Option<String>,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    /// Age retention in seconds (`Stream-Retention`); `None`: keep everything.
    pub retention_secs: Option<u64>,
    pub closed: bool,
    pub fork: Option<ForkRequest>,
    pub body: Bytes,
}

#[derive(Clone, Debug)]
pub struct StreamInfo {
    pub id: u64,
    pub name: String,
    pub content_type: String,
    pub tail: Offset,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub created_ms: u64,
    /// The stream's own first retained offset (see [`Engine::retained_start`] for
    /// what a fork can read of its source).
    pub start: Offset,
    pub retention_secs: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct ProducerHeaders {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

#[derive(Clone, Debug, Default)]
pub struct AppendRequest {
    pub name: String,
    pub content_type: Option<String>,
    pub body: Bytes,
    pub close: bool,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHeaders>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Written (or, for close-only, closed). `producer_seq` echoes the accepted seq.
    Appended {
        tail: Offset,
        closed: bool,
        producer: Option<(u64, u64)>,
    },
    /// Already written by an earlier request with the same producer stamp.
    Duplicate {
        tail: Offset,
        closed: bool,
        epoch: u64,
        last_seq: u64,
    },
}

/// One catch-up read.
pub struct ReadChunk {
    pub segments: Vec<Bytes>,
    /// Per segment: does it start a new append (JSON batches span several records)?
    pub flags: Vec<u8>,
    pub next: Offset,
    /// The read reached the durable tail.
    pub up_to_date: bool,
    /// Closed, and the read reached the final offset.
    pub closed: bool,
    pub json: bool,
}

pub enum WaitOutcome {
    /// Data past the offset is durable (or the stream closed).
    Ready,
    TimedOut,
}

pub struct EngineStats {
    pub wal: Arc<WalStats>,
    pub active_streams: usize,
    pub index_failures: u64,
}

/// Counters of the stream service (the WAL and the stores keep their own).
pub struct ServiceCounters {
    /// Appends acknowledged (durable), duplicates excluded.
    pub appends: AtomicU64,
    /// Per acknowledged append (duplicates included), from entering the engine until
    /// durable: the server's share of an append's latency, without HTTP.
    pub append_seconds: Histogram,
    /// Records (messages) in those appends.
    pub append_records: AtomicU64,
    pub append_bytes: AtomicU64,
    /// Trims that moved a stream's start (by request or by age retention).
    pub trims: AtomicU64,
    /// Reads served from the in-memory tail cache, and their bytes.
    pub reads_memory: AtomicU64,
    pub read_bytes_memory: AtomicU64,
    /// Reads parked on a stream's notifier right now (long-polls, SSE).
    pub waiting_reads: AtomicU64,
    /// Reads (index rows fetched) served by ranged GETs from the object store.
    pub reads_store: AtomicU64,
    pub read_bytes_store: AtomicU64,
}

impl Default for ServiceCounters {
    fn default() -> Self {
        ServiceCounters {
            appends: AtomicU64::new(0),
            append_seconds: Histogram::new(LATENCY_BOUNDS_S),
            append_records: AtomicU64::new(0),
            append_bytes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            reads_memory: AtomicU64::new(0),
            read_bytes_memory: AtomicU64::new(0),
            waiting_reads: AtomicU64::new(0),
            reads_store: AtomicU64::new(0),
            read_bytes_store: AtomicU64::new(0),
        }
    }
}

struct Inner {
    config: EngineConfig,
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    wal: Wal,
    registry: Registry,
    /// Every name in the metadata: a lookup it rules out skips SQLite.
    names: names::NameFilter,
    next_id: AtomicU64,
    /// Serializes deletes and fork creation, which must agree on fork counts.
    lifecycle: tokio::sync::Mutex<()>,
    indexer: IndexerProgress,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    epoch: u64,
    store_stats: Vec<Arc<StoreStats>>,
    counters: ServiceCounters,
    /// Counts the WAL's health changes; bumped before the writers waiting on any
    /// stream are woken to look at the health again (`wait_durable`).
    health_epoch: AtomicU64,
    /// When an at-capacity request last swept for early evictions (ms since epoch).
    pressure_sweep_ms: AtomicU64,
    checkpoints: Arc<CheckpointStats>,
    gc: Arc<GcStats>,
    compactor: Arc<Compactor>,
    /// Chunks read from the object store (see `block_cache`).
    cache: BlockCache,
    /// What recovery did at start: WAL objects replayed, checkpoint restored.
    recovered: (u64, bool),
}

/// The storage engine and stream service of one node.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// A resolved, active stream.
#[derive(Clone)]
pub struct StreamRef {
    pub handle: Arc<StreamHandle>,
}

impl StreamRef {
    pub fn info(&self) -> StreamInfo {
        let view = self.handle.view();
        let c = &self.handle.config;
        StreamInfo {
            id: c.id,
            name: c.name.clone(),
            content_type: c.content_type.clone(),
            tail: view.tail,
            closed: view.closed,
            ttl_secs: c.ttl_secs,
            expires_at: c.expires_at.clone(),
            created_ms: c.created_ms,
            start: view.start,
            retention_secs: view.retention_secs,
        }
    }
}

/// How often an operation re-resolves a stream that changed under it (went dormant,
/// was deleted and re-created) before it gives up with [`changing_too_fast`].
const STATE_RETRIES: usize = 16;

fn changing_too_fast() -> EngineError {
    EngineError::Unavailable("stream is changing state too fast; retry".into())
}

impl Engine {
    /// Opens the engine: recovers the metadata from the bucket, then starts the WAL
    /// writer, the indexer and the dormancy sweeper. The store is instrumented here
    /// (labelled `data`); use [`Engine::open_instrumented`] for stores already
    /// instrumented per backend.
    pub async fn open(
        config: EngineConfig,
        store: Arc<dyn ObjectStore>,
        meta: Meta,
    ) -> Result<Engine> {
        let stats = StoreStats::new("data", config.cost);
        let store = Arc::new(InstrumentedStore::new(store, stats.clone()));
        Engine::open_instrumented(config, store, vec![stats], meta).await
    }

    /// Like [`Engine::open`], for a store whose backends report to `store_stats`
    /// (see `store::instrumented`; the one labelled `wal`, else the first, holds the
    /// WAL and gets the storage estimate).
    pub async fn open_instrumented(
        config: EngineConfig,
        store: Arc<dyn ObjectStore>,
        store_stats: Vec<Arc<StoreStats>>,
        meta: Meta,
    ) -> Result<Engine> {
        let recovered = crate::recovery::recover(&*store, &meta).await?;
        let wal_stats = store_stats
            .iter()
            .find(|s| s.label() == "wal")
            .or(store_stats.first())
            .cloned();
        if let Some(wal_stats) = &wal_stats {
            wal_stats.add_stored_bytes(recovered.listed_bytes);
        }
        tracing::info!(
            epoch = recovered.epoch,
            replayed = recovered.objects_replayed,
            checkpoint = ?recovered.restored_from,
            "recovered from the object store"
        );
        let next_id = meta.next_stream_id().await?;
        // Ids are handed out in order, so `next_id` bounds the rows to name.
        let names = names::NameFilter::for_names(next_id.saturating_sub(1) as usize);
        let named = meta.for_each_name(10_000, |n| names.insert(n)).await?;
        tracing::debug!(named, bytes = names.bytes(), "stream name filter built");
        let (index_tx, index_rx) = mpsc::channel(256);
        let (index_task, indexer) = indexer::spawn(meta.clone(), index_rx);
        let wal = Wal::start(
            store.clone(),
            config.wal.clone(),
            recovered.epoch,
            0,
            index_tx,
        );
        // Held by compaction rounds and GC passes, never both at once.
        let maintenance = Arc::new(tokio::sync::Mutex::new(()));
        let compactor = Arc::new(Compactor::new(
            store.clone(),
            meta.clone(),
            wal.clone(),
            recovered.epoch,
            config.compaction.clone(),
            maintenance.clone(),
        ));
        let cache = BlockCache::new(config.block_cache_bytes);
        let inner = Arc::new(Inner {
            config,
            store,
            meta,
            wal,
            registry: Registry::default(),
            names,
            next_id: AtomicU64::new(next_id),
            lifecycle: tokio::sync::Mutex::new(()),
            indexer,
            tasks: Mutex::new(vec![index_task]),
            epoch: recovered.epoch,
            store_stats,
            counters: ServiceCounters::default(),
            health_epoch: AtomicU64::new(0),
            pressure_sweep_ms: AtomicU64::new(0),
            checkpoints: Arc::default(),
            gc: Arc::default(),
            compactor,
            cache,
            recovered: (
                recovered.objects_replayed,
                recovered.restored_from.is_some(),
            ),
        });
        let engine = Engine { inner };
        engine.spawn_kept(engine.clone().sweep_loop());
        if let Some(interval) = engine.inner.config.fence_check_interval {
            let store = engine.inner.store.clone();
            let wal = engine.inner.wal.clone();
            let epoch = engine.inner.epoch;
            engine.spawn_kept(async move {
                crate::fencing::watch(store, epoch, interval).await;
                wal.fence();
            });
        }
        if let Some(interval) = engine.inner.config.checkpoint_interval {
            engine.spawn_kept(crate::checkpoint::run(
                engine.inner.store.clone(),
                engine.inner.meta.clone(),
                interval,
                engine.inner.wal.health(),
                engine.inner.checkpoints.clone(),
                engine.inner.meta.watermark().await?,
            ));
        }
        if let Some(interval) = engine.inner.config.gc_interval {
            engine.spawn_kept(crate::gc::run(
                engine.inner.store.clone(),
                engine.inner.meta.clone(),
                interval,
                engine.inner.wal.health(),
                engine.inner.gc.clone(),
                wal_stats,
                maintenance,
            ));
        }
        if let Some(interval) = engine.inner.config.compaction.interval {
            engine.spawn_kept(crate::compaction::run(
                engine.inner.compactor.clone(),
                interval,
                engine.inner.wal.health(),
            ));
        }
        if let Some(interval) = engine.inner.config.retention_interval {
            engine.spawn_kept(crate::retention::run(engine.clone(), interval));
        }
        engine.spawn_kept(engine.clone().wake_waiters_on_health_changes());
        Ok(engine)
    }

    /// One subscriber to the WAL's health for all waiting writers: each change is
    /// counted, then every writer waiting on a stream is woken to look at it. Every
    /// append subscribing itself took the health watch's lock, which all of them
    /// share, twice per append.
    async fn wake_waiters_on_health_changes(self) {
        let mut health = self.inner.wal.health();
        loop {
            let stopped = health.changed().await.is_err();
            self.inner.health_epoch.fetch_add(1, Ordering::SeqCst);
            // Taken from the registry first: no stream's lock under the registry's.
            for handle in self.inner.registry.filter(|_| true) {
                handle.wake_op_waiters();
            }
            if stopped {
                return;
            }
        }
    }

    /// Runs a background task that lives as long as the engine (aborted at
    /// shutdown).
    fn spawn_kept(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let task = tokio::spawn(task);
        self.inner.tasks.lock().expect("tasks lock").push(task);
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            wal: self.inner.wal.stats(),
            active_streams: self.inner.registry.len(),
            index_failures: self.inner.indexer.failures.load(Ordering::Relaxed),
        }
    }

    pub fn meta(&self) -> &Meta {
        &self.inner.meta
    }

    /// Runs a compaction pass now over data older than `delay` (default: the
    /// configured delay); see `compaction`. Everything acknowledged before the call
    /// is indexed first, so the pass sees it (the indexer may be lingering).
    pub async fn compact(&self, delay: Option<Duration>) -> Result<PassReport> {
        self.inner.wal.check_health()?;
        self.index_barrier().await?;
        self.inner.compactor.pass(delay).await
    }

    /// Stops accepting writes and makes everything accepted durable and indexed.
    pub async fn shutdown(&self) {
        self.inner.wal.shutdown().await;
        let _ = self.index_barrier().await;
        for task in self.inner.tasks.lock().expect("tasks lock").drain(..) {
            task.abort();
        }
    }

    // ---- resolving names --------------------------------------------------------

    fn handle_from_row(
        &self,
        row: StreamRow,
        producers: HashMap<String, (u64, u64)>,
    ) -> Result<Arc<StreamHandle>> {
        let config = StreamConfig {
            id: row.id,
            json: media_type(&row.content_type) == "application/json",
            expires_at_ms: row.expires_at.as_deref().and_then(parse_rfc3339_ms),
            name: row.name,
            content_type: row.content_type,
            created_ms: row.created_ms,
            ttl_secs: row.ttl_secs,
            expires_at: row.expires_at,
            fork: row.fork,
        };
        let producers = producers
            .into_iter()
            .map(|(id, (epoch, last_seq))| {
                (
                    id,
                    ProducerState {
                        epoch,
                        last_seq,
                        last_op: 0,
                    },
                )
            })
            .collect();
        let lifecycle = if row.soft_deleted {
            Lifecycle::SoftDeleted
        } else {
            Lifecycle::Live
        };
        // A restart must never shorten a sliding TTL: count the load as an access.
        let last_access = row.last_access_ms.max(row.created_ms);
        Ok(Arc::new(StreamHandle::new(
            config,
            row.start,
            row.retention_secs,
            row.tail,
            row.closed,
            row.closed_by,
            row.stream_seq,
            producers,
            lifecycle,
            last_access,
            self.inner.config.tail_cache_bytes_per_stream,
        )))
    }

    fn check_capacity(&self) -> Result<()> {
        if self.inner.registry.len() >= self.inner.config.active_streams_max {
            self.make_room();
        }
        if self.inner.registry.len() >= self.inner.config.active_streams_max {
            return Err(EngineError::Overloaded(format!(
                "too many active streams (limit {}); retry shortly",
                self.inner.config.active_streams_max
            )));
        }
        Ok(())
    }

    /// At the active-stream limit, settled streams idle for `PRESSURE_IDLE` give way
    /// before their dormancy timeout, so that many streams touched once (e.g. a
    /// million created with one append each) do not lock new ones out for a whole
    /// dormancy period. One O(active) sweep per `PRESSURE_SWEEP_EVERY` at most.
    fn make_room(&self) {
        const PRESSURE_IDLE: Duration = Duration::from_secs(1);
        const PRESSURE_SWEEP_EVERY: Duration = Duration::from_millis(100);
        let now = now_ms();
        let last = self.inner.pressure_sweep_ms.load(Ordering::Relaxed);
        if now < last + PRESSURE_SWEEP_EVERY.as_millis() as u64
            || self
                .inner
                .pressure_sweep_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let idle = PRESSURE_IDLE.min(self.inner.config.dormancy);
        let evicted = self
            .inner
            .registry
            .sweep(now.saturating_sub(idle.as_millis() as u64));
        if !evicted.is_empty() {
            // Last-access times go to the metadata store off the request path, as
            // the dormancy sweeper does.
            let engine = self.clone();
            tokio::spawn(async move {
                if let Err(e) = engine.inner.meta.touch(&evicted).await {
                    tracing::warn!(error = %e, "recording last access of evicted streams failed");
                }
            });
        }
    }

    async fn load(&self, row: Option<StreamRow>) -> Result<Option<Arc<StreamHandle>>> {
        let Some(row) = row else { return Ok(None) };
        self.check_capacity()?;
        let producers = self.inner.meta.producers(row.id).await?;
        let handle = self.handle_from_row(row, producers)?;
        let active = self.inner.registry.insert(handle, |existing| {
            let v = existing.view();
            v.evicted || v.lifecycle == Lifecycle::Deleted
        });
        Ok(Some(active))
    }

    /// The active handle for `name`, loading it if dormant; `None` if there is none.
    /// Deleted and expired streams resolve to `None`.
    async fn lookup(&self, name: &str) -> Result<Option<Arc<StreamHandle>>> {
        self.lookup_in(name, false).await
    }

    /// `lookup` for callers that already hold the lifecycle lock (`lifecycle_held`):
    /// an expired stream is then deleted without taking the lock again.
    async fn lookup_in(
        &self,
        name: &str,
        lifecycle_held: bool,
    ) -> Result<Option<Arc<StreamHandle>>> {
        for _ in 0..STATE_RETRIES {
            let handle = match self.inner.registry.by_name(name) {
                Some(h) => h,
                None if !self.inner.names.may_contain(name) => return Ok(None),
                // Boxed, like the other rare branches below: a future is as large as
                // its largest branch, and every append's is moved into a box.
                None => match Box::pin(self.load_by_name(name)).await? {
                    Some(h) => h,
                    None => return Ok(None),
                },
            };
            let view = handle.view();
            if view.evicted {
                continue;
            }
            if view.lifecycle == Lifecycle::Deleted {
                if self
                    .inner
                    .registry
                    .by_name(name)
                    .is_some_and(|h| Arc::ptr_eq(&h, &handle))
                {
                    return Ok(None);
                }
                continue;
            }
            if view.op == 0 && handle.lock().next_op > 1 {
                // Created here and not yet durable: the creation is not visible yet.
                self.wait_durable(&handle, 1).await?;
            }
            if view.lifecycle == Lifecycle::Live && handle.is_expired(now_ms()) {
                if lifecycle_held {
                    Box::pin(self.delete_locked(handle.clone())).await?;
                } else {
                    Box::pin(self.expire(&handle)).await?;
                }
                continue;
            }
            return Ok(Some(handle));
        }
        Err(changing_too_fast())
    }

    /// A stream not in memory, from the metadata store.
    async fn load_by_name(&self, name: &str) -> Result<Option<Arc<StreamHandle>>> {
        self.load(self.inner.meta.stream_by_name(name).await?).await
    }

    async fn lookup_id(&self, id: u64) -> Result<Option<Arc<StreamHandle>>> {
        for _ in 0..STATE_RETRIES {
            let handle = match self.inner.registry.by_id(id) {
                Some(h) => h,
                None => match self.load(self.inner.meta.stream_by_id(id).await?).await? {
                    Some(h) => h,
                    None => return Ok(None),
                },
            };
            if handle.view().evicted {
                continue;
            }
            return Ok(Some(handle));
        }
        Err(changing_too_fast())
    }

    /// Resolves a stream for a client operation: 404 if absent, 410 if soft-deleted.
    pub async fn stream(&self, name: &str) -> Result<StreamRef> {
        let handle = self.lookup(name).await?.ok_or(EngineError::NotFound)?;
        match handle.view().lifecycle {
            Lifecycle::Live => Ok(StreamRef { handle }),
            Lifecycle::SoftDeleted => Err(EngineError::Gone),
            Lifecycle::Deleted => Err(EngineError::NotFound),
        }
    }

    /// Stream metadata; does not count as an access (HEAD does not slide TTLs).
    pub async fn head(&self, name: &str) -> Result<StreamInfo> {
        let stream = self.stream(name).await?;
        let mut info = stream.info();
        info.start = self.retained_start(&stream).await?;
        Ok(info)
    }

    /// The first offset a reader of `stream` can read: its own start, or for a fork
    /// whose start is below its fork point, as far up as its source chain trimmed
    /// (a fork reading inherited data below its source's start gets 410 too).
    pub async fn retained_start(&self, stream: &StreamRef) -> Result<Offset> {
        self.start_of(&stream.handle).await
    }

    /// `Err(Trimmed)` if `from` is below what a reader of `stream` can read. Only a
    /// read below a fork point asks the fork's sources.
    pub async fn check_retained(&self, stream: &StreamRef, from: Offset) -> Result<()> {
        let handle = &stream.handle;
        let inherited = handle.config.fork.as_ref().is_some_and(|f| from < f.point);
        if from < handle.view().start || inherited {
            let start = self.start_of(handle).await?;
            if from < start {
                return Err(EngineError::Trimmed { start });
            }
        }
        Ok(())
    }

    async fn start_of(&self, handle: &Arc<StreamHandle>) -> Result<Offset> {
        let mut start = handle.view().start;
        let mut level = handle.clone();
        let mut cap = Offset(u64::MAX);
        while let Some(origin) = level.config.fork.clone() {
            cap = cap.min(origin.point);
            if start >= cap {
                break;
            }
            let source = self
                .lookup_id(origin.source_id)
                .await?
                .ok_or_else(|| EngineError::Internal("fork source is missing".into()))?;
            start = start.max(source.view().start.min(cap));
            level = source;
        }
        Ok(start)
    }

    /// Marks a read or write access (slides the TTL).
    pub fn touch(&self, stream: &StreamRef) {
        stream.handle.touch(now_ms());
    }

    // ---- durability --------------------------------------------------------------

    async fn wait_durable(&self, handle: &StreamHandle, op_no: u64) -> Result<DurableView> {
        let epoch = &self.inner.health_epoch;
        let wait = async {
            loop {
                let view = handle.view();
                if view.op >= op_no {
                    return Ok(view);
                }
                // Read before the health: a change after this is counted before the
                // waiters are woken (`wake_waiters_on_health_changes`), so it is seen
                // below even if it came before this writer's waker was registered.
                let seen = epoch.load(Ordering::SeqCst);
                // Store down or fenced: answer now rather than at the timeout. The
                // op stays queued (store down) and may still become durable.
                self.inner.wal.check_health().map_err(|e| {
                    EngineError::Unavailable(format!(
                        "{e}; this write's outcome is unknown, retry with idempotent producer headers"
                    ))
                })?;
                // The op's waker is registered first (biased); a health change wakes
                // it, and the second branch then sees the count move.
                let health_changed = std::future::poll_fn(|_| {
                    if epoch.load(Ordering::SeqCst) == seen {
                        Poll::Pending
                    } else {
                        Poll::Ready(())
                    }
                });
                tokio::select! {
                    biased;
                    view = handle.durable_op(op_no) => return Ok(view),
                    () = health_changed => {}
                }
            }
        };
        match tokio::time::timeout(self.inner.config.append_timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(EngineError::Unavailable(format!(
                "write not durable within {:?} (object store slow or down); its outcome is unknown, retry with idempotent producer headers",
                self.inner.config.append_timeout
            ))),
        }
    }

    /// Waits until the metadata store reflects every object written so far.
    async fn index_barrier(&self) -> Result<()> {
        let target = self
            .inner
            .wal
            .stats()
            .objects_written
            .load(Ordering::Acquire);
        let mut applied = self.inner.indexer.applied.clone();
        self.inner.indexer.want(target);
        let wait = async move { applied.wait_for(|a| *a >= target).await.is_ok() };
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(true) => Ok(()),
            _ => Err(EngineError::Unavailable(
                "metadata index is behind; retry".into(),
            )),
        }
    }

    fn submit(&self, handle: &Arc<StreamHandle>, op_no: u64, op: Op) -> Result<()> {
        self.inner.wal.submit(Submission {
            stream_id: handle.config.id,
            op_no,
            op,
            listener: handle.clone(),
        })
    }

    // ---- create ------------------------------------------------------------------

    pub async fn create(&self, req: CreateRequest) -> Result<(bool, StreamInfo)> {
        self.validate_name(&req.name)?;
        if let Some(ct) = &req.content_type {
            if ct.len() > self.inner.config.content_type_bytes_max {
                return Err(EngineError::bad_request("Content-Type is too long"));
            }
        }
        if req.body.len() > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "initial body of {} bytes exceeds the limit of {} bytes",
                req.body.len(),
                self.inner.config.append_bytes_max
            )));
        }
        if req.ttl_secs.is_some() && req.expires_at.is_some() {
            return Err(EngineError::bad_request(
                "Stream-TTL and Stream-Expires-At are mutually exclusive",
            ));
        }
        validate_retention(req.retention_secs)?;
        let expires_at_ms = match &req.expires_at {
            Some(s) => Some(parse_rfc3339_ms(s).ok_or_else(|| {
                EngineError::bad_request("Stream-Expires-At must be an RFC 3339 timestamp")
            })?),
            None => None,
        };
        // Forks take the lifecycle lock so a concurrent delete of the source sees them.
        let guard = match req.fork {
            Some(_) => Some(self.inner.lifecycle.lock().await),
            None => None,
        };
        for _ in 0..STATE_RETRIES {
            if let Some(existing) = self
                .inner
                .registry
                .by_name(&req.name)
                .or(self.lookup_in(&req.name, guard.is_some()).await?)
            {
                match existing.view().lifecycle {
                    Lifecycle::SoftDeleted => {
                        return Err(EngineError::conflict(
                            "a deleted stream with live forks still holds this path; it cannot be reused until its forks are deleted",
                        ))
                    }
                    Lifecycle::Deleted => {}
                    Lifecycle::Live => {
                        if existing.view().evicted {
                            continue;
                        }
                        if existing.view().op == 0 && existing.lock().next_op > 1 {
                            self.wait_durable(&existing, 1).await?;
                        }
                        return self.confirm_existing(&existing, &req, guard.is_some()).await.map(|info| (false, info));
                    }
                }
            }
            match self.create_new(&req, expires_at_ms).await? {
                Some(info) => return Ok((true, info)),
                None => continue, // lost a race for the name; look again
            }
        }
        Err(changing_too_fast())
    }

    fn validate_name(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(EngineError::bad_request("stream name is empty"));
        }
        if name.len() > self.inner.config.stream_name_bytes_max {
            return Err(EngineError::bad_request(format!(
                "stream name is {} bytes; the limit is {}",
                name.len(),
                self.inner.config.stream_name_bytes_max
            )));
        }
        Ok(())
    }

    /// Idempotent create: 200 if the existing stream matches the request, else 409.
    async fn confirm_existing(
        &self,
        existing: &Arc<StreamHandle>,
        req: &CreateRequest,
        lifecycle_held: bool,
    ) -> Result<StreamInfo> {
        let c = &existing.config;
        let view = existing.view();
        let mismatch = |what: &str| {
            Err(EngineError::conflict(format!(
                "stream already exists with a different {what}"
            )))
        };
        let wanted_type = match (&req.content_type, &req.fork) {
            (Some(ct), _) => media_type(ct),
            (None, Some(_)) => media_type(&c.content_type),
            (None, None) => "application/octet-stream".to_string(),
        };
        if wanted_type != media_type(&c.content_type) {
            return mismatch("content type");
        }
        if req.closed != view.closed {
            return mismatch("closed state");
        }
        // Retention can change after creation (admin API): only a stated one must match.
        // Sequencer state: the retention op follows the create and may not be durable yet.
        let retention_secs = existing.lock().retention_secs;
        if req.retention_secs.is_some() && req.retention_secs != retention_secs {
            return mismatch("retention");
        }
        match (&req.fork, &c.fork) {
            (None, None) => {
                if req.ttl_secs != c.ttl_secs || req.expires_at != c.expires_at {
                    return mismatch("TTL or expiry");
                }
            }
            (Some(f), Some(origin)) => {
                let source = self.lookup_in(&f.source, lifecycle_held).await?;
                if source.as_ref().map(|s| s.config.id) != Some(origin.source_id) {
                    return mismatch("fork source");
                }
                if f.offset.is_some() && f.offset != origin.requested_offset.or(Some(origin.point))
                {
                    return mismatch("fork offset");
                }
                if f.sub_offset != origin.sub_offset {
                    return mismatch("fork sub-offset");
                }
                if req.ttl_secs.is_some() && req.ttl_secs != c.ttl_secs
                    || req.expires_at.is_some() && req.expires_at != c.expires_at
                {
                    return mismatch("TTL or expiry");
                }
            }
            _ => return mismatch("fork origin"),
        }
        Ok(StreamRef {
            handle: existing.clone(),
        }
        .info())
    }

    /// Creates a new stream; `None` if another request claimed the name first.
    async fn create_new(
        &self,
        req: &CreateRequest,
        expires_at_ms: Option<u64>,
    ) -> Result<Option<StreamInfo>> {
        let mut content_type = req
            .content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into());
        let mut ttl_secs = req.ttl_secs;
        let mut expires_at = req.expires_at.clone();
        let mut expires_at_ms = expires_at_ms;
        let mut fork = None;
        if let Some(f) = &req.fork {
            // Fork creation holds the lifecycle lock (see `create`).
            let source = match self.lookup_in(&f.source, true).await? {
                Some(s) => s,
                None => return Err(EngineError::ForkSourceNotFound),
            };
            if source.view().lifecycle == Lifecycle::SoftDeleted {
                return Err(EngineError::conflict(
                    "the fork source was deleted and cannot be forked",
                ));
            }
            match &req.content_type {
                Some(ct) if media_type(ct) != media_type(&source.config.content_type) => {
                    return Err(EngineError::conflict(format!(
                        "Content-Type {ct:?} differs from the source stream's {:?}",
                        source.config.content_type
                    )))
                }
                _ => content_type = source.config.content_type.clone(),
            }
            let tail = source.view().tail;
            let anchor = f.offset.unwrap_or(tail);
            let source_start = self.start_of(&source).await?;
            if anchor < source_start {
                return Err(EngineError::Trimmed {
                    start: source_start,
                });
            }
            if anchor > tail {
                return Err(EngineError::bad_request(
                    "Stream-Fork-Offset is beyond the source stream's tail",
                ));
            }
            if f.sub_offset > 0 && f.offset.is_none() {
                return Err(EngineError::bad_request(
                    "Stream-Fork-Sub-Offset needs an explicit Stream-Fork-Offset",
                ));
            }
            let point = if f.sub_offset > 0 {
                self.resolve_sub_offset(&source, anchor, f.sub_offset)
                    .await?
            } else {
                anchor
            };
            if ttl_secs.is_none() && expires_at.is_none() {
                ttl_secs = source.config.ttl_secs;
                expires_at = source.config.expires_at.clone();
                expires_at_ms = source.config.expires_at_ms;
            }
            fork = Some(ForkOrigin {
                source_id: source.config.id,
                point,
                requested_offset: f.offset,
                sub_offset: f.sub_offset,
            });
        }
        let json = media_type(&content_type) == "application/json";
        let records = if req.body.is_empty() {
            Vec::new()
        } else if json {
            json_records(&req.body, true)?
        } else {
            vec![req.body.clone()]
        };
        self.check_capacity()?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let created_ms = now_ms();
        let start = fork.as_ref().map_or(Offset::ZERO, |f| f.point);
        let config = StreamConfig {
            id,
            name: req.name.clone(),
            content_type: content_type.clone(),
            json,
            created_ms,
            ttl_secs,
            expires_at: expires_at.clone(),
            expires_at_ms,
            fork: fork.clone(),
        };
        let handle = Arc::new(StreamHandle::new(
            config,
            Offset::ZERO,
            None,
            start,
            false,
            None,
            None,
            HashMap::new(),
            Lifecycle::Live,
            created_ms,
            self.inner.config.tail_cache_bytes_per_stream,
        ));
        // Before the stream is registered: once it is evicted, lookups find it
        // through the filter (see `names`).
        self.inner.names.insert(&req.name);
        let active = self.inner.registry.insert(handle.clone(), |existing| {
            let v = existing.view();
            v.evicted || v.lifecycle == Lifecycle::Deleted
        });
        if !Arc::ptr_eq(&active, &handle) {
            return Ok(None);
        }
        let last_op = {
            let mut st = handle.lock();
            let create = Op::Create(CreateOp {
                name: req.name.clone(),
                content_type,
                created_ms,
                ttl_secs,
                expires_at,
                fork,
            });
            if let Err(e) = self.submit(&handle, 1, create) {
                drop(st);
                self.inner.registry.remove(&handle);
                return Err(e);
            }
            st.next_op = 2;
            if req.retention_secs.is_some() {
                // The create op predates retention; the setting travels as its own op.
                let secs = req.retention_secs;
                self.submit(&handle, 2, Op::SetRetention { secs })?;
                st.retention_secs = secs;
                st.next_op = 3;
            }
            if !records.is_empty() || req.closed {
                let op = self.build_append(&mut st, records, req.closed, None, None);
                // The create is queued; if this fails the stream exists, empty.
                let op_no = st.next_op;
                self.submit(&handle, op_no, Op::Append(op.clone()))?;
                self.commit_append(&mut st, op_no, &op);
            }
            st.next_op - 1
        };
        self.wait_durable(&handle, last_op).await?;
        Ok(Some(StreamRef { handle }.info()))
    }

    /// The fork point `sub` units past `anchor` on `source`: bytes into the next
    /// append for byte streams, messages into the next batch for JSON streams.
    async fn resolve_sub_offset(
        &self,
        source: &Arc<StreamHandle>,
        anchor: Offset,
        sub: u64,
    ) -> Result<Offset> {
        let overshoot = || {
            EngineError::bad_request("Stream-Fork-Sub-Offset is past the end of the next append")
        };
        let chunk = self
            .read_view(source, anchor, source.view().tail, 16 << 20, false)
            .await?;
        if source.config.json {
            let mut pos = anchor;
            for (i, (seg, flags)) in chunk
                .segments
                .iter()
                .zip(&chunk.flags)
                .enumerate()
                .take(sub as usize)
            {
                if i > 0 && flags & RECORD_BATCH_START != 0 {
                    return Err(overshoot());
                }
                pos = pos.advance(seg.len() as u64);
            }
            if (chunk.segments.len() as u64) < sub {
                return Err(overshoot());
            }
            Ok(pos)
        } else {
            // The first append at the anchor, as this stream's view shows it.
            let mut first_len = 0u64;
            for (i, (seg, flags)) in chunk.segments.iter().zip(&chunk.flags).enumerate() {
                if i > 0 && flags & RECORD_BATCH_START != 0 {
                    break;
                }
                first_len += seg.len() as u64;
            }
            if sub > first_len {
                return Err(overshoot());
            }
            Ok(anchor.advance(sub))
        }
    }

    // ---- append ------------------------------------------------------------------

    fn build_append(
        &self,
        st: &mut handle::State,
        data: Vec<Bytes>,
        close: bool,
        producer: Option<ProducerStamp>,
        stream_seq: Option<String>,
    ) -> AppendOp {
        let ts_ms = now_ms().max(st.last_ts_ms);
        st.last_ts_ms = ts_ms;
        let records = data
            .into_iter()
            .enumerate()
            .map(|(i, data)| Record {
                ts_ms,
                flags: if i == 0 { RECORD_BATCH_START } else { 0 },
                data,
            })
            .collect();
        AppendOp {
            start: st.tail,
            records,
            close,
            producer,
            stream_seq,
        }
    }

    fn commit_append(&self, st: &mut handle::State, op_no: u64, op: &AppendOp) {
        st.next_op = op_no + 1;
        st.tail = op.end();
        if let Some(s) = &op.stream_seq {
            st.stream_seq = Some(s.clone());
        }
        if let Some(p) = &op.producer {
            st.producers.insert(
                p.id.clone(),
                ProducerState {
                    epoch: p.epoch,
                    last_seq: p.seq,
                    last_op: op_no,
                },
            );
        }
        if op.close {
            st.closed = true;
            st.closed_by = op.producer.clone();
            st.close_op = op_no;
        }
    }

    pub async fn append(&self, req: AppendRequest) -> Result<AppendOutcome> {
        if req.body.len() > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "append of {} bytes exceeds the limit of {} bytes",
                req.body.len(),
                self.inner.config.append_bytes_max
            )));
        }
        if req.body.is_empty() && !req.close {
            return Err(EngineError::bad_request(
                "append body is empty (only a close, Stream-Closed: true, may be empty)",
            ));
        }
        if let Some(p) = &req.producer {
            if p.id.is_empty() || p.id.len() > self.inner.config.producer_id_bytes_max {
                return Err(EngineError::bad_request(format!(
                    "Producer-Id must be 1 to {} bytes",
                    self.inner.config.producer_id_bytes_max
                )));
            }
        }
        if req
            .stream_seq
            .as_ref()
            .is_some_and(|s| s.len() > self.inner.config.stream_seq_bytes_max)
        {
            return Err(EngineError::bad_request("Stream-Seq is too long"));
        }
        let started = Instant::now();
        for _ in 0..STATE_RETRIES {
            let stream = self.stream(&req.name).await?;
            let handle = stream.handle;
            handle.touch(now_ms());
            let parsed = if req.body.is_empty() {
                Ok(Vec::new())
            } else if handle.config.json {
                json_records(&req.body, false)
            } else {
                Ok(vec![req.body.clone()])
            };
            let records = parsed.as_ref().map_or(0, Vec::len) as u64;
            let (wait_op, outcome) = {
                let mut st = handle.lock();
                if st.evicted {
                    continue;
                }
                match self.sequence(&handle, &mut st, &req, parsed)? {
                    Sequenced::Wait(op, outcome) => (op, outcome),
                }
            };
            self.wait_durable(&handle, wait_op).await?;
            let c = &self.inner.counters;
            c.append_seconds.observe(started.elapsed().as_secs_f64());
            if let AppendOutcome::Appended { .. } = outcome {
                c.appends.fetch_add(1, Ordering::Relaxed);
                c.append_records.fetch_add(records, Ordering::Relaxed);
                c.append_bytes
                    .fetch_add(req.body.len() as u64, Ordering::Relaxed);
            }
            return Ok(outcome);
        }
        Err(changing_too_fast())
    }

    /// The sequencer: decides an append against the stream state, under its lock.
    fn sequence(
        &self,
        handle: &Arc<StreamHandle>,
        st: &mut handle::State,
        req: &AppendRequest,
        parsed: Result<Vec<Bytes>>,
    ) -> Result<Sequenced> {
        match st.lifecycle {
            Lifecycle::Live => {}
            Lifecycle::SoftDeleted => return Err(EngineError::Gone),
            Lifecycle::Deleted => return Err(EngineError::NotFound),
        }
        let stamp = req.producer.as_ref().map(|p| ProducerStamp {
            id: p.id.clone(),
            epoch: p.epoch,
            seq: p.seq,
        });
        if st.closed {
            if stamp.is_some() && st.closed_by == stamp {
                let p = req.producer.as_ref().expect("stamp implies producer");
                let outcome = AppendOutcome::Duplicate {
                    tail: st.tail,
                    closed: true,
                    epoch: p.epoch,
                    last_seq: p.seq,
                };
                return Ok(Sequenced::Wait(st.close_op, outcome));
            }
            if req.body.is_empty() && req.producer.is_none() {
                let outcome = AppendOutcome::Appended {
                    tail: st.tail,
                    closed: true,
                    producer: None,
                };
                return Ok(Sequenced::Wait(st.close_op, outcome));
            }
            return Err(EngineError::StreamClosed { tail: st.tail });
        }
        if !req.body.is_empty() {
            let got = req.content_type.as_deref().unwrap_or("");
            if !same_media_type(got, &handle.config.content_type) {
                return Err(EngineError::ContentTypeMismatch {
                    expected: handle.config.content_type.clone(),
                    got: got.to_string(),
                });
            }
        }
        if let Some(p) = &req.producer {
            match producer::validate(st.producers.get(&p.id), p.epoch, p.seq) {
                Verdict::Accept => {
                    if !st.producers.contains_key(&p.id)
                        && st.producers.len() >= self.inner.config.producers_per_stream_max
                    {
                        return Err(EngineError::Overloaded(format!(
                            "stream has {} producers, the limit",
                            st.producers.len()
                        )));
                    }
                }
                Verdict::Duplicate { last_seq, last_op } => {
                    let outcome = AppendOutcome::Duplicate {
                        tail: st.tail,
                        closed: st.closed,
                        epoch: p.epoch,
                        last_seq,
                    };
                    return Ok(Sequenced::Wait(last_op, outcome));
                }
                Verdict::StaleEpoch { current } => {
                    return Err(EngineError::ProducerStaleEpoch {
                        current,
                        got: p.epoch,
                    })
                }
                Verdict::EpochMustStartAtZero => {
                    return Err(EngineError::ProducerEpochMustStartAtZero)
                }
                Verdict::Gap { expected, received } => {
                    return Err(EngineError::ProducerSeqGap { expected, received })
                }
            }
        }
        if let (Some(got), Some(last)) = (&req.stream_seq, &st.stream_seq) {
            if got.as_bytes() <= last.as_bytes() {
                return Err(EngineError::StreamSeqConflict {
                    last: last.clone(),
                    got: got.clone(),
                });
            }
        }
        let records = parsed?;
        let op = self.build_append(st, records, req.close, stamp, req.stream_seq.clone());
        let op_no = st.next_op;
        self.submit(handle, op_no, Op::Append(op.clone()))?;
        self.commit_append(st, op_no, &op);
        let outcome = AppendOutcome::Appended {
            tail: st.tail,
            closed: st.closed,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
        };
        Ok(Sequenced::Wait(op_no, outcome))
    }

    // ---- delete ------------------------------------------------------------------

    pub async fn delete(&self, name: &str) -> Result<()> {
        let _guard = self.inner.lifecycle.lock().await;
        let handle = self
            .lookup_in(name, true)
            .await?
            .ok_or(EngineError::NotFound)?;
        if handle.view().lifecycle == Lifecycle::SoftDeleted {
            return Err(EngineError::Gone);
        }
        self.delete_locked(handle).await
    }

    /// Deletes a stream (soft if forks still read it), then cascades to sources that
    /// were soft-deleted and lost their last fork. Caller holds the lifecycle lock.
    async fn delete_locked(&self, mut handle: Arc<StreamHandle>) -> Result<()> {
        let mut went_dormant = 0;
        loop {
            self.index_barrier().await?;
            let forks = self.inner.meta.fork_count(handle.config.id).await?;
            let soft = forks > 0;
            let op_no = {
                let mut st = handle.lock();
                if st.lifecycle == Lifecycle::Deleted {
                    return Ok(());
                }
                if st.evicted {
                    None
                } else {
                    let op_no = st.next_op;
                    self.submit(&handle, op_no, Op::Delete { soft })?;
                    st.next_op += 1;
                    st.lifecycle = if soft {
                        Lifecycle::SoftDeleted
                    } else {
                        Lifecycle::Deleted
                    };
                    Some(op_no)
                }
            };
            let Some(op_no) = op_no else {
                // The stream went dormant while we waited for the index: a delete
                // recorded on its old handle would be invisible to the next lookup,
                // which loads the stream afresh. Act on the handle active now.
                went_dormant += 1;
                if went_dormant > STATE_RETRIES {
                    return Err(changing_too_fast());
                }
                match self.lookup_id(handle.config.id).await? {
                    Some(active) => {
                        active.touch(now_ms());
                        handle = active;
                        continue;
                    }
                    None => return Ok(()),
                }
            };
            self.wait_durable(&handle, op_no).await?;
            if soft {
                return Ok(());
            }
            self.index_barrier().await?;
            self.inner.registry.remove(&handle);
            // Cascade: a soft-deleted source whose last fork this was goes too.
            let Some(origin) = &handle.config.fork else {
                return Ok(());
            };
            let Some(source) = self.lookup_id(origin.source_id).await? else {
                return Ok(());
            };
            if source.view().lifecycle != Lifecycle::SoftDeleted
                || self.inner.meta.fork_count(source.config.id).await? > 0
            {
                return Ok(());
            }
            handle = source;
        }
    }

    // ---- trim and retention ------------------------------------------------------

    /// Drops `name`'s data below `before`: reads there answer 410 from then on, and
    /// the bytes go with GC (whole WAL objects) or compaction. Goes through the
    /// sequencer as a WAL op, so a rebuild from the bucket replays it. Trimming at or
    /// below the current start changes nothing; beyond the tail is a bad request.
    /// Returns the stream's start once the trim is durable.
    ///
    /// On a JSON stream `before` must be a message boundary (an offset the server
    /// handed out): a start inside a message would make reads from -1 begin with a
    /// fragment of it. Byte streams have no boundaries to keep.
    pub async fn trim(&self, name: &str, before: Offset) -> Result<Offset> {
        let stream = self.stream(name).await?;
        let view = stream.handle.view();
        let json = stream.handle.config.json;
        if json && before < view.tail && before > self.start_of(&stream.handle).await? {
            // The record holding the byte before `before` must end right at it.
            let last = self
                .read_view(&stream.handle, Offset(before.0 - 1), view.tail, 1, false)
                .await?;
            if last.segments.first().map(Bytes::len) != Some(1) {
                return Err(EngineError::bad_request(format!(
                    "{before} is inside a JSON message; trim at a message boundary (an offset the server returned)"
                )));
            }
        }
        self.trim_at_boundary(name, before).await
    }

    /// [`Engine::trim`] at an offset known to be a record boundary (the end of an
    /// index row, for the retention pass).
    pub async fn trim_at_boundary(&self, name: &str, before: Offset) -> Result<Offset> {
        let (start, moved) = self
            .stream_op(name, |engine, handle, st| {
                if before > st.tail {
                    return Err(EngineError::bad_request(format!(
                        "cannot trim before {before}: the stream ends at {}",
                        st.tail
                    )));
                }
                if before <= st.start {
                    // Already trimmed this far (maybe not durable yet: wait for it).
                    return Ok((st.next_op - 1, (st.start, false)));
                }
                let op_no = st.next_op;
                engine.submit(handle, op_no, Op::Trim { before })?;
                st.next_op += 1;
                st.start = before;
                Ok((op_no, (before, true)))
            })
            .await?;
        if moved {
            self.inner.counters.trims.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(stream = %name, start = %start, "stream trimmed");
        }
        Ok(start)
    }

    /// Sets (or with `None` clears) `name`'s age retention; the retention pass trims
    /// what is older (see `retention`).
    pub async fn set_retention(&self, name: &str, secs: Option<u64>) -> Result<()> {
        validate_retention(secs)?;
        self.stream_op(name, |engine, handle, st| {
            let op_no = st.next_op;
            engine.submit(handle, op_no, Op::SetRetention { secs })?;
            st.next_op += 1;
            st.retention_secs = secs;
            Ok((op_no, ()))
        })
        .await
    }

    /// Runs `decide` on a live stream's state under its lock (retrying if the
    /// stream was evicted meanwhile), then waits until the op number it returns is
    /// durable (0: nothing to wait for).
    async fn stream_op<T>(
        &self,
        name: &str,
        mut decide: impl FnMut(&Engine, &Arc<StreamHandle>, &mut handle::State) -> Result<(u64, T)>,
    ) -> Result<T> {
        for _ in 0..STATE_RETRIES {
            let handle = self.stream(name).await?.handle;
            let (op_no, out) = {
                let mut st = handle.lock();
                if st.evicted {
                    continue;
                }
                match st.lifecycle {
                    Lifecycle::Live => {}
                    Lifecycle::SoftDeleted => return Err(EngineError::Gone),
                    Lifecycle::Deleted => return Err(EngineError::NotFound),
                }
                decide(self, &handle, &mut st)?
            };
            if op_no > 0 {
                self.wait_durable(&handle, op_no).await?;
            }
            return Ok(out);
        }
        Err(changing_too_fast())
    }

    async fn expire(&self, handle: &Arc<StreamHandle>) -> Result<()> {
        let _guard = self.inner.lifecycle.lock().await;
        if handle.view().lifecycle != Lifecycle::Live {
            return Ok(());
        }
        tracing::debug!(stream = %handle.config.name, "stream expired");
        self.delete_locked(handle.clone()).await
    }

    // ---- read --------------------------------------------------------------------

    /// Reads durable data from `from`, at most about `max_bytes`.
    pub async fn read(
        &self,
        stream: &StreamRef,
        from: Offset,
        max_bytes: usize,
    ) -> Result<ReadChunk> {
        let handle = &stream.handle;
        let view = handle.view();
        if from > view.tail {
            return Err(EngineError::bad_request(
                "offset is beyond the end of the stream",
            ));
        }
        self.check_retained(stream, from).await?;
        let mut chunk = self
            .read_view(handle, from, view.tail, max_bytes, !handle.config.json)
            .await?;
        chunk.up_to_date = chunk.next >= view.tail;
        chunk.closed = chunk.up_to_date && view.closed;
        Ok(chunk)
    }

    /// Reads `[from, until)` of a stream's view: inherited data from its fork source
    /// chain, then its own records.
    async fn read_view(
        &self,
        handle: &Arc<StreamHandle>,
        from: Offset,
        until: Offset,
        max_bytes: usize,
        split: bool,
    ) -> Result<ReadChunk> {
        let mut out = ReadChunk {
            segments: Vec::new(),
            flags: Vec::new(),
            next: from,
            up_to_date: false,
            closed: false,
            json: handle.config.json,
        };
        let mut budget = max_bytes;
        // Walk the fork chain: each level serves [pos, min(its fork point, until)).
        let mut levels = vec![(handle.clone(), until)];
        while let Some(origin) = levels.last().expect("non-empty").0.config.fork.clone() {
            if out.next >= origin.point {
                break;
            }
            let cap = levels.last().expect("non-empty").1.min(origin.point);
            let source = self
                .lookup_id(origin.source_id)
                .await?
                .ok_or_else(|| EngineError::Internal("fork source is missing".into()))?;
            levels.push((source, cap));
        }
        while let Some((level, cap)) = levels.pop() {
            if out.next >= cap || (budget == 0 && !out.segments.is_empty()) {
                continue;
            }
            self.read_own(&level, &mut out, cap, &mut budget, split)
                .await?;
            if out.next < cap {
                break; // out of budget
            }
        }
        Ok(out)
    }

    /// Appends a stream's own records in `[out.next, until)` to `out`.
    async fn read_own(
        &self,
        handle: &Arc<StreamHandle>,
        out: &mut ReadChunk,
        until: Offset,
        budget: &mut usize,
        split: bool,
    ) -> Result<()> {
        while out.next < until && (*budget > 0 || out.segments.is_empty()) {
            if let Some(cached) = handle.read_cached(out.next, until, *budget, split) {
                let n: usize = cached.segments.iter().map(|s| s.len()).sum();
                let c = &self.inner.counters;
                c.reads_memory.fetch_add(1, Ordering::Relaxed);
                c.read_bytes_memory.fetch_add(n as u64, Ordering::Relaxed);
                *budget = budget.saturating_sub(n);
                out.segments.extend(cached.segments);
                out.flags.extend(cached.flags);
                out.next = cached.end;
                return Ok(());
            }
            self.read_cold(handle, out, until, budget, split).await?;
        }
        Ok(())
    }

    /// Reads records that left the tail cache from the object store, via the index.
    async fn read_cold(
        &self,
        handle: &Arc<StreamHandle>,
        out: &mut ReadChunk,
        until: Offset,
        budget: &mut usize,
        split: bool,
    ) -> Result<()> {
        // Compaction may move a row and GC delete its old object between our index
        // lookup and the GET: then the index is read again, once.
        let mut retried = false;
        'lookup: loop {
            let rows = self
                .inner
                .meta
                .chunks_from(handle.config.id, out.next, COLD_ROWS)
                .await?;
            if rows.is_empty() || rows[0].start > out.next {
                // A trim that overtook this read removed the rows.
                trimmed_under(handle, out.next)?;
                return Err(EngineError::Internal(format!(
                    "stream {} has no index entry for offset {}",
                    handle.config.name, out.next
                )));
            }
            for i in 0..rows.len() {
                if out.next >= until || (*budget == 0 && !out.segments.is_empty()) {
                    return Ok(());
                }
                let row = &rows[i];
                let bytes = match self.chunk_bytes(&rows, i, *budget).await {
                    Ok(bytes) => bytes,
                    Err(object_store::Error::NotFound { .. }) if !retried => {
                        retried = true;
                        continue 'lookup;
                    }
                    Err(e) => {
                        // GC may delete a trimmed row's object under a reader.
                        trimmed_under(handle, out.next)?;
                        return Err(EngineError::Unavailable(format!(
                            "object store read of {}: {e}",
                            row.object_key
                        )));
                    }
                };
                let (_, ops) = format::decode_chunk(&bytes)
                    .map_err(|e| EngineError::Internal(format!("{}: {e}", row.object_key)))?;
                for op in ops {
                    let Op::Append(a) = op else { continue };
                    let mut pos = a.start;
                    for record in a.records {
                        let len = record.data.len() as u64;
                        let (start, end) = (pos, pos.advance(len));
                        pos = end;
                        if end <= out.next || start >= until {
                            continue;
                        }
                        if *budget == 0 && !out.segments.is_empty() {
                            return Ok(());
                        }
                        let lo = out.next.0.max(start.0) - start.0;
                        let mut hi = until.0.min(end.0) - start.0;
                        if split {
                            hi = hi.min(lo + (*budget).max(1) as u64);
                        }
                        let piece = record.data.slice(lo as usize..hi as usize);
                        *budget = budget.saturating_sub(piece.len());
                        out.flags.push(if lo == 0 {
                            record.flags
                        } else {
                            record.flags & !RECORD_BATCH_START
                        });
                        out.segments.push(piece);
                        out.next = Offset(start.0 + hi);
                    }
                }
            }
            return Ok(());
        }
    }

    /// The bytes of `rows[i]`'s chunk: from the block cache, or fetched with the
    /// chunks after it. One ranged GET covers a *window*: a row and the rows after
    /// it lying next to it in the same object, up to `readahead_bytes` (compacted
    /// data is laid out that way). Up to `READAHEAD_WINDOWS` windows go out in
    /// parallel, as long as they are needed for `budget` or are full windows of
    /// compacted data (a catch-up reader wants them next); everything fetched goes
    /// into the block cache for the reads that follow.
    async fn chunk_bytes(
        &self,
        rows: &[ChunkRow],
        i: usize,
        budget: usize,
    ) -> object_store::Result<Bytes> {
        let cache = &self.inner.cache;
        let row = &rows[i];
        if let Some(bytes) = cache.get(&row.object_key, row.byte_range.start) {
            return Ok(bytes);
        }
        let limit = self.inner.config.readahead_bytes as u64;
        // Without a cache, chunks beyond the one asked for would be thrown away.
        let most = if cache.enabled() {
            READAHEAD_WINDOWS
        } else {
            1
        };
        let mut windows: Vec<std::ops::Range<usize>> = Vec::new();
        let mut planned = 0u64;
        let mut j = i;
        while j < rows.len() && windows.len() < most {
            if j > i && cache.contains(&rows[j].object_key, rows[j].byte_range.start) {
                j += 1;
                continue;
            }
            let first = &rows[j];
            let mut end = j + 1;
            while end < rows.len()
                && rows[end].object_key == first.object_key
                && rows[end].byte_range.start == rows[end - 1].byte_range.end
                && rows[end].byte_range.end - first.byte_range.start <= limit
            {
                end += 1;
            }
            let bytes = rows[end - 1].byte_range.end - first.byte_range.start;
            let coalesced = end - j > 1;
            if !windows.is_empty() && planned >= budget as u64 && !coalesced {
                break;
            }
            windows.push(j..end);
            planned += bytes;
            j = end;
        }
        let fetched =
            futures::future::try_join_all(windows.into_iter().map(|w| self.fetch_window(&rows[w])))
                .await?;
        Ok(fetched.into_iter().next().expect("one window"))
    }

    /// One ranged GET for adjacent chunks of one object; caches each chunk and
    /// returns the first.
    async fn fetch_window(&self, rows: &[ChunkRow]) -> object_store::Result<Bytes> {
        let first = &rows[0];
        let range = first.byte_range.start..rows[rows.len() - 1].byte_range.end;
        let bytes = self
            .inner
            .store
            .get_range(&Path::from(first.object_key.as_str()), range.clone())
            .await?;
        let c = &self.inner.counters;
        c.reads_store.fetch_add(1, Ordering::Relaxed);
        c.read_bytes_store
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let slice = |r: &ChunkRow| {
            bytes.slice(
                (r.byte_range.start - range.start) as usize
                    ..(r.byte_range.end - range.start) as usize,
            )
        };
        for r in rows {
            self.inner
                .cache
                .insert(&r.object_key, r.byte_range.start, slice(r));
        }
        Ok(slice(first))
    }

    /// Waits until data beyond `offset` is durable, the stream closes, or `timeout`.
    pub async fn wait(
        &self,
        stream: &StreamRef,
        offset: Offset,
        timeout: Duration,
    ) -> Result<WaitOutcome> {
        let mut rx = stream.handle.subscribe();
        let _parked = Parked::new(&self.inner.counters.waiting_reads);
        let wait = async {
            loop {
                let view = *rx.borrow_and_update();
                if view.tail > offset || view.closed {
                    return Ok(WaitOutcome::Ready);
                }
                match view.lifecycle {
                    Lifecycle::Live => {}
                    Lifecycle::SoftDeleted => return Err(EngineError::Gone),
                    Lifecycle::Deleted => return Err(EngineError::NotFound),
                }
                if rx.changed().await.is_err() {
                    return Err(EngineError::NotFound);
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Ok(WaitOutcome::TimedOut),
        }
    }

    // ---- listing -----------------------------------------------------------------

    pub async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Vec<StreamRow>> {
        self.index_barrier().await?;
        self.inner.meta.list(prefix, after, limit).await
    }

    /// Live streams whose names start with `prefix`, counted up to `limit` (a quota
    /// check: creates acknowledged so far are included).
    pub async fn count_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64> {
        self.index_barrier().await?;
        self.inner
            .meta
            .count_streams_with_prefix(prefix, limit)
            .await
    }

    // ---- background --------------------------------------------------------------

    async fn sweep_loop(self) {
        let period = (self.inner.config.dormancy / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(15));
        let mut tick = tokio::time::interval(period);
        // Dormant streams expire too: scan the metadata about once per dormancy
        // period (at least every second) so their deletes reach the WAL and GC can
        // reclaim their bytes without anyone reading them again.
        let scan_every = self.inner.config.dormancy.max(Duration::from_secs(1));
        let mut last_scan = tokio::time::Instant::now();
        let mut scan_after = String::new();
        loop {
            tick.tick().await;
            if last_scan.elapsed() >= scan_every {
                last_scan = tokio::time::Instant::now();
                scan_after = self.expire_dormant(scan_after).await;
            }
            let now = now_ms();
            for handle in self
                .inner
                .registry
                .filter(|h| h.view().lifecycle == Lifecycle::Live && h.is_expired(now))
            {
                if let Err(e) = self.expire(&handle).await {
                    tracing::warn!(stream = %handle.config.name, error = %e, "expiring stream failed");
                }
            }
            let idle_since = now.saturating_sub(self.inner.config.dormancy.as_millis() as u64);
            let evicted = self.inner.registry.sweep(idle_since);
            if let Err(e) = self.inner.meta.touch(&evicted).await {
                tracing::warn!(error = %e, "recording last access of dormant streams failed");
            }
        }
    }
}

impl Engine {
    /// Deletes dormant streams whose TTL or Expires-At has passed, a bounded batch
    /// of names after `after` per call; returns where the next call goes on (empty:
    /// from the start). The lookup does the check and the delete, as for a request.
    async fn expire_dormant(&self, after: String) -> String {
        const BATCH: u32 = 1000;
        let names = match self
            .inner
            .meta
            .expired_candidates(now_ms(), &after, BATCH)
            .await
        {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(error = %e, "scanning for expired streams failed");
                return after;
            }
        };
        let next = if names.len() < BATCH as usize {
            String::new()
        } else {
            names.last().cloned().unwrap_or_default()
        };
        for name in names {
            if self.inner.wal.check_health().is_err() {
                return after;
            }
            if let Err(e) = self.lookup(&name).await {
                tracing::warn!(stream = %name, error = %e, "expiring a dormant stream failed");
            }
        }
        next
    }
}

/// `Err(Trimmed)` if `pos` is now below the stream's start.
fn trimmed_under(handle: &StreamHandle, pos: Offset) -> Result<()> {
    let start = handle.view().start;
    if pos < start {
        return Err(EngineError::Trimmed { start });
    }
    Ok(())
}

/// A retention must be a positive number of seconds within `RETENTION_SECS_MAX`.
fn validate_retention(secs: Option<u64>) -> Result<()> {
    match secs {
        Some(s) if s == 0 || s > crate::config::RETENTION_SECS_MAX => {
            Err(EngineError::bad_request(format!(
                "retention must be 1 to {} seconds",
                crate::config::RETENTION_SECS_MAX
            )))
        }
        _ => Ok(()),
    }
}

/// Counts a parked reader for as long as it lives.
struct Parked<'a>(&'a AtomicU64);

impl<'a> Parked<'a> {
    fn new(gauge: &'a AtomicU64) -> Parked<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        Parked(gauge)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

enum Sequenced {
    /// Answer once sequencer op `.0` is durable.
    Wait(u64, AppendOutcome),
}

/// Splits a JSON body into messages: a top-level array is flattened one level.
/// Messages are validated but not re-encoded: each is a zero-copy slice of the body
/// (without surrounding whitespace). `allow_empty`: `[]` is fine (creating a stream).
pub fn json_records(body: &Bytes, allow_empty: bool) -> Result<Vec<Bytes>> {
    use serde_json::value::RawValue;
    let invalid =
        |e: serde_json::Error| EngineError::bad_request(format!("body is not valid JSON: {e}"));
    let not_utf8 = || EngineError::bad_request("body is not valid JSON: not UTF-8");
    let empty = || EngineError::bad_request("empty JSON array: nothing to append");
    // The fast scanner answers for most bodies; what it is unsure of (and every
    // invalid body, for the error's wording) is serde_json's to decide. A body it
    // found all ASCII needs no UTF-8 check.
    if let Some((found, ascii)) = json_scan::scan(body) {
        if !ascii && std::str::from_utf8(body).is_err() {
            return Err(not_utf8());
        }
        return match found {
            json_scan::Messages::Array(spans) if spans.is_empty() && !allow_empty => Err(empty()),
            json_scan::Messages::Array(spans) => {
                Ok(spans.into_iter().map(|span| body.slice(span)).collect())
            }
            json_scan::Messages::One(span) => Ok(vec![body.slice(span)]),
        };
    }
    let text = std::str::from_utf8(body).map_err(|_| not_utf8())?;
    if text.trim_start().starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text).map_err(invalid)?;
        if items.is_empty() && !allow_empty {
            return Err(empty());
        }
        Ok(items
            .iter()
            .map(|raw| body.slice_ref(raw.get().as_bytes()))
            .collect())
    } else {
        let raw: &RawValue = serde_json::from_str(text).map_err(invalid)?;
        Ok(vec![body.slice_ref(raw.get().as_bytes())])
    }
}

impl Engine {
    /// `Ok` while this node accepts writes.
    pub fn health(&self) -> Result<()> {
        self.inner.wal.check_health()
    }

    /// Per-store request counters (one entry per `store` label).
    pub fn store_stats(&self) -> &[Arc<StoreStats>] {
        &self.inner.store_stats
    }

    pub fn counters(&self) -> &ServiceCounters {
        &self.inner.counters
    }

    /// Writes the engine's metrics (object stores, WAL, streams, appends, reads).
    pub async fn write_metrics(&self, out: &mut Exposition) {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        crate::store::instrumented::write_metrics(out, &self.inner.store_stats);
        let wal = self.inner.wal.stats();
        out.single(
            "picomq_wal_objects_written_total",
            "counter",
            "WAL objects written to the object store (one PUT each, plus retries).",
            get(&wal.objects_written),
        )
        .single(
            "picomq_wal_bytes_written_total",
            "counter",
            "Bytes of WAL objects written.",
            get(&wal.bytes_written),
        )
        .single(
            "picomq_wal_ops_written_total",
            "counter",
            "Stream ops (appends, creates, closes, deletes) made durable.",
            get(&wal.ops_written),
        )
        .single(
            "picomq_wal_records_written_total",
            "counter",
            "Records (messages) made durable.",
            get(&wal.records_written),
        )
        .single(
            "picomq_wal_upload_retries_total",
            "counter",
            "Failed WAL upload attempts that were retried.",
            get(&wal.upload_retries),
        )
        .single(
            "picomq_wal_queued_bytes",
            "gauge",
            "Bytes accepted and waiting for a WAL upload to start.",
            get(&wal.queued_bytes),
        );
        out.family(
            "picomq_wal_flush_bytes",
            "histogram",
            "Size of each WAL object written, in bytes.",
        )
        .histogram("picomq_wal_flush_bytes", &[], &wal.flush_bytes);
        out.family(
            "picomq_wal_flush_ops",
            "histogram",
            "Stream ops packed into each WAL object (group commit).",
        )
        .histogram("picomq_wal_flush_ops", &[], &wal.flush_ops);
        out.family(
            "picomq_wal_batch_wait_seconds",
            "histogram",
            "Per WAL object, from its oldest op entering the write buffer until its upload started.",
        )
        .histogram("picomq_wal_batch_wait_seconds", &[], &wal.batch_wait_seconds);
        out.family(
            "picomq_wal_commit_seconds",
            "histogram",
            "Per WAL object, from its oldest op entering the write buffer until the object and every one before it were durable.",
        )
        .histogram("picomq_wal_commit_seconds", &[], &wal.commit_seconds);
        let health = self.inner.wal.health();
        let state = match &*health.borrow() {
            crate::wal::WalHealth::Ok => "ok",
            crate::wal::WalHealth::StoreDown(_) => "store_down",
            crate::wal::WalHealth::Fenced => "fenced",
            crate::wal::WalHealth::Stopped => "stopped",
        };
        out.family(
            "picomq_wal_state",
            "gauge",
            "1 for the WAL's current state: ok, store_down (appends fail fast), fenced (another process took over the bucket), stopped.",
        );
        for s in ["ok", "store_down", "fenced", "stopped"] {
            out.sample(
                "picomq_wal_state",
                &[("state", s)],
                if s == state { 1.0 } else { 0.0 },
            );
        }
        let cs = self.inner.compactor.stats();
        let bc = &self.inner.cache.stats;
        let ck = &self.inner.checkpoints;
        out.single(
            "picomq_checkpoints_total",
            "counter",
            "Metadata checkpoints written into the object store.",
            ck.written.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_checkpoint_failures_total",
            "counter",
            "Metadata checkpoints that failed to write (retried at the next interval).",
            ck.failures.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_checkpoint_bytes",
            "gauge",
            "Size of the last metadata checkpoint written, in bytes.",
            ck.last_bytes.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_checkpoint_last_timestamp_seconds",
            "gauge",
            "When the last metadata checkpoint was written (Unix time; 0 = none yet).",
            ck.last_written_ms.load(Ordering::Relaxed) as f64 / 1000.0,
        )
        .single(
            "picomq_gc_passes_total",
            "counter",
            "Garbage-collection passes completed.",
            self.inner.gc.passes.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_gc_failures_total",
            "counter",
            "Garbage-collection passes that failed (retried at the next interval).",
            self.inner.gc.failures.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_gc_objects_deleted_total",
            "counter",
            "WAL and compacted objects deleted by garbage collection (nothing pointed into them).",
            self.inner.gc.objects_deleted.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_gc_bytes_deleted_total",
            "counter",
            "Bytes of the WAL objects deleted by garbage collection.",
            self.inner.gc.bytes_deleted.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_passes_total",
            "counter",
            "Compaction passes completed.",
            cs.passes.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_failures_total",
            "counter",
            "Compaction passes that failed (retried at the next interval).",
            cs.failures.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_objects_read_total",
            "counter",
            "WAL objects read by compaction.",
            cs.objects_read.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_bytes_read_total",
            "counter",
            "Bytes of WAL objects read by compaction.",
            cs.bytes_read.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_objects_written_total",
            "counter",
            "Compacted objects (segments and packs) written.",
            cs.objects_written.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_bytes_written_total",
            "counter",
            "Bytes of compacted objects written.",
            cs.bytes_written.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_compaction_rows_replaced_total",
            "counter",
            "Index rows moved off WAL objects by compaction.",
            cs.rows_replaced.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_block_cache_hits_total",
            "counter",
            "Cold reads served from the block cache.",
            bc.hits.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_block_cache_misses_total",
            "counter",
            "Cold reads that had to GET from the object store.",
            bc.misses.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_block_cache_bytes",
            "gauge",
            "Bytes held by the block cache.",
            bc.bytes.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_recovery_objects_replayed",
            "gauge",
            "WAL objects replayed into the metadata at start.",
            self.inner.recovered.0 as f64,
        )
        .single(
            "picomq_recovery_checkpoint_restored",
            "gauge",
            "1 if the metadata was restored from a checkpoint in the object store at start.",
            f64::from(u8::from(self.inner.recovered.1)),
        );
        let indexed = *self.inner.indexer.applied.borrow();
        out.single(
            "picomq_index_failures_total",
            "counter",
            "Failed metadata index transactions (retried).",
            self.inner.indexer.failures.load(Ordering::Relaxed) as f64,
        )
        .single(
            "picomq_index_lag_objects",
            "gauge",
            "WAL objects durable but not yet in the metadata index.",
            // Read after `indexed`: it only grows, so it is never below it.
            (get(&wal.objects_written) - indexed as f64).max(0.0),
        )
        .single(
            "picomq_appends_total",
            "counter",
            "Appends acknowledged as durable (idempotent duplicates excluded).",
            get(&c.appends),
        )
        .family(
            "picomq_append_duration_seconds",
            "histogram",
            "Per append, from entering the engine (body read) until acknowledged durable.",
        )
        .histogram("picomq_append_duration_seconds", &[], &c.append_seconds)
        .single(
            "picomq_trims_total",
            "counter",
            "Trims that moved a stream's start (by request or by age retention).",
            get(&c.trims),
        )
        .single(
            "picomq_append_records_total",
            "counter",
            "Records (messages; a JSON array counts each element) in acknowledged appends.",
            get(&c.append_records),
        )
        .single(
            "picomq_append_bytes_total",
            "counter",
            "Request body bytes of acknowledged appends.",
            get(&c.append_bytes),
        );
        out.family(
            "picomq_reads_total",
            "counter",
            "Read steps by tier: memory (tail cache) or store (ranged GET of an indexed chunk).",
        )
        .sample(
            "picomq_reads_total",
            &[("tier", "memory")],
            get(&c.reads_memory),
        )
        .sample(
            "picomq_reads_total",
            &[("tier", "store")],
            get(&c.reads_store),
        );
        out.family(
            "picomq_read_bytes_total",
            "counter",
            "Bytes read by tier (store: whole chunks fetched).",
        )
        .sample(
            "picomq_read_bytes_total",
            &[("tier", "memory")],
            get(&c.read_bytes_memory),
        )
        .sample(
            "picomq_read_bytes_total",
            &[("tier", "store")],
            get(&c.read_bytes_store),
        );
        out.single(
            "picomq_waiting_reads",
            "gauge",
            "Live readers parked waiting for new data (long-polls and SSE connections between events).",
            get(&c.waiting_reads),
        );
        out.single(
            "picomq_active_streams",
            "gauge",
            "Streams currently held in memory.",
            self.inner.registry.len() as f64,
        );
        if let Ok(n) = self.inner.meta.stream_count().await {
            out.single(
                "picomq_streams",
                "gauge",
                "Streams that exist (not deleted), active or dormant.",
                n as f64,
            );
        }
    }
}

#[cfg(test)]
mod json_tests {
    use super::*;

    #[test]
    fn flattens_one_level_without_copying() {
        let body = Bytes::from_static(br#" [ {"a": 1}, [2, 3], "x" ] "#);
        let records = json_records(&body, false).unwrap();
        assert_eq!(
            records,
            vec![
                Bytes::from_static(br#"{"a": 1}"#),
                Bytes::from_static(b"[2, 3]"),
                Bytes::from_static(br#""x""#)
            ]
        );
        assert_eq!(
            records[0].as_ptr(),
            body[3..].as_ptr(),
            "a slice of the body, not a copy"
        );
        assert_eq!(
            json_records(&Bytes::from_static(b"[[[1]]]"), false).unwrap(),
            vec![Bytes::from_static(b"[[1]]")]
        );
        assert_eq!(
            json_records(&Bytes::from_static(b"7"), false).unwrap(),
            vec![Bytes::from_static(b"7")]
        );
    }

    #[test]
    fn rejects_invalid_and_empty() {
        assert!(json_records(&Bytes::from_static(b"[]"), false).is_err());
        assert!(json_records(&Bytes::from_static(b"[]"), true)
            .unwrap()
            .is_empty());
        for bad in [&b"{"[..], b"[1,]", b"nope", b"[1] 2", b"\xff"] {
            assert!(
                json_records(&Bytes::copy_from_slice(bad), false).is_err(),
                "{bad:?}"
            );
        }
    }
}
