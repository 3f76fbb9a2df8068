//! PicoMQ's HTTP edge: the Durable Streams protocol on every path, plus the reserved
//! server paths (health, metrics, tokens). Authentication, limits, error mapping and
//! browser headers are applied here, once; `server` owns connections (TLS, timeouts).

pub mod app;
pub mod auth;
pub mod cluster;
pub mod console;
pub mod cursor;
pub mod digits;
pub mod ds;
pub mod error;
pub mod groups;
pub mod h1;
pub mod headers;
pub mod limits;
pub mod listing;
pub mod maintenance;
pub mod members;
pub mod metrics;
pub mod positions;
pub mod records;
pub mod request;
pub mod retention;
pub mod schemas;
pub mod server;
pub mod subscriptions;
pub mod tables;
pub mod tokens;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::routing::{any, delete, get, post};
use axum::Router;
use picomq_engine::Engine;
use tracing::Instrument;

pub use app::{json_response, AppState, Cors};
use auth::{Auth, Principal};
use limits::{LiveReaders, RateLimiter};

pub use picomq_engine::shutdown::{ShutdownSignal, ShutdownTrigger};

#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// SSE connections end after this long (clients reconnect from their offset).
    pub sse_max_duration: Duration,
    /// Fired at shutdown: live readers answer at once and /readyz turns 503.
    pub shutdown: ShutdownSignal,
    /// Tokens and their checks; `None` is `--auth off`: every request may do anything.
    pub auth: Option<Arc<Auth>>,
    /// Which browser origins may call the API.
    pub cors: Cors,
    /// A request body must arrive within this long (slow senders get 408).
    pub body_read_timeout: Duration,
    /// Requests per second (and burst) per client IP; `None`: unlimited.
    pub rate_limit_ip: Option<(f64, f64)>,
    /// Proxies whose `X-Forwarded-For` names the client a per-IP limit counts.
    pub trusted_proxies: Vec<limits::IpRange>,
    /// Requests per second (and burst) per token; `None`: unlimited.
    pub rate_limit_token: Option<(f64, f64)>,
    /// Concurrent live reads (long-poll, SSE) of one stream.
    pub live_readers_per_stream_max: usize,
    /// Concurrent live reads with one token.
    pub live_readers_per_token_max: usize,
    /// A cluster member's routing: how clients reach a stream's owner, and the key
    /// members call each other with. `None` outside a cluster.
    pub cluster: Option<ClusterRouting>,
    /// How the Durable Streams subscriptions of the node behave.
    pub subscriptions: picomq_consumers::subscriptions::Settings,
    /// Where clients reach this server (`https://streams.example.com`), for the
    /// URLs subscription bodies hand out; `None`: from each request's Host.
    pub public_url: Option<String>,
    /// The API port serves HTTPS.
    pub tls: bool,
    /// The schema registry, if the node opened it already (before its Kafka
    /// listener, so no append is ever unchecked); opened here otherwise.
    pub registry: Option<Arc<picomq_registry::Registry>>,
    /// What the Iceberg catalog tells readers about the store (FileIO properties
    /// such as `s3.endpoint`; no secrets unless the operator put them here).
    pub iceberg_io: std::collections::BTreeMap<String, String>,
}

/// How a cluster member's edge routes.
#[derive(Clone, Debug)]
pub struct ClusterRouting {
    pub mode: cluster::RouteMode,
    /// The cluster key (see `cluster::peers`).
    pub key: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            long_poll_timeout: Duration::from_secs(25),
            sse_max_duration: Duration::from_secs(60),
            shutdown: ShutdownSignal::never(),
            auth: None,
            cors: Cors::Any,
            body_read_timeout: Duration::from_secs(30),
            rate_limit_ip: None,
            trusted_proxies: Vec::new(),
            rate_limit_token: None,
            live_readers_per_stream_max: 10_000,
            live_readers_per_token_max: 10_000,
            cluster: None,
            subscriptions: picomq_consumers::subscriptions::Settings::default(),
            public_url: None,
            tls: false,
            registry: None,
            iceberg_io: Default::default(),
        }
    }
}

/// Every path the API port routes besides the streams themselves (and the
/// Durable Streams `__ds` APIs under any stream root). Each has its rows in the
/// authorization matrix test (`crates/picomq/tests/it/auth_matrix.rs`), which fails
/// for a path listed here without one; a route the router gains without being
/// listed here stops the server at start.
pub const API_ROUTES: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    listing::PATH,
    maintenance::COMPACT_PATH,
    retention::PATH,
    tokens::TOKENS_PATH,
    tokens::TOKEN_PATH,
    tokens::READ_TOKENS_PATH,
    cluster::nodes::NODES_PATH,
    cluster::nodes::DRAIN_PATH,
    cluster::nodes::RESUME_PATH,
    cluster::peers::PIN_PATH,
    cluster::peers::UNPIN_PATH,
    cluster::peers::CASCADE_PATH,
    cluster::peers::NUDGE_PATH,
    cluster::peers::APPEND_PATH,
    cluster::peers::TAILS_PATH,
    cluster::peers::ADMIN_PATH,
    groups::PATH,
    groups::ITEM_PATH,
    subscriptions::ROTATE_PATH,
    subscriptions::LIST_PATH,
    positions::PATH,
    schemas::PATH,
    schemas::ITEM_PATH,
    tables::PATH,
    tables::ITEM_PATH,
    tables::ICEBERG_PATH,
    console::PATH,
    console::INDEX_PATH,
    console::FILE_PATH,
];

/// The API router, built through [`Routes::route`] so that its paths can be checked
/// against [`API_ROUTES`].
struct Routes {
    router: Router<Arc<AppState>>,
    paths: Vec<&'static str>,
}

impl Routes {
    fn route(
        mut self,
        path: &'static str,
        method: axum::routing::MethodRouter<Arc<AppState>>,
    ) -> Routes {
        self.paths.push(path);
        self.router = self.router.route(path, method);
        self
    }

    fn merge(mut self, paths: &[&'static str], router: Router<Arc<AppState>>) -> Routes {
        self.paths.extend_from_slice(paths);
        self.router = self.router.merge(router);
        self
    }

    /// The router, once its paths are exactly [`API_ROUTES`].
    fn checked(self) -> Router<Arc<AppState>> {
        let mut routed = self.paths.clone();
        let mut listed = API_ROUTES.to_vec();
        routed.sort_unstable();
        listed.sort_unstable();
        assert_eq!(
            routed, listed,
            "every API route is listed in API_ROUTES (and has rows in the authorization matrix)"
        );
        self.router
    }
}

pub fn router(engine: Engine, config: HttpConfig) -> Api {
    routers(engine, config).0
}

/// The node's schema registry, installed as the check every append passes.
pub fn open_registry(engine: &Engine) -> Arc<picomq_registry::Registry> {
    let registry = picomq_registry::Registry::new((**engine).clone());
    engine.set_append_check(registry.clone());
    registry
}

/// The API's service, and the admin router for `--admin-listen` (`/metrics`,
/// `/healthz`, `/readyz` and the console's files only), sharing one state.
pub fn routers(engine: Engine, config: HttpConfig) -> (Api, Router) {
    let edge = match (&config.cluster, engine.cluster()) {
        (Some(routing), Some(_)) => {
            let peers = Arc::new(members::client::PeerClient::new(routing.key.clone()));
            engine.set_peers(peers.clone());
            Some(cluster::ClusterEdge {
                node_id: HeaderValue::from_str(&engine.cluster().expect("a member").config.node_id)
                    .expect("node ids are printable ASCII"),
                mode: routing.mode,
                proxy: members::Proxy::new().expect("TLS with the system's trust store"),
                key: routing.key.clone(),
                peers,
                stats: cluster::EdgeStats::default(),
            })
        }
        _ => None,
    };
    let mut settings = config.subscriptions.clone();
    // Without auth the server is a development one (it listens on loopback only
    // unless told otherwise): the protocol's http://localhost webhooks hold there.
    settings.development = config.auth.is_none();
    if engine.cluster().is_some() {
        // Appends on other members are not seen here: idle subscriptions look often.
        settings.rescan = settings.rescan.min(Duration::from_secs(1));
    }
    let consumers =
        picomq_consumers::Consumers::new(engine.clone(), settings, config.shutdown.clone());
    let registry = match &config.registry {
        Some(r) => r.clone(),
        None => open_registry(&engine),
    };
    let tables = picomq_tables::exporter::Exporter::new(engine.clone(), Some(registry.clone()));
    let state = Arc::new(AppState {
        engine,
        long_poll_timeout: config.long_poll_timeout,
        sse_max_duration: config.sse_max_duration,
        live_readers: AtomicU64::new(0),
        request_ids: AtomicU64::new(0),
        shutdown: config.shutdown,
        guarded: config.auth.is_some()
            || config.rate_limit_ip.is_some()
            || config.rate_limit_token.is_some(),
        auth: config.auth,
        cors: config.cors,
        body_read_timeout: config.body_read_timeout,
        ip_limiter: config
            .rate_limit_ip
            .map(|(rate, burst)| RateLimiter::new(rate, burst)),
        trusted_proxies: config.trusted_proxies,
        token_limiter: config
            .rate_limit_token
            .map(|(rate, burst)| RateLimiter::new(rate, burst)),
        live: LiveReaders::new(
            config.live_readers_per_stream_max,
            config.live_readers_per_token_max,
        ),
        cluster: edge,
        consumers: consumers.clone(),
        public_url: config.public_url,
        tls: config.tls,
        registry,
        tables: tables.clone(),
        iceberg_io: config.iceberg_io,
    });
    tokio::spawn(consumers.subscriptions.clone().run(Duration::from_secs(1)));
    let stop = state.shutdown.clone();
    tokio::spawn(async move { tables.run(stop.fired()).await });
    let mut admin = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .merge(console::routes());
    let api = Routes {
        router: Router::new(),
        paths: Vec::new(),
    }
    .route("/healthz", get(healthz))
    .route("/readyz", get(readyz))
    .route("/metrics", get(metrics::metrics))
    .route(listing::PATH, get(listing::list))
    .route(maintenance::COMPACT_PATH, post(maintenance::compact))
    .route(retention::PATH, any(retention::handle))
    .route(tokens::TOKENS_PATH, post(tokens::create).get(tokens::list))
    .route(tokens::TOKEN_PATH, delete(tokens::revoke))
    .route(tokens::READ_TOKENS_PATH, post(tokens::mint_read_token))
    .route(cluster::nodes::NODES_PATH, get(cluster::nodes::list))
    .route(cluster::nodes::DRAIN_PATH, post(cluster::nodes::drain))
    .route(cluster::nodes::RESUME_PATH, post(cluster::nodes::resume))
    .route(cluster::peers::PIN_PATH, post(cluster::peers::pin))
    .route(cluster::peers::UNPIN_PATH, post(cluster::peers::unpin))
    .route(cluster::peers::CASCADE_PATH, post(cluster::peers::cascade))
    .route(cluster::peers::NUDGE_PATH, post(cluster::peers::nudge))
    .route(cluster::peers::APPEND_PATH, post(cluster::peers::append))
    .route(cluster::peers::ADMIN_PATH, post(cluster::peers::admin))
    .route(groups::PATH, get(groups::list))
    .route(subscriptions::ROTATE_PATH, post(subscriptions::rotate))
    .route(subscriptions::LIST_PATH, get(subscriptions::list))
    .merge(console::PATHS, console::routes())
    .route(groups::ITEM_PATH, any(groups::handle))
    .route(positions::PATH, any(positions::handle))
    .route(schemas::PATH, any(schemas::handle))
    .route(schemas::ITEM_PATH, any(schemas::handle))
    .route(tables::PATH, any(tables::handle))
    .route(tables::ITEM_PATH, any(tables::handle))
    .route(tables::ICEBERG_PATH, any(tables::iceberg))
    .route(cluster::peers::TAILS_PATH, post(cluster::peers::tails))
    .checked()
    .fallback(ds::handle);
    if state.guarded {
        admin = admin.layer(axum::middleware::from_fn_with_state(state.clone(), guard));
    }
    let api = Api {
        app: state.clone(),
        routes: api.with_state(state.clone()),
    };
    (api, admin.with_state(state))
}

/// The API port's service. Every request gets `common_headers` (CORS, security
/// headers, request id, access line) and, with auth or rate limits on, `guard_refusal`;
/// then a stream path goes straight to the Durable Streams handler, and the server's
/// own paths (`/__picomq/...`, `/healthz`, `/readyz`, `/metrics`) go through axum's
/// router.
///
/// Why not axum layers on one router: a layer wraps every route and the fallback, so
/// each request paid for a boxed future per layer and per route, a boxed clone of
/// each wrapped service, a route lookup that always misses for a stream path, and the
/// moves of the handler's large future between those boxes. Under callgrind a 1 KiB
/// append cost the server 59,410 instructions that way and 54,715 this way
/// (docs/performance.md).
#[derive(Clone)]
pub struct Api {
    app: Arc<AppState>,
    routes: Router,
}

impl tower_service::Service<Request<Body>> for Api {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let api = self.clone();
        Box::pin(async move {
            let app = api.app.clone();
            Ok(common_headers(&app, req, move |req| api.dispatch(req)).await)
        })
    }
}

impl Api {
    async fn dispatch(self, mut req: Request<Body>) -> Response<Body> {
        if self.app.guarded {
            if let Some(refused) = guard_refusal(&self.app, &mut req) {
                return refused;
            }
        }
        if is_server_path(req.uri().path()) {
            let mut routes = self.routes;
            let answer = tower_service::Service::call(&mut routes, req).await;
            return answer.unwrap_or_else(|never| match never {});
        }
        let head = req.method() == Method::HEAD;
        let node_id = self.app.cluster.as_ref().map(|edge| edge.node_id.clone());
        let mut resp = ds::handle(State(self.app), req).await.into_response();
        // A cluster member names itself on what it served (a forwarded answer keeps
        // the owner's name): who served what, for operators and tests.
        if let Some(id) = node_id {
            resp.headers_mut().entry(cluster::SERVED_BY).or_insert(id);
        }
        // What axum's router does to every handler's answer, as it still does for
        // the server's own paths: a Content-Length from an exactly sized body, set
        // before a HEAD's body is dropped.
        if !resp.headers().contains_key(header::CONTENT_LENGTH) {
            if let Some(len) = axum::body::HttpBody::size_hint(resp.body()).exact() {
                resp.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            }
        }
        if head {
            *resp.body_mut() = Body::empty();
        }
        resp
    }
}

/// The server's own endpoints (served by the router); every other path names a
/// stream. Reserved `/__` paths that match no route reach the stream handler
/// through the router's fallback, which refuses them.
fn is_server_path(path: &str) -> bool {
    path.starts_with("/__") || matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Rate limits (per client IP, then per token) and authentication: a request with a
/// credential gets its `Principal` as an extension, or is refused (401, 429) if the
/// credential is bad or a limit is reached. Requests without one pass on; each
/// handler decides what needs which scope.
fn guard_refusal(app: &AppState, req: &mut Request<Body>) -> Option<Response<Body>> {
    let now = Instant::now();
    if let (Some(limiter), Some(ConnectInfo(peer))) = (
        &app.ip_limiter,
        req.extensions().get::<ConnectInfo<SocketAddr>>(),
    ) {
        let client = limits::client_ip(peer.ip(), req.headers(), &app.trusted_proxies);
        if let Err(wait) = limiter.check(&client, now) {
            return Some(limits::too_many_requests("from this address", wait).into_response());
        }
    }
    if let Some(auth) = &app.auth {
        match auth.authenticate(req.method(), req.uri().query(), req.headers()) {
            Ok(Some(principal)) => {
                if let (Some(limiter), Principal::Token(t)) = (&app.token_limiter, &principal) {
                    if let Err(wait) = limiter.check(&t.id, now) {
                        return Some(
                            limits::too_many_requests("with this token", wait).into_response(),
                        );
                    }
                }
                req.extensions_mut().insert(principal);
            }
            Ok(None) => {}
            Err(e) => return Some(e.into_response()),
        }
    }
    None
}

/// `guard_refusal` as a layer, for the admin port's router.
async fn guard(
    State(app): State<Arc<AppState>>,
    mut req: Request<Body>,
    next: Next,
) -> Response<Body> {
    match guard_refusal(&app, &mut req) {
        None => next.run(req).await,
        Some(refused) => refused,
    }
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

/// The policy of every answer a browser may open that sets none of its own (stream
/// reads above all): no scripts, no plugins, no forms, an opaque origin.
pub const READ_CONTENT_SECURITY_POLICY: &str = "sandbox";

/// CORS, browser security headers and a request id on every response; one
/// access-log line (target `picomq::access`) per request, and at debug level a span.
async fn common_headers<F, Fut>(app: &AppState, req: Request<Body>, next: F) -> Response<Body>
where
    F: FnOnce(Request<Body>) -> Fut,
    Fut: Future<Output = Response<Body>>,
{
    let id = req
        .headers()
        .get(&headers::REQUEST_ID)
        .filter(|v| v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| {
            let n = app
                .request_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            request_id(app.engine.epoch(), n)
        });
    let started = Instant::now();
    // Kept for the access line (the request itself moves into the handler). The path
    // only: the query may hold a read token and must never be logged.
    let method = req.method().clone();
    let uri = req.uri().clone();
    // At debug level (`--log info,picomq::access=debug`), everything logged while
    // serving the request carries its id.
    // Not at info: creating and entering a span per request cost ~10% of an append's
    // instructions, and the access line names the request by itself.
    let span = tracing::debug_span!(
        target: "picomq::access",
        "request",
        id = id.to_str().unwrap_or("-"),
        method = method.as_str(),
        path = uri.path(),
    );
    let origin = req.headers().get(header::ORIGIN).cloned();
    // Browsers send Origin with every request but a plain GET or HEAD (the Fetch
    // standard), so any other request without one is not a browser's, and the
    // browser-only headers (CORS, CORP) would be ~350 bytes of every append's answer
    // for nothing. A GET or HEAD answer may be cached and handed to a browser later:
    // it always carries them.
    let for_browser = origin.is_some() || matches!(*req.method(), Method::GET | Method::HEAD);
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = if preflight {
        preflight_response(&app.cors, origin.as_ref())
    } else {
        next(req).instrument(span).await
    };
    access_log(&id, &method, uri.path(), resp.status(), started);
    let h = resp.headers_mut();
    // Room for the headers below at once: grown one insert at a time, the map
    // rehashed on the way (~1,900 instructions per request for six, callgrind).
    h.reserve(if for_browser { 7 } else { 2 });
    if for_browser {
        browser_headers(h, &app.cors, origin);
        // What a stream holds is its writers' data, served on the console's
        // origin: a `text/html` stream opened in a tab (a signed read token makes
        // it a plain link) must not run as a page of ours. `sandbox` gives it an
        // opaque origin with no scripts; the console's own files keep their policy.
        h.entry(header::CONTENT_SECURITY_POLICY)
            .or_insert(HeaderValue::from_static(READ_CONTENT_SECURITY_POLICY));
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(headers::REQUEST_ID, id);
    resp
}

/// CORS and `Cross-Origin-Resource-Policy`: what a browser needs to let a page read
/// the answer.
fn browser_headers(h: &mut HeaderMap, cors: &Cors, origin: Option<HeaderValue>) {
    match cors {
        Cors::Any => {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        }
        Cors::Origins(allowed) => {
            h.insert(header::VARY, HeaderValue::from_static("origin"));
            if let Some(origin) = origin.filter(|o| allowed.contains(o)) {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
        }
    }
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(headers::CORS_EXPOSE_HEADERS),
    );
    h.insert(
        headers::CROSS_ORIGIN_RESOURCE_POLICY,
        HeaderValue::from_static("cross-origin"),
    );
}

/// `{epoch:x}-{n:x}`, the id of a request that brought none, built without `format!`
/// (~600 instructions per request through the formatting machinery, callgrind).
fn request_id(epoch: u64, n: u64) -> HeaderValue {
    let mut id = Vec::with_capacity(33);
    digits::push_hex(&mut id, epoch);
    id.push(b'-');
    digits::push_hex(&mut id, n);
    let id = HeaderValue::from_maybe_shared(bytes::Bytes::from(id)).expect("hex digits and -");
    headers::never_indexed(id)
}

/// A CORS preflight (OPTIONS with Access-Control-Request-Method), answered before
/// authentication since browsers send no credentials with it.
fn preflight_response(cors: &Cors, origin: Option<&HeaderValue>) -> Response<Body> {
    if let Cors::Origins(allowed) = cors {
        if !origin.is_some_and(|o| allowed.contains(o)) {
            return error::ApiError::new(
                StatusCode::FORBIDDEN,
                "cors_origin_not_allowed",
                "this origin may not call the API (see --cors-origins)",
            )
            .into_response();
        }
    }
    // Allow-Methods and Allow-Headers matter only to a preflight: other answers
    // carry only the origin and exposed headers (smaller heads on the hot path).
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(header::ACCESS_CONTROL_MAX_AGE, "600")
        .header(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(headers::CORS_ALLOW_METHODS),
        )
        .header(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(headers::CORS_ALLOW_HEADERS),
        )
        .body(Body::empty())
        .expect("static response")
}

/// One request's access line: what `picomq::access` events carry.
pub struct AccessLine<'a> {
    pub id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub latency_us: u64,
}

/// A writer of access lines the process installs with [`set_access_log`], which then
/// replaces the `picomq::access` tracing event: tracing's dispatch through a layered
/// subscriber (per-layer filters, a visitor per field) was ~1,800 of an append's
/// ~3,000 access-log instructions (docs/performance.md). It decides itself whether
/// the log's filter lets the line through (`info`, or `warn` for a 5xx).
pub trait AccessLog: Send + Sync {
    fn write(&self, line: &AccessLine<'_>);
}

static ACCESS_LOG: std::sync::OnceLock<Box<dyn AccessLog>> = std::sync::OnceLock::new();

/// Installs the process's access-line writer. Only the first call counts (false
/// after); without one, access lines are tracing events.
pub fn set_access_log(log: Box<dyn AccessLog>) -> bool {
    ACCESS_LOG.set(log).is_ok()
}

/// One line per request, naming it by itself (id, method, path). Latency is the time
/// to the response head (for SSE and long-polls, until they start or answer).
fn access_log(id: &HeaderValue, method: &Method, path: &str, status: StatusCode, started: Instant) {
    let latency_us = started.elapsed().as_micros() as u64;
    let status = status.as_u16();
    let id = id.to_str().unwrap_or("-");
    let method = method.as_str();
    if let Some(log) = ACCESS_LOG.get() {
        log.write(&AccessLine {
            id,
            method,
            path,
            status,
            latency_us,
        });
    } else if status >= 500 {
        tracing::warn!(target: "picomq::access", id, method, path, status, latency_us, "request failed");
    } else {
        tracing::info!(target: "picomq::access", id, method, path, status, latency_us, "request");
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
        _ if app.engine.cluster().is_some_and(|c| c.is_draining()) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: draining (its streams go to the other nodes; it forwards what it gets)\n"
                .to_string(),
        ),
        _ if app.engine.cluster().is_some_and(|c| !c.lease.is_valid()) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no valid cluster lease (Postgres unreachable, or this node was taken over)\n"
                .to_string(),
        ),
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    };
    Response::builder()
        .status(status)
        .body(Body::from(body))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_read_as_the_formatter_writes_them() {
        let values = [
            0,
            1,
            9,
            15,
            16,
            255,
            4096,
            0xdead_beef,
            u64::MAX >> 4,
            u64::MAX,
        ];
        for epoch in values {
            for n in values {
                let id = request_id(epoch, n);
                assert_eq!(id.to_str().unwrap(), format!("{epoch:x}-{n:x}"));
            }
        }
    }
}
