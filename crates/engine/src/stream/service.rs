//! The stream service's state: what every verb works on. The node (`node.rs`)
//! builds it after recovery and hands it the WAL, the metadata and the cold-read
//! path; the service knows nothing of the node's background passes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::names::NameFilter;
use super::registry::Registry;
use super::ServiceCounters;
use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::error::Result;
use crate::indexer::IndexerProgress;
use crate::meta::Meta;
use crate::read::cold::ColdReader;
use crate::wal::system::SystemLog;
use crate::wal::Wal;

pub(crate) struct Shared {
    pub(crate) config: EngineConfig,
    pub(crate) clock: Clock,
    pub(crate) meta: Meta,
    pub(crate) wal: Wal,
    pub(crate) registry: Registry,
    /// Every name in the metadata: a lookup it rules out skips SQLite.
    pub(crate) names: NameFilter,
    pub(crate) next_id: AtomicU64,
    /// Serializes deletes and fork creation, which must agree on fork counts.
    pub(crate) lifecycle: tokio::sync::Mutex<()>,
    pub(crate) indexer: IndexerProgress,
    pub(crate) counters: ServiceCounters,
    /// Counts the WAL's health changes; bumped before the writers waiting on any
    /// stream are woken to look at the health again (`wait_durable`).
    pub(crate) health_epoch: AtomicU64,
    /// When an at-capacity request last swept for early evictions (ms since epoch).
    pub(crate) pressure_sweep_ms: AtomicU64,
    pub(crate) cold: ColdReader,
    /// The node's own ops (tokens, server keys; compaction's relocations too).
    pub(crate) system: Arc<SystemLog>,
    /// The node's membership of a cluster, if it is in one.
    pub(crate) cluster: Option<super::cluster::ClusterSide>,
    /// What every append is checked against before it is sequenced (the schema
    /// registry's bindings), once the edge installs it.
    pub(crate) append_check: std::sync::OnceLock<Arc<dyn crate::schemas::AppendCheck>>,
    /// Streams whose age retention waits for someone else to trim them (a table
    /// that tiers their history), once the edge installs it.
    pub(crate) retention_hold: std::sync::OnceLock<Arc<dyn super::retention::RetentionHold>>,
}

/// The stream service of one node: create, append, read, lifecycle, and the
/// dormancy and retention passes. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<Shared>,
}

/// A [`Service`] that does not keep it alive: for what the service itself holds
/// (the append check), which would otherwise keep the node's WAL, store and
/// metadata open after it stopped.
#[derive(Clone)]
pub struct WeakService(std::sync::Weak<Shared>);

impl WeakService {
    /// The service, while it runs.
    pub fn upgrade(&self) -> Option<Service> {
        self.0.upgrade().map(|inner| Service { inner })
    }
}

impl Service {
    pub fn downgrade(&self) -> WeakService {
        WeakService(Arc::downgrade(&self.inner))
    }

    pub(crate) fn new(shared: Shared) -> Service {
        Service {
            inner: Arc::new(shared),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The node's clock (wall time for TTLs, expiry, token lifetimes).
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    pub fn meta(&self) -> &Meta {
        &self.inner.meta
    }

    /// `Ok` while this node accepts writes.
    pub fn health(&self) -> Result<()> {
        self.inner.wal.check_health()
    }

    /// One subscriber to the WAL's health for all waiting writers: each change is
    /// counted, then every writer waiting on a stream is woken to look at it. Every
    /// append subscribing itself took the health watch's lock, which all of them
    /// share, twice per append.
    pub(crate) async fn wake_waiters_on_health_changes(self) {
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
}
