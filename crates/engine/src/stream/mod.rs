//! The stream service: the registry of names and one sequencer per active stream.
//! It validates requests against stream state (producers, Stream-Seq, close, content
//! type), assigns offsets, hands ops to the WAL and waits for durability outside any
//! lock, so pipelined appends on one stream share flushes. Reads come from the tail
//! cache or, for older data, from the object store through the index (`read`).
//!
//! One file per verb: `create`, `append` (the sequencer), `read`, `lifecycle`
//! (delete, trim, retention, expiry); `resolve` finds a stream by name, loading it
//! if dormant; `durability` waits for the WAL; `dormancy` and `retention` are the
//! service's background passes.

mod append;
mod cluster;
mod counters;
mod create;
pub(crate) mod dormancy;
mod durability;
pub mod handle;
mod json;
mod json_scan;
mod lifecycle;
pub(crate) mod names;
pub mod producer;
mod read;
pub mod registry;
mod resolve;
pub mod retention;
pub mod seek;
mod service;

use std::sync::Arc;

use bytes::Bytes;

use self::handle::StreamHandle;
use crate::domain::{ContentType, ProducerId, StreamName};
use crate::error::EngineError;
use crate::offset::Offset;

pub use crate::read::ReadChunk;
pub(crate) use cluster::ClusterSide;
pub use counters::ServiceCounters;
pub use json::json_records;
pub use seek::{Located, Seek};
pub(crate) use service::Shared;
pub use service::{Service, WeakService};

#[derive(Clone, Debug)]
pub struct ForkRequest {
    pub source: StreamName,
    pub offset: Option<Offset>,
    pub sub_offset: u64,
}

#[derive(Clone, Debug)]
pub struct CreateRequest {
    pub name: StreamName,
    /// `None`: `application/octet-stream`, or the source's type for a fork.
    pub content_type: Option<ContentType>,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    /// Age retention in seconds; `None`: keep everything.
    pub retention_secs: Option<u64>,
    pub closed: bool,
    pub fork: Option<ForkRequest>,
    pub body: Bytes,
}

impl CreateRequest {
    /// A create of `name` with everything else left to its default.
    pub fn new(name: StreamName) -> CreateRequest {
        CreateRequest {
            name,
            content_type: None,
            ttl_secs: None,
            expires_at: None,
            retention_secs: None,
            closed: false,
            fork: None,
            body: Bytes::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct StreamInfo {
    pub id: u64,
    pub name: String,
    pub content_type: String,
    pub tail: Offset,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub created_ms: u64,
    /// The stream's own first retained offset (see [`Engine::retained_start`] for
    /// what a fork can read of its source).
    pub start: Offset,
    pub retention_secs: Option<u64>,
}

/// An idempotent producer's stamp on an append.
#[derive(Clone, Debug)]
pub struct Producer {
    pub id: ProducerId,
    pub epoch: u64,
    /// The last sequence number the append covers.
    pub seq: u64,
    /// The first, when the append covers several (a Kafka batch); `None`: `seq`.
    pub first_seq: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct AppendRequest {
    pub name: StreamName,
    /// As the client sent it; compared with the stream's media type.
    pub content_type: Option<ContentType>,
    pub body: Bytes,
    pub close: bool,
    /// A writer's own sequence (`Stream-Seq`): each must sort after the last.
    pub stream_seq: Option<String>,
    pub producer: Option<Producer>,
    /// The records, already split (the native record API), instead of `body`; on a
    /// JSON stream each must be one JSON value.
    pub records: Option<Vec<NewRecord>>,
    /// Append only if the stream's next sequence number is this.
    pub match_seq: Option<u64>,
    /// The Kafka topic the append is written as: its subjects (`TOPIC-value`,
    /// `TOPIC-key`) check it when the stream is bound to none.
    pub schema_topic: Option<String>,
    /// Already checked against the stream's schema (a Kafka transaction's records,
    /// checked when produced): the commit must not fail on a binding changed since.
    pub schema_checked: bool,
}

/// One record of the native record API: its bytes and its encoded `RecordExt`.
#[derive(Clone, Debug)]
pub struct NewRecord {
    pub data: Bytes,
    pub ext: Option<Bytes>,
}

impl NewRecord {
    /// A record of bytes only.
    pub fn plain(data: Bytes) -> NewRecord {
        NewRecord { data, ext: None }
    }
}

impl AppendRequest {
    /// An append of `body`, no close, no writer sequence, no producer stamp.
    pub fn new(name: StreamName, content_type: Option<ContentType>, body: Bytes) -> AppendRequest {
        AppendRequest {
            name,
            content_type,
            body,
            close: false,
            stream_seq: None,
            producer: None,
            records: None,
            match_seq: None,
            schema_topic: None,
            schema_checked: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Written (or, for close-only, closed). `producer_seq` echoes the accepted seq.
    Appended {
        tail: Offset,
        closed: bool,
        producer: Option<(u64, u64)>,
        /// The sequence numbers of the records written (empty for a close).
        seqs: std::ops::Range<u64>,
        /// Their server timestamp.
        ts_ms: u64,
    },
    /// Already written by an earlier request with the same producer stamp.
    Duplicate {
        tail: Offset,
        closed: bool,
        epoch: u64,
        last_seq: u64,
    },
}

/// A page of the stream listing.
#[derive(Clone, Debug)]
pub struct ListPage {
    pub streams: Vec<StreamInfo>,
    /// Where the next page goes on (`after`); `None` on the last page.
    pub next: Option<String>,
}

/// Where a read begins (see [`Engine::read_start`](crate::Engine::read_start)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadStart {
    pub from: Offset,
    /// The offset asked for was past the tail: `from` is the tail.
    pub past_tail: bool,
}

pub enum WaitOutcome {
    /// Data past the offset is durable (or the stream closed).
    Ready,
    TimedOut,
    /// The stream moved to another node: ask again (the request is routed afresh).
    Moved,
}

/// A resolved, active stream.
#[derive(Clone)]
pub struct StreamRef {
    pub handle: Arc<StreamHandle>,
}

impl StreamRef {
    pub fn info(&self) -> StreamInfo {
        let view = self.handle.view();
        let c = &self.handle.config;
        StreamInfo {
            id: c.id,
            name: c.name.clone(),
            content_type: c.content_type.clone(),
            tail: view.tail,
            closed: view.closed,
            ttl_secs: c.ttl_secs,
            expires_at: c.expires_at.clone(),
            created_ms: c.created_ms,
            start: view.start,
            retention_secs: view.retention_secs,
        }
    }
}

/// How often an operation re-resolves a stream that changed under it (went dormant,
/// was deleted and re-created) before it gives up with [`changing_too_fast`].
const STATE_RETRIES: usize = 16;

fn changing_too_fast() -> EngineError {
    EngineError::Unavailable("stream is changing state too fast; retry".into())
}
