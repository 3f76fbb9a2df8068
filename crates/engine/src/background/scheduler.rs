//! The scheduler of periodic passes: each pass runs on its own task every interval
//! (with jitter, so passes of many nodes or many kinds do not line up), stops for
//! good once the node is fenced or stopped if it works on the bucket, and can take
//! the node's one maintenance lock, which serializes passes that must not overlap
//! (GC and compaction rounds, see `gc`). A pass that fails logs and waits for its
//! next turn; the scheduler never retries faster than the interval.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::wal::WalHealth;

/// When and how a pass runs.
#[derive(Clone, Copy, Debug)]
pub struct Every {
    /// For logs.
    pub name: &'static str,
    pub interval: Duration,
    /// Stop once the WAL is fenced or stopped: the pass writes to the bucket or the
    /// metadata, which a node that lost the bucket must not do.
    pub while_writer: bool,
    /// Hold the maintenance lock while the pass runs.
    pub exclusive: bool,
}

impl Every {
    /// A pass on the bucket (stops when fenced), not exclusive.
    pub fn writer(name: &'static str, interval: Duration) -> Every {
        Every {
            name,
            interval,
            while_writer: true,
            exclusive: false,
        }
    }
}

/// The lock that passes which must not overlap hold (see the module docs).
pub type Maintenance = Arc<tokio::sync::Mutex<()>>;

pub struct Scheduler {
    health: watch::Receiver<WalHealth>,
    maintenance: Maintenance,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Up to a tenth of the interval either way.
const JITTER: f64 = 0.1;

impl Scheduler {
    pub fn new(health: watch::Receiver<WalHealth>) -> Scheduler {
        Scheduler {
            health,
            maintenance: Arc::default(),
            tasks: Mutex::default(),
        }
    }

    /// The maintenance lock, for work that takes it outside a scheduled pass
    /// (compaction asked for through the admin API).
    pub fn maintenance(&self) -> Maintenance {
        self.maintenance.clone()
    }

    /// Runs `pass` every `every.interval` (the first after one interval) until the
    /// scheduler stops (or, for a writer's pass, the node is fenced).
    pub fn every<F, Fut>(&self, every: Every, pass: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        self.every_or_woken(every, None, pass)
    }

    /// [`Scheduler::every`], and also as soon as `wake` is notified (a pass that
    /// has work before its interval is up: the packer with its buffer half full).
    pub fn every_or_woken<F, Fut>(&self, every: Every, wake: Option<Arc<Notify>>, mut pass: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        assert!(
            !every.interval.is_zero(),
            "pass {} has no interval",
            every.name
        );
        let mut health = self.health.clone();
        let maintenance = self.maintenance.clone();
        let task = tokio::spawn(async move {
            loop {
                let sleep = tokio::time::sleep(jittered(every.interval));
                match &wake {
                    Some(wake) => tokio::select! {
                        _ = sleep => {}
                        _ = wake.notified() => {}
                    },
                    None => sleep.await,
                }
                if every.while_writer
                    && matches!(
                        *health.borrow_and_update(),
                        WalHealth::Fenced | WalHealth::Stopped
                    )
                {
                    tracing::debug!(pass = every.name, "the node stopped writing; pass ends");
                    return;
                }
                let _held = match every.exclusive {
                    true => Some(maintenance.lock().await),
                    false => None,
                };
                pass().await;
            }
        });
        self.tasks.lock().expect("scheduler lock").push(task);
    }

    /// Runs `task` until the scheduler stops (a long-lived task of the node rather
    /// than a periodic pass).
    pub fn keep(&self, task: impl Future<Output = ()> + Send + 'static) {
        let task = tokio::spawn(task);
        self.tasks.lock().expect("scheduler lock").push(task);
    }

    /// Stops every pass (at its next await; a pass holding the maintenance lock
    /// drops it).
    pub fn stop(&self) {
        for task in self.tasks.lock().expect("scheduler lock").drain(..) {
            task.abort();
        }
    }
}

fn jittered(interval: Duration) -> Duration {
    let factor = 1.0 + JITTER * (2.0 * fastrand::f64() - 1.0);
    interval.mul_f64(factor).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Polls `cond` every few milliseconds for up to 10 s.
    async fn eventually(cond: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if cond() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    #[tokio::test]
    async fn passes_run_again_and_again_and_end_when_fenced() {
        let (health_tx, health) = watch::channel(WalHealth::Ok);
        let scheduler = Scheduler::new(health);
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        scheduler.every(
            Every::writer("test", Duration::from_millis(10)),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {}
            },
        );
        assert!(eventually(|| runs.load(Ordering::SeqCst) >= 3).await);
        health_tx.send(WalHealth::Fenced).unwrap();
        // The run in progress (if any) ends; no new one starts.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after_fence = runs.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(runs.load(Ordering::SeqCst), after_fence);
        scheduler.stop();
    }

    #[tokio::test]
    async fn passes_that_are_not_the_writers_outlive_fencing() {
        let (health_tx, health) = watch::channel(WalHealth::Fenced);
        let scheduler = Scheduler::new(health);
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let every = Every {
            while_writer: false,
            ..Every::writer("sweep", Duration::from_millis(10))
        };
        scheduler.every(every, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        });
        assert!(eventually(|| runs.load(Ordering::SeqCst) >= 3).await);
        drop(health_tx);
        scheduler.stop();
    }

    #[tokio::test]
    async fn a_woken_pass_runs_before_its_interval() {
        let (_health_tx, health) = watch::channel(WalHealth::Ok);
        let scheduler = Scheduler::new(health);
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let wake = Arc::new(Notify::new());
        scheduler.every_or_woken(
            Every::writer("pack", Duration::from_secs(3600)),
            Some(wake.clone()),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {}
            },
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "not before its interval");
        wake.notify_one();
        assert!(eventually(|| runs.load(Ordering::SeqCst) == 1).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "once per wake");
        wake.notify_one();
        assert!(eventually(|| runs.load(Ordering::SeqCst) == 2).await);
        scheduler.stop();
    }

    #[tokio::test]
    async fn exclusive_passes_never_overlap() {
        let (_health_tx, health) = watch::channel(WalHealth::Ok);
        let scheduler = Scheduler::new(health);
        let inside = Arc::new(AtomicU32::new(0));
        let overlaps = Arc::new(AtomicU32::new(0));
        for name in ["a", "b"] {
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            let every = Every {
                exclusive: true,
                ..Every::writer(name, Duration::from_millis(5))
            };
            scheduler.every(every, move || {
                let (inside, overlaps) = (inside.clone(), overlaps.clone());
                async move {
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        scheduler.stop();
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}
