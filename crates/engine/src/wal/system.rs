//! The system chunk: ops of the node rather than of one stream (compaction's
//! relocations, tokens, server keys), logged under stream id `SYSTEM_STREAM`. One
//! op counter and one listener for every writer of it, so its ops enter the log in
//! number order and "indexed up to op N" means what it says.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::format::{Op, SYSTEM_STREAM};
use super::{DurableListener, Submission, Wal, WalHealth};
use crate::error::{EngineError, Result};

struct Listener {
    indexed: watch::Sender<u64>,
}

impl DurableListener for Listener {
    fn on_durable(&self, _ops: &[(u64, Op)]) {}
    fn on_indexed(&self, op_no: u64) {
        self.indexed.send_if_modified(|v| {
            let newer = op_no > *v;
            *v = (*v).max(op_no);
            newer
        });
    }
}

pub struct SystemLog {
    wal: Wal,
    listener: Arc<Listener>,
    /// The last op number handed out, taken with its submission (see the module docs).
    last_op: Mutex<u64>,
}

impl SystemLog {
    pub fn new(wal: Wal) -> SystemLog {
        SystemLog {
            wal,
            listener: Arc::new(Listener {
                indexed: watch::channel(0).0,
            }),
            last_op: Mutex::new(0),
        }
    }

    /// Logs `ops` and waits until they are durable and indexed, or fails if this
    /// node stops writing first (then they are replayed by whoever recovers the log,
    /// or never landed: the caller's outcome is unknown).
    pub async fn commit(&self, ops: Vec<Op>) -> Result<()> {
        let last = {
            let mut last = self.last_op.lock().expect("system log lock");
            for op in ops {
                let listener: Arc<dyn DurableListener> = self.listener.clone();
                self.wal.submit(Submission {
                    stream_id: SYSTEM_STREAM,
                    op_no: *last + 1,
                    op,
                    listener,
                })?;
                *last += 1;
            }
            *last
        };
        let mut indexed = self.listener.indexed.subscribe();
        let mut health = self.wal.health();
        loop {
            if *indexed.borrow_and_update() >= last {
                return Ok(());
            }
            if matches!(
                *health.borrow_and_update(),
                WalHealth::Fenced | WalHealth::Stopped
            ) {
                return Err(EngineError::Unavailable(
                    "the log stopped before the change was committed; its outcome is unknown"
                        .into(),
                ));
            }
            tokio::select! {
                _ = indexed.changed() => {}
                _ = health.changed() => {}
            }
        }
    }
}
