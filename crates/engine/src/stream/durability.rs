//! Waiting for the WAL: an op is answered once durable (or with 503 when the store
//! is down or the wait times out), and operations that read the metadata index wait
//! for it to catch up with what is durable (`index_barrier`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::handle::{DurableView, StreamHandle};
use crate::error::{EngineError, Result};
use crate::stream::Service;
use crate::wal::format::Op;
use crate::wal::Submission;

impl Service {
    pub(crate) async fn wait_durable(
        &self,
        handle: &StreamHandle,
        op_no: u64,
    ) -> Result<DurableView> {
        let epoch = &self.inner.health_epoch;
        let wait = async {
            loop {
                let view = handle.view();
                if view.op >= op_no {
                    return Ok(view);
                }
                // Read before the health: a change after this is counted before the
                // waiters are woken (`wake_waiters_on_health_changes`), so it is seen
                // below even if it came before this writer's waker was registered.
                let seen = epoch.load(Ordering::SeqCst);
                // Store down or fenced: answer now rather than at the timeout. The
                // op stays queued (store down) and may still become durable.
                self.inner.wal.check_health().map_err(|e| {
                    EngineError::Unavailable(format!(
                        "{e}; this write's outcome is unknown, retry with idempotent producer headers"
                    ))
                })?;
                // The op's waker is registered first (biased); a health change wakes
                // it, and the second branch then sees the count move.
                let health_changed = std::future::poll_fn(|_| {
                    if epoch.load(Ordering::SeqCst) == seen {
                        Poll::Pending
                    } else {
                        Poll::Ready(())
                    }
                });
                tokio::select! {
                    biased;
                    view = handle.durable_op(op_no) => return Ok(view),
                    () = health_changed => {}
                }
            }
        };
        match tokio::time::timeout(self.inner.config.append_timeout, wait).await {
            // A cluster member acknowledges only while its lease holds: past it,
            // another member may be taking its streams over (which it does with
            // everything durable, this op included, so the op is not lost).
            Ok(Ok(_)) if self.cluster().is_some_and(|c| !c.lease.is_valid()) => {
                Err(EngineError::Unavailable(
                    "this node's cluster lease lapsed before the write was acknowledged; its outcome is unknown, retry with idempotent producer headers".into(),
                ))
            }
            Ok(r) => r,
            Err(_) => Err(EngineError::Unavailable(format!(
                "write not durable within {:?} (object store slow or down); its outcome is unknown, retry with idempotent producer headers",
                self.inner.config.append_timeout
            ))),
        }
    }

    /// Waits until the metadata store reflects every object written so far.
    pub(crate) async fn index_barrier(&self) -> Result<()> {
        let target = self.inner.wal.stats().objects_written.get();
        let mut applied = self.inner.indexer.applied.clone();
        self.inner.indexer.want(target);
        let wait = async move { applied.wait_for(|a| *a >= target).await.is_ok() };
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(true) => Ok(()),
            _ => Err(EngineError::Unavailable(
                "metadata index is behind; retry".into(),
            )),
        }
    }

    /// Queues `op` for the WAL; called under the handle's lock. In a cluster it
    /// first checks, under that lock, that this node still serves the stream: a
    /// hand-over stops serving the slot (`Cluster::disown`), then retires every
    /// registered handle of it (under their locks) and waits for what they
    /// submitted. An op that saw the slot served is therefore on a handle the
    /// hand-over retires and waits for (both sides are SeqCst, and the handle was
    /// registered before it could be found); one that did not is refused here.
    /// So is one on a handle of an earlier ownership term than the slot's now (see
    /// `StreamHandle::term`): its sequencer may be behind what another owner wrote.
    pub(crate) fn submit(&self, handle: &Arc<StreamHandle>, op_no: u64, op: Op) -> Result<()> {
        if !self.serves(&handle.config.name) || self.term_of(&handle.config.name) != handle.term() {
            return Err(EngineError::NotOwner);
        }
        self.submit_more(handle, op_no, op)
    }

    /// `submit` for the ops that follow a checked one under the same lock hold (a
    /// create's initial data): they go with it, whatever ownership did since.
    pub(crate) fn submit_more(&self, handle: &Arc<StreamHandle>, op_no: u64, op: Op) -> Result<()> {
        self.inner.wal.submit(Submission {
            stream_id: handle.config.id,
            op_no,
            op,
            listener: handle.clone(),
        })
    }
}
