//! Abuse limits of the edge: token-bucket rate limits (per client IP, per token) and
//! caps on concurrent live readers (per stream, per token). Every map is bounded.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};

use crate::error::ApiError;

/// An address range: an IP and how many leading bits of it must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpRange {
    addr: IpAddr,
    prefix: u8,
}

impl IpRange {
    /// `10.0.0.0/8`, `fd00::/8`, or one address (`192.0.2.7`, `::1`).
    pub fn parse(s: &str) -> Result<IpRange, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR range"))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0..={bits}"))?,
        };
        Ok(IpRange { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mask = |bits: u32| {
            u128::MAX
                .checked_shl(bits - u32::from(self.prefix))
                .unwrap_or(0)
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask(32) as u32;
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask(128);
                u128::from(net) & m == u128::from(ip) & m
            }
            _ => false,
        }
    }
}

/// Most `X-Forwarded-For` entries read for one request.
const FORWARDED_HOPS_MAX: usize = 32;

/// The client address a per-IP limit counts: the TCP peer, unless the peer is one
/// of `trusted` proxies; then the nearest address in `X-Forwarded-For` that is not a
/// trusted proxy itself, read from the right (entries to its left were written by
/// the client and prove nothing). An entry that is not an address ends the walk at
/// the last address known to be real.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpRange]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|r| r.contains(ip));
    if trusted.is_empty() || !is_trusted(peer) {
        return peer;
    }
    // Right to left: the last header line first, each line's last entry first. A
    // line that is not text counts as an entry that is not an address.
    let hops = headers
        .get_all("x-forwarded-for")
        .iter()
        .rev()
        .flat_map(|value| value.to_str().unwrap_or("?").rsplit(','))
        .take(FORWARDED_HOPS_MAX);
    let mut client = peer;
    for hop in hops {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            return client;
        };
        client = ip.to_canonical();
        if !is_trusted(client) {
            return client;
        }
    }
    client
}

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
    use axum::http::HeaderValue;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn ip_ranges_match_by_prefix() {
        let r = IpRange::parse("10.1.0.0/16").unwrap();
        assert!(r.contains("10.1.200.3".parse().unwrap()));
        assert!(!r.contains("10.2.0.1".parse().unwrap()));
        assert!(
            r.contains("::ffff:10.1.0.9".parse().unwrap()),
            "IPv4-mapped IPv6"
        );
        assert!(IpRange::parse("0.0.0.0/0")
            .unwrap()
            .contains("192.0.2.1".parse().unwrap()));
        let one = IpRange::parse("::1").unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("::2".parse().unwrap()));
        assert!(!one.contains("127.0.0.1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "::/129", "nope", "10.0.0.0/x", ""] {
            assert!(IpRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_nearest_untrusted_forwarded_address() {
        let proxies = [IpRange::parse("10.0.0.0/8").unwrap()];
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // No trusted proxies, or an untrusted peer: the header is ignored.
        assert_eq!(client_ip(peer, &xff(&["192.0.2.9"]), &[]), peer);
        assert_eq!(
            client_ip(ip("192.0.2.1"), &xff(&["192.0.2.9"]), &proxies),
            ip("192.0.2.1")
        );
        // Through two trusted proxies; what the client wrote on the left is not believed.
        assert_eq!(
            client_ip(peer, &xff(&["6.6.6.6, 192.0.2.9, 10.0.0.2"]), &proxies),
            ip("192.0.2.9")
        );
        assert_eq!(
            client_ip(peer, &xff(&["6.6.6.6", "192.0.2.9"]), &proxies),
            ip("192.0.2.9")
        );
        // No header, or only proxies: the farthest known address.
        assert_eq!(client_ip(peer, &xff(&[]), &proxies), peer);
        assert_eq!(
            client_ip(peer, &xff(&["10.0.0.3"]), &proxies),
            ip("10.0.0.3")
        );
        // Garbage to the right of any real address: stop at what is known.
        assert_eq!(client_ip(peer, &xff(&["192.0.2.9, junk"]), &proxies), peer);
        assert_eq!(
            client_ip(peer, &xff(&["junk, 192.0.2.9"]), &proxies),
            ip("192.0.2.9")
        );
        // A header line that is not text is such garbage too.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_bytes(b"\xff").unwrap());
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
        assert_eq!(client_ip(peer, &h, &proxies), ip("192.0.2.9"));
        h.append("x-forwarded-for", HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(client_ip(peer, &h, &proxies), peer);
    }

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
