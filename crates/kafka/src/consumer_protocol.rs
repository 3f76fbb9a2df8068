//! Consumer groups, the KIP-848 protocol (`ConsumerGroupHeartbeat`,
//! `group.protocol=consumer`): the server assigns. Members heartbeat their
//! subscription and what they own; the group epoch moves on when members or
//! subscriptions change, the target assignment spreads each topic's partitions
//! over the members subscribed to it (partition `p` to the `p mod n`-th, members in
//! id order), and each member converges to its target incrementally: a partition
//! moves only once its previous owner has reported it released, so no partition
//! is ever owned twice. A member that reached its target takes the group epoch.
//! Offsets are the group's (`groups.rs`), committed with the member epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
};
use kafka_protocol::protocol::StrBytes;
use picomq_http::auth::Op;
use uuid::Uuid;

use crate::api::{decode, frame, Answer};
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::groups::{self, Group};
use crate::{topics, Kafka};

/// How often members heartbeat, and how long a silent one stays a member.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);
pub(crate) const SESSION: Duration = Duration::from_secs(10);

const FENCED_MEMBER_EPOCH: i16 = 110;
const UNSUPPORTED_ASSIGNOR: i16 = 112;
pub(crate) const STALE_MEMBER_EPOCH: i16 = 113;

/// A partition: (topic as the group's clients name it, partition).
type Part = (String, i32);

pub(crate) struct ConsumerMember {
    pub epoch: i32,
    pub subscribed: Vec<String>,
    /// What it was last told to own.
    pub assigned: BTreeSet<Part>,
    /// The member epoch at which each assigned partition became its: a commit
    /// for the partition may carry any epoch from there to the current one.
    pub assigned_at: BTreeMap<Part, i32>,
    /// What it last reported owning.
    pub owned: BTreeSet<Part>,
    /// Its assignment changed since it was last sent to it.
    pub unsent: bool,
    pub last_seen: Instant,
    pub client_id: String,
    pub client_host: String,
}

/// The KIP-848 side of a group.
#[derive(Default)]
pub(crate) struct ConsumerState {
    pub group_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// Partitions per topic and its id, as last resolved.
    pub topics: HashMap<String, (Uuid, i32)>,
    /// The target assignment of the current group epoch.
    target: BTreeMap<String, BTreeSet<Part>>,
}

impl ConsumerState {
    fn compute_target(&mut self) {
        let mut target: BTreeMap<String, BTreeSet<Part>> = self
            .members
            .keys()
            .map(|m| (m.clone(), BTreeSet::new()))
            .collect();
        let mut by_topic: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, m) in &self.members {
            for t in &m.subscribed {
                by_topic.entry(t.as_str()).or_default().push(id.as_str());
            }
        }
        for (topic, members) in by_topic {
            let Some(&(_, n)) = self.topics.get(topic) else {
                continue;
            };
            for p in 0..n {
                let m = members[p as usize % members.len()];
                target
                    .get_mut(m)
                    .expect("member")
                    .insert((topic.to_string(), p));
            }
        }
        self.target = target;
    }

    /// Membership or subscriptions changed: a new group epoch and target.
    fn bump(&mut self) {
        self.group_epoch += 1;
        self.compute_target();
    }

    /// Moves `member` toward its target; returns whether its assignment changed.
    /// Its epoch moves only in its own heartbeat (`own`), where the answer tells it.
    fn reconcile(&mut self, member: &str, own: bool) -> bool {
        let desired = self.target.get(member).cloned().unwrap_or_default();
        let taken: BTreeSet<Part> = self
            .members
            .iter()
            .filter(|(id, _)| id.as_str() != member)
            .flat_map(|(_, m)| m.assigned.iter().chain(m.owned.iter()).cloned())
            .collect();
        let m = self.members.get_mut(member).expect("member");
        let keep: BTreeSet<Part> = m.assigned.intersection(&desired).cloned().collect();
        let revoking = m.assigned.len() != keep.len();
        let mut next = keep;
        // New partitions only once nothing is left to revoke, and only those
        // nobody else holds or was told to hold.
        if !revoking && m.owned.iter().all(|p| desired.contains(p)) {
            next.extend(desired.iter().filter(|p| !taken.contains(*p)).cloned());
        }
        let changed = next != m.assigned;
        m.assigned = next;
        m.unsent |= changed;
        // Nothing left to give up: the member is at the group's epoch (partitions
        // still held by others come to it later, in the same epoch).
        if own && m.assigned.is_subset(&desired) && m.owned.is_subset(&desired) {
            m.epoch = self.group_epoch;
        }
        let epoch = m.epoch;
        let before = std::mem::take(&mut m.assigned_at);
        m.assigned_at = m
            .assigned
            .iter()
            .map(|p| (p.clone(), before.get(p).copied().unwrap_or(epoch)))
            .collect();
        changed
    }

    /// Members silent for longer than [`SESSION`] leave.
    pub fn expire(&mut self, now: Instant, key: &str) {
        let before = self.members.len();
        self.members.retain(|id, m| {
            let alive = now.duration_since(m.last_seen) <= SESSION;
            if !alive {
                tracing::info!(group = %key, member = %id, "kafka consumer-protocol member's session lapsed");
            }
            alive
        });
        if self.members.len() != before {
            self.bump();
        }
    }

    /// Checks an offset commit's member and epoch. A commit sent while the
    /// heartbeat answer that moved the member's epoch is on its way carries the
    /// old one; as KIP-1251 (assignment epochs), an older epoch is taken when the
    /// member has held every committed partition since that epoch: no other
    /// member can have owned them in between.
    pub fn may_commit<'a>(
        &self,
        member: &str,
        epoch: i32,
        mut parts: impl Iterator<Item = (&'a str, i32)>,
    ) -> Option<i16> {
        let m = self.members.get(member)?;
        let held = |(t, p): (&str, i32)| {
            m.assigned_at
                .get(&(t.to_string(), p))
                .is_some_and(|&since| since <= epoch)
        };
        Some(
            if epoch == m.epoch || (0 <= epoch && epoch < m.epoch && parts.all(held)) {
                code::NONE
            } else {
                STALE_MEMBER_EPOCH
            },
        )
    }
}

/// A topic's id: stable for the life of its partition-0 stream (its id), and
/// different for a topic deleted and created again.
pub(crate) fn topic_id(cluster: &str, stream_id: u64, base: &str) -> Uuid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&stream_id.to_be_bytes());
    b[8..12].copy_from_slice(&crc32c::crc32c(base.as_bytes()).to_be_bytes());
    b[12..].copy_from_slice(&crc32c::crc32c(cluster.as_bytes()).to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x80; // version 8: made by the application
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    Uuid::from_bytes(b)
}

pub(crate) async fn heartbeat(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: ConsumerGroupHeartbeatRequest = decode(request)?;
    let mut resp = ConsumerGroupHeartbeatResponse::default()
        .with_heartbeat_interval_ms(HEARTBEAT.as_millis() as i32);
    let fail = |mut resp: ConsumerGroupHeartbeatResponse, c: i16, m: String| {
        resp.error_code = c;
        resp.error_message = Some(StrBytes::from_string(m));
        frame(ApiKey::ConsumerGroupHeartbeat, &request.header, &resp)
    };
    let key = match crate::group_api::group_key(kafka, session, &req.group_id) {
        Ok(k) => k,
        Err(c) => return Ok(fail(resp, c, "this token may not use that group".into())),
    };
    if req
        .server_assignor
        .as_ref()
        .is_some_and(|a| a.as_str() != "uniform" && a.as_str() != "range")
    {
        return Ok(fail(
            resp,
            UNSUPPORTED_ASSIGNOR,
            "the assignors are uniform and range".into(),
        ));
    }
    if req
        .subscribed_topic_regex
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        return Ok(fail(
            resp,
            code::INVALID_REQUEST,
            "regular-expression subscriptions are not supported: subscribe by name".into(),
        ));
    }
    // The subscribed topics' partitions and ids, resolved outside the group's lock.
    let mut resolved = Vec::new();
    for t in req.subscribed_topic_names.iter().flatten() {
        let name = t.0.to_string();
        let base = match topics::stream_name(kafka, session, &name, 0, Op::Read) {
            Ok(b) => b,
            Err((c, m)) => return Ok(fail(resp, c, m)),
        };
        match topics::partition_count_and_id(kafka, &base).await {
            Ok(Some((n, id))) => resolved.push((name, (topic_id(&kafka.cluster_id, id, &base), n))),
            Ok(None) => {}
            Err(e) => {
                let (c, m) = errors::of(&e);
                return Ok(fail(resp, c, m));
            }
        }
    }
    let group = match kafka.groups.group(kafka, &key) {
        Ok(g) => g,
        Err(c) => {
            let m = if c == groups::NOT_COORDINATOR {
                "another broker coordinates this group"
            } else {
                "too many groups"
            };
            return Ok(fail(resp, c, m.into()));
        }
    };
    let mut g = group.lock().await;
    if !g.members.is_empty() {
        return Ok(fail(
            resp,
            groups::INCONSISTENT_GROUP_PROTOCOL,
            "the group's members use the classic protocol".into(),
        ));
    }
    let answer = member_heartbeat(&mut g, &req, session, request, resolved);
    drop(g);
    match answer {
        Ok((member_id, epoch, assignment)) => {
            resp.member_id = Some(StrBytes::from_string(member_id));
            resp.member_epoch = epoch;
            resp.assignment = assignment;
            Ok(frame(
                ApiKey::ConsumerGroupHeartbeat,
                &request.header,
                &resp,
            ))
        }
        Err((c, m)) => Ok(fail(resp, c, m)),
    }
}

#[allow(clippy::type_complexity)]
fn member_heartbeat(
    g: &mut Group,
    req: &ConsumerGroupHeartbeatRequest,
    session: &Session,
    request: &Request,
    resolved: Vec<(String, (Uuid, i32))>,
) -> Result<(String, i32, Option<Assignment>), (i16, String)> {
    let cg = &mut g.consumer;
    let now = Instant::now();
    let mut member_id = req.member_id.to_string();
    if req.member_epoch < 0 {
        // -1: leaving; -2: a static member leaving for now. Either way it goes.
        if cg.members.remove(&member_id).is_some() {
            cg.bump();
        }
        return Ok((member_id, req.member_epoch, None));
    }
    let mut refreshed = false;
    for (name, t) in resolved {
        if cg.topics.insert(name, t) != Some(t) {
            refreshed = true;
        }
    }
    let rejoin = req.member_epoch == 0
        && cg
            .members
            .get(&member_id)
            .is_none_or(|m| m.epoch != 0 || !m.assigned.is_empty());
    if rejoin {
        if member_id.is_empty() {
            member_id = Uuid::from_u128(fastrand::u128(..)).to_string();
        }
        if !cg.members.contains_key(&member_id) && cg.members.len() >= 1_000 {
            return Err((groups::GROUP_MAX_SIZE_REACHED, "the group is full".into()));
        }
        let m = cg
            .members
            .entry(member_id.clone())
            .or_insert(ConsumerMember {
                epoch: 0,
                subscribed: Vec::new(),
                assigned: BTreeSet::new(),
                assigned_at: BTreeMap::new(),
                owned: BTreeSet::new(),
                unsent: true,
                last_seen: now,
                client_id: request
                    .header
                    .client_id
                    .as_deref()
                    .unwrap_or("")
                    .to_string(),
                client_host: session.peer.clone(),
            });
        // A rejoin starts over.
        m.assigned.clear();
        m.assigned_at.clear();
        m.owned.clear();
        m.unsent = true;
        refreshed = true;
    }
    let Some(m) = cg.members.get_mut(&member_id) else {
        return Err((
            groups::UNKNOWN_MEMBER_ID,
            "unknown member: join with epoch 0".into(),
        ));
    };
    if req.member_epoch != 0 && req.member_epoch != m.epoch {
        return Err((
            FENCED_MEMBER_EPOCH,
            format!(
                "member epoch {} is not the member's {}",
                req.member_epoch, m.epoch
            ),
        ));
    }
    m.last_seen = now;
    if let Some(names) = &req.subscribed_topic_names {
        let names: Vec<String> = names.iter().map(|t| t.0.to_string()).collect();
        if names != m.subscribed {
            m.subscribed = names;
            refreshed = true;
        }
    }
    if let Some(owned) = &req.topic_partitions {
        let by_id: HashMap<Uuid, String> = cg
            .topics
            .iter()
            .map(|(name, (id, _))| (*id, name.clone()))
            .collect();
        let m = cg.members.get_mut(&member_id).expect("member");
        m.owned = owned
            .iter()
            .filter_map(|tp| by_id.get(&tp.topic_id).map(|n| (n.clone(), &tp.partitions)))
            .flat_map(|(n, ps)| ps.iter().map(move |p| (n.clone(), *p)))
            .collect();
    }
    if refreshed {
        cg.bump();
    }
    // Others may be waiting on what this member released.
    let ids: Vec<String> = cg.members.keys().cloned().collect();
    cg.reconcile(&member_id, true);
    for id in ids.iter().filter(|id| **id != member_id) {
        cg.reconcile(id, false);
    }
    let m = cg.members.get_mut(&member_id).expect("member");
    let send = std::mem::take(&mut m.unsent) || req.topic_partitions.is_some();
    let m = &cg.members[&member_id];
    let assignment = send.then(|| {
        let mut per: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        for (t, p) in &m.assigned {
            if let Some((id, _)) = cg.topics.get(t) {
                per.entry(*id).or_default().push(*p);
            }
        }
        Assignment::default().with_topic_partitions(
            per.into_iter()
                .map(|(id, ps)| {
                    TopicPartitions::default()
                        .with_topic_id(id)
                        .with_partitions(ps)
                })
                .collect(),
        )
    });
    Ok((member_id, m.epoch, assignment))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(topic: &str) -> ConsumerMember {
        ConsumerMember {
            epoch: 0,
            subscribed: vec![topic.to_string()],
            assigned: BTreeSet::new(),
            assigned_at: BTreeMap::new(),
            owned: BTreeSet::new(),
            unsent: true,
            last_seen: Instant::now(),
            client_id: String::new(),
            client_host: String::new(),
        }
    }

    /// Heartbeats from `id` reporting that it owns what it was assigned.
    fn heartbeat(cg: &mut ConsumerState, id: &str) {
        let m = cg.members.get_mut(id).unwrap();
        m.owned = m.assigned.clone();
        let ids: Vec<String> = cg.members.keys().cloned().collect();
        cg.reconcile(id, true);
        for other in ids.iter().filter(|o| o.as_str() != id) {
            cg.reconcile(other, false);
        }
    }

    #[test]
    fn commits_may_carry_an_epoch_since_which_the_member_held_the_partitions() {
        let mut cg = ConsumerState::default();
        cg.topics.insert("t".into(), (Uuid::nil(), 4));
        cg.members.insert("a".into(), member("t"));
        cg.members.insert("b".into(), member("t"));
        cg.bump();
        for _ in 0..3 {
            heartbeat(&mut cg, "a");
            heartbeat(&mut cg, "b");
        }
        let old = cg.members["a"].epoch;
        assert_eq!(old, cg.group_epoch);
        let held: Vec<i32> = cg.members["a"].assigned.iter().map(|p| p.1).collect();
        assert_eq!(held, [0, 2]);
        // b leaves; a's next heartbeat takes every partition at a new epoch.
        cg.members.remove("b");
        cg.bump();
        heartbeat(&mut cg, "a");
        heartbeat(&mut cg, "a");
        let new = cg.members["a"].epoch;
        assert!(new > old);
        assert_eq!(cg.members["a"].assigned.len(), 4);
        let check =
            |epoch, parts: &[i32]| cg.may_commit("a", epoch, parts.iter().map(|p| ("t", *p)));
        assert_eq!(check(new, &[0, 1, 2, 3]), Some(code::NONE));
        // A commit sent before the answer with the new epoch arrived.
        assert_eq!(check(old, &[0, 2]), Some(code::NONE));
        // Not for partitions that came with the new epoch, nor from the future.
        assert_eq!(check(old, &[0, 1]), Some(STALE_MEMBER_EPOCH));
        assert_eq!(check(new + 1, &[0]), Some(STALE_MEMBER_EPOCH));
        assert_eq!(check(-1, &[0]), Some(STALE_MEMBER_EPOCH));
        // A partition the member no longer holds.
        assert_eq!(check(old, &[7]), Some(STALE_MEMBER_EPOCH));
        assert_eq!(cg.may_commit("nobody", new, std::iter::empty()), None);
    }
}
