//! Shared counters and latency histograms the writers and readers record into.
//! Histograms are sharded (each task records into shard `task % SHARDS`) so that
//! recording takes an uncontended lock for a few nanoseconds, never a global one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

const SHARDS: usize = 32;
/// Latencies above this (µs) are recorded as this.
const HIGHEST_US: u64 = 120_000_000;

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("valid histogram bounds")
}

pub struct Recorder {
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            shards: (0..SHARDS).map(|_| Mutex::new(histogram())).collect(),
        }
    }
}

impl Recorder {
    pub fn record(&self, task: usize, us: u64) {
        self.shards[task % SHARDS]
            .lock()
            .expect("histogram lock")
            .saturating_record(us.clamp(1, HIGHEST_US));
    }

    pub fn merged(&self) -> Histogram<u64> {
        let mut all = histogram();
        for s in &self.shards {
            all.add(&*s.lock().expect("histogram lock"))
                .expect("same bounds");
        }
        all
    }
}

/// Counts by kind of failure (`status 503`, `connect`, `timeout`, ...).
#[derive(Default)]
pub struct Errors {
    total: AtomicU64,
    kinds: Mutex<BTreeMap<String, u64>>,
}

impl Errors {
    pub fn add(&self, kind: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        *self
            .kinds
            .lock()
            .expect("error kinds lock")
            .entry(kind.to_string())
            .or_default() += 1;
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn kinds(&self) -> BTreeMap<String, u64> {
        self.kinds.lock().expect("error kinds lock").clone()
    }
}

#[derive(Default)]
pub struct Stats {
    /// Records acknowledged since the start (warm-up included), for progress.
    pub acked_records: AtomicU64,
    /// Inside the measured window (by acknowledgement time).
    pub window_requests: AtomicU64,
    pub window_records: AtomicU64,
    pub window_bytes: AtomicU64,
    pub errors: Errors,
    /// Requests sent in the window, from their (scheduled) send to their ack.
    pub ack: Recorder,
    /// Under --rate, the same requests split in two: from when each was due until the
    /// client sent it (waiting for an in-flight slot or for a core), and from that
    /// send to the ack (what the server and the network took).
    pub send_lag: Recorder,
    pub from_send: Recorder,
    /// Records seen by live readers, in total and those sent in the window.
    pub live_records: AtomicU64,
    pub e2e: Recorder,
    pub reader_errors: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_merge_into_one_histogram() {
        let r = Recorder::default();
        for task in 0..100 {
            r.record(task, 1000);
        }
        r.record(7, 0);
        r.record(8, u64::MAX);
        let h = r.merged();
        assert_eq!(h.len(), 102);
        assert_eq!(h.min(), 1);
        assert!(h.max() >= HIGHEST_US);
    }
}
