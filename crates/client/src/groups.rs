//! PicoMQ consumer groups (`/__picomq/groups/{group}`, docs/consumers.md):
//! competing consumers of one stream. A claim hands messages out under a lease;
//! each is acked (never delivered again), nacked (delivered again after a delay) or,
//! after too many deliveries, moved to a dead-letter stream. PicoMQ only.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::Stream;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connection::PicoMq;
use crate::error::{Error, Result};
use crate::follow::{FollowOptions, Retrier};
use crate::offset::Offset;
use crate::path::stream_path;
use crate::transport::HttpMethod;

/// The longest a claim may wait for messages (the server's limit).
pub const CLAIM_WAIT_MAX: Duration = Duration::from_secs(60);
/// The most messages one claim hands out (the server's limit).
pub const CLAIM_MAX: usize = 1_000;

/// A consumer group, by name. Nothing is sent until a method is called.
#[derive(Clone)]
pub struct ConsumerGroup {
    mq: PicoMq,
    name: String,
    path: String,
}

/// How to create a group.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    stream: String,
    max_deliveries: Option<u32>,
    dead_letter: Option<String>,
    lease: Option<Duration>,
    from: Option<Offset>,
}

impl GroupOptions {
    /// A group on `stream` (server defaults: 5 deliveries, 30 s leases, from the
    /// start).
    pub fn new(stream: &str) -> GroupOptions {
        GroupOptions {
            stream: stream.to_string(),
            max_deliveries: None,
            dead_letter: None,
            lease: None,
            from: None,
        }
    }

    /// Deliveries before a message is dead-lettered (0: never).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n);
        self
    }

    /// The stream dead-lettered messages go to (created as JSON if absent).
    pub fn dead_letter(mut self, stream: &str) -> Self {
        self.dead_letter = Some(stream.to_string());
        self
    }

    /// How long a claimed message stays with its consumer before it is handed
    /// back (100 ms to 12 h).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Where the group starts: [`Offset::start`], [`Offset::now`] or an offset.
    pub fn from(mut self, offset: Offset) -> Self {
        self.from = Some(offset);
        self
    }
}

/// A group's configuration and counts.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupInfo {
    /// The group's name.
    pub group: String,
    /// The stream it consumes.
    pub stream: String,
    /// Deliveries before a message is dead-lettered (0: never).
    pub max_deliveries: u32,
    /// The dead-letter stream, if any.
    pub dead_letter: Option<String>,
    /// The lease, in milliseconds.
    pub lease_ms: u64,
    /// When it was created (RFC 3339).
    #[serde(default)]
    pub created_at: String,
    /// The offset past the last message handed out.
    pub cursor: Offset,
    /// Bytes of the stream past the cursor.
    pub lag_bytes: Option<u64>,
    /// Messages handed back, waiting to be delivered again.
    pub pending: u64,
    /// Messages out under a lease.
    pub in_flight: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Deliveries after the first.
    pub redeliveries: u64,
    /// Messages moved to the dead-letter stream.
    pub dead_lettered: u64,
}

/// A message handed out by a claim.
#[derive(Clone, Debug)]
pub struct GroupMessage {
    /// Its id (its Durable Streams offset): what ack and nack take.
    pub id: Offset,
    /// The offset after it.
    pub next_offset: Offset,
    /// How often it has been handed out, this time included.
    pub deliveries: u32,
    /// Its body (on a JSON stream, the message as it was appended).
    pub body: Bytes,
    /// On a JSON stream, the message (`None` if it nests deeper than a `Value`
    /// goes, 128 levels: `body` holds it whole either way).
    pub json: Option<Value>,
}

/// What a claim handed out.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The messages (empty if none came within the wait).
    pub messages: Vec<GroupMessage>,
    /// When their lease ends (RFC 3339).
    pub lease_until: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage {
    id: Offset,
    next_offset: Offset,
    deliveries: u32,
    /// Raw: the server writes it as appended, at any depth.
    body: Option<Box<serde_json::value::RawValue>>,
    body_base64: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireClaim {
    messages: Vec<WireMessage>,
    #[serde(default)]
    lease_until: String,
}

impl WireMessage {
    fn into_message(self) -> std::result::Result<GroupMessage, String> {
        let (body, json) = match (self.body, self.body_base64) {
            (_, Some(b64)) => (
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| format!("message {}: bodyBase64: {e}", self.id))?
                    .into(),
                None,
            ),
            (Some(raw), None) => {
                let json = serde_json::from_str(raw.get()).ok();
                (Bytes::from(String::from(Box::<str>::from(raw))), json)
            }
            (None, None) => (Bytes::new(), None),
        };
        Ok(GroupMessage {
            id: self.id,
            next_offset: self.next_offset,
            deliveries: self.deliveries,
            body,
            json,
        })
    }
}

fn ids_json(ids: &[Offset]) -> Vec<&str> {
    ids.iter().map(Offset::as_str).collect()
}

impl ConsumerGroup {
    pub(crate) fn new(mq: PicoMq, name: &str) -> ConsumerGroup {
        ConsumerGroup {
            mq,
            name: name.to_string(),
            path: format!("/__picomq/groups/{name}"),
        }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the group (or confirms it exists on the same stream; `409` if it
    /// exists on another).
    pub async fn create(&self, options: &GroupOptions) -> Result<GroupInfo> {
        let mut body = json!({ "stream": stream_path(&options.stream) });
        if let Some(n) = options.max_deliveries {
            body["maxDeliveries"] = json!(n);
        }
        if let Some(d) = &options.dead_letter {
            body["deadLetter"] = json!(stream_path(d));
        }
        if let Some(l) = options.lease {
            body["leaseMs"] = json!(l.as_millis() as u64);
        }
        if let Some(f) = &options.from {
            body["from"] = json!(f.as_str());
        }
        self.mq
            .call_json(HttpMethod::PUT, &self.path, &body, Duration::ZERO)
            .await
    }

    /// The group's configuration and counts.
    pub async fn info(&self) -> Result<GroupInfo> {
        let r = self
            .mq
            .call(
                HttpMethod::GET,
                &self.path,
                &[],
                Bytes::new(),
                Duration::ZERO,
            )
            .await?;
        crate::connection::parse_json(&format!("GET {}", self.path), &r.body)
    }

    /// Deletes the group (not its stream).
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

    /// Claims up to `max` messages for `consumer`, waiting up to `wait` (at most
    /// [`CLAIM_WAIT_MAX`]) for the first to arrive.
    pub async fn claim(&self, consumer: &str, max: usize, wait: Duration) -> Result<Claimed> {
        let wait = wait.min(CLAIM_WAIT_MAX);
        let body = json!({
            "consumer": consumer,
            "max": max.clamp(1, CLAIM_MAX),
            "waitMs": wait.as_millis() as u64,
        });
        let path = format!("{}/claim", self.path);
        let wire: WireClaim = self
            .mq
            .call_json(HttpMethod::POST, &path, &body, wait)
            .await?;
        let messages = wire
            .messages
            .into_iter()
            .map(WireMessage::into_message)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|m| Error::decode(&format!("POST {path}"), m))?;
        Ok(Claimed {
            messages,
            lease_until: wire.lease_until,
        })
    }

    /// Acknowledges messages by id: they are never delivered again. Idempotent;
    /// answers how many were out and are now acked.
    pub async fn ack(&self, ids: &[Offset]) -> Result<u64> {
        let path = format!("{}/ack", self.path);
        let v: Value = self
            .mq
            .call_json(
                HttpMethod::POST,
                &path,
                &json!({ "ids": ids_json(ids) }),
                Duration::ZERO,
            )
            .await?;
        Ok(v["acked"].as_u64().unwrap_or(0))
    }

    /// Hands messages back, to be delivered again no sooner than `delay` from now.
    pub async fn nack(&self, ids: &[Offset], delay: Duration) -> Result<u64> {
        let path = format!("{}/nack", self.path);
        let body = json!({ "ids": ids_json(ids), "delayMs": delay.as_millis() as u64 });
        let v: Value = self
            .mq
            .call_json(HttpMethod::POST, &path, &body, Duration::ZERO)
            .await?;
        Ok(v["nacked"].as_u64().unwrap_or(0))
    }

    /// The group's messages for `consumer`, claimed `batch` at a time with waits
    /// of `wait` (long-poll), riding out restarts like a follow. Acking is the
    /// caller's: a message not acked within its lease is delivered again.
    pub fn messages(
        &self,
        consumer: &str,
        batch: usize,
        wait: Duration,
        options: FollowOptions,
    ) -> GroupMessages {
        let state = Claiming {
            group: self.clone(),
            consumer: consumer.to_string(),
            batch,
            wait,
            retrier: Retrier::new(options.backoff, options.retry_for),
            buffered: VecDeque::new(),
            failed: false,
        };
        let inner = futures::stream::unfold(state, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        });
        GroupMessages {
            inner: Box::pin(inner),
        }
    }
}

/// An endless async stream of claimed messages (see [`ConsumerGroup::messages`]).
pub struct GroupMessages {
    inner: BoxStream<'static, Result<GroupMessage>>,
}

impl Stream for GroupMessages {
    type Item = Result<GroupMessage>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

struct Claiming {
    group: ConsumerGroup,
    consumer: String,
    batch: usize,
    wait: Duration,
    retrier: Retrier,
    buffered: VecDeque<GroupMessage>,
    failed: bool,
}

impl Claiming {
    async fn next(&mut self) -> Option<Result<GroupMessage>> {
        loop {
            if let Some(m) = self.buffered.pop_front() {
                return Some(Ok(m));
            }
            if self.failed {
                return None;
            }
            match self
                .group
                .claim(&self.consumer, self.batch, self.wait)
                .await
            {
                Ok(claimed) => {
                    self.retrier.succeeded();
                    self.buffered.extend(claimed.messages);
                }
                Err(e) => {
                    if let Err(e) = self.retrier.failed(e).await {
                        self.failed = true;
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}
