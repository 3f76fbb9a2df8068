//! `picomq serve`: flags (with PICOMQ_* environment equivalents and the optional
//! TOML file read by `config_file`) mapped onto a node's [`Config`], whose defaults
//! they show; logging; and signals (SIGTERM/SIGINT stop the node gracefully, a
//! second one exits at once, SIGHUP reloads the TLS certificate). The node itself is
//! `picomq_node`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use picomq_engine::units::{HumanDuration, Size};
use picomq_http::Cors;
use picomq_node::{AuthMode, Config, Node};

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

/// The defaults every flag shows and falls back to.
fn defaults() -> Config {
    Config::default()
}

fn human(d: Duration) -> HumanDuration {
    HumanDuration(d)
}

fn size(bytes: usize) -> Size {
    Size(bytes as u64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthArg {
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
    pub auth: AuthArg,
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
    #[arg(long, env = "PICOMQ_MAX_LIVE_READERS_PER_STREAM", default_value_t = defaults().http.live_readers_per_stream_max)]
    pub max_live_readers_per_stream: usize,
    /// Concurrent live readers (long-poll and SSE) with one token.
    #[arg(long, env = "PICOMQ_MAX_LIVE_READERS_PER_TOKEN", default_value_t = defaults().http.live_readers_per_token_max)]
    pub max_live_readers_per_token: usize,
    /// Where clients reach this server (e.g. https://streams.example.com), for the
    /// callback and JWKS URLs subscription bodies carry [default: from each request's
    /// Host and X-Forwarded-Host].
    #[arg(long, env = "PICOMQ_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// Deliver webhooks to private, loopback and link-local addresses too, and over
    /// http:// (receivers inside your own network) [default: off: https:// to public
    /// addresses; http://localhost too only with --auth off].
    #[arg(long, env = "PICOMQ_WEBHOOK_ALLOW_PRIVATE")]
    pub webhook_allow_private: bool,
    /// Streams a namespaced token may have under its namespace [default: unlimited].
    #[arg(long, env = "PICOMQ_MAX_STREAMS_PER_NAMESPACE")]
    pub max_streams_per_namespace: Option<u64>,
    /// Tokens the server holds (revoked ones included).
    #[arg(long, env = "PICOMQ_MAX_TOKENS", default_value_t = defaults().auth_limits.tokens_max)]
    pub max_tokens: usize,
    /// Longest life of a signed read token (for EventSource query parameters).
    #[arg(long, env = "PICOMQ_READ_TOKEN_MAX_TTL", default_value_t = human(defaults().auth_limits.read_token_ttl_max))]
    pub read_token_max_ttl: HumanDuration,
    /// A request head (and TLS handshake) must arrive within this long; idle
    /// keep-alive connections close after it too (defeats slow-loris clients).
    #[arg(long, env = "PICOMQ_HEADER_READ_TIMEOUT", default_value_t = human(defaults().server.header_read_timeout))]
    pub header_read_timeout: HumanDuration,
    /// What serves plain-TCP HTTP/1.1 connections: picomq (the server's own loop) or
    /// hyper. TLS and HTTP/2 connections are always served by hyper.
    #[arg(long, env = "PICOMQ_HTTP1_SERVER", default_value = "picomq", value_parser = ["picomq", "hyper"])]
    pub http1_server: String,
    /// Whether the server's own HTTP/1.1 loop sends mapped ranges of the local
    /// store's files (catch-up reads of packs) with sendfile: on or off.
    #[arg(long, env = "PICOMQ_HTTP1_SENDFILE", default_value = "on", value_parser = ["on", "off"])]
    pub http1_sendfile: String,
    /// A request body must arrive within this long, else 408.
    #[arg(long, env = "PICOMQ_BODY_READ_TIMEOUT", default_value_t = human(defaults().http.body_read_timeout))]
    pub body_read_timeout: HumanDuration,
    /// Largest request head (request line plus headers), in bytes.
    #[arg(long, env = "PICOMQ_MAX_HEADER_BYTES", default_value_t = size(defaults().server.header_bytes_max))]
    pub max_header_bytes: Size,
    /// Client connections open at once; beyond it new ones wait in the backlog.
    #[arg(long, env = "PICOMQ_MAX_CONNECTIONS", default_value_t = defaults().server.connections_max)]
    pub max_connections: usize,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TOML file of options, keyed by flag name (`listen = "0.0.0.0:4437"`). Flags
    /// and PICOMQ_* variables override it [default: none].
    #[arg(long, env = "PICOMQ_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "PICOMQ_LISTEN", default_value_t = defaults().listen)]
    pub listen: SocketAddr,
    /// Directory for the default object store and metadata database.
    #[arg(long, env = "PICOMQ_DATA_DIR", default_value_os_t = defaults().data_dir)]
    pub data_dir: PathBuf,
    /// Object store URL: file:///path, memory://, s3://bucket/prefix, gs://, az://
    /// [default: file://DATA_DIR/objects].
    #[arg(long, env = "PICOMQ_STORE")]
    pub store: Option<String>,
    /// Metadata database URL: sqlite://path, or postgres://USER:PASS@HOST:PORT/DB to
    /// run as a cluster member (nodes sharing one Postgres and one bucket)
    /// [default: sqlite://DATA_DIR/meta.sqlite; in-memory when --store is memory://].
    #[arg(long, env = "PICOMQ_META")]
    pub meta: Option<String>,
    /// Cluster members: the base URL other nodes reach this one at [default:
    /// http://LISTEN (https with --tls-cert), when LISTEN is a specific address].
    #[arg(long, env = "PICOMQ_ADVERTISE", value_name = "URL")]
    pub advertise: Option<String>,
    /// Cluster members: a stable name for this node; its share of the streams
    /// follows the name across restarts [default: the advertised host:port].
    #[arg(long, env = "PICOMQ_NODE_ID", value_name = "NAME")]
    pub node_id: Option<String>,
    /// Cluster members: how a request for a stream another node serves gets there:
    /// proxy (forwarded, its answer streamed back) or redirect (307 to that node).
    #[arg(long, env = "PICOMQ_ROUTE", default_value_t = defaults().route)]
    pub route: picomq_http::cluster::RouteMode,
    /// Cluster members: how long a node's lease lasts unrenewed (renewed every
    /// fifth of it); once it lapses the others take the node's streams over.
    #[arg(long, env = "PICOMQ_LEASE", default_value_t = human(defaults().lease))]
    pub lease: HumanDuration,
    /// How long a long-poll read waits for new data before answering 204.
    #[arg(long, env = "PICOMQ_LONG_POLL_TIMEOUT", default_value_t = human(defaults().http.long_poll_timeout))]
    pub long_poll_timeout: HumanDuration,
    /// SSE connections are closed after this long; clients resume from their offset.
    #[arg(long, env = "PICOMQ_SSE_MAX_DURATION", default_value_t = human(defaults().http.sse_max_duration))]
    pub sse_max_duration: HumanDuration,
    /// Object-store write budget in PUTs per second. At the budget, batches grow
    /// instead of PUTs multiplying [default: unlimited].
    #[arg(long, env = "PICOMQ_MAX_WRITES_PER_SEC")]
    pub max_writes_per_sec: Option<f64>,
    /// How long an append waits to become durable before failing with 503.
    #[arg(long, env = "PICOMQ_APPEND_TIMEOUT", default_value_t = human(defaults().engine.append_timeout))]
    pub append_timeout: HumanDuration,
    /// Largest request body of one append or create, in bytes (or 8MiB, 512KiB).
    #[arg(long, env = "PICOMQ_MAX_APPEND_BYTES", default_value_t = size(defaults().engine.append_bytes_max))]
    pub max_append_bytes: Size,
    /// Largest response body of one catch-up read, in bytes.
    #[arg(long, env = "PICOMQ_MAX_READ_BYTES", default_value_t = size(defaults().engine.read_bytes_max))]
    pub max_read_bytes: Size,
    /// Longest stream name (URL path), in bytes.
    #[arg(long, env = "PICOMQ_MAX_NAME_BYTES", default_value_t = defaults().engine.stream_name_bytes_max)]
    pub max_name_bytes: usize,
    /// Streams held in memory at once.
    #[arg(long, env = "PICOMQ_MAX_ACTIVE_STREAMS", default_value_t = defaults().engine.active_streams_max)]
    pub max_active_streams: usize,
    /// An idle stream leaves memory after this long.
    #[arg(long, env = "PICOMQ_DORMANCY", default_value_t = human(defaults().engine.dormancy))]
    pub dormancy: HumanDuration,
    /// Recent durable bytes cached in memory per active stream.
    #[arg(long, env = "PICOMQ_TAIL_CACHE_BYTES", default_value_t = size(defaults().engine.tail_cache_bytes_per_stream))]
    pub tail_cache_bytes: Size,
    /// Largest WAL object, in bytes.
    #[arg(long, env = "PICOMQ_WAL_MAX_OBJECT_BYTES", default_value_t = size(defaults().engine.wal.flush_bytes_max))]
    pub wal_max_object_bytes: Size,
    /// WAL uploads in flight at once [default: 2 on a local disk, 4 on a bucket].
    #[arg(long, env = "PICOMQ_WAL_MAX_INFLIGHT")]
    pub wal_max_inflight: Option<usize>,
    /// Start another WAL upload while one is in flight once the newest has run this
    /// long (e.g. 10ms on S3: lower commit latency for more PUTs; `0`: at once, syncs
    /// back to back on a local disk, see docs/performance.md), or `off`: only once
    /// 1 MiB waits [default: 0 on a local disk, off on a bucket].
    #[arg(long, env = "PICOMQ_WAL_OVERLAP_AFTER")]
    pub wal_overlap_after: Option<picomq_node::WalOverlap>,
    /// Accepted-but-not-durable bytes; beyond this appends get 503.
    #[arg(long, env = "PICOMQ_WAL_BUFFER_BYTES", default_value_t = size(defaults().engine.wal.buffer_bytes_max))]
    pub wal_buffer_bytes: Size,
    /// Testing and benchmarks only: add this latency to every object-store request
    /// (e.g. 20ms to behave like S3 on a local directory) [default: none].
    #[arg(long, env = "PICOMQ_STORE_LATENCY")]
    pub store_latency: Option<HumanDuration>,
    /// Testing only: make this share of object-store requests fail, transiently
    /// (e.g. 0.1) [default: none].
    #[arg(long, env = "PICOMQ_STORE_ERROR_RATE", value_name = "SHARE")]
    pub store_error_rate: Option<f64>,
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
    #[arg(long, env = "PICOMQ_SHUTDOWN_TIMEOUT", default_value_t = human(defaults().shutdown_timeout))]
    pub shutdown_timeout: HumanDuration,
    #[command(flatten)]
    pub storage: crate::storage::StorageArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// The Kafka listener (docs/kafka.md).
#[derive(Args, Debug)]
pub struct KafkaArgs {
    /// Also serve the Kafka wire protocol on this address (e.g. 127.0.0.1:9092):
    /// Kafka clients produce to and consume from the same streams [default: off].
    #[arg(long, env = "PICOMQ_KAFKA_LISTEN", value_name = "ADDR")]
    pub kafka_listen: Option<SocketAddr>,
    /// HOST:PORT that Kafka clients reach this node at (what Metadata names)
    /// [default: the --kafka-listen address].
    #[arg(long, env = "PICOMQ_KAFKA_ADVERTISE", value_name = "HOST:PORT")]
    pub kafka_advertise: Option<String>,
    /// Largest Kafka request, in bytes.
    #[arg(long, env = "PICOMQ_KAFKA_MAX_REQUEST_BYTES", default_value_t = size(kafka_defaults().max_request_bytes))]
    pub kafka_max_request_bytes: Size,
    /// Most open Kafka connections.
    #[arg(long, env = "PICOMQ_KAFKA_MAX_CONNECTIONS", default_value_t = kafka_defaults().max_connections)]
    pub kafka_max_connections: usize,
    /// Create a topic the first time a client asks for it (Kafka's
    /// auto.create.topics.enable); the client still needs the create scope.
    #[arg(long, env = "PICOMQ_KAFKA_AUTO_CREATE_TOPICS", default_value_t = kafka_defaults().auto_create_topics, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub kafka_auto_create_topics: bool,
    /// A Kafka request, once begun, must arrive within this; a client that stalls
    /// half way through one is disconnected.
    #[arg(long, env = "PICOMQ_KAFKA_REQUEST_READ_TIMEOUT", default_value_t = human(kafka_defaults().request_read_timeout))]
    pub kafka_request_read_timeout: HumanDuration,
    /// A Kafka connection that sends nothing for this long is closed.
    #[arg(long, env = "PICOMQ_KAFKA_IDLE_TIMEOUT", default_value_t = human(kafka_defaults().idle_timeout))]
    pub kafka_idle_timeout: HumanDuration,
    /// Partitions of an auto-created topic (Kafka's num.partitions).
    #[arg(long, env = "PICOMQ_KAFKA_DEFAULT_PARTITIONS", default_value_t = kafka_defaults().default_partitions, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub kafka_default_partitions: i32,
}

fn kafka_defaults() -> picomq_kafka::KafkaConfig {
    picomq_kafka::KafkaConfig::new(SocketAddr::from(([127, 0, 0, 1], 9092)))
}

impl KafkaArgs {
    fn configure(&self, config: &mut Config) {
        config.kafka = self.kafka_listen.map(|listen| {
            let mut k = picomq_kafka::KafkaConfig::new(listen);
            k.advertise = self.kafka_advertise.clone();
            k.max_request_bytes = self.kafka_max_request_bytes.bytes();
            k.max_connections = self.kafka_max_connections;
            k.auto_create_topics = self.kafka_auto_create_topics;
            k.default_partitions = self.kafka_default_partitions;
            k.request_read_timeout = self.kafka_request_read_timeout.0;
            k.idle_timeout = self.kafka_idle_timeout.0;
            k
        });
    }
}

impl ServeArgs {
    /// The node's configuration these flags describe.
    pub fn config(&self) -> Result<Config, String> {
        let mut config = defaults();
        config.listen = self.listen;
        config.data_dir = self.data_dir.clone();
        config.store = self.store.clone();
        config.meta = self.meta.clone();
        config.advertise = self.advertise.clone();
        config.node_id = self.node_id.clone();
        config.route = self.route;
        config.lease = self.lease.0;
        config.store_latency = self.store_latency.map(|d| d.0);
        config.store_error_rate = self.store_error_rate;
        config.shutdown_timeout = self.shutdown_timeout.0;
        config.wal_overlap = self.wal_overlap_after;
        config.wal_uploads_in_flight = self.wal_max_inflight;
        let e = &mut config.engine;
        e.wal.flush_bytes_max = self.wal_max_object_bytes.bytes();
        e.wal.buffer_bytes_max = self.wal_buffer_bytes.bytes();
        e.wal.max_writes_per_sec = self.max_writes_per_sec;
        e.append_timeout = self.append_timeout.0;
        e.append_bytes_max = self.max_append_bytes.bytes();
        e.read_bytes_max = self.max_read_bytes.bytes();
        e.stream_name_bytes_max = self.max_name_bytes;
        e.active_streams_max = self.max_active_streams;
        e.dormancy = self.dormancy.0;
        e.tail_cache_bytes_per_stream = self.tail_cache_bytes.bytes();
        self.storage.configure(&mut config);
        self.security.configure(&mut config)?;
        self.kafka.configure(&mut config);
        config.http.long_poll_timeout = self.long_poll_timeout.0;
        config.http.sse_max_duration = self.sse_max_duration.0;
        config.check()?;
        Ok(config)
    }
}

impl SecurityArgs {
    fn configure(&self, config: &mut Config) -> Result<(), String> {
        config.auth = match self.auth {
            AuthArg::Required => AuthMode::Required,
            AuthArg::Off => AuthMode::Off,
        };
        config.bootstrap_token_file = self.bootstrap_token_file.clone();
        config.allow_unauthenticated_public = self.allow_unauthenticated_public;
        config.tls = self.tls_cert.clone().zip(self.tls_key.clone());
        let burst = |rps: f64| self.rate_limit_burst.unwrap_or(rps).max(1.0);
        let http = &mut config.http;
        http.cors = Cors::parse(&self.cors_origins).map_err(|e| format!("--cors-origins: {e}"))?;
        http.body_read_timeout = self.body_read_timeout.0;
        http.rate_limit_ip = self.rate_limit_ip.map(|r| (r, burst(r)));
        http.trusted_proxies = self.trusted_proxies.clone();
        http.rate_limit_token = self.rate_limit_token.map(|r| (r, burst(r)));
        http.live_readers_per_stream_max = self.max_live_readers_per_stream;
        http.live_readers_per_token_max = self.max_live_readers_per_token;
        if let Some(url) = &self.public_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "--public-url {url:?}: use an http:// or https:// URL"
                ));
            }
        }
        http.public_url = self.public_url.clone();
        http.subscriptions.webhook_allow_private = self.webhook_allow_private;
        config.auth_limits.tokens_max = self.max_tokens;
        config.auth_limits.read_token_ttl_max = self.read_token_max_ttl.0;
        config.auth_limits.streams_per_namespace_max = self.max_streams_per_namespace;
        config.server.header_read_timeout = self.header_read_timeout.0;
        config.server.header_bytes_max = self.max_header_bytes.bytes();
        config.server.own_http1 = self.http1_server == "picomq";
        config.server.sendfile = self.http1_sendfile == "on";
        config.server.connections_max = self.max_connections;
        Ok(())
    }
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

async fn serve(args: ServeArgs) -> Result<(), String> {
    let mut signals = Signals::install()?;
    let config = args.config()?;
    let mut node = Node::start(config).await?;
    if let Some(tls) = node.tls() {
        reload_tls_on_sighup(tls)?;
    }
    let signal = tokio::select! {
        signal = signals.recv() => signal,
        r = node.wait() => return r.and(Err("the node stopped".into())),
    };
    tracing::info!(signal, "stopping");
    tokio::select! {
        r = node.shutdown() => r,
        signal = signals.recv() => {
            tracing::warn!(signal, "second signal: exiting before the WAL flush finished (nothing unflushed was acknowledged)");
            Err("interrupted during shutdown".into())
        }
    }
}

/// SIGHUP reads the TLS certificate and key again; a bad file keeps the old ones.
fn reload_tls_on_sighup(tls: std::sync::Arc<picomq_http::server::Tls>) -> Result<(), String> {
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
