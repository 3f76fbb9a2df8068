//! The write-ahead log: one writer per node packing the ops of all streams into one
//! object per flush (group commit). `format` owns the bytes, `writer` the flush policy,
//! `recovery` finding and replaying objects after a restart.

pub mod format;
pub mod writer;

pub use writer::{
    DurableListener, FlushedChunk, FlushedObject, Submission, Wal, WalHealth, WalStats,
};
