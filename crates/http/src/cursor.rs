//! Stream-Cursor values (Durable Streams §10.1): the number of 20-second intervals
//! since 2024-10-09T00:00:00Z, never going backwards for a client that echoes one.

/// 2024-10-09T00:00:00Z in seconds since the Unix epoch.
const CURSOR_EPOCH_SECS: u64 = 1_728_432_000;
const INTERVAL_SECS: u64 = 20;

pub fn next_cursor(now_secs: u64, client: Option<&str>) -> u64 {
    let current = now_secs.saturating_sub(CURSOR_EPOCH_SECS) / INTERVAL_SECS;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        // Jitter of 1..=3600 s, in whole intervals (at least one), so caches move on.
        Some(c) if c >= current => c + fastrand::u64(1..=3600).div_ceil(INTERVAL_SECS),
        _ => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_backwards() {
        let now = CURSOR_EPOCH_SECS + 20 * 1000;
        assert_eq!(next_cursor(now, None), 1000);
        assert_eq!(next_cursor(now, Some("10")), 1000);
        for _ in 0..100 {
            assert!(next_cursor(now, Some("1000")) > 1000);
            assert!(next_cursor(now, Some("5000")) > 5000);
        }
    }
}
