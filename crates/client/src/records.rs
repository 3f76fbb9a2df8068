//! PicoMQ's native record API (`/__picomq/streams/{name}/...`, docs/native-api.md):
//! the same streams as records with dense sequence numbers, server timestamps,
//! headers and bodies. Appends ([`NewRecord`], conditional on `match_seq`, stamped
//! by a producer if asked), reads from a sequence number, a time, the tail or an
//! offset ([`ReadFrom`], [`ReadBounds`]), [`follow_records`](DurableStream::follow_records),
//! info and trims. PicoMQ only: other Durable Streams servers do not have it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::connection::{describe, parse_json};
use crate::error::{Error, Result};
use crate::follow::{FollowOptions, Retrier, LIVE_WAIT};
use crate::offset::Offset;
use crate::path::query_value;
use crate::stream::DurableStream;
use crate::transport::HttpMethod;

/// At most this many records in one append (the server's limit).
pub const APPEND_RECORDS_MAX: usize = 1_000;

/// A record to append.
#[derive(Clone, Debug)]
pub struct NewRecord {
    body: NewBody,
    headers: Vec<(String, String)>,
    timestamp_ms: Option<u64>,
}

#[derive(Clone, Debug)]
enum NewBody {
    Text(String),
    Bytes(Bytes),
    Json(Value),
}

impl NewRecord {
    /// A record whose body is UTF-8 text (on a JSON stream: JSON text).
    pub fn text(body: impl Into<String>) -> NewRecord {
        NewRecord::with(NewBody::Text(body.into()))
    }

    /// A record whose body is any bytes (sent base64-encoded).
    pub fn bytes(body: impl Into<Bytes>) -> NewRecord {
        NewRecord::with(NewBody::Bytes(body.into()))
    }

    /// A record whose body is `value` as compact JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<NewRecord> {
        let v = serde_json::to_value(value)
            .map_err(|e| Error::InvalidArgument(format!("a record does not serialize: {e}")))?;
        Ok(NewRecord::with(NewBody::Json(v)))
    }

    fn with(body: NewBody) -> NewRecord {
        NewRecord {
            body,
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    /// Adds a header (names may repeat; order is kept).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> NewRecord {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The client's own timestamp (milliseconds since the Unix epoch), returned
    /// with the record as `client_timestamp`; reads by time use the server's.
    pub fn client_timestamp(mut self, ms: u64) -> NewRecord {
        self.timestamp_ms = Some(ms);
        self
    }

    fn to_json(&self) -> Value {
        let mut v = match &self.body {
            NewBody::Text(t) => json!({ "body": t }),
            NewBody::Bytes(b) => {
                json!({ "body_base64": base64::engine::general_purpose::STANDARD.encode(b) })
            }
            NewBody::Json(j) => json!({ "json": j }),
        };
        if !self.headers.is_empty() {
            v["headers"] = Value::Array(
                self.headers
                    .iter()
                    .map(|(k, val)| json!([k, val]))
                    .collect(),
            );
        }
        if let Some(ts) = self.timestamp_ms {
            v["timestamp"] = json!(ts);
        }
        v
    }
}

/// The answer to a records append.
#[derive(Clone, Debug, Deserialize)]
pub struct RecordsAck {
    /// The first record's sequence number (absent on a duplicate).
    pub first_seq: Option<u64>,
    /// The last record's sequence number (absent on a duplicate).
    pub last_seq: Option<u64>,
    /// The stream's next sequence number.
    pub next_seq: u64,
    /// The server timestamp of the first record (all records of an append share it).
    pub first_timestamp: Option<u64>,
    /// The server timestamp of the last record.
    pub last_timestamp: Option<u64>,
    /// The Durable Streams tail after the append.
    pub next_offset: Offset,
    /// The same producer stamp was accepted before: nothing was written.
    #[serde(default)]
    pub duplicate: bool,
}

/// A producer stamp for a records append (`Producer-Id`, `-Epoch`, `-Seq`): the
/// server writes a stamped batch at most once.
#[derive(Clone, Debug)]
pub struct ProducerStamp {
    /// The producer's stable id.
    pub id: String,
    /// Its epoch (grows with every restart of the producer).
    pub epoch: u64,
    /// The batch's sequence number: 0, 1, 2, ... within the epoch.
    pub seq: u64,
}

/// Where a records read starts.
#[derive(Clone, Debug)]
pub enum ReadFrom {
    /// The first retained record.
    Start,
    /// The record with this sequence number.
    Seq(u64),
    /// The first record whose server timestamp is at or after this (ms since the
    /// Unix epoch).
    Timestamp(u64),
    /// This many records before the tail (`Tail(1)`: the last record).
    Tail(u64),
    /// A Durable Streams offset.
    Offset(Offset),
}

impl ReadFrom {
    fn query(&self) -> Option<String> {
        match self {
            ReadFrom::Start => None,
            ReadFrom::Seq(n) => Some(format!("seq={n}")),
            ReadFrom::Timestamp(t) => Some(format!("timestamp={t}")),
            ReadFrom::Tail(n) => Some(format!("tail={n}")),
            ReadFrom::Offset(o) => Some(format!("offset={}", query_value(o.as_str()))),
        }
    }
}

/// Where a records read stops (the first bound reached; at least one record is
/// returned if any is there).
#[derive(Clone, Debug, Default)]
pub struct ReadBounds {
    /// At most this many records (server default and maximum 1,000).
    pub count: Option<u32>,
    /// At most about this many body bytes (server default 1 MiB, maximum 4 MiB).
    pub bytes: Option<u64>,
    /// Only records with a server timestamp before this (ms since the Unix epoch).
    pub until_ms: Option<u64>,
}

impl ReadBounds {
    /// At most `n` records.
    pub fn count(n: u32) -> ReadBounds {
        ReadBounds {
            count: Some(n),
            ..Default::default()
        }
    }

    /// Only records with a server timestamp before `ms`.
    pub fn until(mut self, ms: u64) -> ReadBounds {
        self.until_ms = Some(ms);
        self
    }

    fn push_query(&self, q: &mut Vec<String>) {
        if let Some(n) = self.count {
            q.push(format!("count={n}"));
        }
        if let Some(n) = self.bytes {
            q.push(format!("bytes={n}"));
        }
        if let Some(t) = self.until_ms {
            q.push(format!("until={t}"));
        }
    }
}

/// A record as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its sequence number: dense from 0 along the stream.
    pub seq: u64,
    /// The server's timestamp (ms since the Unix epoch); never decreases.
    pub timestamp: u64,
    /// The Durable Streams offset it starts at.
    pub offset: Offset,
    /// Its headers, in order (names may repeat).
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Bytes,
    /// The timestamp the client sent with it, if any.
    pub client_timestamp: Option<u64>,
}

impl Record {
    /// The first value of header `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text, if it is UTF-8.
    pub fn body_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Decode {
            request: format!("the body of record {}", self.seq),
            message: e.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct WireRecord {
    seq: u64,
    timestamp: u64,
    offset: Offset,
    #[serde(default)]
    headers: Vec<(String, String)>,
    body: Option<String>,
    body_base64: Option<String>,
    client_timestamp: Option<u64>,
}

impl WireRecord {
    fn into_record(self) -> std::result::Result<Record, String> {
        let body = match (self.body, self.body_base64) {
            (Some(text), None) => Bytes::from(text),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(Bytes::from)
                .map_err(|e| format!("record {}: body_base64: {e}", self.seq))?,
            (None, None) => Bytes::new(),
            (Some(_), Some(_)) => {
                return Err(format!("record {} has body and body_base64", self.seq))
            }
        };
        Ok(Record {
            seq: self.seq,
            timestamp: self.timestamp,
            offset: self.offset,
            headers: self.headers,
            body,
            client_timestamp: self.client_timestamp,
        })
    }
}

#[derive(Deserialize)]
struct WireBatch {
    records: Vec<WireRecord>,
    next_seq: u64,
    next_offset: Offset,
    tail_seq: u64,
    #[serde(default)]
    up_to_date: bool,
    #[serde(default)]
    closed: bool,
    #[serde(default)]
    until_reached: bool,
}

/// What one records read returned.
#[derive(Clone, Debug)]
pub struct RecordBatch {
    /// The records, in sequence order.
    pub records: Vec<Record>,
    /// Where to read on.
    pub next_seq: u64,
    /// The Durable Streams offset to read on from.
    pub next_offset: Offset,
    /// The stream's next sequence number at the time of the read.
    pub tail_seq: u64,
    /// The read reached the tail.
    pub up_to_date: bool,
    /// The stream is closed and the read reached its end.
    pub closed: bool,
    /// The `until` bound stopped the read.
    pub until_reached: bool,
}

/// A stream's record metadata.
#[derive(Clone, Debug, Deserialize)]
pub struct RecordsInfo {
    /// The stream's name.
    pub stream: String,
    /// Its content type.
    pub content_type: String,
    /// The first retained sequence number.
    pub first_seq: u64,
    /// The next sequence number (the next append's first).
    pub next_seq: u64,
    /// Records retained.
    pub records: u64,
    /// The Durable Streams offset of the first retained record.
    pub first_offset: Offset,
    /// The Durable Streams tail.
    pub next_offset: Offset,
    /// The first retained record's server timestamp (absent without records).
    pub first_timestamp: Option<u64>,
    /// The last record's server timestamp (absent without records).
    pub last_timestamp: Option<u64>,
    /// Whether the stream is closed.
    #[serde(default)]
    pub closed: bool,
}

/// The answer to a trim.
#[derive(Clone, Debug, Deserialize)]
pub struct TrimAck {
    /// The stream's name.
    pub stream: String,
    /// Where the retained data now starts (a Durable Streams offset).
    pub start: Offset,
    /// The first retained sequence number (trims by sequence number).
    pub first_seq: Option<u64>,
}

impl DurableStream {
    /// `/__picomq/streams/{name}/{action}`.
    fn native_path(&self, action: &str) -> String {
        format!("/__picomq/streams{}/{action}", self.path())
    }

    /// Appends `records` as one batch (at most [`APPEND_RECORDS_MAX`]); with
    /// `match_seq`, only if the stream's next sequence number is that (else
    /// [`Reason::SeqMismatch`](crate::Reason::SeqMismatch), `412`).
    pub async fn append_records(
        &self,
        records: &[NewRecord],
        match_seq: Option<u64>,
    ) -> Result<RecordsAck> {
        self.append_records_stamped(records, match_seq, None).await
    }

    /// [`append_records`](Self::append_records) with a producer stamp: a retry of
    /// an accepted stamp answers `duplicate: true` and writes nothing.
    pub async fn append_records_stamped(
        &self,
        records: &[NewRecord],
        match_seq: Option<u64>,
        stamp: Option<&ProducerStamp>,
    ) -> Result<RecordsAck> {
        if records.is_empty() || records.len() > APPEND_RECORDS_MAX {
            return Err(Error::InvalidArgument(format!(
                "an append takes 1 to {APPEND_RECORDS_MAX} records, not {}",
                records.len()
            )));
        }
        let mut body =
            json!({ "records": records.iter().map(NewRecord::to_json).collect::<Vec<_>>() });
        if let Some(seq) = match_seq {
            body["match_seq"] = json!(seq);
        }
        let path = self.native_path("records");
        let (epoch, seq) = stamp
            .map(|s| (s.epoch.to_string(), s.seq.to_string()))
            .unwrap_or_default();
        let mut headers = vec![("content-type", "application/json")];
        if let Some(s) = stamp {
            headers.extend([
                ("producer-id", s.id.as_str()),
                ("producer-epoch", epoch.as_str()),
                ("producer-seq", seq.as_str()),
            ]);
        }
        let r = self
            .mq
            .call(
                HttpMethod::POST,
                &path,
                &headers,
                Bytes::from(body.to_string()),
                Duration::ZERO,
            )
            .await?;
        parse_json(&describe(&HttpMethod::POST, &path), &r.body)
    }

    /// Reads records from `from`, within `bounds` (a catch-up read).
    pub async fn read_records(&self, from: &ReadFrom, bounds: &ReadBounds) -> Result<RecordBatch> {
        self.records_get(from, bounds, false).await
    }

    async fn records_get(
        &self,
        from: &ReadFrom,
        bounds: &ReadBounds,
        live: bool,
    ) -> Result<RecordBatch> {
        let mut q: Vec<String> = from.query().into_iter().collect();
        bounds.push_query(&mut q);
        if live {
            q.push("live=long-poll".into());
        }
        let mut path = self.native_path("records");
        if !q.is_empty() {
            path.push('?');
            path.push_str(&q.join("&"));
        }
        let wait = if live { LIVE_WAIT } else { Duration::ZERO };
        let r = self
            .mq
            .call(HttpMethod::GET, &path, &[], Bytes::new(), wait)
            .await?;
        let request = describe(&HttpMethod::GET, &path);
        let wire: WireBatch = parse_json(&request, &r.body)?;
        let records = wire
            .records
            .into_iter()
            .map(WireRecord::into_record)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|m| Error::decode(&request, m))?;
        Ok(RecordBatch {
            records,
            next_seq: wire.next_seq,
            next_offset: wire.next_offset,
            tail_seq: wire.tail_seq,
            up_to_date: wire.up_to_date,
            closed: wire.closed,
            until_reached: wire.until_reached,
        })
    }

    /// Follows the stream's records from `from`, live (`live=long-poll`), one
    /// [`Record`] at a time, resuming from the last `next_seq` across disconnects
    /// and server restarts. Ends when the stream is closed and read to its end, or
    /// when `bounds.until_ms` is reached.
    pub fn follow_records(
        &self,
        from: ReadFrom,
        bounds: ReadBounds,
        options: FollowOptions,
    ) -> RecordStream {
        let state = RecordsFollow {
            stream: self.clone(),
            from,
            bounds,
            retrier: Retrier::new(options.backoff, options.retry_for),
            buffered: VecDeque::new(),
            done: false,
        };
        let inner = futures::stream::unfold(state, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        });
        RecordStream {
            inner: Box::pin(inner),
        }
    }

    /// The stream's record metadata: first and next sequence numbers, count, times.
    pub async fn info(&self) -> Result<RecordsInfo> {
        let path = self.native_path("info");
        let r = self
            .mq
            .call(HttpMethod::GET, &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        parse_json(&describe(&HttpMethod::GET, &path), &r.body)
    }

    /// Drops the records below sequence number `seq`.
    pub async fn trim_before_seq(&self, seq: u64) -> Result<TrimAck> {
        self.trim(&format!("before_seq={seq}")).await
    }

    /// Drops the data before `offset` (a `Stream-Next-Offset` value).
    pub async fn trim_before(&self, offset: &Offset) -> Result<TrimAck> {
        self.trim(&format!("before={}", query_value(offset.as_str())))
            .await
    }

    async fn trim(&self, query: &str) -> Result<TrimAck> {
        let path = format!("{}?{query}", self.native_path("trim"));
        let r = self
            .mq
            .call(HttpMethod::POST, &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        parse_json(&describe(&HttpMethod::POST, &path), &r.body)
    }
}

/// An async stream of followed records, in sequence order.
pub struct RecordStream {
    inner: BoxStream<'static, Result<Record>>,
}

impl Stream for RecordStream {
    type Item = Result<Record>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

struct RecordsFollow {
    stream: DurableStream,
    from: ReadFrom,
    bounds: ReadBounds,
    retrier: Retrier,
    buffered: VecDeque<Record>,
    done: bool,
}

impl RecordsFollow {
    async fn next(&mut self) -> Option<Result<Record>> {
        loop {
            if let Some(r) = self.buffered.pop_front() {
                return Some(Ok(r));
            }
            if self.done {
                return None;
            }
            match self
                .stream
                .records_get(&self.from, &self.bounds, true)
                .await
            {
                Ok(batch) => {
                    self.retrier.succeeded();
                    if batch
                        .records
                        .last()
                        .is_some_and(|r| r.seq >= batch.next_seq)
                    {
                        self.done = true;
                        return Some(Err(Error::Decode {
                            request: format!("GET {}", self.stream.native_path("records")),
                            message: "next_seq is not past the records returned".into(),
                        }));
                    }
                    self.from = ReadFrom::Seq(batch.next_seq);
                    self.done = (batch.closed && batch.up_to_date) || batch.until_reached;
                    self.buffered.extend(batch.records);
                }
                Err(e) => {
                    if let Err(e) = self.retrier.failed(e).await {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}
