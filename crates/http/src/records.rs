//! The native record API (docs/native-api.md): the same streams as records with
//! sequence numbers, server timestamps and headers.
//!
//! ```text
//! POST /__picomq/streams/{name}/records          append a batch
//! GET  /__picomq/streams/{name}/records?...      read (catch-up, long-poll, SSE)
//! GET  /__picomq/streams/{name}/info             first/next sequence numbers, count
//! ```
//!
//! Trims by sequence number are `retention.rs`'s (`trim?before_seq=N`). The engine
//! does the work: `Engine::append` with pre-split records, `Engine::seek` to find
//! where a read starts, `Engine::read`/`read_or_wait` for the records.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Response, StatusCode};
use base64::Engine as _;
use bytes::Bytes;
use picomq_engine::{
    AppendOutcome, AppendRequest, EngineError, NewRecord, Offset, OffsetQuery, ReadChunk,
    RecordExt, Seek, StreamName, StreamRef,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::auth::{Access, Op, Principal};
use crate::ds::query::timestamp_param;
use crate::ds::sse::Credential;
use crate::error::ApiError;
use crate::headers;
use crate::request::{percent_decode, read_body};

/// Records one append may carry.
pub const BATCH_RECORDS_MAX: usize = 1_000;
/// Headers one record may carry, and their sizes.
pub const HEADERS_MAX: usize = 64;
pub const HEADER_NAME_BYTES_MAX: usize = 256;
pub const HEADER_BYTES_MAX: usize = 64 << 10;
/// A record's key (the Kafka record key).
pub const KEY_BYTES_MAX: usize = 64 << 10;
/// Records one read returns by default and at most.
pub const READ_COUNT_MAX: usize = 1_000;
/// Body bytes one read returns by default, and at most.
pub const READ_BYTES_DEFAULT: usize = 1 << 20;
pub const READ_BYTES_MAX: usize = 4 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendBody {
    records: Vec<InRecord>,
    #[serde(default)]
    match_seq: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InRecord {
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_base64: Option<String>,
    #[serde(default)]
    json: Option<Value>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    timestamp: Option<u64>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_base64: Option<String>,
}

/// `POST .../records`: the batch as the engine's records.
pub async fn append(
    app: &Arc<AppState>,
    name: StreamName,
    shown: &str,
    req_headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let parsed: AppendBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "body must be {{\"records\": [{{\"body\": ...}}], \"match_seq\": N}}: {e}"
        ))
    })?;
    if parsed.records.is_empty() || parsed.records.len() > BATCH_RECORDS_MAX {
        return Err(ApiError::bad_request(format!(
            "an append carries 1 to {BATCH_RECORDS_MAX} records, not {}",
            parsed.records.len()
        )));
    }
    let mut records = Vec::with_capacity(parsed.records.len());
    for (i, r) in parsed.records.into_iter().enumerate() {
        records.push(new_record(i, r)?);
    }
    let count = records.len() as u64;
    let mut request = AppendRequest::new(name.clone(), None, Bytes::new());
    request.records = Some(records);
    request.match_seq = parsed.match_seq;
    request.producer = crate::ds::write::producer(app, req_headers)?;
    let watched = app.watching_writes().then(|| name.clone());
    let outcome = app.engine.append(request).await?;
    if let Some(name) = watched {
        app.written(&name);
    }
    let body = match outcome {
        AppendOutcome::Appended {
            tail, seqs, ts_ms, ..
        } => {
            debug_assert_eq!(seqs.end - seqs.start, count);
            json!({
                "stream": shown,
                "first_seq": seqs.start,
                "last_seq": seqs.end - 1,
                "next_seq": seqs.end,
                "first_timestamp": ts_ms,
                "last_timestamp": ts_ms,
                "next_offset": tail.to_string(),
                "duplicate": false,
            })
        }
        AppendOutcome::Duplicate { tail, .. } => {
            let stream = app.engine.stream(&name).await?;
            json!({
                "stream": shown,
                "next_seq": stream.handle.view().tail_seq,
                "next_offset": tail.to_string(),
                "duplicate": true,
            })
        }
    };
    Ok(crate::app::json_response(StatusCode::OK, body))
}

fn new_record(i: usize, r: InRecord) -> Result<NewRecord, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("record {i}: {m}"));
    let data = match (r.body, r.body_base64, r.json) {
        (Some(text), None, None) => Bytes::from(text),
        (None, Some(b64), None) => Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| bad(format!("body_base64 is not base64: {e}")))?,
        ),
        (None, None, Some(v)) => Bytes::from(serde_json::to_vec(&v).expect("a Value serializes")),
        _ => {
            return Err(bad(
                "give exactly one of body, body_base64 or json".to_string()
            ))
        }
    };
    if r.headers.len() > HEADERS_MAX {
        return Err(bad(format!("at most {HEADERS_MAX} headers")));
    }
    let mut header_bytes = 0;
    for (name, value) in &r.headers {
        let name_ok = !name.is_empty()
            && name.len() <= HEADER_NAME_BYTES_MAX
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !name_ok {
            return Err(bad(format!(
                "header name {name:?} must be 1 to {HEADER_NAME_BYTES_MAX} visible ASCII characters without ':'"
            )));
        }
        header_bytes += name.len() + value.len();
    }
    if header_bytes > HEADER_BYTES_MAX {
        return Err(bad(format!(
            "headers hold {header_bytes} bytes; the limit is {HEADER_BYTES_MAX}"
        )));
    }
    let key = match (r.key, r.key_base64) {
        (None, None) => None,
        (Some(text), None) => Some(Bytes::from(text)),
        (None, Some(b64)) => Some(Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| bad(format!("key_base64 is not base64: {e}")))?,
        )),
        _ => return Err(bad("give key or key_base64, not both".to_string())),
    };
    if key.as_ref().is_some_and(|k| k.len() > KEY_BYTES_MAX) {
        return Err(bad(format!("the key is over {KEY_BYTES_MAX} bytes")));
    }
    // A record's bytes are never empty (an empty record is unreadable at the
    // tail): an empty body is kept as one zero byte marked empty (RecordExt).
    let empty_value = data.is_empty();
    let data = if empty_value {
        Bytes::from_static(b"\0")
    } else {
        data
    };
    let ext = if r.headers.is_empty() && r.timestamp.is_none() && key.is_none() && !empty_value {
        None
    } else {
        if r.timestamp == Some(u64::MAX) {
            return Err(bad("timestamp is out of range".to_string()));
        }
        let ext = RecordExt {
            client_ts_ms: r.timestamp,
            headers: r
                .headers
                .into_iter()
                .map(|(n, v)| (n, Bytes::from(v)))
                .collect(),
            key,
            null_value: false,
            empty_value,
        };
        Some(ext.encode())
    };
    Ok(NewRecord { data, ext })
}

/// Where a read starts.
#[derive(Debug, PartialEq)]
enum From {
    First,
    Seq(u64),
    Time(u64),
    Tail(u64),
    Offset(OffsetQuery),
}

#[derive(Debug, PartialEq)]
struct ReadParams {
    from: From,
    count: usize,
    bytes: usize,
    until: Option<u64>,
    live: Live,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

fn read_params(raw: Option<&str>) -> Result<ReadParams, ApiError> {
    let mut p = ReadParams {
        from: From::First,
        count: READ_COUNT_MAX,
        bytes: READ_BYTES_DEFAULT,
        until: None,
        live: Live::CatchUp,
    };
    let mut starts = 0;
    for pair in raw.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (key, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)
            .ok_or_else(|| ApiError::bad_request(format!("query parameter {key} is malformed")))?;
        let uint = |max: u64| headers::strict_uint(&v, key, max);
        match key {
            "seq" => {
                starts += 1;
                p.from = From::Seq(uint(u64::MAX >> 1)?);
            }
            "timestamp" => {
                starts += 1;
                p.from = From::Time(timestamp_param(key, &v)?);
            }
            "tail" => {
                starts += 1;
                p.from = From::Tail(uint(u64::MAX >> 1)?);
            }
            "offset" => {
                starts += 1;
                p.from = From::Offset(
                    OffsetQuery::parse(&v).map_err(|e| ApiError::bad_request(e.to_string()))?,
                );
            }
            "count" => {
                p.count = uint(READ_COUNT_MAX as u64)? as usize;
                if p.count == 0 {
                    return Err(ApiError::bad_request("count must be at least 1"));
                }
            }
            "bytes" => {
                p.bytes = uint(READ_BYTES_MAX as u64)? as usize;
                if p.bytes == 0 {
                    return Err(ApiError::bad_request("bytes must be at least 1"));
                }
            }
            "until" => p.until = Some(timestamp_param(key, &v)?),
            "live" => {
                p.live = match v.as_str() {
                    "" | "false" => Live::CatchUp,
                    "long-poll" => Live::LongPoll,
                    "sse" => Live::Sse,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "live={other:?} is not a read mode; use long-poll or sse"
                        )))
                    }
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}; a records read takes seq, timestamp, tail or offset, and count, bytes, until, live"
                )))
            }
        }
    }
    if starts > 1 {
        return Err(ApiError::bad_request(
            "give at most one of seq, timestamp, tail and offset",
        ));
    }
    Ok(p)
}

/// `GET .../records`.
pub async fn read(
    app: &Arc<AppState>,
    name: StreamName,
    raw_query: Option<&str>,
    principal: Option<Principal>,
) -> Result<Response<Body>, ApiError> {
    let params = read_params(raw_query)?;
    let stream = app.engine.stream(&name).await?;
    let (from, from_seq) = start(app, &stream, &params.from).await?;
    let slot = match params.live {
        Live::CatchUp => None,
        _ => Some(app.live.acquire(
            &name,
            match &principal {
                Some(Principal::Token(t)) => Some(t.id.as_str()),
                _ => None,
            },
        )?),
    };
    if params.live == Live::Sse {
        return Ok(sse(
            app.clone(),
            stream,
            (from, from_seq),
            params,
            principal,
            slot,
        ));
    }
    let at = (from, from_seq);
    let mut page = Page::read(app, &stream, at, &params, false).await?;
    if params.live == Live::LongPoll && page.records.is_empty() && page.up_to_date && !page.closed {
        page = Page::read(app, &stream, at, &params, true).await?;
    }
    if !page.records.is_empty() {
        app.engine.bookmark(&stream, page.next_seq, page.next);
    }
    Ok(crate::app::json_response(StatusCode::OK, page.json()))
}

/// Where a read starts: a record boundary and the number of the record there.
/// Numbers are dense, so a number below the tail that a seek does not find exactly
/// was trimmed; only a read from the start asks for the first record.
async fn start(app: &AppState, stream: &StreamRef, from: &From) -> Result<(Offset, u64), ApiError> {
    let engine = &app.engine;
    let at = match *from {
        From::First => engine.first_record(stream).await?,
        From::Seq(n) => {
            // The next page of a reader paging by number: where its last page ended.
            if let Some(offset) = engine.bookmarked(stream, n).await? {
                return Ok((offset, n));
            }
            let at = engine.seek(stream, Seek::Seq(n)).await?;
            if at.seq > n {
                return Err(ApiError::new(
                    StatusCode::GONE,
                    "trimmed",
                    format!(
                        "record {n} was trimmed; the first retained record is {}",
                        at.seq
                    ),
                )
                .with_json_field("first_seq", json!(at.seq)));
            }
            at
        }
        From::Time(t) => engine.seek(stream, Seek::Time(t)).await?,
        // Past what is retained, a seek lands on the first retained record.
        From::Tail(n) => {
            let tail = stream.handle.view().tail_seq;
            engine
                .seek(stream, Seek::Seq(tail.saturating_sub(n)))
                .await?
        }
        From::Offset(q) => {
            let from = engine.read_start(stream, q).await?.from;
            return Ok(match q {
                OffsetQuery::At(asked) if asked > from => {
                    record_in_append(app, stream, from, asked).await?
                }
                _ => (from, engine.seq_of(stream, from).await?),
            });
        }
    };
    Ok((at.offset, at.seq))
}

/// Where a read from `asked`, inside the append that starts at `from`, begins. A
/// Durable Streams read starts at the append; a record offset this API gave out
/// (inside a JSON batch, say) starts at that record. Any other offset: the append.
async fn record_in_append(
    app: &AppState,
    stream: &StreamRef,
    from: Offset,
    asked: Offset,
) -> Result<(Offset, u64), EngineError> {
    let chunk = app.engine.read(stream, from, READ_BYTES_MAX).await?;
    let mut pos = from;
    for (data, meta) in chunk.segments.iter().zip(&chunk.meta) {
        if pos == asked {
            return Ok((pos, meta.seq));
        }
        if pos > asked {
            break;
        }
        pos = pos.advance(data.len() as u64);
    }
    let seq = match chunk.meta.first() {
        Some(first) => first.seq,
        None => app.engine.seq_of(stream, from).await?,
    };
    Ok((from, seq))
}

/// One page of records.
struct Page {
    records: Vec<Value>,
    next_seq: u64,
    next: Offset,
    tail_seq: u64,
    up_to_date: bool,
    closed: bool,
    until_reached: bool,
}

impl Page {
    async fn read(
        app: &AppState,
        stream: &StreamRef,
        (from, from_seq): (Offset, u64),
        params: &ReadParams,
        wait: bool,
    ) -> Result<Page, EngineError> {
        let engine = &app.engine;
        let chunk = if wait {
            let shutdown = app.shutdown.fired();
            engine
                .read_or_wait(stream, from, params.bytes, app.long_poll_timeout, shutdown)
                .await?
        } else {
            engine.read(stream, from, params.bytes).await?
        };
        let view = stream.handle.view();
        Ok(Page::of(&chunk, (from, from_seq), params, view.tail_seq))
    }

    /// The records of `chunk` (read from `from`, where record `from_seq` starts)
    /// within the read's bounds.
    fn of(
        chunk: &ReadChunk,
        (from, from_seq): (Offset, u64),
        params: &ReadParams,
        tail_seq: u64,
    ) -> Page {
        let mut records = Vec::new();
        let mut pos = from;
        let mut next_seq = from_seq;
        let mut stopped = false;
        let mut until_reached = false;
        for (data, meta) in chunk.segments.iter().zip(&chunk.meta) {
            if params.until.is_some_and(|u| meta.ts_ms >= u) {
                until_reached = true;
            }
            if until_reached || records.len() >= params.count {
                stopped = true;
                break;
            }
            records.push(record_json(data, meta, pos));
            pos = pos.advance(data.len() as u64);
            next_seq = meta.seq + 1;
        }
        let up_to_date = !stopped && chunk.up_to_date;
        Page {
            records,
            next_seq,
            next: if stopped { pos } else { chunk.next },
            tail_seq: tail_seq.max(next_seq),
            up_to_date,
            closed: up_to_date && chunk.closed,
            until_reached,
        }
    }

    fn json(&self) -> Value {
        json!({
            "records": self.records,
            "next_seq": self.next_seq,
            "next_offset": self.next.to_string(),
            "tail_seq": self.tail_seq,
            "up_to_date": self.up_to_date,
            "closed": self.closed,
            "until_reached": self.until_reached,
        })
    }
}

/// One record as the API shows it.
fn record_json(data: &Bytes, meta: &picomq_engine::RecordMeta, offset: Offset) -> Value {
    let mut r = serde_json::Map::new();
    r.insert("seq".into(), json!(meta.seq));
    r.insert("timestamp".into(), json!(meta.ts_ms));
    r.insert("offset".into(), json!(offset.to_string()));
    let ext = meta
        .ext
        .as_ref()
        .and_then(|e| RecordExt::decode(e).ok())
        .unwrap_or_default();
    let headers: Vec<Value> = ext
        .headers
        .iter()
        .map(|(n, v)| json!([n, String::from_utf8_lossy(v)]))
        .collect();
    r.insert("headers".into(), Value::Array(headers));
    // A Kafka record with a null or empty value holds a placeholder.
    let data: &[u8] = if ext.null_value || ext.empty_value {
        &[]
    } else {
        data
    };
    match std::str::from_utf8(data) {
        Ok(text) => r.insert("body".into(), json!(text)),
        Err(_) => r.insert(
            "body_base64".into(),
            json!(base64::engine::general_purpose::STANDARD.encode(data)),
        ),
    };
    if let Some(ts) = ext.client_ts_ms {
        r.insert("client_timestamp".into(), json!(ts));
    }
    if let Some(key) = &ext.key {
        match std::str::from_utf8(key) {
            Ok(text) => r.insert("key".into(), json!(text)),
            Err(_) => r.insert(
                "key_base64".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(key)),
            ),
        };
    }
    if ext.null_value {
        // A Kafka tombstone: its value is null, not empty.
        r.insert("null_body".into(), json!(true));
    }
    Value::Object(r)
}

/// `live=sse`: an `event: records` per page, until the stream is closed and read,
/// the server's SSE limit, shutdown, or the credential ends.
fn sse(
    app: Arc<AppState>,
    stream: StreamRef,
    from: (Offset, u64),
    params: ReadParams,
    principal: Option<Principal>,
    slot: Option<crate::limits::LiveSlot>,
) -> Response<Body> {
    struct Pump {
        app: Arc<AppState>,
        stream: StreamRef,
        from: (Offset, u64),
        params: ReadParams,
        credential: Option<Credential>,
        started: Instant,
        wait: bool,
        done: bool,
        _slot: Option<crate::limits::LiveSlot>,
    }
    let credential = principal.and_then(|p| Credential::new(&app, p));
    let pump = Pump {
        app,
        stream,
        from,
        params,
        credential,
        started: Instant::now(),
        wait: false,
        done: false,
        _slot: slot,
    };
    let body = futures::stream::unfold(pump, |mut p| async move {
        loop {
            if p.done
                || p.app.shutdown.is_fired()
                || p.started.elapsed() >= p.app.sse_max_duration
                || p.credential.as_ref().is_some_and(|c| c.check().is_err())
            {
                return None;
            }
            let waited = p.wait;
            let page = match Page::read(&p.app, &p.stream, p.from, &p.params, p.wait).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::debug!(error = %e, "records SSE ended");
                    return None;
                }
            };
            p.wait = page.up_to_date;
            // A long-poll's time passed at the tail with nothing: a comment, so that
            // proxies and clients see the connection is alive (EventSource ignores it).
            if waited && page.records.is_empty() && page.up_to_date && !page.closed {
                return Some((
                    Ok::<_, Infallible>(Bytes::from_static(b": keep-alive\n\n")),
                    p,
                ));
            }
            p.done = page.closed || page.until_reached;
            let next = (page.next, page.next_seq);
            if page.records.is_empty() && !p.done {
                if next == p.from && !page.up_to_date {
                    return None; // a partial read with nothing: let the client resume
                }
                p.from = next;
                continue;
            }
            p.from = next;
            let event = format!("event: records\ndata:{}\n\n", page.json());
            return Some((Ok::<_, Infallible>(Bytes::from(event)), p));
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(body))
        .expect("valid response")
}

/// `GET .../info`.
pub async fn info(
    app: &AppState,
    name: StreamName,
    shown: &str,
    access: Access<'_>,
) -> Result<Response<Body>, ApiError> {
    let stream = app.engine.stream(&name).await?;
    let first = app.engine.first_record(&stream).await?;
    let view = stream.handle.view();
    let mut body = json!({
        "stream": shown,
        "content_type": stream.handle.config.content_type,
        "first_seq": first.seq,
        "next_seq": view.tail_seq,
        "records": view.tail_seq - first.seq,
        "first_offset": first.offset.to_string(),
        "next_offset": view.tail.to_string(),
        "closed": view.closed,
    });
    if let Some((source, point, point_seq)) = app.engine.fork_source(&stream).await? {
        // Named as the caller names streams, relative to its token's namespace; a
        // source the caller may not read is not named.
        let source = access
            .shown(&source)
            .filter(|_| access.allows(Op::Read, &source));
        body["forked_from"] = json!({
            "stream": source,
            "offset": point.to_string(),
            "seq": point_seq,
        });
    }
    if let Some((subject, version)) = crate::ds::schema_of(app, &name).await {
        body["schema"] = json!({ "subject": subject, "version": version });
    }
    if let Some(ts) = first.ts_ms {
        body["first_timestamp"] = json!(ts);
        body["last_timestamp"] = json!(stream.handle.lock().last_ts_ms.max(ts));
    }
    Ok(crate::app::json_response(StatusCode::OK, body))
}

/// The method an action allows, for a 405.
pub fn allowed(action: &str, method: &Method) -> bool {
    match action {
        "records" => method == Method::GET || method == Method::POST,
        "info" => method == Method::GET,
        _ => false,
    }
}

/// Reads the body of an append (its JSON is larger than its records: base64 and
/// quoting).
pub async fn read_append_body(app: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let max = app.engine.config().append_bytes_max.saturating_mul(2) + (1 << 20);
    read_body(body, max, app.body_read_timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_parameters_are_checked() {
        let p = read_params(Some("seq=5&count=10&bytes=100&until=2026-12-04T10:00:00Z")).unwrap();
        assert_eq!(p.from, From::Seq(5));
        assert_eq!((p.count, p.bytes), (10, 100));
        assert_eq!(p.until, Some(1_796_378_400_000));
        assert_eq!(
            read_params(Some("tail=3&live=sse")).unwrap().from,
            From::Tail(3)
        );
        assert_eq!(read_params(None).unwrap().from, From::First);
        for bad in [
            "seq=1&tail=2",
            "seq=-1",
            "count=0",
            "count=1001",
            "bytes=99999999",
            "timestamp=soon",
            "live=push",
            "offset=xyz",
            "limit=5",
        ] {
            assert!(read_params(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_need_one_body_and_sane_headers() {
        let rec = |v: Value| new_record(0, serde_json::from_value(v).unwrap());
        assert!(rec(json!({"body": "x"})).unwrap().ext.is_none());
        let r = rec(
            json!({"body_base64": "AAE=", "headers": [["a", "1"], ["a", "2"]], "timestamp": 5}),
        )
        .unwrap();
        assert_eq!(&r.data[..], &[0, 1]);
        let ext = RecordExt::decode(r.ext.as_ref().unwrap()).unwrap();
        assert_eq!(ext.client_ts_ms, Some(5));
        assert_eq!(ext.headers.len(), 2);
        assert_eq!(
            &rec(json!({"json": {"k": [1, 2]}})).unwrap().data[..],
            b"{\"k\":[1,2]}"
        );
        for bad in [
            json!({}),
            json!({"body": "x", "json": 1}),
            json!({"body_base64": "***"}),
            json!({"body": "x", "headers": [["", "v"]]}),
            json!({"body": "x", "headers": [["a:b", "v"]]}),
            json!({"body": "x", "headers": [["a", "x".repeat(70_000)]]}),
        ] {
            assert!(rec(bad.clone()).is_err(), "{bad}");
        }
        assert!(serde_json::from_value::<InRecord>(json!({"body": "x", "extra": 1})).is_err());
    }
}
