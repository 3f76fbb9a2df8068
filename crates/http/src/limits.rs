//! Abuse limits of the edge: token-bucket rate limits (per client IP, per token) and
//! caps on concurrent live readers (per stream, per token). Every map is bounded.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::error::ApiError;

/// Most keys a rate limiter or live-reader map tracks at once.
pub const KEYS_MAX: usize = 100_000;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A token bucket per key: `rate` requests per second on average, bursts of `burst`.
pub struct RateLimiter<K> {
    rate: f64,
    burst: f64,
    keys_max: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    pub fn new(rate_per_sec: f64, burst: f64) -> RateLimiter<K> {
        RateLimiter::with_keys_max(rate_per_sec, burst, KEYS_MAX)
    }

    pub fn with_keys_max(rate_per_sec: f64, burst: f64, keys_max: usize) -> RateLimiter<K> {
        RateLimiter {
            rate: rate_per_sec,
            burst: burst.max(1.0),
            keys_max: keys_max.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket, or says how long until one is there.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(key) && buckets.len() >= self.keys_max {
            // Keys whose bucket has refilled carry no state worth keeping.
            let full_after = Duration::from_secs_f64(self.burst / self.rate);
            buckets.retain(|_, b| now.saturating_duration_since(b.at) < full_after);
            if buckets.len() >= self.keys_max {
                // Still full (a flood of distinct keys): forget the lot rather than
                // grow; each key restarts with a full bucket.
                buckets.clear();
            }
        }
        let b = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// 429 with Retry-After (whole seconds, at least 1).
pub fn too_many_requests(what: &str, retry_after: Duration) -> ApiError {
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many requests {what}; retry after {}s", secs.max(1)),
    )
    .with_header("retry-after", secs.max(1))
}

/// Counts of open live reads (long-polls and SSE), per stream and per token.
#[derive(Debug)]
pub struct LiveReaders {
    per_stream_max: usize,
    per_token_max: usize,
    counts: Mutex<HashMap<(bool, String), usize>>,
}

/// One live reader's slots; released on drop.
#[derive(Debug)]
pub struct LiveSlot {
    readers: Arc<LiveReaders>,
    keys: [Option<(bool, String)>; 2],
}

impl LiveReaders {
    pub fn new(per_stream_max: usize, per_token_max: usize) -> Arc<LiveReaders> {
        Arc::new(LiveReaders {
            per_stream_max,
            per_token_max,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for a live read of `stream` by `token` (None: no token), or 429.
    pub fn acquire(
        self: &Arc<Self>,
        stream: &str,
        token: Option<&str>,
    ) -> Result<LiveSlot, ApiError> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let stream_key = (false, stream.to_string());
        let token_key = token.map(|t| (true, t.to_string()));
        let full = |key: &(bool, String), max: usize| counts.get(key).copied().unwrap_or(0) >= max;
        if full(&stream_key, self.per_stream_max) {
            return Err(self.refused("on this stream", self.per_stream_max));
        }
        if let Some(k) = &token_key {
            if full(k, self.per_token_max) {
                return Err(self.refused("for this token", self.per_token_max));
            }
        }
        if counts.len() + 2 > KEYS_MAX {
            return Err(self.refused("on this server", KEYS_MAX / 2));
        }
        *counts.entry(stream_key.clone()).or_default() += 1;
        if let Some(k) = &token_key {
            *counts.entry(k.clone()).or_default() += 1;
        }
        Ok(LiveSlot {
            readers: self.clone(),
            keys: [Some(stream_key), token_key],
        })
    }

    fn refused(&self, scope: &str, max: usize) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_live_readers",
            format!("at most {max} live readers (long-poll or SSE) {scope}; retry later"),
        )
        .with_header("retry-after", 1)
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut counts = self
            .readers
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for key in self.keys.iter_mut().filter_map(Option::take) {
            if let Some(n) = counts.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refuses_beyond_burst_and_refills() {
        let rl = RateLimiter::new(10.0, 2.0);
        let t0 = Instant::now();
        assert!(rl.check(&1, t0).is_ok());
        assert!(rl.check(&1, t0).is_ok());
        let wait = rl.check(&1, t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100));
        // Another key has its own bucket.
        assert!(rl.check(&2, t0).is_ok());
        assert!(rl.check(&1, t0 + Duration::from_millis(100)).is_ok());
    }

    #[test]
    fn keys_are_bounded() {
        let rl = RateLimiter::with_keys_max(1.0, 1.0, 10);
        let t0 = Instant::now();
        for k in 0..1000 {
            let _ = rl.check(&k, t0);
            assert!(rl.len() <= 10);
        }
    }

    #[test]
    fn live_slots_count_and_release() {
        let lr = LiveReaders::new(2, 3);
        let a = lr.acquire("s", Some("t")).unwrap();
        let _b = lr.acquire("s", Some("t")).unwrap();
        assert_eq!(
            lr.acquire("s", None).unwrap_err().status,
            StatusCode::TOO_MANY_REQUESTS
        );
        let _c = lr.acquire("s2", Some("t")).unwrap();
        assert!(lr.acquire("s3", Some("t")).is_err());
        drop(a);
        assert!(lr.acquire("s", None).is_ok());
        drop((_b, _c));
        assert!(lr.counts.lock().unwrap().is_empty());
    }
}
