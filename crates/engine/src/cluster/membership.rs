//! The membership loop of a node: renew the lease; read the members and the slot
//! owners; take over members whose lease lapsed; hand the slots this member should
//! no longer own to the members that should; claim the free slots that are its own.
//!
//! Every node runs the same assignment (`slots`) over the same members, so they
//! agree on where each slot belongs without talking to each other. A slot changes
//! hands in one of two ways only:
//! - by hand-over from a live owner, after it stopped serving the slot and every op
//!   of the slot's streams is durable and indexed (`Service::settle_slot`): the new
//!   owner loads those streams from the index and continues where they ended;
//! - by a claim of a free slot: one nobody owned, or whose owner is finished (its
//!   log sealed and fully indexed, by a takeover or by its leaving).
//!
//! Each step also checks that the bucket prefix and the metadata still belong to
//! each other (`identity`); when they no longer do, the member stops acknowledging
//! at once and for good, as a member taken over does, and says why.
//!
//! A member judges others dead only after it has held its own lease for a whole
//! lease period: after an outage of Postgres every member's lease has lapsed by the
//! store's clock, and the first to reconnect must not take over the others before
//! they had the chance to renew.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::path::Path;
use object_store::ObjectStore;
use tokio::time::Instant;

use super::coordinator::{Coordinator, Joining, MemberRow, MemberState, SlotRow};
use super::takeover::Takeover;
use super::{slots, Cluster, ClusterConfig, SLOTS};
use crate::error::{EngineError, Result};
use crate::stream::Service;

/// Slots handed over in one step at most: each hand-over makes its streams' new
/// requests wait until it is done, so they go in batches.
const HAND_OVER_BATCH: usize = 64;
/// The loop's pace while slots are moving (it runs every renewal interval otherwise).
const BUSY_STEP: Duration = Duration::from_millis(100);
/// How long after another member's lease runs out (by the metadata store's clock)
/// the loop looks again.
const LAPSE_MARGIN: Duration = Duration::from_millis(20);

pub(crate) struct Membership {
    cluster: Arc<Cluster>,
    service: Service,
    takeover: Arc<Takeover>,
    /// Dead members being taken over by this node.
    taking: Arc<Mutex<HashSet<u64>>>,
    /// Where to tell the node it lost its lease for good.
    on_fenced: Box<dyn Fn() + Send + Sync>,
    /// The binding checked at start, checked again every step.
    watch: crate::identity::Watch,
    /// Whether the other members were told this one joined (once the edge has
    /// connected the calls to them).
    announced: std::sync::atomic::AtomicBool,
}

impl Membership {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        service: Service,
        takeover: Arc<Takeover>,
        on_fenced: Box<dyn Fn() + Send + Sync>,
        watch: crate::identity::Watch,
    ) -> Membership {
        Membership {
            cluster,
            service,
            takeover,
            taking: Arc::default(),
            on_fenced,
            watch,
            announced: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Runs until the node stops.
    pub(crate) async fn run(self) {
        let every = self.cluster.lease.renew_every();
        loop {
            let started = Instant::now();
            let (busy, lapse) = match self.step().await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(error = %e, "cluster membership step failed; retrying");
                    (false, None)
                }
            };
            let pace = if busy { BUSY_STEP } else { every };
            // A member whose lease runs out before the next step is looked at again
            // just after it does: a dead node's streams wait for its lease, not for
            // the lease and then up to a renewal interval more.
            let next = match lapse {
                Some(left) => (started + pace).min(started + left + LAPSE_MARGIN),
                None => started + pace,
            };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = self.cluster.nudged() => {}
            }
        }
    }

    /// One round: whether slots are still moving (run again soon), and how long
    /// until the next lease of another running member runs out, as read now.
    async fn step(&self) -> Result<(bool, Option<Duration>)> {
        // Given up for good (see `give_up`): renewing would make the lease look held.
        if self.cluster.unbound().is_some() {
            return Ok((false, None));
        }
        if !self.renew().await {
            return Ok((false, None));
        }
        // The binding is read beside the members and slots, so it costs no time.
        let (members, slots, unbound) = tokio::join!(
            self.cluster.coord.members(),
            self.cluster.coord.slots(),
            self.binding_changed()
        );
        if let Some(why) = unbound {
            self.give_up(&why);
            return Ok((false, None));
        }
        let (members, slots) = (members?, slots?);
        self.cluster.set_members(members.clone());
        for row in &slots {
            self.cluster.apply_slot(*row);
        }
        self.take_over_dead(&members);
        self.announce(&members);
        let lapse = members
            .iter()
            .filter(|m| m.epoch != self.cluster.epoch && m.is_alive())
            .map(|m| Duration::from_millis(m.lease_left_ms as u64))
            .min();
        Ok((self.rebalance(&members, &slots).await?, lapse))
    }

    /// Once after joining: tells the other live members to look at the cluster now,
    /// so that each knows this one within milliseconds rather than at its next
    /// step (what each names as brokers to Kafka clients must agree: a client
    /// that is shown different broker lists by different members may drop a
    /// broker it is still waiting on).
    fn announce(&self, members: &[MemberRow]) {
        use std::sync::atomic::Ordering;
        if self.announced.load(Ordering::Acquire) {
            return;
        }
        let others: Vec<String> = members
            .iter()
            .filter(|m| m.epoch != self.cluster.epoch && m.is_alive())
            .map(|m| m.advertise.clone())
            .collect();
        if self.service.tell_members(others) {
            self.announced.store(true, Ordering::Release);
        }
    }

    /// Renews this member's lease; `false` when it does not hold one now.
    async fn renew(&self) -> bool {
        let c = &self.cluster;
        let sent = Instant::now();
        match c
            .coord
            .renew(c.epoch, c.lease.ttl().as_millis() as u64)
            .await
        {
            Ok(Some(state)) => {
                c.lease.renewed(sent);
                c.stats.renewals_ok.inc();
                c.set_draining(state == MemberState::Draining);
            }
            Ok(None) => {
                if c.lease.is_valid() || !c.owned_slots().is_empty() {
                    tracing::error!(
                        epoch = c.epoch,
                        "this member's lease was taken over by another node: giving up every stream"
                    );
                }
                c.lease.lost();
                c.disown_all();
                (self.on_fenced)();
                return false;
            }
            Err(e) => {
                c.stats.renewals_failed.inc();
                tracing::warn!(error = %e, remaining = ?c.lease.remaining(), "renewing the cluster lease failed");
            }
        }
        c.lease.is_valid()
    }

    /// Why this member's store and metadata no longer belong to each other, if they
    /// do not (see `identity::Watch`); `None` also when either cannot be read in
    /// time: an unreachable store is the lease's business.
    async fn binding_changed(&self) -> Option<String> {
        let (store, meta) = (&*self.takeover.store, &self.takeover.meta);
        let check = self.watch.changed(store, meta);
        tokio::time::timeout(self.cluster.lease.renew_every(), check)
            .await
            .ok()
            .flatten()
    }

    /// Stops acknowledging for good: the metadata or the prefix now belongs to
    /// something else, so nothing this member writes could be found again.
    fn give_up(&self, why: &str) {
        let c = &self.cluster;
        tracing::error!(
            epoch = c.epoch,
            binding = %self.watch.binding,
            "the store and the metadata no longer belong to each other: {why}; this member stops acknowledging writes"
        );
        c.set_unbound(why);
        c.lease.lost();
        c.disown_all();
        (self.on_fenced)();
    }

    /// Starts a takeover of each member the store judges lapsed, once this member
    /// has held its own lease for a lease period.
    ///
    /// An earlier incarnation of this very node (same node id, same advertised URL,
    /// older epoch) is taken over at once: a node that restarts declares the process
    /// before it gone, so a restart does not wait out its old lease. Should that
    /// process still run (paused), it can no longer write: its next WAL object meets
    /// the seal, its index batches are refused, and it rejoins as a new member.
    fn take_over_dead(&self, members: &[MemberRow]) {
        let settled = self.cluster.lease.held_for() >= self.cluster.lease.ttl();
        let me = &self.cluster.config;
        let sealers_alive = |m: &MemberRow| {
            m.sealer
                .and_then(|s| members.iter().find(|x| x.epoch == s))
                .is_some_and(MemberRow::is_alive)
        };
        for m in members {
            let lapsed = m.state.is_running() && m.lease_left_ms <= 0;
            let orphaned = m.state == MemberState::Sealing && !sealers_alive(m);
            let predecessor = m.state.is_running()
                && m.epoch < self.cluster.epoch
                && m.node_id == me.node_id
                && m.advertise == me.advertise;
            if m.epoch == self.cluster.epoch || !(predecessor || (settled && (lapsed || orphaned)))
            {
                continue;
            }
            if !self.taking.lock().expect("takeovers").insert(m.epoch) {
                continue;
            }
            let (takeover, taking, cluster, dead, service) = (
                self.takeover.clone(),
                self.taking.clone(),
                self.cluster.clone(),
                m.clone(),
                self.service.clone(),
            );
            // The others claim their shares of the dead member's slots as soon as
            // its log is indexed, not at their next step.
            let others: Vec<String> = members
                .iter()
                .filter(|o| o.epoch != self.cluster.epoch && o.epoch != m.epoch && o.is_alive())
                .map(|o| o.advertise.clone())
                .collect();
            tokio::spawn(async move {
                match takeover.run(&dead.node_id, dead.epoch).await {
                    Ok(Some(_)) => {
                        service.tell_members(others);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(
                        node = %dead.node_id, epoch = dead.epoch, error = %e,
                        "taking over a member failed; retrying"
                    ),
                }
                taking.lock().expect("takeovers").remove(&dead.epoch);
                cluster.nudge();
            });
        }
    }

    /// Hands over the slots others should own and claims the free ones that are
    /// this member's; `true` while some still have to move.
    async fn rebalance(&self, members: &[MemberRow], slots: &[SlotRow]) -> Result<bool> {
        let c = &self.cluster;
        let owners = desired_owners(members, c.is_draining().then_some(c.epoch));
        let alive = |epoch: u64| members.iter().any(|m| m.epoch == epoch && m.is_alive());
        let (mut give, mut claim, mut reown) = (Vec::new(), Vec::new(), Vec::new());
        for row in slots {
            let want = owners[row.slot as usize];
            let mine = row.owner == Some(c.epoch);
            match want {
                Some(to) if mine && to != c.epoch => give.push((row.slot, Some(to))),
                None if mine && c.is_draining() => give.push((row.slot, None)),
                Some(to) if to == c.epoch && mine && !c.serving(row.slot) => reown.push(*row),
                Some(to) if to == c.epoch && !mine && !row.owner.is_some_and(alive) => {
                    claim.push(row.slot)
                }
                _ => {}
            }
        }
        if !claim.is_empty() {
            for row in c.coord.claim(c.epoch, &claim).await? {
                c.apply_slot(row);
            }
        }
        if !reown.is_empty() {
            // A hand-over that did not happen: its streams were retired, so they
            // settle (and leave memory) before the slot is served again.
            let slots: Vec<u32> = reown.iter().map(|r| r.slot).collect();
            self.service.settle_slots(&slots).await?;
            for row in reown {
                c.own(row.slot, row.generation);
            }
        }
        let busy = !give.is_empty();
        give.truncate(HAND_OVER_BATCH);
        self.hand_over(give).await;
        Ok(busy)
    }

    /// Stops serving `give`'s slots, settles their streams, and records each slot's
    /// new owner (`None`: nobody, when no other member is alive to take it). A
    /// failure leaves the slot unserved but this member's: the next step retries.
    async fn hand_over(&self, give: Vec<(u32, Option<u64>)>) {
        if give.is_empty() {
            return;
        }
        let c = &self.cluster;
        let slots: Vec<u32> = give.iter().map(|(s, _)| *s).collect();
        for slot in &slots {
            c.disown(*slot);
        }
        c.changes.send_modify(|n| *n += 1);
        if let Err(e) = self.service.settle_slots(&slots).await {
            tracing::warn!(error = %e, slots = slots.len(), "streams of slots being handed over did not settle; retrying");
            return;
        }
        for (slot, to) in give {
            match c.coord.hand_over(c.epoch, slot, to).await {
                Ok(Some(row)) => c.apply_slot(row),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, slot, "handing a slot over failed; retrying"),
            }
        }
        tracing::debug!(slots = slots.len(), "slots handed over");
    }
}

/// Joins the cluster as a new member: claims an epoch in the bucket above every
/// epoch the cluster has had, and registers it with a fresh lease. A bucket holding
/// logs the coordinator does not know (a single node's) is refused: nothing would
/// index them, and collection would delete them.
pub(crate) async fn join(
    store: &dyn ObjectStore,
    coord: &dyn Coordinator,
    config: &ClusterConfig,
) -> Result<u64> {
    let known: HashSet<u64> = coord.members().await?.iter().map(|m| m.epoch).collect();
    let listed = store
        .list_with_delimiter(Some(&Path::from(crate::layout::WAL)))
        .await?;
    let foreign: Vec<String> = listed
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().map(str::to_string))
        .filter(|e| e.parse::<u64>().is_ok_and(|e| !known.contains(&e)))
        .collect();
    if !foreign.is_empty() {
        return Err(EngineError::bad_request(format!(
            "the bucket holds WAL logs the cluster's metadata does not know (epochs {}): it was written by a single node; a cluster needs a bucket (or --store prefix) of its own",
            foreign.join(", ")
        )));
    }
    let epoch = crate::fencing::claim(store, coord.max_epoch().await? + 1).await?;
    coord
        .join(&Joining {
            epoch,
            node_id: config.node_id.clone(),
            advertise: config.advertise.clone(),
            lease_ms: config.lease.as_millis() as u64,
            kafka: config.kafka.clone(),
        })
        .await?;
    Ok(epoch)
}

/// For every slot, the epoch of the member that should own it: the assignment over
/// the live members (`Live`, lease holding), one incarnation per node id (its
/// newest), leaving `excluded` (a draining member) out.
pub(crate) fn desired_owners(members: &[MemberRow], excluded: Option<u64>) -> Vec<Option<u64>> {
    let mut newest: Vec<&MemberRow> = Vec::new();
    for m in members {
        if !m.is_alive() || m.state != MemberState::Live || Some(m.epoch) == excluded {
            continue;
        }
        match newest.iter_mut().find(|n| n.node_id == m.node_id) {
            Some(n) if n.epoch < m.epoch => *n = m,
            Some(_) => {}
            None => newest.push(m),
        }
    }
    let ids: Vec<&str> = newest.iter().map(|m| m.node_id.as_str()).collect();
    (0..SLOTS)
        .map(|slot| slots::owner_index(slot, &ids).map(|i| newest[i].epoch))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(epoch: u64, node: &str, state: MemberState, left_ms: i64) -> MemberRow {
        MemberRow {
            epoch,
            node_id: node.into(),
            advertise: format!("http://{node}"),
            state,
            lease_left_ms: left_ms,
            sealer: None,
            applied_seq: 0,
            joined_unix_ms: 0,
            kafka: None,
        }
    }

    #[test]
    fn only_live_members_with_a_lease_are_assigned_slots() {
        let members = vec![
            member(1, "a", MemberState::Live, 4000),
            member(2, "b", MemberState::Live, -10),
            member(3, "c", MemberState::Draining, 4000),
            member(4, "d", MemberState::Live, 4000),
        ];
        let owners = desired_owners(&members, None);
        assert!(owners.iter().all(|o| matches!(o, Some(1) | Some(4))));
        let owners = desired_owners(&members, Some(4));
        assert!(owners.iter().all(|o| *o == Some(1)));
    }

    #[test]
    fn a_restarted_node_wins_over_its_old_incarnation() {
        let members = vec![
            member(5, "a", MemberState::Live, 1000),
            member(9, "a", MemberState::Live, 5000),
            member(6, "b", MemberState::Live, 5000),
        ];
        let owners = desired_owners(&members, None);
        assert!(owners.iter().all(|o| matches!(o, Some(9) | Some(6))));
        assert!(owners.contains(&Some(9)));
    }
}
