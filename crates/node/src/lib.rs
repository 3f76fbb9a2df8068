//! A PicoMQ node as a library: [`Node::start`] opens the stores, binds the ports and
//! recovers in the background (the ports answer "alive, not ready" meanwhile), then
//! serves; [`Node::ready`] waits for that, [`Node::shutdown`] stops gracefully.
//! `picomq serve` is flags, logging and signals around this; tests start nodes
//! in-process through it.

pub mod config;
pub mod data_dir;
mod recovering;
pub mod storage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use picomq_engine::meta::Meta;
use picomq_engine::Engine;
use picomq_http::auth::Auth;
use picomq_http::server::{ServerOptions, Tls};
use picomq_http::{ShutdownSignal, ShutdownTrigger};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::{AuthMode, Config, WalOverlap};
use recovering::Recovering;

/// Where a node is in its life.
#[derive(Clone)]
enum State {
    Recovering,
    Ready(Engine),
    Failed(String),
    Stopped,
}

/// A running node.
pub struct Node {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    kafka_addr: Option<SocketAddr>,
    tls: Option<Arc<Tls>>,
    state: watch::Receiver<State>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), String>>>,
}

/// What the node's task owns between start and stop.
struct Started {
    /// Held until the node ends (see `data_dir`); `None` when no data directory is used.
    data_dir_lock: Option<data_dir::DataDirLock>,
    config: Config,
    meta: Meta,
    opened: storage::OpenedStore,
    listener: TcpListener,
    recovering: Recovering,
    admin: Option<(TcpListener, Recovering)>,
    /// Bound at start (a port in use fails the start), served once ready.
    kafka: Option<TcpListener>,
    tls: Option<Arc<Tls>>,
    state: watch::Sender<State>,
}

impl Node {
    /// Checks the configuration, opens the stores and the metadata, binds the ports,
    /// and starts recovering; returns once the ports answer (not yet ready).
    pub async fn start(config: Config) -> Result<Node, String> {
        config.check()?;
        let tls = match &config.tls {
            Some((cert, key)) => Some(Arc::new(Tls::load(cert, key)?)),
            None => None,
        };
        // Before anything in the directory is opened: a second server on it is
        // refused at once rather than after its recovery gives up.
        let data_dir_lock = match config.uses_data_dir() {
            true => Some(data_dir::lock(&config.absolute_data_dir()?)?),
            false => None,
        };
        let store_url = config.store_url()?;
        let meta_url = config.meta_url()?;
        let faults = storage::Faults {
            latency: config.store_latency,
            error_rate: config.store_error_rate,
        };
        let opened = storage::open(
            &store_url,
            config.wal_store.as_deref(),
            config.engine.cost,
            faults,
        )?;
        let cleaned = std::iter::once(store_url.clone()).chain(config.wal_store.clone());
        storage::clean_abandoned_uploads(cleaned.collect());
        if config.store_latency.is_some() || config.store_error_rate.is_some() {
            tracing::warn!(
                latency = ?config.store_latency,
                error_rate = ?config.store_error_rate,
                "object-store fault injection is on (--store-latency, --store-error-rate)"
            );
        }
        let meta = Meta::open(&meta_url)
            .await
            .map_err(|e| format!("--meta: {e}"))?;
        // The port opens before recovery so probes can tell "alive" from "ready":
        // until recovery ends it serves only /healthz, and 503 everywhere else.
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("--listen {}: {e}", config.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (listener, recovering) = recovering::serve(listener, tls.clone())?;
        // The admin port too: liveness probes pointed at it pass during a long recovery.
        let (admin, admin_addr) = match config.admin_listen {
            Some(at) => {
                let admin = TcpListener::bind(at)
                    .await
                    .map_err(|e| format!("--admin-listen {at}: {e}"))?;
                let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
                (Some(recovering::serve(admin, None)?), Some(admin_addr))
            }
            None => (None, None),
        };
        let (kafka, kafka_addr) = match &config.kafka {
            Some(k) => {
                let l = TcpListener::bind(k.listen)
                    .await
                    .map_err(|e| format!("--kafka-listen {}: {e}", k.listen))?;
                let at = l.local_addr().map_err(|e| e.to_string())?;
                (Some(l), Some(at))
            }
            None => (None, None),
        };
        let meta_shown = picomq_engine::meta::redacted_url(&meta_url);
        tracing::info!(listen = %addr, store = %store_url, meta = %meta_shown, "recovering");
        let (state_tx, state) = watch::channel(State::Recovering);
        let (stop, stopped) = oneshot::channel();
        let started = Started {
            data_dir_lock,
            config,
            meta,
            opened,
            listener,
            recovering,
            admin,
            kafka,
            tls: tls.clone(),
            state: state_tx,
        };
        let task = tokio::spawn(started.run(stopped));
        Ok(Node {
            addr,
            admin_addr,
            kafka_addr,
            tls,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The API port's address (the one asked for, or the port the OS chose).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` or `https://` and the API port's address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The Kafka port, if `--kafka-listen` was given.
    pub fn kafka_addr(&self) -> Option<SocketAddr> {
        self.kafka_addr
    }

    /// Waits until the node serves (recovery done): its engine, or why it failed.
    pub async fn ready(&self) -> Result<Engine, String> {
        let mut state = self.state.clone();
        loop {
            match &*state.borrow_and_update() {
                State::Recovering => {}
                State::Ready(engine) => return Ok(engine.clone()),
                State::Failed(e) => return Err(e.clone()),
                State::Stopped => return Err("the node stopped".into()),
            }
            if state.changed().await.is_err() {
                return Err("the node stopped".into());
            }
        }
    }

    /// The TLS configuration, if the node serves HTTPS: `reload` it to pick up a
    /// renewed certificate (new connections use it).
    pub fn tls(&self) -> Option<Arc<Tls>> {
        self.tls.clone()
    }

    /// Resolves when the node ended on its own (its server failed), with why.
    pub async fn wait(&mut self) -> Result<(), String> {
        let Some(task) = self.task.as_mut() else {
            return Ok(());
        };
        let result = task.await.map_err(|e| format!("node task: {e}"))?;
        self.task = None;
        result
    }

    /// Stops gracefully: no new connections, live reads answer at once, in-flight
    /// requests finish (three quarters of `shutdown_timeout`), then the WAL makes
    /// everything accepted durable and indexed (the rest). Stopping during recovery
    /// abandons it (nothing was acknowledged yet).
    pub async fn shutdown(mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait().await
    }
}

impl Started {
    async fn run(self, mut stop: oneshot::Receiver<()>) -> Result<(), String> {
        let state = self.state.clone();
        let result = self.serve(&mut stop).await;
        state.send_replace(match &result {
            Err(e) => State::Failed(e.clone()),
            Ok(()) => State::Stopped,
        });
        result
    }

    async fn serve(self, stop: &mut oneshot::Receiver<()>) -> Result<(), String> {
        let Started {
            data_dir_lock: _held_until_the_node_ends,
            config,
            meta,
            opened,
            listener,
            recovering,
            admin,
            kafka,
            tls,
            state,
        } = self;
        let mut engine_config = config.engine_config()?;
        let listen = listener.local_addr().map_err(|e| e.to_string())?;
        let kafka_bound = match &kafka {
            Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?),
            None => None,
        };
        engine_config.cluster = config.cluster_config(listen, kafka_bound)?;
        let open = recover(engine_config.clone(), opened.clone(), meta.clone());
        let engine = tokio::select! {
            r = open => r?,
            _ = &mut *stop => {
                tracing::info!("stopped during recovery");
                return Ok(());
            }
        };
        recovering.stop().await;
        let admin = match admin {
            Some((listener, recovering)) => {
                recovering.stop().await;
                Some(listener)
            }
            None => None,
        };
        let ports = Ports::new(listener, admin, kafka)?;
        let mut current = match Incarnation::start(&config, engine, &ports, &tls).await {
            Ok(current) => current,
            Err((engine, e)) => {
                engine.shutdown().await;
                return Err(e);
            }
        };
        state.send_replace(State::Ready(current.engine.clone()));
        loop {
            let in_cluster = current.engine.cluster().is_some();
            tokio::select! {
                _ = &mut *stop => break,
                r = &mut current.server => {
                    current.engine.shutdown().await;
                    return Err(format!("server stopped: {r:?}"));
                }
                () = current.engine.fenced(), if in_cluster => {
                    let unbound = current.engine.cluster().and_then(|c| c.unbound().map(str::to_string));
                    if let Some(why) = unbound {
                        // Rejoining would be refused: the store and the metadata no
                        // longer belong to each other. Stop, and say why.
                        current.engine.shutdown().await;
                        return Err(format!("stopped: the store and the metadata no longer belong to each other: {why} (see \"Identity\" in docs/cluster.md)"));
                    }
                    tracing::warn!("this member was taken over by another node (its lease lapsed while it was away): rejoining as a new member");
                    let engine = recover(engine_config.clone(), opened.clone(), meta.clone()).await?;
                    let next = match Incarnation::start(&config, engine, &ports, &tls).await {
                        Ok(next) => next,
                        Err((engine, e)) => {
                            engine.shutdown().await;
                            return Err(e);
                        }
                    };
                    state.send_replace(State::Ready(next.engine.clone()));
                    let old = std::mem::replace(&mut current, next);
                    tokio::spawn(old.retire());
                }
            }
        }
        stop_gracefully(
            &current.engine,
            current.trigger,
            current.server,
            config.shutdown_timeout,
        )
        .await
    }
}

/// The node's listening sockets, kept so that a new incarnation of the node (a
/// cluster member rejoining after it was taken over) serves on the same ports.
struct Ports {
    api: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
    kafka: Option<std::net::TcpListener>,
}

impl Ports {
    fn new(
        api: TcpListener,
        admin: Option<TcpListener>,
        kafka: Option<TcpListener>,
    ) -> Result<Ports, String> {
        let std = |l: TcpListener| l.into_std().map_err(|e| e.to_string());
        Ok(Ports {
            api: std(api)?,
            admin: admin.map(std).transpose()?,
            kafka: kafka.map(std).transpose()?,
        })
    }

    /// A handle on a port for one more accept loop.
    fn listener(l: &std::net::TcpListener) -> Result<TcpListener, String> {
        let l = l.try_clone().map_err(|e| e.to_string())?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        TcpListener::from_std(l).map_err(|e| e.to_string())
    }
}

/// One engine with its edge and accept loops.
struct Incarnation {
    engine: Engine,
    trigger: ShutdownTrigger,
    server: JoinHandle<()>,
}

impl Incarnation {
    /// Opens the tokens, builds the edge and serves on `ports`; on failure the
    /// engine comes back for the caller to shut down.
    async fn start(
        config: &Config,
        engine: Engine,
        ports: &Ports,
        tls: &Option<Arc<Tls>>,
    ) -> Result<Incarnation, (Engine, String)> {
        match Incarnation::serve(config, engine.clone(), ports, tls).await {
            Ok((trigger, server)) => Ok(Incarnation {
                engine,
                trigger,
                server,
            }),
            Err(e) => Err((engine, e)),
        }
    }

    async fn serve(
        config: &Config,
        engine: Engine,
        ports: &Ports,
        tls: &Option<Arc<Tls>>,
    ) -> Result<(ShutdownTrigger, JoinHandle<()>), String> {
        // Tokens load after recovery: it may have restored them from the bucket.
        let auth = open_auth(config, engine.clone()).await?;
        let (trigger, shutdown) = ShutdownSignal::new();
        let mut http = config.http.clone();
        http.shutdown = shutdown.clone();
        if let Some(cluster) = engine.cluster() {
            let key = cluster
                .key()
                .await
                .map_err(|e| format!("reading the cluster key: {e}"))?;
            http.cluster = Some(picomq_http::ClusterRouting {
                mode: config.route,
                key,
            });
            if let Some(auth) = &auth {
                // Tokens made or revoked on other members reach this one.
                tokio::spawn(auth.clone().follow_store(shutdown.clone()));
            }
            tracing::info!(node_id = %cluster.config.node_id, advertise = %cluster.config.advertise, route = %config.route, "cluster member");
        }
        if http.iceberg_io.is_empty() {
            http.iceberg_io = picomq_engine::store::reader_settings(&config.store_url()?);
        }
        // Before any listener: no append is taken before the registry checks it.
        let registry = picomq_http::open_registry(&engine);
        registry.ready().await;
        http.registry = Some(registry);
        if let (Some(kafka), Some(port)) = (&config.kafka, &ports.kafka) {
            let listener = Ports::listener(port)?;
            let serve = picomq_kafka::serve(
                listener,
                engine.clone(),
                auth.clone(),
                tls.clone(),
                kafka.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "the Kafka listener stopped");
                }
            });
        }
        http.auth = auth;
        http.tls = tls.is_some();
        let (app, admin_routes) = picomq_http::routers(engine.clone(), http);
        if let Some(admin) = &ports.admin {
            let admin = Ports::listener(admin)?;
            let addr = admin.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(admin_listen = %addr, "serving /metrics, /healthz and /readyz");
            let stop = shutdown.clone();
            tokio::spawn(async move {
                axum::serve(admin, admin_routes)
                    .with_graceful_shutdown(async move { stop.fired().await })
                    .await
            });
        }
        let listener = Ports::listener(&ports.api)?;
        tracing::info!(
            listen = %listener.local_addr().map_err(|e| e.to_string())?,
            epoch = engine.epoch(),
            tls = tls.is_some(),
            auth = ?config.auth,
            "picomq serving (ready)"
        );
        let options = ServerOptions {
            tls: tls.clone(),
            peer_address: config.http.rate_limit_ip.is_some(),
            ..config.server.clone()
        };
        let server = tokio::spawn(picomq_http::server::serve(listener, app, options, shutdown));
        Ok((trigger, server))
    }

    /// Ends an incarnation that was replaced: its accept loop stops, its
    /// connections finish their requests (which it forwards or answers 503), its
    /// engine stops.
    async fn retire(self) {
        self.trigger.fire();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.server).await;
        self.engine.shutdown_within(Duration::ZERO).await;
    }
}

/// Opens the engine, trying again while the object store fails transiently
/// (recovery is idempotent: a failed attempt leaves nothing half done that the next
/// one does not redo), for up to [`RECOVERY_RETRY_FOR`].
async fn recover(
    config: picomq_engine::EngineConfig,
    opened: storage::OpenedStore,
    meta: Meta,
) -> Result<Engine, String> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = Engine::open_instrumented(
            config.clone(),
            opened.store.clone(),
            opened.stats.clone(),
            meta.clone(),
        )
        .await;
        match attempt {
            Ok(engine) => return Ok(engine),
            Err(picomq_engine::EngineError::Unavailable(e))
                if started.elapsed() < RECOVERY_RETRY_FOR =>
            {
                tracing::warn!(error = %e, ?backoff, "recovery could not reach the object store; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(format!("recovery failed: {e}")),
        }
    }
}

/// How long a stopping cluster member keeps serving after its drain, with
/// /readyz failing, so that load balancers checking every 500 ms (two failures to
/// take a server out) stop sending to it first.
const LOAD_BALANCER_GRACE: Duration = Duration::from_millis(1500);

/// How long start-up keeps trying an object store that fails.
const RECOVERY_RETRY_FOR: Duration = Duration::from_secs(120);

/// The drain, then the WAL flush, each within its share of `timeout`.
async fn stop_gracefully(
    engine: &Engine,
    trigger: ShutdownTrigger,
    mut server: JoinHandle<()>,
    timeout: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let drain_deadline = started + timeout * 3 / 4;
    let deadline = started + timeout;
    tracing::info!(
        ?timeout,
        "shutting down: refusing new connections, ending live reads, finishing in-flight requests"
    );
    // Stops the accept loop and asks every connection to close once its request is
    // answered; SSE and long-polls answer at once.
    // A cluster member hands its streams to the others while it still answers
    // (requests for them are forwarded meanwhile), then drains its connections.
    if let Some(cluster) = engine.cluster() {
        // The members taking the streams over read their recent history from packs.
        engine.pack_unpacked().await;
        if cluster
            .drain_all((timeout / 2).max(Duration::from_secs(1)))
            .await
        {
            tracing::info!(elapsed = ?started.elapsed(), "every stream handed to the other members");
        }
        // /readyz has answered 503 since the drain began: give load balancers the
        // time to stop sending here before connections close.
        tokio::time::sleep(LOAD_BALANCER_GRACE.min(timeout / 4)).await;
    }
    trigger.fire();
    tokio::select! {
        _ = &mut server => tracing::info!(elapsed = ?started.elapsed(), "all connections closed"),
        _ = tokio::time::sleep_until(drain_deadline) => {
            tracing::warn!("requests still running at the drain deadline are cut off (not acknowledged)");
        }
    }
    server.abort();
    tokio::select! {
        _ = engine.shutdown() => {
            tracing::info!(elapsed = ?started.elapsed(), "WAL flushed; bye");
            Ok(())
        }
        _ = tokio::time::sleep_until(deadline) => Err(format!(
            "the WAL did not flush within --shutdown-timeout {timeout:?}; appends that were not flushed were not acknowledged"
        )),
    }
}

/// Opens the token store (`--auth required`) and applies the bootstrap token.
async fn open_auth(config: &Config, engine: Engine) -> Result<Option<Arc<Auth>>, String> {
    if config.auth == AuthMode::Off {
        return Ok(None);
    }
    let auth = Auth::open(engine, config.auth_limits.clone()).await?;
    if let Some(path) = &config.bootstrap_token_file {
        let secret = std::fs::read_to_string(path)
            .map_err(|e| format!("--bootstrap-token-file {}: {e}", path.display()))?;
        auth.bootstrap(&secret).await?;
    }
    if !auth.any_live_token() {
        return Err("--auth required, but no token can authenticate: give the first admin token with --bootstrap-token-file".into());
    }
    Ok(Some(Arc::new(auth)))
}
