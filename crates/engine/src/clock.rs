//! The one clock: wall time in milliseconds since the Unix epoch, for everything
//! that stores or compares a time (record timestamps, TTLs, expiry, token lifetimes,
//! retention). Reading the system time anywhere else is refused by clippy
//! (`clippy.toml`). A test injects a [`ManualClock`] and moves it instead of
//! sleeping. Durations measured on one node (latencies, timeouts) use `Instant` and
//! tokio's timers, which this does not replace.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Wall-clock time for the engine and the edge: the system clock, or a manual one.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<AtomicU64>>,
}

impl Clock {
    /// The system's real-time clock.
    pub fn system() -> Clock {
        Clock { manual: None }
    }

    /// A clock that stands still at `start_ms` until the returned handle moves it.
    pub fn manual(start_ms: u64) -> (Clock, ManualClock) {
        let now = Arc::new(AtomicU64::new(start_ms));
        (
            Clock {
                manual: Some(now.clone()),
            },
            ManualClock { now },
        )
    }

    /// Milliseconds since the Unix epoch (0 if the system clock is before it).
    pub fn now_ms(&self) -> u64 {
        match &self.manual {
            Some(now) => now.load(Ordering::Acquire),
            None => system_now_ms(),
        }
    }
}

/// Moves a [`Clock::manual`] clock (tests).
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn advance(&self, by: std::time::Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::AcqRel);
    }

    pub fn set_ms(&self, ms: u64) {
        self.now.fetch_max(ms, Ordering::AcqRel);
    }
}

#[allow(clippy::disallowed_methods)] // the one place that reads the system clock
fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_never_back() {
        let (clock, hand) = Clock::manual(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        hand.advance(Duration::from_secs(2));
        assert_eq!(clock.clone().now_ms(), 3_000);
        hand.set_ms(10);
        assert_eq!(clock.now_ms(), 3_000);
        assert!(Clock::system().now_ms() > 1_700_000_000_000);
    }
}
