//! A node's part in a cluster: nodes sharing one bucket and one Postgres database,
//! each active stream owned by one node at a time. Postgres holds who is alive
//! (member leases) and who owns what (slots, see `slots`); the bucket holds the
//! data, each member writing its own log. See docs/cluster.md for the protocol and
//! why it is safe; in short:
//! - a member is one incarnation (one epoch, one log); it owns slots only while its
//!   lease holds, and stops acting as an owner before the lease can lapse (`lease`);
//! - a member whose lease lapsed is taken over: one survivor seals its log in the
//!   bucket and indexes what was not indexed, then its slots are free (`takeover`);
//! - slots move between live members only by hand-over, after every op of their
//!   streams is durable and indexed (`membership`);
//! - a request for a stream this node does not own goes to the owner ([`Route`]).
//!
//! This module owns the node's view of the cluster (members, slot owners, its own
//! slots); it never touches the WAL or the index itself.

pub mod coordinator;
pub mod lease;
pub(crate) mod membership;
pub mod slots;
pub(crate) mod takeover;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{EngineError, Result};
use crate::metrics::{Counter, Desc, Exposition, Gauge, Source};
pub use coordinator::{Coordinator, Joining, MemberRow, MemberState, SlotRow};
use lease::Lease;
pub use slots::{slot_of, SLOTS};

/// How a node takes part in a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// A stable name for the node (its slots follow the name across restarts).
    pub node_id: String,
    /// The base URL other nodes reach this one at.
    pub advertise: String,
    /// How long a member's lease lasts unrenewed; others take over after it lapses.
    pub lease: Duration,
    /// Where Kafka clients reach this node's Kafka listener (`HOST:PORT`), if it
    /// has one; published with the member so that every broker names the others.
    pub kafka: Option<String>,
}

/// Where a request for a stream goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node owns the stream: serve it.
    Local,
    /// Another live member owns it.
    Remote { node_id: String, url: String },
    /// No live member owns it right now (a move or a takeover is under way).
    Unowned,
    /// This node owns it but cannot prove it (its lease could not be renewed).
    NoLease,
}

/// A fork's creator asks its source's owner to pin the fork point: the source's
/// data up to it is then in the index, and the source cannot be hard-deleted
/// until the fork is in the index too (or the pin expires).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ForkPin {
    pub source: String,
    pub offset: Option<u64>,
    pub sub_offset: u64,
    /// The content type the fork asks for (checked against the source's).
    pub content_type: Option<String>,
}

/// What the source's owner answers: everything the fork takes from its source.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PinnedFork {
    pub pin: u64,
    pub source_id: u64,
    pub content_type: String,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub point: u64,
    /// The sequence number of the record at `point` (0 from members that predate
    /// sequence numbers).
    #[serde(default)]
    pub point_seq: u64,
}

/// An operation on a stream's lifecycle or settings, made at the member serving
/// the stream wherever it was asked for (the Kafka listener's topic administration:
/// a topic's partitions live on different members).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StreamAdmin {
    /// Creates the stream (an existing one with the same settings is no error).
    Create {
        stream: String,
        content_type: Option<String>,
        retention_secs: Option<u64>,
    },
    Delete {
        stream: String,
    },
    Info {
        stream: String,
    },
    SetRetention {
        stream: String,
        retention_secs: Option<u64>,
    },
    /// Appends every record of `from`, a companion of `stream` (so served by the
    /// same member), to `stream`, then trims `from` to where it was read. The
    /// appends carry the stamp `producer` at `epoch` with sequence numbers from 0,
    /// so a repeat after a crash part way is answered as a duplicate for what was
    /// already appended (a Kafka transaction's commit, docs/kafka.md). `create`
    /// makes `stream` (with `from`'s media type) if it does not exist.
    Publish {
        stream: String,
        from: String,
        producer: String,
        epoch: u64,
        create: bool,
    },
    /// Trims every record of the stream (a Kafka transaction's abort); a missing
    /// stream is no error.
    Discard {
        stream: String,
    },
    /// Reads records from number `seq` on, about `bytes` of them (a table's
    /// export reading a stream another member serves): `Service::read_seq`.
    Read {
        stream: String,
        seq: u64,
        bytes: usize,
    },
    /// Trims the records below number `exported` that are older than the
    /// stream's age retention (none without one): a table with `trimSource`
    /// after committing them. Answers the stream's start afterwards.
    Tier {
        stream: String,
        exported: u64,
    },
}

impl StreamAdmin {
    /// The stream it acts on.
    pub fn stream(&self) -> &str {
        match self {
            StreamAdmin::Create { stream, .. }
            | StreamAdmin::Delete { stream }
            | StreamAdmin::Info { stream }
            | StreamAdmin::SetRetention { stream, .. }
            | StreamAdmin::Publish { stream, .. }
            | StreamAdmin::Discard { stream }
            | StreamAdmin::Read { stream, .. }
            | StreamAdmin::Tier { stream, .. } => stream,
        }
    }
}

/// What a [`StreamAdmin`] answers: the stream afterwards (zeros after a delete).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamAdminAnswer {
    pub id: u64,
    pub retention_secs: Option<u64>,
    /// A create made the stream (rather than finding it).
    pub created: bool,
    /// Records a publish appended (0 for a repeat).
    #[serde(default)]
    pub published: u64,
    /// What a read found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<crate::stream::seek::SeqBatch>,
    /// The first record's number after a tiering trim.
    #[serde(default)]
    pub first_seq: u64,
}

/// Who leads a slot for Kafka clients: the member that owns it, as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotLeader {
    pub epoch: u64,
    /// How many times the slot changed hands (a Kafka leader epoch).
    pub generation: u64,
    /// The owner's Kafka listener, if it has one.
    pub kafka: Option<String>,
}

/// Calls to other members, made by the edge that speaks their protocol.
#[async_trait::async_trait]
pub trait Peers: Send + Sync + 'static {
    /// Pins a fork point at the owner reached at `url` (see [`ForkPin`]).
    async fn pin_fork(&self, url: &str, pin: &ForkPin) -> Result<PinnedFork>;
    /// Releases a pin (the fork is indexed, or its creation failed).
    async fn unpin_fork(&self, url: &str, source_id: u64, pin: u64) -> Result<()>;
    /// Asks the owner to delete the soft-deleted `source_id` if its last fork went.
    async fn cascade(&self, url: &str, source_id: u64) -> Result<()>;
    /// Tells the member that slots changed hands (a takeover finished), so it looks
    /// at the cluster now instead of at its next step.
    async fn nudge(&self, url: &str) -> Result<()>;
    /// The durable tails of `streams` at the member that serves them (the metadata
    /// store has them only as far as that member indexed).
    async fn tails(
        &self,
        url: &str,
        streams: Vec<String>,
    ) -> Result<std::collections::HashMap<String, u64>>;
    /// Appends the JSON `body` to `stream` at the member that serves it.
    async fn append(&self, url: &str, stream: &str, body: String) -> Result<()>;
    /// Makes `op` at the member that serves its stream.
    async fn admin(&self, url: &str, op: &StreamAdmin) -> Result<StreamAdminAnswer>;
}

/// A member as the nodes endpoint shows it.
#[derive(Clone, Debug)]
pub struct MemberInfo {
    pub row: MemberRow,
    pub slots: u32,
    pub this_node: bool,
}

/// What this node knows of the cluster.
#[derive(Default)]
struct Table {
    members: HashMap<u64, MemberRow>,
    /// The owner (member epoch) of each slot, as last read.
    owners: Vec<Option<u64>>,
    /// The generation of each slot's row last applied: a read older than it (a
    /// request's refresh racing the membership step) is ignored.
    generations: Vec<u64>,
}

pub struct Cluster {
    pub config: ClusterConfig,
    pub(crate) coord: Arc<dyn Coordinator>,
    /// This member's epoch (its log's).
    pub epoch: u64,
    pub lease: Lease,
    /// Per slot: 1 + the generation this member owns it at; 0 when not owned.
    owned: Box<[AtomicU64]>,
    table: RwLock<Table>,
    /// Bumped whenever the table changes (requests waiting for a slot's new owner).
    changes: watch::Sender<u64>,
    draining: AtomicBool,
    wake: tokio::sync::Notify,
    pub(crate) stats: ClusterStats,
    /// Why this member gave up: its store and metadata stopped belonging to each
    /// other (see `identity`).
    unbound: std::sync::OnceLock<String>,
}

impl Cluster {
    pub fn new(config: ClusterConfig, coord: Arc<dyn Coordinator>, epoch: u64) -> Cluster {
        Cluster {
            lease: Lease::new(config.lease),
            config,
            coord,
            epoch,
            owned: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            table: RwLock::new(Table {
                members: HashMap::new(),
                owners: vec![None; SLOTS as usize],
                generations: vec![0; SLOTS as usize],
            }),
            changes: watch::channel(0).0,
            draining: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            stats: ClusterStats::default(),
            unbound: std::sync::OnceLock::new(),
        }
    }

    /// Why this member stopped for good, if its store and metadata stopped
    /// belonging to each other; it must not rejoin.
    pub fn unbound(&self) -> Option<&str> {
        self.unbound.get().map(String::as_str)
    }

    pub(crate) fn set_unbound(&self, why: &str) {
        let _ = self.unbound.set(why.to_string());
    }

    /// Whether this node may serve `slot` now: it owns it and its lease holds.
    pub fn owns(&self, slot: u32) -> bool {
        // SeqCst, as in `disown`: see `Service::submit` for why the order matters.
        self.owned[slot as usize].load(Ordering::SeqCst) != 0 && self.lease.is_valid()
    }

    /// The term this member serves `slot` at: 1 + the slot's generation when it
    /// gained it, 0 while it does not serve it. It changes whenever the slot's
    /// service was interrupted (a hand-over, a claim after another owner), so a
    /// stream handle of an older term may miss what another node wrote since.
    pub fn term(&self, slot: u32) -> u64 {
        self.owned[slot as usize].load(Ordering::SeqCst)
    }

    /// `Err(NotOwner)` unless this node may serve the stream `name` now.
    pub fn check_owner(&self, name: &str) -> Result<()> {
        if self.owns(slot_of(name)) {
            return Ok(());
        }
        Err(EngineError::NotOwner)
    }

    /// The member owning `slot` as last read, if it is running.
    pub fn leader(&self, slot: u32) -> Option<SlotLeader> {
        let table = self.table.read().expect("cluster table");
        let owner = table.owners[slot as usize]?;
        let m = table.members.get(&owner)?;
        if !m.state.is_running() {
            return None;
        }
        Some(SlotLeader {
            epoch: owner,
            generation: table.generations[slot as usize],
            kafka: m.kafka.clone(),
        })
    }

    /// Where a request for `name` goes.
    pub fn route(&self, name: &str) -> Route {
        self.route_slot(slot_of(name))
    }

    /// The base URL of the member owning the stream with slot `slot`, if another.
    pub fn owner_url(&self, slot: u32) -> Option<String> {
        match self.route_slot(slot) {
            Route::Remote { url, .. } => Some(url),
            _ => None,
        }
    }

    fn route_slot(&self, slot: u32) -> Route {
        let serving = self.serving(slot);
        if serving && self.lease.is_valid() {
            return Route::Local;
        }
        if serving {
            return Route::NoLease;
        }
        let table = self.table.read().expect("cluster table");
        match table.owners[slot as usize].and_then(|e| table.members.get(&e)) {
            Some(m) if m.epoch != self.epoch && m.state.is_running() => Route::Remote {
                node_id: m.node_id.clone(),
                url: m.advertise.clone(),
            },
            _ => Route::Unowned,
        }
    }

    /// Re-reads `slot`'s owner from the store (a request forwarded here by a node
    /// that believes this one owns it); takes the slot if it was handed to this
    /// member. Returns the route afterwards.
    pub async fn refresh_slot(&self, slot: u32) -> Result<Route> {
        let row = self.coord.slot(slot).await?;
        self.apply_slot(row);
        Ok(self.route_slot(slot))
    }

    /// Resolves when the table next changes, or after `at_most`.
    pub async fn changed(&self, at_most: Duration) {
        let mut rx = self.changes.subscribe();
        let _ = tokio::time::timeout(at_most, rx.changed()).await;
    }

    /// Slots this member owns.
    pub fn owned_slots(&self) -> Vec<u32> {
        (0..SLOTS)
            .filter(|&s| self.owned[s as usize].load(Ordering::Acquire) != 0)
            .collect()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Members as last read, with how many slots each owns.
    pub fn members(&self) -> Vec<MemberInfo> {
        let table = self.table.read().expect("cluster table");
        let mut counts: HashMap<u64, u32> = HashMap::new();
        for owner in table.owners.iter().flatten() {
            *counts.entry(*owner).or_default() += 1;
        }
        let mut out: Vec<MemberInfo> = table
            .members
            .values()
            .map(|m| MemberInfo {
                row: m.clone(),
                slots: counts.get(&m.epoch).copied().unwrap_or(0),
                this_node: m.epoch == self.epoch,
            })
            .collect();
        out.sort_by(|a, b| {
            a.row
                .node_id
                .cmp(&b.row.node_id)
                .then(a.row.epoch.cmp(&b.row.epoch))
        });
        out
    }

    /// Records what the store says of one slot. A slot the store newly gives this
    /// member is served from now on; one it gives another is not. A slot the store
    /// still gives this member but that it stopped serving (a hand-over under way)
    /// stays unserved: only the membership loop serves it again (`own`).
    fn apply_slot(&self, row: SlotRow) {
        let mine = row.owner == Some(self.epoch);
        let mut table = self.table.write().expect("cluster table");
        if row.generation < table.generations[row.slot as usize] {
            return;
        }
        table.generations[row.slot as usize] = row.generation;
        let was = table.owners[row.slot as usize];
        if mine && was != Some(self.epoch) {
            self.own(row.slot, row.generation);
        } else if !mine {
            self.disown(row.slot);
        }
        if was != row.owner {
            table.owners[row.slot as usize] = row.owner;
            drop(table);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Serves `slot` (the store gives it to this member at `generation`).
    fn own(&self, slot: u32, generation: u64) {
        if self.owned[slot as usize].swap(generation + 1, Ordering::AcqRel) == 0 {
            self.stats.slots_gained.inc();
        }
    }

    /// Whether this member serves `slot` (whatever its lease).
    fn serving(&self, slot: u32) -> bool {
        self.owned[slot as usize].load(Ordering::Acquire) != 0
    }

    /// Stops serving `slot` (before its streams are handed over).
    fn disown(&self, slot: u32) {
        if self.owned[slot as usize].swap(0, Ordering::SeqCst) != 0 {
            self.stats.slots_lost.inc();
        }
    }

    /// Stops serving every slot (the lease is gone for good).
    fn disown_all(&self) {
        for slot in 0..SLOTS {
            self.disown(slot);
        }
        self.changes.send_modify(|n| *n += 1);
    }

    fn set_draining(&self, draining: bool) {
        if self.draining.swap(draining, Ordering::AcqRel) != draining {
            tracing::info!(draining, "cluster membership state changed");
            self.nudge();
        }
    }

    /// Wakes the membership loop (a takeover ended, a drain began).
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    async fn nudged(&self) {
        self.wake.notified().await;
    }

    fn set_members(&self, members: Vec<MemberRow>) {
        let mut table = self.table.write().expect("cluster table");
        let changed = members.len() != table.members.len()
            || members.iter().any(|m| {
                table.members.get(&m.epoch).is_none_or(|old| {
                    old.state != m.state || (old.lease_left_ms > 0) != (m.lease_left_ms > 0)
                })
            });
        table.members = members.into_iter().map(|m| (m.epoch, m)).collect();
        drop(table);
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
    }
}

impl Cluster {
    /// The cluster key (see [`Coordinator::cluster_key`]).
    pub async fn key(&self) -> Result<String> {
        self.coord.cluster_key().await
    }

    /// Members as the store has them now, with the slots each serves.
    pub async fn members_now(&self) -> Result<Vec<MemberInfo>> {
        let members = self.coord.members().await?;
        let slots = self.coord.slots().await?;
        let mut counts: HashMap<u64, u32> = HashMap::new();
        for owner in slots.iter().filter_map(|s| s.owner) {
            *counts.entry(owner).or_default() += 1;
        }
        Ok(members
            .into_iter()
            .map(|m| MemberInfo {
                slots: counts.get(&m.epoch).copied().unwrap_or(0),
                this_node: m.epoch == self.epoch,
                row: m,
            })
            .collect())
    }

    /// Drains (`Draining`) or resumes (`Live`) the running member named `node_id`
    /// (its newest incarnation); its epoch, or `None` if no such member runs. The
    /// member sees it at its next renewal.
    pub async fn set_node_state(&self, node_id: &str, state: MemberState) -> Result<Option<u64>> {
        let members = self.coord.members().await?;
        let Some(target) = members
            .iter()
            .filter(|m| m.node_id == node_id && m.state.is_running())
            .max_by_key(|m| m.epoch)
        else {
            return Ok(None);
        };
        if !self.coord.set_state(target.epoch, state).await? {
            return Ok(None);
        }
        if target.epoch == self.epoch {
            self.set_draining(state == MemberState::Draining);
        }
        Ok(Some(target.epoch))
    }

    /// Hands every slot to the other members and waits (up to `timeout`) until
    /// none is left; `true` if none is.
    pub async fn drain_all(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        if let Err(e) = self
            .coord
            .set_state(self.epoch, MemberState::Draining)
            .await
        {
            tracing::warn!(error = %e, "could not start draining; the others take over once the lease lapses");
            return false;
        }
        self.set_draining(true);
        while tokio::time::Instant::now() < deadline {
            if let Ok(slots) = self.coord.slots().await {
                if !slots.iter().any(|s| s.owner == Some(self.epoch)) {
                    return true;
                }
            }
            self.nudge();
            self.changed(Duration::from_millis(200)).await;
        }
        tracing::warn!("streams still owned after the drain timeout; the others take them over once the lease lapses");
        false
    }

    /// Records that this member left: it owns nothing and its log is fully indexed
    /// (the caller stopped the WAL and waited for the index first).
    pub async fn mark_left(&self) -> bool {
        match self.coord.set_state(self.epoch, MemberState::Left).await {
            Ok(left) => left,
            Err(e) => {
                tracing::warn!(error = %e, "could not record leaving; the others take this member over once its lease lapses");
                false
            }
        }
    }

    /// The logs of finished members, for collection, while this member holds the
    /// maintenance job (they belong to nobody else); otherwise none.
    pub async fn finished_logs(&self, every: Duration) -> Vec<u64> {
        if !holds_job(Some(self), "maintenance", every).await {
            return Vec::new();
        }
        match self.coord.members().await {
            Ok(members) => members
                .iter()
                .filter(|m| m.state.is_finished())
                .map(|m| m.epoch)
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// The shortest lease of a cluster-wide job: long enough that a pass which renews
/// it between rounds (compaction) keeps it through any one round.
const JOB_LEASE_MIN: Duration = Duration::from_secs(30);

/// Whether this node runs the cluster-wide job `job` now: always on a single node;
/// in a cluster, while it holds the job's lease (three passes long, at least
/// `JOB_LEASE_MIN`), so each job runs on one member at a time and moves when that
/// member dies. Calling it again renews the lease.
pub async fn holds_job(cluster: Option<&Cluster>, job: &str, every: Duration) -> bool {
    let Some(c) = cluster else { return true };
    if !c.lease.is_valid() {
        return false;
    }
    let lease_ms = (every * 3)
        .max(c.lease.ttl())
        .max(JOB_LEASE_MIN)
        .as_millis() as u64;
    match c.coord.hold_job(job, c.epoch, lease_ms).await {
        Ok(held) => held,
        Err(e) => {
            tracing::warn!(job, error = %e, "could not take the cluster job lease");
            false
        }
    }
}

static SLOTS_OWNED: Desc = Desc::gauge(
    "picomq_cluster_slots_owned",
    "Slots (shares of the stream names) this node owns.",
);
static SLOTS_GAINED: Desc = Desc::counter(
    "picomq_cluster_slots_gained_total",
    "Slots this node took (claimed free, or handed to it).",
);
static SLOTS_LOST: Desc = Desc::counter(
    "picomq_cluster_slots_lost_total",
    "Slots this node stopped owning (handed over, or its lease lapsed).",
);
static RENEWALS: Desc = Desc::counter(
    "picomq_cluster_lease_renewals_total",
    "Member lease renewals, by outcome.",
);
static TAKEOVERS: Desc = Desc::counter(
    "picomq_cluster_takeovers_total",
    "Dead members whose log this node sealed and indexed.",
);
static TAKEOVER_OBJECTS: Desc = Desc::counter(
    "picomq_cluster_takeover_objects_replayed_total",
    "WAL objects of dead members this node indexed while taking them over.",
);
static LEASE_HELD: Desc = Desc::gauge(
    "picomq_cluster_lease_held",
    "1 while this node holds its member lease.",
);
static MEMBERS_ALIVE: Desc = Desc::gauge(
    "picomq_cluster_members_alive",
    "Members whose lease holds, as this node last read them.",
);

pub(crate) struct ClusterStats {
    pub slots_gained: Counter,
    pub slots_lost: Counter,
    pub renewals_ok: Counter,
    pub renewals_failed: Counter,
    pub takeovers: Counter,
    pub takeover_objects: Counter,
    slots_owned: Gauge,
    lease_held: Gauge,
    members_alive: Gauge,
}

impl Default for ClusterStats {
    fn default() -> Self {
        ClusterStats {
            slots_gained: Counter::new(&SLOTS_GAINED),
            slots_lost: Counter::new(&SLOTS_LOST),
            renewals_ok: Counter::labelled(&RENEWALS, &[("outcome", "ok")]),
            renewals_failed: Counter::labelled(&RENEWALS, &[("outcome", "failed")]),
            takeovers: Counter::new(&TAKEOVERS),
            takeover_objects: Counter::new(&TAKEOVER_OBJECTS),
            slots_owned: Gauge::new(&SLOTS_OWNED),
            lease_held: Gauge::new(&LEASE_HELD),
            members_alive: Gauge::new(&MEMBERS_ALIVE),
        }
    }
}

impl Source for Cluster {
    fn export(&self, out: &mut Exposition) {
        let s = &self.stats;
        s.slots_owned.set(self.owned_slots().len() as u64);
        s.lease_held.set(u64::from(self.lease.is_valid()));
        let alive = {
            let table = self.table.read().expect("cluster table");
            table.members.values().filter(|m| m.is_alive()).count()
        };
        s.members_alive.set(alive as u64);
        out.gauge(&s.slots_owned)
            .gauge(&s.lease_held)
            .gauge(&s.members_alive)
            .counter(&s.slots_gained)
            .counter(&s.slots_lost)
            .counter(&s.takeovers)
            .counter(&s.takeover_objects)
            .counter(&s.renewals_ok)
            .counter(&s.renewals_failed);
    }
}
