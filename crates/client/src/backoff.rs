//! The SDK's one retry policy: capped exponential backoff with jitter, so clients
//! reconnecting after a server restart do not arrive in lockstep.

use std::time::Duration;

/// Capped exponential backoff: `first`, doubling up to `max`, each wait plus up to
/// half of it again at random.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Default for Backoff {
    /// 100 ms doubling up to 5 s.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
    }
}

impl Backoff {
    /// Waits start at `first` and double up to `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let first = first.max(Duration::from_millis(1));
        Backoff {
            first,
            max: max.max(first),
            next: first,
        }
    }

    /// The next wait (and doubles the one after it).
    pub fn next_wait(&mut self) -> Duration {
        let jitter_ms = fastrand::u64(0..=self.next.as_millis() as u64 / 2);
        let wait = self.next + Duration::from_millis(jitter_ms);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Sleeps for the next wait.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_wait()).await;
    }

    /// Back to the first wait (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}
