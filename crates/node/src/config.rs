//! Everything a node is configured with, and its defaults: the node's own settings
//! here, the engine's in `picomq_engine::config`, the edge's in `picomq_http`
//! (`HttpConfig`, `ServerOptions`, `AuthConfig`). Each default is stated once, in
//! those `Default` impls; `picomq serve`'s flags and its TOML file read theirs from
//! [`Config::default`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use picomq_engine::cluster::ClusterConfig;
use picomq_engine::EngineConfig;
use picomq_http::auth::AuthConfig;
use picomq_http::server::ServerOptions;
use picomq_http::HttpConfig;

/// Whether requests need a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Every request needs a token (or a signed read token for reads).
    Required,
    /// No authentication: anyone who reaches the port may do anything.
    Off,
}

/// `--wal-overlap-after`: when another WAL upload may start while one is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalOverlap {
    /// Only once `pipeline_bytes_min` is buffered.
    Off,
    /// Once the newest upload in flight has run this long (zero: at once).
    After(Duration),
}

impl WalOverlap {
    /// The engine's `WalConfig::overlap_after`.
    pub fn after(self) -> Option<Duration> {
        match self {
            WalOverlap::Off => None,
            WalOverlap::After(after) => Some(after),
        }
    }
}

impl std::str::FromStr for WalOverlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(WalOverlap::Off);
        }
        picomq_engine::units::parse_duration(s)
            .map(WalOverlap::After)
            .map_err(|e| format!("{e} (or `off`)"))
    }
}

impl std::fmt::Display for WalOverlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalOverlap::Off => f.write_str("off"),
            WalOverlap::After(d) => f.write_str(&picomq_engine::units::format_duration(*d)),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    /// The API port.
    pub listen: SocketAddr,
    /// Also serve /metrics, /healthz and /readyz here.
    pub admin_listen: Option<SocketAddr>,
    /// Where the default object store and metadata database live.
    pub data_dir: PathBuf,
    /// Object store URL; `None`: `file://DATA_DIR/objects`.
    pub store: Option<String>,
    /// A store of its own for WAL objects; `None`: the object store.
    pub wal_store: Option<String>,
    /// Metadata database URL; `None`: `sqlite://DATA_DIR/meta.sqlite`, in memory with
    /// a `memory://` store.
    pub meta: Option<String>,
    /// Testing and benchmarks: latency added to every object-store request.
    pub store_latency: Option<Duration>,
    /// Testing: the share of object-store requests that fail (transiently).
    pub store_error_rate: Option<f64>,
    /// Compaction's object-store request budget; `None`: the engine's default on a
    /// bucket, unlimited when every store is local (their requests cost nothing).
    pub compaction_requests_per_sec: Option<f64>,
    /// When a WAL upload may start while others are in flight; `None`: at once
    /// where the WAL is a local log (syncs back to back), the engine's setting
    /// (off unless set there) on a bucket.
    pub wal_overlap: Option<WalOverlap>,
    /// WAL uploads in flight at once; `None`: 2 where the WAL is a local log, the
    /// engine's setting on a bucket.
    pub wal_uploads_in_flight: Option<usize>,
    pub engine: EngineConfig,
    /// The edge's settings (its shutdown signal and tokens are the node's own at
    /// start, whatever is set here).
    pub http: HttpConfig,
    /// Connection limits (the TLS setting is `tls` below).
    pub server: ServerOptions,
    pub auth: AuthMode,
    pub auth_limits: AuthConfig,
    /// File holding the bootstrap admin token (with `auth` required).
    pub bootstrap_token_file: Option<PathBuf>,
    /// With `auth` off, listen on a non-loopback address anyway.
    pub allow_unauthenticated_public: bool,
    /// PEM certificate chain and private key: serve HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Upper bound on a graceful stop: in-flight requests get three quarters of it,
    /// the WAL flush the rest.
    pub shutdown_timeout: Duration,
    /// A cluster member's base URL for the other members; `None`: the scheme and
    /// the address it listens on (which must then be a specific address).
    pub advertise: Option<String>,
    /// A cluster member's stable name (its share of the streams follows it across
    /// restarts); `None`: the advertised URL's host and port.
    pub node_id: Option<String>,
    /// How a member sends requests for streams another member serves.
    pub route: picomq_http::cluster::RouteMode,
    /// How long a member's lease lasts unrenewed (others take over after it).
    pub lease: Duration,
    /// Also serve the Kafka wire protocol (`--kafka-listen`).
    pub kafka: Option<picomq_kafka::KafkaConfig>,
}

/// WAL uploads in flight at once on a local log: two syncs overlap; four gained
/// the batched appends little more and cost the many-streams shape 5-10% and twice
/// its p99 (docs/performance.md, "Syncs back to back").
const LOG_UPLOADS_IN_FLIGHT: usize = 2;

/// The packer's objects on a local data store (`PackConfig::object_bytes_max`).
const LOCAL_PACK_BYTES: usize = 8 << 20;

/// Bounds of `--lease`: renewals must fit in it several times over Postgres round
/// trips, and a dead member's streams wait that long.
const LEASE_MIN: Duration = Duration::from_secs(1);
const LEASE_MAX: Duration = Duration::from_secs(300);

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 4437)),
            admin_listen: None,
            data_dir: PathBuf::from("./picomq-data"),
            store: None,
            wal_store: None,
            meta: None,
            store_latency: None,
            store_error_rate: None,
            compaction_requests_per_sec: None,
            wal_overlap: None,
            wal_uploads_in_flight: None,
            engine: EngineConfig::default(),
            http: HttpConfig::default(),
            server: ServerOptions::default(),
            auth: AuthMode::Off,
            auth_limits: AuthConfig::default(),
            bootstrap_token_file: None,
            allow_unauthenticated_public: false,
            tls: None,
            shutdown_timeout: Duration::from_secs(20),
            advertise: None,
            node_id: None,
            route: picomq_http::cluster::RouteMode::Proxy,
            lease: Duration::from_secs(5),
            kafka: None,
        }
    }
}

impl Config {
    /// A node on a fresh directory and an ephemeral loopback port, everything else
    /// default (tests and embedding).
    pub fn ephemeral(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.into(),
            ..Config::default()
        }
    }

    /// Refuses settings that cannot work, with the flag to blame.
    pub fn check(&self) -> Result<(), String> {
        let public = !self.listen.ip().is_loopback();
        if self.auth == AuthMode::Off && public && !self.allow_unauthenticated_public {
            return Err(format!(
                "refusing to listen on {} with --auth off: anyone reaching it could read, write and delete every stream. Use --auth required (with --bootstrap-token-file), listen on a loopback address, or pass --allow-unauthenticated-public if this is intended",
                self.listen
            ));
        }
        if let Some(k) = &self.kafka {
            if self.auth == AuthMode::Off
                && !k.listen.ip().is_loopback()
                && !self.allow_unauthenticated_public
            {
                return Err(format!(
                    "refusing to serve Kafka on {} with --auth off: anyone reaching it could read and write every stream. Use --auth required (clients then authenticate with SASL), a loopback address, or --allow-unauthenticated-public",
                    k.listen
                ));
            }
            if k.listen.ip().is_unspecified() && k.advertise.is_none() {
                return Err(format!(
                    "--kafka-listen {} is every address: give --kafka-advertise HOST:PORT, the address Kafka clients reach this node at",
                    k.listen
                ));
            }
            k.advertised(k.listen)?;
        }
        if self.auth == AuthMode::Off && self.bootstrap_token_file.is_some() {
            return Err("--bootstrap-token-file needs --auth required".into());
        }
        let e = &self.engine;
        for (name, v) in [
            ("wal-max-object-bytes", e.wal.flush_bytes_max),
            (
                "wal-max-inflight",
                self.wal_uploads_in_flight
                    .unwrap_or(e.wal.uploads_in_flight_max),
            ),
            ("wal-buffer-bytes", e.wal.buffer_bytes_max),
            ("max-append-bytes", e.append_bytes_max),
            ("max-read-bytes", e.read_bytes_max),
            ("max-name-bytes", e.stream_name_bytes_max),
            ("max-active-streams", e.active_streams_max),
            (
                "max-live-readers-per-stream",
                self.http.live_readers_per_stream_max,
            ),
            (
                "max-live-readers-per-token",
                self.http.live_readers_per_token_max,
            ),
            ("max-tokens", self.auth_limits.tokens_max),
            ("max-header-bytes", self.server.header_bytes_max),
            ("max-connections", self.server.connections_max),
        ] {
            if v == 0 {
                return Err(format!("--{name} must be greater than 0"));
            }
        }
        if let Some(rate) = e.wal.max_writes_per_sec {
            if !(rate.is_finite() && rate > 0.0) {
                return Err("--max-writes-per-sec must be a positive number".into());
            }
        }
        if self
            .store_error_rate
            .is_some_and(|r| !(0.0..1.0).contains(&r))
        {
            return Err("--store-error-rate must be at least 0 and below 1".into());
        }
        if self.auth_limits.streams_per_namespace_max == Some(0) {
            return Err("--max-streams-per-namespace must be greater than 0".into());
        }
        if !(LEASE_MIN..=LEASE_MAX).contains(&self.lease) {
            return Err(format!(
                "--lease must be between {}s and {}s",
                LEASE_MIN.as_secs(),
                LEASE_MAX.as_secs()
            ));
        }
        if let Some(url) = &self.advertise {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || url.parse::<axum::http::Uri>().is_err()
            {
                return Err(format!(
                    "--advertise {url:?}: give a base URL such as http://10.0.0.5:4437"
                ));
            }
        }
        if let Some(id) = &self.node_id {
            if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err("--node-id must be 1 to 128 printable ASCII characters".into());
            }
        }
        if self.engine.read_budget < Duration::from_millis(10) {
            return Err("--read-budget must be at least 10ms".into());
        }
        for (name, d) in [
            ("header-read-timeout", self.server.header_read_timeout),
            ("body-read-timeout", self.http.body_read_timeout),
            ("read-token-max-ttl", self.auth_limits.read_token_ttl_max),
        ] {
            if d < Duration::from_millis(1) {
                return Err(format!("--{name} must be at least 1ms"));
            }
        }
        Ok(())
    }

    /// The object store's URL.
    pub fn store_url(&self) -> Result<String, String> {
        Ok(match &self.store {
            Some(url) => url.clone(),
            None => format!(
                "file://{}",
                self.absolute_data_dir()?.join("objects").display()
            ),
        })
    }

    /// The metadata database's URL (creating the data directory it lives in).
    pub fn meta_url(&self) -> Result<String, String> {
        if let Some(url) = &self.meta {
            return Ok(url.clone());
        }
        if self.store_url()?.starts_with("memory:") {
            return Ok("sqlite::memory:".into());
        }
        let dir = self.absolute_data_dir()?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("--data-dir {}: {e}", dir.display()))?;
        Ok(format!("sqlite://{}", dir.join("meta.sqlite").display()))
    }

    /// Whether the node keeps anything in `--data-dir` (its objects or its SQLite).
    pub fn uses_data_dir(&self) -> bool {
        let memory = self
            .store
            .as_deref()
            .is_some_and(|s| s.starts_with("memory:"));
        self.store.is_none() || (self.meta.is_none() && !memory)
    }

    /// `--data-dir` as an absolute path.
    pub fn absolute_data_dir(&self) -> Result<PathBuf, String> {
        std::path::absolute(&self.data_dir).map_err(|e| format!("--data-dir: {e}"))
    }

    /// Whether the metadata store is shared by a cluster (Postgres).
    pub fn is_cluster(&self) -> bool {
        self.meta
            .as_deref()
            .is_some_and(picomq_engine::meta::is_shared_url)
    }

    /// A cluster member's settings, for one listening at `listen` (and for Kafka
    /// clients at `kafka`, when it has a Kafka listener).
    pub fn cluster_config(
        &self,
        listen: SocketAddr,
        kafka: Option<SocketAddr>,
    ) -> Result<Option<ClusterConfig>, String> {
        if !self.is_cluster() {
            if self.advertise.is_some() || self.node_id.is_some() {
                return Err(
                    "--advertise and --node-id are for cluster members: give --meta postgres://..."
                        .into(),
                );
            }
            return Ok(None);
        }
        let advertise = match &self.advertise {
            Some(url) => url.trim_end_matches('/').to_string(),
            None if listen.ip().is_unspecified() => {
                return Err(format!(
                    "listening on {listen} (every address): give --advertise, the URL other nodes reach this one at"
                ))
            }
            None => {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{listen}")
            }
        };
        let node_id = match &self.node_id {
            Some(id) => id.clone(),
            None => advertise
                .split_once("://")
                .map_or(advertise.as_str(), |(_, rest)| rest)
                .trim_end_matches('/')
                .to_string(),
        };
        let kafka = match (&self.kafka, kafka) {
            (Some(k), Some(bound)) => {
                let (host, port) = k.advertised(bound)?;
                Some(if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                })
            }
            _ => None,
        };
        Ok(Some(ClusterConfig {
            node_id,
            advertise,
            lease: self.lease,
            kafka,
        }))
    }

    /// The engine's settings with what depends on the stores filled in.
    pub fn engine_config(&self) -> Result<EngineConfig, String> {
        let mut engine = self.engine.clone();
        engine.store_name = picomq_engine::store::name(&self.store_url()?);
        let local = |url: &str| url.starts_with("file:") || url.starts_with("memory:");
        let store_local = local(&self.store_url()?);
        let wal_local = self.wal_store.as_deref().map_or(store_local, local);
        let local = store_local && wal_local;
        // WAL rows of a piece's size or more stay in WAL objects for good, where the
        // WAL objects are the data store's: in a bucket an object lives as long as
        // something points into it, but the local log reclaims a file only once
        // every entry in it is gone, and a WAL store of its own (chosen for its
        // latency, not to keep data) keeps only what is not packed yet.
        engine.compaction.wal_rows_final_bytes = (!store_local && self.wal_store.is_none())
            .then_some(engine.compaction.chunk_bytes_max as u64);
        // Packs written through into the block cache save a GET of a remote store;
        // reading a local file back costs a copy from the page cache, not a round
        // trip, and a second copy of every pack in memory would cost more.
        engine.pack.write_through = !local || self.store_latency.is_some();
        // On local disks, where a file costs no request, packs of 8 MiB rather
        // than 64: a pack is encoded whole before it is written, and a 64 MiB
        // file's sync shares the disk with the WAL's. Under 1 KiB appends this
        // took 30-50 MiB off the peak RSS and half off the append p99
        // (docs/performance.md). Injected latency stands for a bucket, whose
        // PUTs cost per request.
        if store_local && self.store_latency.is_none() {
            engine.pack.object_bytes_max = LOCAL_PACK_BYTES;
        }
        // A local log syncs each upload: two in flight, the next started at once,
        // keep the syncs back to back, which a VM serves far faster than spaced
        // ones (docs/performance.md, "Syncs back to back"). A bucket's PUTs cost
        // per request: the next waits for 1 MiB or the overlap set.
        let log = wal_local && self.store_latency.is_none();
        engine.wal.overlap_after = match self.wal_overlap {
            Some(overlap) => overlap.after(),
            None if log => Some(Duration::ZERO),
            None => engine.wal.overlap_after,
        };
        engine.wal.uploads_in_flight_max = match self.wal_uploads_in_flight {
            Some(n) => n,
            None if log => LOG_UPLOADS_IN_FLIGHT,
            None => engine.wal.uploads_in_flight_max,
        };
        engine.compaction.requests_per_sec = match self.compaction_requests_per_sec {
            Some(rate) => rate,
            // The local store's requests are reads and writes of local files: only
            // the byte budget means anything there.
            None if local => f64::INFINITY,
            None => EngineConfig::default().compaction.requests_per_sec,
        };
        Ok(engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(store: &str, wal_store: Option<&str>, set: Option<f64>) -> f64 {
        let config = Config {
            store: Some(store.into()),
            wal_store: wal_store.map(str::to_string),
            compaction_requests_per_sec: set,
            ..Config::default()
        };
        config.engine_config().unwrap().compaction.requests_per_sec
    }

    #[test]
    fn compaction_request_budget_is_unlimited_only_on_local_stores() {
        assert_eq!(
            budget("file:///var/lib/picomq/objects", None, None),
            f64::INFINITY
        );
        assert_eq!(budget("memory://", None, None), f64::INFINITY);
        assert_eq!(budget("s3://bucket/prefix", None, None), 50.0);
        assert_eq!(budget("file:///x", Some("s3://wal"), None), 50.0);
        assert_eq!(budget("file:///x", None, Some(7.0)), 7.0);
    }

    #[test]
    fn packs_go_into_the_block_cache_only_where_the_store_is_remote() {
        let through = |store: &str, wal_store: Option<&str>, latency: Option<u64>| {
            let config = Config {
                store: Some(store.into()),
                wal_store: wal_store.map(str::to_string),
                store_latency: latency.map(Duration::from_millis),
                ..Config::default()
            };
            config.engine_config().unwrap().pack.write_through
        };
        assert!(!through("file:///var/lib/picomq/objects", None, None));
        assert!(!through("memory://", None, None));
        assert!(through("s3://bucket/prefix", None, None));
        assert!(through("file:///x", Some("s3://wal"), None));
        // Injected latency stands for a remote store.
        assert!(through("file:///x", None, Some(20)));
    }

    #[test]
    fn packs_are_smaller_only_where_a_put_costs_nothing() {
        let max = |store: &str, latency: Option<u64>| {
            let config = Config {
                store: Some(store.into()),
                store_latency: latency.map(Duration::from_millis),
                ..Config::default()
            };
            config.engine_config().unwrap().pack.object_bytes_max
        };
        assert_eq!(max("file:///var/lib/picomq/objects", None), 8 << 20);
        assert_eq!(max("memory://", None), 8 << 20);
        assert_eq!(max("s3://bucket/prefix", None), 64 << 20);
        assert_eq!(max("file:///x", Some(20)), 64 << 20);
    }

    #[test]
    fn big_wal_rows_stay_only_in_a_bucket_that_is_also_the_data_store() {
        let stay = |store: &str, wal_store: Option<&str>| {
            let config = Config {
                store: Some(store.into()),
                wal_store: wal_store.map(str::to_string),
                ..Config::default()
            };
            config
                .engine_config()
                .unwrap()
                .compaction
                .wal_rows_final_bytes
        };
        assert_eq!(stay("file:///var/lib/picomq/objects", None), None);
        assert_eq!(stay("memory://", None), None);
        assert_eq!(stay("s3://bucket/prefix", None), Some(1 << 20));
        assert_eq!(stay("file:///x", Some("s3://wal")), None);
        assert_eq!(stay("s3://bucket/prefix", Some("s3://express/wal")), None);
    }

    #[test]
    fn a_local_log_syncs_back_to_back_and_a_bucket_waits_unless_set() {
        let wal = |store: &str, overlap: Option<&str>, in_flight: Option<usize>| {
            let config = Config {
                store: Some(store.into()),
                wal_overlap: overlap.map(|s| s.parse().unwrap()),
                wal_uploads_in_flight: in_flight,
                ..Config::default()
            };
            let wal = config.engine_config().unwrap().wal;
            (wal.overlap_after, wal.uploads_in_flight_max)
        };
        let bucket = EngineConfig::default().wal.uploads_in_flight_max;
        let at_once = Some(Duration::ZERO);
        assert_eq!(
            wal("file:///var/lib/picomq/objects", None, None),
            (at_once, 2)
        );
        assert_eq!(wal("memory://", None, None), (at_once, 2));
        assert_eq!(wal("s3://bucket/prefix", None, None), (None, bucket));
        assert_eq!(wal("file:///x", Some("off"), Some(4)), (None, 4));
        assert_eq!(
            wal("s3://bucket", Some("10ms"), Some(8)),
            (Some(Duration::from_millis(10)), 8)
        );
        // A local store made to answer like a bucket (benchmarks) is one.
        let slow = Config {
            store: Some("file:///x".into()),
            store_latency: Some(Duration::from_millis(20)),
            ..Config::default()
        };
        let slow = slow.engine_config().unwrap().wal;
        assert_eq!(
            (slow.overlap_after, slow.uploads_in_flight_max),
            (None, bucket)
        );
        // The WAL on a bucket of its own, the data local: the WAL's store decides.
        let wal_in_bucket = Config {
            store: Some("file:///x".into()),
            wal_store: Some("s3://wal-bucket".into()),
            ..Config::default()
        };
        assert_eq!(
            wal_in_bucket.engine_config().unwrap().wal.overlap_after,
            None
        );
        let set = |s: &str| s.parse::<WalOverlap>().unwrap().after();
        assert_eq!(set("off"), None);
        assert_eq!(set("OFF"), None);
        assert_eq!(set("0"), Some(Duration::ZERO));
        assert_eq!(set("10ms"), Some(Duration::from_millis(10)));
        for bad in ["", "soon", "-1ms", "10 parsecs"] {
            let err = bad.parse::<WalOverlap>().unwrap_err();
            assert!(err.contains("off"), "{bad}: {err}");
        }
        assert_eq!(WalOverlap::Off.to_string(), "off");
        assert_eq!(WalOverlap::After(Duration::ZERO).to_string(), "0s");
    }

    #[test]
    fn open_public_ports_need_a_decision() {
        let public = Config {
            listen: "0.0.0.0:4437".parse().unwrap(),
            ..Config::default()
        };
        assert!(public.check().unwrap_err().contains("--auth off"));
        let allowed = Config {
            allow_unauthenticated_public: true,
            ..public.clone()
        };
        assert!(allowed.check().is_ok());
        assert!(Config::default().check().is_ok());
    }
}
