//! `picomq serve`: configuration (flags with PICOMQ_* environment equivalents),
//! start-up (recovery before listening), and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use picomq_engine::{meta::Meta, Engine, EngineConfig, WalConfig};
use picomq_http::HttpConfig;

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

#[derive(Args, Debug)]
pub struct ServeArgs {
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
    /// Object-store write budget in PUTs per second (unlimited if unset). At the
    /// budget, batches grow instead of PUTs multiplying.
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
    /// Accepted-but-not-durable bytes; beyond this appends get 503.
    #[arg(long, env = "PICOMQ_WAL_BUFFER_BYTES", default_value_t = WalConfig::default().buffer_bytes_max)]
    pub wal_buffer_bytes: usize,
    /// Testing and benchmarks only: add this latency to every object-store request
    /// (e.g. 20ms to behave like S3 on a local directory).
    #[arg(long, env = "PICOMQ_STORE_LATENCY", value_parser = duration)]
    pub store_latency: Option<Duration>,
    /// Log format: text or json.
    #[arg(long, env = "PICOMQ_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Log filter, e.g. info or picomq=debug.
    #[arg(long, env = "PICOMQ_LOG", default_value = "info")]
    pub log: String,
    #[command(flatten)]
    pub storage: crate::storage::StorageArgs,
}

fn init_logging(args: &ServeArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .map_err(|e| format!("--log {:?}: {e}", args.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
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
    if let Err(e) = init_logging(&args) {
        eprintln!("picomq: {e}");
        return ExitCode::from(2);
    }
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("picomq: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let mut config = engine_config(&args)?;
    args.storage.configure(&mut config);
    let data_dir = std::path::absolute(&args.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    let store_url = args
        .store
        .clone()
        .unwrap_or_else(|| format!("file://{}", data_dir.join("objects").display()));
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
    if let Some(latency) = args.store_latency {
        tracing::warn!(
            ?latency,
            "object-store latency injection is on (--store-latency)"
        );
    }
    let meta = Meta::open(&meta_url)
        .await
        .map_err(|e| format!("--meta: {e}"))?;
    // Recovery runs before the listener opens: a ready port means a recovered node.
    let engine = Engine::open_instrumented(config, opened.store, opened.stats, meta)
        .await
        .map_err(|e| format!("recovery failed: {e}"))?;
    let http = HttpConfig {
        long_poll_timeout: args.long_poll_timeout,
        sse_max_duration: args.sse_max_duration,
    };
    let (app, admin) = picomq_http::routers(engine.clone(), http);
    if let Some(addr) = args.storage.admin_listen {
        let admin_listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("--admin-listen {addr}: {e}"))?;
        tracing::info!(admin_listen = %addr, "serving /metrics, /healthz and /readyz");
        tokio::spawn(async move { axum::serve(admin_listener, admin).await });
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %local, store = %store_url, meta = %meta_url, epoch = engine.epoch(), "picomq serving");
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    });
    let server = tokio::spawn(async move { server.await });
    shutdown_signal().await;
    tracing::info!("shutting down: refusing new connections, finishing in-flight requests");
    let _ = stop_tx.send(true);
    // In-flight requests get a bounded grace period; live readers are cut after it.
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    match tokio::time::timeout(Duration::from_secs(20), engine.shutdown()).await {
        Ok(()) => tracing::info!("WAL flushed; bye"),
        Err(_) => {
            tracing::warn!("WAL did not flush within 20s; unflushed appends were not acknowledged")
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
