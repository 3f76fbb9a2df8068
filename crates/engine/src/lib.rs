//! PicoMQ's storage engine and stream service: durable streams whose every record
//! lives in object storage, written through a group-commit WAL.
//!
//! Layers, top to bottom (see docs/architecture.md):
//! - `node`: the engine of one node, its start, stop, health and metrics;
//! - `stream`: the stream service (registry, sequencers, one file per verb);
//! - `read`: the read tiers below it (block cache, cold reads through the index);
//! - `wal` + `indexer` + `recovery` + `background`: the storage engine;
//! - `store` + `meta`: the backends.
//!
//! Cross-cutting owners: `config` (every default), `clock` (wall time), `layout`
//! (every object key), `units` (durations, sizes, timestamps), `metrics`, `offset`
//! (the wire form of a position), `domain` (media types), `error`.

mod access;
pub mod background;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod domain;
pub mod error;
pub mod failpoint;
pub mod fencing;
pub mod identity;
mod indexer;
pub mod into_cluster;
pub mod layout;
pub mod meta;
pub mod metrics;
pub mod node;
pub mod offset;
pub mod read;
pub mod recovery;
pub mod schemas;
pub mod shutdown;
pub mod store;
pub mod stream;
pub mod units;
pub mod wal;

pub use clock::Clock;
pub use config::{CompactionConfig, CostConfig, EngineConfig, PackConfig, WalConfig};
pub use domain::{ContentType, Invalid, ProducerId, StreamName};
pub use error::{EngineError, Result};
pub use meta::TokenRecord;
pub use node::Engine;
pub use offset::{Offset, OffsetError, OffsetQuery};
pub use read::RecordMeta;
pub use stream::{
    AppendOutcome, AppendRequest, CreateRequest, ForkRequest, ListPage, Located, NewRecord,
    Producer, ReadChunk, ReadStart, Seek, StreamInfo, StreamRef, WaitOutcome,
};
pub use wal::format::RecordExt;
