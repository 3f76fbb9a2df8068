//! What a cluster asks of its coordination store (Postgres): member leases, slot
//! owners, takeovers of dead members' logs, cluster-wide job leases and stream ids.
//!
//! Every time judgement ("has this lease lapsed?") is made by the store's own clock
//! inside the statement that acts on it, so no two nodes' clocks are ever compared.

use async_trait::async_trait;

use crate::error::Result;

/// A member's state. A member is one incarnation of a node (one epoch, one log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Serving, owning slots while its lease holds.
    Live,
    /// Handing its slots to the others (drain, or shutdown); still renewing.
    Draining,
    /// Its lease lapsed; `sealer` is sealing its log and replaying what was not indexed.
    Sealing,
    /// Its log is sealed and fully indexed; it owns nothing.
    Replayed,
    /// It handed everything over and stopped; its log is fully indexed.
    Left,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Live => "live",
            MemberState::Draining => "draining",
            MemberState::Sealing => "sealing",
            MemberState::Replayed => "replayed",
            MemberState::Left => "left",
        }
    }

    pub fn parse(s: &str) -> Option<MemberState> {
        Some(match s {
            "live" => MemberState::Live,
            "draining" => MemberState::Draining,
            "sealing" => MemberState::Sealing,
            "replayed" => MemberState::Replayed,
            "left" => MemberState::Left,
            _ => return None,
        })
    }

    /// Renewing its lease and answering for its slots.
    pub fn is_running(self) -> bool {
        matches!(self, MemberState::Live | MemberState::Draining)
    }

    /// Its log needs nothing more from anyone: every object in it is indexed.
    pub fn is_finished(self) -> bool {
        matches!(self, MemberState::Replayed | MemberState::Left)
    }
}

#[derive(Clone, Debug)]
pub struct MemberRow {
    pub epoch: u64,
    pub node_id: String,
    pub advertise: String,
    pub state: MemberState,
    /// Lease time left by the store's clock, in ms; negative once lapsed.
    pub lease_left_ms: i64,
    /// The member sealing this one's log (state `Sealing`).
    pub sealer: Option<u64>,
    /// Next WAL sequence of this member's log not yet indexed.
    pub applied_seq: u64,
    pub joined_unix_ms: u64,
    /// Its Kafka listener as clients reach it (`HOST:PORT`), if it has one.
    pub kafka: Option<String>,
}

impl MemberRow {
    /// Running with a lease the store has not judged lapsed.
    pub fn is_alive(&self) -> bool {
        self.state.is_running() && self.lease_left_ms > 0
    }
}

/// One slot's owner (a member's epoch) and how many times it changed hands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRow {
    pub slot: u32,
    pub owner: Option<u64>,
    pub generation: u64,
}

/// A member joining: its log's epoch and how others reach it.
#[derive(Clone, Debug)]
pub struct Joining {
    pub epoch: u64,
    pub node_id: String,
    pub advertise: String,
    pub lease_ms: u64,
    /// Its Kafka listener as clients reach it (`HOST:PORT`), if it has one.
    pub kafka: Option<String>,
}

#[async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// The highest epoch any member ever had (0: none).
    async fn max_epoch(&self) -> Result<u64>;
    /// Registers a live member holding a fresh lease.
    async fn join(&self, member: &Joining) -> Result<()>;
    /// Extends the lease of a running member and returns its state (`Live` or
    /// `Draining`); `None` if it is no longer running (another member took its log
    /// over, or it left).
    async fn renew(&self, epoch: u64, lease_ms: u64) -> Result<Option<MemberState>>;
    /// Moves a running member to `Draining` or `Left` (`Left` only without slots).
    async fn set_state(&self, epoch: u64, state: MemberState) -> Result<bool>;
    /// Every member not `Left` or `Replayed` for long (the store keeps a few for
    /// the record).
    async fn members(&self) -> Result<Vec<MemberRow>>;
    /// Every slot, in slot order.
    async fn slots(&self) -> Result<Vec<SlotRow>>;
    async fn slot(&self, slot: u32) -> Result<SlotRow>;
    /// Takes the slots among `slots` that have no owner or whose owner is finished;
    /// returns those taken.
    async fn claim(&self, epoch: u64, slots: &[u32]) -> Result<Vec<SlotRow>>;
    /// Gives `slot`, owned by `from`, to the running member `to` (or to nobody).
    async fn hand_over(&self, from: u64, slot: u32, to: Option<u64>) -> Result<Option<SlotRow>>;
    /// Starts taking over `dead`'s log if its lease lapsed (or its sealer's did,
    /// or `me` is a newer incarnation of the same node at the same address):
    /// marks it `Sealing` by `me`; returns its `applied_seq`, or `None` if it is not
    /// up for takeover (alive, finished, or another member is on it).
    async fn begin_takeover(&self, me: u64, dead: u64) -> Result<Option<u64>>;
    /// `dead`'s log is sealed and indexed: it becomes `Replayed`, its slots free.
    async fn finish_takeover(&self, me: u64, dead: u64) -> Result<()>;
    /// Holds the cluster-wide job lease `job` for `lease_ms` if it is free, lapsed or
    /// already `epoch`'s; `true` if held.
    async fn hold_job(&self, job: &str, epoch: u64, lease_ms: u64) -> Result<bool>;
    /// Reserves `n` stream ids; returns the first.
    async fn reserve_ids(&self, n: u64) -> Result<u64>;
    /// The key members present to each other's cluster endpoints (made once, with
    /// the cluster; only those who can read the store know it).
    async fn cluster_key(&self) -> Result<String>;
}
