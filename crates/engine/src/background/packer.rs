//! The packer: recent history moves out of the WAL within about a second, rewritten
//! from memory (the bytes the node just wrote) into packed objects where each
//! stream's records lie together, so reading the last minutes of a stream after a
//! restart costs a few large GETs instead of one per WAL object it spans.
//!
//! Each WAL object holds one small chunk per stream (a stream written over N
//! flushes spans N objects). The indexer hands the packer every object it applied;
//! the packer keeps their appends in memory, by stream, and writes them out in two
//! levels (design and costs in docs/compaction.md, "Recent history"):
//! - **L0**: once the oldest run still only in the WAL is `l0_delay` old, or
//!   `l0_objects_max` WAL objects hold runs not packed yet, one pack takes every
//!   such run. This bounds what lives only in the WAL, and so what a restart must
//!   read back (see [`Packer::warm`]).
//! - **L1**: a stream whose buffered data reached `piece_bytes` gets one piece of
//!   that size (its L0 runs and newer ones, rewritten together): pieces of a size
//!   that reads want. A stream that stays smaller leaves memory after `l1_delay`
//!   with its data in L0 pieces (compaction merges those later).
//!
//! Streams ready for L1 when an L0 pack is due go straight into it, so a busy
//! stream is written once, not twice. Packs are compaction's objects (`seg/`) and
//! go through the same commit: the object is written, then `Relocate` ops move the
//! index onto it through the WAL, all under the maintenance lock (GC never sees a
//! pack between its write and its commit). A piece covers whole index rows (whole
//! WAL chunks or whole earlier pieces) and never a gap, so each relocation replaces
//! whole rows on its own: a crash between two leaves a correct index, and one
//! before the commit leaves an unreferenced object for GC. Data of a stream deleted
//! or trimmed meanwhile is ignored by the relocation (see `meta`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::compaction::{split, Compactor, PassReport, Piece};
use crate::config::PackConfig;
use crate::error::{EngineError, Result};
use crate::meta::{IndexRow, Meta};
use crate::metrics::{Counter, Desc, Exposition, Gauge, Source};
use crate::offset::Offset;
use crate::read::block_cache::BlockCache;
use crate::read::cold::ColdReader;
use crate::wal::format::{self, AppendOp, Op, Record, SYSTEM_STREAM};
use crate::wal::FlushedObject;

/// Which level a buffered run has reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// Only in the WAL (whole chunks of WAL objects).
    Wal,
    /// In an L0 pack (one whole L0 piece).
    L0,
}

/// A contiguous span of one stream's appends, all at one level.
struct Run {
    start: Offset,
    end: Offset,
    ops: Vec<Op>,
    /// Its records' bytes (what pieces are sized by).
    bytes: usize,
    /// What holding it costs besides those bytes: its ops, their record lists,
    /// and a piece's copy of each op while a pass writes it ([`bookkeeping`]).
    extra: usize,
    last_ts_ms: u64,
    level: Level,
    /// When its oldest data entered the buffer.
    since: Instant,
    /// Its chunks are in the block cache under their old place (the warm-up put
    /// them there): its pack goes there too, or readers would miss the cache for
    /// bytes it held a moment before.
    cached: bool,
    /// A pass is writing it: its pieces hold its records until the pass ends, so
    /// letting it go would free nothing (see [`Recent::shed`]).
    writing: bool,
}

#[derive(Default)]
struct Recent {
    streams: BTreeMap<u64, Vec<Run>>,
    bytes: usize,
    /// WAL objects fed whose runs are not in a pack yet, and when the oldest came.
    unpacked_objects: usize,
    oldest_unpacked: Option<Instant>,
    /// The next pass writes everything buffered as final (L1) pieces: a stop.
    everything: bool,
    /// Record bytes let go since the packer last counted them: of runs only in the
    /// WAL, and of L0 runs.
    dropped: (usize, usize),
    /// `bytes` counts each run's bookkeeping besides its records (the node's
    /// packer: its bound is memory); without, records only (the tests of the
    /// policies below, in round figures).
    with_bookkeeping: bool,
}

impl Recent {
    /// What a run counts against the bound.
    fn held(&self, run: &Run) -> usize {
        run.bytes + if self.with_bookkeeping { run.extra } else { 0 }
    }

    /// A run into its stream's runs, kept in offset order (a restart's warm-up
    /// feeds older runs while new ones come in).
    fn add(&mut self, stream_id: u64, run: Run) {
        let held = self.held(&run);
        let runs = self.streams.entry(stream_id).or_default();
        let at = runs.partition_point(|r| r.start < run.start);
        if runs.get(at).is_some_and(|r| r.start == run.start) {
            return; // fed twice (warm-up and live): keep one
        }
        runs.insert(at, run);
        self.bytes += held;
    }

    /// Whether what was just fed took the buffer from under half of `max` to half
    /// or more: once per filling, not on every feed while it stays there (a pass
    /// that finds nothing due would otherwise run again after every feed).
    fn filled_past_half(&self, before: usize, max: usize) -> bool {
        before < max / 2 && self.bytes >= max / 2
    }

    /// Past `max` bytes, the oldest runs leave memory until an eighth of `max` is
    /// free again; returns the bytes let go. Runs a pass is writing stay: the
    /// pass's pieces hold their records until it ends, so dropping them would free
    /// nothing and only let newer data in past the bound (a pass of a full buffer
    /// takes long enough for the bound to be held twice over). They leave, or
    /// become L0 runs that may go, when the pass settles. One sort per shedding,
    /// not a scan of every stream per run let go: that was quadratic, and with
    /// 100,000 small streams buffered it held the indexer (whose task feeds the
    /// packer) at 100% of a core for seconds per batch.
    fn shed(&mut self, max: usize) -> usize {
        if self.bytes <= max {
            return 0;
        }
        let target = max - max / 8;
        let mut order: Vec<(Instant, u64, usize)> = self
            .streams
            .iter()
            .flat_map(|(id, runs)| {
                runs.iter()
                    .enumerate()
                    .filter(|(_, r)| !r.writing)
                    .map(move |(i, r)| (r.since, *id, i))
            })
            .collect();
        order.sort_unstable();
        let mut taken: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut freed = 0;
        for (_, id, i) in order {
            if self.bytes - freed <= target {
                break;
            }
            let run = &self.streams[&id][i];
            freed += self.held(run);
            match run.level {
                Level::Wal => self.dropped.0 += run.bytes,
                Level::L0 => self.dropped.1 += run.bytes,
            }
            taken.entry(id).or_default().push(i);
        }
        for (id, mut gone) in taken {
            gone.sort_unstable();
            let runs = self.streams.get_mut(&id).expect("stream present");
            let mut i = 0;
            runs.retain(|_| {
                let keep = gone.binary_search(&i).is_err();
                i += 1;
                keep
            });
            if runs.is_empty() {
                self.streams.remove(&id);
            }
        }
        self.bytes -= freed;
        freed
    }

    /// The pass is over (settled, or failed and wrote nothing): every run may be
    /// let go again.
    fn unmark(&mut self) {
        for run in self.streams.values_mut().flatten() {
            run.writing = false;
        }
    }

    /// What is due now: an L1 piece for each stream with `piece_bytes` buffered or
    /// with data older than `l1_delay`, and, when an L0 pack is due, every other run
    /// still only in the WAL. `None`: nothing to write.
    fn plan(&mut self, c: &PackConfig, max: usize, now: Instant) -> Option<Plan> {
        let recent = self;
        let everything = std::mem::take(&mut recent.everything);
        let l0_due = everything
            || recent.unpacked_objects >= c.l0_objects_max
            || recent
                .oldest_unpacked
                .is_some_and(|t| now.duration_since(t) >= c.l0_delay);
        let mut plan = Plan {
            pieces: Vec::new(),
            done: Vec::new(),
            l0_pieces: 0,
            l1_pieces: 0,
        };
        for (&id, runs) in recent.streams.iter_mut() {
            let bytes: usize = runs.iter().map(|r| r.bytes).sum();
            let old = runs
                .first()
                .is_some_and(|r| now.duration_since(r.since) >= c.l1_delay);
            // The leading runs that follow each other: whole rows, no gap (a stop
            // takes every run, gaps or not).
            let n = if everything {
                runs.len()
            } else {
                contiguous_prefix(runs)
            };
            let (pieces, last) = if bytes >= c.piece_bytes || old || everything {
                runs[..n].iter_mut().for_each(|r| r.writing = true);
                (pieces_of(id, &runs[..n], max), true)
            } else if l0_due {
                // Every run still only in the WAL, across gaps (a row that stays in
                // the WAL is one): each stretch of them is pieces of its own.
                let wal: Vec<Piece> = runs
                    .chunk_by(|a, b| a.level == b.level)
                    .filter(|stretch| stretch[0].level == Level::Wal)
                    .flat_map(|stretch| pieces_of(id, stretch, max))
                    .collect();
                if wal.is_empty() {
                    continue;
                }
                runs.iter_mut()
                    .filter(|r| r.level == Level::Wal)
                    .for_each(|r| r.writing = true);
                (wal, false)
            } else {
                continue;
            };
            let spans = pieces.iter().map(|p| (p.start, p.end)).collect();
            if last {
                plan.l1_pieces += pieces.len() as u64;
            } else {
                plan.l0_pieces += pieces.len() as u64;
            }
            plan.pieces.extend(pieces);
            plan.done.push(Done {
                stream_id: id,
                spans,
                last,
            });
        }
        if l0_due {
            recent.unpacked_objects = 0;
            recent.oldest_unpacked = None;
        }
        (!plan.pieces.is_empty()).then_some(plan)
    }

    /// After a commit: the runs an L1 piece took leave memory; those each L0 piece
    /// took become one L0 run (a whole row, for the L1 piece that follows).
    fn settle(&mut self, done: &[Done]) {
        let recent = self;
        let with_bookkeeping = recent.with_bookkeeping;
        let held = |r: Run| r.bytes + if with_bookkeeping { r.extra } else { 0 };
        let mut freed = 0;
        for d in done {
            let Some(runs) = recent.streams.get_mut(&d.stream_id) else {
                continue;
            };
            if d.last {
                let end = d.spans.last().map_or(Offset::ZERO, |s| s.1);
                let n = runs.iter().take_while(|r| r.end <= end).count();
                freed += runs.drain(..n).map(held).sum::<usize>();
            } else {
                for &(start, end) in &d.spans {
                    let Some(first) = runs.iter().position(|r| r.start == start) else {
                        continue;
                    };
                    let n = runs[first..].iter().take_while(|r| r.end <= end).count();
                    let merged: Vec<Run> = runs.drain(first..first + n).collect();
                    if !merged.is_empty() {
                        runs.insert(first, merge(merged, Level::L0));
                    }
                }
            }
            if runs.is_empty() {
                recent.streams.remove(&d.stream_id);
            }
        }
        recent.bytes -= freed;
        // One pass at a time: once it has settled, nothing is being written.
        recent.unmark();
    }
}

static PACKS: Desc = Desc::counter(
    "picomq_pack_objects_written_total",
    "Packs written from memory (recent history moved out of the WAL).",
);
static PACK_BYTES: Desc = Desc::counter(
    "picomq_pack_bytes_written_total",
    "Bytes of packs written from memory.",
);
static PIECES: Desc = Desc::counter(
    "picomq_pack_pieces_total",
    "Stream pieces written into packs, by level (l0: what was only in the WAL; l1: a stream's pieces of full size).",
);
static FAILURES: Desc = Desc::counter(
    "picomq_pack_failures_total",
    "Pack writes or commits that failed (the data stays where it was; retried).",
);
static BUFFERED: Desc = Desc::gauge(
    "picomq_pack_buffered_bytes",
    "Memory held for packing: recent records and each append's bookkeeping.",
);
static DROPPED: Desc = Desc::counter(
    "picomq_pack_dropped_bytes_total",
    "Record bytes let go because the packer's buffer was full, by level (wal: not in a pack yet, left to compaction; l0: in an L0 pack, not rewritten into an L1 piece).",
);

pub struct PackStats {
    pub packs: Counter,
    pub bytes: Counter,
    pub pieces_l0: Counter,
    pub pieces_l1: Counter,
    pub failures: Counter,
    pub buffered: Gauge,
    pub dropped_wal: Counter,
    pub dropped_l0: Counter,
}

impl Default for PackStats {
    fn default() -> Self {
        PackStats {
            packs: Counter::new(&PACKS),
            bytes: Counter::new(&PACK_BYTES),
            pieces_l0: Counter::labelled(&PIECES, &[("level", "l0")]),
            pieces_l1: Counter::labelled(&PIECES, &[("level", "l1")]),
            failures: Counter::new(&FAILURES),
            buffered: Gauge::new(&BUFFERED),
            dropped_wal: Counter::labelled(&DROPPED, &[("level", "wal")]),
            dropped_l0: Counter::labelled(&DROPPED, &[("level", "l0")]),
        }
    }
}

impl Source for PackStats {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.packs)
            .counter(&self.bytes)
            .counter(&self.pieces_l0)
            .counter(&self.pieces_l1)
            .counter(&self.failures)
            .gauge(&self.buffered)
            .counter(&self.dropped_wal)
            .counter(&self.dropped_l0);
    }
}

pub struct Packer {
    compactor: Arc<Compactor>,
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    config: PackConfig,
    /// Where what a pack holds goes as it is written (the cold reads' block cache):
    /// a relocation moves rows to the pack, and readers of them, after a restart's
    /// warm-up above all, find them there rather than cold. Every pack with
    /// `write_through` (remote stores), else only those of cached runs.
    cache: Option<Arc<BlockCache>>,
    recent: Mutex<Recent>,
    /// One pass at a time (the scheduled one and the warm-up's).
    passing: tokio::sync::Mutex<()>,
    /// Notified when the buffer fills past half its bound: the next pass runs
    /// then rather than at its interval, so a stream written faster than the
    /// buffer drains between two ticks is packed before it is shed.
    wake: Arc<tokio::sync::Notify>,
    pub stats: PackStats,
}

/// What one pass writes, and what becomes of the runs it took.
struct Plan {
    pieces: Vec<Piece>,
    done: Vec<Done>,
    l0_pieces: u64,
    l1_pieces: u64,
}

/// One stream's share of a pass: the spans of its pieces, and whether they are
/// final (L1: the runs leave memory) or L0 (each span becomes one L0 run).
struct Done {
    stream_id: u64,
    spans: Vec<(Offset, Offset)>,
    last: bool,
}

impl Packer {
    pub fn new(
        compactor: Arc<Compactor>,
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        config: PackConfig,
        cache: Option<Arc<BlockCache>>,
    ) -> Packer {
        Packer {
            compactor,
            store,
            meta,
            config,
            cache,
            recent: Mutex::new(Recent {
                with_bookkeeping: true,
                ..Recent::default()
            }),
            passing: tokio::sync::Mutex::new(()),
            wake: Arc::default(),
            stats: PackStats::default(),
        }
    }

    /// Takes the appends of objects just applied to the index (the indexer calls
    /// this in log order).
    pub fn feed(&self, objects: &[FlushedObject]) {
        let now = Instant::now();
        let stays = self.rows_stay();
        let mut recent = self.recent.lock().expect("packer lock");
        let before = recent.bytes;
        for object in objects {
            let mut any = false;
            for chunk in &object.chunks {
                if chunk.stream_id == SYSTEM_STREAM {
                    continue;
                }
                if stays(chunk.range.end - chunk.range.start) {
                    // Into the cache as its pack would have gone (remote stores):
                    // a reader of it just behind the tail finds it there.
                    let cache = self.cache.as_deref().filter(|_| self.config.write_through);
                    if let (Some(cache), Some(bytes)) = (cache, &object.bytes) {
                        let r = chunk.range.start as usize..chunk.range.end as usize;
                        cache.insert(&object.key, chunk.range.start, bytes.slice(r));
                    }
                    continue;
                }
                if let Some(run) = run_of(chunk.ops.iter().map(|(_, op)| op), now) {
                    any = true;
                    recent.add(chunk.stream_id, run);
                }
            }
            if any {
                recent.unpacked_objects = recent.unpacked_objects.saturating_add(1);
                recent.oldest_unpacked.get_or_insert(now);
            }
        }
        if recent.filled_past_half(before, self.config.buffer_bytes_max) {
            self.wake.notify_one();
        }
        self.shed(&mut recent);
        self.stats.buffered.set(recent.bytes as u64);
    }

    /// What the scheduler waits on besides the packer's interval (see `wake`).
    pub fn wake(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }

    /// Whether a WAL row of this many bytes stays where the WAL wrote it: a row of
    /// a piece's size or more (a big batch, a busy stream's flush) is read in one
    /// GET of that size already, and copying it into a pack would write every byte
    /// twice for nothing (`CompactionConfig::wal_rows_final_bytes`).
    fn rows_stay(&self) -> impl Fn(u64) -> bool {
        let at = self.compactor.config().wal_rows_final_bytes;
        move |bytes| at.is_some_and(|at| bytes >= at)
    }

    /// Past the buffer's bound, the oldest runs leave memory unpacked: their data
    /// stays where it is (WAL or L0) for compaction.
    fn shed(&self, recent: &mut Recent) {
        recent.shed(self.config.buffer_bytes_max);
        let (wal, l0) = std::mem::take(&mut recent.dropped);
        self.stats.dropped_wal.add(wal as u64);
        self.stats.dropped_l0.add(l0 as u64);
    }

    /// One pass (the scheduler runs it every `interval`): writes a pack if one is
    /// due.
    pub async fn pass(&self) {
        let _one = self.passing.lock().await;
        let chunk_max = self.compactor.config().chunk_bytes_max;
        let planned = {
            let mut recent = self.recent.lock().expect("packer lock");
            recent.plan(&self.config, chunk_max, Instant::now())
        };
        let Some(plan) = planned else {
            return;
        };
        match self.write(plan.pieces).await {
            Ok(()) => {
                // Counted once written and committed, not when planned.
                self.stats.pieces_l0.add(plan.l0_pieces);
                self.stats.pieces_l1.add(plan.l1_pieces);
                let mut recent = self.recent.lock().expect("packer lock");
                recent.settle(&plan.done);
                self.stats.buffered.set(recent.bytes as u64);
            }
            Err(e) => {
                self.recent.lock().expect("packer lock").unmark();
                self.stats.failures.inc();
                tracing::warn!(error = %e, "writing a pack failed; the data stays where it is");
            }
        }
    }

    /// Packs at once everything buffered, as final pieces (a graceful stop): each
    /// stream's recent history, what is only in the WAL and its recent L0 pieces,
    /// becomes one piece per MiB, so the next incarnation, or the member a stream is
    /// handed to, reads it in a GET or two rather than one per WAL object or per
    /// second of L0 packs.
    pub async fn pack_now(&self) {
        self.recent.lock().expect("packer lock").everything = true;
        self.pass().await;
    }

    /// Writes the pieces as packs and commits their relocations, under the
    /// maintenance lock.
    async fn write(&self, pieces: Vec<Piece>) -> Result<()> {
        let _maintenance = self.compactor.maintenance().lock().await;
        let mut report = PassReport::default();
        let mut relocations = Vec::new();
        for object in split(pieces, self.config.object_bytes_max) {
            // Into the cache where a read of the store costs a round trip, and
            // anywhere for what the cache held under its old place.
            let through = self.config.write_through || object.iter().any(|p| p.cached);
            let cache = self.cache.as_deref().filter(|_| through);
            relocations.extend(
                self.compactor
                    .write_object(object, &mut report, false, cache)
                    .await?,
            );
        }
        crate::failpoint::hit("pack-after-write");
        self.compactor.commit(relocations).await?;
        self.stats.packs.add(report.objects_written);
        self.stats.bytes.add(report.bytes_written);
        Ok(())
    }
}

/// One chunk's appends as a run (`None` without records).
fn run_of<'a>(ops: impl Iterator<Item = &'a Op>, now: Instant) -> Option<Run> {
    let mut run: Option<Run> = None;
    for op in ops {
        let Op::Append(a) = op else { continue };
        if a.records.is_empty() {
            continue;
        }
        let bytes: usize = a.records.iter().map(|r| r.data.len()).sum();
        let extra = bookkeeping(a.records.len());
        let last_ts_ms = a.records.last().map_or(0, |r| r.ts_ms);
        let op = Op::Append(AppendOp {
            start: a.start,
            start_seq: a.start_seq,
            records: a.records.clone(),
            close: false,
            producer: None,
            stream_seq: None,
        });
        match &mut run {
            Some(r) => {
                r.end = a.end();
                r.bytes += bytes;
                r.extra += extra;
                r.last_ts_ms = r.last_ts_ms.max(last_ts_ms);
                r.ops.push(op);
            }
            None => {
                run = Some(Run {
                    start: a.start,
                    end: a.end(),
                    ops: vec![op],
                    bytes,
                    extra,
                    last_ts_ms,
                    level: Level::Wal,
                    since: now,
                    cached: false,
                    writing: false,
                })
            }
        }
    }
    run
}

/// What one buffered append of `records` records holds besides their bytes: the
/// op in its run and the copy of it in a pass's piece, the shared record list
/// (its reference-counted header and one `Record` each), and each record's
/// shared buffer header: 520 bytes for an append of one record (an `Op` is 184),
/// half again on top of a 1 KiB record, so a bound on record bytes alone let the
/// packer hold about 1.5 times its bound (docs/compaction.md).
fn bookkeeping(records: usize) -> usize {
    const SHARED_HEADER: usize = 32;
    2 * std::mem::size_of::<Op>()
        + std::mem::size_of::<Vec<Record>>()
        + 2 * std::mem::size_of::<usize>()
        + records * (std::mem::size_of::<Record>() + SHARED_HEADER)
}

/// How many leading runs follow each other without a gap.
fn contiguous_prefix(runs: &[Run]) -> usize {
    runs.windows(2)
        .position(|w| w[0].end != w[1].start)
        .map_or(runs.len(), |i| i + 1)
}

fn merge(runs: Vec<Run>, level: Level) -> Run {
    let mut iter = runs.into_iter();
    let mut first = iter.next().expect("at least one run");
    for r in iter {
        first.end = r.end;
        first.bytes += r.bytes;
        first.extra += r.extra;
        first.last_ts_ms = first.last_ts_ms.max(r.last_ts_ms);
        first.ops.extend(r.ops);
        first.cached |= r.cached;
    }
    first.level = level;
    first.writing = false;
    first
}

/// Contiguous runs cut into pieces (index rows) of at most `max` bytes, at run
/// boundaries only (a run is a whole row: a WAL chunk, or an earlier piece; a
/// single bigger one stays whole).
fn pieces_of(stream_id: u64, runs: &[Run], max: usize) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for run in runs {
        match out.last_mut() {
            Some(p) if p.end == run.start && p.bytes + run.bytes <= max => {
                p.end = run.end;
                p.bytes += run.bytes;
                p.last_ts_ms = p.last_ts_ms.max(run.last_ts_ms);
                p.ops.extend(run.ops.iter().cloned());
                p.cached |= run.cached;
            }
            _ => out.push(Piece {
                stream_id,
                start: run.start,
                end: run.end,
                ops: run.ops.clone(),
                bytes: run.bytes,
                last_ts_ms: run.last_ts_ms,
                cached: run.cached,
            }),
        }
    }
    out
}

/// Where a restart's warm-up looks for recent history.
pub struct WarmFrom {
    /// The prefix of the last incarnation's WAL objects (its log): the rows still
    /// there are what it had not packed.
    pub wal: String,
    /// Packs of the last incarnation: under this prefix, the newest ones.
    pub packs: String,
}

impl WarmFrom {
    /// The recent history of `epoch`'s log: the rows still in its WAL objects (rows
    /// packed no longer point there), newest first, and its packs. No window of
    /// objects before the end: how many objects a second of the log takes depends on
    /// how often the WAL syncs, and a packer that shed its buffer leaves rows behind
    /// any such window.
    pub fn log(epoch: u64) -> WarmFrom {
        WarmFrom {
            wal: format!("{}/", crate::layout::wal_epoch_prefix(epoch)),
            packs: crate::layout::segments_of(epoch),
        }
    }
}

impl Packer {
    /// After a restart: the recent history of the last incarnation, its newest packs
    /// (up to [`WARM_PACKS_MAX`]) and what it had not packed yet (WAL objects near
    /// the end of the log), is read back, one ranged GET per object,
    /// [`WARM_AT_ONCE`] at a time, into the block cache (the first readers find it
    /// there, and wait for the objects still coming rather than fetch them again:
    /// [`ColdReader::warming`]) and into the packer's buffer (WAL data is packed at
    /// once, and recent L0 pieces are rewritten into L1 pieces as if the node had
    /// not stopped). Returns the objects read.
    pub async fn warm(&self, cold: &ColdReader, from: &WarmFrom) -> Result<usize> {
        use futures::{StreamExt, TryStreamExt};
        let mut packs: Vec<String> = self
            .store
            .list(Some(&Path::from(from.packs.as_str())))
            .map_ok(|o| o.location.to_string())
            .try_collect()
            .await?;
        packs.sort_unstable();
        let newest = &packs[packs.len().saturating_sub(WARM_PACKS_MAX)..];
        // Older data first: a reader catching up from the start meets it first.
        let packs = if newest.is_empty() {
            Vec::new()
        } else {
            self.meta.rows_in_objects(newest).await?
        };
        // Only that log's objects: what later logs hold (another member's, this
        // node's own next incarnation) is their writer's to pack; two packers
        // relocating the same span would each replace the other's rows. Rows that
        // stay in the WAL for good are left to the readers, whom they cost a GET of
        // a piece's size each, like any pack's piece.
        let stays_from = self.compactor.config().wal_rows_final_bytes;
        let rows: Vec<IndexRow> = self
            .meta
            .wal_rows_newest_first(&from.wal, stays_from.unwrap_or(u64::MAX), WARM_ROWS_MAX)
            .await?;
        let objects = warm_plan(packs, rows, WARM_PACK_BYTES, WARM_WAL_BYTES);
        let n = objects.len();
        let mut tickets = cold.warming(objects.iter().map(|(key, _, _)| key.clone()));
        let fetched = futures::stream::iter(objects)
            .map(|(key, rows, level)| async move {
                let range = span_of(&rows);
                let path = Path::from(key.as_str());
                let mut got = self.store.get_range(&path, range.clone()).await;
                for _ in 1..WARM_TRIES {
                    if got.is_ok() {
                        break;
                    }
                    got = self.store.get_range(&path, range.clone()).await;
                }
                (key, rows, level, range.start, got)
            })
            .buffered(WARM_AT_ONCE);
        futures::pin_mut!(fetched);
        let now = Instant::now();
        while let Some((key, rows, level, base, got)) = fetched.next().await {
            // An object that cannot be read now is left to the readers: the warm-up
            // only saves them the wait.
            let bytes = match got {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::debug!(key, error = %e, "warm-up skipped an object");
                    tickets.done(&key);
                    continue;
                }
            };
            let mut runs = Vec::with_capacity(rows.len());
            for row in rows {
                let r = &row.chunk.byte_range;
                let chunk = bytes.slice((r.start - base) as usize..(r.end - base) as usize);
                let (_, ops) = format::decode_chunk(&chunk)
                    .map_err(|e| EngineError::Internal(format!("{key}: {e}")))?;
                if let Some(mut run) = run_of(ops.iter(), now) {
                    run.level = level;
                    run.cached = true;
                    runs.push((row.stream_id, run));
                }
                cold.cache().insert(&key, r.start, chunk);
            }
            tickets.done(&key);
            let mut recent = self.recent.lock().expect("packer lock");
            for (stream_id, run) in runs {
                recent.add(stream_id, run);
            }
            if level == Level::Wal {
                recent.unpacked_objects = recent.unpacked_objects.saturating_add(1);
                recent.oldest_unpacked.get_or_insert(now);
            }
            self.shed(&mut recent);
            self.stats.buffered.set(recent.bytes as u64);
        }
        // Due at once: this is the data a crash left only in the WAL.
        self.recent.lock().expect("packer lock").unpacked_objects = usize::MAX;
        Ok(n)
    }
}

/// What the warm-up reads, in order: of the packs' rows (oldest pack first), the
/// newest packs whose spans fit in `pack_bytes`, a busy node's last minute of packs
/// being far more than a cache keeps; then of the WAL rows (newest object first),
/// the newest objects whose spans fit in `wal_bytes`, oldest first, a bound of its
/// own, since read on demand they cost a GET per chunk, a pack a GET per piece.
fn warm_plan(
    packs: Vec<IndexRow>,
    wal_newest_first: Vec<IndexRow>,
    pack_bytes: u64,
    wal_bytes: u64,
) -> Vec<(String, Vec<IndexRow>, Level)> {
    let mut objects = group_by_object(packs, Level::L0);
    let keep = objects.iter().rev().take_while(within(pack_bytes)).count();
    objects.drain(..objects.len() - keep);
    let mut wal: Vec<_> = group_by_object(wal_newest_first, Level::Wal)
        .into_iter()
        .take_while(within(wal_bytes))
        .collect();
    wal.reverse();
    objects.extend(wal);
    objects
}

/// For `take_while`: objects while their spans, added up, stay within `budget`.
fn within<T: std::borrow::Borrow<(String, Vec<IndexRow>, Level)>>(
    budget: u64,
) -> impl FnMut(&T) -> bool {
    let mut bytes = 0u64;
    move |object| {
        let span = span_of(&object.borrow().1);
        bytes += span.end - span.start;
        bytes <= budget
    }
}

/// The bytes of one object that `rows` cover: rows come in stream order, not in the
/// order of their bytes, so the first row need not start it.
fn span_of(rows: &[IndexRow]) -> std::ops::Range<u64> {
    let start = rows.iter().map(|r| r.chunk.byte_range.start).min();
    let end = rows.iter().map(|r| r.chunk.byte_range.end).max();
    start.unwrap_or(0)..end.unwrap_or(0)
}

/// Index rows grouped by object (rows come grouped), each group with its level.
fn group_by_object(rows: Vec<IndexRow>, level: Level) -> Vec<(String, Vec<IndexRow>, Level)> {
    let mut objects: Vec<(String, Vec<IndexRow>, Level)> = Vec::new();
    for row in rows {
        match objects.last_mut() {
            Some((key, rows, _)) if *key == row.chunk.object_key => rows.push(row),
            _ => objects.push((row.chunk.object_key.clone(), vec![row], level)),
        }
    }
    objects
}

/// Attempts the warm-up makes at each object before it leaves it to the readers.
const WARM_TRIES: usize = 3;

/// Objects the warm-up fetches at once: at an object store's latency (tens of ms a
/// request) a few hundred objects take a few rounds, well inside a second.
const WARM_AT_ONCE: usize = 32;

/// Packs the warm-up reads back, at most: about a minute's worth (`l1_delay`) of a
/// busy node's L0 packs.
const WARM_PACKS_MAX: usize = 128;

/// Bytes of packs the warm-up reads back, at most (the newest first): a quarter of
/// the default block cache.
const WARM_PACK_BYTES: u64 = 64 << 20;

/// Bytes of WAL objects the warm-up reads back, at most (the newest), apart
/// from the packs' share: what the log had not packed costs a GET per chunk when
/// read on demand, where a pack costs one per piece, so it is not cut short for
/// packs. About a second of a busy node's log is far less; the bound is for a
/// packer that had fallen behind (the default block cache could not keep more).
const WARM_WAL_BYTES: u64 = 256 << 20;

/// Index rows the warm-up asks for, at most (the newest): a bound on the query's
/// memory. With chunks of a few hundred bytes (about 60 MB for 200,000 rows) it
/// binds before `WARM_WAL_BYTES` does.
const WARM_ROWS_MAX: u32 = 200_000;

impl std::fmt::Debug for Packer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packer")
            .field("config", &self.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::wal::format::{Record, RECORD_BATCH_START};

    fn append(start: u64, len: usize) -> Op {
        Op::Append(AppendOp {
            start: Offset(start),
            start_seq: start,
            records: std::sync::Arc::new(vec![Record::plain(
                start,
                RECORD_BATCH_START,
                Bytes::from(vec![b'x'; len]),
            )]),
            close: false,
            producer: None,
            stream_seq: None,
        })
    }

    fn recent_with(chunks: &[(u64, u64, usize)], at: Instant) -> Recent {
        let mut recent = Recent::default();
        for &(id, start, len) in chunks {
            let run = run_of([append(start, len)].iter(), at).unwrap();
            recent.add(id, run);
            recent.unpacked_objects += 1;
            recent.oldest_unpacked.get_or_insert(at);
        }
        recent
    }

    fn config() -> PackConfig {
        PackConfig {
            l0_objects_max: 1_000,
            piece_bytes: 100,
            ..PackConfig::default()
        }
    }

    fn spans(plan: &Plan, id: u64) -> Vec<(u64, u64)> {
        plan.pieces
            .iter()
            .filter(|p| p.stream_id == id)
            .map(|p| (p.start.0, p.end.0))
            .collect()
    }

    fn index_row(stream_id: u64, key: &str, bytes: std::ops::Range<u64>) -> IndexRow {
        IndexRow {
            stream_id,
            chunk: crate::meta::ChunkRow {
                start: Offset(0),
                end: Offset(1),
                object_key: key.into(),
                byte_range: bytes,
                start_seq: 0,
                last_ts_ms: 0,
            },
        }
    }

    #[test]
    fn the_warm_up_keeps_the_newest_packs_and_wal_objects_each_within_its_bound() {
        let keys = |plan: &[(String, Vec<IndexRow>, Level)]| -> Vec<(String, usize, Level)> {
            plan.iter()
                .map(|(k, r, l)| (k.clone(), r.len(), *l))
                .collect()
        };
        // Three packs of 600, 500 and 400 bytes (rows out of byte order in the
        // middle one), and WAL objects (newest first, as the index gives them) that
        // together are far more than the budget.
        let packs = vec![
            index_row(1, "seg/a", 0..300),
            index_row(2, "seg/a", 300..600),
            index_row(1, "seg/b", 200..500),
            index_row(2, "seg/b", 0..200),
            index_row(1, "seg/c", 100..500),
        ];
        let wal = vec![
            index_row(1, "wal/2", 0..7_000),
            index_row(1, "wal/1", 0..5_000),
            index_row(2, "wal/1", 5_000..9_000),
        ];
        let plan = warm_plan(packs.clone(), wal.clone(), 1_000, u64::MAX);
        assert_eq!(
            keys(&plan),
            [
                ("seg/b".into(), 2, Level::L0),
                ("seg/c".into(), 1, Level::L0),
                ("wal/1".into(), 2, Level::Wal),
                ("wal/2".into(), 1, Level::Wal),
            ],
            "the oldest pack does not fit; the WAL objects all go, after the packs, oldest first"
        );
        let all = warm_plan(packs.clone(), wal.clone(), 1_500, u64::MAX);
        assert_eq!(all.len(), 5, "exactly the three packs fit");
        let none = warm_plan(packs.clone(), wal.clone(), 399, u64::MAX);
        assert_eq!(
            keys(&none),
            [
                ("wal/1".into(), 2, Level::Wal),
                ("wal/2".into(), 1, Level::Wal)
            ],
            "no pack fits; the WAL objects still go"
        );
        // The WAL objects have a bound of their own (7,000 + 9,000 bytes), and
        // the packs' budget is not spent on them.
        let newest = warm_plan(packs, wal, 1_000, 15_999);
        assert_eq!(
            keys(&newest),
            [
                ("seg/b".into(), 2, Level::L0),
                ("seg/c".into(), 1, Level::L0),
                ("wal/2".into(), 1, Level::Wal),
            ],
            "the newest WAL objects that fit"
        );
    }

    #[test]
    fn past_the_bound_the_oldest_runs_go_first_until_an_eighth_is_free() {
        let then = Instant::now();
        let later = then + Duration::from_secs(1);
        let mut recent = recent_with(&[(1, 0, 30), (2, 0, 30), (3, 0, 30)], then);
        for (id, start) in [(1, 30), (3, 30)] {
            recent.add(id, run_of([append(start, 30)].iter(), later).unwrap());
        }
        assert_eq!(recent.shed(150), 0, "within the bound");
        // 150 bytes held, bound 120: down to 105 at most, so two of the older runs
        // go; every newer one stays.
        assert_eq!(recent.shed(120), 60);
        assert_eq!(recent.bytes, 90);
        let left: Vec<(u64, u64)> = recent
            .streams
            .iter()
            .flat_map(|(id, runs)| runs.iter().map(move |r| (*id, r.start.0)))
            .collect();
        assert_eq!(left, [(1, 30), (3, 0), (3, 30)]);
    }

    #[test]
    fn runs_a_pass_is_writing_are_not_let_go_and_count_against_the_bound() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        // Stream 1 has a piece's worth (L1); stream 2 is only in the WAL (L0).
        let mut recent = recent_with(&[(1, 0, 60), (1, 60, 60), (2, 0, 30)], then);
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!((plan.l0_pieces, plan.l1_pieces), (1, 1));
        // While the pass writes, newer runs come in past the bound of 200.
        for (id, start) in [(1, 120), (2, 30), (3, 0)] {
            recent.add(id, run_of([append(start, 40)].iter(), now).unwrap());
        }
        assert_eq!(recent.bytes, 270);
        // The 150 bytes being written cannot go, though they are the oldest: the
        // newer runs go instead, down to 175 at most.
        assert_eq!(recent.shed(200), 120);
        assert_eq!(recent.bytes, 150);
        let left: Vec<(u64, u64)> = recent
            .streams
            .iter()
            .flat_map(|(id, runs)| runs.iter().map(move |r| (*id, r.start.0)))
            .collect();
        assert_eq!(left, [(1, 0), (1, 60), (2, 0)]);
        // Once it settles, the L1 runs are gone and the L0 run may go.
        recent.settle(&plan.done);
        assert_eq!(recent.bytes, 30);
        assert!(recent.streams.values().flatten().all(|r| !r.writing));
        assert_eq!(recent.shed(20), 30);
        assert!(recent.streams.is_empty());
    }

    #[test]
    fn the_bound_counts_what_a_run_holds_besides_its_records() {
        let now = Instant::now();
        let mut recent = Recent {
            with_bookkeeping: true,
            ..Recent::default()
        };
        let per_append = 100 + bookkeeping(1);
        assert!(
            bookkeeping(1) >= 200,
            "an op, its copy, its list: {}",
            bookkeeping(1)
        );
        assert!(bookkeeping(10) > bookkeeping(1) + 9 * 80, "and each record");
        for start in [0, 100, 200] {
            recent.add(1, run_of([append(start, 100)].iter(), now).unwrap());
        }
        assert_eq!(recent.bytes, 3 * per_append);
        // 300 record bytes fit a bound of 320; what holds them does not, and
        // each run holds more than the 280 the shedding goes down to.
        assert_eq!(recent.shed(320), 3 * per_append);
        assert!(recent.streams.is_empty() && recent.bytes == 0);
        // The same runs counted as records only stay.
        let mut plain = recent_with(&[(1, 0, 100), (1, 100, 100), (1, 200, 100)], now);
        assert_eq!(plain.shed(320), 0);
    }

    #[test]
    fn what_is_let_go_is_counted_by_level() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        let mut recent = recent_with(&[(1, 0, 30)], then);
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        recent.settle(&plan.done);
        recent.add(2, run_of([append(0, 50)].iter(), now).unwrap());
        assert_eq!(recent.shed(10), 80);
        assert_eq!(recent.dropped, (50, 30), "(wal, l0)");
    }

    #[test]
    fn a_failed_pass_lets_its_runs_go_again() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        let mut recent = recent_with(&[(1, 0, 60), (1, 60, 60)], then);
        let _plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(recent.shed(50), 0, "being written");
        recent.unmark();
        assert_eq!(recent.shed(50), 120);
    }

    #[test]
    fn a_pass_is_asked_for_once_when_the_buffer_fills_past_half() {
        let now = Instant::now();
        let mut recent = recent_with(&[(1, 0, 40)], now);
        let before = recent.bytes;
        assert!(
            !recent.filled_past_half(before, 100),
            "40 of 100 is under half"
        );
        let run = run_of([append(40, 20)].iter(), now).unwrap();
        recent.add(1, run);
        assert!(recent.filled_past_half(before, 100), "60 of 100, from 40");
        let before = recent.bytes;
        let run = run_of([append(60, 20)].iter(), now).unwrap();
        recent.add(1, run);
        assert!(!recent.filled_past_half(before, 100), "already past half");
    }

    #[test]
    fn nothing_is_due_before_its_time() {
        let now = Instant::now();
        let mut recent = recent_with(&[(1, 0, 10), (1, 10, 10)], now);
        assert!(recent.plan(&config(), 1 << 20, now).is_none());
    }

    #[test]
    fn an_l0_pack_takes_what_is_only_in_the_wal_and_keeps_it_for_l1() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        let mut recent = recent_with(&[(1, 0, 10), (1, 10, 10), (2, 0, 5)], then);
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 20)]);
        assert_eq!(spans(&plan, 2), [(0, 5)]);
        assert_eq!((plan.l0_pieces, plan.l1_pieces), (2, 0));
        recent.settle(&plan.done);
        // One L0 run per piece, still in memory; nothing unpacked now.
        let runs = &recent.streams[&1];
        assert_eq!(runs.len(), 1);
        assert_eq!(
            (runs[0].start.0, runs[0].end.0, runs[0].level),
            (0, 20, Level::L0)
        );
        assert_eq!(recent.bytes, 25);
        assert!(recent.plan(&config(), 1 << 20, now).is_none());
    }

    #[test]
    fn an_l0_pack_takes_wal_runs_past_a_row_that_stays_in_the_wal() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        // 20..500 is a big row the packer was never fed: it stays in its WAL object.
        let mut recent = recent_with(&[(1, 0, 10), (1, 10, 10), (1, 500, 10)], then);
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 20), (500, 510)]);
        assert_eq!((plan.l0_pieces, plan.l1_pieces), (2, 0));
        recent.settle(&plan.done);
        let runs: Vec<(u64, u64, Level)> = recent.streams[&1]
            .iter()
            .map(|r| (r.start.0, r.end.0, r.level))
            .collect();
        assert_eq!(runs, [(0, 20, Level::L0), (500, 510, Level::L0)]);
        assert!(recent.plan(&config(), 1 << 20, now).is_none());
        // A stop writes both as final pieces, gap or not.
        recent.everything = true;
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 20), (500, 510)]);
        assert_eq!(plan.l1_pieces, 2);
        recent.settle(&plan.done);
        assert!(recent.streams.is_empty());
        assert_eq!(recent.bytes, 0);
    }

    #[test]
    fn a_stop_writes_everything_buffered_as_final_pieces() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        let mut recent = recent_with(&[(1, 0, 10), (1, 10, 10), (2, 0, 5)], then);
        // An L0 pass first: the runs stay buffered as L0, for L1 later.
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        recent.settle(&plan.done);
        assert_eq!(recent.bytes, 25);
        // Then a stop: the L0 runs, as L1 pieces that leave memory, long before
        // they would be due.
        recent.everything = true;
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 20)]);
        assert_eq!(spans(&plan, 2), [(0, 5)]);
        assert_eq!((plan.l0_pieces, plan.l1_pieces), (0, 2));
        recent.settle(&plan.done);
        assert_eq!(recent.bytes, 0);
        assert!(!recent.everything, "once");
        assert!(recent.plan(&config(), 1 << 20, now).is_none());
    }

    #[test]
    fn a_stream_of_piece_size_gets_one_piece_and_leaves_memory() {
        let now = Instant::now();
        let mut recent = recent_with(&[(1, 0, 60), (1, 60, 60), (2, 0, 5)], now);
        let plan = recent.plan(&config(), 1 << 20, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 120)]);
        assert!(spans(&plan, 2).is_empty(), "not due: small and young");
        assert_eq!(plan.l1_pieces, 1);
        recent.settle(&plan.done);
        assert!(!recent.streams.contains_key(&1));
        assert_eq!(recent.bytes, 5);
    }

    #[test]
    fn pieces_never_span_a_gap_and_are_cut_at_rows() {
        let now = Instant::now();
        // 0..60 and 60..120 follow each other; 200.. does not.
        let mut recent = recent_with(&[(1, 0, 60), (1, 60, 60), (1, 200, 60)], now);
        let plan = recent.plan(&config(), 100, now).unwrap();
        assert_eq!(spans(&plan, 1), [(0, 60), (60, 120)]);
        recent.settle(&plan.done);
        let left: Vec<u64> = recent.streams[&1].iter().map(|r| r.start.0).collect();
        assert_eq!(left, [200]);
    }

    #[test]
    fn a_piece_is_cached_if_any_of_its_runs_was_warmed_into_the_cache() {
        let now = Instant::now();
        // Each stream has a piece's worth (100 bytes), due at once.
        let mut recent = recent_with(&[(1, 0, 50), (1, 50, 50), (2, 0, 100)], now);
        recent.streams.get_mut(&1).unwrap()[1].cached = true;
        let plan = recent.plan(&config(), 100, now).unwrap();
        let cached: Vec<(u64, bool)> = plan
            .pieces
            .iter()
            .map(|p| (p.stream_id, p.cached))
            .collect();
        assert_eq!(cached, [(1, true), (2, false)]);
    }

    #[test]
    fn small_streams_are_written_whole_after_l1_delay() {
        let then = Instant::now();
        let c = config();
        let mut recent = recent_with(&[(1, 0, 5), (1, 5, 5)], then);
        let plan = recent
            .plan(&c, 1 << 20, then + Duration::from_secs(2))
            .unwrap();
        recent.settle(&plan.done);
        recent
            .streams
            .get_mut(&1)
            .unwrap()
            .push(run_of([append(10, 5)].iter(), then + Duration::from_secs(3)).unwrap());
        recent.bytes += 5;
        let later = then + c.l1_delay + Duration::from_secs(1);
        let plan = recent.plan(&c, 1 << 20, later).unwrap();
        // The L0 piece and the newer run, rewritten as one.
        assert_eq!(spans(&plan, 1), [(0, 15)]);
        assert_eq!(plan.l1_pieces, 1);
        recent.settle(&plan.done);
        assert!(recent.streams.is_empty() && recent.bytes == 0);
    }
}
