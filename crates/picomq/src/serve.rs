//! `picomq serve`: configuration (flags, PICOMQ_* environment, an optional TOML file
//! read by `config_file`), start-up (the port answers "alive, not ready" while
//! recovery runs) and graceful shutdown (bounded by `--shutdown-timeout`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use picomq_engine::{meta::Meta, Engine, EngineConfig, WalConfig};
use picomq_http::auth::{Auth, AuthConfig};
use picomq_http::server::{ServerOptions, Tls};
use picomq_http::{Cors, HttpConfig, ShutdownSignal, ShutdownTrigger};
use tokio::time::Instant;

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

fn ip_range(s: &str) -> Result<picomq_http::limits::IpRange, String> {
    picomq_http::limits::IpRange::parse(s)
}

fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a positive number of requests per second"
        )),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Every request needs a token (or a signed read token for reads).
    Required,
    /// No authentication: anyone who reaches the port may do anything.
    Off,
}

/// Who may connect and how much they may do: authentication, TLS, CORS and the abuse
/// limits of the HTTP edge.
#[derive(Args, Debug)]
pub struct SecurityArgs {
    /// Authentication: `required` (bearer tokens with scopes) or `off`.
    #[arg(long, env = "PICOMQ_AUTH", value_enum, default_value = "off")]
    pub auth: AuthMode,
    /// File holding the bootstrap admin token (any secret of 32 to 512 visible ASCII
    /// characters, e.g. from `openssl rand -hex 32`). Set at first start; a changed
    /// file replaces it at the next start [default: none].
    #[arg(long, env = "PICOMQ_BOOTSTRAP_TOKEN_FILE", value_name = "PATH")]
    pub bootstrap_token_file: Option<PathBuf>,
    /// With --auth off, listen on a non-loopback address anyway (anyone who reaches
    /// the port may read, write and delete every stream) [default: off].
    #[arg(long, env = "PICOMQ_ALLOW_UNAUTHENTICATED_PUBLIC")]
    pub allow_unauthenticated_public: bool,
    /// PEM certificate chain: serve HTTPS (reloaded with the key on SIGHUP) [default: none].
    #[arg(
        long,
        env = "PICOMQ_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert [default: none].
    #[arg(
        long,
        env = "PICOMQ_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Browser origins allowed to call the API: `*`, or a comma-separated list such as
    /// https://app.example.com (listed origins also get Allow-Credentials).
    #[arg(long, env = "PICOMQ_CORS_ORIGINS", default_value = "*")]
    pub cors_origins: String,
    /// Requests per second per client IP address [default: unlimited].
    #[arg(long, env = "PICOMQ_RATE_LIMIT_IP", value_parser = rate, value_name = "RPS")]
    pub rate_limit_ip: Option<f64>,
    /// Proxies in front of the server (comma-separated IPs or CIDR ranges, e.g.
    /// 10.0.0.0/8): for requests they forward, --rate-limit-ip counts the client named
    /// in X-Forwarded-For instead of the proxy [default: none, the header is ignored].
    #[arg(long, env = "PICOMQ_TRUSTED_PROXIES", value_delimiter = ',', value_parser = ip_range, value_name = "LIST")]
    pub trusted_proxies: Vec<picomq_http::limits::IpRange>,
    /// Requests per second per token [default: unlimited].
    #[arg(long, env = "PICOMQ_RATE_LIMIT_TOKEN", value_parser = rate, value_name = "RPS")]
    pub rate_limit_token: Option<f64>,
    /// Requests a client may make at once above its rate [default: one second's worth].
    #[arg(long, env = "PICOMQ_RATE_LIMIT_BURST", value_parser = rate)]
    pub rate_limit_burst: Option<f64>,
    /// Concurrent live readers (long-poll and SSE) of one stream.
    #[arg(
        long,
        env = "PICOMQ_MAX_LIVE_READERS_PER_STREAM",
        default_value_t = 10_000
    )]
    pub max_live_readers_per_stream: usize,
    /// Concurrent live readers (long-poll and SSE) with one token.
    #[arg(
        long,
        env = "PICOMQ_MAX_LIVE_READERS_PER_TOKEN",
        default_value_t = 10_000
    )]
    pub max_live_readers_per_token: usize,
    /// Streams a namespaced token may have under its namespace [default: unlimited].
    #[arg(long, env = "PICOMQ_MAX_STREAMS_PER_NAMESPACE")]
    pub max_streams_per_namespace: Option<u64>,
    /// Tokens the server holds (revoked ones included).
    #[arg(long, env = "PICOMQ_MAX_TOKENS", default_value_t = AuthConfig::default().tokens_max)]
    pub max_tokens: usize,
    /// Longest life of a signed read token (for EventSource query parameters).
    #[arg(long, env = "PICOMQ_READ_TOKEN_MAX_TTL", default_value = "1h", value_parser = duration)]
    pub read_token_max_ttl: Duration,
    /// A request head (and TLS handshake) must arrive within this long; idle
    /// keep-alive connections close after it too (defeats slow-loris clients).
    #[arg(long, env = "PICOMQ_HEADER_READ_TIMEOUT", default_value = "20s", value_parser = duration)]
    pub header_read_timeout: Duration,
    /// A request body must arrive within this long, else 408.
    #[arg(long, env = "PICOMQ_BODY_READ_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub body_read_timeout: Duration,
    /// Largest request head (request line plus headers), in bytes.
    #[arg(long, env = "PICOMQ_MAX_HEADER_BYTES", default_value_t = ServerOptions::default().header_bytes_max)]
    pub max_header_bytes: usize,
    /// Client connections open at once; beyond it new ones wait in the backlog.
    #[arg(long, env = "PICOMQ_MAX_CONNECTIONS", default_value_t = ServerOptions::default().connections_max)]
    pub max_connections: usize,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TOML file of options, keyed by flag name (`listen = "0.0.0.0:4437"`). Flags
    /// and PICOMQ_* variables override it [default: none].
    #[arg(long, env = "PICOMQ_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "PICOMQ_LISTEN", default_value = "127.0.0.1:4437")]
    pub listen: SocketAddr,
    /// Directory for the default object store and metadata database.
    #[arg(long, env = "PICOMQ_DATA_DIR", default_value = "./picomq-data")]
    pub data_dir: PathBuf,
    /// Object store URL: file:///path or memory:// [default: file://DATA_DIR/objects].
    #[arg(long, env = "PICOMQ_STORE")]
    pub store: Option<String>,
    /// Metadata database URL: sqlite://path [default: sqlite://DATA_DIR/meta.sqlite;
    /// in-memory when --store is memory://].
    #[arg(long, env = "PICOMQ_META")]
    pub meta: Option<String>,
    /// How long a long-poll read waits for new data before answering 204.
    #[arg(long, env = "PICOMQ_LONG_POLL_TIMEOUT", default_value = "25s", value_parser = duration)]
    pub long_poll_timeout: Duration,
    /// SSE connections are closed after this long; clients resume from their offset.
    #[arg(long, env = "PICOMQ_SSE_MAX_DURATION", default_value = "60s", value_parser = duration)]
    pub sse_max_duration: Duration,
    /// Object-store write budget in PUTs per second. At the budget, batches grow
    /// instead of PUTs multiplying [default: unlimited].
    #[arg(long, env = "PICOMQ_MAX_WRITES_PER_SEC")]
    pub max_writes_per_sec: Option<f64>,
    /// How long an append waits to become durable before failing with 503.
    #[arg(long, env = "PICOMQ_APPEND_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub append_timeout: Duration,
    /// Largest request body of one append or create, in bytes.
    #[arg(long, env = "PICOMQ_MAX_APPEND_BYTES", default_value_t = EngineConfig::default().append_bytes_max)]
    pub max_append_bytes: usize,
    /// Largest response body of one catch-up read, in bytes.
    #[arg(long, env = "PICOMQ_MAX_READ_BYTES", default_value_t = EngineConfig::default().read_bytes_max)]
    pub max_read_bytes: usize,
    /// Longest stream name (URL path), in bytes.
    #[arg(long, env = "PICOMQ_MAX_NAME_BYTES", default_value_t = EngineConfig::default().stream_name_bytes_max)]
    pub max_name_bytes: usize,
    /// Streams held in memory at once.
    #[arg(long, env = "PICOMQ_MAX_ACTIVE_STREAMS", default_value_t = EngineConfig::default().active_streams_max)]
    pub max_active_streams: usize,
    /// An idle stream leaves memory after this long.
    #[arg(long, env = "PICOMQ_DORMANCY", default_value = "60s", value_parser = duration)]
    pub dormancy: Duration,
    /// Recent durable bytes cached in memory per active stream.
    #[arg(long, env = "PICOMQ_TAIL_CACHE_BYTES", default_value_t = EngineConfig::default().tail_cache_bytes_per_stream)]
    pub tail_cache_bytes: usize,
    /// Largest WAL object, in bytes.
    #[arg(long, env = "PICOMQ_WAL_MAX_OBJECT_BYTES", default_value_t = WalConfig::default().flush_bytes_max)]
    pub wal_max_object_bytes: usize,
    /// WAL uploads in flight at once.
    #[arg(long, env = "PICOMQ_WAL_MAX_INFLIGHT", default_value_t = WalConfig::default().uploads_in_flight_max)]
    pub wal_max_inflight: usize,
    /// Start another WAL upload while one is in flight once the newest has run this
    /// long (e.g. 10ms on S3): lower commit latency for more PUTs. Off by default;
    /// on a local disk concurrent fsyncs slow each other [default: off].
    #[arg(long, env = "PICOMQ_WAL_OVERLAP_AFTER", value_parser = duration)]
    pub wal_overlap_after: Option<Duration>,
    /// Accepted-but-not-durable bytes; beyond this appends get 503.
    #[arg(long, env = "PICOMQ_WAL_BUFFER_BYTES", default_value_t = WalConfig::default().buffer_bytes_max)]
    pub wal_buffer_bytes: usize,
    /// Testing and benchmarks only: add this latency to every object-store request
    /// (e.g. 20ms to behave like S3 on a local directory) [default: none].
    #[arg(long, env = "PICOMQ_STORE_LATENCY", value_parser = duration)]
    pub store_latency: Option<Duration>,
    /// Log format: text or json.
    #[arg(long, env = "PICOMQ_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Log filter, e.g. info or picomq=debug. One line per request is logged at
    /// info under the target picomq::access (silence it with info,picomq::access=warn;
    /// with info,picomq::access=debug each request also runs in a span naming it).
    #[arg(long, env = "PICOMQ_LOG", default_value = "info")]
    pub log: String,
    /// Upper bound on a graceful shutdown (SIGTERM/SIGINT): in-flight requests get
    /// three quarters of it to finish, the WAL flush the rest; then the process exits.
    #[arg(long, env = "PICOMQ_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = duration)]
    pub shutdown_timeout: Duration,
    #[command(flatten)]
    pub storage: crate::storage::StorageArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
}

fn engine_config(args: &ServeArgs) -> Result<EngineConfig, String> {
    let positive = |name: &str, v: usize| {
        if v == 0 {
            Err(format!("--{name} must be greater than 0"))
        } else {
            Ok(v)
        }
    };
    if let Some(rate) = args.max_writes_per_sec {
        if !(rate.is_finite() && rate > 0.0) {
            return Err("--max-writes-per-sec must be a positive number".into());
        }
    }
    Ok(EngineConfig {
        wal: WalConfig {
            flush_bytes_max: positive("wal-max-object-bytes", args.wal_max_object_bytes)?,
            uploads_in_flight_max: positive("wal-max-inflight", args.wal_max_inflight)?,
            overlap_after: match args.wal_overlap_after {
                Some(d) if d.is_zero() => {
                    return Err("--wal-overlap-after must be greater than 0".into())
                }
                d => d,
            },
            buffer_bytes_max: positive("wal-buffer-bytes", args.wal_buffer_bytes)?,
            max_writes_per_sec: args.max_writes_per_sec,
            ..WalConfig::default()
        },
        append_timeout: args.append_timeout,
        append_bytes_max: positive("max-append-bytes", args.max_append_bytes)?,
        read_bytes_max: positive("max-read-bytes", args.max_read_bytes)?,
        stream_name_bytes_max: positive("max-name-bytes", args.max_name_bytes)?,
        active_streams_max: positive("max-active-streams", args.max_active_streams)?,
        dormancy: args.dormancy,
        tail_cache_bytes_per_stream: args.tail_cache_bytes,
        ..EngineConfig::default()
    })
}

pub async fn run(args: ServeArgs) -> ExitCode {
    let logging = match crate::logging::init(&args.log, args.log_format == "json") {
        Ok(logging) => logging,
        Err(e) => {
            eprintln!("picomq: {e}");
            return ExitCode::from(2);
        }
    };
    let result = serve(args).await;
    if let Err(e) = &result {
        tracing::error!("{e}");
    }
    logging.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("picomq: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The edge's settings, checked before anything is opened.
fn check_security(args: &ServeArgs) -> Result<(Cors, Option<Arc<Tls>>), String> {
    let sec = &args.security;
    let public = !args.listen.ip().is_loopback();
    if sec.auth == AuthMode::Off && public && !sec.allow_unauthenticated_public {
        return Err(format!(
            "refusing to listen on {} with --auth off: anyone reaching it could read, write and delete every stream. Use --auth required (with --bootstrap-token-file), listen on a loopback address, or pass --allow-unauthenticated-public if this is intended",
            args.listen
        ));
    }
    if sec.auth == AuthMode::Off && sec.bootstrap_token_file.is_some() {
        return Err("--bootstrap-token-file needs --auth required".into());
    }
    for (name, v) in [
        (
            "max-live-readers-per-stream",
            sec.max_live_readers_per_stream,
        ),
        ("max-live-readers-per-token", sec.max_live_readers_per_token),
        ("max-tokens", sec.max_tokens),
        ("max-header-bytes", sec.max_header_bytes),
        ("max-connections", sec.max_connections),
    ] {
        if v == 0 {
            return Err(format!("--{name} must be greater than 0"));
        }
    }
    if sec.max_streams_per_namespace == Some(0) {
        return Err("--max-streams-per-namespace must be greater than 0".into());
    }
    for (name, d) in [
        ("header-read-timeout", sec.header_read_timeout),
        ("body-read-timeout", sec.body_read_timeout),
        ("read-token-max-ttl", sec.read_token_max_ttl),
    ] {
        if d < Duration::from_millis(1) {
            return Err(format!("--{name} must be at least 1ms"));
        }
    }
    let cors = Cors::parse(&sec.cors_origins).map_err(|e| format!("--cors-origins: {e}"))?;
    let tls = match (&sec.tls_cert, &sec.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(Tls::load(cert, key)?)),
        _ => None,
    };
    Ok((cors, tls))
}

/// Opens the token store (`--auth required`) and applies the bootstrap token.
async fn open_auth(args: &ServeArgs, meta: Meta) -> Result<Option<Arc<Auth>>, String> {
    let sec = &args.security;
    if sec.auth == AuthMode::Off {
        return Ok(None);
    }
    let config = AuthConfig {
        tokens_max: sec.max_tokens,
        read_token_ttl_max: sec.read_token_max_ttl,
        streams_per_namespace_max: sec.max_streams_per_namespace,
    };
    let auth = Auth::open(meta, config).await?;
    if let Some(path) = &sec.bootstrap_token_file {
        let secret = std::fs::read_to_string(path)
            .map_err(|e| format!("--bootstrap-token-file {}: {e}", path.display()))?;
        auth.bootstrap(&secret).await?;
    }
    if !auth.any_live_token() {
        return Err("--auth required, but no token can authenticate: give the first admin token with --bootstrap-token-file".into());
    }
    Ok(Some(Arc::new(auth)))
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let mut signals = Signals::install()?;
    let (cors, tls) = check_security(&args)?;
    let mut config = engine_config(&args)?;
    let data_dir = std::path::absolute(&args.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    let store_url = args
        .store
        .clone()
        .unwrap_or_else(|| format!("file://{}", data_dir.join("objects").display()));
    args.storage.configure(&mut config, &store_url);
    let in_memory = store_url.starts_with("memory:");
    let meta_url = match &args.meta {
        Some(m) => m.clone(),
        None if in_memory => "sqlite::memory:".to_string(),
        None => {
            std::fs::create_dir_all(&data_dir)
                .map_err(|e| format!("--data-dir {}: {e}", data_dir.display()))?;
            format!("sqlite://{}", data_dir.join("meta.sqlite").display())
        }
    };
    let opened = crate::storage::open(&store_url, &args.storage, config.cost, args.store_latency)?;
    // Staging files of uploads a crash interrupted (local directories only), in the
    // background: a big tree must not delay start-up.
    for url in std::iter::once(store_url.clone()).chain(args.storage.wal_store.clone()) {
        tokio::task::spawn_blocking(move || {
            match picomq_engine::store::remove_abandoned_uploads(&url, Duration::from_secs(600)) {
                Ok(0) => {}
                Ok(n) => tracing::info!(store = %url, files = n, "removed abandoned uploads"),
                Err(e) => {
                    tracing::warn!(store = %url, error = %e, "could not clean abandoned uploads")
                }
            }
        });
    }
    if let Some(latency) = args.store_latency {
        tracing::warn!(
            ?latency,
            "object-store latency injection is on (--store-latency)"
        );
    }
    let meta = Meta::open(&meta_url)
        .await
        .map_err(|e| format!("--meta: {e}"))?;
    // The port opens before recovery so probes can tell "alive" from "ready": until
    // recovery ends it serves only /healthz, and 503 everywhere else.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let (listener, recovering) = serve_while_recovering(listener, tls.clone())?;
    // The admin port too: liveness probes pointed at it pass during a long recovery.
    let admin_port = match args.storage.admin_listen {
        Some(addr) => {
            let admin_listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("--admin-listen {addr}: {e}"))?;
            Some(serve_while_recovering(admin_listener, None)?)
        }
        None => None,
    };
    tracing::info!(listen = %local, store = %store_url, meta = %meta_url, "recovering");
    let engine = tokio::select! {
        r = Engine::open_instrumented(config, opened.store, opened.stats, meta.clone()) => r.map_err(|e| format!("recovery failed: {e}"))?,
        signal = signals.recv() => {
            tracing::info!(signal, "stopped during recovery");
            return Ok(());
        }
    };
    // Tokens load after recovery: it may have restored the metadata (tokens included)
    // from a checkpoint in the bucket.
    let auth = match open_auth(&args, meta).await {
        Ok(auth) => auth,
        Err(e) => {
            engine.shutdown().await;
            return Err(e);
        }
    };
    recovering.stop().await;
    let admin_port = match admin_port {
        Some((admin_listener, recovering)) => {
            recovering.stop().await;
            Some(admin_listener)
        }
        None => None,
    };
    let (trigger, shutdown) = ShutdownSignal::new();
    let sec = &args.security;
    let burst = |rps: f64| sec.rate_limit_burst.unwrap_or(rps).max(1.0);
    let http = HttpConfig {
        long_poll_timeout: args.long_poll_timeout,
        sse_max_duration: args.sse_max_duration,
        shutdown: shutdown.clone(),
        auth,
        cors,
        body_read_timeout: sec.body_read_timeout,
        rate_limit_ip: sec.rate_limit_ip.map(|r| (r, burst(r))),
        trusted_proxies: sec.trusted_proxies.clone(),
        rate_limit_token: sec.rate_limit_token.map(|r| (r, burst(r))),
        live_readers_per_stream_max: sec.max_live_readers_per_stream,
        live_readers_per_token_max: sec.max_live_readers_per_token,
    };
    let (app, admin) = picomq_http::routers(engine.clone(), http);
    if let Some(admin_listener) = admin_port {
        let addr = admin_listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(admin_listen = %addr, "serving /metrics, /healthz and /readyz");
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(admin_listener, admin)
                .with_graceful_shutdown(async move { stop.fired().await })
                .await
        });
    }
    if let Some(tls) = &tls {
        reload_tls_on_sighup(tls.clone())?;
    }
    tracing::info!(
        listen = %local,
        epoch = engine.epoch(),
        tls = tls.is_some(),
        auth = ?args.security.auth,
        "picomq serving (ready)"
    );
    let options = ServerOptions {
        header_read_timeout: sec.header_read_timeout,
        header_bytes_max: sec.max_header_bytes,
        connections_max: sec.max_connections,
        tls,
        peer_address: sec.rate_limit_ip.is_some(),
    };
    let server = picomq_http::server::serve(listener, app, options, shutdown.clone());
    let mut server = tokio::spawn(server);

    let signal = tokio::select! {
        signal = signals.recv() => signal,
        r = &mut server => return Err(format!("server stopped: {r:?}")),
    };
    let started = Instant::now();
    let drain_deadline = started + args.shutdown_timeout * 3 / 4;
    let deadline = started + args.shutdown_timeout;
    tracing::info!(signal, timeout = ?args.shutdown_timeout, "shutting down: refusing new connections, ending live reads, finishing in-flight requests");
    // Stops the accept loop and asks every connection to close once its request is
    // answered; SSE and long-polls answer at once.
    trigger.fire();
    tokio::select! {
        _ = &mut server => tracing::info!(elapsed = ?started.elapsed(), "all connections closed"),
        _ = tokio::time::sleep_until(drain_deadline) => {
            tracing::warn!("requests still running at the drain deadline are cut off (not acknowledged)");
        }
        signal = signals.recv() => {
            tracing::warn!(signal, "second signal: exiting without flushing the WAL (nothing unflushed was acknowledged)");
            return Err("interrupted during shutdown".into());
        }
    }
    server.abort();
    tokio::select! {
        _ = engine.shutdown() => {
            tracing::info!(elapsed = ?started.elapsed(), "WAL flushed; bye");
            Ok(())
        }
        _ = tokio::time::sleep_until(deadline) => Err(format!(
            "the WAL did not flush within --shutdown-timeout {:?}; appends that were not flushed were not acknowledged",
            args.shutdown_timeout
        )),
        signal = signals.recv() => {
            tracing::warn!(signal, "second signal: exiting before the WAL flush finished (nothing unflushed was acknowledged)");
            Err("interrupted during shutdown".into())
        }
    }
}

/// SIGHUP reads the TLS certificate and key again; a bad file keeps the old ones.
fn reload_tls_on_sighup(tls: Arc<Tls>) -> Result<(), String> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup())
            .map_err(|e| format!("installing the SIGHUP handler: {e}"))?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: TLS reload failed; keeping the previous certificate")
                    }
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = tls;
    Ok(())
}

/// The stand-in server on a duplicate of the listening socket while recovery runs.
struct Recovering {
    stop: ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

/// Starts the stand-in on a duplicate of `listener`; hands the listener back for the
/// real server.
fn serve_while_recovering(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<Tls>>,
) -> Result<(tokio::net::TcpListener, Recovering), String> {
    let io = |e: std::io::Error| format!("--listen: duplicating the socket: {e}");
    // `into_std` leaves the socket non-blocking, as `from_std` requires.
    let listener = listener.into_std().map_err(io)?;
    let dup = listener.try_clone().map_err(io)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(io)?;
    let dup = tokio::net::TcpListener::from_std(dup).map_err(io)?;
    let (stop, stopped) = ShutdownSignal::new();
    let options = ServerOptions {
        tls,
        ..ServerOptions::default()
    };
    let server =
        picomq_http::server::serve(dup, picomq_http::recovering_router(), options, stopped);
    let recovering = Recovering {
        stop,
        task: tokio::spawn(server),
    };
    Ok((listener, recovering))
}

impl Recovering {
    /// Stops accepting (connections waiting in the backlog go to the real server) and
    /// closes the stand-in's connections; clients see them close and reconnect.
    async fn stop(self) {
        self.stop.fire();
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            tracing::warn!("a connection opened during recovery did not close within 5s");
        }
    }
}

/// SIGTERM and SIGINT, caught from the start so neither kills the process mid-way.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, String> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let install =
                |kind| signal(kind).map_err(|e| format!("installing signal handlers: {e}"));
            Ok(Signals {
                term: install(SignalKind::terminate())?,
                int: install(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The name of the next signal received.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}
