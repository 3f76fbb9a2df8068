//! The block cache: chunks fetched from the object store, least recently used out
//! first, bounded in bytes. Objects are immutable and a key is never rewritten with
//! other bytes, so entries need no invalidation; chunks of deleted objects simply
//! age out. Entries are keyed by `(object key, byte offset)` of the chunk.
//!
//! It holds only chunks known to be intact: fetched ones whose checksum was verified
//! on the way in (`cold`), and the ones this node wrote (packer, compaction). So a
//! hit is decoded without checksumming it again.
//!
//! A readahead GET fetches several adjacent chunks in one request and inserts each
//! as a slice of the same buffer, so the cache can hold a buffer a little longer
//! than its accounted bytes say (until its last slice leaves).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;

use crate::metrics::{Counter, Desc, Exposition, Gauge, Source};

type Key = (String, u64);

static HITS: Desc = Desc::counter(
    "picomq_block_cache_hits_total",
    "Cold reads served from the block cache.",
);
static MISSES: Desc = Desc::counter(
    "picomq_block_cache_misses_total",
    "Cold reads that had to GET from the object store.",
);
static EVICTIONS: Desc = Desc::counter(
    "picomq_block_cache_evictions_total",
    "Chunks dropped from the block cache to make room.",
);
static BYTES: Desc = Desc::gauge("picomq_block_cache_bytes", "Bytes held by the block cache.");

pub struct BlockCacheStats {
    pub hits: Counter,
    pub misses: Counter,
    pub evictions: Counter,
    pub bytes: Gauge,
}

impl Default for BlockCacheStats {
    fn default() -> Self {
        BlockCacheStats {
            hits: Counter::new(&HITS),
            misses: Counter::new(&MISSES),
            evictions: Counter::new(&EVICTIONS),
            bytes: Gauge::new(&BYTES),
        }
    }
}

impl Source for BlockCacheStats {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.hits)
            .counter(&self.misses)
            .counter(&self.evictions)
            .gauge(&self.bytes);
    }
}

pub struct BlockCache {
    capacity: usize,
    inner: Mutex<Lru>,
    pub stats: BlockCacheStats,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<Key, (Bytes, u64)>,
    /// Use tick -> key, oldest first.
    order: BTreeMap<u64, Key>,
    tick: u64,
    bytes: usize,
}

impl BlockCache {
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache {
            capacity,
            inner: Mutex::default(),
            stats: BlockCacheStats::default(),
        }
    }

    pub fn get(&self, object: &str, offset: u64) -> Option<Bytes> {
        if self.capacity == 0 {
            return None;
        }
        let mut lru = self.inner.lock().expect("block cache lock");
        let lru = &mut *lru;
        lru.tick += 1;
        let tick = lru.tick;
        let key = (object.to_string(), offset);
        let found = match lru.entries.get_mut(&key) {
            Some((bytes, used)) => {
                lru.order.remove(used);
                *used = tick;
                lru.order.insert(tick, key);
                Some(bytes.clone())
            }
            None => None,
        };
        let counter = if found.is_some() {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        counter.inc();
        found
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Whether the chunk is cached, without touching its recency or the counters.
    pub fn contains(&self, object: &str, offset: u64) -> bool {
        self.capacity > 0
            && self
                .inner
                .lock()
                .expect("block cache lock")
                .entries
                .contains_key(&(object.to_string(), offset))
    }

    pub fn insert(&self, object: &str, offset: u64, bytes: Bytes) {
        if bytes.len() > self.capacity {
            return;
        }
        let mut lru = self.inner.lock().expect("block cache lock");
        let lru = &mut *lru;
        lru.tick += 1;
        let key = (object.to_string(), offset);
        lru.bytes += bytes.len();
        if let Some((old, used)) = lru.entries.insert(key.clone(), (bytes, lru.tick)) {
            lru.bytes -= old.len();
            lru.order.remove(&used);
        }
        lru.order.insert(lru.tick, key);
        while lru.bytes > self.capacity {
            let Some((_, key)) = lru.order.pop_first() else {
                break;
            };
            if let Some((old, _)) = lru.entries.remove(&key) {
                lru.bytes -= old.len();
                self.stats.evictions.inc();
            }
        }
        self.stats.bytes.set(lru.bytes as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_first() {
        let cache = BlockCache::new(10);
        cache.insert("a", 0, Bytes::from_static(b"1234"));
        cache.insert("a", 4, Bytes::from_static(b"5678"));
        assert!(cache.get("a", 0).is_some()); // "a"@0 is now the most recent
        cache.insert("b", 0, Bytes::from_static(b"9999"));
        assert!(cache.get("a", 4).is_none());
        assert_eq!(cache.get("a", 0).unwrap(), Bytes::from_static(b"1234"));
        assert!(cache.get("b", 0).is_some());
        assert_eq!(cache.stats.bytes.get(), 8);
    }

    #[test]
    fn a_zero_capacity_cache_holds_nothing() {
        let cache = BlockCache::new(0);
        cache.insert("a", 0, Bytes::from_static(b"x"));
        assert!(cache.get("a", 0).is_none());
    }
}
