//! The open-loop send schedule (`--rate`), released on time to within the OS timer.
//!
//! Request `k` is due at `start + k / rate`, and its latency counts from that instant
//! (so a server that falls behind is charged for the backlog it caused). The schedule
//! must therefore not be late itself: tokio's timer wheel ticks in milliseconds and
//! rounds deadlines up, so a send put to sleep with `sleep_until` left 0-2 ms late,
//! and that lateness was charged to the server. It was most of the gap between the
//! lone-append p50 (1.5 ms against the memory store) and what curl saw (0.5 ms).
//!
//! One thread sleeps with the OS's high-resolution timer (typically 50-100 µs late)
//! and hands out one permit per request that has come due; writers take a permit,
//! then the next request number. It sleeps at least [`RELEASE_QUANTUM_US`] at a time, so
//! at high rates it releases a few requests per wake-up instead of waking (and waking
//! a writer's worker thread) for each one.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::payload::now_us;

pub struct Pacer {
    due: Arc<Semaphore>,
}

impl Pacer {
    /// Releases requests at `requests_per_s` from `start_us` until `end_us` (on the
    /// [`now_us`] clock); after `end_us`, [`Pacer::next`] answers `false`.
    pub fn start(start_us: u64, end_us: u64, requests_per_s: f64) -> Pacer {
        let due = Arc::new(Semaphore::new(0));
        let released = due.clone();
        std::thread::Builder::new()
            .name("bench-pacer".into())
            .spawn(move || release(&released, start_us, end_us, requests_per_s))
            .expect("spawn the pacer thread");
        Pacer { due }
    }

    /// Waits until one more request is due; `false` once the schedule is over.
    pub async fn next(&self) -> bool {
        match self.due.acquire().await {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Pacer {
    /// The thread sees this within [`POLL_MAX`] and exits.
    fn drop(&mut self) {
        self.due.close();
    }
}

/// Longest sleep of the pacer thread, so that it notices a dropped [`Pacer`].
const POLL_MAX: Duration = Duration::from_millis(100);

/// Shortest sleep of the pacer thread, in microseconds. Above 4,000 requests/s a
/// request may be released up to this late, and that lateness is charged to the
/// server like any other. At 16,000 live appends/s (64 SSE readers) a wake-up per
/// request cost the client 0.55 cores against 0.45 with this quantum (four runs
/// each), while the median send lag rose 0.22 -> 0.34 ms.
const RELEASE_QUANTUM_US: u64 = 250;

/// When request `k` is due.
pub fn due_at(start_us: u64, k: u64, requests_per_s: f64) -> u64 {
    start_us + (k as f64 * 1e6 / requests_per_s) as u64
}

fn release(due: &Semaphore, start_us: u64, end_us: u64, requests_per_s: f64) {
    let mut released = 0u64;
    loop {
        let now = now_us();
        if now >= end_us || due.is_closed() {
            break;
        }
        // Every request whose time has come: k with due_at(k) <= now.
        let mut count = released;
        while due_at(start_us, count, requests_per_s) <= now {
            count += 1;
        }
        if count > released {
            due.add_permits((count - released) as usize);
            released = count;
        }
        let wake = due_at(start_us, released, requests_per_s).min(end_us);
        let wait = Duration::from_micros(wake.saturating_sub(now_us()).max(RELEASE_QUANTUM_US));
        std::thread::sleep(wait.min(POLL_MAX));
    }
    due.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn releases_no_request_early_and_none_past_the_end() {
        // 50 ms at 2,000 requests/s (one wake-up per request) and at 40,000/s (several
        // per wake-up): at most 100 and 2,000 due, none before its time.
        for rate in [2_000.0, 40_000.0] {
            let start = now_us() + 2_000;
            let end = start + 50_000;
            let pacer = Pacer::start(start, end, rate);
            let mut k = 0u64;
            while pacer.next().await {
                let at = due_at(start, k, rate);
                let now = now_us();
                assert!(now >= at, "request {k} released {} µs early", at - now);
                k += 1;
            }
            // Permits not taken before the end are dropped with the schedule.
            let due = (rate * 0.05) as u64;
            assert!((1..=due).contains(&k), "{k} requests released at {rate}/s");
            assert!(now_us() >= end);
        }
    }
}
