//! Finding records by sequence number and by time (the native record API, and
//! Durable Streams reads that start at a time).
//!
//! Sequence numbers and server timestamps never decrease along a stream, and offsets
//! grow with both, so a record is found in two steps: an append boundary at or
//! before it, then a forward scan of the records from there. The boundary comes from
//! the tail cache when the cache holds the record, else from a binary search over the
//! stream's index rows in offset space (each probe one `chunks_from` lookup by the
//! primary key: about 40 probes for a terabyte, and no index of its own that every
//! append would pay for). A fork's inherited records are scanned from its first
//! readable offset.
//!
//! A reader paging by number asks for exactly the record its last page ended
//! before. A stream's handle remembers the last few such ends (`bookmark`), so the
//! next page starts there without a seek; a trim since then shows as an offset
//! below the stream's start, and the seek runs (and answers "trimmed").

use std::sync::Arc;

use super::handle::StreamHandle;
use super::StreamRef;
use crate::error::Result;
use crate::offset::Offset;
use crate::read::RecordMeta;
use crate::stream::Service;

/// What to find: the first record at or after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seek {
    /// A sequence number.
    Seq(u64),
    /// A server timestamp (ms since the Unix epoch).
    Time(u64),
}

impl Seek {
    /// Is `record` at or after the target?
    pub fn reached(self, record: &RecordMeta) -> bool {
        match self {
            Seek::Seq(n) => record.seq >= n,
            Seek::Time(t) => record.ts_ms >= t,
        }
    }
}

/// A record found by [`Service::seek`], or the tail when no record is at or after
/// the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    /// Where the record starts (a record boundary: a Durable Streams read from
    /// here returns it first, unless it is inside a JSON batch).
    pub offset: Offset,
    /// Its sequence number (the tail's next one for the tail).
    pub seq: u64,
    /// Its server timestamp (`None` at the tail).
    pub ts_ms: Option<u64>,
}

/// Bytes one scan step reads: each step decodes the chunks it touches whole, so a
/// step covers a packed row (about 1 MiB) at once rather than decoding it again
/// for every quarter of it.
const SCAN_BYTES: usize = 4 << 20;

impl Service {
    /// The first durable record of `stream` at or after `target`, from its first
    /// readable offset; the tail if there is none.
    pub async fn seek(&self, stream: &StreamRef, target: Seek) -> Result<Located> {
        let handle = &stream.handle;
        let view = handle.view();
        let floor = self.start_of(handle).await?;
        let own_floor = handle
            .config
            .fork
            .as_ref()
            .map_or(floor, |f| f.point.max(floor));
        let mut from = match handle.cached_before(target) {
            Some(o) => o.max(own_floor),
            None => {
                self.indexed_before(handle, own_floor, view.tail, target)
                    .await?
            }
        };
        // The target may lie in what a fork inherits: scan from its first offset.
        if from <= own_floor {
            from = floor;
        }
        let tail = Located {
            offset: view.tail,
            seq: view.tail_seq,
            ts_ms: None,
        };
        while from < view.tail {
            let chunk = self
                .read_view(handle, from, view.tail, SCAN_BYTES, None)
                .await?;
            let mut pos = from;
            for (segment, meta) in chunk.segments.iter().zip(&chunk.meta) {
                if target.reached(meta) {
                    return Ok(Located {
                        offset: pos,
                        seq: meta.seq,
                        ts_ms: Some(meta.ts_ms),
                    });
                }
                pos = pos.advance(segment.len() as u64);
            }
            if chunk.next <= from {
                break;
            }
            from = chunk.next;
        }
        Ok(tail)
    }

    /// Where record `seq` starts, without a seek, when a recent read of `stream`
    /// ended there (see [`Service::bookmark`]) and it is still retained.
    pub async fn bookmarked(&self, stream: &StreamRef, seq: u64) -> Result<Option<Offset>> {
        let handle = &stream.handle;
        let Some(offset) = handle.bookmarked(seq) else {
            return Ok(None);
        };
        // Only offsets below the tail are kept, and the tail never moves back.
        Ok((offset >= self.start_of(handle).await?).then_some(offset))
    }

    /// Remembers where a read of `stream` ended: record `seq` starts at `offset`, a
    /// record boundary (ignored at or past the durable tail, which a seek finds at
    /// once). A reader paging by number then starts its next page there.
    pub fn bookmark(&self, stream: &StreamRef, seq: u64, offset: Offset) {
        if offset < stream.handle.view().tail {
            stream.handle.bookmark(seq, offset);
        }
    }

    /// The sequence number of the record starting at `pos` (a record boundary of
    /// `handle`'s view; at or past the durable tail: the tail's).
    pub(crate) async fn seq_at(&self, handle: &Arc<StreamHandle>, pos: Offset) -> Result<u64> {
        let view = handle.view();
        if pos >= view.tail {
            return Ok(view.tail_seq);
        }
        let chunk = self.read_view(handle, pos, view.tail, 1, None).await?;
        Ok(chunk.meta.first().map_or(view.tail_seq, |m| m.seq))
    }

    /// The sequence number of the record starting at `pos` of `stream` (a record
    /// boundary, such as a read's start; at or past the tail: the tail's).
    pub async fn seq_of(&self, stream: &StreamRef, pos: Offset) -> Result<u64> {
        self.seq_at(&stream.handle, pos).await
    }

    /// The first record `stream` holds: its offset, sequence number and timestamp
    /// (the tail for an empty stream).
    pub async fn first_record(&self, stream: &StreamRef) -> Result<Located> {
        let handle = &stream.handle;
        let view = handle.view();
        let from = self.start_of(handle).await?;
        if from >= view.tail {
            return Ok(Located {
                offset: view.tail,
                seq: view.tail_seq,
                ts_ms: None,
            });
        }
        let chunk = self.read_view(handle, from, view.tail, 1, None).await?;
        Ok(match chunk.meta.first() {
            Some(m) => Located {
                offset: from,
                seq: m.seq,
                ts_ms: Some(m.ts_ms),
            },
            None => Located {
                offset: view.tail,
                seq: view.tail_seq,
                ts_ms: None,
            },
        })
    }

    /// An append boundary in `[lo, hi]` with every record before it short of
    /// `target`, as late as the index rows of `handle` show: binary search in offset
    /// space, each probe the row holding (or following) the middle offset.
    async fn indexed_before(
        &self,
        handle: &Arc<StreamHandle>,
        lo: Offset,
        hi: Offset,
        target: Seek,
    ) -> Result<Offset> {
        let id = handle.config.id;
        let (mut lo, mut hi, mut best) = (lo, hi, lo);
        while lo < hi {
            let mid = Offset(lo.0 + (hi.0 - lo.0) / 2);
            let rows = self.inner.meta.chunks_from(id, mid, 1).await?;
            let Some(row) = rows.first().filter(|r| r.start < hi) else {
                hi = mid;
                continue;
            };
            match target {
                Seek::Seq(n) if row.start_seq <= n => {
                    best = best.max(row.start);
                    lo = row.end;
                }
                Seek::Time(t) if row.last_ts_ms < t => {
                    best = best.max(row.end);
                    lo = row.end;
                }
                _ => hi = row.start.min(mid),
            }
        }
        Ok(best)
    }
}

/// Bytes one [`Service::read_seq`] returns at most.
pub const READ_SEQ_BYTES_MAX: usize = 8 << 20;

/// Records of a stream from a sequence number on ([`Service::read_seq`]); also
/// the wire form a member answers another with (bodies in base64).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeqBatch {
    /// The stream's id (a stream deleted and made again under its name has a new
    /// one).
    pub stream_id: u64,
    /// The next sequence number the stream will give.
    pub tail_seq: u64,
    /// The first record at or after the one asked for: above it when those were
    /// trimmed (the tail's number when there is none).
    pub first_seq: u64,
    pub records: Vec<SeqRecord>,
}

/// One record of a [`SeqBatch`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeqRecord {
    pub seq: u64,
    pub ts_ms: u64,
    /// Where it starts, as a Durable Streams offset.
    pub offset: String,
    /// Its encoded `RecordExt`, if any.
    #[serde(default, with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub ext: Option<bytes::Bytes>,
    #[serde(with = "b64")]
    pub data: bytes::Bytes,
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &bytes::Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bytes::Bytes, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map(bytes::Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

mod b64_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Option<bytes::Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match b {
            Some(b) => super::b64::serialize(b, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bytes::Bytes>, D::Error> {
        #[derive(Deserialize)]
        struct W(#[serde(with = "super::b64")] bytes::Bytes);
        Ok(Option::<W>::deserialize(d)?.map(|w| w.0))
    }
}

impl Service {
    /// The durable records of `stream` from number `seq` on, about `max_bytes` of
    /// them (at least one when there is one), stopping at the tail as it was when
    /// called. A reader that goes on from the last record's successor starts
    /// without a seek ([`Service::bookmark`]).
    pub async fn read_seq(
        &self,
        stream: &StreamRef,
        seq: u64,
        max_bytes: usize,
    ) -> Result<SeqBatch> {
        let end = stream.handle.view().tail_seq;
        let mut batch = SeqBatch {
            stream_id: stream.handle.config.id,
            tail_seq: end,
            first_seq: seq.min(end),
            records: Vec::new(),
        };
        if seq >= end {
            return Ok(batch);
        }
        let from = match self.bookmarked(stream, seq).await? {
            Some(o) => o,
            None => {
                let at = self.seek(stream, Seek::Seq(seq)).await?;
                batch.first_seq = at.seq;
                if at.seq >= end {
                    return Ok(batch);
                }
                at.offset
            }
        };
        let chunk = self
            .read(stream, from, max_bytes.clamp(1, READ_SEQ_BYTES_MAX))
            .await?;
        let mut pos = from;
        let mut next = None;
        for (data, meta) in chunk.segments.iter().zip(&chunk.meta) {
            let start = pos;
            pos = pos.advance(data.len() as u64);
            if meta.seq >= end {
                next = Some((meta.seq, start));
                break;
            }
            // A read from inside a JSON batch starts at the batch.
            if meta.seq < seq {
                continue;
            }
            batch.records.push(SeqRecord {
                seq: meta.seq,
                ts_ms: meta.ts_ms,
                offset: start.to_string(),
                ext: meta.ext.clone(),
                data: data.clone(),
            });
        }
        if let Some(last) = batch.records.last() {
            let (seq, at) = next.unwrap_or((last.seq + 1, chunk.next));
            self.bookmark(stream, seq, at);
        }
        Ok(batch)
    }
}
