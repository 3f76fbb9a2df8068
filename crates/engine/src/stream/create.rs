//! Creating a stream (idempotent: the same request again is 200, a different one
//! 409), with an optional first append, and forking one at an offset.

use std::collections::HashMap;
use std::sync::Arc;

use super::handle::{Lifecycle, StreamConfig, StreamHandle};
use super::json::json_records;
use super::lifecycle::validate_retention;
use super::{changing_too_fast, CreateRequest, ForkRequest, StreamInfo, StreamRef, STATE_RETRIES};
use crate::cluster::ForkPin;
use crate::domain::{self, Invalid};
use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::stream::Service;
use crate::units;
use crate::wal::format::{CreateOp, ForkOrigin, Op, RECORD_BATCH_START};

impl Service {
    /// Creates `req.name`, or confirms that it exists as asked: `(true, _)` when it
    /// was created now.
    pub async fn create(&self, req: CreateRequest) -> Result<(bool, StreamInfo)> {
        if req.body.len() > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "initial body of {} bytes exceeds the limit of {} bytes",
                req.body.len(),
                self.inner.config.append_bytes_max
            )));
        }
        if req.ttl_secs.is_some() && req.expires_at.is_some() {
            return Err(Invalid::TtlWithExpiry.into());
        }
        validate_retention(req.retention_secs)?;
        let expires_at_ms = match &req.expires_at {
            Some(s) => Some(units::parse_rfc3339_ms(s).ok_or(Invalid::ExpiryNotRfc3339)?),
            None => None,
        };
        // A fork of a source this node serves takes the lifecycle lock, so that a
        // concurrent delete of the source sees it. A source served by another node
        // is pinned there instead (`fork_from`), and no lock of this node is held
        // across that call: two nodes forking each other's streams at once would
        // otherwise each hold its own lock while waiting for the other's.
        let guard = match &req.fork {
            Some(f) if self.serves(&f.source) => Some(self.inner.lifecycle.lock().await),
            _ => None,
        };
        for _ in 0..STATE_RETRIES {
            // Taken before the name is resolved: a new stream's handle is of the
            // term its absence was seen in (see `StreamHandle::term`).
            let term = self.term_of(&req.name);
            if let Some(existing) = self
                .registered(&req.name)
                .or(self.lookup_in(&req.name, guard.is_some()).await?)
            {
                match existing.view().lifecycle {
                    Lifecycle::SoftDeleted => {
                        return Err(EngineError::conflict(
                            "a deleted stream with live forks still holds this path; it cannot be reused until its forks are deleted",
                        ))
                    }
                    Lifecycle::Deleted => {}
                    Lifecycle::Live => {
                        if existing.view().evicted {
                            continue;
                        }
                        if existing.view().op == 0 && existing.lock().next_op > 1 {
                            self.wait_durable(&existing, 1).await?;
                        }
                        return self.confirm_existing(&existing, &req, guard.is_some()).await.map(|info| (false, info));
                    }
                }
            }
            match self
                .create_new(&req, expires_at_ms, term, guard.is_some())
                .await?
            {
                Some(info) => return Ok((true, info)),
                None => continue, // lost a race for the name; look again
            }
        }
        Err(changing_too_fast())
    }

    /// Idempotent create: 200 if the existing stream matches the request, else 409.
    pub(crate) async fn confirm_existing(
        &self,
        existing: &Arc<StreamHandle>,
        req: &CreateRequest,
        lifecycle_held: bool,
    ) -> Result<StreamInfo> {
        let c = &existing.config;
        let view = existing.view();
        let mismatch = |what: &str| {
            Err(EngineError::conflict(format!(
                "stream already exists with a different {what}"
            )))
        };
        let wanted_type = match (&req.content_type, &req.fork) {
            (Some(ct), _) => domain::media_type(ct.as_str()),
            (None, Some(_)) => domain::media_type(&c.content_type),
            (None, None) => domain::OCTET_STREAM.to_string(),
        };
        if wanted_type != domain::media_type(&c.content_type) {
            return mismatch("content type");
        }
        if req.closed != view.closed {
            return mismatch("closed state");
        }
        // Retention can change after creation (admin API): only a stated one must match.
        // Sequencer state: the retention op follows the create and may not be durable yet.
        let retention_secs = existing.lock().retention_secs;
        if req.retention_secs.is_some() && req.retention_secs != retention_secs {
            return mismatch("retention");
        }
        match (&req.fork, &c.fork) {
            (None, None) => {
                if req.ttl_secs != c.ttl_secs || req.expires_at != c.expires_at {
                    return mismatch("TTL or expiry");
                }
            }
            (Some(f), Some(origin)) => {
                let source_id = if self.serves(&f.source) {
                    self.lookup_in(&f.source, lifecycle_held)
                        .await?
                        .map(|s| s.config.id)
                } else {
                    self.stream_id_anywhere(&f.source).await?
                };
                if source_id != Some(origin.source_id) {
                    return mismatch("fork source");
                }
                if f.offset.is_some() && f.offset != origin.requested_offset.or(Some(origin.point))
                {
                    return mismatch("fork offset");
                }
                if f.sub_offset != origin.sub_offset {
                    return mismatch("fork sub-offset");
                }
                if req.ttl_secs.is_some() && req.ttl_secs != c.ttl_secs
                    || req.expires_at.is_some() && req.expires_at != c.expires_at
                {
                    return mismatch("TTL or expiry");
                }
            }
            _ => return mismatch("fork origin"),
        }
        Ok(StreamRef {
            handle: existing.clone(),
        }
        .info())
    }

    /// Creates a new stream; `None` if another request claimed the name first.
    pub(crate) async fn create_new(
        &self,
        req: &CreateRequest,
        expires_at_ms: Option<u64>,
        term: u64,
        lifecycle_held: bool,
    ) -> Result<Option<StreamInfo>> {
        let mut shape = Shape {
            content_type: req
                .content_type
                .as_ref()
                .map_or(domain::OCTET_STREAM.to_string(), |c| c.as_str().to_string()),
            ttl_secs: req.ttl_secs,
            expires_at: req.expires_at.clone(),
            expires_at_ms,
            fork: None,
            pin: None,
        };
        if let Some(f) = &req.fork {
            self.fork_from(req, f, &mut shape, lifecycle_held).await?;
        }
        let json = domain::is_json(&shape.content_type);
        let prepared = async {
            let records = if req.body.is_empty() {
                Vec::new()
            } else if json {
                json_records(&req.body, true)?
            } else {
                vec![req.body.clone()]
            };
            self.check_capacity()?;
            Ok::<_, EngineError>((records, self.new_stream_id().await?))
        };
        let (records, id) = match prepared.await {
            Ok(p) => p,
            Err(e) => {
                // A pin left behind would count as a fork of the source for its whole
                // lifetime: a delete of the source meanwhile would be soft for good.
                if let Some((url, source_id, pin)) = shape.pin.take() {
                    self.unpin_remote_fork(url, source_id, pin);
                }
                return Err(e);
            }
        };
        let created_ms = self.inner.clock.now_ms();
        let handle = self.new_handle(id, req, &shape, json, created_ms, term);
        // Before the stream is registered: once it is evicted, lookups find it
        // through the filter (see `names`).
        self.inner.names.insert(&req.name);
        let active = self.inner.registry.insert(handle.clone(), |existing| {
            let v = existing.view();
            v.evicted || v.lifecycle == Lifecycle::Deleted || existing.term() < term
        });
        let lost_race = !Arc::ptr_eq(&active, &handle);
        // A hand-over of the slot may have passed since the name was resolved; it
        // did not see this handle, so it is not left behind (see `submit`). Nor is
        // one whose name was resolved under an earlier term than the slot's now.
        let moved = !lost_race && (!self.serves(&req.name) || self.term_of(&req.name) != term);
        if moved {
            handle.retire();
            self.inner.registry.remove(&handle);
        }
        if lost_race || moved {
            if let Some((url, source_id, pin)) = shape.pin.take() {
                self.unpin_remote_fork(url, source_id, pin);
            }
            return if moved {
                Err(EngineError::NotOwner)
            } else {
                Ok(None)
            };
        }
        let pin = shape.pin.take();
        let create = CreateOp {
            name: req.name.to_string(),
            content_type: shape.content_type,
            created_ms,
            ttl_secs: shape.ttl_secs,
            expires_at: shape.expires_at,
            fork: shape.fork,
        };
        let created = match self.submit_creation(&handle, req, create, records) {
            Ok(last_op) => self.wait_durable(&handle, last_op).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Some((url, source_id, pin)) = pin {
            // Released once the fork is in the index (or at once if it failed).
            self.unpin_remote_fork(url, source_id, pin);
        }
        created?;
        Ok(Some(StreamRef { handle }.info()))
    }

    /// A fork takes its source's content type and, unless given its own, its TTL or
    /// expiry; its history is the source's below the fork point. A source served by
    /// another node pins the point there (see `stream::cluster`).
    async fn fork_from(
        &self,
        req: &CreateRequest,
        f: &ForkRequest,
        shape: &mut Shape,
        lifecycle_held: bool,
    ) -> Result<()> {
        let content_type = req.content_type.as_ref().map(|c| c.as_str());
        let resolved = if self.serves(&f.source) {
            // The source's slot came here after `create` looked (a hand-over):
            // without the lifecycle lock a delete of it could miss this fork.
            if !lifecycle_held {
                return Err(EngineError::Unavailable(
                    "the fork source moved to this node meanwhile; try again".into(),
                ));
            }
            let source = match self.lookup_in(&f.source, true).await? {
                Some(s) => s,
                None => return Err(EngineError::ForkSourceNotFound),
            };
            self.resolve_fork(&source, f.offset, f.sub_offset, content_type)
                .await?
        } else {
            let pin = ForkPin {
                source: f.source.to_string(),
                offset: f.offset.map(|o| o.0),
                sub_offset: f.sub_offset,
                content_type: content_type.map(str::to_string),
            };
            let (url, pinned) = self.pin_remote_fork(&pin).await?;
            shape.pin = Some((url, pinned.source_id, pinned.pin));
            ResolvedFork {
                source_id: pinned.source_id,
                expires_at_ms: pinned
                    .expires_at
                    .as_deref()
                    .and_then(units::parse_rfc3339_ms),
                content_type: pinned.content_type,
                ttl_secs: pinned.ttl_secs,
                expires_at: pinned.expires_at,
                point: Offset(pinned.point),
                point_seq: pinned.point_seq,
            }
        };
        shape.content_type = resolved.content_type;
        if shape.ttl_secs.is_none() && shape.expires_at.is_none() {
            shape.ttl_secs = resolved.ttl_secs;
            shape.expires_at = resolved.expires_at;
            shape.expires_at_ms = resolved.expires_at_ms;
        }
        shape.fork = Some(ForkOrigin {
            source_id: resolved.source_id,
            point: resolved.point,
            point_seq: resolved.point_seq,
            requested_offset: f.offset,
            sub_offset: f.sub_offset,
        });
        Ok(())
    }

    /// Checks a fork of `source` and resolves its point: the source must be live,
    /// of the same media type as asked, and hold the anchor (`offset`, or its tail)
    /// within what it retains.
    pub(crate) async fn resolve_fork(
        &self,
        source: &Arc<StreamHandle>,
        offset: Option<Offset>,
        sub_offset: u64,
        content_type: Option<&str>,
    ) -> Result<ResolvedFork> {
        if source.view().lifecycle == Lifecycle::SoftDeleted {
            return Err(EngineError::conflict(
                "the fork source was deleted and cannot be forked",
            ));
        }
        match content_type {
            Some(ct) if !domain::same_media_type(ct, &source.config.content_type) => {
                return Err(EngineError::conflict(format!(
                    "content type {ct:?} differs from the source stream's {:?}",
                    source.config.content_type
                )))
            }
            _ => {}
        }
        let tail = source.view().tail;
        let anchor = offset.unwrap_or(tail);
        let source_start = self.start_of(source).await?;
        if anchor < source_start {
            return Err(EngineError::Trimmed {
                start: source_start,
            });
        }
        if anchor > tail {
            return Err(Invalid::ForkOffsetPastTail.into());
        }
        if sub_offset > 0 && offset.is_none() {
            return Err(Invalid::ForkSubOffsetWithoutOffset.into());
        }
        let point = if sub_offset > 0 {
            self.resolve_sub_offset(source, anchor, sub_offset).await?
        } else {
            anchor
        };
        let point_seq = self.seq_at(source, point).await?;
        Ok(ResolvedFork {
            source_id: source.config.id,
            content_type: source.config.content_type.clone(),
            ttl_secs: source.config.ttl_secs,
            expires_at: source.config.expires_at.clone(),
            expires_at_ms: source.config.expires_at_ms,
            point,
            point_seq,
        })
    }

    fn new_handle(
        &self,
        id: u64,
        req: &CreateRequest,
        shape: &Shape,
        json: bool,
        created_ms: u64,
        term: u64,
    ) -> Arc<StreamHandle> {
        let start = shape.fork.as_ref().map_or(Offset::ZERO, |f| f.point);
        let start_seq = shape.fork.as_ref().map_or(0, |f| f.point_seq);
        let config = StreamConfig {
            id,
            name: req.name.to_string(),
            content_type: shape.content_type.clone(),
            json,
            created_ms,
            ttl_secs: shape.ttl_secs,
            expires_at: shape.expires_at.clone(),
            expires_at_ms: shape.expires_at_ms,
            fork: shape.fork.clone(),
        };
        Arc::new(
            StreamHandle::new(
                config,
                Offset::ZERO,
                None,
                start,
                start_seq,
                false,
                None,
                None,
                HashMap::new(),
                Lifecycle::Live,
                created_ms,
                self.inner.config.tail_cache_bytes_per_stream,
            )
            .with_term(term),
        )
    }

    /// Submits a new stream's ops (create, retention, first append or close) under
    /// its lock; returns the last op's number.
    fn submit_creation(
        &self,
        handle: &Arc<StreamHandle>,
        req: &CreateRequest,
        create: CreateOp,
        records: Vec<bytes::Bytes>,
    ) -> Result<u64> {
        let mut st = handle.lock();
        if let Err(e) = self.submit(handle, 1, Op::Create(create)) {
            drop(st);
            self.inner.registry.remove(handle);
            return Err(e);
        }
        st.next_op = 2;
        if req.retention_secs.is_some() {
            // The create op predates retention; the setting travels as its own op.
            let secs = req.retention_secs;
            self.submit_more(handle, 2, Op::SetRetention { secs })?;
            st.retention_secs = secs;
            st.next_op = 3;
        }
        if !records.is_empty() || req.closed {
            let records = records.into_iter().map(super::NewRecord::plain).collect();
            let op = self.build_append(&mut st, records, req.closed, None, None);
            // The create is queued; if this fails the stream exists, empty.
            let op_no = st.next_op;
            self.submit_more(handle, op_no, Op::Append(op.clone()))?;
            self.commit_append(&mut st, op_no, &op);
        }
        Ok(st.next_op - 1)
    }

    /// The fork point `sub` units past `anchor` on `source`: bytes into the next
    /// append for byte streams, messages into the next batch for JSON streams.
    pub(crate) async fn resolve_sub_offset(
        &self,
        source: &Arc<StreamHandle>,
        anchor: Offset,
        sub: u64,
    ) -> Result<Offset> {
        let overshoot = || EngineError::from(Invalid::ForkSubOffsetPastAppend);
        let chunk = self
            .read_view(source, anchor, source.view().tail, 16 << 20, None)
            .await?;
        if source.config.json {
            let mut pos = anchor;
            for (i, (seg, flags)) in chunk
                .segments
                .iter()
                .zip(&chunk.flags)
                .enumerate()
                .take(sub as usize)
            {
                if i > 0 && flags & RECORD_BATCH_START != 0 {
                    return Err(overshoot());
                }
                pos = pos.advance(seg.len() as u64);
            }
            if (chunk.segments.len() as u64) < sub {
                return Err(overshoot());
            }
            Ok(pos)
        } else {
            // The first append at the anchor, as this stream's view shows it.
            let mut first_len = 0u64;
            for (i, (seg, flags)) in chunk.segments.iter().zip(&chunk.flags).enumerate() {
                if i > 0 && flags & RECORD_BATCH_START != 0 {
                    break;
                }
                first_len += seg.len() as u64;
            }
            if sub > first_len {
                return Err(overshoot());
            }
            Ok(anchor.advance(sub))
        }
    }
}

/// What a new stream is, once a fork's source has had its say.
struct Shape {
    content_type: String,
    ttl_secs: Option<u64>,
    expires_at: Option<String>,
    expires_at_ms: Option<u64>,
    fork: Option<ForkOrigin>,
    /// A pin on the fork point held by the source's owner: `(its URL, source id,
    /// pin)`, released once the fork is indexed.
    pin: Option<(String, u64, u64)>,
}

/// What a fork takes from its source.
pub(crate) struct ResolvedFork {
    pub(crate) source_id: u64,
    pub(crate) content_type: String,
    pub(crate) ttl_secs: Option<u64>,
    pub(crate) expires_at: Option<String>,
    pub(crate) expires_at_ms: Option<u64>,
    pub(crate) point: Offset,
    pub(crate) point_seq: u64,
}
