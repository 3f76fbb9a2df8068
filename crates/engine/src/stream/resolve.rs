//! Finding a stream by name or id: the registry of active streams first, else the
//! metadata store (a dormant stream is loaded and registered), with the checks every
//! operation needs (deleted, soft-deleted, expired, not yet durable).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::handle::{Lifecycle, StreamConfig, StreamHandle};
use super::producer::ProducerState;
use super::{changing_too_fast, StreamInfo, StreamRef, STATE_RETRIES};
use crate::domain::{self, StreamName};
use crate::error::{EngineError, Result};
use crate::meta::StreamRow;
use crate::offset::Offset;
use crate::stream::Service;
use crate::units;

impl Service {
    pub(crate) fn handle_from_row(
        &self,
        row: StreamRow,
        producers: HashMap<String, (u64, u64)>,
        term: u64,
    ) -> Result<Arc<StreamHandle>> {
        let config = StreamConfig {
            id: row.id,
            json: domain::media_type(&row.content_type) == "application/json",
            expires_at_ms: row.expires_at.as_deref().and_then(units::parse_rfc3339_ms),
            name: row.name,
            content_type: row.content_type,
            created_ms: row.created_ms,
            ttl_secs: row.ttl_secs,
            expires_at: row.expires_at,
            fork: row.fork,
        };
        let producers = producers
            .into_iter()
            .map(|(id, (epoch, last_seq))| {
                (
                    id,
                    ProducerState {
                        epoch,
                        last_seq,
                        last_op: 0,
                    },
                )
            })
            .collect();
        let lifecycle = if row.soft_deleted {
            Lifecycle::SoftDeleted
        } else {
            Lifecycle::Live
        };
        // A restart must never shorten a sliding TTL: count the load as an access.
        let last_access = row.last_access_ms.max(row.created_ms);
        Ok(Arc::new(
            StreamHandle::new(
                config,
                row.start,
                row.retention_secs,
                row.tail,
                row.next_seq,
                row.closed,
                row.closed_by,
                row.stream_seq,
                producers,
                lifecycle,
                last_access,
                self.inner.config.tail_cache_bytes_per_stream,
            )
            .with_term(term),
        ))
    }

    pub(crate) fn check_capacity(&self) -> Result<()> {
        if self.inner.registry.len() >= self.inner.config.active_streams_max {
            self.make_room();
        }
        if self.inner.registry.len() >= self.inner.config.active_streams_max {
            return Err(EngineError::Overloaded(format!(
                "too many active streams (limit {}); retry shortly",
                self.inner.config.active_streams_max
            )));
        }
        Ok(())
    }

    /// At the active-stream limit, settled streams idle for `PRESSURE_IDLE` give way
    /// before their dormancy timeout, so that many streams touched once (e.g. a
    /// million created with one append each) do not lock new ones out for a whole
    /// dormancy period. One O(active) sweep per `PRESSURE_SWEEP_EVERY` at most.
    pub(crate) fn make_room(&self) {
        const PRESSURE_IDLE: Duration = Duration::from_secs(1);
        const PRESSURE_SWEEP_EVERY: Duration = Duration::from_millis(100);
        let now = self.inner.clock.now_ms();
        let last = self.inner.pressure_sweep_ms.load(Ordering::Relaxed);
        if now < last + PRESSURE_SWEEP_EVERY.as_millis() as u64
            || self
                .inner
                .pressure_sweep_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let idle = PRESSURE_IDLE.min(self.inner.config.dormancy);
        let evicted = self
            .inner
            .registry
            .sweep(now.saturating_sub(idle.as_millis() as u64));
        if !evicted.is_empty() {
            // Last-access times go to the metadata store off the request path, as
            // the dormancy sweeper does.
            let meta = self.inner.meta.clone();
            tokio::spawn(async move {
                if let Err(e) = meta.touch(&evicted).await {
                    tracing::warn!(error = %e, "recording last access of evicted streams failed");
                }
            });
        }
    }

    /// Registers the stream of `row`, read while this node served its slot at
    /// ownership term `term` (read before the row: see `StreamHandle::term`).
    pub(crate) async fn load(
        &self,
        row: Option<StreamRow>,
        term: u64,
    ) -> Result<Option<Arc<StreamHandle>>> {
        let Some(row) = row else { return Ok(None) };
        // Only the owner loads a stream into its registry (its sequencer lives there).
        self.check_owner(&row.name)?;
        self.check_capacity()?;
        let producers = self.inner.meta.producers(row.id).await?;
        // Timestamps never decrease along a stream, across restarts and owners too:
        // the next append's time starts from the last indexed record's.
        let last = if row.tail > row.start {
            let at = Offset(row.tail.0 - 1);
            self.inner
                .meta
                .chunks_from(row.id, at, 1)
                .await?
                .first()
                .map(|r| r.last_ts_ms)
        } else {
            None
        };
        let handle = self.handle_from_row(row, producers, term)?;
        if let Some(ts) = last {
            let mut st = handle.lock();
            st.last_ts_ms = st.last_ts_ms.max(ts);
        }
        let id = handle.config.id;
        let active = self.inner.registry.insert(handle.clone(), |existing| {
            let v = existing.view();
            // A deleted stream's own tombstone stays (its row may not be gone yet).
            v.evicted
                || existing.term() < term
                || (v.lifecycle == Lifecycle::Deleted && existing.config.id != id)
        });
        // A hand-over of the slot may have passed while the row was read; it did
        // not see this handle, so it must not stay behind (see `submit`). Nor may a
        // handle whose row was read under an earlier term than the slot's now.
        if Arc::ptr_eq(&active, &handle)
            && (!self.serves(&active.config.name) || self.term_of(&active.config.name) != term)
        {
            handle.retire();
            self.inner.registry.remove(&handle);
            return Err(EngineError::NotOwner);
        }
        Ok(Some(active))
    }

    /// The active handle for `name`, loading it if dormant; `None` if there is none.
    /// Deleted and expired streams resolve to `None`.
    pub(crate) async fn lookup(&self, name: &str) -> Result<Option<Arc<StreamHandle>>> {
        self.lookup_in(name, false).await
    }

    /// `lookup` for callers that already hold the lifecycle lock (`lifecycle_held`):
    /// an expired stream is then deleted without taking the lock again.
    pub(crate) async fn lookup_in(
        &self,
        name: &str,
        lifecycle_held: bool,
    ) -> Result<Option<Arc<StreamHandle>>> {
        self.check_owner(name)?;
        for _ in 0..STATE_RETRIES {
            let handle = match self.registered(name) {
                Some(h) => h,
                None if !self.inner.names.may_contain(name) => return Ok(None),
                // Boxed, like the other rare branches below: a future is as large as
                // its largest branch, and every append's is moved into a box.
                None => match Box::pin(self.load_by_name(name)).await? {
                    Some(h) => h,
                    None => return Ok(None),
                },
            };
            let view = handle.view();
            if view.evicted {
                continue;
            }
            if view.lifecycle == Lifecycle::Deleted {
                if self
                    .inner
                    .registry
                    .by_name(name)
                    .is_some_and(|h| Arc::ptr_eq(&h, &handle))
                {
                    return Ok(None);
                }
                continue;
            }
            if view.op == 0 && handle.lock().next_op > 1 {
                // Created here and not yet durable: the creation is not visible yet.
                self.wait_durable(&handle, 1).await?;
            }
            if view.lifecycle == Lifecycle::Live && handle.is_expired(self.inner.clock.now_ms()) {
                if lifecycle_held {
                    Box::pin(self.delete_locked(handle.clone())).await?;
                } else {
                    Box::pin(self.expire(&handle)).await?;
                }
                continue;
            }
            return Ok(Some(handle));
        }
        Err(changing_too_fast())
    }

    /// A stream not in memory, from the metadata store.
    pub(crate) async fn load_by_name(&self, name: &str) -> Result<Option<Arc<StreamHandle>>> {
        let term = self.term_of(name);
        self.load(self.inner.meta.stream_by_name(name).await?, term)
            .await
    }

    pub(crate) async fn lookup_id(&self, id: u64) -> Result<Option<Arc<StreamHandle>>> {
        for _ in 0..STATE_RETRIES {
            let handle = match self.inner.registry.by_id(id).and_then(|h| self.current(h)) {
                Some(h) => h,
                None => {
                    let Some(row) = self.inner.meta.stream_by_id(id).await? else {
                        return Ok(None);
                    };
                    // The row loaded is read after the term is taken, as in
                    // `load_by_name` (the first read only finds the name).
                    let term = self.term_of(&row.name);
                    match self
                        .load(self.inner.meta.stream_by_id(id).await?, term)
                        .await?
                    {
                        Some(h) => h,
                        None => return Ok(None),
                    }
                }
            };
            if handle.view().evicted {
                continue;
            }
            return Ok(Some(handle));
        }
        Err(changing_too_fast())
    }

    /// Resolves a stream for a client operation: 404 if absent, 410 if soft-deleted.
    pub async fn stream(&self, name: &StreamName) -> Result<StreamRef> {
        let handle = self.lookup(name).await?.ok_or(EngineError::NotFound)?;
        match handle.view().lifecycle {
            Lifecycle::Live => Ok(StreamRef { handle }),
            Lifecycle::SoftDeleted => Err(EngineError::Gone),
            Lifecycle::Deleted => Err(EngineError::NotFound),
        }
    }

    /// Stream metadata; does not count as an access (HEAD does not slide TTLs).
    pub async fn head(&self, name: &StreamName) -> Result<StreamInfo> {
        let stream = self.stream(name).await?;
        let mut info = stream.info();
        info.start = self.retained_start(&stream).await?;
        Ok(info)
    }

    /// The first offset a reader of `stream` can read: its own start, or for a fork
    /// whose start is below its fork point, as far up as its source chain trimmed
    /// (a fork reading inherited data below its source's start gets 410 too).
    pub async fn retained_start(&self, stream: &StreamRef) -> Result<Offset> {
        self.start_of(&stream.handle).await
    }

    /// `Err(Trimmed)` if `from` is below what a reader of `stream` can read. Only a
    /// read below a fork point asks the fork's sources.
    pub async fn check_retained(&self, stream: &StreamRef, from: Offset) -> Result<()> {
        let handle = &stream.handle;
        let inherited = handle.config.fork.as_ref().is_some_and(|f| from < f.point);
        if from < handle.view().start || inherited {
            let start = self.start_of(handle).await?;
            if from < start {
                return Err(EngineError::Trimmed { start });
            }
        }
        Ok(())
    }

    pub(crate) async fn start_of(&self, handle: &Arc<StreamHandle>) -> Result<Offset> {
        let mut start = handle.view().start;
        let mut level = handle.clone();
        let mut cap = Offset(u64::MAX);
        while let Some(origin) = level.config.fork.clone() {
            cap = cap.min(origin.point);
            if start >= cap {
                break;
            }
            let source = self
                .source_handle(origin.source_id)
                .await?
                .ok_or_else(|| EngineError::Internal("fork source is missing".into()))?;
            start = start.max(source.view().start.min(cap));
            level = source;
        }
        Ok(start)
    }

    /// Where a fork came from: its source's name, the offset its own data begins at
    /// and that record's sequence number. `None` for a stream that is not a fork (or
    /// whose source is gone for good).
    pub async fn fork_source(&self, stream: &StreamRef) -> Result<Option<(String, Offset, u64)>> {
        let Some(origin) = stream.handle.config.fork.clone() else {
            return Ok(None);
        };
        Ok(self
            .source_handle(origin.source_id)
            .await?
            .map(|source| (source.config.name.clone(), origin.point, origin.point_seq)))
    }

    /// Marks a read or write access (slides the TTL).
    pub fn touch(&self, stream: &StreamRef) {
        stream.handle.touch(self.inner.clock.now_ms());
    }
}
