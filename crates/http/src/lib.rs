//! PicoMQ's HTTP edge: the Durable Streams protocol on every path, plus the reserved
//! server paths (health, metrics). Limits, error mapping and browser headers are
//! applied here, once.

pub mod cursor;
pub mod ds;
pub mod error;
pub mod headers;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, Response, StatusCode};
use axum::middleware::Next;
use axum::routing::get;
use axum::Router;
use picomq_engine::Engine;

#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// SSE connections end after this long (clients reconnect from their offset).
    pub sse_max_duration: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            long_poll_timeout: Duration::from_secs(25),
            sse_max_duration: Duration::from_secs(60),
        }
    }
}

pub struct AppState {
    pub engine: Engine,
    pub long_poll_timeout: Duration,
    pub sse_max_duration: Duration,
    pub live_readers: AtomicU64,
    pub request_ids: AtomicU64,
}

pub fn router(engine: Engine, config: HttpConfig) -> Router {
    let state = Arc::new(AppState {
        engine,
        long_poll_timeout: config.long_poll_timeout,
        sse_max_duration: config.sse_max_duration,
        live_readers: AtomicU64::new(0),
        request_ids: AtomicU64::new(0),
    });
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(ds::handle)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            common_headers,
        ))
        .with_state(state)
}

/// CORS, browser security headers and a request id on every response.
async fn common_headers(
    State(app): State<Arc<AppState>>,
    req: Request<Body>,
    next: Next,
) -> Response<Body> {
    let id = req
        .headers()
        .get(headers::REQUEST_ID)
        .filter(|v| v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| {
            let n = app
                .request_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            HeaderValue::from_str(&format!("{:x}-{n:x}", app.engine.epoch()))
                .expect("hex is a valid header")
        });
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static(headers::CORS_ALLOW_METHODS),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static(headers::CORS_ALLOW_HEADERS),
    );
    h.insert(
        "access-control-expose-headers",
        HeaderValue::from_static(headers::CORS_EXPOSE_HEADERS),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("cross-origin"),
    );
    h.insert(headers::REQUEST_ID, id);
    resp
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(app): State<Arc<AppState>>) -> Response<Body> {
    let (status, body) = match app.engine.health() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    };
    Response::builder()
        .status(status)
        .body(Body::from(body))
        .expect("valid response")
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response<Body> {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let s = app.engine.stats();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    metric(
        "picomq_wal_objects_written_total",
        "counter",
        "WAL objects written to the object store (PUTs).",
        s.wal.objects_written.load(Relaxed),
    );
    metric(
        "picomq_wal_bytes_written_total",
        "counter",
        "Bytes of WAL objects written.",
        s.wal.bytes_written.load(Relaxed),
    );
    metric(
        "picomq_wal_ops_written_total",
        "counter",
        "Stream ops (appends, creates, closes, deletes) made durable.",
        s.wal.ops_written.load(Relaxed),
    );
    metric(
        "picomq_wal_upload_retries_total",
        "counter",
        "Failed WAL uploads that were retried.",
        s.wal.upload_retries.load(Relaxed),
    );
    metric(
        "picomq_index_failures_total",
        "counter",
        "Failed metadata index transactions (retried).",
        s.index_failures,
    );
    metric(
        "picomq_active_streams",
        "gauge",
        "Streams currently held in memory.",
        s.active_streams as u64,
    );
    metric(
        "picomq_live_readers",
        "gauge",
        "Open SSE connections.",
        app.live_readers.load(Relaxed),
    );
    Response::builder()
        .header("content-type", "text/plain; version=0.0.4")
        .body(Body::from(out))
        .expect("valid response")
}
