//! PicoMQ's storage engine and stream service: durable streams whose every record
//! lives in object storage, written through a group-commit WAL.
//!
//! Layers, top to bottom: `stream` (registry, sequencers, reads), `wal` + `indexer` +
//! `recovery` (the storage engine), `store` + `meta` (backends).

pub mod block_cache;
pub mod checkpoint;
pub mod compaction;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod fencing;
pub mod gc;
pub mod indexer;
pub mod meta;
pub mod metrics;
pub mod offset;
pub mod recovery;
pub mod retention;
pub mod store;
pub mod stream;
pub mod wal;

pub use config::{CompactionConfig, CostConfig, EngineConfig, WalConfig};
pub use error::{EngineError, Result};
pub use offset::{Offset, OffsetError, OffsetQuery};
pub use stream::{
    AppendOutcome, AppendRequest, CreateRequest, Engine, ForkRequest, ProducerHeaders, ReadChunk,
    StreamInfo, StreamRef, WaitOutcome,
};
