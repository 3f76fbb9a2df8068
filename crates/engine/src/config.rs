//! Engine configuration: every limit and timing knob of the storage engine and stream
//! service, with its default. The binary maps flags onto this; nothing else restates
//! these defaults.

use std::time::Duration;

use crate::clock::Clock;

#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Largest WAL object one flush writes; a bigger backlog is split.
    pub flush_bytes_max: usize,
    /// While an upload is in flight, start another only once this much is buffered.
    pub pipeline_bytes_min: usize,
    /// Uploads allowed in flight at once.
    pub uploads_in_flight_max: usize,
    /// While uploads are in flight, also start another once the newest has run this
    /// long (and something is buffered; zero: at once). Trades PUTs for commit
    /// latency where PUTs are independent (S3, 20 ms per request, 10 ms: ack p99 47 ->
    /// 35 ms for 2.2x the PUTs, benchmarks/overlap.sh). On the local log zero keeps
    /// the syncs back to back, which a VM serves far faster than spaced ones (up to
    /// 1.4x the batched appends), but with more WAL objects a restart's warm-up may
    /// leave more records to the readers (docs/performance.md, "Syncs back to back"):
    /// `None` (off) by default.
    pub overlap_after: Option<Duration>,
    /// Bytes accepted but not yet durable; past this, appends get 503 (back-pressure).
    pub buffer_bytes_max: usize,
    /// Object-store write budget (PUTs per second); `None` = unlimited.
    pub max_writes_per_sec: Option<f64>,
    /// Cap on the exponential backoff between retries of a failing upload.
    pub retry_backoff_max: Duration,
    /// After failing this long, the store is reported down: new appends fail fast
    /// and appends waiting on the failing upload get 503 (their outcome unknown).
    pub store_down_after: Duration,
    /// One upload attempt that has not answered after this long is abandoned and
    /// retried (a hung connection must not stall the log forever).
    pub upload_attempt_timeout: Duration,
    /// A flushed object keeps its bytes (for the block cache) when one of its rows
    /// is at least this large: rows that stay in the WAL, which the packer would
    /// otherwise have written through into the cache as a pack. Set by the engine.
    pub rows_cached_from: Option<u64>,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            flush_bytes_max: 8 << 20,
            pipeline_bytes_min: 1 << 20,
            uploads_in_flight_max: 4,
            overlap_after: None,
            buffer_bytes_max: 256 << 20,
            max_writes_per_sec: None,
            retry_backoff_max: Duration::from_secs(2),
            store_down_after: Duration::from_secs(5),
            upload_attempt_timeout: Duration::from_secs(30),
            rows_cached_from: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub wal: WalConfig,
    /// How long an append waits for durability before answering 503.
    pub append_timeout: Duration,
    /// Largest body of one append (or of a create's initial content).
    pub append_bytes_max: usize,
    /// Largest response body of one catch-up read. The body references the bytes the
    /// caches hold rather than copying them (records under 8 KiB are gathered 64 KiB
    /// at a time as the socket takes them), so a large cap costs few requests, not
    /// memory per response.
    pub read_bytes_max: usize,
    /// Recent durable bytes kept in memory per active stream.
    pub tail_cache_bytes_per_stream: usize,
    /// Active (in-memory) streams at once; past this, requests that need a new one get 429.
    pub active_streams_max: usize,
    /// An active stream idle this long drops out of memory.
    pub dormancy: Duration,
    pub stream_name_bytes_max: usize,
    pub content_type_bytes_max: usize,
    pub producer_id_bytes_max: usize,
    pub stream_seq_bytes_max: usize,
    /// Idempotent producers remembered per stream.
    pub producers_per_stream_max: usize,
    /// How often the node checks the bucket for a newer process that fenced it
    /// (one HEAD request each time); `None` = only learn it on the next write.
    pub fence_check_interval: Option<Duration>,
    /// How often the metadata is checkpointed into the object store (when it changed
    /// since the last checkpoint); `None` = never. See `checkpoint`.
    pub checkpoint_interval: Option<Duration>,
    /// How often garbage collection deletes WAL objects that nothing points into
    /// any more (below the oldest checkpoint); `None` = never. See `gc`.
    pub gc_interval: Option<Duration>,
    pub compaction: CompactionConfig,
    pub pack: PackConfig,
    /// Cold reads: bytes of index rows fetched in one ranged GET when they sit next
    /// to each other in one object (compacted data), kept in the block cache for
    /// the reads that follow.
    pub readahead_bytes: usize,
    /// Memory for chunks fetched from the object store (LRU); 0 = no cache.
    pub block_cache_bytes: usize,
    /// How long a catch-up read waits for the object store before it answers with
    /// what is ready (a partial answer; what it asked for keeps coming into the
    /// block cache for the next request).
    pub read_budget: Duration,
    /// How often the age-retention pass trims streams that have a retention (see
    /// `stream::retention`); `None` = never.
    pub retention_interval: Option<Duration>,
    /// Prices for the estimated object-store bill in /metrics.
    pub cost: CostConfig,
    /// Wall time (tests inject a manual clock).
    pub clock: Clock,
    /// Membership of a cluster (with a metadata store that coordinates one:
    /// Postgres); `None` on a single node.
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// The store as the prefix's identity records it and messages name it
    /// (`store::name` of `--store`).
    pub store_name: String,
}

/// Compaction rewrites old WAL data into read-optimized objects (see `compaction`).
#[derive(Clone, Debug)]
pub struct CompactionConfig {
    /// How often a background pass runs; `None` = only when asked (admin API).
    pub interval: Option<Duration>,
    /// Data younger than this stays where the WAL wrote it (recent data is read
    /// from the tail cache anyway, and a stream still busy grows longer runs).
    pub delay: Duration,
    /// Object-store bytes (read + written) per second compaction may use.
    pub bytes_per_sec: u64,
    /// Object-store requests (GET, PUT) per second compaction may use.
    pub requests_per_sec: f64,
    /// Largest object compaction writes.
    pub object_bytes_max: usize,
    /// Largest chunk (one index row) compaction writes; a read fetches whole
    /// chunks, so this bounds a read's over-fetch.
    pub chunk_bytes_max: usize,
    /// A stream with at least this much data in one round gets objects of its own
    /// (a segment); smaller ones share packed objects.
    pub segment_bytes_min: usize,
    /// WAL bytes one round reads before it writes and commits.
    pub round_bytes_max: usize,
    /// WAL rows (one stream's chunk of one WAL object) at least this large are
    /// final where the WAL wrote them: neither the packer nor compaction rewrites
    /// them, since a read of one is already a GET of at least a piece's size.
    /// `None` (the node's choice for the local WAL log, whose files are reclaimed
    /// only once every entry in them is gone): every row moves.
    pub wal_rows_final_bytes: Option<u64>,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            interval: Some(Duration::from_secs(60)),
            delay: Duration::from_secs(600),
            bytes_per_sec: 64 << 20,
            requests_per_sec: 50.0,
            object_bytes_max: 64 << 20,
            chunk_bytes_max: 1 << 20,
            segment_bytes_min: 4 << 20,
            round_bytes_max: 64 << 20,
            wal_rows_final_bytes: None,
        }
    }
}
/// The packer moves recent history out of the WAL from memory (see `packer`).
#[derive(Clone, Debug)]
pub struct PackConfig {
    /// How often the packer looks whether a pack is due; `None`: never pack (recent
    /// data stays in WAL objects until compaction).
    pub interval: Option<Duration>,
    /// Data stays only in the WAL at most about this long (an L0 pack takes it).
    pub l0_delay: Duration,
    /// ... or until this many WAL objects hold data not packed yet: what a restart
    /// reads back to warm up.
    pub l0_objects_max: usize,
    /// A stream with this much buffered gets a piece of its own (L1).
    pub piece_bytes: usize,
    /// A stream's buffered data is written as one piece after this long, whatever
    /// its size.
    pub l1_delay: Duration,
    /// Record bytes held for packing, at most; past it the oldest are let go.
    pub buffer_bytes_max: usize,
    /// Packs go into the block cache as they are written, so readers of recent
    /// history find them there rather than asking the store. Worth its memory only
    /// where a read of the store costs a round trip: off for local directories and
    /// memory stores (a read there copies from the page cache), on for S3-like ones.
    /// Off, only the packs of data the cache held under its old place go in (what
    /// a restart's warm-up read back).
    pub write_through: bool,
    /// A pack object's size, at most (a piece bigger than it is one object of its
    /// own). A pack is encoded whole in memory before it is written, so this is
    /// also the packer's memory on top of its buffer while it writes. On a bucket
    /// a PUT costs per request and packs are as large as compaction's objects; a
    /// node on a local directory makes them smaller (docs/performance.md,
    /// "Smaller packs on local disks").
    pub object_bytes_max: usize,
}

impl Default for PackConfig {
    fn default() -> Self {
        PackConfig {
            interval: Some(Duration::from_millis(200)),
            l0_delay: Duration::from_secs(1),
            l0_objects_max: 256,
            piece_bytes: 1 << 20,
            l1_delay: Duration::from_secs(60),
            buffer_bytes_max: 64 << 20,
            write_through: true,
            object_bytes_max: 64 << 20,
        }
    }
}

/// Largest per-stream age retention, in seconds (about 136 years; as for TTLs).
pub const RETENTION_SECS_MAX: u64 = u32::MAX as u64;

/// Object-store prices, in US dollars. Defaults: S3 Standard, us-east-1.
#[derive(Clone, Copy, Debug)]
pub struct CostConfig {
    /// Per 1,000 PUT, COPY, POST or LIST requests.
    pub put_per_1000_usd: f64,
    /// Per 1,000 GET or HEAD requests.
    pub get_per_1000_usd: f64,
    /// Per GB stored for a month (30 days).
    pub storage_gb_month_usd: f64,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            put_per_1000_usd: 0.005,
            get_per_1000_usd: 0.0004,
            storage_gb_month_usd: 0.023,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            wal: WalConfig::default(),
            append_timeout: Duration::from_secs(10),
            append_bytes_max: 8 << 20,
            read_bytes_max: 16 << 20,
            tail_cache_bytes_per_stream: 256 << 10,
            active_streams_max: 100_000,
            dormancy: Duration::from_secs(60),
            stream_name_bytes_max: 1024,
            content_type_bytes_max: 256,
            producer_id_bytes_max: 256,
            stream_seq_bytes_max: 256,
            producers_per_stream_max: 10_000,
            fence_check_interval: Some(Duration::from_secs(10)),
            checkpoint_interval: Some(Duration::from_secs(300)),
            gc_interval: Some(Duration::from_secs(600)),
            compaction: CompactionConfig::default(),
            pack: PackConfig::default(),
            readahead_bytes: 8 << 20,
            block_cache_bytes: 256 << 20,
            read_budget: Duration::from_millis(500),
            retention_interval: Some(Duration::from_secs(60)),
            cost: CostConfig::default(),
            clock: Clock::system(),
            cluster: None,
            store_name: "unnamed".into(),
        }
    }
}
