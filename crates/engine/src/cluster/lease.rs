//! What a node knows of its own membership lease, by its own monotonic clock.
//!
//! Postgres stamps a lease `now() + ttl` when it renews it, and other nodes judge it
//! lapsed by Postgres' clock. The node itself cannot read that clock, but it knows
//! the renewal was sent at `sent`, before Postgres evaluated `now()`; so the lease
//! lasts at least until `sent + ttl` in real time. The node treats it as valid only
//! until `sent + ttl - margin`: it stops acknowledging before anyone can judge the
//! lease lapsed, whatever the delays of the renewal's round trip. The margin covers
//! the drift between the node's clock rate and Postgres' over one lease.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The share of a lease kept in reserve.
const MARGIN_DIVISOR: u32 = 5;

pub struct Lease {
    ttl: Duration,
    state: Mutex<State>,
    /// `true` while the lease is held (readiness, and writers waiting on it).
    held: watch::Sender<bool>,
}

struct State {
    valid_until: Option<Instant>,
    /// Since when the lease has been held without a gap.
    held_since: Option<Instant>,
}

impl Lease {
    pub fn new(ttl: Duration) -> Lease {
        Lease {
            ttl,
            state: Mutex::new(State {
                valid_until: None,
                held_since: None,
            }),
            held: watch::channel(false).0,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often to renew: several renewals fit in the time the lease lasts.
    pub fn renew_every(&self) -> Duration {
        self.ttl / MARGIN_DIVISOR
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        let until = sent + self.ttl - self.ttl / MARGIN_DIVISOR;
        let mut st = self.state.lock().expect("lease lock");
        let now = Instant::now();
        if st.valid_until.is_none_or(|v| v <= now) {
            st.held_since = Some(now);
        }
        st.valid_until = Some(st.valid_until.map_or(until, |v| v.max(until)));
        drop(st);
        self.held.send_if_modified(|h| !std::mem::replace(h, true));
    }

    /// The lease is gone for good (another node took this one's streams).
    pub fn lost(&self) {
        let mut st = self.state.lock().expect("lease lock");
        st.valid_until = None;
        st.held_since = None;
        drop(st);
        self.held.send_if_modified(|h| std::mem::replace(h, false));
    }

    /// Whether the node may act as the owner of its streams right now.
    pub fn is_valid(&self) -> bool {
        let valid = self
            .state
            .lock()
            .expect("lease lock")
            .valid_until
            .is_some_and(|v| Instant::now() < v);
        if !valid {
            self.held.send_if_modified(|h| std::mem::replace(h, false));
        }
        valid
    }

    /// How long the lease has been held without a gap (zero when it is not held).
    pub fn held_for(&self) -> Duration {
        if !self.is_valid() {
            return Duration::ZERO;
        }
        let st = self.state.lock().expect("lease lock");
        st.held_since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Time left before the node must stop acting as an owner.
    pub fn remaining(&self) -> Duration {
        let st = self.state.lock().expect("lease lock");
        st.valid_until.map_or(Duration::ZERO, |v| {
            v.saturating_duration_since(Instant::now())
        })
    }

    pub fn watch(&self) -> watch::Receiver<bool> {
        self.held.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_ends_before_others_can_judge_it_lapsed() {
        let lease = Lease::new(Duration::from_secs(5));
        assert!(!lease.is_valid());
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await; // the round trip
        lease.renewed(sent);
        assert!(lease.is_valid());
        tokio::time::advance(Duration::from_millis(3_600)).await;
        assert!(lease.is_valid(), "3.9 s after sending");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!lease.is_valid(), "4.1 s after sending: within the margin");
        assert_eq!(lease.held_for(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_extend_and_a_gap_restarts_the_count() {
        let lease = Lease::new(Duration::from_secs(5));
        lease.renewed(Instant::now());
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(1)).await;
            lease.renewed(Instant::now());
        }
        assert_eq!(lease.held_for(), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!lease.is_valid());
        lease.renewed(Instant::now());
        assert_eq!(lease.held_for(), Duration::ZERO);
        // A late answer to an older renewal never shortens the lease.
        let old = Instant::now() - Duration::from_secs(3);
        lease.renewed(old);
        assert_eq!(lease.remaining(), Duration::from_secs(4));
        lease.lost();
        assert!(!lease.is_valid());
        assert!(!*lease.watch().borrow());
    }
}
