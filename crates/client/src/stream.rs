//! [`DurableStream`]: one stream through the Durable Streams protocol (create,
//! metadata, append, read, close, delete), so it works against any Durable Streams
//! server. Following is `follow`, the idempotent producer `producer`, PicoMQ's
//! record API `records`; this module owns reading an answer into a [`Chunk`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::OnceCell;

use crate::connection::{describe, ok, PicoMq};
use crate::error::{Error, Result};
use crate::offset::Offset;
use crate::path::{query_value, stream_path};
use crate::transport::{HttpMethod, Response};

/// The content type of JSON streams.
pub(crate) const JSON: &str = "application/json";

/// Whether `content_type` is JSON mode (`application/json`, any parameters).
pub(crate) fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(JSON))
}

/// One stream on the server. Cheap to clone. The content type, needed for appends,
/// is learned from [`create`](Self::create) or [`head`](Self::head) (asked once if
/// neither ran) or set with [`with_content_type`](Self::with_content_type).
#[derive(Clone)]
pub struct DurableStream {
    pub(crate) mq: PicoMq,
    name: Arc<str>,
    path: Arc<str>,
    content_type: Arc<OnceCell<String>>,
}

/// How to create a stream (`PUT`).
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    content_type: Option<String>,
    ttl: Option<Duration>,
    expires_at: Option<String>,
    closed: bool,
    body: Option<Bytes>,
}

impl CreateOptions {
    /// A JSON stream (`application/json`): appends are JSON messages.
    pub fn json() -> Self {
        Self::content_type(JSON)
    }

    /// A byte stream (`application/octet-stream`).
    pub fn bytes() -> Self {
        Self::content_type("application/octet-stream")
    }

    /// A stream of this content type (`text/plain`, ...).
    pub fn content_type(content_type: &str) -> Self {
        CreateOptions {
            content_type: Some(content_type.to_string()),
            ..Default::default()
        }
    }

    /// `Stream-TTL`: the stream expires after this long without reads or writes
    /// (whole seconds).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// `Stream-Expires-At`: the stream expires at this RFC 3339 time.
    pub fn expires_at(mut self, rfc3339: impl Into<String>) -> Self {
        self.expires_at = Some(rfc3339.into());
        self
    }

    /// `Stream-Closed: true`: created closed (with [`body`](Self::body) as its
    /// whole content).
    pub fn closed(mut self) -> Self {
        self.closed = true;
        self
    }

    /// The stream's first content.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }
}

/// The answer to a create.
#[derive(Clone, Debug)]
pub struct Created {
    /// `true` if this request created it (`201`), `false` if it existed with the
    /// same configuration (`200`).
    pub created: bool,
    /// The tail after any initial content.
    pub next_offset: Option<Offset>,
    /// The stream's content type.
    pub content_type: Option<String>,
    /// Whether the stream is closed.
    pub closed: bool,
}

/// A stream's metadata (`HEAD`).
#[derive(Clone, Debug)]
pub struct StreamMeta {
    /// The content type.
    pub content_type: Option<String>,
    /// The tail: where the next append will start.
    pub next_offset: Offset,
    /// Whether the stream is closed (no more appends).
    pub closed: bool,
    /// The sliding time-to-live, if set.
    pub ttl: Option<Duration>,
    /// The absolute expiry (RFC 3339), if set.
    pub expires_at: Option<String>,
    /// Where retained data starts (PicoMQ: after trims; absent on other servers).
    pub start_offset: Option<Offset>,
}

/// The answer to an append or a close.
#[derive(Clone, Debug)]
pub struct AppendAck {
    /// The tail after the append.
    pub next_offset: Option<Offset>,
    /// Whether the stream is now closed.
    pub closed: bool,
    /// An idempotent producer's batch that the server already had (`204` to a
    /// stamped append): nothing was written twice.
    pub duplicate: bool,
}

/// What one read returned: the data from the offset asked for up to
/// [`next_offset`](Self::next_offset), where the next read continues.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The bytes read (on a JSON stream, a JSON array of messages; empty if none).
    pub data: Bytes,
    /// Where to read on; resuming from here never repeats or skips anything.
    pub next_offset: Offset,
    /// The read reached the tail (more may still be appended).
    pub up_to_date: bool,
    /// The stream is closed and the read reached its end: nothing will follow.
    pub closed: bool,
    /// The data is JSON messages (the stream is `application/json`).
    pub json: bool,
    /// `Stream-Cursor`, echoed on the next long-poll.
    pub cursor: Option<String>,
}

impl Chunk {
    /// The messages of a JSON stream's chunk, each as a `T` (use
    /// `serde_json::Value` for any JSON).
    pub fn messages<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        if self.data.is_empty() {
            return Ok(Vec::new());
        }
        serde_json::from_slice(&self.data).map_err(|e| Error::Decode {
            request: format!("messages of the chunk ending at {}", self.next_offset),
            message: e.to_string(),
        })
    }

    /// Whether no data came.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty() || (self.json && self.data.as_ref() == b"[]")
    }

    /// Reads a read answer (`200` with data, or a long-poll's `204`).
    pub(crate) fn from_response(request: &str, r: Response) -> Result<Chunk> {
        let next_offset = r
            .header("stream-next-offset")
            .map(Offset::from)
            .ok_or_else(|| Error::decode(request, "no Stream-Next-Offset header"))?;
        let json = r.header("content-type").is_some_and(is_json);
        Ok(Chunk {
            up_to_date: r.header("stream-up-to-date") == Some("true"),
            closed: r.header("stream-closed") == Some("true"),
            cursor: r.header("stream-cursor").map(str::to_string),
            json,
            next_offset,
            data: if r.status.as_u16() == 204 {
                Bytes::new()
            } else {
                r.body
            },
        })
    }
}

/// Options of one append.
#[derive(Clone, Debug, Default)]
pub struct AppendOptions {
    /// `Stream-Seq`: a writer sequence the server requires to grow (bytewise).
    pub stream_seq: Option<String>,
    /// Close the stream with this append.
    pub close: bool,
}

impl DurableStream {
    pub(crate) fn new(mq: PicoMq, name: &str) -> DurableStream {
        DurableStream {
            mq,
            name: name.trim_start_matches('/').into(),
            path: stream_path(name).into(),
            content_type: Arc::new(OnceCell::new()),
        }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stream's URL path (`/` and the name, percent-encoded where needed).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Sets the content type appends are sent with, instead of asking the server.
    pub fn with_content_type(self, content_type: &str) -> Self {
        let cell = OnceCell::new();
        cell.set(content_type.to_string())
            .expect("a fresh cell is empty");
        DurableStream {
            content_type: Arc::new(cell),
            ..self
        }
    }

    /// The stream's content type: known from `create`/`head`, or asked now.
    pub async fn content_type(&self) -> Result<String> {
        let ct = self
            .content_type
            .get_or_try_init(|| async {
                let meta = self.head().await?;
                Ok::<_, Error>(
                    meta.content_type
                        .unwrap_or_else(|| "application/octet-stream".into()),
                )
            })
            .await?;
        Ok(ct.clone())
    }

    fn learn_content_type(&self, content_type: Option<&str>) {
        if let Some(ct) = content_type {
            let _ = self.content_type.set(ct.to_string());
        }
    }

    /// Creates the stream (`PUT`); answers `created: false` if it exists with the
    /// same configuration, and a `409` error if it exists otherwise.
    pub async fn create(&self, options: CreateOptions) -> Result<Created> {
        let ttl = options.ttl.map(|t| t.as_secs().to_string());
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(ct) = &options.content_type {
            headers.push(("content-type", ct));
        }
        if let Some(ttl) = &ttl {
            headers.push(("stream-ttl", ttl));
        }
        if let Some(at) = &options.expires_at {
            headers.push(("stream-expires-at", at));
        }
        if options.closed {
            headers.push(("stream-closed", "true"));
        }
        let body = options.body.unwrap_or_default();
        let r = self
            .mq
            .call(HttpMethod::PUT, &self.path, &headers, body, Duration::ZERO)
            .await?;
        let content_type = r
            .header("content-type")
            .map(str::to_string)
            .or(options.content_type);
        self.learn_content_type(content_type.as_deref());
        Ok(Created {
            created: r.status.as_u16() == 201,
            next_offset: r.header("stream-next-offset").map(Offset::from),
            content_type,
            closed: r.header("stream-closed") == Some("true"),
        })
    }

    /// The stream's metadata (`HEAD`): tail, content type, closed.
    pub async fn head(&self) -> Result<StreamMeta> {
        let r = self
            .mq
            .call(
                HttpMethod::HEAD,
                &self.path,
                &[],
                Bytes::new(),
                Duration::ZERO,
            )
            .await?;
        let request = describe(&HttpMethod::HEAD, &self.path);
        let next_offset = r
            .header("stream-next-offset")
            .map(Offset::from)
            .ok_or_else(|| Error::decode(&request, "no Stream-Next-Offset header"))?;
        let content_type = r.header("content-type").map(str::to_string);
        self.learn_content_type(content_type.as_deref());
        Ok(StreamMeta {
            content_type,
            next_offset,
            closed: r.header("stream-closed") == Some("true"),
            ttl: r
                .header("stream-ttl")
                .and_then(|t| t.parse().ok())
                .map(Duration::from_secs),
            expires_at: r.header("stream-expires-at").map(str::to_string),
            start_offset: r.header("stream-start-offset").map(Offset::from),
        })
    }

    /// Appends `body` as it is: bytes on a byte stream; on a JSON stream a JSON
    /// value (a top-level array is one message per element).
    pub async fn append(&self, body: impl Into<Bytes>) -> Result<AppendAck> {
        self.append_with(body, AppendOptions::default()).await
    }

    /// Appends one JSON message (an array too is one message).
    pub async fn append_json<T: Serialize + ?Sized>(&self, message: &T) -> Result<AppendAck> {
        let body = json_body(std::slice::from_ref(&message))?;
        self.post(body, Some(JSON), &AppendOptions::default(), &[])
            .await
    }

    /// Appends each of `messages` as one JSON message, in one request.
    pub async fn append_json_batch<T: Serialize>(&self, messages: &[T]) -> Result<AppendAck> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument(
                "an append needs at least one message".into(),
            ));
        }
        let body = json_body(messages)?;
        self.post(body, Some(JSON), &AppendOptions::default(), &[])
            .await
    }

    /// Appends `body` with a `Stream-Seq` or closing the stream.
    pub async fn append_with(
        &self,
        body: impl Into<Bytes>,
        options: AppendOptions,
    ) -> Result<AppendAck> {
        let ct = self.content_type().await?;
        self.post(body.into(), Some(&ct), &options, &[]).await
    }

    /// Closes the stream: no more appends; readers at its end see `closed`.
    pub async fn close(&self) -> Result<AppendAck> {
        let options = AppendOptions {
            close: true,
            ..Default::default()
        };
        self.post(Bytes::new(), None, &options, &[]).await
    }

    /// `POST` with the given content type, options and extra headers.
    pub(crate) async fn post(
        &self,
        body: Bytes,
        content_type: Option<&str>,
        options: &AppendOptions,
        extra: &[(&str, &str)],
    ) -> Result<AppendAck> {
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(4 + extra.len());
        if let Some(ct) = content_type {
            headers.push(("content-type", ct));
        }
        if let Some(seq) = &options.stream_seq {
            headers.push(("stream-seq", seq));
        }
        if options.close {
            headers.push(("stream-closed", "true"));
        }
        headers.extend_from_slice(extra);
        let r = self
            .mq
            .call(HttpMethod::POST, &self.path, &headers, body, Duration::ZERO)
            .await?;
        Ok(AppendAck {
            next_offset: r.header("stream-next-offset").map(Offset::from),
            closed: r.header("stream-closed") == Some("true"),
            duplicate: !extra.is_empty() && r.status.as_u16() == 204,
        })
    }

    /// Deletes the stream and its data.
    pub async fn delete(&self) -> Result<()> {
        self.mq
            .call(
                HttpMethod::DELETE,
                &self.path,
                &[],
                Bytes::new(),
                Duration::ZERO,
            )
            .await?;
        Ok(())
    }

    /// A catch-up read from `offset`: what the stream holds from there, up to the
    /// server's chunk size.
    pub async fn read(&self, offset: &Offset) -> Result<Chunk> {
        self.get(
            &format!("offset={}", query_value(offset.as_str())),
            Duration::ZERO,
        )
        .await
    }

    /// A catch-up read from the first append whose server timestamp is at or after
    /// `timestamp_ms` (milliseconds since the Unix epoch). PicoMQ only.
    pub async fn read_from_time(&self, timestamp_ms: u64) -> Result<Chunk> {
        self.get(&format!("timestamp={timestamp_ms}"), Duration::ZERO)
            .await
    }

    /// Reads the whole stream from its start to the tail (catch-up reads): every
    /// chunk's data, and the offset after them.
    pub async fn read_to_end(&self) -> Result<(Vec<Chunk>, Offset)> {
        let mut offset = Offset::start();
        let mut chunks = Vec::new();
        loop {
            let chunk = self.read(&offset).await?;
            let done = chunk.up_to_date || chunk.closed;
            if chunk.next_offset == offset && !done {
                return Err(Error::decode(
                    &format!("GET {}?offset={offset}", self.path),
                    "a read made no progress",
                ));
            }
            offset = chunk.next_offset.clone();
            if !chunk.is_empty() {
                chunks.push(chunk);
            }
            if done {
                return Ok((chunks, offset));
            }
        }
    }

    /// `GET path?query`, read into a chunk; `wait` as in [`PicoMq::send`].
    pub(crate) async fn get(&self, query: &str, wait: Duration) -> Result<Chunk> {
        let path = format!("{}?{query}", self.path);
        let r = self
            .mq
            .send(HttpMethod::GET, &path, &[], Bytes::new(), wait)
            .await?;
        let r = ok(&HttpMethod::GET, &path, r)?;
        Chunk::from_response(&describe(&HttpMethod::GET, &path), r)
    }
}

/// `[m1,m2,...]`: messages as one JSON append (the server flattens one level, so
/// each is one message, arrays included).
pub(crate) fn json_body<T: Serialize>(messages: &[T]) -> Result<Bytes> {
    serde_json::to_vec(messages)
        .map(Bytes::from)
        .map_err(|e| Error::InvalidArgument(format!("a message does not serialize: {e}")))
}
