//! Chunks of local files whose checksum passed a moment ago.
//!
//! Every chunk fetched from the store is checksummed before it is used, so that a
//! chunk the disk or the store corrupted is an error, never wrong records. On the
//! local store a pack's range is a mapping of the page cache (`store::mapped`),
//! and a catch-up reader of a stream larger than the block cache fetches the same
//! chunks again on every pass: the CRC32C over every byte was a third of the
//! server's CPU for one warm reader (docs/performance.md, "sendfile").
//!
//! A chunk of a mapped local file that passed its checksum is remembered here for
//! [`TRUST_FOR`]; a fetch of the same chunk (object, byte range) within that time
//! is not checksummed again. The files behind mappings are written whole and
//! never changed (`store::mapped`), so what can differ on a second fetch within a
//! minute is only a page the kernel evicted and read again from a disk that
//! corrupted it in between. Bytes that are not a mapping (a GET from a bucket,
//! the WAL log's reused files) are checksummed on every fetch as before.
//!
//! Bounded: at most [`CHECKED_MAX`] chunks are remembered; when full, those past
//! their time go, and if none has, all of them.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a checked chunk of a mapped local file is trusted without checking it again.
pub const TRUST_FOR: Duration = Duration::from_secs(60);
/// Chunks remembered at most (about 24 bytes each, plus the map's overhead).
pub const CHECKED_MAX: usize = 65_536;

#[derive(Default)]
pub struct RecentlyChecked {
    /// A 64-bit hash of (object key, byte range) -> when its checksum passed.
    at: Mutex<HashMap<u64, Instant>>,
    hasher: std::collections::hash_map::RandomState,
}

impl RecentlyChecked {
    fn key(&self, object: &str, range: &Range<u64>) -> u64 {
        let mut h = self.hasher.build_hasher();
        object.hash(&mut h);
        range.start.hash(&mut h);
        range.end.hash(&mut h);
        h.finish()
    }

    /// Whether this chunk passed its checksum within [`TRUST_FOR`] of `now`.
    pub fn recently(&self, object: &str, range: &Range<u64>, now: Instant) -> bool {
        let key = self.key(object, range);
        let at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        at.get(&key)
            .is_some_and(|t| now.saturating_duration_since(*t) < TRUST_FOR)
    }

    /// This chunk's checksum passed at `now`.
    pub fn passed(&self, object: &str, range: &Range<u64>, now: Instant) {
        let key = self.key(object, range);
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        if at.len() >= CHECKED_MAX && !at.contains_key(&key) {
            at.retain(|_, t| now.saturating_duration_since(*t) < TRUST_FOR);
            if at.len() >= CHECKED_MAX {
                at.clear();
            }
        }
        at.insert(key, now);
    }

    pub fn len(&self) -> usize {
        self.at.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_trusted_for_a_minute_by_its_object_and_exact_range() {
        let checked = RecentlyChecked::default();
        let t0 = Instant::now();
        assert!(!checked.recently("packs/a", &(0..100), t0));
        checked.passed("packs/a", &(0..100), t0);
        assert!(checked.recently("packs/a", &(0..100), t0 + Duration::from_secs(59)));
        assert!(!checked.recently("packs/a", &(0..100), t0 + TRUST_FOR));
        // Another range of the same object, or the same range of another, is not.
        assert!(!checked.recently("packs/a", &(0..101), t0));
        assert!(!checked.recently("packs/a", &(1..100), t0));
        assert!(!checked.recently("packs/b", &(0..100), t0));
    }

    #[test]
    fn it_holds_at_most_its_bound_dropping_the_expired_first() {
        let checked = RecentlyChecked::default();
        let t0 = Instant::now();
        for i in 0..CHECKED_MAX as u64 {
            checked.passed("old", &(i..i + 1), t0);
        }
        assert_eq!(checked.len(), CHECKED_MAX);
        // Full of expired entries: they go, the new one stays.
        let later = t0 + TRUST_FOR + Duration::from_secs(1);
        checked.passed("new", &(0..1), later);
        assert_eq!(checked.len(), 1);
        assert!(checked.recently("new", &(0..1), later));
        // Full of live ones: all go but the newest.
        for i in 0..CHECKED_MAX as u64 {
            checked.passed("live", &(i..i + 1), later);
        }
        assert!(checked.len() <= CHECKED_MAX);
        checked.passed("newest", &(0..1), later);
        assert!(checked.len() <= CHECKED_MAX);
        assert!(checked.recently("newest", &(0..1), later));
    }
}
