//! The write-ahead log: one writer per node packing the ops of all streams into one
//! object per flush (group commit). `format` owns the bytes, `writer` the flush policy,
//! `recovery` finding and replaying objects after a restart.

pub mod format;
pub mod writer;

pub use writer::{
    DurableListener, FlushedChunk, FlushedObject, Submission, Wal, WalHealth, WalStats,
};

/// Calls `pass` every `interval` (first after one interval) for as long as this node
/// is the bucket's writer: background work on the bucket (checkpoints, GC) stops once
/// the WAL is fenced or stopped.
pub async fn while_writer<F, Fut>(
    interval: std::time::Duration,
    mut health: tokio::sync::watch::Receiver<WalHealth>,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = tokio::time::Instant::now() + interval;
    let mut ticker = tokio::time::interval_at(start, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if matches!(
            *health.borrow_and_update(),
            WalHealth::Fenced | WalHealth::Stopped
        ) {
            return;
        }
        pass().await;
    }
}
