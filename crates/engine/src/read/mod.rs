//! The read path below the stream service: what one catch-up read returns, and the
//! tiers it is served from when the stream's tail cache cannot: the block cache and
//! ranged GETs through the object index (`cold`). Knows nothing of the stream
//! service above it; the service decides which stream, which range and when.

pub mod block_cache;
pub mod checked;
pub mod cold;

use bytes::Bytes;

use crate::metrics::Desc;
use crate::offset::Offset;

/// Reads by tier: `memory` (the tail cache) or `store` (ranged GETs of indexed chunks).
pub static READS: Desc = Desc::counter(
    "picomq_reads_total",
    "Read steps by tier: memory (tail cache) or store (ranged GET of an indexed chunk).",
);
pub static READ_BYTES: Desc = Desc::counter(
    "picomq_read_bytes_total",
    "Bytes read by tier (store: whole chunks fetched).",
);

/// What the native record API shows of a record besides its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordMeta {
    /// Its sequence number (records are numbered densely per stream).
    pub seq: u64,
    /// Its server timestamp (ms since the Unix epoch).
    pub ts_ms: u64,
    /// Its encoded `RecordExt` (headers, client timestamp), if any.
    pub ext: Option<Bytes>,
}

/// One catch-up read.
pub struct ReadChunk {
    pub segments: Vec<Bytes>,
    /// Per segment: does it start a new append (JSON batches span several records)?
    pub flags: Vec<u8>,
    /// Per segment: its record's number, timestamp and extension.
    pub meta: Vec<RecordMeta>,
    pub next: Offset,
    /// The read reached the durable tail.
    pub up_to_date: bool,
    /// Closed, and the read reached the final offset.
    pub closed: bool,
    pub json: bool,
    /// The store did not answer within the read's budget: this is what was ready
    /// (maybe nothing), and the client reads on from `next`.
    pub partial: bool,
}

impl ReadChunk {
    /// An empty read starting at `from`.
    pub fn empty(from: Offset, json: bool) -> ReadChunk {
        ReadChunk {
            segments: Vec::new(),
            flags: Vec::new(),
            meta: Vec::new(),
            next: from,
            up_to_date: false,
            closed: false,
            json,
            partial: false,
        }
    }

    /// Bytes of data gathered so far.
    pub fn bytes(&self) -> usize {
        self.segments.iter().map(Bytes::len).sum()
    }
}
