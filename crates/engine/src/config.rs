//! Engine configuration: every limit and timing knob of the storage engine and stream
//! service, with its default. The binary maps flags onto this; nothing else restates
//! these defaults.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Largest WAL object one flush writes; a bigger backlog is split.
    pub flush_bytes_max: usize,
    /// While an upload is in flight, start another only once this much is buffered.
    pub pipeline_bytes_min: usize,
    /// Uploads allowed in flight at once.
    pub uploads_in_flight_max: usize,
    /// Bytes accepted but not yet durable; past this, appends get 503 (back-pressure).
    pub buffer_bytes_max: usize,
    /// Object-store write budget (PUTs per second); `None` = unlimited.
    pub max_writes_per_sec: Option<f64>,
    /// Cap on the exponential backoff between retries of a failing upload.
    pub retry_backoff_max: Duration,
    /// After failing this long, the store is reported down and new appends fail fast.
    pub store_down_after: Duration,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            flush_bytes_max: 8 << 20,
            pipeline_bytes_min: 1 << 20,
            uploads_in_flight_max: 4,
            buffer_bytes_max: 256 << 20,
            max_writes_per_sec: None,
            retry_backoff_max: Duration::from_secs(2),
            store_down_after: Duration::from_secs(5),
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
    /// Largest response body of one catch-up read.
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            wal: WalConfig::default(),
            append_timeout: Duration::from_secs(10),
            append_bytes_max: 8 << 20,
            read_bytes_max: 1 << 20,
            tail_cache_bytes_per_stream: 256 << 10,
            active_streams_max: 100_000,
            dormancy: Duration::from_secs(60),
            stream_name_bytes_max: 1024,
            content_type_bytes_max: 256,
            producer_id_bytes_max: 256,
            stream_seq_bytes_max: 256,
            producers_per_stream_max: 10_000,
        }
    }
}
