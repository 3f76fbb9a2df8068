//! The stream service's side of a cluster: it serves only the streams of the slots
//! this node owns; it settles a slot's streams before the slot is handed over; it
//! reads fork sources owned elsewhere through the index, and asks their owners to
//! pin fork points and to cascade deletes; it takes stream ids from blocks the
//! coordinator reserves (ids are unique across the cluster).
//!
//! Why a fork of a source owned elsewhere is safe: the source's owner pins the fork
//! point under its lifecycle lock after its index holds the source's data up to the
//! point, and counts the pin as a fork when deciding whether a delete is soft. The
//! fork's creator releases the pin once the fork itself is in the index (where every
//! node's fork count sees it); a pin not released in [`PIN_TTL`] lapses.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::handle::{Lifecycle, StreamHandle};
use super::seek::Seek;
use super::{AppendOutcome, AppendRequest, CreateRequest, NewRecord, Producer, StreamInfo};
use crate::cluster::{
    slot_of, Cluster, ForkPin, Peers, PinnedFork, Route, StreamAdmin, StreamAdminAnswer,
};
use crate::domain::{ContentType, ProducerId, StreamName};
use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::stream::Service;

/// How long a fork pin lasts unreleased (a fork's creation takes milliseconds;
/// this covers its creator dying and being taken over).
const PIN_TTL: Duration = Duration::from_secs(60);
/// How long a fork source owned elsewhere is read from one copy of its row.
const SNAPSHOT_TTL: Duration = Duration::from_secs(1);
/// Snapshots kept at most (then the oldest half goes).
const SNAPSHOTS_MAX: usize = 4096;
/// Stream ids reserved from the coordinator at a time.
const ID_BLOCK: u64 = 1000;

/// What the service keeps for the cluster.
pub(crate) struct ClusterSide {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) peers: OnceLock<Arc<dyn Peers>>,
    pins: Mutex<Pins>,
    snapshots: Mutex<HashMap<u64, (Instant, Arc<StreamHandle>)>>,
    ids: Mutex<std::ops::Range<u64>>,
    ids_refill: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Pins {
    next: u64,
    /// Source id -> (pin, expiry).
    by_source: HashMap<u64, Vec<(u64, Instant)>>,
}

impl ClusterSide {
    pub(crate) fn new(cluster: Arc<Cluster>) -> ClusterSide {
        ClusterSide {
            cluster,
            peers: OnceLock::new(),
            pins: Mutex::default(),
            snapshots: Mutex::default(),
            ids: Mutex::new(0..0),
            ids_refill: tokio::sync::Mutex::new(()),
        }
    }

    fn peers(&self) -> Result<&Arc<dyn Peers>> {
        self.peers
            .get()
            .ok_or_else(|| EngineError::Unavailable("cluster peers are not connected yet".into()))
    }

    /// The base URL of the member serving `name`, or 503 while nobody does.
    fn owner_url(&self, name: &str) -> Result<String> {
        self.cluster.owner_url(slot_of(name)).ok_or_else(|| {
            EngineError::Unavailable("the stream is moving between nodes; retry in a moment".into())
        })
    }

    fn live_pins(&self, source_id: u64) -> usize {
        let mut pins = self.pins.lock().expect("fork pins");
        let now = Instant::now();
        let Some(list) = pins.by_source.get_mut(&source_id) else {
            return 0;
        };
        list.retain(|(_, until)| *until > now);
        let n = list.len();
        if n == 0 {
            pins.by_source.remove(&source_id);
        }
        n
    }
}

impl Service {
    pub(crate) fn cluster_side(&self) -> Option<&ClusterSide> {
        self.inner.cluster.as_ref()
    }

    /// The cluster this node is a member of, if any.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.inner.cluster.as_ref().map(|c| &c.cluster)
    }

    /// Connects the calls to other members (the edge provides them).
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        if let Some(side) = self.cluster_side() {
            let _ = side.peers.set(peers);
            // The membership loop tells the others this member joined.
            side.cluster.nudge();
        }
    }

    /// The calls to other members, once the edge connected them.
    pub fn peers(&self) -> Option<Arc<dyn Peers>> {
        self.cluster_side()
            .and_then(|side| side.peers.get().cloned())
    }

    /// Whether this node serves the stream `name` (always, outside a cluster).
    pub fn serves(&self, name: &str) -> bool {
        self.cluster().is_none_or(|c| c.owns(slot_of(name)))
    }

    /// The ownership term `name`'s slot is served at (`Cluster::term`); 0 outside a
    /// cluster, and while this node does not serve it.
    pub fn term_of(&self, name: &str) -> u64 {
        self.cluster().map_or(0, |c| c.term(slot_of(name)))
    }

    /// The registered handle of `name`, unless it belongs to an earlier term of the
    /// slot: such a handle outlived a change of owner that did not settle it (this
    /// node stopped serving the slot without handing it over, or regained it after
    /// another owner wrote the stream), so its tail and producer state may be
    /// behind the index. It is retired and dropped, and the stream is loaded afresh.
    /// While the slot is not served at all the handle stays (a hand-over settles it).
    pub(crate) fn registered(&self, name: &str) -> Option<Arc<StreamHandle>> {
        let handle = self.inner.registry.by_name(name)?;
        self.current(handle)
    }

    /// `handle` if it is of the current term of its slot (see `registered`).
    pub(crate) fn current(&self, handle: Arc<StreamHandle>) -> Option<Arc<StreamHandle>> {
        let term = self.term_of(&handle.config.name);
        if handle.term() == term || term == 0 {
            return Some(handle);
        }
        tracing::warn!(
            stream = %handle.config.name, was = handle.term(), now = term,
            "dropping a stream handle from an earlier ownership of its slot"
        );
        handle.retire();
        self.inner.registry.remove(&handle);
        None
    }

    /// `Err(NotOwner)` unless this node serves `name`.
    pub(crate) fn check_owner(&self, name: &str) -> Result<()> {
        match self.cluster() {
            Some(c) => c.check_owner(name),
            None => Ok(()),
        }
    }

    /// Takes the active streams of `slots` out of service and waits until every op
    /// they submitted is durable and indexed; they are then dropped from memory, and
    /// the next owner loads them from the index as they are.
    pub(crate) async fn settle_slots(&self, slots: &[u32]) -> Result<()> {
        let slots: HashSet<u32> = slots.iter().copied().collect();
        let handles = self
            .inner
            .registry
            .filter(|h| slots.contains(&slot_of(&h.config.name)));
        let last_ops: Vec<u64> = handles.iter().map(|h| h.retire()).collect();
        for (handle, last) in handles.iter().zip(last_ops) {
            if last > 0 && handle.view().op < last {
                self.wait_durable(handle, last).await?;
            }
        }
        self.index_barrier().await?;
        let mut touched = Vec::with_capacity(handles.len());
        for handle in &handles {
            self.inner.registry.remove(handle);
            touched.push((handle.config.id, handle.last_access_ms()));
        }
        self.inner.meta.touch(&touched).await?;
        Ok(())
    }

    /// The handle to read a fork source `id` through: the active one, or for a
    /// source owned elsewhere a copy of its row (never registered: only its data
    /// below fork points, which is immutable and indexed, is read through it).
    pub(crate) async fn source_handle(&self, id: u64) -> Result<Option<Arc<StreamHandle>>> {
        let Some(side) = self.cluster_side() else {
            return self.lookup_id(id).await;
        };
        if let Some(h) = self.inner.registry.by_id(id).and_then(|h| self.current(h)) {
            if !h.view().evicted {
                return Ok(Some(h));
            }
        }
        if let Some((at, h)) = side.snapshots.lock().expect("snapshots").get(&id) {
            if at.elapsed() < SNAPSHOT_TTL {
                return Ok(Some(h.clone()));
            }
        }
        let Some(row) = self.inner.meta.stream_by_id(id).await? else {
            return Ok(None);
        };
        if self.serves(&row.name) {
            return self.lookup_id(id).await;
        }
        let handle = self.handle_from_row(row, HashMap::new(), 0)?;
        let mut snapshots = side.snapshots.lock().expect("snapshots");
        if snapshots.len() >= SNAPSHOTS_MAX {
            let now = Instant::now();
            snapshots.retain(|_, (at, _)| now.duration_since(*at) < SNAPSHOT_TTL);
        }
        snapshots.insert(id, (Instant::now(), handle.clone()));
        Ok(Some(handle))
    }

    /// The id of the live stream `name` wherever it is served (a fork's source).
    pub(crate) async fn stream_id_anywhere(&self, name: &str) -> Result<Option<u64>> {
        if self.serves(name) {
            return Ok(self.lookup(name).await?.map(|h| h.config.id));
        }
        Ok(self
            .inner
            .meta
            .stream_by_name(name)
            .await?
            .filter(|row| !row.soft_deleted)
            .map(|row| row.id))
    }

    /// A new stream's id: the node's counter, or in a cluster the next id of a
    /// block reserved from the coordinator.
    pub(crate) async fn new_stream_id(&self) -> Result<u64> {
        let Some(side) = self.cluster_side() else {
            return Ok(self
                .inner
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        };
        loop {
            if let Some(id) = side.ids.lock().expect("id block").next() {
                return Ok(id);
            }
            let _refill = side.ids_refill.lock().await;
            if !side.ids.lock().expect("id block").is_empty() {
                continue;
            }
            let first = side.cluster.coord.reserve_ids(ID_BLOCK).await?;
            *side.ids.lock().expect("id block") = first..first + ID_BLOCK;
        }
    }

    /// Fork pins on `source_id` that a delete must count as forks.
    /// Forks that read `source_id` (served here; the caller holds the lifecycle lock):
    /// those the metadata knows plus the pins of forks still being created on other
    /// members. The pins are counted **first**: under the lock no pin can be added,
    /// and a member releases its pin only after its fork's row is committed, so a
    /// pin gone by now is a row the metadata query that follows sees. Read the other
    /// way round, a query that started just before that commit and a release that
    /// landed during it counted the fork in neither, and the source was deleted hard
    /// under a fork that exists.
    pub(crate) async fn forks_of(&self, source_id: u64) -> Result<u64> {
        let pins = self.fork_pins(source_id);
        crate::failpoint::pause("between-fork-counts").await;
        Ok(pins + self.inner.meta.fork_count(source_id).await?)
    }

    fn fork_pins(&self, source_id: u64) -> u64 {
        self.cluster_side()
            .map_or(0, |s| s.live_pins(source_id) as u64)
    }

    /// Pins a fork point on a stream this node serves, for a fork created on
    /// another node (see the module header).
    pub async fn pin_fork(&self, pin: &ForkPin) -> Result<PinnedFork> {
        let side = self
            .cluster_side()
            .ok_or_else(|| EngineError::bad_request("this node is not in a cluster"))?;
        let _guard = self.inner.lifecycle.lock().await;
        let source = self
            .lookup_in(&pin.source, true)
            .await?
            .ok_or(EngineError::ForkSourceNotFound)?;
        let resolved = self
            .resolve_fork(
                &source,
                pin.offset.map(Offset),
                pin.sub_offset,
                pin.content_type.as_deref(),
            )
            .await?;
        self.index_barrier().await?;
        let mut pins = side.pins.lock().expect("fork pins");
        pins.next += 1;
        let id = pins.next;
        pins.by_source
            .entry(source.config.id)
            .or_default()
            .push((id, Instant::now() + PIN_TTL));
        Ok(PinnedFork {
            pin: id,
            source_id: source.config.id,
            content_type: resolved.content_type,
            ttl_secs: resolved.ttl_secs,
            expires_at: resolved.expires_at,
            point: resolved.point.0,
            point_seq: resolved.point_seq,
        })
    }

    /// Releases a fork pin (see [`Service::pin_fork`]).
    pub fn unpin_fork(&self, source_id: u64, pin: u64) {
        if let Some(side) = self.cluster_side() {
            let mut pins = side.pins.lock().expect("fork pins");
            if let Some(list) = pins.by_source.get_mut(&source_id) {
                list.retain(|(p, _)| *p != pin);
            }
        }
    }

    /// Another member says slots changed hands (it finished a takeover): look at
    /// the cluster now rather than at the next renewal.
    pub fn cluster_changed(&self) {
        if let Some(side) = self.cluster_side() {
            side.cluster.nudge();
        }
    }

    /// After a takeover or a join: tells the members at `urls` to look at the
    /// cluster now, so each claims its share of a dead member's slots, or learns
    /// of a new member, at once (best effort: they look at their next step
    /// anyway). `false` while the calls to other members are not connected yet.
    pub(crate) fn tell_members(&self, urls: Vec<String>) -> bool {
        let Some(Ok(peers)) = self.cluster_side().map(|side| side.peers().cloned()) else {
            return false;
        };
        for url in urls {
            let peers = peers.clone();
            tokio::spawn(async move {
                if let Err(e) = peers.nudge(&url).await {
                    tracing::debug!(member = %url, error = %e, "telling a member to look at the cluster failed");
                }
            });
        }
        true
    }

    /// Asks the owner of the fork source `pin.source` to pin the fork point.
    pub(crate) async fn pin_remote_fork(&self, pin: &ForkPin) -> Result<(String, PinnedFork)> {
        let side = self.cluster_side().expect("called in a cluster");
        let url = side.owner_url(&pin.source)?;
        let pinned = side.peers()?.pin_fork(&url, pin).await?;
        Ok((url, pinned))
    }

    /// Once the fork created here is in the index, releases its pin at `url`.
    pub(crate) fn unpin_remote_fork(&self, url: String, source_id: u64, pin: u64) {
        let (service, side) = (self.clone(), self.cluster_side().expect("in a cluster"));
        let Ok(peers) = side.peers().cloned() else {
            return;
        };
        tokio::spawn(async move {
            if service.index_barrier().await.is_ok() {
                if let Err(e) = peers.unpin_fork(&url, source_id, pin).await {
                    tracing::debug!(error = %e, "releasing a fork pin failed; it lapses by itself");
                }
            }
        });
    }

    /// After a fork was hard-deleted here: its source `source` (a copy of its row)
    /// is served elsewhere; ask its owner to delete it if that was its last fork.
    pub(crate) fn cascade_remote(&self, source: &StreamHandle) {
        let Some(side) = self.cluster_side() else {
            return;
        };
        let (Ok(url), Ok(peers)) = (side.owner_url(&source.config.name), side.peers().cloned())
        else {
            tracing::warn!(source = %source.config.name, "a deleted fork's source could not be reached; its owner's retention pass deletes it later");
            return;
        };
        let id = source.config.id;
        tokio::spawn(async move {
            if let Err(e) = peers.cascade(&url, id).await {
                tracing::warn!(error = %e, "asking a fork source's owner to delete it failed");
            }
        });
    }

    /// A fork of `source_id` was deleted on another node: delete `source_id` (served
    /// here) if it is soft-deleted and that was its last fork.
    pub async fn cascade_from_peer(&self, source_id: u64) -> Result<()> {
        let _guard = self.inner.lifecycle.lock().await;
        let Some(source) = self.lookup_id(source_id).await? else {
            return Ok(());
        };
        if source.view().lifecycle != Lifecycle::SoftDeleted || self.forks_of(source_id).await? > 0
        {
            return Ok(());
        }
        self.delete_locked(source).await
    }
}

/// How long an operation made at a stream's owner waits for a moving stream to
/// have one (a hand-over takes milliseconds, a takeover after a death a lease).
const ADMIN_OWNER_WAIT: Duration = Duration::from_secs(8);

impl Service {
    /// Makes `op` at the member serving its stream: here when this node serves it
    /// (or is no cluster member), else through that member's peer call. A stream
    /// between owners is waited for, up to [`ADMIN_OWNER_WAIT`]; an owner that
    /// cannot be reached (it died) is asked again once its stream moved. Each
    /// operation is safe to repeat: a create finds its stream, a delete finds none.
    pub async fn admin(&self, op: &StreamAdmin) -> Result<StreamAdminAnswer> {
        let Some(side) = self.cluster_side() else {
            return self.admin_here(op).await;
        };
        let slot = slot_of(op.stream());
        let deadline = Instant::now() + ADMIN_OWNER_WAIT;
        loop {
            let outcome = match side.cluster.route(op.stream()) {
                Route::Local => self.admin_here(op).await,
                Route::Remote { url, .. } => match side.peers() {
                    Ok(peers) => peers.admin(&url, op).await,
                    Err(e) => Err(e),
                },
                Route::Unowned | Route::NoLease => Err(EngineError::NotOwner),
            };
            match outcome {
                Err(EngineError::NotOwner | EngineError::Unavailable(_))
                    if Instant::now() < deadline =>
                {
                    let _ = side.cluster.refresh_slot(slot).await;
                    side.cluster.changed(Duration::from_millis(250)).await;
                }
                other => return other,
            }
        }
    }

    /// Makes `op` on this node, which must serve its stream (`NotOwner` else): the
    /// owner's side of [`Service::admin`].
    pub async fn admin_here(&self, op: &StreamAdmin) -> Result<StreamAdminAnswer> {
        let name = StreamName::new(op.stream(), self.inner.config.stream_name_bytes_max)?;
        self.check_owner(&name)?;
        let answer = |info: StreamInfo, created: bool| StreamAdminAnswer {
            id: info.id,
            retention_secs: info.retention_secs,
            created,
            published: 0,
            read: None,
            first_seq: 0,
        };
        match op {
            StreamAdmin::Create {
                content_type,
                retention_secs,
                ..
            } => {
                let mut req = CreateRequest::new(name);
                if let Some(ct) = content_type {
                    req.content_type = ContentType::new(ct, 256)?;
                }
                req.retention_secs = *retention_secs;
                let (created, info) = self.create(req).await?;
                Ok(answer(info, created))
            }
            StreamAdmin::Delete { .. } => {
                self.delete(&name).await?;
                Ok(StreamAdminAnswer::default())
            }
            StreamAdmin::Info { .. } => Ok(answer(self.head(&name).await?, false)),
            StreamAdmin::SetRetention { retention_secs, .. } => {
                self.set_retention(&name, *retention_secs).await?;
                Ok(answer(self.head(&name).await?, false))
            }
            StreamAdmin::Publish {
                from,
                producer,
                epoch,
                create,
                ..
            } => {
                let from = StreamName::new(from.as_str(), self.inner.config.stream_name_bytes_max)?;
                if slot_of(from.as_str()) != slot_of(name.as_str()) {
                    return Err(EngineError::bad_request(format!(
                        "{from} is not a companion of {name}"
                    )));
                }
                let published = self
                    .publish(&from, &name, producer, *epoch, *create)
                    .await?;
                Ok(StreamAdminAnswer {
                    published,
                    ..StreamAdminAnswer::default()
                })
            }
            StreamAdmin::Discard { .. } => {
                match self.stream(&name).await {
                    Ok(s) => {
                        let tail = s.handle.view().tail;
                        self.trim(&name, tail).await?;
                    }
                    Err(EngineError::NotFound) => {}
                    Err(e) => return Err(e),
                }
                Ok(StreamAdminAnswer::default())
            }
            StreamAdmin::Tier { exported, .. } => {
                let stream = self.stream(&name).await?;
                let info = stream.info();
                if let Some(secs) = info.retention_secs {
                    let cutoff = self
                        .clock()
                        .now_ms()
                        .saturating_sub(secs.saturating_mul(1000));
                    let by_time = self.seek(&stream, Seek::Time(cutoff)).await?;
                    let by_seq = self.seek(&stream, Seek::Seq(*exported)).await?;
                    let at = if by_time.seq <= by_seq.seq {
                        by_time
                    } else {
                        by_seq
                    };
                    if at.offset > self.start_of(&stream.handle).await? {
                        self.trim(&name, at.offset).await?;
                    }
                }
                let first = self.first_record(&self.stream(&name).await?).await?;
                Ok(StreamAdminAnswer {
                    id: info.id,
                    retention_secs: info.retention_secs,
                    first_seq: first.seq,
                    ..StreamAdminAnswer::default()
                })
            }
            StreamAdmin::Read { seq, bytes, .. } => {
                let stream = self.stream(&name).await?;
                let batch = self.read_seq(&stream, *seq, *bytes).await?;
                Ok(StreamAdminAnswer {
                    id: batch.stream_id,
                    read: Some(batch),
                    ..StreamAdminAnswer::default()
                })
            }
        }
    }

    /// [`StreamAdmin::Publish`] on this node: `from`'s records appended to `to` in
    /// pieces of at most the append limit, stamped `producer` at `epoch` with
    /// sequence numbers counted from 0 over the records (the same pieces and
    /// numbers on a repeat), then `from` trimmed. The count appended (not
    /// counting duplicates).
    async fn publish(
        &self,
        from: &StreamName,
        to: &StreamName,
        producer: &str,
        epoch: u64,
        create: bool,
    ) -> Result<u64> {
        let id = ProducerId::new(producer, self.inner.config.producer_id_bytes_max)?;
        let source = match self.stream(from).await {
            Ok(s) => s,
            Err(EngineError::NotFound) => return Ok(0),
            Err(e) => return Err(e),
        };
        let limit = self.inner.config.append_bytes_max.max(1);
        let mut at = self.first_record(&source).await?.offset;
        let mut piece: Vec<NewRecord> = Vec::new();
        let mut piece_bytes = 0;
        let mut seq = 0u64;
        let mut published = 0;
        // Pieces are cut by record sizes alone, so a repeat cuts the same ones;
        // each is appended once full, so memory holds one piece and one read.
        loop {
            let chunk = self.read(&source, at, 1 << 20).await?;
            for (data, meta) in chunk.segments.iter().zip(&chunk.meta) {
                let size = data.len() + meta.ext.as_ref().map_or(0, |e| e.len());
                if !piece.is_empty() && piece_bytes + size > limit {
                    let full = std::mem::take(&mut piece);
                    published += self
                        .publish_piece(to, &source, &id, epoch, &mut seq, full, create)
                        .await?;
                    piece_bytes = 0;
                }
                piece.push(NewRecord {
                    data: data.clone(),
                    ext: meta.ext.clone(),
                });
                piece_bytes += size;
            }
            let next = chunk.next;
            let done = chunk.up_to_date || next == at;
            at = next;
            if done {
                break;
            }
        }
        if !piece.is_empty() {
            published += self
                .publish_piece(to, &source, &id, epoch, &mut seq, piece, create)
                .await?;
        }
        self.trim(from, at).await?;
        Ok(published)
    }

    /// One piece of a publish, stamped `seq..seq+len-1` at `epoch` (`seq` moves
    /// past it): the records appended (0 for a duplicate).
    #[allow(clippy::too_many_arguments)]
    async fn publish_piece(
        &self,
        to: &StreamName,
        source: &super::StreamRef,
        id: &ProducerId,
        epoch: u64,
        seq: &mut u64,
        piece: Vec<NewRecord>,
        create: bool,
    ) -> Result<u64> {
        let n = piece.len() as u64;
        let stamp = Producer {
            id: id.clone(),
            epoch,
            seq: *seq + n - 1,
            first_seq: Some(*seq),
        };
        *seq += n;
        let mut piece = Some(piece);
        for attempt in 0..2 {
            // A copy only where a second attempt may follow (the stream created).
            let retry = create && attempt == 0;
            let records = if retry { piece.clone() } else { piece.take() };
            let mut req = AppendRequest::new(to.clone(), None, bytes::Bytes::new());
            req.records = records;
            req.producer = Some(stamp.clone());
            // Checked against the stream's schema when they were produced.
            req.schema_checked = true;
            match self.append(req).await {
                Ok(AppendOutcome::Appended { .. }) => return Ok(n),
                Ok(AppendOutcome::Duplicate { .. }) => return Ok(0),
                Err(EngineError::NotFound) if create && attempt == 0 => {
                    let mut make = CreateRequest::new(to.clone());
                    make.content_type = ContentType::new(&source.handle.config.content_type, 256)?;
                    self.create(make).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(EngineError::NotFound)
    }
}
