//! The group-commit writer and its flush policy.
//!
//! Sequencers `submit` ops (synchronously, under their own lock, so each stream's ops
//! enter the log in offset order). One task drains the buffer into WAL objects:
//! - nothing in flight: flush at once, so a lone append pays one PUT and no delay;
//! - uploads in flight: keep accumulating, and start another upload only when
//!   `pipeline_bytes_min` is buffered, or (with `overlap_after`) the newest upload
//!   has run that long, and fewer than `uploads_in_flight_max` run;
//! - an optional write budget spaces PUTs at least `1/max_writes_per_sec` apart;
//!   under the budget nothing waits, at the budget batches grow instead.
//!
//! Objects complete in sequence order: an object's ops become durable (listeners run,
//! waiters wake) only after every earlier object did, so acknowledgements follow
//! submission order. A failing upload is retried with capped, jittered backoff until
//! it lands; it is never skipped, so the log has no holes while this node lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesOrdered, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use super::format::{self, Op};
use crate::config::WalConfig;
use crate::error::{EngineError, Result};
use crate::metrics::{
    Counter, Desc, Exposition, Gauge, Histogram, Source, BYTES_BOUNDS, COUNT_BOUNDS,
    LATENCY_BOUNDS_S,
};

/// Told, in log order, when a submitted op became durable and when its index rows
/// were written to the metadata store.
pub trait DurableListener: Send + Sync {
    /// All of one stream's ops in a durable object, `(op_no, op)` in submission
    /// order: one call per stream per object, so waiters wake once per object.
    fn on_durable(&self, ops: &[(u64, Op)]);
    fn on_indexed(&self, op_no: u64);
}

pub struct Submission {
    pub stream_id: u64,
    /// Per-stream sequence number of this op, assigned by its sequencer.
    pub op_no: u64,
    pub op: Op,
    pub listener: Arc<dyn DurableListener>,
}

/// One stream's ops in a durable object, handed to the indexer.
pub struct FlushedChunk {
    pub stream_id: u64,
    /// Byte range of the chunk inside the object.
    pub range: std::ops::Range<u64>,
    pub ops: Vec<(u64, Op)>,
    pub listener: Option<Arc<dyn DurableListener>>,
}

pub struct FlushedObject {
    pub key: String,
    pub epoch: u64,
    pub seq: u64,
    pub chunks: Vec<FlushedChunk>,
    /// The object's bytes, kept when one of its rows is at least
    /// `WalConfig::rows_cached_from` (the packer puts such rows in the block cache).
    pub bytes: Option<Bytes>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalHealth {
    Ok,
    /// Uploads have been failing for longer than `store_down_after`.
    StoreDown(String),
    /// Another process took over this log; this node must stop acknowledging.
    Fenced,
    Stopped,
}

pub struct WalStats {
    pub objects_written: Counter,
    pub bytes_written: Counter,
    pub ops_written: Counter,
    pub records_written: Counter,
    pub upload_retries: Counter,
    /// Size of each WAL object written, in bytes.
    pub flush_bytes: Histogram,
    /// Ops (appends, creates, closes, deletes) per WAL object.
    pub flush_ops: Histogram,
    /// Bytes accepted and waiting for an upload to start.
    pub queued_bytes: Gauge,
    /// Per object, from its oldest op entering the buffer until its upload started.
    pub batch_wait_seconds: Histogram,
    /// Per object, from its oldest op entering the buffer until the object was
    /// durable with every object before it (what that op's append waited for).
    pub commit_seconds: Histogram,
}

static OBJECTS_WRITTEN: Desc = Desc::counter(
    "picomq_wal_objects_written_total",
    "WAL objects written to the object store (one PUT each, plus retries).",
);
static BYTES_WRITTEN: Desc = Desc::counter(
    "picomq_wal_bytes_written_total",
    "Bytes of WAL objects written.",
);
static OPS_WRITTEN: Desc = Desc::counter(
    "picomq_wal_ops_written_total",
    "Stream ops (appends, creates, closes, deletes) made durable.",
);
static RECORDS_WRITTEN: Desc = Desc::counter(
    "picomq_wal_records_written_total",
    "Records (messages) made durable.",
);
static UPLOAD_RETRIES: Desc = Desc::counter(
    "picomq_wal_upload_retries_total",
    "Failed WAL upload attempts that were retried.",
);
static QUEUED_BYTES: Desc = Desc::gauge(
    "picomq_wal_queued_bytes",
    "Bytes accepted and waiting for a WAL upload to start.",
);
static FLUSH_BYTES: Desc = Desc::histogram(
    "picomq_wal_flush_bytes",
    "Size of each WAL object written, in bytes.",
);
static FLUSH_OPS: Desc = Desc::histogram(
    "picomq_wal_flush_ops",
    "Stream ops packed into each WAL object (group commit).",
);
static BATCH_WAIT: Desc = Desc::histogram(
    "picomq_wal_batch_wait_seconds",
    "Per WAL object, from its oldest op entering the write buffer until its upload started.",
);
static COMMIT: Desc = Desc::histogram(
    "picomq_wal_commit_seconds",
    "Per WAL object, from its oldest op entering the write buffer until the object and every one before it were durable.",
);
static STATE: Desc = Desc::gauge(
    "picomq_wal_state",
    "1 for the WAL's current state: ok, store_down (appends fail fast), fenced (another process took over the bucket), stopped.",
);

impl Default for WalStats {
    fn default() -> Self {
        WalStats {
            objects_written: Counter::new(&OBJECTS_WRITTEN),
            bytes_written: Counter::new(&BYTES_WRITTEN),
            ops_written: Counter::new(&OPS_WRITTEN),
            records_written: Counter::new(&RECORDS_WRITTEN),
            upload_retries: Counter::new(&UPLOAD_RETRIES),
            flush_bytes: Histogram::new(&FLUSH_BYTES, BYTES_BOUNDS),
            flush_ops: Histogram::new(&FLUSH_OPS, COUNT_BOUNDS),
            queued_bytes: Gauge::new(&QUEUED_BYTES),
            batch_wait_seconds: Histogram::new(&BATCH_WAIT, LATENCY_BOUNDS_S),
            commit_seconds: Histogram::new(&COMMIT, LATENCY_BOUNDS_S),
        }
    }
}

impl Source for Wal {
    fn export(&self, out: &mut Exposition) {
        let stats = &self.shared.stats;
        out.counter(&stats.objects_written)
            .counter(&stats.bytes_written)
            .counter(&stats.ops_written)
            .counter(&stats.records_written)
            .counter(&stats.upload_retries)
            .gauge(&stats.queued_bytes)
            .histogram(&stats.flush_bytes, &[])
            .histogram(&stats.flush_ops, &[])
            .histogram(&stats.batch_wait_seconds, &[])
            .histogram(&stats.commit_seconds, &[]);
        let state = match &*self.shared.health.borrow() {
            WalHealth::Ok => "ok",
            WalHealth::StoreDown(_) => "store_down",
            WalHealth::Fenced => "fenced",
            WalHealth::Stopped => "stopped",
        };
        for s in ["ok", "store_down", "fenced", "stopped"] {
            out.value(&STATE, &[("state", s)], f64::from(u8::from(s == state)));
        }
    }
}

struct Buffer {
    subs: Vec<Submission>,
    bytes: usize,
    closed: bool,
    /// When the oldest op in `subs` entered (read from the clock only when an op
    /// enters an empty buffer).
    since: Option<Instant>,
}

struct Shared {
    buffer: Mutex<Buffer>,
    wake: Notify,
    health: watch::Sender<WalHealth>,
    stats: Arc<WalStats>,
    config: WalConfig,
}

#[derive(Clone)]
pub struct Wal {
    shared: Arc<Shared>,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Wal {
    /// Starts the writer for incarnation `epoch`, numbering objects from `first_seq`.
    pub fn start(
        store: Arc<dyn ObjectStore>,
        config: WalConfig,
        epoch: u64,
        first_seq: u64,
        indexer: mpsc::Sender<FlushedObject>,
    ) -> Wal {
        let (health, _) = watch::channel(WalHealth::Ok);
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer {
                subs: Vec::new(),
                bytes: 0,
                closed: false,
                since: None,
            }),
            wake: Notify::new(),
            health,
            stats: Arc::new(WalStats::default()),
            config,
        });
        let writer = Writer {
            shared: shared.clone(),
            store,
            epoch,
            next_seq: first_seq,
            next_durable: first_seq,
            indexer,
            last_put: None,
            newest_upload: None,
        };
        let task = tokio::spawn(writer.run());
        Wal {
            shared,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// Queues an op. Fails fast (never blocks) when the store is down, this node is
    /// fenced or stopping, or the backlog is full.
    pub fn submit(&self, sub: Submission) -> Result<()> {
        self.check_health()?;
        let size = format::encoded_len(&sub.op);
        {
            let mut buf = self.shared.buffer.lock().expect("wal buffer lock");
            if buf.closed {
                return Err(EngineError::Unavailable("server is shutting down".into()));
            }
            if buf.bytes + size > self.shared.config.buffer_bytes_max && !buf.subs.is_empty() {
                return Err(EngineError::Unavailable(
                    "write backlog is full (object store slower than the append rate); retry later"
                        .into(),
                ));
            }
            if buf.subs.is_empty() {
                buf.since = Some(Instant::now());
            }
            buf.bytes += size;
            buf.subs.push(sub);
            self.shared.stats.queued_bytes.set(buf.bytes as u64);
        }
        self.shared.wake.notify_one();
        Ok(())
    }

    pub fn check_health(&self) -> Result<()> {
        match &*self.shared.health.borrow() {
            WalHealth::Ok => Ok(()),
            WalHealth::StoreDown(e) => Err(EngineError::Unavailable(format!(
                "object store unavailable: {e}"
            ))),
            WalHealth::Fenced => Err(EngineError::Unavailable(
                "this node was fenced by another process writing the same bucket".into(),
            )),
            WalHealth::Stopped => Err(EngineError::Unavailable("server is shutting down".into())),
        }
    }

    /// Another process took over the bucket: stop acknowledging, refuse new ops.
    pub fn fence(&self) {
        let changed = self.shared.health.send_if_modified(|h| {
            if matches!(h, WalHealth::Ok | WalHealth::StoreDown(_)) {
                *h = WalHealth::Fenced;
                true
            } else {
                false
            }
        });
        if changed {
            tracing::error!(
                "a newer process claimed this bucket: this node is fenced and refuses writes"
            );
        }
        self.shared.wake.notify_one();
    }

    pub fn health(&self) -> watch::Receiver<WalHealth> {
        self.shared.health.subscribe()
    }

    pub fn stats(&self) -> Arc<WalStats> {
        self.shared.stats.clone()
    }

    /// Stops accepting ops, writes out everything already accepted, and waits for it.
    pub async fn shutdown(&self) {
        self.shared.buffer.lock().expect("wal buffer lock").closed = true;
        self.shared.wake.notify_one();
        let task = self.task.lock().expect("wal task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    store: Arc<dyn ObjectStore>,
    epoch: u64,
    next_seq: u64,
    /// The next object to become durable: objects complete strictly in sequence.
    next_durable: u64,
    indexer: mpsc::Sender<FlushedObject>,
    last_put: Option<Instant>,
    /// When the newest upload in flight started (`None` when none is in flight).
    newest_upload: Option<Instant>,
}

/// Largest WAL object whose write may run on the writer's own thread
/// ([`crate::store::WriteOnCaller`]): a sequential writer's 64 KiB appends, not a
/// multi-megabyte one, whose write and checksum would hold a runtime worker.
const ON_CALLER_BYTES_MAX: usize = 256 << 10;

type Upload = JoinHandle<Result<Encoded, ()>>;

struct Encoded {
    key: String,
    seq: u64,
    bytes: usize,
    chunks: Vec<FlushedChunk>,
    since: Option<Instant>,
    data: Option<Bytes>,
}

impl Writer {
    async fn run(mut self) {
        let mut inflight: FuturesOrdered<Upload> = FuturesOrdered::new();
        loop {
            if *self.shared.health.borrow() == WalHealth::Fenced {
                self.fail_buffer();
                return;
            }
            let (buffered, closed) = {
                let buf = self.shared.buffer.lock().expect("wal buffer lock");
                (buf.bytes, buf.closed)
            };
            let budget_wait = self.budget_wait();
            let room = inflight.len() < self.shared.config.uploads_in_flight_max;
            // How long until the newest upload has run `overlap_after` (zero: now).
            let overlap_wait = match (self.shared.config.overlap_after, self.newest_upload) {
                (Some(after), Some(started)) if buffered > 0 && room => {
                    Some(after.saturating_sub(started.elapsed()))
                }
                _ => None,
            };
            let may_start = buffered > 0
                && room
                && (inflight.is_empty()
                    || buffered >= self.shared.config.pipeline_bytes_min
                    || overlap_wait == Some(Duration::ZERO)
                    || closed)
                && budget_wait.is_none();
            if may_start {
                let upload = self.start_flush(inflight.is_empty());
                inflight.push_back(upload);
                self.newest_upload = Some(Instant::now());
                continue;
            }
            if closed && buffered == 0 && inflight.is_empty() {
                self.shared.health.send_replace(WalHealth::Stopped);
                return;
            }
            tokio::select! {
                _ = self.shared.wake.notified() => {}
                done = inflight.next(), if !inflight.is_empty() => {
                    match done {
                        Some(Ok(Ok(encoded))) => {
                            if inflight.is_empty() {
                                self.newest_upload = None;
                            }
                            self.complete(encoded).await
                        }
                        _ => {
                            // Fenced (or the upload task died): acknowledge nothing more.
                            self.shared.health.send_replace(WalHealth::Fenced);
                            self.fail_buffer();
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep(budget_wait.unwrap_or(Duration::ZERO)), if budget_wait.is_some() && buffered > 0 => {}
                // (Under the budget its own sleep wakes the loop.)
                _ = tokio::time::sleep(overlap_wait.unwrap_or(Duration::ZERO)), if overlap_wait.is_some() && budget_wait.is_none() => {}
            }
        }
    }

    /// How long until the write budget allows the next PUT (`None` = now).
    fn budget_wait(&self) -> Option<Duration> {
        let rate = self.shared.config.max_writes_per_sec?;
        let last = self.last_put?;
        let spacing = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let elapsed = last.elapsed();
        (elapsed < spacing).then(|| spacing - elapsed)
    }

    /// Takes what is buffered (up to `flush_bytes_max`) and starts its upload;
    /// `alone`: no other upload is in flight.
    fn start_flush(&mut self, alone: bool) -> Upload {
        let (subs, since) = {
            let mut buf = self.shared.buffer.lock().expect("wal buffer lock");
            let max = self.shared.config.flush_bytes_max;
            let mut taken = 0;
            let mut n = 0;
            for sub in &buf.subs {
                let size = format::encoded_len(&sub.op);
                if n > 0 && taken + size > max {
                    break;
                }
                taken += size;
                n += 1;
            }
            buf.bytes -= taken;
            self.shared.stats.queued_bytes.set(buf.bytes as u64);
            let rest = buf.subs.split_off(n);
            // What stays behind (a backlog past one object) counts from now: an
            // underestimate of its wait, and only when the store lags far behind.
            let since = if rest.is_empty() {
                buf.since.take()
            } else {
                buf.since.replace(Instant::now())
            };
            (std::mem::replace(&mut buf.subs, rest), since)
        };
        if let Some(since) = since {
            self.shared
                .stats
                .batch_wait_seconds
                .observe(since.elapsed().as_secs_f64());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.last_put = Some(Instant::now());
        let one_op = subs.len() == 1;
        let (bytes, chunks) = encode(self.epoch, seq, subs);
        let on_caller = alone && one_op && bytes.len() <= ON_CALLER_BYTES_MAX;
        let key = crate::layout::wal_key(self.epoch, seq);
        let store = self.store.clone();
        let shared = self.shared.clone();
        let big = |at: u64| chunks.iter().any(|c| c.range.end - c.range.start >= at);
        let data = shared
            .config
            .rows_cached_from
            .is_some_and(big)
            .then(|| bytes.clone());
        tokio::spawn(async move {
            let len = bytes.len();
            upload(&*store, &key, bytes, on_caller, &shared).await?;
            Ok(Encoded {
                key,
                seq,
                bytes: len,
                chunks,
                since,
                data,
            })
        })
    }

    async fn complete(&mut self, encoded: Encoded) {
        // Acknowledgements follow submission order only if objects complete in
        // sequence: a gap or a reorder here would acknowledge an op before one
        // submitted earlier is durable.
        assert_eq!(
            encoded.seq, self.next_durable,
            "WAL objects must become durable in sequence"
        );
        self.next_durable += 1;
        let stats = &self.shared.stats;
        stats.objects_written.add(1);
        stats.flush_bytes.observe(encoded.bytes as f64);
        if let Some(since) = encoded.since {
            stats.commit_seconds.observe(since.elapsed().as_secs_f64());
        }
        let ops: usize = encoded.chunks.iter().map(|c| c.ops.len()).sum();
        stats.flush_ops.observe(ops as f64);
        let records: usize = encoded
            .chunks
            .iter()
            .flat_map(|c| &c.ops)
            .map(|(_, op)| match op {
                Op::Append(a) => a.records.len(),
                _ => 0,
            })
            .sum();
        stats.records_written.add(records as u64);
        for chunk in &encoded.chunks {
            if let Some(listener) = &chunk.listener {
                listener.on_durable(&chunk.ops);
            }
            stats.ops_written.add(chunk.ops.len() as u64);
        }
        let flushed = FlushedObject {
            key: encoded.key,
            epoch: self.epoch,
            seq: encoded.seq,
            chunks: encoded.chunks,
            bytes: encoded.data,
        };
        // Bounded channel: a slow metadata store slows the log down instead of
        // growing memory without limit.
        let _ = self.indexer.send(flushed).await;
    }

    fn fail_buffer(&self) {
        let mut buf = self.shared.buffer.lock().expect("wal buffer lock");
        buf.subs.clear();
        buf.bytes = 0;
        buf.since = None;
        buf.closed = true;
        self.shared.stats.queued_bytes.set(0);
    }
}

/// One stream's ops of a flush: stream id, its listener, `(op_no, op)` pairs.
type Group = (u64, Arc<dyn DurableListener>, Vec<(u64, Op)>);

/// Packs submissions into one object: header, then one chunk per stream, each
/// stream's ops in submission order.
fn encode(epoch: u64, seq: u64, subs: Vec<Submission>) -> (Bytes, Vec<FlushedChunk>) {
    let mut order: HashMap<u64, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut size = format::HEADER_LEN;
    for sub in subs {
        size += format::encoded_len(&sub.op) + format::CHUNK_HEADER_LEN;
        match order.get(&sub.stream_id) {
            Some(&i) => groups[i].2.push((sub.op_no, sub.op)),
            None => {
                order.insert(sub.stream_id, groups.len());
                groups.push((sub.stream_id, sub.listener, vec![(sub.op_no, sub.op)]));
            }
        }
    }
    let mut out = BytesMut::with_capacity(size + 16 * groups.len());
    format::encode_header(&mut out, epoch, seq, groups.len() as u32);
    let mut chunks = Vec::with_capacity(groups.len());
    for (stream_id, listener, ops) in groups {
        let range = format::encode_chunk(&mut out, stream_id, ops.iter().map(|(_, op)| op));
        chunks.push(FlushedChunk {
            stream_id,
            range: range.start as u64..range.end as u64,
            ops,
            listener: Some(listener),
        });
    }
    (out.freeze(), chunks)
}

/// Writes one object create-only, retrying transient failures until it lands.
/// `Err` means this node is fenced: the key exists with other bytes.
///
/// The store is declared down `store_down_after` from the first attempt, even while
/// an attempt is still pending (a client's own retries or a hung connection must not
/// hide an outage), and healthy again as soon as an attempt lands.
async fn upload(
    store: &dyn ObjectStore,
    key: &str,
    bytes: Bytes,
    on_caller: bool,
    shared: &Shared,
) -> Result<(), ()> {
    let path = Path::from(key);
    let started = Instant::now();
    let down_at = tokio::time::Instant::from_std(started + shared.config.store_down_after);
    let mut backoff = Duration::from_millis(10);
    let mut attempt = 0u32;
    loop {
        let attempt_result = {
            let put = attempt_put(
                store,
                &path,
                &bytes,
                on_caller,
                shared.config.upload_attempt_timeout,
            );
            tokio::pin!(put);
            loop {
                tokio::select! {
                    r = &mut put => break r,
                    _ = tokio::time::sleep_until(down_at), if !store_down(shared) => {
                        mark_down(shared, "uploads have been failing or hanging".into());
                    }
                }
            }
        };
        let err = match attempt_result {
            Attempt::Landed => {
                mark_healthy(shared);
                shared.stats.bytes_written.add(bytes.len() as u64);
                return Ok(());
            }
            Attempt::Fenced => return Err(()),
            Attempt::Failed(e) => e,
        };
        attempt += 1;
        shared.stats.upload_retries.add(1);
        if started.elapsed() >= shared.config.store_down_after {
            mark_down(shared, err.clone());
        }
        if attempt == 1 || attempt.is_power_of_two() {
            tracing::warn!(key, attempt, error = %err, "WAL upload failed; retrying");
        }
        let jitter = fastrand::u64(0..=backoff.as_millis() as u64 / 2 + 1);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(shared.config.retry_backoff_max);
    }
}

enum Attempt {
    Landed,
    Fenced,
    Failed(String),
}

/// One create-only PUT, resolving `AlreadyExists` by comparing bytes.
async fn attempt_put(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: &Bytes,
    on_caller: bool,
    timeout: Duration,
) -> Attempt {
    let mut opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    if on_caller {
        opts.extensions.insert(crate::store::WriteOnCaller);
    }
    let put = store.put_opts(path, PutPayload::from(bytes.clone()), opts);
    match tokio::time::timeout(timeout, put).await {
        Err(_) => Attempt::Failed(format!("no answer within {timeout:?}")),
        Ok(Ok(_)) => Attempt::Landed,
        Ok(Err(object_store::Error::AlreadyExists { .. })) => {
            // Either an earlier attempt of ours landed (its response was lost), or
            // a newer incarnation sealed this key to fence us. The bytes tell.
            let existing = async { store.get(path).await?.bytes().await };
            match tokio::time::timeout(timeout, existing).await {
                Ok(Ok(existing)) if existing == *bytes => Attempt::Landed,
                Ok(Ok(_)) => {
                    tracing::error!(
                        key = %path,
                        "WAL key taken by another writer: this node is fenced"
                    );
                    Attempt::Fenced
                }
                Ok(Err(e)) => Attempt::Failed(e.to_string()),
                Err(_) => Attempt::Failed(format!("no answer within {timeout:?}")),
            }
        }
        Ok(Err(e)) => Attempt::Failed(e.to_string()),
    }
}

fn store_down(shared: &Shared) -> bool {
    !matches!(*shared.health.borrow(), WalHealth::Ok)
}

fn mark_down(shared: &Shared, msg: String) {
    shared.health.send_if_modified(|h| {
        if *h == WalHealth::Ok {
            tracing::error!(error = %msg, "object store down: new appends fail fast until it answers again");
            *h = WalHealth::StoreDown(msg);
            true
        } else {
            false
        }
    });
}

fn mark_healthy(shared: &Shared) {
    shared.health.send_if_modified(|h| {
        if matches!(h, WalHealth::StoreDown(_)) {
            tracing::info!("object store reachable again");
            *h = WalHealth::Ok;
            true
        } else {
            false
        }
    });
}
