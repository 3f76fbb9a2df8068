//! Reading a stream: `[from, tail)` of its view (inherited data from its fork
//! source chain, then its own records), from the tail cache where it holds them,
//! else from the object store (`read::cold`); and waiting for data past an offset
//! (long-polls and SSE park on the stream's notifier).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::handle::{Lifecycle, StreamHandle};
use super::{ListPage, ReadChunk, ReadStart, StreamInfo, StreamRef, WaitOutcome};
use crate::domain::StreamName;
use crate::error::{EngineError, Result};
use crate::meta::StreamRow;
use crate::metrics::Gauge;
use crate::offset::{Offset, OffsetQuery};
use crate::read::cold::Cold;
use crate::stream::Service;
use crate::units;

impl Service {
    /// Where a read of `stream` asked for at `query` begins, counting the read as an
    /// access (it slides the TTL):
    /// - `-1`: the first offset a reader can read (below it: trimmed);
    /// - `now`: the tail;
    /// - an offset: the start of the append holding it, so a reader never gets half
    ///   an append (clients that compute offsets, such as the Yjs provider's `+1`,
    ///   land inside one), or the tail when it is past the tail (`past_tail`), which
    ///   a long-poll answers at once rather than waiting for data that may never
    ///   reach it. Below the first readable offset: 410 (`Trimmed`).
    pub async fn read_start(&self, stream: &StreamRef, query: OffsetQuery) -> Result<ReadStart> {
        let handle = &stream.handle;
        handle.touch(self.inner.clock.now_ms());
        let tail = handle.view().tail;
        let asked = match query {
            OffsetQuery::Start => {
                let from = self.start_of(handle).await?;
                return Ok(ReadStart {
                    from,
                    past_tail: false,
                });
            }
            OffsetQuery::Now => {
                return Ok(ReadStart {
                    from: tail,
                    past_tail: false,
                })
            }
            OffsetQuery::At(o) => o,
        };
        if asked >= tail {
            return Ok(ReadStart {
                from: tail,
                past_tail: asked > tail,
            });
        }
        let start = self.start_of(handle).await?;
        if asked < start {
            return Err(EngineError::Trimmed { start });
        }
        let from = self.append_start(handle, asked).await?.max(start);
        Ok(ReadStart {
            from,
            past_tail: false,
        })
    }

    /// Where the append of `handle`'s view holding `pos` (below the tail) starts: in
    /// the tail cache, else the index, of the stream or fork source that holds it.
    async fn append_start(&self, handle: &Arc<StreamHandle>, pos: Offset) -> Result<Offset> {
        let mut level = handle.clone();
        while let Some(origin) = level.config.fork.clone() {
            if pos >= origin.point {
                break;
            }
            level = self
                .source_handle(origin.source_id)
                .await?
                .ok_or_else(|| EngineError::Internal("fork source is missing".into()))?;
        }
        if let Some(start) = level.cached_append_start(pos) {
            return Ok(start);
        }
        let start = || level.view().start;
        let cold = Cold {
            stream_id: level.config.id,
            name: &level.config.name,
            start: &start,
        };
        let begins = self.inner.cold.append_start(&cold, pos).await?;
        // A fork's own records begin at its fork point, whatever its source holds.
        Ok(match &handle.config.fork {
            Some(f) if pos >= f.point => begins.max(f.point),
            _ => begins,
        })
    }

    /// A catch-up read of durable data from `from` (a [`ReadStart`], or the `next` of
    /// an earlier read): whole appends, about `max_bytes` of them (at least one).
    pub async fn read(
        &self,
        stream: &StreamRef,
        from: Offset,
        max_bytes: usize,
    ) -> Result<ReadChunk> {
        let handle = &stream.handle;
        let view = handle.view();
        let from = from.min(view.tail);
        let deadline = Instant::now() + self.inner.config.read_budget;
        let mut chunk = self
            .read_view(handle, from, view.tail, max_bytes, Some(deadline))
            .await?;
        chunk.up_to_date = chunk.next >= view.tail;
        chunk.closed = chunk.up_to_date && view.closed;
        if chunk.partial {
            self.inner.counters.reads_partial.inc();
        }
        Ok(chunk)
    }

    /// A long-poll: [`Engine::read`], and when it found nothing on an open stream,
    /// waits up to `timeout` (or until `cancel` resolves) for data past `from`, then
    /// reads again. An empty answer means nothing came.
    pub async fn read_or_wait(
        &self,
        stream: &StreamRef,
        from: Offset,
        max_bytes: usize,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<ReadChunk> {
        let chunk = self.read(stream, from, max_bytes).await?;
        // Only at the tail is there anything to wait for (a partial read has data
        // still to fetch).
        if !chunk.segments.is_empty() || chunk.closed || !chunk.up_to_date {
            return Ok(chunk);
        }
        let outcome = tokio::select! {
            r = self.wait(stream, from, timeout) => r?,
            () = cancel => WaitOutcome::TimedOut,
        };
        stream.handle.touch(self.inner.clock.now_ms());
        match outcome {
            WaitOutcome::Ready => self.read(stream, from, max_bytes).await,
            WaitOutcome::TimedOut | WaitOutcome::Moved => Ok(chunk),
        }
    }

    /// Reads `[from, until)` of a stream's view: inherited data from its fork source
    /// chain, then its own records.
    pub(crate) async fn read_view(
        &self,
        handle: &Arc<StreamHandle>,
        from: Offset,
        until: Offset,
        max_bytes: usize,
        deadline: Option<Instant>,
    ) -> Result<ReadChunk> {
        // Without a deadline (the engine's own reads: fork points, trim checks) the
        // read waits for the store as long as it takes.
        let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let mut out = ReadChunk::empty(from, handle.config.json);
        let mut budget = max_bytes;
        // Walk the fork chain: each level serves [pos, min(its fork point, until)).
        let mut levels = vec![(handle.clone(), until)];
        while let Some(origin) = levels.last().expect("non-empty").0.config.fork.clone() {
            if out.next >= origin.point {
                break;
            }
            let cap = levels.last().expect("non-empty").1.min(origin.point);
            let source = self
                .source_handle(origin.source_id)
                .await?
                .ok_or_else(|| EngineError::Internal("fork source is missing".into()))?;
            levels.push((source, cap));
        }
        while let Some((level, cap)) = levels.pop() {
            if out.next >= cap || (budget == 0 && !out.segments.is_empty()) {
                continue;
            }
            self.read_own(&level, &mut out, cap, &mut budget, deadline)
                .await?;
            if out.next < cap {
                break; // out of budget
            }
        }
        Ok(out)
    }

    /// Appends a stream's own records in `[out.next, until)` to `out`.
    pub(crate) async fn read_own(
        &self,
        handle: &Arc<StreamHandle>,
        out: &mut ReadChunk,
        until: Offset,
        budget: &mut usize,
        deadline: Instant,
    ) -> Result<()> {
        while out.next < until && (*budget > 0 || out.segments.is_empty()) && !out.partial {
            if let Some(cached) = handle.read_cached(out.next, until, *budget) {
                let n: usize = cached.segments.iter().map(|s| s.len()).sum();
                let c = &self.inner.counters;
                c.reads_memory.inc();
                c.read_bytes_memory.add(n as u64);
                *budget = budget.saturating_sub(n);
                out.segments.extend(cached.segments);
                out.flags.extend(cached.flags);
                out.meta.extend(cached.meta);
                out.next = cached.end;
                return Ok(());
            }
            let start = || handle.view().start;
            let cold = Cold {
                stream_id: handle.config.id,
                name: &handle.config.name,
                start: &start,
            };
            self.inner
                .cold
                .read(&cold, out, until, budget, deadline)
                .await?;
        }
        Ok(())
    }

    /// Waits until data beyond `offset` is durable, the stream closes, or `timeout`.
    pub async fn wait(
        &self,
        stream: &StreamRef,
        offset: Offset,
        timeout: Duration,
    ) -> Result<WaitOutcome> {
        let mut rx = stream.handle.subscribe();
        let _parked = Parked::new(&self.inner.counters.waiting_reads);
        let wait = async {
            loop {
                let view = *rx.borrow_and_update();
                if view.tail > offset || view.closed {
                    return Ok(WaitOutcome::Ready);
                }
                if view.evicted {
                    return Ok(WaitOutcome::Moved);
                }
                match view.lifecycle {
                    Lifecycle::Live => {}
                    Lifecycle::SoftDeleted => return Err(EngineError::Gone),
                    Lifecycle::Deleted => return Err(EngineError::NotFound),
                }
                if rx.changed().await.is_err() {
                    return Err(EngineError::NotFound);
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Ok(WaitOutcome::TimedOut),
        }
    }

    /// A page of live streams whose names start with `prefix`, after `after`, in
    /// name order, at most `limit` of them, and the name the next page goes on after
    /// (`None` on the last page). Acknowledged creates are included.
    pub async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<ListPage> {
        self.index_barrier().await?;
        // One extra row says whether another page exists.
        let mut rows = self.inner.meta.list(prefix, after, limit + 1).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = more.then(|| rows.last().map(|r| r.name.clone())).flatten();
        let now = self.inner.clock.now_ms();
        let mut streams = Vec::with_capacity(rows.len());
        for row in rows {
            // A stream served by another node: its owner expires it, not a listing.
            if !maybe_expired(&row, now) || !self.serves(&row.name) {
                streams.push(info_of(row));
                continue;
            }
            // Its sliding TTL counts accesses the index has not seen yet: only the
            // stream service can tell (and expires it if it did).
            match self.head(&StreamName::stored(row.name)).await {
                Ok(info) => streams.push(info),
                Err(EngineError::NotFound | EngineError::Gone) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ListPage { streams, next })
    }

    /// Live streams whose names start with `prefix`, counted up to `limit` (a quota
    /// check: creates acknowledged so far are included).
    pub async fn count_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64> {
        self.index_barrier().await?;
        self.inner
            .meta
            .count_streams_with_prefix(prefix, limit)
            .await
    }
}

/// Counts a parked reader for as long as it lives.
struct Parked<'a>(&'a Gauge);

impl<'a> Parked<'a> {
    fn new(gauge: &'a Gauge) -> Parked<'a> {
        gauge.add(1);
        Parked(gauge)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.sub(1);
    }
}

/// By the metadata alone this stream may have expired.
fn maybe_expired(row: &StreamRow, now_ms: u64) -> bool {
    let by_deadline = row
        .expires_at
        .as_deref()
        .and_then(units::parse_rfc3339_ms)
        .is_some_and(|at| at <= now_ms);
    let by_ttl = row.ttl_secs.is_some_and(|ttl| {
        row.last_access_ms.max(row.created_ms) + ttl.saturating_mul(1000) <= now_ms
    });
    by_deadline || by_ttl
}

fn info_of(row: StreamRow) -> StreamInfo {
    StreamInfo {
        id: row.id,
        name: row.name,
        content_type: row.content_type,
        tail: row.tail,
        closed: row.closed,
        ttl_secs: row.ttl_secs,
        expires_at: row.expires_at,
        created_ms: row.created_ms,
        start: row.start,
        retention_secs: row.retention_secs,
    }
}
