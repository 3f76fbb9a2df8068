//! Compaction: rewrites old WAL data into read-optimized objects and moves the index
//! onto them, so a long history costs few objects to keep and few GETs to read.
//!
//! A round reads the oldest WAL objects that still hold indexed data (one GET per
//! object, whatever number of streams it holds), or compacted objects that are
//! mostly dead space (their streams deleted or trimmed), concatenates each stream's adjacent
//! rows into chunks of at most `chunk_bytes_max`, and writes them out: a stream with
//! `segment_bytes_min` or more in the round gets objects of its own (a *segment*),
//! the others share *packs*. Chunks keep the WAL chunk format, so the read path does
//! not change: an index row just points somewhere else. Offsets never change.
//!
//! The index moves through the WAL: every new chunk is an `Op::Relocate` in the
//! node's system chunk, applied by the indexer like any other op. So the invariant
//! "every index row is derived from the log" still holds, a restore from any
//! checkpoint replays the moves, and garbage collection keeps its single rule
//! (`gc`): an object no row points into and older than the checkpoint floor can go.
//! Compacted objects are named after the WAL position at which they were written
//! (`seg/{epoch}/{seq}-{n}.seg`); the relocation that references one lands at that
//! position or later, which is what lets GC compare them with the floor.
//!
//! Crash safety: a crash after writing an object but before its relocation is
//! durable leaves the object unreferenced (GC deletes it once the floor passes its
//! position); after the relocation is durable, replay re-applies it. A round holds
//! the maintenance lock until its relocations are indexed, so GC never sees a new
//! object between its write and its commit. Compaction never blocks appends (it
//! reads durable data and submits a few small ops) nor reads (a read that fetched a
//! row just before a move finds the old object, or re-reads the index if GC has
//! deleted it since).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::config::CompactionConfig;
use crate::error::{EngineError, Result};
use crate::layout;
use crate::meta::{IndexRow, Meta};
use crate::metrics::{Counter, Desc, Exposition, Source};
use crate::offset::Offset;
use crate::read::block_cache::BlockCache;
use crate::wal::format::{self, AppendOp, Op, RelocateOp};
use crate::wal::system::SystemLog;

/// Index rows one round looks at, at most.
const ROUND_ROWS_MAX: u32 = 20_000;
/// Small compacted objects of one size tier that are merged together.
const SMALL_MERGE: usize = 8;

/// Size tiers of small compacted objects, a factor of 8 apart from 64 KiB.
fn size_tier(size: u64) -> u32 {
    let mut tier = 0;
    let mut bound = 64 << 10;
    while size >= bound {
        tier += 1;
        bound *= 8;
    }
    tier
}

static PASSES: Desc = Desc::counter(
    "picomq_compaction_passes_total",
    "Compaction passes completed.",
);
static FAILURES: Desc = Desc::counter(
    "picomq_compaction_failures_total",
    "Compaction passes that failed (retried at the next interval).",
);
static OBJECTS_READ: Desc = Desc::counter(
    "picomq_compaction_objects_read_total",
    "WAL objects read by compaction.",
);
static BYTES_READ: Desc = Desc::counter(
    "picomq_compaction_bytes_read_total",
    "Bytes of WAL objects read by compaction.",
);
static OBJECTS_WRITTEN: Desc = Desc::counter(
    "picomq_compaction_objects_written_total",
    "Compacted objects (segments and packs) written.",
);
static BYTES_WRITTEN: Desc = Desc::counter(
    "picomq_compaction_bytes_written_total",
    "Bytes of compacted objects written.",
);
static ROWS_REPLACED: Desc = Desc::counter(
    "picomq_compaction_rows_replaced_total",
    "Index rows moved off WAL objects by compaction.",
);
static CHUNKS_WRITTEN: Desc = Desc::counter(
    "picomq_compaction_chunks_written_total",
    "Chunks (index rows) written into compacted objects.",
);

pub struct CompactionStats {
    pub passes: Counter,
    pub failures: Counter,
    pub objects_read: Counter,
    pub bytes_read: Counter,
    pub objects_written: Counter,
    pub bytes_written: Counter,
    pub rows_replaced: Counter,
    pub chunks_written: Counter,
}

impl Default for CompactionStats {
    fn default() -> Self {
        CompactionStats {
            passes: Counter::new(&PASSES),
            failures: Counter::new(&FAILURES),
            objects_read: Counter::new(&OBJECTS_READ),
            bytes_read: Counter::new(&BYTES_READ),
            objects_written: Counter::new(&OBJECTS_WRITTEN),
            bytes_written: Counter::new(&BYTES_WRITTEN),
            rows_replaced: Counter::new(&ROWS_REPLACED),
            chunks_written: Counter::new(&CHUNKS_WRITTEN),
        }
    }
}

impl Source for CompactionStats {
    fn export(&self, out: &mut Exposition) {
        for c in [
            &self.passes,
            &self.failures,
            &self.objects_read,
            &self.bytes_read,
            &self.objects_written,
            &self.bytes_written,
            &self.rows_replaced,
            &self.chunks_written,
        ] {
            out.counter(c);
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    pub rounds: u64,
    /// Compacted objects rewritten because most of their bytes were dead or
    /// because they were small.
    pub compacted_objects_rewritten: u64,
    /// WAL objects and compacted objects read.
    pub objects_read: u64,
    pub bytes_read: u64,
    pub objects_written: u64,
    pub bytes_written: u64,
    pub rows_replaced: u64,
    pub chunks_written: u64,
}

pub struct Compactor {
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    epoch: u64,
    config: CompactionConfig,
    stats: CompactionStats,
    /// Held by a compaction round and by a GC pass: GC never runs between a new
    /// object's write and its relocation being indexed.
    maintenance: Arc<tokio::sync::Mutex<()>>,
    system: Arc<SystemLog>,
    next_object: AtomicU64,
    /// WAL positions (as keys) seen at past passes, oldest first: data below the
    /// newest one older than `delay` is old enough to compact.
    seen: Mutex<Vec<(Instant, String)>>,
    pacer: Mutex<Pacer>,
}

impl Compactor {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        epoch: u64,
        config: CompactionConfig,
        maintenance: Arc<tokio::sync::Mutex<()>>,
        system: Arc<SystemLog>,
    ) -> Compactor {
        let pacer = Pacer::new(config.bytes_per_sec, config.requests_per_sec);
        Compactor {
            store,
            meta,
            epoch,
            config,
            stats: CompactionStats::default(),
            maintenance,
            system,
            next_object: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            pacer: Mutex::new(pacer),
        }
    }

    pub fn stats(&self) -> &CompactionStats {
        &self.stats
    }

    /// The key below which WAL data is old enough, or `None` if nothing is yet.
    async fn cutoff(&self, delay: Duration) -> Result<Option<String>> {
        let now = self.meta.watermark().await?.map_or_else(
            || layout::wal_key(self.epoch, 0),
            |w| layout::wal_key(w.epoch, w.next_seq),
        );
        let mut seen = self.seen.lock().expect("seen lock");
        seen.push((Instant::now(), now));
        let old_enough = seen.iter().rposition(|(at, _)| at.elapsed() >= delay);
        let cutoff = old_enough.map(|i| seen[i].1.clone());
        // Only the newest old-enough position is ever needed again.
        if let Some(i) = old_enough {
            seen.drain(..i);
        }
        Ok(cutoff)
    }

    /// Compacts everything older than the configured delay (or `delay` if given).
    pub async fn pass(&self, delay: Option<Duration>) -> Result<PassReport> {
        self.pass_while(delay, || std::future::ready(true)).await
    }

    /// [`pass`](Self::pass), asking `still_ours` before every round after the first
    /// and stopping when it says no: in a cluster it renews the maintenance job's
    /// lease, so a pass longer than the lease never overlaps another member's.
    pub async fn pass_while<F, Fut>(
        &self,
        delay: Option<Duration>,
        still_ours: F,
    ) -> Result<PassReport>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut report = PassReport::default();
        let mut first = true;
        let Some(cutoff) = self.cutoff(delay.unwrap_or(self.config.delay)).await? else {
            return Ok(report);
        };
        // 1. WAL data older than the delay.
        loop {
            if !std::mem::take(&mut first) && !still_ours().await {
                return Ok(report);
            }
            let _maintenance = self.maintenance.lock().await;
            // Rows already a piece's size or more stay where the WAL wrote them.
            let smaller_than = self.config.wal_rows_final_bytes.unwrap_or(u64::MAX);
            let rows = self
                .meta
                .rows_in_wal_below(&cutoff, smaller_than, ROUND_ROWS_MAX)
                .await?;
            if rows.is_empty() {
                break;
            }
            self.round(&rows, self.config.round_bytes_max, &mut report)
                .await?;
        }
        // 2. Compacted objects that are mostly dead space or small, a round's worth
        // at a time.
        let rewrite = self.objects_to_rewrite().await?;
        let mut batch: Vec<String> = Vec::new();
        let mut bytes = 0;
        for (n, (key, size)) in rewrite.iter().enumerate() {
            batch.push(key.clone());
            bytes += *size as usize;
            if bytes >= self.config.round_bytes_max || n + 1 == rewrite.len() {
                if !std::mem::take(&mut first) && !still_ours().await {
                    return Ok(report);
                }
                let _maintenance = self.maintenance.lock().await;
                let rows = self.meta.rows_in_objects(&batch).await?;
                if !rows.is_empty() {
                    self.round(&rows, usize::MAX, &mut report).await?;
                    report.compacted_objects_rewritten += batch.len() as u64;
                }
                batch.clear();
                bytes = 0;
            }
        }
        self.stats.passes.add(1);
        Ok(report)
    }

    /// One round; `false` when there was nothing left to compact.
    /// One round over `rows` (grouped by object): reads their objects, oldest
    /// first, until `bytes_max` is read, rewrites the rows of the objects read and
    /// commits; returns how many rows it took.
    async fn round(
        &self,
        rows: &[IndexRow],
        bytes_max: usize,
        report: &mut PassReport,
    ) -> Result<usize> {
        // Whole objects: one GET serves every stream in an object.
        let mut by_stream: BTreeMap<u64, Vec<(IndexRow, Bytes)>> = BTreeMap::new();
        let mut fetched = 0usize;
        let mut i = 0;
        while i < rows.len() && fetched < bytes_max {
            let key = rows[i].chunk.object_key.clone();
            self.pace(0, 1).await;
            let object = self
                .store
                .get(&Path::from(key.as_str()))
                .await?
                .bytes()
                .await?;
            self.pace(object.len() as u64, 0).await;
            fetched += object.len();
            report.objects_read += 1;
            report.bytes_read += object.len() as u64;
            self.stats.objects_read.add(1);
            self.stats.bytes_read.add(object.len() as u64);
            while i < rows.len() && rows[i].chunk.object_key == key {
                let row = rows[i].clone();
                let range = row.chunk.byte_range.start as usize..row.chunk.byte_range.end as usize;
                if range.end > object.len() {
                    return Err(EngineError::Internal(format!(
                        "index row past the end of {key}"
                    )));
                }
                by_stream
                    .entry(row.stream_id)
                    .or_default()
                    .push((row, object.slice(range)));
                i += 1;
            }
        }
        // Each stream's rows in offset order, cut into chunks.
        let mut segments: Vec<Vec<Piece>> = Vec::new();
        let mut packed: Vec<Piece> = Vec::new();
        for (stream_id, mut rows) in by_stream {
            rows.sort_by_key(|(r, _)| r.chunk.start);
            let pieces = pieces(stream_id, &rows, self.config.chunk_bytes_max)?;
            let bytes: usize = pieces.iter().map(|p| p.bytes).sum();
            if bytes >= self.config.segment_bytes_min {
                segments.push(pieces);
            } else {
                packed.extend(pieces);
            }
        }
        let mut relocations = Vec::new();
        for group in segments.into_iter().chain(std::iter::once(packed)) {
            for object in split(group, self.config.object_bytes_max) {
                relocations.extend(self.write(object, report).await?);
            }
        }
        crate::failpoint::hit("compaction-after-write");
        report.rows_replaced += i as u64;
        self.stats.rows_replaced.add(i as u64);
        self.commit(relocations).await?;
        crate::failpoint::hit("compaction-after-commit");
        report.rounds += 1;
        Ok(i)
    }

    /// Compacted objects worth rewriting, with their sizes:
    /// - *sparse* ones, at least half of whose bytes nothing points into any more
    ///   (deleted, trimmed or expired streams' data): rewriting the live rows lets
    ///   GC reclaim the rest (objects nothing points into at all are GC's already);
    /// - *small* ones (under `segment_bytes_min`, e.g. the pack of each pass's
    ///   recent trickle), merged once `SMALL_MERGE` of one size tier exist, so
    ///   objects do not pile up one per pass and a byte is rewritten at most once
    ///   per tier.
    async fn objects_to_rewrite(&self) -> Result<Vec<(String, u64)>> {
        use futures::TryStreamExt;
        let live = self
            .meta
            .live_bytes_under(&format!("{}/", layout::SEGMENTS))
            .await?;
        let mut chosen = Vec::new();
        let mut tiers: BTreeMap<u32, Vec<(String, u64)>> = BTreeMap::new();
        let mut listing = self.store.list(Some(&Path::from(layout::SEGMENTS)));
        while let Some(object) = listing.try_next().await? {
            let key = object.location.to_string();
            let live = live.get(&key).copied().unwrap_or(0);
            if live == 0 {
                continue;
            }
            if live * 2 <= object.size {
                chosen.push((key, object.size));
            } else if (object.size as usize) < self.config.segment_bytes_min {
                tiers
                    .entry(size_tier(object.size))
                    .or_default()
                    .push((key, object.size));
            }
        }
        for (_, objects) in tiers {
            if objects.len() >= SMALL_MERGE {
                chosen.extend(objects);
            }
        }
        Ok(chosen)
    }

    /// Writes one compacted object; returns the relocations that point at it.
    async fn write(&self, pieces: Vec<Piece>, report: &mut PassReport) -> Result<Vec<Op>> {
        self.write_object(pieces, report, true, None).await
    }

    /// [`Compactor::write`], paced by compaction's budget or not (`paced`): the
    /// packer writes from memory what the WAL just wrote, at the WAL's own pace.
    /// With a `cache`, each chunk written goes into it under its new place.
    pub(crate) async fn write_object(
        &self,
        pieces: Vec<Piece>,
        report: &mut PassReport,
        paced: bool,
        cache: Option<&BlockCache>,
    ) -> Result<Vec<Op>> {
        let at = self.meta.watermark().await?.unwrap_or_default();
        let (epoch, seq) = if at.epoch == self.epoch {
            (at.epoch, at.next_seq)
        } else {
            (self.epoch, 0)
        };
        let n = self.next_object.fetch_add(1, Ordering::Relaxed);
        let key = layout::segment_key(epoch, seq, n);
        // Sized up front: an object of up to 64 MiB grown by doubling would copy
        // itself over and over and touch twice the memory.
        let bound = format::HEADER_LEN
            + pieces
                .iter()
                .map(|p| {
                    format::CHUNK_HEADER_LEN
                        + 12
                        + p.ops.iter().map(format::encoded_len).sum::<usize>()
                })
                .sum::<usize>();
        let mut out = BytesMut::with_capacity(bound);
        format::encode_header(&mut out, epoch, seq, pieces.len() as u32);
        let mut relocations = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let range = format::encode_chunk(&mut out, piece.stream_id, piece.ops.iter());
            relocations.push(Op::Relocate(RelocateOp {
                stream_id: piece.stream_id,
                start: piece.start,
                end: piece.end,
                object_key: key.clone(),
                byte_range: range.start as u64..range.end as u64,
                last_ts_ms: piece.last_ts_ms,
                // Pieces keep their appends' numbers: the first one's is the span's.
                start_seq: piece
                    .ops
                    .iter()
                    .find_map(|op| match op {
                        Op::Append(a) => Some(a.start_seq),
                        _ => None,
                    })
                    .unwrap_or(0),
            }));
        }
        let bytes = out.freeze();
        let len = bytes.len() as u64;
        if paced {
            self.pace(len, 1).await;
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(
                &Path::from(key.as_str()),
                PutPayload::from(bytes.clone()),
                opts,
            )
            .await?;
        if let Some(cache) = cache {
            for op in &relocations {
                if let Op::Relocate(r) = op {
                    let range = r.byte_range.start as usize..r.byte_range.end as usize;
                    cache.insert(&key, r.byte_range.start, bytes.slice(range));
                }
            }
        }
        report.objects_written += 1;
        report.bytes_written += len;
        report.chunks_written += relocations.len() as u64;
        let s = &self.stats;
        s.objects_written.add(1);
        s.bytes_written.add(len);
        s.chunks_written.add(relocations.len() as u64);
        Ok(relocations)
    }

    /// Logs the relocations and waits until they are indexed (or this node stops
    /// writing: then they are replayed by whoever recovers the log, or never landed).
    pub(crate) async fn commit(&self, relocations: Vec<Op>) -> Result<()> {
        self.system.commit(relocations).await
    }

    /// The lock a round holds from its write to its commit (see `gc`).
    pub(crate) fn maintenance(&self) -> &Arc<tokio::sync::Mutex<()>> {
        &self.maintenance
    }

    pub(crate) fn config(&self) -> &CompactionConfig {
        &self.config
    }

    async fn pace(&self, bytes: u64, requests: u64) {
        let wait = self
            .pacer
            .lock()
            .expect("pacer lock")
            .charge(bytes, requests);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

impl Compactor {
    /// The pass the scheduler runs every `--compaction-interval`.
    pub async fn scheduled_pass<F, Fut>(&self, still_ours: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        match self.pass_while(None, still_ours).await {
            Ok(r) if r.rounds > 0 => tracing::info!(
                objects_read = r.objects_read,
                objects_written = r.objects_written,
                bytes_written = r.bytes_written,
                rows_replaced = r.rows_replaced,
                "compacted WAL data"
            ),
            Ok(_) => {}
            Err(e) => {
                self.stats.failures.inc();
                tracing::warn!(error = %e, "compaction pass failed; will retry");
            }
        }
    }
}

/// One chunk to write: a run of one stream's records.
pub(crate) struct Piece {
    pub(crate) stream_id: u64,
    pub(crate) start: Offset,
    pub(crate) end: Offset,
    pub(crate) ops: Vec<Op>,
    pub(crate) bytes: usize,
    pub(crate) last_ts_ms: u64,
    /// Its data is in the block cache under its old place (see the packer).
    pub(crate) cached: bool,
}

/// Cuts one stream's rows (offset order, with their chunk bytes) into pieces of at
/// most `max` record bytes (a single bigger row stays whole). Pieces end on row
/// boundaries, so each relocation replaces whole rows on its own: applying some of
/// a round's relocations and not others (a crash between two WAL objects) leaves a
/// correct index. A piece never spans a gap between rows. Only records are kept:
/// producer stamps and lifecycle ops matter to replay, and replay reads the WAL.
fn pieces(stream_id: u64, rows: &[(IndexRow, Bytes)], max: usize) -> Result<Vec<Piece>> {
    let mut out: Vec<Piece> = Vec::new();
    for (row, bytes) in rows {
        let (_, ops) = format::decode_chunk(bytes)
            .map_err(|e| EngineError::Internal(format!("{}: {e}", row.chunk.object_key)))?;
        let mut appends = Vec::new();
        let mut size = 0;
        let mut last_ts_ms = 0;
        for op in ops {
            let Op::Append(a) = op else { continue };
            if a.records.is_empty() {
                continue;
            }
            size += a.records.iter().map(|r| r.data.len()).sum::<usize>();
            last_ts_ms = a.records.last().map_or(last_ts_ms, |r| r.ts_ms);
            appends.push(Op::Append(AppendOp {
                start: a.start,
                start_seq: a.start_seq,
                records: a.records,
                close: false,
                producer: None,
                stream_seq: None,
            }));
        }
        let (start, end) = (row.chunk.start, row.chunk.end);
        if size as u64 != end.0 - start.0 {
            return Err(EngineError::Internal(format!(
                "index row {}..{} of stream {stream_id} does not match {}",
                start.0, end.0, row.chunk.object_key
            )));
        }
        match out.last_mut() {
            Some(p) if p.end == start && p.bytes + size <= max => {
                p.end = end;
                p.bytes += size;
                p.last_ts_ms = p.last_ts_ms.max(last_ts_ms);
                p.ops.extend(appends);
            }
            _ => out.push(Piece {
                stream_id,
                start,
                end,
                ops: appends,
                bytes: size,
                last_ts_ms,
                cached: false,
            }),
        }
    }
    Ok(out)
}

/// Splits pieces into objects of about `max` bytes, in order. A remainder of a
/// quarter of `max` or less joins the last object instead of making a small one
/// (which the next pass would merge again), so objects reach at most 1.25 x `max`.
pub(crate) fn split(pieces: Vec<Piece>, max: usize) -> Vec<Vec<Piece>> {
    let mut left: usize = pieces.iter().map(|p| p.bytes).sum();
    let mut objects: Vec<Vec<Piece>> = Vec::new();
    let mut size = 0;
    for piece in pieces {
        if objects.is_empty() || (size + piece.bytes > max && size > 0 && left > max / 4) {
            objects.push(Vec::new());
            size = 0;
        }
        size += piece.bytes;
        left -= piece.bytes;
        objects.last_mut().expect("one object").push(piece);
    }
    objects
}

/// Waits shorter than this are not slept but carried: tokio's timer rounds every
/// sleep up to its next millisecond tick, so a sleep of a few microseconds per object
/// (what a byte budget books for a small WAL object) cost a millisecond each and held
/// compaction under 1,000 objects/s whatever its budget (750/s measured).
const PACE_SLEEP_MIN: Duration = Duration::from_millis(10);

/// Spaces compaction's object-store use: each request and byte books time on a
/// virtual clock running at the configured rates; a caller waits until its booking
/// once that is at least [`PACE_SLEEP_MIN`] away (so the rates hold on average, and
/// a burst runs at most that far ahead of them).
struct Pacer {
    bytes_per_sec: f64,
    requests_per_sec: f64,
    next: Instant,
}

impl Pacer {
    fn new(bytes_per_sec: u64, requests_per_sec: f64) -> Pacer {
        Pacer {
            bytes_per_sec: bytes_per_sec.max(1) as f64,
            requests_per_sec: requests_per_sec.max(0.001),
            next: Instant::now(),
        }
    }

    /// Books `bytes` and `requests`; returns how long to wait before using them.
    fn charge(&mut self, bytes: u64, requests: u64) -> Duration {
        let now = Instant::now();
        if self.next < now {
            self.next = now;
        }
        let wait = self.next - now;
        let cost = (bytes as f64 / self.bytes_per_sec).max(requests as f64 / self.requests_per_sec);
        self.next += Duration::from_secs_f64(cost);
        if wait < PACE_SLEEP_MIN {
            Duration::ZERO
        } else {
            wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_objects_fall_into_tiers_eight_times_apart() {
        assert_eq!(size_tier(0), 0);
        assert_eq!(size_tier((64 << 10) - 1), 0);
        assert_eq!(size_tier(64 << 10), 1);
        assert_eq!(size_tier((512 << 10) - 1), 1);
        assert_eq!(size_tier(512 << 10), 2);
    }

    #[test]
    fn pacer_carries_waits_too_short_to_sleep() {
        let mut p = Pacer::new(u64::MAX, 1_000.0);
        let waits: Vec<Duration> = (0..20).map(|_| p.charge(0, 1)).collect();
        assert!(
            waits.iter().all(|w| w.is_zero() || *w >= PACE_SLEEP_MIN),
            "{waits:?}"
        );
        // 1 ms per request: by the twelfth the debt is a sleep's worth.
        let first = waits.iter().position(|w| !w.is_zero());
        assert!(matches!(first, Some(9..=11)), "{waits:?}");
    }

    #[test]
    fn pacer_spaces_requests_at_the_configured_rate() {
        let mut p = Pacer::new(u64::MAX, 10.0);
        assert!(p.charge(0, 1).is_zero());
        let wait = p.charge(0, 1);
        assert!(wait > Duration::from_millis(80) && wait <= Duration::from_millis(100));
    }

    #[test]
    fn split_keeps_order_and_bounds_objects() {
        let piece = |start: u64| Piece {
            stream_id: 1,
            start: Offset(start),
            end: Offset(start + 10),
            ops: Vec::new(),
            bytes: 10,
            last_ts_ms: 0,
            cached: false,
        };
        let objects = split((0..5).map(|i| piece(i * 10)).collect(), 25);
        let sizes: Vec<usize> = objects.iter().map(|o| o.len()).collect();
        assert_eq!(sizes, vec![2, 2, 1]);
        assert_eq!(objects[2][0].start, Offset(40));
        // A small remainder joins the last object.
        let objects = split((0..5).map(|i| piece(i * 10)).collect(), 45);
        let sizes: Vec<usize> = objects.iter().map(|o| o.len()).collect();
        assert_eq!(sizes, vec![5]);
    }
}
