//! The rows a batch of WAL objects writes, whatever the database: a create's
//! `streams` row, one `chunks` row per stream per object, and one stream's appends
//! folded into the single update (and producer upserts) that leaves what applying
//! them one by one would. Each backend's `apply` writes these in its own SQL; the
//! text form of a producer stamp (`closed_by`) is here too, so both read and write
//! the same column.

use std::collections::BTreeMap;

use crate::offset::Offset;
use crate::wal::format::{AppendOp, CreateOp, Op, ProducerStamp, RelocateOp};
use crate::wal::FlushedChunk;

/// A stream created by the batch: its `streams` row.
pub(super) struct CreateRow<'a> {
    pub id: i64,
    pub name: &'a str,
    pub content_type: &'a str,
    pub created_ms: i64,
    pub ttl_secs: Option<i64>,
    pub expires_at: Option<&'a str>,
    pub fork_source: Option<i64>,
    pub fork_point: Option<i64>,
    pub fork_requested: Option<i64>,
    pub fork_sub_offset: i64,
    pub fork_point_seq: i64,
    /// A fork starts at its divergence point; a new stream at 0.
    pub tail: i64,
    /// A fork's first own sequence number is its source's at the fork point.
    pub next_seq: i64,
}

impl<'a> CreateRow<'a> {
    pub fn of(stream_id: u64, c: &'a CreateOp) -> CreateRow<'a> {
        let fork = c.fork.as_ref();
        CreateRow {
            id: stream_id as i64,
            name: &c.name,
            content_type: &c.content_type,
            created_ms: c.created_ms as i64,
            ttl_secs: c.ttl_secs.map(|t| t as i64),
            expires_at: c.expires_at.as_deref(),
            fork_source: fork.map(|f| f.source_id as i64),
            fork_point: fork.map(|f| f.point.0 as i64),
            fork_requested: fork.and_then(|f| f.requested_offset).map(|o| o.0 as i64),
            fork_sub_offset: fork.map_or(0, |f| f.sub_offset as i64),
            fork_point_seq: fork.map_or(0, |f| f.point_seq as i64),
            tail: fork.map_or(0, |f| f.point.0 as i64),
            next_seq: fork.map_or(0, |f| f.point_seq as i64),
        }
    }
}

/// A `chunks` row of the batch.
pub(super) struct NewChunk<'a> {
    pub stream_id: i64,
    pub start: i64,
    pub end: i64,
    pub key: &'a str,
    pub byte_start: i64,
    pub byte_end: i64,
    /// Timestamp of the row's last record.
    pub last_ts_ms: i64,
    /// Sequence number of the row's first record.
    pub start_seq: i64,
}

impl<'a> NewChunk<'a> {
    /// The index row of one stream's chunk of the object at `key`: the span of its
    /// appends (none if it holds no records).
    pub fn of(key: &'a str, chunk: &FlushedChunk) -> Option<NewChunk<'a>> {
        let data = chunk.ops.iter().filter_map(|(_, op)| match op {
            Op::Append(a) => a
                .records
                .last()
                .map(|r| (a.start, a.start_seq, a.end(), r.ts_ms)),
            _ => None,
        });
        type Span = (Offset, u64, Offset, u64);
        let span = data.fold(None, |acc: Option<Span>, (s, q, e, ts)| {
            Some(acc.map_or((s, q, e, ts), |(s0, q0, _, _)| (s0, q0, e, ts)))
        });
        let (start, start_seq, end, last_ts_ms) = span?;
        Some(NewChunk {
            stream_id: chunk.stream_id as i64,
            start: start.0 as i64,
            end: end.0 as i64,
            key,
            byte_start: chunk.range.start as i64,
            byte_end: chunk.range.end as i64,
            last_ts_ms: last_ts_ms as i64,
            start_seq: start_seq as i64,
        })
    }
}

/// One stream's appends in a batch, written as one row of one stream update and
/// one upsert per producer instead of a statement of each per append. It leaves the
/// rows exactly as applying the appends one by one would: tail and last access only
/// grow, a close sticks, the last closing producer and the last `Stream-Seq` win,
/// each producer's last stamp wins.
#[derive(Default)]
pub(super) struct AppendRun<'a> {
    pub end: u64,
    /// The sequence number after the run's last record.
    pub end_seq: u64,
    pub close: bool,
    pub closed_by: Option<&'a ProducerStamp>,
    pub stream_seq: Option<&'a str>,
    pub written_ms: u64,
    pub producers: Vec<&'a ProducerStamp>,
}

impl<'a> AppendRun<'a> {
    pub fn add(&mut self, a: &'a AppendOp) {
        self.end = self.end.max(a.end().0);
        self.end_seq = self.end_seq.max(a.end_seq());
        if a.close {
            self.close = true;
            self.closed_by = a.producer.as_ref().or(self.closed_by);
        }
        if let Some(seq) = &a.stream_seq {
            self.stream_seq = Some(seq);
        }
        // A write is an access: after a rebuild from the bucket a sliding TTL counts
        // from the last write at the latest.
        self.written_ms = self.written_ms.max(a.records.last().map_or(0, |r| r.ts_ms));
        if let Some(p) = &a.producer {
            match self.producers.iter_mut().find(|q| q.id == p.id) {
                Some(q) => *q = p,
                None => self.producers.push(p),
            }
        }
    }
}

/// A producer stamp as the `closed_by` column holds it: `epoch:seq:id`.
pub(super) fn encode_stamp(p: &ProducerStamp) -> String {
    format!("{}:{}:{}", p.epoch, p.seq, p.id)
}

pub(super) fn decode_stamp(s: &str) -> Option<ProducerStamp> {
    let mut parts = s.splitn(3, ':');
    let epoch = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    Some(ProducerStamp {
        id: parts.next()?.to_string(),
        epoch,
        seq,
    })
}

/// Whether a row of `rows` (a stream's, start to end) reaches across an edge of
/// `r`'s span: then the move is stale, and replacing the rows that start inside
/// the span would drop what that row holds past the span's end (or leave two rows
/// over one offset). Offsets never change, so any move whose span holds whole rows
/// only is safe to apply, in any order: a narrower move that lost the race to a
/// wider one (the packer on the stream's owner against compaction on the member
/// holding the maintenance job, each committing through its own log) changes
/// nothing, and its object is left to garbage collection.
/// `rows` maps each row's start to its end and whatever the caller keeps with it.
pub(super) fn straddled<T>(rows: &BTreeMap<u64, (u64, T)>, r: &RelocateOp) -> bool {
    let (s, e) = (r.start.0, r.end.0);
    let before = rows
        .range(..s)
        .next_back()
        .is_some_and(|(_, (end, _))| *end > s);
    before || rows.range(s..e).any(|(_, (end, _))| *end > e)
}
