//! Durable Streams subscriptions (PROTOCOL.md sections 6 and 7) under the reserved
//! `{stream-root}/__ds/subscriptions/{id}`: create (webhook or pull-wake), read,
//! delete, link and unlink streams, and the pull-wake cycle: claim a wake, read the
//! streams it names, ack (a heartbeat without `done`), release. Works against any
//! Durable Streams server with subscriptions.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connection::{ok, parse_json, PicoMq};
use crate::error::Result;
use crate::offset::Offset;
use crate::path::query_value;
use crate::transport::HttpMethod;

/// One subscription, by id. Nothing is sent until a method is called.
#[derive(Clone)]
pub struct Subscription {
    mq: PicoMq,
    id: String,
    path: String,
}

/// How a subscription delivers wakes.
#[derive(Clone, Debug)]
pub enum Delivery {
    /// Signed `POST`s to this URL.
    Webhook {
        /// The receiver's URL (`https://`, or `http://localhost` in development).
        url: String,
    },
    /// Wake events appended to this stream (root-relative path; the application
    /// creates it); workers claim them.
    PullWake {
        /// The wake stream's path.
        wake_stream: String,
    },
}

/// What a subscription is: its delivery and the streams it links.
#[derive(Clone, Debug)]
pub struct SubscriptionConfig {
    delivery: Delivery,
    pattern: Option<String>,
    streams: Vec<String>,
    lease: Option<Duration>,
    description: Option<String>,
}

impl SubscriptionConfig {
    /// A pull-wake subscription waking workers through `wake_stream`.
    pub fn pull_wake(wake_stream: &str) -> Self {
        SubscriptionConfig::with(Delivery::PullWake {
            wake_stream: wake_stream.to_string(),
        })
    }

    /// A webhook subscription posting to `url`.
    pub fn webhook(url: &str) -> Self {
        SubscriptionConfig::with(Delivery::Webhook {
            url: url.to_string(),
        })
    }

    fn with(delivery: Delivery) -> Self {
        SubscriptionConfig {
            delivery,
            pattern: None,
            streams: Vec::new(),
            lease: None,
            description: None,
        }
    }

    /// Links every stream matching `glob` (`*` one segment, `**` any number).
    pub fn pattern(mut self, glob: &str) -> Self {
        self.pattern = Some(glob.to_string());
        self
    }

    /// Links `path` explicitly (root-relative).
    pub fn stream(mut self, path: &str) -> Self {
        self.streams.push(path.to_string());
        self
    }

    /// The lease of a wake (1 s to 10 min; server default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// A human-readable description.
    pub fn description(mut self, text: &str) -> Self {
        self.description = Some(text.to_string());
        self
    }

    fn to_json(&self) -> Value {
        let mut v = match &self.delivery {
            Delivery::Webhook { url } => json!({ "type": "webhook", "webhook": { "url": url } }),
            Delivery::PullWake { wake_stream } => {
                json!({ "type": "pull-wake", "wake_stream": wake_stream })
            }
        };
        if let Some(p) = &self.pattern {
            v["pattern"] = json!(p);
        }
        if !self.streams.is_empty() {
            v["streams"] = json!(self.streams);
        }
        if let Some(l) = self.lease {
            v["lease_ttl_ms"] = json!(l.as_millis() as u64);
        }
        if let Some(d) = &self.description {
            v["description"] = json!(d);
        }
        v
    }
}

/// A subscription as the server describes it.
#[derive(Clone, Debug, Deserialize)]
pub struct SubscriptionInfo {
    /// Its id.
    pub id: String,
    /// `webhook` or `pull-wake`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its glob, if any.
    pub pattern: Option<String>,
    /// Its linked streams.
    #[serde(default)]
    pub streams: Vec<LinkedStream>,
    /// The wake stream (pull-wake).
    pub wake_stream: Option<String>,
    /// The wake lease, in milliseconds.
    pub lease_ttl_ms: Option<u64>,
    /// The current wake generation.
    pub generation: Option<u64>,
    /// Everything the server said, for fields not typed here.
    #[serde(skip)]
    pub raw: Value,
}

/// A stream linked to a subscription.
#[derive(Clone, Debug, Deserialize)]
pub struct LinkedStream {
    /// Its root-relative path.
    pub path: String,
    /// `explicit` or `glob`.
    pub link_type: String,
    /// The last offset processed (inclusive).
    pub acked_offset: Offset,
    /// The stream's tail when the wake was issued (claims only).
    pub tail_offset: Option<Offset>,
    /// Whether there is data past `acked_offset` (claims only).
    pub has_pending: Option<bool>,
}

/// A claimed pull-wake: the streams with pending work and the token that acks.
#[derive(Clone, Debug, Deserialize)]
pub struct Wake {
    /// The wake's id.
    pub wake_id: String,
    /// Its generation (fencing).
    pub generation: u64,
    /// The bearer token of its acks and release.
    pub token: String,
    /// The linked streams, with their acked and tail offsets.
    pub streams: Vec<LinkedStream>,
    /// The lease; ack (without `done`) within it to keep the claim.
    pub lease_ttl_ms: u64,
}

/// The answer to an ack.
#[derive(Clone, Debug, Deserialize)]
pub struct WakeAck {
    /// With `done`: the subscription has more pending work (another wake follows).
    #[serde(default)]
    pub next_wake: bool,
}

impl Subscription {
    pub(crate) fn new(mq: PicoMq, root: &str, id: &str) -> Subscription {
        let root = root.trim_matches('/');
        let prefix = if root.is_empty() {
            String::new()
        } else {
            format!("/{root}")
        };
        Subscription {
            mq,
            id: id.to_string(),
            path: format!("{prefix}/__ds/subscriptions/{}", query_value(id)),
        }
    }

    /// The subscription's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    async fn describe(&self, method: HttpMethod, body: Bytes) -> Result<SubscriptionInfo> {
        let headers = [("content-type", "application/json")];
        let r = self
            .mq
            .call(method.clone(), &self.path, &headers, body, Duration::ZERO)
            .await?;
        let request = format!("{method} {}", self.path);
        let raw: Value = parse_json(&request, &r.body)?;
        let mut info: SubscriptionInfo = serde_json::from_value(raw.clone())
            .map_err(|e| crate::Error::decode(&request, e.to_string()))?;
        info.raw = raw;
        Ok(info)
    }

    /// Creates the subscription, or re-confirms it with the same configuration
    /// (`409` if it exists with another).
    pub async fn create(&self, config: &SubscriptionConfig) -> Result<SubscriptionInfo> {
        let body = Bytes::from(config.to_json().to_string());
        self.describe(HttpMethod::PUT, body).await
    }

    /// The subscription's configuration, links and state.
    pub async fn get(&self) -> Result<SubscriptionInfo> {
        self.describe(HttpMethod::GET, Bytes::new()).await
    }

    /// Deletes the subscription.
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

    /// Links `streams` (root-relative paths) explicitly, at their tails.
    pub async fn add_streams(&self, streams: &[&str]) -> Result<()> {
        let path = format!("{}/streams", self.path);
        let body = Bytes::from(json!({ "streams": streams }).to_string());
        let headers = [("content-type", "application/json")];
        self.mq
            .call(HttpMethod::POST, &path, &headers, body, Duration::ZERO)
            .await?;
        Ok(())
    }

    /// Removes the explicit link of `stream` (a glob link stays while it matches).
    pub async fn remove_stream(&self, stream: &str) -> Result<()> {
        let path = format!("{}/streams/{}", self.path, query_value(stream));
        self.mq
            .call(HttpMethod::DELETE, &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        Ok(())
    }

    /// Claims the pending wake of a pull-wake subscription for `worker`. Refusals
    /// carry the server's code: `NO_PENDING_WORK`, `ALREADY_CLAIMED` (409).
    pub async fn claim(&self, worker: &str) -> Result<Wake> {
        let path = format!("{}/claim", self.path);
        self.mq
            .call_json(
                HttpMethod::POST,
                &path,
                &json!({ "worker": worker }),
                Duration::ZERO,
            )
            .await
    }

    /// Acks `acks` (stream path, last processed offset, inclusive) for `wake`;
    /// with `done` the wake ends, without it the lease is extended (a heartbeat).
    /// A stale wake is refused with `FENCED` (409).
    pub async fn ack(&self, wake: &Wake, acks: &[(&str, &Offset)], done: bool) -> Result<WakeAck> {
        let acks: Vec<Value> = acks
            .iter()
            .map(|(s, o)| json!({ "stream": s, "offset": o.as_str() }))
            .collect();
        let body = json!({
            "wake_id": wake.wake_id,
            "generation": wake.generation,
            "acks": acks,
            "done": done,
        });
        let r = self.wake_call("ack", wake, &body).await?;
        parse_json(&format!("POST {}/ack", self.path), &r.body)
    }

    /// Gives the wake back without acking (another worker may claim it).
    pub async fn release(&self, wake: &Wake) -> Result<()> {
        let body = json!({ "wake_id": wake.wake_id, "generation": wake.generation });
        self.wake_call("release", wake, &body).await?;
        Ok(())
    }

    async fn wake_call(
        &self,
        action: &str,
        wake: &Wake,
        body: &Value,
    ) -> Result<crate::transport::Response> {
        let path = format!("{}/{action}", self.path);
        let headers = [("content-type", "application/json")];
        let r = self
            .mq
            .send_with(
                HttpMethod::POST,
                &path,
                &headers,
                Bytes::from(body.to_string()),
                Duration::ZERO,
                Some(&wake.token),
            )
            .await?;
        ok(&HttpMethod::POST, &path, r)
    }
}
