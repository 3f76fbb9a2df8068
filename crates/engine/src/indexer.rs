//! The indexer: applies durable WAL objects to the metadata store, in log order and
//! off the acknowledgement path, then tells each stream its ops are indexed (which
//! lets its tail cache shrink and lets it go dormant).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use crate::error::EngineError;
use crate::meta::Meta;
use crate::metrics::{Counter, Desc, Exposition};
use crate::wal::FlushedObject;

/// Objects applied in one metadata transaction, at most (a bound on the memory and
/// the length of one transaction; [`BATCH_LINGER`] is what normally ends a batch).
const BATCH_OBJECTS_MAX: usize = 512;
/// How long the indexer gathers objects after the first before it writes them.
/// Appends and reads never wait for the index (tail-cache trimming, dormancy and
/// compaction do); operations that do (deletes, forks: `Engine::index_barrier`)
/// nudge it to write at once. Each transaction rewrites every index page it touches,
/// so fewer, larger transactions cost less per row. At 8,000 one-record appends/s over
/// 64 streams, one transaction per object (360/s) cost the SQLite thread 4.5-5.7 s of
/// CPU per run; 10 ms, 4.2-4.4 s; 50 ms, 3.4 s. With the local store's WAL log (about
/// 1,800 objects/s at 6,600 live appends/s, so 64 objects ended a batch after ~35 ms),
/// 200 ms and 512 objects halved the SQLite threads' CPU (16.4-17.2% -> 7.4-8.6% of a
/// core; 19.3% -> 12.0% at 13,000/s) and lowered the p50 in seven of eight pairs;
/// the p99 moved within the run-to-run noise. Less SQLite I/O also leaves the disk to
/// the WAL's fsyncs. See docs/performance.md.
const BATCH_LINGER: Duration = Duration::from_millis(200);

static FAILURES: Desc = Desc::counter(
    "picomq_index_failures_total",
    "Failed metadata index transactions (retried).",
);
static LAG: Desc = Desc::gauge(
    "picomq_index_lag_objects",
    "WAL objects durable but not yet in the metadata index.",
);

pub struct IndexerProgress {
    /// Objects of this incarnation applied so far.
    pub applied: watch::Receiver<u64>,
    pub failures: Arc<Counter>,
    /// Wakes a lingering indexer when `want` rose.
    nudge: Arc<Notify>,
    /// Objects someone waits to see applied (a count, like `applied`).
    want: Arc<AtomicU64>,
}

impl IndexerProgress {
    /// Failures and lag behind the `written` objects of this incarnation.
    pub fn export(&self, written: u64, out: &mut Exposition) {
        let indexed = *self.applied.borrow();
        out.counter(&self.failures)
            .value(&LAG, &[], written.saturating_sub(indexed) as f64);
    }

    /// Asks the indexer to write, without lingering, until `objects` of this
    /// incarnation are applied.
    pub fn want(&self, objects: u64) {
        self.want.fetch_max(objects, Ordering::AcqRel);
        self.nudge.notify_one();
    }
}

/// Told about every batch of objects once it is in the index (the packer).
pub type OnApplied = Box<dyn Fn(&[FlushedObject]) + Send + Sync>;

pub fn spawn(
    meta: Meta,
    mut rx: mpsc::Receiver<FlushedObject>,
    on_applied: OnApplied,
) -> (JoinHandle<()>, IndexerProgress) {
    let (applied_tx, applied) = watch::channel(0u64);
    let failures = Arc::new(Counter::new(&FAILURES));
    let failures_task = failures.clone();
    let nudge = Arc::new(Notify::new());
    let nudged = nudge.clone();
    let want = Arc::new(AtomicU64::new(0));
    let wanted = want.clone();
    let task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(BATCH_OBJECTS_MAX);
        let mut applied_n = 0u64;
        while let Some(first) = rx.recv().await {
            batch.push(first);
            let deadline = tokio::time::Instant::now() + BATCH_LINGER;
            loop {
                // Someone waits for objects not applied yet (`want`): write as soon
                // as the batch holds them all (objects arrive in order, so that is a
                // count). Otherwise gather until the linger ends.
                let want = wanted.load(Ordering::Acquire);
                let held = applied_n + batch.len() as u64;
                if batch.len() >= BATCH_OBJECTS_MAX || (want > applied_n && held >= want) {
                    break;
                }
                tokio::select! {
                    next = tokio::time::timeout_at(deadline, rx.recv()) => match next {
                        Ok(Some(next)) => batch.push(next),
                        // Elapsed, or the log is shutting down: write what we have.
                        Ok(None) | Err(_) => break,
                    },
                    _ = nudged.notified() => {}
                }
            }
            // The index follows the log in order: one object after another, no gaps
            // (a gap would leave an acknowledged op out of the index for good).
            for pair in batch.windows(2) {
                assert!(
                    (pair[1].epoch, pair[1].seq) == (pair[0].epoch, pair[0].seq + 1),
                    "the indexer must apply WAL objects in log order"
                );
            }
            // The objects are durable; the index must follow. Retry until it does.
            let mut backoff = Duration::from_millis(10);
            crate::failpoint::pause("index-before-apply").await;
            while let Err(e) = meta.apply(&batch).await {
                if matches!(e, EngineError::Fenced) {
                    // Another member took the log over and indexes it from the
                    // bucket; nothing more of it may be written here.
                    tracing::warn!("indexer stopped: this node's log was taken over");
                    return;
                }
                failures_task.inc();
                tracing::error!(error = %e, "indexing WAL objects failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            on_applied(&batch);
            for object in &batch {
                for chunk in &object.chunks {
                    if let (Some(listener), Some((last_op, _))) =
                        (&chunk.listener, chunk.ops.last())
                    {
                        listener.on_indexed(*last_op);
                    }
                }
            }
            let n = batch.len() as u64;
            applied_n += n;
            applied_tx.send_modify(|a| *a += n);
            batch.clear();
        }
    });
    (
        task,
        IndexerProgress {
            applied,
            failures,
            nudge,
            want,
        },
    )
}
