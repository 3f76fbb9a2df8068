//! Consumer groups, the classic protocol. A group's coordinator is the node
//! serving its offsets stream (every group on one node; on a cluster the
//! member owning that stream's slot, `brokers`). Others answer NOT_COORDINATOR.
//! A group's state in memory belongs to one term of the coordinator's service
//! of that slot: after the slot moved away and back, it is dropped and read
//! afresh (another member may have coordinated it meanwhile).
//!
//! Membership lives in memory (as in Kafka, a restart makes members rejoin);
//! committed offsets are durable: each group's commits are JSON records of a
//! reserved stream `__kafka/groups/{group}`, acknowledged once durable like any
//! append, read back when the group is first used after a start. Every
//! [`SNAPSHOT_EVERY`] commits a snapshot record of all offsets is appended and
//! the stream trimmed before it.
//!
//! A rebalance: a join (a new member, a changed subscription) or a departure
//! (LeaveGroup, a session that lapsed) moves the group to `PreparingRebalance`;
//! members learn it from their heartbeats and rejoin. Once every member has
//! rejoined (or its rebalance timeout passed) and the join delay has passed, the
//! generation moves on, the leader gets the members and their subscriptions, and
//! its SyncGroup hands every member its assignment.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use picomq_engine::{EngineError, StreamName};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Mutex};

use crate::errors::code;
use crate::{json_log, Kafka};

/// Commits between two snapshots of a group's offsets.
const SNAPSHOT_EVERY: u64 = 256;
/// Groups held in memory at once.
pub(crate) const GROUPS_MAX: usize = 10_000;
/// Members one group may have.
const MEMBERS_MAX: usize = 1_000;
/// Longest group id.
pub(crate) const GROUP_ID_MAX: usize = 249;
/// Bounds on what clients ask for.
const SESSION_MIN: Duration = Duration::from_millis(1_000);
const SESSION_MAX: Duration = Duration::from_secs(300);

pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
pub(crate) const ILLEGAL_GENERATION: i16 = 22;
pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
pub(crate) const INVALID_SESSION_TIMEOUT: i16 = 26;
pub(crate) const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
pub(crate) const MEMBER_ID_REQUIRED: i16 = 79;
pub(crate) const GROUP_MAX_SIZE_REACHED: i16 = 81;
pub(crate) const NON_EMPTY_GROUP: i16 = 68;
pub(crate) const GROUP_ID_NOT_FOUND: i16 = 69;
pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub(crate) const INVALID_GROUP_ID: i16 = 24;
pub(crate) const NOT_COORDINATOR: i16 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// What a JoinGroup gets once the join phase ends.
#[derive(Clone, Debug)]
pub(crate) struct Joined {
    pub error: i16,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// For the leader: every member and its metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl Joined {
    /// A JoinGroup answered with `error`.
    fn refused(error: i16, member_id: String) -> Joined {
        Joined {
            error,
            generation: -1,
            protocol: None,
            leader: String::new(),
            member_id,
            members: Vec::new(),
        }
    }
}

pub(crate) struct Member {
    pub client_id: String,
    pub client_host: String,
    pub instance_id: Option<String>,
    pub session: Duration,
    pub rebalance: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    pub last_seen: Instant,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<(i16, Bytes)>>,
}

/// A committed offset.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Committed {
    pub offset: i64,
    pub epoch: i32,
    pub metadata: Option<String>,
}

pub(crate) struct Group {
    /// The group id with the token's namespace before it.
    pub key: String,
    pub state: State,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    rebalance_started: Instant,
    pub offsets: BTreeMap<(String, i32), Committed>,
    /// Where reading the offsets stream got to: commits that arrive other than
    /// through this group (a transaction's, published at its commit) are read
    /// from here on the next use.
    read_to: Option<picomq_engine::Offset>,
    commits_since_snapshot: u64,
    /// Its members of the KIP-848 protocol (a group uses one protocol or the other).
    pub consumer: crate::consumer_protocol::ConsumerState,
}

/// A group in memory and the term of its coordinator's slot it was made at.
type Held = (u64, Arc<Mutex<Group>>);

/// Every group this node coordinates.
#[derive(Default)]
pub(crate) struct Coordinator {
    groups: StdMutex<HashMap<String, Held>>,
}

/// The name of the reserved stream holding group `key`'s committed offsets.
pub(crate) fn offsets_stream_name(key: &str) -> String {
    format!("__kafka/groups/{key}")
}

/// The reserved stream holding a group's committed offsets.
fn offsets_stream(kafka: &Kafka, key: &str) -> Result<StreamName, EngineError> {
    Ok(StreamName::new(
        offsets_stream_name(key),
        kafka.engine.config().stream_name_bytes_max,
    )?)
}

/// The term this node coordinates group `key` at; NOT_COORDINATOR while it
/// does not (another member does, or the group is moving).
pub(crate) fn coordinating(kafka: &Kafka, key: &str) -> Result<u64, i16> {
    let name = offsets_stream_name(key);
    if !kafka.engine.serves(&name) {
        return Err(NOT_COORDINATOR);
    }
    Ok(kafka.engine.term_of(&name))
}

impl Coordinator {
    /// The group `key`, made (empty) if new or of an earlier term: NOT_COORDINATOR
    /// on a node that does not coordinate it, COORDINATOR_NOT_AVAILABLE past
    /// [`GROUPS_MAX`].
    pub fn group(&self, kafka: &Kafka, key: &str) -> Result<Arc<Mutex<Group>>, i16> {
        let term = coordinating(kafka, key)?;
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = current(&mut groups, key, term) {
            return Ok(g);
        }
        if groups.len() >= GROUPS_MAX {
            // Forget a group nobody is in (its offsets stay durable).
            let idle = groups
                .iter()
                .find(|(_, (_, g))| {
                    g.try_lock()
                        .is_ok_and(|g| g.members.is_empty() && g.consumer.members.is_empty())
                })
                .map(|(k, _)| k.clone())
                .ok_or(COORDINATOR_NOT_AVAILABLE)?;
            groups.remove(&idle);
        }
        let g = Arc::new(Mutex::new(Group {
            key: key.to_string(),
            state: State::Empty,
            generation: 0,
            protocol_type: String::new(),
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            rebalance_started: Instant::now(),
            offsets: BTreeMap::new(),
            read_to: None,
            commits_since_snapshot: 0,
            consumer: Default::default(),
        }));
        groups.insert(key.to_string(), (term, g.clone()));
        Ok(g)
    }

    /// The group `key` if it is in memory (of this term); NOT_COORDINATOR on a
    /// node that does not coordinate it.
    pub fn existing(&self, kafka: &Kafka, key: &str) -> Result<Option<Arc<Mutex<Group>>>, i16> {
        let term = coordinating(kafka, key)?;
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        Ok(current(&mut groups, key, term))
    }

    pub fn forget(&self, key: &str) {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Keys of the groups in memory.
    pub fn keys(&self) -> Vec<String> {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }
}

/// The group `key` held at `term`; one held at an earlier term is taken out and
/// unloaded (see `Group::unload`) once its lock is free.
fn current(groups: &mut HashMap<String, Held>, key: &str, term: u64) -> Option<Arc<Mutex<Group>>> {
    match groups.get(key) {
        Some((t, g)) if *t == term => Some(g.clone()),
        Some(_) => {
            if let Some((_, stale)) = groups.remove(key) {
                tokio::spawn(async move { stale.lock().await.unload() });
            }
            None
        }
        None => None,
    }
}

/// Expires lapsed sessions and ends join phases that are due; unloads the groups
/// this node no longer coordinates (their slot moved to another member), answering
/// their waiting members NOT_COORDINATOR at once. Runs until `shutdown`.
pub(crate) async fn tick(kafka: Arc<Kafka>, shutdown: picomq_engine::shutdown::ShutdownSignal) {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = shutdown.fired() => return,
        }
        let (groups, unloaded) = {
            let mut held = kafka
                .groups
                .groups
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let gone: Vec<String> = held
                .iter()
                .filter(|(key, (term, _))| coordinating(&kafka, key) != Ok(*term))
                .map(|(key, _)| key.clone())
                .collect();
            let unloaded: Vec<_> = gone.iter().filter_map(|k| held.remove(k)).collect();
            let groups: Vec<_> = held.values().map(|(_, g)| g.clone()).collect();
            (groups, unloaded)
        };
        for (_, g) in unloaded {
            g.lock().await.unload();
        }
        for g in groups {
            let mut g = g.lock().await;
            g.expire(Instant::now());
            g.complete_join(kafka.join_delay, Instant::now());
            let key = g.key.clone();
            g.consumer.expire(Instant::now(), &key);
        }
    }
}

pub(crate) struct JoinRequest {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session: Duration,
    pub rebalance: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// The client may be told to come back with a member id (JoinGroup v4+).
    pub member_id_required: bool,
}

impl Group {
    fn start_rebalance(&mut self, now: Instant) {
        if self.state != State::PreparingRebalance {
            self.state = State::PreparingRebalance;
            self.rebalance_started = now;
        }
        // Members waiting for their assignment must rejoin.
        for m in self.members.values_mut() {
            if let Some(tx) = m.sync.take() {
                let _ = tx.send((REBALANCE_IN_PROGRESS, Bytes::new()));
            }
        }
    }

    /// A JoinGroup: an answer now (an error, or a member id to come back with),
    /// or a receiver for the answer once the join phase ends.
    pub fn join(
        &mut self,
        req: JoinRequest,
        join_delay: Duration,
    ) -> Result<oneshot::Receiver<Joined>, Joined> {
        let now = Instant::now();
        let refuse = Joined::refused;
        if req.session < SESSION_MIN || req.session > SESSION_MAX {
            return Err(refuse(INVALID_SESSION_TIMEOUT, req.member_id));
        }
        if !self.consumer.members.is_empty() {
            return Err(refuse(INCONSISTENT_GROUP_PROTOCOL, req.member_id));
        }
        if self.members.is_empty() {
            self.protocol_type = req.protocol_type.clone();
        }
        if req.protocols.is_empty() || req.protocol_type != self.protocol_type {
            return Err(refuse(INCONSISTENT_GROUP_PROTOCOL, req.member_id));
        }
        let known = self.members.contains_key(&req.member_id);
        if !req.member_id.is_empty() && !known {
            return Err(refuse(UNKNOWN_MEMBER_ID, req.member_id));
        }
        if req.member_id.is_empty() {
            if self.members.len() >= MEMBERS_MAX {
                return Err(refuse(GROUP_MAX_SIZE_REACHED, String::new()));
            }
            let id = format!(
                "{}-{:016x}",
                if req.client_id.is_empty() {
                    "member"
                } else {
                    &req.client_id
                },
                fastrand::u64(..)
            );
            if req.member_id_required {
                // Registered now, so its session counts; it joins with this id.
                self.members.insert(id.clone(), Member::new(&req, now));
                return Err(refuse(MEMBER_ID_REQUIRED, id));
            }
            return self.join_as(id, req, now, join_delay);
        }
        let id = req.member_id.clone();
        self.join_as(id, req, now, join_delay)
    }

    fn join_as(
        &mut self,
        id: String,
        req: JoinRequest,
        now: Instant,
        join_delay: Duration,
    ) -> Result<oneshot::Receiver<Joined>, Joined> {
        let changed = match self.members.get(&id) {
            Some(m) => {
                m.protocols != req.protocols
                    || m.join.is_none() && self.state != State::PreparingRebalance
            }
            None => true,
        };
        let member = self
            .members
            .entry(id.clone())
            .or_insert_with(|| Member::new(&req, now));
        member.protocols = req.protocols;
        member.session = req.session;
        member.rebalance = req.rebalance;
        member.last_seen = now;
        let (tx, rx) = oneshot::channel();
        if let Some(old) = member.join.replace(tx) {
            drop(old);
        }
        if changed || self.state != State::PreparingRebalance {
            self.start_rebalance(now);
        }
        self.complete_join(join_delay, now);
        Ok(rx)
    }

    /// Ends the join phase when every member has rejoined (and the delay for
    /// others to arrive has passed) or the rebalance timeout has.
    pub fn complete_join(&mut self, join_delay: Duration, now: Instant) {
        if self.state != State::PreparingRebalance {
            return;
        }
        let waited = now.duration_since(self.rebalance_started);
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance)
            .max()
            .unwrap_or_default();
        let all_in = self.members.values().all(|m| m.join.is_some());
        if !(all_in && waited >= join_delay || waited >= timeout) {
            return;
        }
        // Those that did not rejoin in time leave.
        self.members.retain(|_, m| m.join.is_some());
        if self.members.is_empty() {
            self.state = State::Empty;
            self.leader = None;
            self.protocol = None;
            self.generation += 1;
            return;
        }
        // The first protocol of the leader's (in its order) that every member has.
        let leader = match &self.leader {
            Some(l) if self.members.contains_key(l) => l.clone(),
            _ => self.members.keys().next().cloned().expect("members"),
        };
        let protocol = self.members[&leader]
            .protocols
            .iter()
            .map(|(n, _)| n.clone())
            .find(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(p, _)| p == n))
            });
        let Some(protocol) = protocol else {
            for m in self.members.values_mut() {
                if let Some(tx) = m.join.take() {
                    let _ = tx.send(Joined::refused(INCONSISTENT_GROUP_PROTOCOL, String::new()));
                }
            }
            self.members.clear();
            self.state = State::Empty;
            return;
        };
        self.generation += 1;
        self.leader = Some(leader.clone());
        self.protocol = Some(protocol.clone());
        self.state = State::CompletingRebalance;
        let all: Vec<(String, Option<String>, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(p, _)| *p == protocol)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), m.instance_id.clone(), meta)
            })
            .collect();
        for (id, m) in self.members.iter_mut() {
            m.last_seen = now;
            m.assignment = Bytes::new();
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: code::NONE,
                    generation: self.generation,
                    protocol: Some(protocol.clone()),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        all.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }

    /// A SyncGroup: the member's assignment now, or a receiver for it.
    pub fn sync(
        &mut self,
        member: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<oneshot::Receiver<(i16, Bytes)>, (i16, Bytes)> {
        let Some(m) = self.members.get_mut(member) else {
            return Err((UNKNOWN_MEMBER_ID, Bytes::new()));
        };
        m.last_seen = Instant::now();
        if generation != self.generation {
            return Err((ILLEGAL_GENERATION, Bytes::new()));
        }
        match self.state {
            State::PreparingRebalance | State::Empty => {
                return Err((REBALANCE_IN_PROGRESS, Bytes::new()))
            }
            State::Stable => return Err((code::NONE, m.assignment.clone())),
            State::CompletingRebalance => {}
        }
        if self.leader.as_deref() == Some(member) {
            for (id, a) in assignments {
                if let Some(m) = self.members.get_mut(&id) {
                    m.assignment = a;
                }
            }
            self.state = State::Stable;
            for m in self.members.values_mut() {
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send((code::NONE, m.assignment.clone()));
                }
            }
            return Err((code::NONE, self.members[member].assignment.clone()));
        }
        let (tx, rx) = oneshot::channel();
        self.members.get_mut(member).expect("checked").sync = Some(tx);
        Ok(rx)
    }

    pub fn heartbeat(&mut self, member: &str, generation: i32) -> i16 {
        let Some(m) = self.members.get_mut(member) else {
            return UNKNOWN_MEMBER_ID;
        };
        m.last_seen = Instant::now();
        if self.state == State::PreparingRebalance {
            return REBALANCE_IN_PROGRESS;
        }
        if generation != self.generation {
            return ILLEGAL_GENERATION;
        }
        code::NONE
    }

    /// This node stopped coordinating the group: every member waiting in
    /// JoinGroup or SyncGroup is answered NOT_COORDINATOR now, so it finds the
    /// new coordinator instead of waiting for its request to time out.
    fn unload(&mut self) {
        for (id, m) in self.members.iter_mut() {
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined::refused(NOT_COORDINATOR, id.clone()));
            }
            if let Some(tx) = m.sync.take() {
                let _ = tx.send((NOT_COORDINATOR, Bytes::new()));
            }
        }
        self.members.clear();
    }

    pub fn leave(&mut self, member: &str) -> i16 {
        let Some(mut m) = self.members.remove(member) else {
            return UNKNOWN_MEMBER_ID;
        };
        if let Some(tx) = m.join.take() {
            drop(tx);
        }
        if self.members.is_empty() {
            self.state = State::Empty;
            self.leader = None;
            self.generation += 1;
        } else {
            self.start_rebalance(Instant::now());
        }
        code::NONE
    }

    /// Members whose session lapsed leave (a member waiting in JoinGroup or
    /// SyncGroup is alive).
    pub fn expire(&mut self, now: Instant) {
        let lapsed: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.join.is_none() && m.sync.is_none() && now.duration_since(m.last_seen) > m.session
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in lapsed {
            tracing::info!(group = %self.key, member = %id, "kafka group member's session lapsed");
            self.leave(&id);
        }
    }

    /// Checks a commit's member and generation (`-1`: a commit from outside the
    /// group's membership, as a consumer that assigns itself makes).
    pub fn may_commit<'a>(
        &self,
        member: &str,
        generation: i32,
        parts: impl Iterator<Item = (&'a str, i32)>,
    ) -> i16 {
        if let Some(c) = self.consumer.may_commit(member, generation, parts) {
            return c;
        }
        if generation < 0 && member.is_empty() {
            return if self.members.is_empty() && self.consumer.members.is_empty() {
                code::NONE
            } else {
                // Kafka lets a group with members take only its members' commits.
                UNKNOWN_MEMBER_ID
            };
        }
        if !self.members.contains_key(member) {
            return UNKNOWN_MEMBER_ID;
        }
        if generation != self.generation {
            return ILLEGAL_GENERATION;
        }
        // As Kafka: while a rebalance is being prepared, the generation ending
        // may still commit what it processed; between join and sync it may not.
        if self.state == State::CompletingRebalance {
            return REBALANCE_IN_PROGRESS;
        }
        code::NONE
    }

    /// Reads the group's committed offsets from its stream: all of it the first
    /// time, then what was appended since (a transaction's offsets, published at
    /// its commit). Records read again are applied again, harmlessly.
    pub async fn load_offsets(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        let name = offsets_stream(kafka, &self.key)?;
        let stream = match kafka.engine.stream(&name).await {
            Ok(s) => s,
            Err(EngineError::NotFound) => {
                self.offsets.clear();
                self.read_to = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let tail = stream.handle.view().tail;
        if self.read_to == Some(tail) {
            return Ok(());
        }
        let start = kafka.engine.first_record(&stream).await?.offset;
        let at = match self.read_to {
            Some(r) if r >= start => r,
            _ => {
                // First read, or trimmed past by a snapshot: from the start.
                self.offsets.clear();
                start
            }
        };
        let at = json_log::read(kafka, &stream, at, |v| self.apply(v)).await?;
        self.read_to = Some(at);
        Ok(())
    }

    fn apply(&mut self, v: &Value) {
        if let Some(all) = v.get("snapshot").and_then(Value::as_array) {
            self.offsets.clear();
            self.apply_entries(all);
        } else if let Some(some) = v.get("commit").and_then(Value::as_array) {
            self.apply_entries(some);
        }
    }

    fn apply_entries(&mut self, entries: &[Value]) {
        for e in entries {
            let (Some(t), Some(p), Some(o)) = (
                e.get(0).and_then(Value::as_str),
                e.get(1).and_then(Value::as_i64),
                e.get(2).and_then(Value::as_i64),
            ) else {
                continue;
            };
            let committed = Committed {
                offset: o,
                epoch: e.get(3).and_then(Value::as_i64).unwrap_or(-1) as i32,
                metadata: e.get(4).and_then(Value::as_str).map(str::to_string),
            };
            if o < 0 {
                self.offsets.remove(&(t.to_string(), p as i32));
            } else {
                self.offsets.insert((t.to_string(), p as i32), committed);
            }
        }
    }

    /// Commits `entries` (topic as the group's clients name it, partition,
    /// offset): durable before this returns.
    pub async fn commit(
        &mut self,
        kafka: &Kafka,
        entries: Vec<(String, i32, Committed)>,
    ) -> Result<(), EngineError> {
        self.load_offsets(kafka).await?;
        let name = offsets_stream(kafka, &self.key)?;
        let rows: Vec<Value> = entries
            .iter()
            .map(|(t, p, c)| json!([t, p, c.offset, c.epoch, c.metadata]))
            .collect();
        let body = json!({ "commit": rows });
        json_log::append(kafka, &name, body).await?;
        for (t, p, c) in entries {
            self.offsets.insert((t, p), c);
        }
        self.commits_since_snapshot += 1;
        if self.commits_since_snapshot >= SNAPSHOT_EVERY {
            self.snapshot(kafka, &name).await?;
        }
        Ok(())
    }

    /// Appends every offset as one record and trims what came before it.
    async fn snapshot(&mut self, kafka: &Kafka, name: &StreamName) -> Result<(), EngineError> {
        let rows: Vec<Value> = self
            .offsets
            .iter()
            .map(|((t, p), c)| json!([t, p, c.offset, c.epoch, c.metadata]))
            .collect();
        let tail = kafka.engine.stream(name).await?.handle.view().tail;
        json_log::append(kafka, name, json!({ "snapshot": rows })).await?;
        kafka.engine.trim(name, tail).await?;
        self.commits_since_snapshot = 0;
        Ok(())
    }

    /// Deletes the group's offsets (DeleteGroups).
    pub async fn delete_offsets(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        let name = offsets_stream(kafka, &self.key)?;
        match kafka.engine.delete(&name).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.offsets.clear();
        self.read_to = None;
        Ok(())
    }
}

impl Member {
    fn new(req: &JoinRequest, now: Instant) -> Member {
        Member {
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            instance_id: req.instance_id.clone(),
            session: req.session,
            rebalance: req.rebalance,
            protocols: req.protocols.clone(),
            assignment: Bytes::new(),
            last_seen: now,
            join: None,
            sync: None,
        }
    }
}

/// Unused offsets of a group answer -1.
pub(crate) fn none_committed() -> Committed {
    Committed {
        offset: -1,
        epoch: -1,
        metadata: None,
    }
}
