//! PicoMQ's HTTP edge: the Durable Streams protocol on every path, plus the reserved
//! server paths (health, metrics). Limits, error mapping and browser headers are
//! applied here, once.

pub mod cursor;
pub mod ds;
pub mod error;
pub mod headers;
pub mod listing;
pub mod metrics;
pub mod shutdown;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::middleware::Next;
use axum::routing::get;
use axum::Router;
use picomq_engine::Engine;
use tracing::Instrument;

pub use shutdown::{ShutdownSignal, ShutdownTrigger};

#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// SSE connections end after this long (clients reconnect from their offset).
    pub sse_max_duration: Duration,
    /// Fired at shutdown: live readers answer at once and /readyz turns 503.
    pub shutdown: ShutdownSignal,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            long_poll_timeout: Duration::from_secs(25),
            sse_max_duration: Duration::from_secs(60),
            shutdown: ShutdownSignal::never(),
        }
    }
}

pub struct AppState {
    pub engine: Engine,
    pub long_poll_timeout: Duration,
    pub sse_max_duration: Duration,
    pub live_readers: AtomicU64,
    pub request_ids: AtomicU64,
    pub shutdown: ShutdownSignal,
}

pub fn router(engine: Engine, config: HttpConfig) -> Router {
    routers(engine, config).0
}

/// The API router, and the admin router for `--admin-listen` (`/metrics`, `/healthz`
/// and `/readyz` only), sharing one state.
pub fn routers(engine: Engine, config: HttpConfig) -> (Router, Router) {
    let state = Arc::new(AppState {
        engine,
        long_poll_timeout: config.long_poll_timeout,
        sse_max_duration: config.sse_max_duration,
        live_readers: AtomicU64::new(0),
        request_ids: AtomicU64::new(0),
        shutdown: config.shutdown,
    });
    let admin = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .with_state(state.clone());
    let api = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .route(listing::PATH, get(listing::list))
        .fallback(ds::handle)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            common_headers,
        ))
        .with_state(state);
    (api, admin)
}

/// What the port serves while the node recovers, before `router`: alive (`/healthz`
/// 200) but not ready; `/readyz` and every stream request get 503 with Retry-After.
pub fn recovering_router() -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .fallback(|| async {
            error::ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "starting",
                "the server is recovering its streams from the object store; retry shortly",
            )
            .with_header(header::RETRY_AFTER, 1)
        })
}

/// CORS, browser security headers and a request id on every response; one span and
/// one access-log line (target `picomq::access`) per request.
async fn common_headers(
    State(app): State<Arc<AppState>>,
    req: Request<Body>,
    next: Next,
) -> Response<Body> {
    let id = req
        .headers()
        .get(&headers::REQUEST_ID)
        .filter(|v| v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| {
            let n = app
                .request_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            HeaderValue::from_str(&format!("{:x}-{n:x}", app.engine.epoch()))
                .expect("hex is a valid header")
        });
    let started = Instant::now();
    let span = tracing::info_span!(
        "request",
        id = id.to_str().unwrap_or("-"),
        method = %req.method(),
        path = req.uri().path(),
    );
    let mut resp = next.run(req).instrument(span.clone()).await;
    access_log(&span, resp.status(), started);
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(headers::CORS_ALLOW_METHODS),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(headers::CORS_ALLOW_HEADERS),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(headers::CORS_EXPOSE_HEADERS),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        headers::CROSS_ORIGIN_RESOURCE_POLICY,
        HeaderValue::from_static("cross-origin"),
    );
    h.insert(headers::REQUEST_ID, id);
    resp
}

/// Latency is the time to the response head (for SSE and long-polls, until they start
/// or answer).
fn access_log(span: &tracing::Span, status: StatusCode, started: Instant) {
    let _entered = span.enter();
    let latency_us = started.elapsed().as_micros() as u64;
    let status = status.as_u16();
    if status >= 500 {
        tracing::warn!(target: "picomq::access", status, latency_us, "request failed");
    } else {
        tracing::info!(target: "picomq::access", status, latency_us, "request");
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(app): State<Arc<AppState>>) -> Response<Body> {
    let (status, body) = match app.engine.health() {
        _ if app.shutdown.is_fired() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down\n".to_string(),
        ),
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    };
    Response::builder()
        .status(status)
        .body(Body::from(body))
        .expect("valid response")
}
