//! What every handler shares: the node's state as the edge holds it (`AppState`:
//! the engine, the consumers, authentication, limits, the cluster edge), the
//! browser origins it allows (`Cors`), and the JSON answer every handler writes.

use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};
use picomq_engine::Engine;

use crate::auth::Auth;
use crate::limits::{self, LiveReaders, RateLimiter};
use crate::members::ClusterEdge;
use picomq_engine::shutdown::ShutdownSignal;

/// Browser origins allowed to call the API (CORS).
#[derive(Clone, Debug)]
pub enum Cors {
    /// `Access-Control-Allow-Origin: *`, never with credentials.
    Any,
    /// Only these origins (`https://app.example.com`), echoed back with
    /// `Access-Control-Allow-Credentials: true`; preflights from others get 403.
    Origins(Vec<HeaderValue>),
}

impl Cors {
    /// `*` or a comma-separated list of origins (scheme://host[:port]).
    pub fn parse(list: &str) -> Result<Cors, String> {
        let list = list.trim();
        if list == "*" {
            return Ok(Cors::Any);
        }
        let mut origins = Vec::new();
        for o in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let valid = (o.starts_with("http://") || o.starts_with("https://"))
                && !o.ends_with('/')
                && o.len() <= 256
                && o.split_once("://").is_some_and(|(_, h)| {
                    !h.is_empty() && !h.contains('/') && h.bytes().all(|b| b.is_ascii_graphic())
                });
            if o == "*" || !valid {
                return Err(format!(
                    "CORS origin {o:?}: use * alone, or origins like https://app.example.com (scheme and host, no path)"
                ));
            }
            origins.push(HeaderValue::from_str(o).map_err(|e| e.to_string())?);
        }
        if origins.is_empty() {
            return Err("the CORS origin list is empty (use * to allow any origin)".into());
        }
        Ok(Cors::Origins(origins))
    }
}

pub struct AppState {
    pub engine: Engine,
    pub long_poll_timeout: Duration,
    pub sse_max_duration: Duration,
    pub live_readers: AtomicU64,
    pub request_ids: AtomicU64,
    pub shutdown: ShutdownSignal,
    /// Whether the `guard` middleware runs (auth or rate limits are on).
    pub guarded: bool,
    pub auth: Option<Arc<Auth>>,
    pub cors: Cors,
    pub body_read_timeout: Duration,
    pub ip_limiter: Option<RateLimiter<IpAddr>>,
    /// Proxies whose `X-Forwarded-For` the per-IP limit believes.
    pub trusted_proxies: Vec<limits::IpRange>,
    pub token_limiter: Option<RateLimiter<String>>,
    pub live: Arc<LiveReaders>,
    /// A cluster member's routing (proxy or redirect) and peer key.
    pub cluster: Option<ClusterEdge>,
    /// The consumers of this node: groups, subscriptions, positions.
    pub consumers: Arc<picomq_consumers::Consumers>,
    pub public_url: Option<String>,
    pub tls: bool,
    /// The schema registry (`/__picomq/schemas/`, stream bindings).
    pub registry: Arc<picomq_registry::Registry>,
    /// Iceberg tables: the exporter and what the catalog serves.
    pub tables: Arc<picomq_tables::exporter::Exporter>,
    pub iceberg_io: std::collections::BTreeMap<String, String>,
}

impl AppState {
    /// Whether a write must tell anyone (subscriptions, waiting group claims).
    pub fn watching_writes(&self) -> bool {
        self.consumers.watching()
    }

    /// A write to stream `name` was acknowledged.
    pub fn written(&self, name: &str) {
        self.consumers.written(name);
    }
}

/// A JSON answer that no cache keeps (the API's own endpoints).
pub fn json_response(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("valid response")
}
