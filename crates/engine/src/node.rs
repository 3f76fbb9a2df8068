//! The engine of one node: what it holds, how it starts (recovery, then the WAL
//! writer, the indexer and every background pass under one scheduler), how it
//! stops, and what it reports (health, metrics). The stream operations themselves
//! are in `stream`, one file per verb.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use tokio::sync::mpsc;

use crate::background::checkpoint::Checkpointer;
use crate::background::compaction::{Compactor, PassReport};
use crate::background::gc::{Collector, Scope};
use crate::background::packer::{Packer, WarmFrom};
use crate::background::{Every, Scheduler};
use crate::cluster::membership::Membership;
use crate::cluster::takeover::Takeover;
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::indexer;
use crate::meta::Meta;
use crate::metrics::{Desc, Exposition, Source};
use crate::read::cold::ColdReader;
use crate::store::instrumented::{InstrumentedStore, StoreStats};
use crate::stream::names::NameFilter;
use crate::stream::registry::Registry;
use crate::stream::{ClusterSide, Service, ServiceCounters, Shared};
use crate::wal::system::SystemLog;
use crate::wal::Wal;

/// What the node holds besides its stream service: the bucket, the background
/// passes and what recovery found.
pub(crate) struct Node {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) scheduler: Scheduler,
    pub(crate) epoch: u64,
    pub(crate) store_stats: Vec<Arc<StoreStats>>,
    pub(crate) checkpointer: Arc<Checkpointer>,
    pub(crate) collector: Arc<Collector>,
    pub(crate) compactor: Arc<Compactor>,
    pub(crate) packer: Arc<Packer>,
    /// What recovery did at start: WAL objects replayed, checkpoint restored.
    pub(crate) recovered: (u64, bool),
    /// The cluster and metadata this node's store belongs to, checked at start.
    pub(crate) binding: crate::identity::Binding,
}

/// The storage engine and stream service of one node. The stream operations are the
/// [`Service`]'s (it derefs to it); the node adds its start, stop and passes.
#[derive(Clone)]
pub struct Engine {
    service: Service,
    node: Arc<Node>,
}

impl std::ops::Deref for Engine {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

pub struct EngineStats {
    pub wal: Arc<crate::wal::WalStats>,
    pub active_streams: usize,
    pub index_failures: u64,
}

/// The cluster-wide job of compaction and of collecting finished members' logs:
/// one member at a time, so compaction's commits and collection never overlap.
const MAINTENANCE_JOB: &str = "maintenance";

/// How long readiness waits for the warm-up after a restart (`Packer::warm`) at
/// most; past it the warm-up goes on in the background and readers wait for the
/// objects it is fetching.
pub(crate) const WARM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a graceful stop waits for its last pack at most.
const PACK_AT_STOP: Duration = Duration::from_secs(2);

static RECOVERY_REPLAYED: Desc = Desc::gauge(
    "picomq_recovery_objects_replayed",
    "WAL objects replayed into the metadata at start.",
);
static RECOVERY_CHECKPOINT: Desc = Desc::gauge(
    "picomq_recovery_checkpoint_restored",
    "1 if the metadata was restored from a checkpoint in the object store at start.",
);

impl Engine {
    /// Opens the engine: recovers the metadata from the bucket, then starts the WAL
    /// writer, the indexer and the background passes. The store is instrumented here
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
        let coordinator = match (&config.cluster, meta.coordinator()) {
            (Some(cluster), Some(coord)) => Some((cluster.clone(), coord)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(EngineError::bad_request(
                    "cluster settings need a metadata store shared by the nodes (--meta postgres://...)",
                ))
            }
            (None, Some(_)) => {
                return Err(EngineError::bad_request(
                    "a shared metadata store (Postgres) needs cluster settings (node id, advertised URL)",
                ))
            }
        };
        // Recovery and takeovers make many requests and must finish as a whole: each
        // request is retried on its own rather than the whole pass.
        let patient: Arc<dyn ObjectStore> =
            Arc::new(crate::store::retrying::RetryingStore::new(store.clone()));
        // Before anything is written to the bucket: this metadata and this prefix
        // must belong to each other (see `identity`).
        let binding = crate::identity::bind(&*patient, &meta, &config.store_name).await?;
        tracing::info!(
            cluster = %binding.cluster_id,
            store = %binding.store,
            meta = %format!("{} {}", binding.meta_kind, binding.meta_id),
            "the metadata and the store belong to each other"
        );
        let recovered = match &coordinator {
            // A member recovers nothing itself: its log is new, and the logs of
            // members that died are taken over by the membership loop.
            Some((cluster, coord)) => {
                let epoch = crate::cluster::membership::join(&*patient, &**coord, cluster).await?;
                crate::recovery::Recovered {
                    epoch,
                    objects_replayed: 0,
                    listed_bytes: 0,
                    restored_from: None,
                }
            }
            None => crate::recovery::recover(&*patient, &meta).await?,
        };
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
            cluster = %binding.cluster_id,
            store = %binding.store,
            meta = %format!("{} {}", binding.meta_kind, binding.meta_id),
            replayed = recovered.objects_replayed,
            checkpoint = ?recovered.restored_from,
            "recovered from the object store"
        );
        // A member indexes through a view that refuses its batches once it is fenced.
        let meta = match coordinator {
            Some(_) => meta.for_member(recovered.epoch),
            None => meta,
        };
        let next_id = meta.next_stream_id().await?;
        let names = match coordinator {
            Some(_) => NameFilter::off(),
            None => {
                // Ids are handed out in order, so `next_id` bounds the rows to name.
                let names = NameFilter::for_names(next_id.saturating_sub(1) as usize);
                let named = meta.for_each_name(10_000, &mut |n| names.insert(n)).await?;
                tracing::debug!(named, bytes = names.bytes(), "stream name filter built");
                names
            }
        };
        let (index_tx, index_rx) = mpsc::channel(256);
        // Rows that stay in the WAL go into the block cache as they are written,
        // where packs would (remote stores): the writer keeps their objects' bytes.
        let mut wal_config = config.wal.clone();
        wal_config.rows_cached_from = config
            .compaction
            .wal_rows_final_bytes
            .filter(|_| config.pack.write_through && config.pack.interval.is_some());
        let wal = Wal::start(store.clone(), wal_config, recovered.epoch, 0, index_tx);
        let scheduler = Scheduler::new(wal.health());
        let system = Arc::new(SystemLog::new(wal.clone()));
        let compactor = Arc::new(Compactor::new(
            store.clone(),
            meta.clone(),
            recovered.epoch,
            config.compaction.clone(),
            scheduler.maintenance(),
            system.clone(),
        ));
        let cold = ColdReader::new(
            store.clone(),
            meta.clone(),
            config.block_cache_bytes,
            config.readahead_bytes,
        );
        let packer = Arc::new(Packer::new(
            compactor.clone(),
            store.clone(),
            meta.clone(),
            config.pack.clone(),
            cold.cache().enabled().then(|| cold.shared_cache()),
        ));
        // Where the last incarnation's recent history is (see `Packer::warm`): the
        // rows still in its WAL objects, and its packs.
        let warm_from = match coordinator {
            Some(_) => None,
            None => meta.watermark().await?,
        };
        let warm_from = warm_from.map(|w| WarmFrom::log(w.epoch));
        let feed_packer = || -> indexer::OnApplied {
            match config.pack.interval {
                Some(_) => {
                    let packer = packer.clone();
                    Box::new(move |objects| packer.feed(objects))
                }
                None => Box::new(|_| {}),
            }
        };
        let (index_task, indexer) = indexer::spawn(meta.clone(), index_rx, feed_packer());
        scheduler.keep(async move {
            let _ = index_task.await;
        });
        let checkpointer = Arc::new(Checkpointer::new(
            store.clone(),
            meta.clone(),
            config.clock.clone(),
            meta.watermark().await?,
        ));
        let collector = Arc::new(Collector::new(store.clone(), meta.clone(), wal_stats));
        let epoch = recovered.epoch;
        let cluster = coordinator
            .map(|(config, coord)| Arc::new(crate::cluster::Cluster::new(config, coord, epoch)));
        let takeover = cluster.as_ref().map(|c| {
            Arc::new(Takeover {
                cluster: c.clone(),
                store: patient.clone(),
                meta: meta.clone(),
                on_applied: feed_packer(),
                warm: std::sync::OnceLock::new(),
            })
        });
        let service = Service::new(Shared {
            clock: config.clock.clone(),
            config,
            meta,
            wal,
            registry: Registry::default(),
            names,
            next_id: AtomicU64::new(next_id),
            lifecycle: tokio::sync::Mutex::new(()),
            indexer,
            counters: ServiceCounters::default(),
            health_epoch: AtomicU64::new(0),
            pressure_sweep_ms: AtomicU64::new(0),
            cold,
            system,
            cluster: cluster.clone().map(ClusterSide::new),
            append_check: std::sync::OnceLock::new(),
            retention_hold: std::sync::OnceLock::new(),
        });
        let node = Arc::new(Node {
            store,
            scheduler,
            epoch,
            store_stats,
            checkpointer,
            collector,
            compactor,
            packer,
            recovered: (
                recovered.objects_replayed,
                recovered.restored_from.is_some(),
            ),
            binding,
        });
        let engine = Engine { service, node };
        engine.schedule_passes();
        if let (Some(cluster), Some(takeover)) = (cluster, takeover) {
            engine.join_cluster(cluster, takeover);
        }
        if let (Some(_), Some(from)) = (engine.service.inner.config.pack.interval, warm_from) {
            // Readiness waits for the warm-up, a little: the first reads after a
            // restart then find the recent history in the cache.
            let warmed = engine.warm_up(from);
            let _ = tokio::time::timeout(WARM_WAIT, warmed).await;
        }
        Ok(engine)
    }

    /// Starts the membership loop (see `cluster::membership`). Losing the lease for
    /// good (another member took this one's log over) fences the WAL.
    fn join_cluster(&self, cluster: Arc<crate::cluster::Cluster>, takeover: Arc<Takeover>) {
        if self.service.inner.config.pack.interval.is_some() {
            // Weak: the membership loop that holds the takeover lives in the node.
            let (service, node) = (self.service.clone(), Arc::downgrade(&self.node));
            let _ = takeover
                .warm
                .set(Box::new(move |epoch| match node.upgrade() {
                    Some(node) => {
                        let from = WarmFrom::log(epoch);
                        Engine {
                            service: service.clone(),
                            node,
                        }
                        .warm_up(from)
                    }
                    None => tokio::sync::oneshot::channel().1,
                }));
        }
        let wal = self.service.inner.wal.clone();
        let on_fenced: Box<dyn Fn() + Send + Sync> = Box::new(move || wal.fence());
        let watch = crate::identity::Watch {
            binding: self.node.binding.clone(),
        };
        let membership = Membership::new(cluster, self.service.clone(), takeover, on_fenced, watch);
        self.node.scheduler.keep(membership.run());
    }

    /// Brings back the recent history of the last incarnation (see
    /// `Packer::warm`), in a task of its own; the answer comes once it is in the
    /// cache (the packing that follows goes on after).
    fn warm_up(&self, from: WarmFrom) -> tokio::sync::oneshot::Receiver<()> {
        let (packer, service) = (self.node.packer.clone(), self.service.clone());
        let (warmed, answer) = tokio::sync::oneshot::channel();
        self.node.scheduler.keep(async move {
            let started = std::time::Instant::now();
            let result = packer.warm(&service.inner.cold, &from).await;
            let _ = warmed.send(());
            match result {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(objects = n, elapsed = ?started.elapsed(), "recent history read back into the cache");
                    packer.pass().await;
                    tracing::debug!(elapsed = ?started.elapsed(), "recent history packed");
                }
                Err(e) => tracing::warn!(error = %e, "warming up recent history failed; reads fetch it as they come"),
            }
        });
        answer
    }

    /// Every periodic pass of the node, under its one scheduler.
    fn schedule_passes(&self) {
        let config = &self.service.inner.config;
        let sched = &self.node.scheduler;
        sched.keep(self.service.clone().wake_waiters_on_health_changes());
        let engine = self.service.clone();
        let sweep = crate::stream::dormancy::period(config.dormancy);
        let mut dormancy = crate::stream::dormancy::Sweeper::new(config.dormancy);
        // Runs after fencing too: it only drops handles from memory and expires
        // streams through the WAL, which refuses writes once fenced.
        let every = Every {
            while_writer: false,
            ..Every::writer("dormancy", sweep)
        };
        sched.every(every, move || {
            let engine = engine.clone();
            let step = dormancy.step();
            async move { engine.dormancy_pass(step).await }
        });
        let cluster = self.service.cluster().cloned();
        // In a cluster every member claims epochs: a newer claim is no sign of a
        // takeover there (its lease says that).
        if let Some(interval) = config.fence_check_interval.filter(|_| cluster.is_none()) {
            let (store, wal, epoch, meta) = (
                self.node.store.clone(),
                self.service.inner.wal.clone(),
                self.node.epoch,
                self.service.inner.meta.clone(),
            );
            let watch = Arc::new(crate::identity::Watch {
                binding: self.node.binding.clone(),
            });
            sched.every(Every::writer("fence-watch", interval), move || {
                let (store, wal, meta, watch) =
                    (store.clone(), wal.clone(), meta.clone(), watch.clone());
                async move {
                    if let Ok(true) = crate::fencing::superseded(&*store, epoch).await {
                        wal.fence();
                    } else if let Some(why) = watch.changed(&*store, &meta).await {
                        tracing::error!(binding = %watch.binding, "the store and the metadata no longer belong to each other: {why}; this node stops acknowledging writes");
                        wal.fence();
                    }
                }
            });
        }
        self.schedule_checkpoints();
        if let Some(interval) = config.gc_interval {
            let collector = self.node.collector.clone();
            let every = Every {
                exclusive: true,
                ..Every::writer("gc", interval)
            };
            let (cluster, applied) = (cluster.clone(), self.service.inner.indexer.applied.clone());
            sched.every(every, move || {
                let (collector, cluster, applied) =
                    (collector.clone(), cluster.clone(), applied.clone());
                async move {
                    let scope = match cluster {
                        None => Scope::Checkpointed,
                        Some(c) => {
                            let indexed_below = *applied.borrow();
                            Scope::Member {
                                epoch: c.epoch,
                                indexed_below,
                                finished: c.finished_logs(interval).await,
                            }
                        }
                    };
                    collector.pass(&scope).await
                }
            });
        }
        if let Some(interval) = config.compaction.interval {
            // Not exclusive: a pass takes the maintenance lock round by round.
            let compactor = self.node.compactor.clone();
            let job = cluster.clone();
            sched.every(Every::writer("compaction", interval), move || {
                let (compactor, job) = (compactor.clone(), job.clone());
                async move {
                    let held = move || {
                        let job = job.clone();
                        async move {
                            crate::cluster::holds_job(job.as_deref(), MAINTENANCE_JOB, interval)
                                .await
                        }
                    };
                    if held().await {
                        compactor.scheduled_pass(held).await
                    }
                }
            });
        }
        if let Some(interval) = config.pack.interval {
            let packer = self.node.packer.clone();
            let wake = Some(packer.wake());
            sched.every_or_woken(Every::writer("pack", interval), wake, move || {
                let packer = packer.clone();
                async move { packer.pass().await }
            });
        }
        if let Some(interval) = config.retention_interval {
            let engine = self.service.clone();
            let after = Arc::new(std::sync::Mutex::new(String::new()));
            sched.every(Every::writer("retention", interval), move || {
                let (engine, after) = (engine.clone(), after.clone());
                async move {
                    let from = after.lock().expect("retention cursor").clone();
                    let next = crate::stream::retention::pass(
                        &engine,
                        from,
                        crate::stream::retention::STREAMS_PER_PASS,
                    )
                    .await;
                    *after.lock().expect("retention cursor") = next;
                }
            });
        }
    }

    /// The checkpoint pass, for a local index only: a store of record (Postgres)
    /// has nothing to checkpoint and recovery never restores one.
    fn schedule_checkpoints(&self) {
        let Some(interval) = self.service.inner.config.checkpoint_interval else {
            return;
        };
        if self.service.inner.meta.local_index().is_none() {
            tracing::info!(
                "metadata checkpoints off: the metadata store is the metadata of record, not a local index"
            );
            return;
        }
        let checkpointer = self.node.checkpointer.clone();
        let every = Every::writer("checkpoint", interval);
        self.node.scheduler.every(every, move || {
            let checkpointer = checkpointer.clone();
            async move { checkpointer.pass().await }
        });
    }

    pub fn epoch(&self) -> u64 {
        self.node.epoch
    }

    /// The cluster and metadata this node's store belongs to (checked at start).
    pub fn binding(&self) -> &crate::identity::Binding {
        &self.node.binding
    }

    /// Resolves once this node is fenced: another process took its log over (on
    /// one node, a newer process on the same bucket; in a cluster, a member that
    /// judged this one's lease lapsed). Never resolves otherwise.
    pub async fn fenced(&self) {
        let mut health = self.service.inner.wal.health();
        loop {
            if matches!(*health.borrow_and_update(), crate::wal::WalHealth::Fenced) {
                return;
            }
            if health.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    pub fn stats(&self) -> EngineStats {
        let inner = &self.service.inner;
        EngineStats {
            wal: inner.wal.stats(),
            active_streams: inner.registry.len(),
            index_failures: inner.indexer.failures.get(),
        }
    }

    /// The node's object store, rooted at its prefix: for features that keep
    /// their own objects there (Iceberg tables, under `tables/`), which the
    /// engine's garbage collection never touches.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.node.store.clone()
    }

    /// Per-store request counters (one entry per `store` label).
    pub fn store_stats(&self) -> &[Arc<StoreStats>] {
        &self.node.store_stats
    }

    /// Runs a compaction pass now over data older than `delay` (default: the
    /// configured delay); see `compaction`. Everything acknowledged before the call
    /// is indexed first, so the pass sees it (the indexer may be lingering).
    pub async fn compact(&self, delay: Option<Duration>) -> Result<PassReport> {
        self.service.inner.wal.check_health()?;
        self.service.index_barrier().await?;
        self.node.compactor.pass(delay).await
    }

    /// Stops accepting writes and makes everything accepted durable and indexed. A
    /// cluster member first hands its streams to the others (within `drain`), and
    /// leaves once its log is indexed.
    pub async fn shutdown(&self) {
        self.shutdown_within(Duration::from_secs(10)).await
    }

    /// Packs what is still only in the WAL, now (within a few seconds at most): a
    /// stopping node does it before it hands its streams over and again before it
    /// stops, so whoever reads them next reads packs.
    pub async fn pack_unpacked(&self) {
        if self.service.inner.config.pack.interval.is_some() {
            let _ = tokio::time::timeout(PACK_AT_STOP, self.node.packer.pack_now()).await;
        }
    }

    /// [`Engine::shutdown`], giving a cluster member `drain` to hand over its streams.
    pub async fn shutdown_within(&self, drain: Duration) {
        // What is only in the WAL goes into a pack first (bounded: a slow store
        // must not hold the stop): the next incarnation's warm-up, or a member
        // taking streams over by hand-over (which warms nothing), reads a few packs
        // instead of one GET per WAL object per stream.
        self.pack_unpacked().await;
        let cluster = self.service.cluster().cloned();
        let drained = match &cluster {
            Some(c) => c.drain_all(drain).await,
            None => false,
        };
        self.service.inner.wal.shutdown().await;
        let indexed = self.service.index_barrier().await.is_ok();
        if let (Some(c), true, true) = (&cluster, drained, indexed) {
            if c.mark_left().await {
                tracing::info!("left the cluster: every stream handed over, the log indexed");
            }
        }
        self.node.scheduler.stop();
    }

    /// Writes the engine's metrics: object stores, WAL, index, background passes,
    /// caches, and the stream service.
    pub async fn write_metrics(&self, out: &mut Exposition) {
        let (node, inner) = (&self.node, &self.service.inner);
        crate::store::instrumented::write_metrics(out, &node.store_stats);
        inner.wal.export(out);
        node.checkpointer.stats.export(out);
        node.collector.stats.export(out);
        node.compactor.stats().export(out);
        node.packer.stats.export(out);
        inner.cold.cache().stats.export(out);
        if let Some(cluster) = self.service.cluster() {
            cluster.export(out);
        }
        out.value(&RECOVERY_REPLAYED, &[], node.recovered.0 as f64)
            .value(
                &RECOVERY_CHECKPOINT,
                &[],
                f64::from(u8::from(node.recovered.1)),
            );
        inner
            .indexer
            .export(inner.wal.stats().objects_written.get(), out);
        self.service.export_service(out).await;
    }
}
