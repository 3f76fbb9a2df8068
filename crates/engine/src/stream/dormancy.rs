//! The dormancy pass: active streams idle for `--dormancy` leave memory (their last
//! access goes to the metadata), active streams past their TTL or Expires-At are
//! deleted, and about once per dormancy period the metadata is scanned for dormant
//! streams that expired, so their deletes reach the WAL and GC can reclaim their
//! bytes without anyone reading them again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::handle::Lifecycle;
use crate::stream::Service;

/// Expired dormant streams deleted per scan, at most.
const EXPIRE_BATCH: u32 = 1000;

/// How often the pass runs: a quarter of the dormancy, within 50 ms to 15 s.
pub(crate) fn period(dormancy: Duration) -> Duration {
    (dormancy / 4).clamp(Duration::from_millis(50), Duration::from_secs(15))
}

/// What the pass remembers between runs: when it last scanned the metadata, and
/// where the next scan goes on.
pub(crate) struct Sweeper {
    scan_every: Duration,
    last_scan: Instant,
    cursor: Arc<Mutex<String>>,
}

/// One run of the pass: whether it scans the metadata for expired streams.
pub(crate) struct Step {
    scan: Option<Arc<Mutex<String>>>,
}

impl Sweeper {
    pub(crate) fn new(dormancy: Duration) -> Sweeper {
        Sweeper {
            scan_every: dormancy.max(Duration::from_secs(1)),
            last_scan: Instant::now(),
            cursor: Arc::default(),
        }
    }

    pub(crate) fn step(&mut self) -> Step {
        let scan = (self.last_scan.elapsed() >= self.scan_every).then(|| {
            self.last_scan = Instant::now();
            self.cursor.clone()
        });
        Step { scan }
    }
}

impl Service {
    pub(crate) async fn dormancy_pass(&self, step: Step) {
        if let Some(cursor) = step.scan {
            let after = cursor.lock().expect("dormancy cursor").clone();
            let next = self.expire_dormant(after).await;
            *cursor.lock().expect("dormancy cursor") = next;
        }
        let now = self.inner.clock.now_ms();
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

    /// Deletes dormant streams whose TTL or Expires-At has passed, a bounded batch
    /// of names after `after` per call; returns where the next call goes on (empty:
    /// from the start). The lookup does the check and the delete, as for a request.
    async fn expire_dormant(&self, after: String) -> String {
        let names = match self
            .inner
            .meta
            .expired_candidates(self.inner.clock.now_ms(), &after, EXPIRE_BATCH)
            .await
        {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(error = %e, "scanning for expired streams failed");
                return after;
            }
        };
        let next = if names.len() < EXPIRE_BATCH as usize {
            String::new()
        } else {
            names.last().cloned().unwrap_or_default()
        };
        for name in names {
            if self.inner.wal.check_health().is_err() {
                return after;
            }
            // In a cluster each owner expires its own streams.
            if !self.serves(&name) {
                continue;
            }
            if let Err(e) = self.lookup(&name).await {
                tracing::warn!(stream = %name, error = %e, "expiring a dormant stream failed");
            }
        }
        next
    }
}
