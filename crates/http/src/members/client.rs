//! The client side of the members' calls to each other: the engine's `Peers`
//! (fork pins, cascades, nudges, exact tails, appends at a stream's owner) over
//! HTTP with the cluster key, and the wire forms both sides share.

use async_trait::async_trait;
use bytes::Bytes;
use picomq_client::Client;
use picomq_engine::cluster::{ForkPin, Peers, PinnedFork, StreamAdmin, StreamAdminAnswer};
use picomq_engine::{EngineError, Offset, Result as EngineResult};
use serde::Deserialize;

use super::CLUSTER_KEY;

pub const PIN_PATH: &str = "/__picomq/cluster/fork-pin";
pub const UNPIN_PATH: &str = "/__picomq/cluster/fork-unpin";
pub const CASCADE_PATH: &str = "/__picomq/cluster/cascade";
pub const NUDGE_PATH: &str = "/__picomq/cluster/nudge";
pub const APPEND_PATH: &str = "/__picomq/cluster/append";
pub const TAILS_PATH: &str = "/__picomq/cluster/tails";
pub const ADMIN_PATH: &str = "/__picomq/cluster/admin";

/// The durable tails of streams a member serves, asked by another (the index in
/// the metadata store may lag them).
#[derive(Deserialize, serde::Serialize)]
pub struct Tails {
    pub streams: Vec<String>,
}

/// How long a call to another member may take: a member that is paused or cut off
/// answers 503 here within this, rather than holding the caller's request (and what
/// it waits on) for as long as the connection lasts.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// At most this many streams per tails call.
pub const TAILS_MAX: usize = 1_000;

/// An append one member makes on a stream another serves (a subscription's wake
/// event on its wake stream).
#[derive(Deserialize, serde::Serialize)]
pub struct Append {
    pub stream: String,
    pub body: String,
}

#[derive(Deserialize, serde::Serialize)]
pub struct Unpin {
    pub source_id: u64,
    pub pin: u64,
}

#[derive(Deserialize, serde::Serialize)]
pub struct Cascade {
    pub source_id: u64,
}

/// The client side: calls another member with the cluster key.
pub struct PeerClient {
    key: String,
    /// One client (and its connections) per member URL.
    clients: std::sync::Mutex<std::collections::HashMap<String, Client>>,
}

impl PeerClient {
    pub fn new(key: String) -> PeerClient {
        PeerClient {
            key,
            clients: Default::default(),
        }
    }

    fn client(&self, base: &str) -> Client {
        let mut clients = self.clients.lock().expect("peer clients");
        if clients.len() > 1024 {
            clients.clear();
        }
        clients
            .entry(base.to_string())
            .or_insert_with(|| Client::new(base))
            .clone()
    }

    async fn call(&self, base: &str, path: &str, body: String) -> EngineResult<Bytes> {
        let resp = self.call_raw(base, path, body).await?;
        if resp.status.is_success() {
            return Ok(resp.body);
        }
        Err(error_from(&resp))
    }

    async fn call_raw(
        &self,
        base: &str,
        path: &str,
        body: String,
    ) -> EngineResult<picomq_client::Response> {
        let client = self.client(base);
        let headers = [
            (CLUSTER_KEY, self.key.as_str()),
            ("content-type", "application/json"),
        ];
        let sent = client.send(
            picomq_client::HttpMethod::POST,
            path,
            &headers,
            Bytes::from(body),
        );
        let resp = tokio::time::timeout(CALL_TIMEOUT, sent)
            .await
            .map_err(|_| {
                EngineError::Unavailable(format!(
                    "cluster member {base}: no answer within {CALL_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| EngineError::Unavailable(format!("cluster member {base}: {e}")))?;
        Ok(resp)
    }
}

/// The engine error a member's error answer stands for (statuses the engine's
/// errors map to; see `error.rs`).
fn error_from(resp: &picomq_client::Response) -> EngineError {
    let message = resp.error_message();
    let code = serde_json::from_slice::<serde_json::Value>(&resp.body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default();
    match (resp.status.as_u16(), code.as_str()) {
        (404, "fork_source_not_found") | (404, "not_found") => EngineError::ForkSourceNotFound,
        (410, "offset_trimmed") => {
            let start = resp
                .header("stream-start-offset")
                .and_then(|s| Offset::parse(s).ok())
                .unwrap_or(Offset::ZERO);
            EngineError::Trimmed { start }
        }
        (410, _) => EngineError::Gone,
        (409, _) => EngineError::Conflict(message),
        (400, _) => EngineError::BadRequest(message),
        (503, "not_owner") => EngineError::NotOwner,
        _ => EngineError::Unavailable(format!(
            "cluster member answered {}: {message}",
            resp.status
        )),
    }
}

#[async_trait]
impl Peers for PeerClient {
    async fn pin_fork(&self, url: &str, pin: &ForkPin) -> EngineResult<PinnedFork> {
        let body = serde_json::to_string(pin).expect("serializable");
        let bytes = self.call(url, PIN_PATH, body).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::Internal(format!("fork pin answer from {url}: {e}")))
    }

    async fn unpin_fork(&self, url: &str, source_id: u64, pin: u64) -> EngineResult<()> {
        let body = serde_json::to_string(&Unpin { source_id, pin }).expect("serializable");
        self.call(url, UNPIN_PATH, body).await.map(|_| ())
    }

    async fn cascade(&self, url: &str, source_id: u64) -> EngineResult<()> {
        let body = serde_json::to_string(&Cascade { source_id }).expect("serializable");
        self.call(url, CASCADE_PATH, body).await.map(|_| ())
    }

    async fn nudge(&self, url: &str) -> EngineResult<()> {
        self.call(url, NUDGE_PATH, "{}".to_string())
            .await
            .map(|_| ())
    }

    /// The tails of `streams` (those the member at `base` serves), by name.
    async fn tails(
        &self,
        base: &str,
        streams: Vec<String>,
    ) -> EngineResult<std::collections::HashMap<String, u64>> {
        let call = serde_json::to_string(&Tails { streams }).expect("serializable");
        let bytes = self.call(base, TAILS_PATH, call).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::Internal(format!("tails answer from {base}: {e}")))
    }

    /// Appends the JSON `body` to `stream` at the member at `base`.
    async fn append(&self, base: &str, stream: &str, body: String) -> EngineResult<()> {
        let call = serde_json::to_string(&Append {
            stream: stream.to_string(),
            body,
        })
        .expect("serializable");
        self.call(base, APPEND_PATH, call).await.map(|_| ())
    }

    async fn admin(&self, base: &str, op: &StreamAdmin) -> EngineResult<StreamAdminAnswer> {
        let call = serde_json::to_string(op).expect("serializable");
        let resp = self.call_raw(base, ADMIN_PATH, call).await?;
        match resp.status.as_u16() {
            200 => serde_json::from_slice(&resp.body)
                .map_err(|e| EngineError::Internal(format!("admin answer from {base}: {e}"))),
            404 => Err(EngineError::NotFound),
            _ => Err(error_from(&resp)),
        }
    }
}
