//! The consumer groups of one node: loading a group from its companion stream,
//! claiming (long-polling for data that is not there yet), acks, nacks and the
//! dead-letter stream.
//!
//! Durability: a group's events are a JSON stream `__groups/{group}/{stream}`, in
//! the slot of its stream (`cluster::slots::placed_by`), so the member serving the
//! stream serves the group, reads the stream locally and logs the group's events
//! locally. Every claim, ack, nack and dead-lettering is durable there before it is
//! answered; a snapshot every [`SNAPSHOT_EVERY`] events lets the older ones be
//! trimmed. A crash loses nothing acknowledged: a replay gives the messages out
//! under a lease (delivered again once it lapses) and those acked (never again).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use picomq_engine::wal::format::RECORD_BATCH_START;
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, Engine, EngineError, Offset, OffsetQuery, StreamName,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::state::{Back, Event, GroupConfig, GroupState, Handed};
use crate::error::ConsumerError;
use crate::Consumers;

pub const STATE_PREFIX: &str = "__groups/";
/// Events between snapshots (and trims of the events before them).
const SNAPSHOT_EVERY: u32 = 256;
/// Messages one claim may take, and bytes it reads at most.
pub const CLAIM_MAX: usize = 1_000;
const CLAIM_READ_BYTES: usize = 1 << 20;
/// Backoff of dead-lettering parked messages again: from the first, doubled per
/// failed attempt, up to the last.
const PARKED_RETRY_MS_MIN: u64 = 1_000;
const PARKED_RETRY_MS_MAX: u64 = 60_000;
/// Messages out under a lease per group; a claim past it waits for acks.
pub const OUT_MAX: usize = 100_000;
pub const GROUP_NAME_BYTES_MAX: usize = 128;

pub struct Groups {
    engine: Engine,
    groups: Mutex<HashMap<String, Arc<Group>>>,
    /// Group name -> its stream: a group never changes stream, so a lookup (a
    /// metadata listing, which waits for the index) is paid once per group.
    streams: Mutex<HashMap<String, String>>,
    /// Whether any group is loaded: the only thing an append looks at while none is.
    any: std::sync::atomic::AtomicBool,
    loading: tokio::sync::Mutex<()>,
    hub: std::sync::OnceLock<Weak<Consumers>>,
}

pub struct Group {
    pub state_name: StreamName,
    pub stream: StreamName,
    live: tokio::sync::Mutex<Option<Live>>,
    /// New data on the stream, or messages handed back.
    data: Notify,
    /// Events applied in memory, in order, waiting to be written.
    queue: Mutex<Vec<Queued>>,
    /// One writer at a time takes the whole queue (group commit per group).
    writer: tokio::sync::Mutex<()>,
    /// A write failed: memory is ahead of the log; the group must be loaded again.
    broken: std::sync::atomic::AtomicBool,
}

/// An event's JSON, and who waits for it to be durable (a snapshot: nobody).
struct Queued {
    json: Bytes,
    snapshot: bool,
    done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// Durable once resolved.
type Written = tokio::sync::oneshot::Receiver<Result<(), String>>;

struct Live {
    state: GroupState,
    json: bool,
    events: u32,
    /// Messages read past the cursor, not handed out yet.
    ahead: std::collections::VecDeque<Ahead>,
    /// Messages out of deliveries the dead-letter stream did not take.
    parked: Option<Parked>,
}

/// Messages out of deliveries that could not be dead-lettered (the dead-letter
/// stream is closed, not JSON, or unreachable). They stay handed back in the
/// group's log, so nothing is lost and a replay finds them again; they are never
/// delivered again, and dead-lettering is retried after a backoff. Not logged: a
/// node that loads the group again simply tries them once more.
struct Parked {
    offsets: std::collections::BTreeSet<u64>,
    reason: String,
    since_ms: u64,
    retry_at_ms: u64,
    /// Failed attempts in a row (the backoff doubles with each).
    attempts: u32,
}

struct Ahead {
    offset: u64,
    append: u64,
    end: u64,
    /// The append the cursor is in once this message is taken.
    next_append: u64,
    body: Bytes,
}

/// A message as a claim hands it out.
pub struct Message {
    pub offset: u64,
    pub end: u64,
    pub deliveries: u32,
    pub body: Bytes,
}

pub fn state_stream(group: &str, stream: &str) -> String {
    format!("{STATE_PREFIX}{group}/{stream}")
}

pub fn not_found(group: &str) -> ConsumerError {
    ConsumerError::not_found("group_not_found", format!("no consumer group {group:?}"))
}

pub fn check_group_name(group: &str) -> Result<(), ConsumerError> {
    crate::names::check_key_name("group", group, GROUP_NAME_BYTES_MAX)
}

impl Groups {
    pub fn new(engine: Engine) -> Arc<Groups> {
        Arc::new(Groups {
            engine,
            groups: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            any: std::sync::atomic::AtomicBool::new(false),
            loading: tokio::sync::Mutex::new(()),
            hub: std::sync::OnceLock::new(),
        })
    }

    pub(crate) fn connect(&self, hub: Weak<Consumers>) {
        let _ = self.hub.set(hub);
    }

    fn name(&self, s: String) -> Result<StreamName, ConsumerError> {
        StreamName::new(s, self.engine.config().stream_name_bytes_max).map_err(ConsumerError::from)
    }

    /// A write to stream `name` was acknowledged: wake the group's waiting claims.
    pub fn on_write(&self, name: &str) {
        if !self.watching() {
            return;
        }
        let groups = self.groups.lock().expect("groups lock");
        for g in groups.values() {
            if g.stream.as_str() == name {
                g.data.notify_waiters();
            }
        }
    }

    pub fn watching(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The stream of group `group`, from the metadata (every member sees it).
    pub async fn stream_of(&self, group: &str) -> Result<Option<String>, ConsumerError> {
        if let Some(s) = self.streams.lock().expect("group streams").get(group) {
            return Ok(Some(s.clone()));
        }
        let prefix = format!("{STATE_PREFIX}{group}/");
        let page = self.engine.list(&prefix, "", 1).await?;
        let stream = page
            .streams
            .first()
            .and_then(|s| s.name.strip_prefix(&prefix).map(str::to_string));
        if let Some(s) = &stream {
            let mut streams = self.streams.lock().expect("group streams");
            if streams.len() >= 100_000 {
                streams.clear();
            }
            streams.insert(group.to_string(), s.clone());
        }
        Ok(stream)
    }

    /// Forgets what this node knew of `group`'s stream (it was deleted, here or
    /// on another member).
    pub fn forget_stream(&self, group: &str) {
        self.streams.lock().expect("group streams").remove(group);
    }

    /// Every group: `(group, stream)`, in name order, at most `limit`.
    pub async fn list(&self, limit: usize) -> Result<Vec<(String, String)>, ConsumerError> {
        let mut out = Vec::new();
        let mut after = String::new();
        while out.len() < limit {
            let page = self.engine.list(STATE_PREFIX, &after, 500).await?;
            for s in &page.streams {
                if let Some((g, stream)) = s.name[STATE_PREFIX.len()..].split_once('/') {
                    out.push((g.to_string(), stream.to_string()));
                }
            }
            match page.next {
                Some(n) => after = n,
                None => break,
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// The group, loaded from its events if this node has not loaded it.
    pub async fn get(
        &self,
        group: &str,
        stream: &str,
    ) -> Result<Option<Arc<Group>>, ConsumerError> {
        let key = state_stream(group, stream);
        if let Some(g) = self.registered(&key) {
            return Ok(Some(g));
        }
        let _loading = self.loading.lock().await;
        if let Some(g) = self.registered(&key) {
            return Ok(Some(g));
        }
        self.load(&key, stream).await
    }

    fn registered(&self, key: &str) -> Option<Arc<Group>> {
        self.groups.lock().expect("groups lock").get(key).cloned()
    }

    fn forget(&self, g: &Arc<Group>) {
        let mut groups = self.groups.lock().expect("groups lock");
        if groups
            .get(g.state_name.as_str())
            .is_some_and(|x| Arc::ptr_eq(x, g))
        {
            groups.remove(g.state_name.as_str());
        }
        self.any.store(!groups.is_empty(), Ordering::Relaxed);
    }

    async fn load(&self, key: &str, stream: &str) -> Result<Option<Arc<Group>>, ConsumerError> {
        let state_name = self.name(key.to_string())?;
        let handle = match self.engine.stream(&state_name).await {
            Ok(s) => s,
            Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut from = self.engine.retained_start(&handle).await?;
        let mut state: Option<GroupState> = None;
        let mut events = 0u32;
        loop {
            let chunk = self.engine.read(&handle, from, 4 << 20).await?;
            for seg in &chunk.segments {
                let event: Event = serde_json::from_slice(seg).map_err(|e| {
                    ConsumerError::internal(format!("group events of {key} are unreadable: {e}"))
                })?;
                match (&mut state, &event) {
                    (_, Event::Snapshot(s)) => {
                        state = Some((**s).clone());
                        events = 0;
                    }
                    (Some(st), e) => {
                        st.apply(e);
                        events += 1;
                    }
                    (None, _) => {}
                }
            }
            let done = chunk.up_to_date || chunk.next == from;
            from = chunk.next;
            if done {
                break;
            }
        }
        let Some(state) = state else { return Ok(None) };
        let stream_name = self.name(stream.to_string())?;
        let json = self
            .engine
            .head(&stream_name)
            .await
            .map(|i| i.content_type.starts_with("application/json"))
            .unwrap_or(true);
        let g = Arc::new(Group {
            state_name,
            stream: stream_name,
            live: tokio::sync::Mutex::new(Some(Live {
                state,
                json,
                events,
                ahead: Default::default(),
                parked: None,
            })),
            data: Notify::new(),
            queue: Mutex::new(Vec::new()),
            writer: tokio::sync::Mutex::new(()),
            broken: std::sync::atomic::AtomicBool::new(false),
        });
        let mut groups = self.groups.lock().expect("groups lock");
        groups.insert(key.to_string(), g.clone());
        self.any.store(true, Ordering::Relaxed);
        drop(groups);
        Ok(Some(g))
    }

    /// Creates a group on `config.stream` starting at `from`; `false` if it
    /// existed with the same stream (any other stream: 409).
    pub async fn create(&self, mut config: GroupConfig, from: &str) -> Result<bool, ConsumerError> {
        check_group_name(&config.group)?;
        let _loading = self.loading.lock().await;
        if let Some(stream) = self.stream_of(&config.group).await? {
            if stream == config.stream {
                return Ok(false);
            }
            return Err(ConsumerError::conflict(
                "group_exists",
                // Not naming the stream: the caller may not be allowed to know it.
                format!(
                    "group {:?} exists on another stream (group names are unique on the server)",
                    config.group
                ),
            ));
        }
        let stream = self.name(config.stream.clone())?;
        let data = self.engine.stream(&stream).await?;
        let query = OffsetQuery::parse(from)
            .map_err(|e| ConsumerError::invalid(format!("--from / \"from\": {e}")))?;
        let start = self.engine.read_start(&data, query).await?;
        let cursor = match query {
            OffsetQuery::At(o) if !start.past_tail => o.0,
            _ => start.from.0,
        };
        config.created_at = picomq_engine::units::format_rfc3339_ms(self.engine.clock().now_ms());
        let state = GroupState::new(config.clone(), cursor, start.from.0);
        let key = state_stream(&config.group, &config.stream);
        let mut create = CreateRequest::new(self.name(key)?);
        create.content_type = Some(ContentType::json());
        let (_, info) = self.engine.create(create).await?;
        let body = serde_json::to_vec(&Event::Snapshot(Box::new(state))).expect("json");
        self.engine
            .append(AppendRequest::new(
                self.name(info.name)?,
                Some(ContentType::json()),
                Bytes::from(body),
            ))
            .await?;
        // Listed (indexed) before it is answered: every member finds the group.
        self.stream_of(&config.group).await?;
        Ok(true)
    }

    pub async fn delete(&self, group: &str, stream: &str) -> Result<(), ConsumerError> {
        self.forget_stream(group);
        let key = state_stream(group, stream);
        if let Some(g) = self.registered(&key) {
            *g.live.lock().await = None;
            self.forget(&g);
        }
        match self.engine.delete(&self.name(key)?).await {
            Ok(()) | Err(EngineError::NotFound | EngineError::Gone) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Applies `event` and queues it for the log, in the order of application;
    /// the caller lets go of the group's lock, then waits with [`Groups::flush`].
    /// Events of many requests go out as one append: claims and acks of a busy
    /// group cost one WAL commit per flush, not one each. The order in the log is
    /// the order in memory, so a replay (from any snapshot) rebuilds the same state.
    fn log(&self, g: &Group, live: &mut Live, event: Event) -> Written {
        live.state.apply(&event);
        live.events += 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut queue = g.queue.lock().expect("group queue");
        queue.push(Queued {
            json: Bytes::from(serde_json::to_vec(&event).expect("json")),
            snapshot: false,
            done: Some(tx),
        });
        if live.events >= SNAPSHOT_EVERY {
            live.events = 0;
            let snap = Event::Snapshot(Box::new(live.state.clone()));
            queue.push(Queued {
                json: Bytes::from(serde_json::to_vec(&snap).expect("json")),
                snapshot: true,
                done: None,
            });
        }
        rx
    }

    /// Waits until the events behind `written` are durable, writing the queue if
    /// no other request is writing it.
    async fn flush(&self, g: &Arc<Group>, written: Vec<Written>) -> Result<(), ConsumerError> {
        for mut rx in written {
            loop {
                if let Ok(r) = rx.try_recv() {
                    r.map_err(|e| ConsumerError::from(EngineError::Unavailable(e)))?;
                    break;
                }
                let _writer = g.writer.lock().await;
                if let Ok(r) = rx.try_recv() {
                    r.map_err(|e| ConsumerError::from(EngineError::Unavailable(e)))?;
                    break;
                }
                let batch = std::mem::take(&mut *g.queue.lock().expect("group queue"));
                self.write_batch(g, batch).await;
            }
        }
        Ok(())
    }

    /// Writes queued events: runs of events as one append each, a snapshot alone
    /// (and the log trimmed to it).
    async fn write_batch(&self, g: &Arc<Group>, batch: Vec<Queued>) {
        let mut run: Vec<Queued> = Vec::new();
        let mut failed: Option<String> = None;
        for q in batch.into_iter().chain(std::iter::once(Queued {
            json: Bytes::new(),
            snapshot: true,
            done: None,
        })) {
            if !q.snapshot {
                run.push(q);
                continue;
            }
            if !run.is_empty() {
                let r = match &failed {
                    Some(e) => Err(e.clone()),
                    None => self.append_events(g, &run).await.map(|_| ()),
                };
                if let Err(e) = &r {
                    failed = Some(e.clone());
                }
                for q in run.drain(..) {
                    if let Some(tx) = q.done {
                        let _ = tx.send(r.clone());
                    }
                }
            }
            if !q.json.is_empty() && failed.is_none() {
                match self.append_events(g, std::slice::from_ref(&q)).await {
                    Ok(start) => {
                        let _ = self.engine.trim_at_boundary(&g.state_name, start).await;
                    }
                    Err(e) => failed = Some(e),
                }
            }
        }
        if let Some(e) = failed {
            tracing::warn!(group = %g.state_name, error = %e, "a consumer group's events could not be written; it will be loaded again");
            g.broken.store(true, Ordering::SeqCst);
            self.forget(g);
        }
    }

    /// Appends events as one JSON array; returns where the append starts.
    async fn append_events(&self, g: &Group, events: &[Queued]) -> Result<Offset, String> {
        let mut body =
            Vec::with_capacity(events.iter().map(|q| q.json.len() + 1).sum::<usize>() + 2);
        body.push(b'[');
        for (i, q) in events.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&q.json);
        }
        body.push(b']');
        let len = (body.len() - 2 - events.len().saturating_sub(1)) as u64;
        let req = AppendRequest::new(
            g.state_name.clone(),
            Some(ContentType::json()),
            Bytes::from(body),
        );
        match self.engine.append(req).await {
            Ok(
                picomq_engine::AppendOutcome::Appended { tail, .. }
                | picomq_engine::AppendOutcome::Duplicate { tail, .. },
            ) => Ok(Offset(tail.0.saturating_sub(len))),
            Err(e) => Err(e.to_string()),
        }
    }

    fn check(g: &Group) -> Result<(), ConsumerError> {
        if g.broken.load(Ordering::SeqCst) {
            return Err(EngineError::Unavailable(
                "this consumer group is being loaded again after a failed write; retry".into(),
            )
            .into());
        }
        Ok(())
    }

    /// Up to `max` messages for `consumer`, waiting up to `wait` for some.
    pub async fn claim(
        &self,
        g: &Arc<Group>,
        consumer: &str,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<Message>, u64), ConsumerError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = g.data.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (messages, lease_until, next_due) = self.try_claim(g, consumer, max).await?;
            let now = tokio::time::Instant::now();
            if !messages.is_empty() || now >= deadline {
                return Ok((messages, lease_until));
            }
            let mut until = deadline;
            if let Some(due) = next_due {
                let wall = self.engine.clock().now_ms();
                let due_in = Duration::from_millis(due.saturating_sub(wall) + 1);
                until = until.min(now + due_in);
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn try_claim(
        &self,
        g: &Arc<Group>,
        consumer: &str,
        max: usize,
    ) -> Result<(Vec<Message>, u64, Option<u64>), ConsumerError> {
        Self::check(g)?;
        let mut written = Vec::new();
        let mut guard = g.live.lock().await;
        let live = guard.as_mut().ok_or_else(|| not_found(""))?;
        let now = self.engine.clock().now_ms();
        live.state.lapse(now);
        let room = OUT_MAX.saturating_sub(live.state.out.len());
        let max = max.min(room);
        let (again, dead) = live.state.due(now, max);
        let dead = live.unparked(dead, now);
        if !dead.is_empty() {
            written.extend(self.dead_letter(g, live, dead).await);
        }
        let mut messages = Vec::new();
        let mut handed: Vec<Handed> = Vec::new();
        let mut gone = Vec::new();
        for (offset, back) in again {
            match self.read_one(g, live.json, &back, offset).await? {
                Some(body) => {
                    handed.push((offset, back.append, back.end, back.deliveries + 1));
                    messages.push(Message {
                        offset,
                        end: back.end,
                        deliveries: back.deliveries + 1,
                        body,
                    });
                }
                None => gone.push(offset),
            }
        }
        if !gone.is_empty() {
            // Trimmed away (retention) before it was delivered again.
            written.push(self.log(g, live, Event::Ack { offsets: gone }));
        }
        let (mut cursor, mut cursor_append) = (live.state.cursor, live.state.cursor_append);
        if messages.len() < max {
            let fresh = self
                .read_new(
                    g,
                    live,
                    &mut cursor,
                    &mut cursor_append,
                    max - messages.len(),
                )
                .await?;
            for m in fresh {
                handed.push((m.0, m.1, m.2, 1));
                messages.push(Message {
                    offset: m.0,
                    end: m.2,
                    deliveries: 1,
                    body: m.3,
                });
            }
        }
        let lease_until = now + live.state.config.lease_ms;
        if !handed.is_empty() || cursor != live.state.cursor {
            let event = Event::Claim {
                consumer: consumer.to_string(),
                until: lease_until,
                messages: handed,
                cursor,
                cursor_append,
            };
            written.push(self.log(g, live, event));
        }
        let next_due = live.next_due_ms();
        drop(guard);
        self.flush(g, written).await?;
        Ok((messages, lease_until, next_due))
    }

    /// Messages from the cursor on: `(offset, append, end, body)`, at most `max`;
    /// moves the cursor past them. Served from the group's read-ahead (one read
    /// of up to [`CLAIM_READ_BYTES`] serves many claims: a cold read decodes whole
    /// chunks, which must not be paid per claim of a few messages).
    async fn read_new(
        &self,
        g: &Arc<Group>,
        live: &mut Live,
        cursor: &mut u64,
        cursor_append: &mut u64,
        max: usize,
    ) -> Result<Vec<(u64, u64, u64, Bytes)>, ConsumerError> {
        let mut out = Vec::new();
        for _ in 0..8 {
            while out.len() < max {
                let Some(m) = live.ahead.pop_front() else {
                    break;
                };
                if m.offset < *cursor {
                    continue;
                }
                *cursor = m.end;
                *cursor_append = m.next_append;
                out.push((m.offset, m.append, m.end, m.body));
            }
            if out.len() >= max {
                break;
            }
            let stream = self.engine.stream(&g.stream).await?;
            let from = *cursor_append;
            let chunk = match self
                .engine
                .read(&stream, Offset(from), CLAIM_READ_BYTES)
                .await
            {
                Ok(c) => c,
                Err(EngineError::Trimmed { start }) => {
                    *cursor = start.0;
                    *cursor_append = start.0;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let messages = split(&chunk.segments, &chunk.flags, from, live.json);
            let n = messages.len();
            let appends: Vec<u64> = messages.iter().map(|m| m.1).collect();
            for (i, (offset, append, end, body)) in messages.into_iter().enumerate() {
                let next_append = if i + 1 < n && appends[i + 1] == append {
                    append
                } else {
                    end
                };
                live.ahead.push_back(Ahead {
                    offset,
                    append,
                    end,
                    next_append,
                    body,
                });
            }
            if live.ahead.is_empty()
                || (chunk.up_to_date && live.ahead.iter().all(|m| m.offset < *cursor))
            {
                live.ahead.clear();
                break;
            }
        }
        Ok(out)
    }

    /// The body of the message at `offset` (in the append at `back.append`);
    /// `None` if it was trimmed away.
    async fn read_one(
        &self,
        g: &Arc<Group>,
        json: bool,
        back: &Back,
        offset: u64,
    ) -> Result<Option<Bytes>, ConsumerError> {
        let stream = self.engine.stream(&g.stream).await?;
        let chunk = match self
            .engine
            .read(&stream, Offset(back.append), CLAIM_READ_BYTES)
            .await
        {
            Ok(c) => c,
            Err(EngineError::Trimmed { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(split(&chunk.segments, &chunk.flags, back.append, json)
            .into_iter()
            .find(|m| m.0 == offset)
            .map(|m| m.3))
    }

    /// Appends messages out of deliveries to the dead-letter stream (if the group
    /// has one), then logs them dead. If the dead-letter stream does not take them,
    /// they are parked instead (handed back, never delivered again, tried again
    /// later): a dead-letter stream that refuses never stops the group.
    async fn dead_letter(
        &self,
        g: &Arc<Group>,
        live: &mut Live,
        dead: super::state::BackList,
    ) -> Vec<Written> {
        let offsets: Vec<u64> = dead.iter().map(|(o, _)| *o).collect();
        let appended = match live.state.config.dead_letter.clone() {
            Some(dlq) => self.append_dead_records(g, live, &dlq, &dead).await,
            None => Ok(()),
        };
        let now = self.engine.clock().now_ms();
        match appended {
            Ok(()) => {
                live.parked = live.parked.take().filter(|p| {
                    // Parked messages not in this batch (past a claim's `max`) stay
                    // parked; the next attempt is due at once.
                    p.offsets.iter().any(|o| !offsets.contains(o))
                });
                if let Some(p) = &mut live.parked {
                    p.offsets.retain(|o| !offsets.contains(o));
                    p.retry_at_ms = now;
                    p.attempts = 0;
                }
                vec![self.log(g, live, Event::Dead { offsets })]
            }
            Err(e) => {
                let reason = format!(
                    "the dead-letter stream {:?} did not take them: {}",
                    live.state.config.dead_letter.as_deref().unwrap_or(""),
                    e
                );
                tracing::warn!(group = %live.state.config.group, parked = offsets.len(), %reason, "messages out of deliveries are parked");
                // Messages out under a lease (a nack of their last delivery) are
                // handed back first, so the log holds them until they are dead.
                let out: Vec<u64> = offsets
                    .iter()
                    .copied()
                    .filter(|o| live.state.out.contains_key(o))
                    .collect();
                let mut written = Vec::new();
                if !out.is_empty() {
                    let event = Event::Nack {
                        offsets: out,
                        not_before: 0,
                    };
                    written.push(self.log(g, live, event));
                }
                live.park(offsets, reason, now);
                written
            }
        }
    }

    /// The dead letters of `dead` as one append to `dlq`.
    async fn append_dead_records(
        &self,
        g: &Arc<Group>,
        live: &Live,
        dlq: &str,
        dead: &super::state::BackList,
    ) -> Result<(), ConsumerError> {
        let mut bodies = Vec::with_capacity(dead.len());
        for (offset, back) in dead {
            bodies.push(self.read_one(g, live.json, back, *offset).await?);
        }
        let records: Vec<DeadRecord<'_>> = dead
            .iter()
            .zip(&bodies)
            .map(|((offset, back), body)| {
                dead_record(
                    &live.state.config,
                    live.json,
                    *offset,
                    back.deliveries,
                    body.as_deref(),
                )
            })
            .collect();
        let body = serde_json::to_vec(&records).expect("dead letters serialize");
        self.append_dead(dlq, Bytes::from(body)).await
    }

    /// Appends to the dead-letter stream (created as a JSON stream if it is not
    /// there), here or at the member serving it.
    async fn append_dead(&self, name: &str, body: Bytes) -> Result<(), ConsumerError> {
        let stream = self.name(name.to_string())?;
        let mut create = CreateRequest::new(stream.clone());
        create.content_type = Some(ContentType::json());
        let local = match self.engine.create(create).await {
            Ok(_) => true,
            Err(EngineError::NotOwner) => false,
            Err(EngineError::Conflict(_)) => true,
            Err(e) => return Err(e.into()),
        };
        if local {
            self.engine
                .append(AppendRequest::new(stream, Some(ContentType::json()), body))
                .await?;
            if let Some(hub) = self.hub.get().and_then(Weak::upgrade) {
                hub.written(name);
            }
            return Ok(());
        }
        crate::append_at_owner(&self.engine, name, body).await
    }

    /// Acks `offsets`; returns how many were out or handed back.
    pub async fn ack(&self, g: &Arc<Group>, offsets: Vec<u64>) -> Result<usize, ConsumerError> {
        Self::check(g)?;
        let mut guard = g.live.lock().await;
        let live = guard.as_mut().ok_or_else(|| not_found(""))?;
        let known: Vec<u64> = offsets
            .into_iter()
            .filter(|o| live.state.out.contains_key(o) || live.state.back.contains_key(o))
            .collect();
        let n = known.len();
        if n > 0 {
            let written = self.log(g, live, Event::Ack { offsets: known });
            drop(guard);
            self.flush(g, vec![written]).await?;
        }
        Ok(n)
    }

    /// Hands `offsets` back, to be delivered again after `delay` (or
    /// dead-lettered if they are out of deliveries); returns how many were out.
    pub async fn nack(
        &self,
        g: &Arc<Group>,
        offsets: Vec<u64>,
        delay: Duration,
    ) -> Result<usize, ConsumerError> {
        Self::check(g)?;
        let mut written = Vec::new();
        let mut guard = g.live.lock().await;
        let live = guard.as_mut().ok_or_else(|| not_found(""))?;
        let mut back = Vec::new();
        let mut dead = Vec::new();
        for o in offsets {
            if let Some(out) = live.state.out.get(&o) {
                let b = Back {
                    deliveries: out.deliveries,
                    not_before_ms: 0,
                    append: out.append,
                    end: out.end,
                };
                if live.state.exhausted(out.deliveries) {
                    dead.push((o, b));
                } else {
                    back.push(o);
                }
            }
        }
        let n = back.len() + dead.len();
        if !back.is_empty() {
            let not_before = self.engine.clock().now_ms() + delay.as_millis() as u64;
            let event = Event::Nack {
                offsets: back,
                not_before,
            };
            written.push(self.log(g, live, event));
        }
        if !dead.is_empty() {
            written.extend(self.dead_letter(g, live, dead).await);
        }
        drop(guard);
        self.flush(g, written).await?;
        g.data.notify_waiters();
        Ok(n)
    }

    /// The group's configuration and counts.
    pub async fn describe(&self, g: &Arc<Group>) -> Result<Value, ConsumerError> {
        let tail = self.engine.head(&g.stream).await.map(|i| i.tail.0).ok();
        let mut guard = g.live.lock().await;
        let live = guard.as_mut().ok_or_else(|| not_found(""))?;
        live.state.lapse(self.engine.clock().now_ms());
        let parked = live.parked_view();
        let s = &live.state;
        Ok(json!({
            "group": s.config.group,
            "stream": s.config.stream,
            "maxDeliveries": s.config.max_deliveries,
            "deadLetter": s.config.dead_letter,
            "leaseMs": s.config.lease_ms,
            "createdAt": s.config.created_at,
            "cursor": Offset(s.cursor).to_string(),
            "lagBytes": tail.map(|t| t.saturating_sub(s.cursor)),
            "pending": s.back.len().saturating_sub(parked.count),
            "inFlight": s.out.len(),
            "acked": s.acked_total,
            "redeliveries": s.redeliveries_total,
            "deadLettered": s.dead_lettered_total,
            "parked": parked.json(),
        }))
    }

    /// Per-group gauges for `/metrics`, of the groups this node has loaded.
    pub async fn export(&self, out: &mut picomq_engine::metrics::Exposition) {
        let groups: Vec<Arc<Group>> = self
            .groups
            .lock()
            .expect("groups lock")
            .values()
            .cloned()
            .collect();
        for g in groups {
            let Ok(v) = self.describe(&g).await else {
                continue;
            };
            let group = v["group"].as_str().unwrap_or("").to_string();
            let labels = [("group", group.as_str())];
            let num = |k: &str| v[k].as_f64().unwrap_or(0.0);
            out.value(&super::PENDING, &labels, num("pending"));
            out.value(&super::IN_FLIGHT, &labels, num("inFlight"));
            out.value(&super::LAG, &labels, num("lagBytes"));
            out.value(&super::ACKED, &labels, num("acked"));
            out.value(&super::REDELIVERIES, &labels, num("redeliveries"));
            out.value(&super::DEAD_LETTERED, &labels, num("deadLettered"));
            let parked = v["parked"]["messages"].as_f64().unwrap_or(0.0);
            out.value(&super::PARKED, &labels, parked);
        }
    }
}

impl Live {
    /// `dead` without the messages parked and not due for another attempt.
    fn unparked(&mut self, dead: super::state::BackList, now_ms: u64) -> super::state::BackList {
        let state = &self.state;
        let Some(p) = &mut self.parked else {
            return dead;
        };
        // Acked (or otherwise settled) since they were parked.
        p.offsets.retain(|o| state.back.contains_key(o));
        if p.offsets.is_empty() {
            self.parked = None;
            return dead;
        }
        if now_ms >= p.retry_at_ms {
            return dead;
        }
        dead.into_iter()
            .filter(|(o, _)| !p.offsets.contains(o))
            .collect()
    }

    fn park(&mut self, offsets: Vec<u64>, reason: String, now_ms: u64) {
        let p = self.parked.get_or_insert_with(|| Parked {
            offsets: Default::default(),
            reason: String::new(),
            since_ms: now_ms,
            retry_at_ms: now_ms,
            attempts: 0,
        });
        p.offsets.extend(offsets);
        p.reason = reason;
        p.attempts = p.attempts.saturating_add(1);
        let backoff = PARKED_RETRY_MS_MIN
            .saturating_mul(1u64 << p.attempts.saturating_sub(1).min(16))
            .min(PARKED_RETRY_MS_MAX);
        p.retry_at_ms = now_ms + backoff;
    }

    /// When a claim waiting for messages should look again: the next message due
    /// (parked ones aside) or the next attempt at the parked ones.
    fn next_due_ms(&self) -> Option<u64> {
        let parked = self.parked.as_ref();
        let skip = |o: &u64| parked.is_some_and(|p| p.offsets.contains(o));
        let next = self.state.next_due_ms_except(skip);
        match (next, parked.map(|p| p.retry_at_ms)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn parked_view(&self) -> ParkedView {
        match &self.parked {
            Some(p) => ParkedView {
                count: p
                    .offsets
                    .iter()
                    .filter(|o| self.state.back.contains_key(o))
                    .count(),
                detail: Some((p.reason.clone(), p.since_ms, p.retry_at_ms)),
            },
            None => ParkedView {
                count: 0,
                detail: None,
            },
        }
    }
}

/// What a group's status says about its parked messages.
struct ParkedView {
    count: usize,
    detail: Option<(String, u64, u64)>,
}

impl ParkedView {
    fn json(&self) -> Value {
        let fmt = picomq_engine::units::format_rfc3339_ms;
        match &self.detail {
            Some((reason, since, retry)) if self.count > 0 => json!({
                "messages": self.count,
                "reason": reason,
                "since": fmt(*since),
                "nextAttempt": fmt(*retry),
            }),
            _ => json!({ "messages": 0 }),
        }
    }
}

/// A message as the dead-letter stream records it: a JSON stream's message as
/// the bytes that were appended (`body`), any other stream's as base64.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct DeadRecord<'a> {
    group: &'a str,
    stream: &'a str,
    offset: String,
    deliveries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

fn dead_record<'a>(
    config: &'a GroupConfig,
    json: bool,
    offset: u64,
    deliveries: u32,
    body: Option<&'a [u8]>,
) -> DeadRecord<'a> {
    let raw = body.filter(|_| json).and_then(raw_json);
    let body_base64 = match (raw, body) {
        (None, Some(b)) => Some(base64::engine::general_purpose::STANDARD.encode(b)),
        _ => None,
    };
    DeadRecord {
        group: &config.group,
        stream: &config.stream,
        offset: Offset(offset).to_string(),
        deliveries,
        body: raw,
        body_base64,
    }
}

/// A JSON message's bytes as raw JSON, written out as they are (no depth limit:
/// checking them does not recurse); `None` if they are not JSON.
pub fn raw_json(bytes: &[u8]) -> Option<&serde_json::value::RawValue> {
    serde_json::from_slice(bytes).ok()
}

/// A read's segments as messages `(offset, append, end, body)`: a JSON stream's
/// messages one by one, any other stream's appends whole.
pub fn split(
    segments: &[Bytes],
    flags: &[u8],
    from: u64,
    json: bool,
) -> Vec<(u64, u64, u64, Bytes)> {
    let mut out: Vec<(u64, u64, u64, Bytes)> = Vec::with_capacity(segments.len());
    let mut pos = from;
    let mut append = from;
    for (i, seg) in segments.iter().enumerate() {
        let starts = flags.get(i).is_some_and(|f| f & RECORD_BATCH_START != 0) || i == 0;
        if starts {
            append = pos;
        }
        let end = pos + seg.len() as u64;
        if json || starts || out.is_empty() {
            out.push((pos, append, end, seg.clone()));
        } else {
            let last = out.last_mut().expect("not empty");
            let mut joined = Vec::with_capacity(last.3.len() + seg.len());
            joined.extend_from_slice(&last.3);
            joined.extend_from_slice(seg);
            last.3 = Bytes::from(joined);
            last.2 = end;
        }
        pos = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_messages_split_one_by_one_and_byte_appends_stay_whole() {
        let segs = [Bytes::from("{}"), Bytes::from("[1]"), Bytes::from("7")];
        let flags = [RECORD_BATCH_START, 0, RECORD_BATCH_START];
        let m = split(&segs, &flags, 100, true);
        let at: Vec<(u64, u64, u64)> = m.iter().map(|x| (x.0, x.1, x.2)).collect();
        assert_eq!(at, [(100, 100, 102), (102, 100, 105), (105, 105, 106)]);
        let m = split(&segs, &flags, 100, false);
        assert_eq!(m.len(), 2);
        assert_eq!(&m[0].3[..], b"{}[1]");
        assert_eq!((m[1].0, m[1].2), (105, 106));
    }
}
