//! PicoMQ's consumers, a layer of their own above the stream service: consumer
//! groups (`groups`), Durable Streams subscriptions with webhook and pull-wake
//! delivery (`subscriptions`) and server-kept positions (`positions`). Their state
//! lives in streams whose names start with `__` (companions of the stream they
//! follow, so the member serving a stream serves its consumers), written through
//! the engine like any append.
//!
//! This crate speaks domain types: names, offsets, configurations, messages, and
//! [`ConsumerError`]. It knows nothing of HTTP or of who may ask; the edge
//! authorizes every stream a request touches and translates requests and answers.

pub mod error;
pub mod groups;
pub mod names;
pub mod positions;
pub mod subscriptions;

use std::sync::Arc;

use bytes::Bytes;
use picomq_engine::cluster::{slot_of, Route};
use picomq_engine::shutdown::ShutdownSignal;
use picomq_engine::{Engine, EngineError};

pub use error::{ConsumerError, Refusal};

/// The consumers of one node, told of every acknowledged write.
pub struct Consumers {
    pub groups: Arc<groups::Groups>,
    pub subscriptions: Arc<subscriptions::Subscriptions>,
    pub positions: Arc<positions::Positions>,
}

impl Consumers {
    /// The consumers of the node of `engine`; subscriptions are driven until
    /// `shutdown` fires (once [`Consumers::run`] is spawned).
    pub fn new(
        engine: Engine,
        settings: subscriptions::Settings,
        shutdown: ShutdownSignal,
    ) -> Arc<Consumers> {
        let hub = Arc::new(Consumers {
            groups: groups::Groups::new(engine.clone()),
            subscriptions: subscriptions::Subscriptions::new(engine.clone(), settings, shutdown),
            positions: positions::Positions::new(engine),
        });
        hub.groups.connect(Arc::downgrade(&hub));
        hub.subscriptions.connect(Arc::downgrade(&hub));
        hub
    }

    /// Whether a write must tell anyone (subscriptions, waiting group claims).
    pub fn watching(&self) -> bool {
        self.subscriptions.watching() || self.groups.watching()
    }

    /// A write to stream `name` was acknowledged.
    pub fn written(&self, name: &str) {
        self.subscriptions.on_write(name);
        self.groups.on_write(name);
    }
}

/// Appends the JSON `body` to `name` at the cluster member that serves it (this
/// node was refused as not its owner).
pub(crate) async fn append_at_owner(
    engine: &Engine,
    name: &str,
    body: Bytes,
) -> Result<(), ConsumerError> {
    let (Some(cluster), Some(peers)) = (engine.cluster(), engine.peers()) else {
        return Err(EngineError::NotOwner.into());
    };
    match cluster.refresh_slot(slot_of(name)).await? {
        Route::Remote { url, .. } => {
            let body = String::from_utf8(body.to_vec())
                .map_err(|_| ConsumerError::invalid("a JSON body is UTF-8"))?;
            Ok(peers.append(&url, name, body).await?)
        }
        _ => Err(EngineError::NotOwner.into()),
    }
}

/// `N` bytes from the operating system's secure random source.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the operating system's random source works");
    out
}
