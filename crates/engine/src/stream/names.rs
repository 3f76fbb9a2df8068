//! A Bloom filter of every stream name in the metadata, so that looking up a name
//! this node has never seen (creating a new stream, or a request for a stream that
//! does not exist) does not cost a SQLite query. Each query is a round trip to
//! sqlx's worker thread, and those hand-offs were a quarter of the server's CPU when
//! creating streams (docs/performance.md).
//!
//! Exactness: the filter never forgets a name. It is filled from the `streams` table
//! after recovery, before the node serves, and a new stream's name goes in before the
//! stream is registered, so any later lookup that misses the registry finds it here.
//! Names are never removed (a deleted name is a false positive, which costs the query
//! it cost before). Rows only ever come from this node's log (one node owns the
//! metadata), so nothing else adds names behind its back.
//!
//! Sized for twice the names at start-up (at least 2^20) at 10 bits per name and 7
//! probes: about 1% false positives at capacity, degrading gracefully past it
//! (about 14% at twice the capacity) until the next start sizes it afresh.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};

const PROBES: u64 = 7;
const BITS_PER_NAME: usize = 10;
const MIN_NAMES: usize = 1 << 20;

pub struct NameFilter {
    words: Box<[AtomicU64]>,
    /// Number of bits minus one (a power of two minus one).
    mask: u64,
    /// Rules nothing out: in a cluster other nodes create names behind this one's
    /// back, so every lookup asks the metadata.
    off: bool,
}

impl NameFilter {
    /// A filter for `existing` names plus as many again.
    pub fn for_names(existing: usize) -> NameFilter {
        let bits = (existing.saturating_mul(2).max(MIN_NAMES) * BITS_PER_NAME).next_power_of_two();
        NameFilter {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            mask: bits as u64 - 1,
            off: false,
        }
    }

    /// A filter that may contain every name.
    pub fn off() -> NameFilter {
        NameFilter {
            words: Box::new([]),
            mask: 0,
            off: true,
        }
    }

    pub fn insert(&self, name: &str) {
        if self.off {
            return;
        }
        for bit in self.bits(name) {
            self.words[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::Relaxed);
        }
    }

    /// `false`: no stream was ever named `name` (on this node's metadata).
    pub fn may_contain(&self, name: &str) -> bool {
        self.off
            || self.bits(name).all(|bit| {
                self.words[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
            })
    }

    /// The probed bit positions: double hashing over two independent hashes.
    fn bits(&self, name: &str) -> impl Iterator<Item = u64> + '_ {
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let h1 = hasher.hash_one((0u8, name));
        let h2 = hasher.hash_one((1u8, name)) | 1;
        (0..PROBES).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_inserted_name_is_found_and_few_others_are() {
        let f = NameFilter::for_names(0);
        assert_eq!(
            f.bytes(),
            2 << 20,
            "2^20 names x 10 bits, rounded up to 2^24 bits"
        );
        let n = MIN_NAMES;
        for i in 0..n {
            f.insert(&format!("stream/{i}"));
        }
        for i in 0..n {
            assert!(f.may_contain(&format!("stream/{i}")), "stream/{i} lost");
        }
        let probes = 100_000;
        let false_positives = (0..probes)
            .filter(|i| f.may_contain(&format!("other/{i}")))
            .count();
        // At capacity with 16 bits per name (the power-of-two rounding), the expected
        // rate is ~0.1%; allow 1%.
        assert!(
            false_positives < probes / 100,
            "{false_positives} false positives in {probes}"
        );
    }

    #[test]
    fn sized_for_twice_the_existing_names() {
        assert_eq!(NameFilter::for_names(3_000_000).bytes(), 8 << 20);
    }
}
