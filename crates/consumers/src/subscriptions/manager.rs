//! The subscriptions of one node: each one's state kept in a stream of its own, a
//! driver task per subscription that issues wakes, delivers webhooks and lapses
//! leases, and the loading of subscriptions at start and when this node comes to
//! serve their streams.
//!
//! Durability: a subscription's state is a JSON stream named
//! `__subscriptions/{path}` (path: the subscription's URL path), one message per
//! change holding the whole state; the last message is the state. A change is
//! answered, and a wake sent, only once its message is durable, so a restart, or
//! the node that takes the stream over in a cluster, resumes exactly what was
//! acknowledged. In a cluster the node serving that stream is the one that
//! delivers: its appends are refused once it is not (terms), and it lets go.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, Engine, EngineError, Offset, StreamName,
};
use serde_json::json;
use tokio::sync::Notify;

use super::config::{self, glob_matches, literal_prefix, Kind, SubConfig, STREAMS_MAX};
use super::signing::{signature_header, Signer};
use super::state::{Link, SubState, WakeRequest};
use crate::error::ConsumerError;
use crate::Consumers;
use picomq_engine::shutdown::ShutdownSignal;

/// Most streams one tails call asks a member for.
const TAILS_ASKED_MAX: usize = 1_000;
/// Where every subscription's state stream lives.
pub const STATE_PREFIX: &str = "__subscriptions/";
/// A state stream is trimmed to its last message after this many changes.
const TRIM_EVERY: u32 = 64;
/// How long a webhook has to answer.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// A webhook answer is read up to this size (only `{"done": true}` matters).
const WEBHOOK_ANSWER_BYTES_MAX: usize = 64 << 10;
/// Subscriptions one node holds.
pub const SUBSCRIPTIONS_MAX: usize = 10_000;

/// How the subscriptions of a node behave.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Deliver webhooks to private, loopback and link-local addresses too.
    pub webhook_allow_private: bool,
    /// A development server (`--auth off`): the protocol's `http://localhost`
    /// exception for webhooks holds.
    pub development: bool,
    /// How often an idle subscription looks for data its node was not told of
    /// (appends on other members of a cluster, streams created elsewhere).
    pub rescan: Duration,
}

impl Settings {
    pub fn webhook_rule(&self) -> config::WebhookRule {
        config::WebhookRule {
            allow_private: self.webhook_allow_private,
            development: self.development,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            webhook_allow_private: false,
            development: false,
            rescan: Duration::from_secs(30),
        }
    }
}

pub struct Subscriptions {
    engine: Engine,
    pub settings: Settings,
    subs: Mutex<HashMap<String, Arc<Sub>>>,
    /// Serializes creates and loads, so one subscription never has two drivers.
    loading: tokio::sync::Mutex<()>,
    any: AtomicBool,
    pub signer: Signer,
    webhooks: super::webhook::Webhooks,
    /// The node's consumers, told of the wake events this one appends.
    hub: std::sync::OnceLock<Weak<Consumers>>,
    pub counters: super::Counters,
    shutdown: ShutdownSignal,
}

/// One subscription this node drives.
pub struct Sub {
    pub name: StreamName,
    root: String,
    pattern: Option<String>,
    explicit: Mutex<HashSet<String>>,
    live: tokio::sync::Mutex<Option<Live>>,
    notify: Notify,
    stopped: AtomicBool,
}

/// What the lock of a subscription guards.
pub struct Live {
    pub state: SubState,
    /// Last known tail of each linked stream (not persisted: read again).
    pub tails: HashMap<String, u64>,
    /// The state stream's tail after the last write, and writes since a trim.
    written: Offset,
    writes: u32,
}

/// The state stream of the subscription at URL path `path` (no leading `/`).
pub fn state_stream(path: &str) -> String {
    format!("{STATE_PREFIX}{path}")
}

fn unavailable(e: EngineError) -> ConsumerError {
    ConsumerError::from(e)
}

impl Subscriptions {
    pub fn new(engine: Engine, settings: Settings, shutdown: ShutdownSignal) -> Arc<Subscriptions> {
        let webhooks = super::webhook::Webhooks::new(settings.webhook_rule());
        Arc::new(Subscriptions {
            engine,
            settings,
            subs: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            any: AtomicBool::new(false),
            signer: Signer::default(),
            webhooks,
            hub: std::sync::OnceLock::new(),
            counters: super::Counters::default(),
            shutdown,
        })
    }

    pub(crate) fn connect(&self, hub: Weak<Consumers>) {
        let _ = self.hub.set(hub);
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    fn now_ms(&self) -> u64 {
        self.engine.clock().now_ms()
    }

    fn serves(&self, name: &str) -> bool {
        self.engine
            .cluster()
            .is_none_or(|c| c.owns(picomq_engine::cluster::slot_of(name)))
    }

    fn len(&self) -> usize {
        self.subs.lock().expect("subscriptions lock").len()
    }

    /// Whether any subscription is driven here (writes need not tell otherwise).
    pub fn watching(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The subscriptions in memory now (a copy: the lock is not held while they
    /// are looked at).
    fn all_registered(&self) -> Vec<Arc<Sub>> {
        let subs = self.subs.lock().expect("subscriptions lock");
        subs.values().cloned().collect()
    }

    /// A write to stream `name` was acknowledged: wakes the subscriptions it concerns.
    pub fn on_write(&self, name: &str) {
        if !self.any.load(Ordering::Relaxed) || name.starts_with("__") {
            return;
        }
        let subs = self.all_registered();
        for sub in subs {
            if sub.concerns(name) {
                sub.notify.notify_one();
            }
        }
    }

    fn register(self: &Arc<Self>, sub: Arc<Sub>) {
        let mut subs = self.subs.lock().expect("subscriptions lock");
        subs.insert(sub.name.to_string(), sub.clone());
        self.any.store(true, Ordering::Relaxed);
        drop(subs);
        sub.notify.notify_one();
        let me = self.clone();
        tokio::spawn(async move { me.drive(sub).await });
    }

    fn unregister(&self, sub: &Arc<Sub>) {
        sub.stopped.store(true, Ordering::SeqCst);
        sub.notify.notify_one();
        let mut subs = self.subs.lock().expect("subscriptions lock");
        if subs
            .get(sub.name.as_str())
            .is_some_and(|s| Arc::ptr_eq(s, sub))
        {
            subs.remove(sub.name.as_str());
        }
        self.any.store(!subs.is_empty(), Ordering::Relaxed);
    }

    /// The subscription at URL path `path`, loaded from its stream if this node
    /// has not loaded it yet; `None` if there is none.
    pub async fn get(self: &Arc<Self>, path: &str) -> Result<Option<Arc<Sub>>, ConsumerError> {
        let name = state_stream(path);
        if let Some(sub) = self.registered(&name) {
            return Ok(Some(sub));
        }
        let _loading = self.loading.lock().await;
        if let Some(sub) = self.registered(&name) {
            return Ok(Some(sub));
        }
        self.load(&name).await
    }

    fn registered(&self, name: &str) -> Option<Arc<Sub>> {
        let sub = self
            .subs
            .lock()
            .expect("subscriptions lock")
            .get(name)
            .cloned();
        sub.filter(|s| !s.stopped.load(Ordering::SeqCst))
    }

    /// Reads a state stream's last message and starts driving it.
    async fn load(self: &Arc<Self>, name: &str) -> Result<Option<Arc<Sub>>, ConsumerError> {
        let max = self.engine.config().stream_name_bytes_max;
        let stream_name = StreamName::new(name.to_string(), max).map_err(ConsumerError::from)?;
        let stream = match self.engine.stream(&stream_name).await {
            Ok(s) => s,
            Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
            Err(e) => return Err(unavailable(e)),
        };
        let mut from = self.engine.retained_start(&stream).await?;
        let mut last = None;
        loop {
            let chunk = self.engine.read(&stream, from, 4 << 20).await?;
            if let Some(seg) = chunk.segments.last() {
                last = Some(seg.clone());
            }
            if chunk.up_to_date || chunk.next == from {
                from = chunk.next;
                break;
            }
            from = chunk.next;
        }
        let Some(last) = last else { return Ok(None) };
        let state: SubState = serde_json::from_slice(&last).map_err(|e| {
            ConsumerError::internal(format!("subscription state {name} is unreadable: {e}"))
        })?;
        tracing::info!(subscription = %state.id, generation = state.generation, "loaded a subscription");
        let sub = Sub::new(stream_name, state, from);
        self.register(sub.clone());
        Ok(Some(sub))
    }

    /// Creates a subscription, or confirms one with the same configuration:
    /// `(created, state)`, or 409 for another configuration.
    pub async fn create(
        self: &Arc<Self>,
        path: &str,
        id: &str,
        root: &str,
        root_url: &str,
        config: SubConfig,
    ) -> Result<(bool, Arc<Sub>), ConsumerError> {
        if let Some(url) = &config.webhook_url {
            config::check_webhook_url(url, self.settings.webhook_rule())?;
        }
        let hash = config.hash();
        if let Some(sub) = self.get(path).await? {
            let live = sub.live.lock().await;
            let same = live.as_ref().is_some_and(|l| l.state.hash == hash);
            drop(live);
            if same {
                return Ok((false, sub));
            }
            return Err(ConsumerError::conflict(
                "SUBSCRIPTION_ALREADY_EXISTS",
                "a subscription with this id exists with another configuration",
            ));
        }
        let _loading = self.loading.lock().await;
        if self.len() >= SUBSCRIPTIONS_MAX {
            return Err(ConsumerError::refused(
                crate::error::Refusal::Busy,
                "too_many_subscriptions",
                format!("this node holds {SUBSCRIPTIONS_MAX} subscriptions, its limit"),
            ));
        }
        let max = self.engine.config().stream_name_bytes_max;
        let name = StreamName::new(state_stream(path), max).map_err(ConsumerError::from)?;
        let mut create = CreateRequest::new(name.clone());
        create.content_type = Some(ContentType::json());
        self.engine.create(create).await?;
        let mut state = SubState {
            id: id.to_string(),
            root: root.to_string(),
            root_url: root_url.to_string(),
            config,
            hash,
            created_at: picomq_engine::units::format_rfc3339_ms(self.now_ms()),
            links: Default::default(),
            generation: 0,
            wake: None,
            retry: None,
        };
        // Explicit streams, then the pattern's existing streams, at their tails.
        let mut tails = HashMap::new();
        for path in state.config.streams.clone() {
            let tail = self.tail_of(&format!("{root}{path}")).await?.unwrap_or(0);
            state.links.insert(
                path.clone(),
                Link {
                    explicit: true,
                    glob: false,
                    acked: tail,
                },
            );
            tails.insert(path, tail);
        }
        if let Some(pattern) = state.config.pattern.clone() {
            for (path, tail) in self.matching(root, &pattern).await? {
                let link = state.links.entry(path.clone()).or_insert(Link {
                    explicit: false,
                    glob: false,
                    acked: tail,
                });
                link.glob = true;
                tails.insert(path, tail);
            }
        }
        let written = self.engine.head(&name).await?.tail;
        let sub = Sub::new(name, state, written);
        {
            let mut live = sub.live.lock().await;
            let l = live.as_mut().expect("a new subscription is live");
            l.tails = tails;
            self.persist(&sub, l).await?;
        }
        self.register(sub.clone());
        self.counters.created.inc();
        Ok((true, sub))
    }

    /// Deletes a subscription: its state stream goes, and with it every wake.
    pub async fn delete(self: &Arc<Self>, path: &str) -> Result<bool, ConsumerError> {
        let Some(sub) = self.get(path).await? else {
            return Ok(false);
        };
        let mut live = sub.live.lock().await;
        match self.engine.delete(&sub.name).await {
            Ok(()) | Err(EngineError::NotFound | EngineError::Gone) => {}
            Err(e) => return Err(e.into()),
        }
        *live = None;
        drop(live);
        self.unregister(&sub);
        Ok(true)
    }

    /// The tail of stream `name`, from the metadata (every member of a cluster
    /// sees every stream's), `None` if it does not exist.
    pub async fn tail_of(&self, name: &str) -> Result<Option<u64>, ConsumerError> {
        if self.serves(name) {
            // Served here: the exact durable tail, without waiting for the index.
            let max = self.engine.config().stream_name_bytes_max;
            let stream = StreamName::new(name.to_string(), max).map_err(ConsumerError::from)?;
            return match self.engine.head(&stream).await {
                Ok(info) => Ok(Some(info.tail.0)),
                Err(EngineError::NotFound | EngineError::Gone) => Ok(None),
                Err(e) => Err(e.into()),
            };
        }
        let page = self.engine.list(name, "", 1).await?;
        Ok(page
            .streams
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.tail.0))
    }

    /// The streams under `root` that `pattern` matches, with their tails.
    async fn matching(
        &self,
        root: &str,
        pattern: &str,
    ) -> Result<Vec<(String, u64)>, ConsumerError> {
        let prefix = format!("{root}{}", literal_prefix(pattern));
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let page = self.engine.list(&prefix, &after, 500).await?;
            for s in &page.streams {
                let Some(rel) = s.name.strip_prefix(root) else {
                    continue;
                };
                if rel.starts_with("__") || !glob_matches(pattern, rel) {
                    continue;
                }
                if out.len() >= STREAMS_MAX {
                    tracing::warn!(pattern, "a subscription's pattern matches more than {STREAMS_MAX} streams; the rest are not linked");
                    return Ok(out);
                }
                out.push((rel.to_string(), s.tail.0));
            }
            match page.next {
                Some(next) => after = next,
                None => return Ok(out),
            }
        }
    }

    /// Reads every linked stream's tail again, links streams the pattern matches
    /// now (at their start: they came after the subscription) and drops glob
    /// links whose stream is gone. `true` if the links changed.
    async fn refresh(&self, live: &mut Live, exact: bool) -> Result<bool, ConsumerError> {
        let root = live.state.root.clone();
        let mut tails = HashMap::new();
        let mut changed = false;
        if let Some(pattern) = live.state.config.pattern.clone() {
            for (path, tail) in self.matching(&root, &pattern).await? {
                if !live.state.links.contains_key(&path) {
                    if live.state.links.len() >= STREAMS_MAX {
                        continue;
                    }
                    live.state.links.insert(
                        path.clone(),
                        Link {
                            explicit: false,
                            glob: true,
                            acked: 0,
                        },
                    );
                    changed = true;
                } else if let Some(link) = live.state.links.get_mut(&path) {
                    if !link.glob {
                        link.glob = true;
                        changed = true;
                    }
                }
                tails.insert(path, tail);
            }
        }
        let explicit: Vec<String> = live
            .state
            .links
            .iter()
            .filter(|(p, l)| l.explicit && !tails.contains_key(*p))
            .map(|(p, _)| p.clone())
            .collect();
        for path in explicit {
            if let Some(tail) = self.tail_of(&format!("{root}{path}")).await? {
                tails.insert(path, tail);
            }
        }
        let before = live.state.links.len();
        live.state
            .links
            .retain(|p, l| l.explicit || tails.contains_key(p));
        changed |= live.state.links.len() != before;
        for (p, l) in live.state.links.iter_mut() {
            if l.glob && !l.explicit && !tails.contains_key(p) {
                l.glob = false;
            }
        }
        if exact {
            self.exact_tails(&root, &mut tails).await;
        }
        live.tails = tails;
        Ok(changed)
    }

    /// Asks the members serving linked streams for their tails: the metadata store
    /// has them only as far as each member indexed.
    async fn exact_tails(&self, root: &str, tails: &mut HashMap<String, u64>) {
        let (Some(cluster), Some(peers)) = (self.engine.cluster(), self.engine.peers()) else {
            return;
        };
        let mut by_owner: HashMap<String, Vec<String>> = HashMap::new();
        for path in tails.keys() {
            let name = format!("{root}{path}");
            if let picomq_engine::cluster::Route::Remote { url, .. } = cluster.route(&name) {
                let names = by_owner.entry(url).or_default();
                if names.len() < TAILS_ASKED_MAX {
                    names.push(name);
                }
            }
        }
        for (url, names) in by_owner {
            match peers.tails(&url, names).await {
                Ok(found) => {
                    for (name, tail) in found {
                        if let Some(path) = name.strip_prefix(root) {
                            if let Some(t) = tails.get_mut(path) {
                                *t = (*t).max(tail);
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(member = %url, error = %e, "could not read tails from a member")
                }
            }
        }
    }

    /// Writes the state as the state stream's next message; durable on return.
    async fn persist(&self, sub: &Sub, live: &mut Live) -> Result<(), ConsumerError> {
        let body = serde_json::to_vec(&live.state).expect("a state serializes");
        let req = AppendRequest::new(
            sub.name.clone(),
            Some(ContentType::json()),
            Bytes::from(body),
        );
        let before = live.written;
        match self.engine.append(req).await {
            Ok(picomq_engine::AppendOutcome::Appended { tail, .. })
            | Ok(picomq_engine::AppendOutcome::Duplicate { tail, .. }) => live.written = tail,
            Err(e) => {
                if matches!(e, EngineError::NotOwner | EngineError::NotFound) {
                    // Another node serves it now (or it was deleted): let go.
                    sub.stopped.store(true, Ordering::SeqCst);
                }
                return Err(e.into());
            }
        }
        live.writes += 1;
        if live.writes >= TRIM_EVERY {
            live.writes = 0;
            if let Err(e) = self.engine.trim_at_boundary(&sub.name, before).await {
                tracing::debug!(error = %e, "trimming a subscription's state stream failed");
            }
        }
        sub.explicit.lock().expect("explicit lock").clone_from(
            &live
                .state
                .links
                .iter()
                .filter(|(_, l)| l.explicit)
                .map(|(p, _)| p.clone())
                .collect(),
        );
        Ok(())
    }

    /// The driver of one subscription: looks again whenever a linked stream is
    /// written, a lease or retry falls due, or the rescan interval passed.
    async fn drive(self: Arc<Self>, sub: Arc<Sub>) {
        loop {
            if sub.stopped.load(Ordering::SeqCst) {
                break;
            }
            let due = {
                let live = sub.live.lock().await;
                match live.as_ref() {
                    None => break,
                    Some(l) => l.state.next_deadline_ms(),
                }
            };
            let now = self.now_ms();
            let wait = due
                .map(|d| Duration::from_millis(d.saturating_sub(now)))
                .unwrap_or(self.settings.rescan)
                .min(self.settings.rescan);
            tokio::select! {
                _ = sub.notify.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.fired() => break,
            }
            if sub.stopped.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = self.tick(&sub).await {
                tracing::debug!(subscription = %sub.name, error = %e, "a subscription's turn failed");
                if sub.stopped.load(Ordering::SeqCst) || !self.serves(sub.name.as_str()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        self.unregister(&sub);
        tracing::debug!(subscription = %sub.name, "stopped driving a subscription");
    }

    /// One turn: lapse a lease that ran out, and issue a wake if there is pending
    /// work and none in flight.
    async fn tick(self: &Arc<Self>, sub: &Arc<Sub>) -> Result<(), ConsumerError> {
        let mut guard = sub.live.lock().await;
        let Some(live) = guard.as_mut() else {
            return Ok(());
        };
        let now = self.now_ms();
        let mut changed = false;
        if live.state.lease_lapsed(now) {
            live.state.wake = None;
            self.counters.leases_lapsed.inc();
            changed = true;
        }
        let retry_due = live
            .state
            .retry
            .as_ref()
            .is_none_or(|r| r.next_attempt_at_ms <= now);
        if live.state.wake.is_none() && retry_due {
            changed |= self.refresh(live, false).await?;
            if live.state.pending(&live.tails) {
                return self.wake(sub, live).await;
            }
        }
        if changed {
            self.persist(sub, live).await?;
        }
        Ok(())
    }

    /// Issues a wake (durable first), then delivers it.
    async fn wake(self: &Arc<Self>, sub: &Arc<Sub>, live: &mut Live) -> Result<(), ConsumerError> {
        let token = live.state.issue_wake(&live.tails, self.now_ms());
        self.persist(sub, live).await?;
        self.counters.wakes.inc();
        match live.state.config.kind {
            Kind::Webhook => {
                let me = self.clone();
                let sub = sub.clone();
                let (body, wake_id) = webhook_body(&live.state, &token);
                tokio::spawn(async move { me.deliver(sub, wake_id, body).await });
            }
            Kind::PullWake => self.write_wake_event(&live.state).await,
        }
        Ok(())
    }

    async fn write_wake_event(&self, state: &SubState) {
        let Some(wake_stream) = &state.config.wake_stream else {
            return;
        };
        let stream = live_first_pending(state);
        let event = json!({
            "type": "wake",
            "subscription_id": state.id,
            "stream": stream,
            "generation": state.generation,
            "ts": self.now_ms(),
        });
        let name = format!("{}{wake_stream}", state.root);
        let body = Bytes::from(event.to_string());
        if let Err(e) = self.append_anywhere(&name, body).await {
            tracing::warn!(subscription = %state.id, wake_stream = %name, error = %e, "could not write a wake event");
        }
    }

    /// Appends `body` to the JSON stream `name`, here or at the member serving it.
    async fn append_anywhere(&self, name: &str, body: Bytes) -> Result<(), ConsumerError> {
        let max = self.engine.config().stream_name_bytes_max;
        let stream = StreamName::new(name.to_string(), max).map_err(ConsumerError::from)?;
        let req = AppendRequest::new(stream, Some(ContentType::json()), body.clone());
        match self.engine.append(req).await {
            Ok(_) => {
                match self.hub.get().and_then(Weak::upgrade) {
                    Some(hub) => hub.written(name),
                    None => self.on_write(name),
                }
                Ok(())
            }
            Err(EngineError::NotOwner) => crate::append_at_owner(&self.engine, name, body).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Sends a webhook wake and applies its answer (unless the wake ended first).
    async fn deliver(self: Arc<Self>, sub: Arc<Sub>, wake_id: String, body: Vec<u8>) {
        let url = {
            let live = sub.live.lock().await;
            match live
                .as_ref()
                .and_then(|l| l.state.config.webhook_url.clone())
            {
                Some(url) => url,
                None => return,
            }
        };
        let outcome = self.post_webhook(&url, body).await;
        let mut guard = sub.live.lock().await;
        let Some(live) = guard.as_mut() else { return };
        if live.state.wake.as_ref().map(|w| w.wake_id.as_str()) != Some(wake_id.as_str()) {
            return;
        }
        let now = self.now_ms();
        match outcome {
            Ok(done) => {
                self.counters.deliveries.inc();
                let was_failing = live.state.retry.take().is_some();
                if done {
                    live.state.ack_snapshot();
                    live.state.wake = None;
                } else if !was_failing {
                    return;
                }
            }
            Err(e) => {
                self.counters.delivery_failures.inc();
                let jitter = fastrand::f64() * 2.0 - 1.0;
                live.state.schedule_retry(now, jitter);
                let r = live.state.retry.as_ref().expect("scheduled above");
                tracing::info!(subscription = %live.state.id, attempt = r.attempt, next_in_ms = r.next_attempt_at_ms.saturating_sub(now), error = %e, "webhook delivery failed; retrying");
            }
        }
        if let Err(e) = self.persist(&sub, live).await {
            tracing::debug!(error = %e, "could not record a webhook's answer");
        }
        drop(guard);
        sub.notify.notify_one();
    }

    /// POSTs a signed wake; `Ok(done)` for a 2xx answer.
    async fn post_webhook(&self, url: &str, body: Vec<u8>) -> Result<bool, String> {
        let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
        let key = self
            .signer
            .active(&self.engine)
            .await
            .map_err(|e| e.to_string())?;
        let signature = signature_header(&key, self.now_ms() / 1000, &body);
        let headers = [
            ("content-type", "application/json"),
            ("webhook-signature", signature.as_str()),
        ];
        let send = self
            .webhooks
            .post(&parsed, &headers, body, WEBHOOK_ANSWER_BYTES_MAX);
        let resp = tokio::time::timeout(WEBHOOK_TIMEOUT, send)
            .await
            .map_err(|_| format!("no answer within {WEBHOOK_TIMEOUT:?}"))??;
        if !resp.status.is_success() {
            return Err(format!("answered {}", resp.status));
        }
        let Some(body) = resp.body else {
            return Ok(false);
        };
        let done = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("done").and_then(|d| d.as_bool()))
            .unwrap_or(false);
        Ok(done)
    }

    /// Runs `f` on the subscription's state and persists it if `f` succeeded and
    /// asked to; the driver looks again afterwards.
    pub async fn with_state<T>(
        &self,
        sub: &Arc<Sub>,
        refresh: bool,
        f: impl FnOnce(&mut Live, u64) -> Result<(T, bool), ConsumerError>,
    ) -> Result<T, ConsumerError> {
        let mut guard = sub.live.lock().await;
        let live = guard.as_mut().ok_or_else(not_found)?;
        if refresh {
            self.refresh(live, true).await?;
        }
        let now = self.now_ms();
        let before = live.state.clone();
        let (out, write) = match f(live, now) {
            Ok(r) => r,
            Err(e) => {
                live.state = before;
                return Err(e);
            }
        };
        if write {
            if let Err(e) = self.persist(sub, live).await {
                live.state = before;
                return Err(e);
            }
        }
        drop(guard);
        sub.notify.notify_one();
        Ok(out)
    }

    /// Loads the subscriptions this node serves and has not loaded, and lets go of
    /// the ones it no longer serves: at start, and periodically in a cluster.
    pub async fn reconcile(self: &Arc<Self>) -> Result<(), ConsumerError> {
        let mut after = String::new();
        let mut seen = 0usize;
        loop {
            let page = self.engine.list(STATE_PREFIX, &after, 500).await?;
            for s in &page.streams {
                seen += 1;
                if seen > SUBSCRIPTIONS_MAX {
                    return Ok(());
                }
                if self.serves(&s.name) && self.registered(&s.name).is_none() {
                    let _loading = self.loading.lock().await;
                    if self.registered(&s.name).is_none() {
                        if let Err(e) = self.load(&s.name).await {
                            tracing::warn!(subscription = %s.name, error = %e, "could not load a subscription");
                        }
                    }
                }
            }
            match page.next {
                Some(next) => after = next,
                None => break,
            }
        }
        let subs = self.all_registered();
        for sub in subs {
            if !self.serves(sub.name.as_str()) {
                self.unregister(&sub);
            }
        }
        Ok(())
    }

    /// Keeps loading what this node comes to serve (a cluster's hand-overs and
    /// takeovers), until the node stops.
    pub async fn run(self: Arc<Self>, every: Duration) {
        loop {
            if let Err(e) = self.reconcile().await {
                tracing::debug!(error = %e, "loading subscriptions failed; trying again");
            }
            if self.engine.cluster().is_none() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.shutdown.fired() => return,
            }
        }
    }
}

fn live_first_pending(state: &SubState) -> Option<String> {
    let wake = state.wake.as_ref()?;
    wake.snapshot
        .iter()
        .find(|(p, t)| state.links.get(*p).is_some_and(|l| **t > l.acked))
        .map(|(p, _)| p.clone())
}

/// The body of a webhook wake and its wake id.
fn webhook_body(state: &SubState, token: &str) -> (Vec<u8>, String) {
    let wake = state.wake.as_ref().expect("a wake was issued");
    let tails: HashMap<String, u64> = wake.snapshot.clone().into_iter().collect();
    let body = json!({
        "subscription_id": state.id,
        "wake_id": wake.wake_id,
        "generation": state.generation,
        "streams": state.stream_infos(&tails),
        "callback_url": state.action_url("callback"),
        "callback_token": token,
    });
    (
        serde_json::to_vec(&body).expect("json"),
        wake.wake_id.clone(),
    )
}

pub fn not_found() -> ConsumerError {
    ConsumerError::not_found("SUBSCRIPTION_NOT_FOUND", "no subscription with this id")
}

impl Sub {
    fn new(name: StreamName, state: SubState, written: Offset) -> Arc<Sub> {
        Arc::new(Sub {
            name,
            root: state.root.clone(),
            pattern: state.config.pattern.clone(),
            explicit: Mutex::new(
                state
                    .links
                    .iter()
                    .filter(|(_, l)| l.explicit)
                    .map(|(p, _)| p.clone())
                    .collect(),
            ),
            live: tokio::sync::Mutex::new(Some(Live {
                state,
                tails: HashMap::new(),
                written,
                writes: 0,
            })),
            notify: Notify::new(),
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether a write to stream `name` may give this subscription work.
    fn concerns(&self, name: &str) -> bool {
        let Some(rel) = name.strip_prefix(self.root.as_str()) else {
            return false;
        };
        self.pattern
            .as_deref()
            .is_some_and(|p| glob_matches(p, rel))
            || self.explicit.lock().expect("explicit lock").contains(rel)
    }
}

/// Convenience for handlers: the wake request of a body.
pub fn wake_request(body: &[u8]) -> Result<WakeRequest, ConsumerError> {
    serde_json::from_slice(body).map_err(|e| {
        ConsumerError::invalid(format!("body is not a wake request: {e}"))
            .with_code("INVALID_REQUEST")
    })
}
