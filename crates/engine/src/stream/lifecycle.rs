//! A stream's life after creation: delete (soft while forks read it, cascading to
//! sources that lost their last fork), trim, age retention, and expiry by TTL or
//! Expires-At. Each is a WAL op through the sequencer, so a rebuild from the bucket
//! replays it.

use std::sync::Arc;

use bytes::Bytes;

use super::handle::{self, Lifecycle, StreamHandle};
use super::{changing_too_fast, STATE_RETRIES};
use crate::domain::{Invalid, StreamName};
use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::stream::Service;
use crate::wal::format::Op;

impl Service {
    pub async fn delete(&self, name: &StreamName) -> Result<()> {
        let _guard = self.inner.lifecycle.lock().await;
        let handle = self
            .lookup_in(name, true)
            .await?
            .ok_or(EngineError::NotFound)?;
        if handle.view().lifecycle == Lifecycle::SoftDeleted {
            return Err(EngineError::Gone);
        }
        self.delete_locked(handle).await
    }

    /// Deletes a stream (soft if forks still read it), then cascades to sources that
    /// were soft-deleted and lost their last fork. Caller holds the lifecycle lock.
    pub(crate) async fn delete_locked(&self, mut handle: Arc<StreamHandle>) -> Result<()> {
        let mut went_dormant = 0;
        loop {
            self.index_barrier().await?;
            let soft = self.forks_of(handle.config.id).await? > 0;
            let op_no = {
                let mut st = handle.lock();
                if st.lifecycle == Lifecycle::Deleted {
                    return Ok(());
                }
                if st.evicted {
                    None
                } else {
                    let op_no = st.next_op;
                    self.submit(&handle, op_no, Op::Delete { soft })?;
                    st.next_op += 1;
                    st.lifecycle = if soft {
                        Lifecycle::SoftDeleted
                    } else {
                        Lifecycle::Deleted
                    };
                    Some(op_no)
                }
            };
            let Some(op_no) = op_no else {
                // The stream went dormant while we waited for the index: a delete
                // recorded on its old handle would be invisible to the next lookup,
                // which loads the stream afresh. Act on the handle active now.
                went_dormant += 1;
                if went_dormant > STATE_RETRIES {
                    return Err(changing_too_fast());
                }
                match self.lookup_id(handle.config.id).await? {
                    Some(active) => {
                        active.touch(self.inner.clock.now_ms());
                        handle = active;
                        continue;
                    }
                    None => return Ok(()),
                }
            };
            self.wait_durable(&handle, op_no).await?;
            if soft {
                return Ok(());
            }
            self.index_barrier().await?;
            self.inner.registry.remove(&handle);
            // Cascade: a soft-deleted source whose last fork this was goes too.
            let Some(origin) = &handle.config.fork else {
                return Ok(());
            };
            let Some(source) = self.source_handle(origin.source_id).await? else {
                return Ok(());
            };
            if !self.serves(&source.config.name) {
                self.cascade_remote(&source);
                return Ok(());
            }
            if source.view().lifecycle != Lifecycle::SoftDeleted
                || self.forks_of(source.config.id).await? > 0
            {
                return Ok(());
            }
            handle = source;
        }
    }

    /// Drops `name`'s data below `before`: reads there answer 410 from then on, and
    /// the bytes go with GC (whole WAL objects) or compaction. Goes through the
    /// sequencer as a WAL op, so a rebuild from the bucket replays it. Trimming at or
    /// below the current start changes nothing; beyond the tail is a bad request.
    /// Returns the stream's start once the trim is durable.
    ///
    /// On a JSON stream `before` must be a message boundary (an offset the server
    /// handed out): a start inside a message would make reads from -1 begin with a
    /// fragment of it. Byte streams have no boundaries to keep.
    pub async fn trim(&self, name: &StreamName, before: Offset) -> Result<Offset> {
        let stream = self.stream(name).await?;
        let view = stream.handle.view();
        let json = stream.handle.config.json;
        if json && before < view.tail && before > self.start_of(&stream.handle).await? {
            // The record holding the byte before `before` must end right at it.
            let last = self
                .read_view(&stream.handle, Offset(before.0 - 1), view.tail, 1, None)
                .await?;
            if last.segments.first().map(Bytes::len) != Some(1) {
                return Err(EngineError::bad_request(format!(
                    "{before} is inside a JSON message; trim at a message boundary (an offset the server returned)"
                )));
            }
        }
        self.trim_at_boundary(name, before).await
    }

    /// [`Engine::trim`] at an offset known to be a record boundary (the end of an
    /// index row, for the retention pass).
    pub async fn trim_at_boundary(&self, name: &StreamName, before: Offset) -> Result<Offset> {
        let (start, moved) = self
            .stream_op(name, |engine, handle, st| {
                if before > st.tail {
                    return Err(EngineError::bad_request(format!(
                        "cannot trim before {before}: the stream ends at {}",
                        st.tail
                    )));
                }
                if before <= st.start {
                    // Already trimmed this far (maybe not durable yet: wait for it).
                    return Ok((st.next_op - 1, (st.start, false)));
                }
                let op_no = st.next_op;
                engine.submit(handle, op_no, Op::Trim { before })?;
                st.next_op += 1;
                st.start = before;
                Ok((op_no, (before, true)))
            })
            .await?;
        if moved {
            self.inner.counters.trims.inc();
            tracing::debug!(stream = %name, start = %start, "stream trimmed");
        }
        Ok(start)
    }

    /// Sets (or with `None` clears) `name`'s age retention; the retention pass trims
    /// what is older (see `retention`).
    pub async fn set_retention(&self, name: &StreamName, secs: Option<u64>) -> Result<()> {
        validate_retention(secs)?;
        self.stream_op(name, |engine, handle, st| {
            let op_no = st.next_op;
            engine.submit(handle, op_no, Op::SetRetention { secs })?;
            st.next_op += 1;
            st.retention_secs = secs;
            Ok((op_no, ()))
        })
        .await
    }

    /// Runs `decide` on a live stream's state under its lock (retrying if the
    /// stream was evicted meanwhile), then waits until the op number it returns is
    /// durable (0: nothing to wait for).
    pub(crate) async fn stream_op<T>(
        &self,
        name: &StreamName,
        mut decide: impl FnMut(&Service, &Arc<StreamHandle>, &mut handle::State) -> Result<(u64, T)>,
    ) -> Result<T> {
        for _ in 0..STATE_RETRIES {
            let handle = self.stream(name).await?.handle;
            let (op_no, out) = {
                let mut st = handle.lock();
                if st.evicted {
                    continue;
                }
                match st.lifecycle {
                    Lifecycle::Live => {}
                    Lifecycle::SoftDeleted => return Err(EngineError::Gone),
                    Lifecycle::Deleted => return Err(EngineError::NotFound),
                }
                decide(self, &handle, &mut st)?
            };
            if op_no > 0 {
                self.wait_durable(&handle, op_no).await?;
            }
            return Ok(out);
        }
        Err(changing_too_fast())
    }

    pub(crate) async fn expire(&self, handle: &Arc<StreamHandle>) -> Result<()> {
        let _guard = self.inner.lifecycle.lock().await;
        if handle.view().lifecycle != Lifecycle::Live {
            return Ok(());
        }
        tracing::debug!(stream = %handle.config.name, "stream expired");
        self.delete_locked(handle.clone()).await?;
        self.inner.counters.expired.inc();
        Ok(())
    }
}

/// A retention must be a positive number of seconds within `RETENTION_SECS_MAX`.
pub(crate) fn validate_retention(secs: Option<u64>) -> Result<()> {
    match secs {
        Some(s) if s == 0 || s > crate::config::RETENTION_SECS_MAX => Err(Invalid::Retention {
            max: crate::config::RETENTION_SECS_MAX,
        }
        .into()),
        _ => Ok(()),
    }
}
