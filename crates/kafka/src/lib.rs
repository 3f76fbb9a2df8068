//! The Kafka wire protocol on PicoMQ's streams (docs/kafka.md).
//!
//! A listener beside the HTTP edge: Kafka clients produce to and fetch from the
//! same streams HTTP clients append to and read, through the same engine (an
//! acknowledged produce is durable exactly as an acknowledged append is) and the
//! same authorization decision (SASL/PLAIN's password is a PicoMQ token).
//!
//! `conn` frames requests and keeps their answers in order; `api` decodes each
//! request and hands it to the module of its verb: `produce`, `fetch`,
//! `metadata` (and ListOffsets), `admin` (topics, partitions, configs).
//! `names` maps topics and partitions to streams, `batch` is the record format.

mod admin;
mod api;
pub mod batch;
mod brokers;
mod conn;
mod consumer_protocol;
mod errors;
mod fetch;
mod group_api;
mod groups;
mod json_log;
mod metadata;
pub mod names;
mod produce;
mod topics;
mod txn;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use picomq_engine::shutdown::ShutdownSignal;
use picomq_engine::Engine;
use picomq_http::auth::Auth;
use picomq_http::server::Tls;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The Kafka listener's settings (`picomq serve --kafka-*`).
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    pub listen: SocketAddr,
    /// `host:port` that Metadata names for this broker; default: the listen address.
    pub advertise: Option<String>,
    /// Largest request frame (`--kafka-max-request-bytes`).
    pub max_request_bytes: usize,
    /// Most open Kafka connections (`--kafka-max-connections`).
    pub max_connections: usize,
    /// Requests one connection may have in flight before it is read no further.
    pub in_flight_per_connection: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// A request frame, once begun, must arrive within this (a client that
    /// stalls half way through one is cut off).
    pub request_read_timeout: Duration,
    /// Whether Metadata and Produce create topics that do not exist (as Kafka's
    /// `auto.create.topics.enable`); a creating token's `create` scope still applies.
    pub auto_create_topics: bool,
    /// Partitions auto-created topics get.
    pub default_partitions: i32,
    /// Most partitions a topic may have.
    pub partitions_max: i32,
    /// Most records one produced batch may hold.
    pub batch_records_max: usize,
    /// How long a consumer group's join phase waits for more members after the
    /// last expected one joined (Kafka's group.initial.rebalance.delay.ms).
    pub group_join_delay: Duration,
}

impl KafkaConfig {
    pub fn new(listen: SocketAddr) -> KafkaConfig {
        KafkaConfig {
            listen,
            advertise: None,
            max_request_bytes: 16 << 20,
            max_connections: 10_000,
            in_flight_per_connection: 32,
            idle_timeout: Duration::from_secs(600),
            request_read_timeout: Duration::from_secs(30),
            auto_create_topics: true,
            default_partitions: 1,
            partitions_max: 1_024,
            batch_records_max: 100_000,
            group_join_delay: Duration::from_millis(500),
        }
    }

    /// The broker's advertised host and port.
    pub fn advertised(&self, bound: SocketAddr) -> Result<(String, i32), String> {
        let Some(at) = &self.advertise else {
            if bound.ip().is_unspecified() {
                return Err(format!(
                    "--kafka-listen {bound} is every address: give --kafka-advertise HOST:PORT, the address Kafka clients reach this node at"
                ));
            }
            return Ok((bound.ip().to_string(), i32::from(bound.port())));
        };
        let (host, port) = at
            .rsplit_once(':')
            .ok_or_else(|| format!("--kafka-advertise {at:?}: expected HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("--kafka-advertise {at:?}: {port:?} is not a port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 {
            return Err(format!("--kafka-advertise {at:?}: expected HOST:PORT"));
        }
        Ok((host.to_string(), i32::from(port)))
    }
}

/// What every connection shares.
pub struct Kafka {
    pub(crate) engine: Engine,
    pub(crate) auth: Option<Arc<Auth>>,
    pub(crate) config: KafkaConfig,
    pub(crate) host: String,
    pub(crate) port: i32,
    pub(crate) cluster_id: String,
    pub(crate) shutdown: ShutdownSignal,
    pub(crate) long_poll_max: Duration,
    pub(crate) groups: Arc<groups::Coordinator>,
    /// The transactional ids this node coordinates.
    pub(crate) txns: txn::Coordinator,
    /// How long a group's join phase waits for more members to arrive.
    pub(crate) join_delay: Duration,
    /// Topic ids handed out, and the partition-0 stream (absolute) of each: a
    /// KIP-848 client asks Metadata by id. Bounded: cleared when full.
    pub(crate) topic_ids: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, String>>,
}

impl Kafka {
    pub(crate) fn remember_topic(&self, id: uuid::Uuid, base: &str) {
        let mut ids = self.topic_ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.len() >= 100_000 {
            ids.clear();
        }
        ids.insert(id, base.to_string());
    }

    pub(crate) fn topic_of_id(&self, id: &uuid::Uuid) -> Option<String> {
        self.topic_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }
}

/// Serves Kafka clients on `listener` until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    auth: Option<Arc<Auth>>,
    tls: Option<Arc<Tls>>,
    config: KafkaConfig,
    shutdown: ShutdownSignal,
) -> Result<(), String> {
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let (host, port) = config.advertised(bound)?;
    let cluster_id = engine.binding().cluster_id.clone();
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let kafka = Arc::new(Kafka {
        engine,
        auth,
        host,
        port,
        cluster_id,
        shutdown: shutdown.clone(),
        long_poll_max: Duration::from_secs(30),
        groups: Arc::new(groups::Coordinator::default()),
        txns: txn::Coordinator::default(),
        join_delay: config.group_join_delay,
        topic_ids: Default::default(),
        config,
    });
    tokio::spawn(groups::tick(kafka.clone(), shutdown.clone()));
    tokio::spawn(txn::tick(kafka.clone(), shutdown.clone()));
    tracing::info!(kafka_listen = %bound, advertise = %format!("{}:{}", kafka.host, kafka.port), tls = tls.is_some(), "serving Kafka clients");
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = shutdown.fired() => return Ok(()),
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "kafka accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = kafka.config.max_connections, "kafka connection refused: --kafka-max-connections reached");
            drop(socket);
            continue;
        };
        let _ = socket.set_nodelay(true);
        let kafka = kafka.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let result = match tls {
                Some(tls) => {
                    let accepted = tokio::time::timeout(
                        Duration::from_secs(10),
                        tls.acceptor().accept(socket),
                    )
                    .await;
                    match accepted {
                        Ok(Ok(s)) => conn::run(s, peer.ip().to_string(), kafka).await,
                        Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                        Err(_) => Err("TLS handshake timed out".to_string()),
                    }
                }
                None => conn::run(socket, peer.ip().to_string(), kafka).await,
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "kafka connection closed");
            }
            drop(permit);
        });
    }
}
