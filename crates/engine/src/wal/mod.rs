//! The write-ahead log: one writer per node packing the ops of all streams into one
//! object per flush (group commit). `format` owns the bytes, `writer` the flush policy,
//! `system` the node's own ops; finding and replaying objects after a restart is the
//! crate's `recovery`.

pub mod format;
pub mod system;
pub mod writer;

pub use writer::{
    DurableListener, FlushedChunk, FlushedObject, Submission, Wal, WalHealth, WalStats,
};
