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
    Ok(chunk_response(&stream, &chunk, &requested, cursor, headers))
}

/// A read's 200 (or 304 when the client holds this very chunk).
fn chunk_response(
    stream: &StreamRef,
    chunk: &ReadChunk,
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
    r.body(Body::from(body_of(chunk))).expect("valid response")
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
