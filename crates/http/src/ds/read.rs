//! HEAD (metadata), and GET reads: catch-up, `offset=now`, and long-poll. SSE lives in
//! `sse`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Response, StatusCode};
use bytes::{BufMut, Bytes, BytesMut};
use picomq_engine::{OffsetQuery, ReadChunk, StreamName, StreamRef};

use super::{offset_value, query, value, Caller, HttpResult};
use crate::app::AppState;
use crate::cursor::next_cursor;
use crate::error::ApiError;
use crate::headers::*;

/// Catch-up chunks that are not at the tail never change: let caches keep them.
const CACHE_IMMUTABLE_CHUNK: &str = "public, max-age=60, stale-while-revalidate=300";
/// At the tail more data may come: caches must revalidate (ETag) every time.
const CACHE_AT_TAIL: &str = "no-cache";

pub async fn head(app: &AppState, name: StreamName) -> HttpResult {
    let info = app.engine.head(&name).await?;
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, value(&info.content_type))
        .header(STREAM_NEXT_OFFSET, offset_value(info.tail))
        .header(header::CACHE_CONTROL, "no-store")
        .header(
            header::ETAG,
            format!(
                "\"{}:-1:{}{}\"",
                info.id,
                info.tail,
                if info.closed { ":c" } else { "" }
            ),
        );
    if info.closed {
        r = r.header(STREAM_CLOSED, "true");
    }
    if let Some(ttl) = info.ttl_secs {
        r = r.header(STREAM_TTL, ttl);
    }
    if let Some(at) = &info.expires_at {
        r = r.header(STREAM_EXPIRES_AT, value(at));
    }
    r = r.header(STREAM_START_OFFSET, offset_value(info.start));
    if let Some(secs) = info.retention_secs {
        r = r.header(STREAM_RETENTION, secs);
    }
    Ok(r.body(Body::empty()).expect("valid response"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

impl Live {
    fn parse(live: Option<&str>) -> Result<Live, ApiError> {
        match live {
            None | Some("") | Some("false") => Ok(Live::CatchUp),
            Some("long-poll") => Ok(Live::LongPoll),
            Some("sse") => Ok(Live::Sse),
            Some(other) => Err(ApiError::bad_request(format!(
                "live={other:?} is not a read mode; use long-poll or sse"
            ))),
        }
    }
}

pub async fn get(
    app: &Arc<AppState>,
    caller: &Caller<'_>,
    name: StreamName,
    raw_query: Option<&str>,
    headers: &HeaderMap,
) -> HttpResult {
    let mut params = query::read_params(raw_query)?;
    if let (None, Some(consumer)) = (&params.offset, &params.consumer) {
        // A server-kept position (`positions.rs`); none yet: the beginning.
        picomq_consumers::positions::check_consumer(consumer)?;
        let at = app.consumers.positions.get(consumer, &name).await?;
        params.offset = Some(at.map_or_else(|| "-1".to_string(), |o| o.to_string()));
    }
    let live = Live::parse(params.live.as_deref())?;
    if let Some(t) = params.timestamp {
        // A read by time is a read from the offset of the first append at or after it.
        let stream = app.engine.stream(&name).await?;
        let at = app
            .engine
            .seek(&stream, picomq_engine::Seek::Time(t))
            .await?;
        params.offset = Some(at.offset.to_string());
    }
    if live != Live::CatchUp && params.offset.is_none() {
        return Err(ApiError::bad_request(
            "live reads need an offset (use -1 for the beginning, now for the tail)",
        ));
    }
    let offset_param = params.offset.as_deref().unwrap_or("-1");
    let query =
        OffsetQuery::parse(offset_param).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let stream = app.engine.stream(&name).await?;
    let slot = match live {
        Live::CatchUp => None,
        _ => Some(app.live.acquire(&name, caller.token_id())?),
    };
    // Where the read begins (the engine's rule: -1, now, or the start of the append
    // holding the offset), 410 below the first readable offset; checked before an
    // SSE response starts.
    let start = app.engine.read_start(&stream, query).await?;
    let from = start.from;
    match live {
        Live::Sse => {
            return Ok(super::sse::respond(
                app.clone(),
                stream,
                from,
                params.cursor,
                slot,
                caller.principal().cloned(),
            ))
        }
        Live::CatchUp if query == OffsetQuery::Now => return Ok(now_response(&stream)),
        _ => {}
    }
    let max = app.engine.config().read_bytes_max;
    let chunk = match live {
        // Past the tail a long-poll answers at once, as a catch-up read would.
        Live::LongPoll if !start.past_tail => {
            let shutdown = app.shutdown.fired();
            let timeout = app.long_poll_timeout;
            app.engine
                .read_or_wait(&stream, from, max, timeout, shutdown)
                .await?
        }
        _ => app.engine.read(&stream, from, max).await?,
    };
    let cursor = (live == Live::LongPoll)
        .then(|| next_cursor(app.engine.clock().now_ms() / 1000, params.cursor.as_deref()));
    // Nothing came before the timeout (a partial answer, not at the tail, has data
    // still to fetch and is a 200).
    if live == Live::LongPoll && chunk.segments.is_empty() && chunk.up_to_date && !start.past_tail {
        let mut r = Response::builder()
            .status(StatusCode::NO_CONTENT)
            .header(STREAM_NEXT_OFFSET, offset_value(chunk.next))
            .header(STREAM_UP_TO_DATE, "true")
            .header(header::CACHE_CONTROL, "no-store");
        if chunk.closed {
            r = r.header(STREAM_CLOSED, "true");
        } else if let Some(c) = cursor {
            r = r.header(STREAM_CURSOR, c);
        }
        return Ok(r.body(Body::empty()).expect("valid response"));
    }
    // After a trim, -1 names different bytes: the tag carries where they began.
    let requested = match query {
        OffsetQuery::Start if from > picomq_engine::Offset::ZERO => from.to_string(),
        _ => offset_param.to_string(),
    };
    Ok(chunk_response(&stream, chunk, &requested, cursor, headers))
}

/// A read's 200 (or 304 when the client holds this very chunk).
fn chunk_response(
    stream: &StreamRef,
    chunk: ReadChunk,
    requested: &str,
    cursor: Option<u64>,
    headers: &HeaderMap,
) -> Response<Body> {
    let etag = format!(
        "\"{}:{}:{}{}\"",
        stream.info().id,
        requested,
        chunk.next,
        if chunk.closed { ":c" } else { "" }
    );
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        return Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .header(header::ETAG, etag)
            .body(Body::empty())
            .expect("valid response");
    }
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            value(&stream.handle.config.content_type),
        )
        .header(STREAM_NEXT_OFFSET, offset_value(chunk.next))
        .header(header::ETAG, etag)
        .header(
            header::CACHE_CONTROL,
            if chunk.up_to_date {
                CACHE_AT_TAIL
            } else {
                CACHE_IMMUTABLE_CHUNK
            },
        );
    if chunk.up_to_date {
        r = r.header(STREAM_UP_TO_DATE, "true");
    }
    if chunk.closed {
        r = r.header(STREAM_CLOSED, "true");
    }
    if let Some(c) = cursor.filter(|_| !chunk.closed) {
        r = r.header(STREAM_CURSOR, c);
    }
    r.body(Body::new(FramesBody::new(chunk.segments, chunk.json)))
        .expect("valid response")
}

/// `offset=now` catch-up: no data, just where the tail is.
fn now_response(stream: &StreamRef) -> Response<Body> {
    let info = stream.info();
    let json = stream.handle.config.json;
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, value(&info.content_type))
        .header(STREAM_NEXT_OFFSET, offset_value(info.tail))
        .header(STREAM_UP_TO_DATE, "true")
        .header(header::CACHE_CONTROL, "no-store");
    if info.closed {
        r = r.header(STREAM_CLOSED, "true");
    }
    r.body(Body::from(if json { "[]" } else { "" }))
        .expect("valid response")
}

/// Records at least this large go to the socket as they are, shared with the cache
/// that holds them; smaller ones are copied together into frames of about
/// [`FRAME_BYTES`] (a frame per 100-byte record would cost more than the copy).
const SHARED_SEGMENT_BYTES: usize = 8 * 1024;
const FRAME_BYTES: usize = 64 * 1024;

/// A catch-up read's body (the same bytes as [`body_of`], with an exact length) as
/// frames made while the socket takes them: large records go out as the shared
/// slices they are, small ones are gathered a frame at a time. A response of many
/// MiB costs no buffer of its own, only references to bytes the caches hold.
struct FramesBody {
    segments: std::vec::IntoIter<Bytes>,
    json: bool,
    /// JSON: the `[` is out / the `]` is out.
    opened: bool,
    closed: bool,
    /// JSON: the next segment takes a `,` before it.
    comma: bool,
    remaining: u64,
}

impl FramesBody {
    fn new(segments: Vec<Bytes>, json: bool) -> FramesBody {
        let data: u64 = segments.iter().map(|s| s.len() as u64).sum();
        let framing = if json {
            2 + segments.len().saturating_sub(1) as u64
        } else {
            0
        };
        FramesBody {
            segments: segments.into_iter(),
            json,
            opened: !json,
            closed: !json,
            comma: false,
            remaining: data + framing,
        }
    }

    /// The next frame, `None` at the end.
    fn next_frame(&mut self) -> Option<Bytes> {
        let mut pending = BytesMut::new();
        if !self.opened {
            self.opened = true;
            pending.put_u8(b'[');
        }
        while pending.len() < FRAME_BYTES {
            let Some(seg) = self.segments.as_slice().first() else {
                break;
            };
            // Large records, and a lone small one (a live read's usual answer), go
            // out as the shared slices they are.
            let lone = !self.json && pending.is_empty() && self.segments.len() == 1;
            let shared = seg.len() >= SHARED_SEGMENT_BYTES || (lone && !seg.is_empty());
            if !shared && pending.capacity() - pending.len() < seg.len() + 1 {
                // Once per frame (it ends past FRAME_BYTES by less than one small
                // record), and no more than the body has left: a small answer gets a
                // small buffer.
                pending.reserve((self.remaining as usize).min(FRAME_BYTES + SHARED_SEGMENT_BYTES));
            }
            if self.comma {
                self.comma = false;
                pending.put_u8(b',');
            }
            if shared && !pending.is_empty() {
                break; // the gathered bytes go first, the shared slice next time
            }
            let seg = self.segments.next().expect("peeked");
            self.comma = self.json;
            if shared {
                return Some(seg);
            }
            pending.put_slice(&seg);
        }
        if self.segments.as_slice().is_empty() && !self.closed {
            self.closed = true;
            pending.put_u8(b']');
        }
        (!pending.is_empty()).then(|| pending.freeze())
    }
}

impl hyper::body::Body for FramesBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = self.next_frame();
        if let Some(f) = &next {
            self.remaining -= f.len() as u64;
        }
        std::task::Poll::Ready(next.map(|f| Ok(hyper::body::Frame::data(f))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

/// The response body of a read: the bytes, or for JSON streams a JSON array of the
/// messages.
pub fn body_of(chunk: &ReadChunk) -> Bytes {
    let len: usize = chunk.segments.iter().map(|s| s.len() + 1).sum::<usize>() + 2;
    if !chunk.json && chunk.segments.len() == 1 {
        return chunk.segments[0].clone();
    }
    let mut out = BytesMut::with_capacity(len);
    if chunk.json {
        out.put_u8(b'[');
        for (i, seg) in chunk.segments.iter().enumerate() {
            if i > 0 {
                out.put_u8(b',');
            }
            out.put_slice(seg);
        }
        out.put_u8(b']');
    } else {
        for seg in &chunk.segments {
            out.put_slice(seg);
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(segments: &[Bytes], json: bool) -> (Vec<Bytes>, u64) {
        let mut body = FramesBody::new(segments.to_vec(), json);
        let exact = body.remaining;
        let mut out = Vec::new();
        while let Some(f) = body.next_frame() {
            out.push(f);
        }
        assert_eq!(body.remaining, exact, "next_frame does not count");
        (out, exact)
    }

    fn chunk(segments: &[Bytes], json: bool) -> ReadChunk {
        let mut c = ReadChunk::empty(picomq_engine::Offset::ZERO, json);
        c.segments = segments.to_vec();
        c
    }

    #[test]
    fn frames_carry_the_same_bytes_as_one_body_with_large_records_shared() {
        let small = |n: usize, b: u8| Bytes::from(vec![b; n]);
        let large = Bytes::from(vec![b'L'; SHARED_SEGMENT_BYTES * 3]);
        let shapes: Vec<Vec<Bytes>> = vec![
            vec![],
            vec![small(5, b'a')],
            vec![large.clone()],
            vec![small(3, b'a'), large.clone(), small(4, b'b')],
            vec![large.clone(), large.clone()],
            (0..3000)
                .map(|i| small(100, b'0' + (i % 10) as u8))
                .collect(),
            (0..40)
                .map(|i| {
                    if i % 7 == 0 {
                        large.clone()
                    } else {
                        small(1000, b'x')
                    }
                })
                .collect(),
        ];
        for segments in &shapes {
            for json in [false, true] {
                let (out, exact) = frames(segments, json);
                let joined: Vec<u8> = out.iter().flat_map(|f| f.iter().copied()).collect();
                let whole = body_of(&chunk(segments, json));
                assert_eq!(
                    joined,
                    &whole[..],
                    "json {json}, {} segments",
                    segments.len()
                );
                assert_eq!(exact, whole.len() as u64);
                assert!(out.iter().all(|f| !f.is_empty()));
                assert!(
                    out.iter()
                        .all(|f| f.len() <= FRAME_BYTES + SHARED_SEGMENT_BYTES
                            || f.len() == large.len()),
                    "frames stay small unless shared"
                );
                // Large records are the very slices the read returned, not copies.
                let shared = out
                    .iter()
                    .filter(|f| f.len() == large.len() && f.as_ptr() == large.as_ptr())
                    .count();
                let expected = segments.iter().filter(|s| s.len() == large.len()).count();
                assert_eq!(shared, expected);
                if !json && segments.len() == 1 {
                    assert_eq!(
                        out[0].as_ptr(),
                        segments[0].as_ptr(),
                        "a lone record is shared"
                    );
                }
            }
        }
    }
}
