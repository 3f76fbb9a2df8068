//! Cold reads: records that left a stream's tail cache, found through the object
//! index and fetched with ranged GETs, through the block cache.
//!
//! A read looks up to [`COLD_ROWS`] index rows at once; one GET covers a *window* of
//! rows lying next to each other in one object (compacted data is laid out that
//! way), up to `readahead_bytes`, and up to [`READAHEAD_WINDOWS`] windows go out in
//! parallel. Everything fetched goes into the block cache for the reads that follow.
//! Compaction may move a row and GC delete its old object between the index lookup
//! and the GET: then the index is read again, once.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::block_cache::BlockCache;
use super::ReadChunk;
use crate::error::{EngineError, Result};
use crate::meta::{ChunkRow, Meta};
use crate::metrics::Counter;
use crate::offset::Offset;
use crate::wal::format::{self, Op, RECORD_BATCH_START};

/// Index rows one cold read looks up at once (readahead spans up to this many).
const COLD_ROWS: u32 = 64;
/// Ranged GETs one cold read issues in parallel, at most.
const READAHEAD_WINDOWS: usize = 4;

/// Counters of the store tier of reads.
pub struct ColdStats {
    /// Index rows' chunks fetched by ranged GETs, and their bytes.
    pub reads: Counter,
    pub read_bytes: Counter,
}

impl Default for ColdStats {
    fn default() -> Self {
        ColdStats {
            reads: Counter::labelled(&super::READS, &[("tier", "store")]),
            read_bytes: Counter::labelled(&super::READ_BYTES, &[("tier", "store")]),
        }
    }
}

/// One stream's range as the cold path sees it.
pub struct Cold<'a> {
    pub stream_id: u64,
    pub name: &'a str,
    /// The stream's first retained offset now: a read that finds no row below it
    /// was overtaken by a trim (410), not a hole in the index.
    pub start: &'a (dyn Fn() -> Offset + Sync),
}

pub struct ColdReader {
    store: Arc<dyn ObjectStore>,
    meta: Meta,
    pub cache: BlockCache,
    readahead_bytes: u64,
    pub stats: ColdStats,
}

impl ColdReader {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        cache_bytes: usize,
        readahead_bytes: usize,
    ) -> ColdReader {
        ColdReader {
            store,
            meta,
            cache: BlockCache::new(cache_bytes),
            readahead_bytes: readahead_bytes as u64,
            stats: ColdStats::default(),
        }
    }

    /// Appends `[out.next, until)` of the stream's own records to `out`, about
    /// `budget` bytes (at least one piece), ending where an append ends.
    pub async fn read(
        &self,
        stream: &Cold<'_>,
        out: &mut ReadChunk,
        until: Offset,
        budget: &mut usize,
    ) -> Result<()> {
        let mut retried = false;
        'lookup: loop {
            let rows = self
                .meta
                .chunks_from(stream.stream_id, out.next, COLD_ROWS)
                .await?;
            if rows.is_empty() || rows[0].start > out.next {
                // A trim that overtook this read removed the rows.
                trimmed_under(stream, out.next)?;
                return Err(EngineError::Internal(format!(
                    "stream {} has no index entry for offset {}",
                    stream.name, out.next
                )));
            }
            for i in 0..rows.len() {
                if out.next >= until || (*budget == 0 && !out.segments.is_empty()) {
                    return Ok(());
                }
                let bytes = match self.chunk_bytes(&rows, i, *budget).await {
                    Ok(bytes) => bytes,
                    Err(object_store::Error::NotFound { .. }) if !retried => {
                        retried = true;
                        continue 'lookup;
                    }
                    Err(e) => {
                        // GC may delete a trimmed row's object under a reader.
                        trimmed_under(stream, out.next)?;
                        return Err(EngineError::Unavailable(format!(
                            "object store read of {}: {e}",
                            rows[i].object_key
                        )));
                    }
                };
                if !take_records(&rows[i], &bytes, out, until, budget)? {
                    return Ok(());
                }
            }
            return Ok(());
        }
    }

    /// The bytes of `rows[i]`'s chunk: from the block cache, or fetched with the
    /// chunks after it, in up to `READAHEAD_WINDOWS` windows as long as they are
    /// needed for `budget` or are full windows of compacted data (a catch-up reader
    /// wants them next).
    async fn chunk_bytes(
        &self,
        rows: &[ChunkRow],
        i: usize,
        budget: usize,
    ) -> object_store::Result<Bytes> {
        let row = &rows[i];
        if let Some(bytes) = self.cache.get(&row.object_key, row.byte_range.start) {
            return Ok(bytes);
        }
        // Without a cache, chunks beyond the one asked for would be thrown away.
        let most = if self.cache.enabled() {
            READAHEAD_WINDOWS
        } else {
            1
        };
        let mut windows: Vec<std::ops::Range<usize>> = Vec::new();
        let mut planned = 0u64;
        let mut j = i;
        while j < rows.len() && windows.len() < most {
            if j > i
                && self
                    .cache
                    .contains(&rows[j].object_key, rows[j].byte_range.start)
            {
                j += 1;
                continue;
            }
            let end = window_end(rows, j, self.readahead_bytes);
            let bytes = rows[end - 1].byte_range.end - rows[j].byte_range.start;
            let coalesced = end - j > 1;
            if !windows.is_empty() && planned >= budget as u64 && !coalesced {
                break;
            }
            windows.push(j..end);
            planned += bytes;
            j = end;
        }
        let fetched =
            futures::future::try_join_all(windows.into_iter().map(|w| self.fetch_window(&rows[w])))
                .await?;
        Ok(fetched.into_iter().next().expect("one window"))
    }

    /// One ranged GET for adjacent chunks of one object; caches each chunk and
    /// returns the first.
    async fn fetch_window(&self, rows: &[ChunkRow]) -> object_store::Result<Bytes> {
        let first = &rows[0];
        let range = first.byte_range.start..rows[rows.len() - 1].byte_range.end;
        let bytes = self
            .store
            .get_range(&Path::from(first.object_key.as_str()), range.clone())
            .await?;
        self.stats.reads.inc();
        self.stats.read_bytes.add(bytes.len() as u64);
        let slice = |r: &ChunkRow| {
            bytes.slice(
                (r.byte_range.start - range.start) as usize
                    ..(r.byte_range.end - range.start) as usize,
            )
        };
        for r in rows {
            self.cache
                .insert(&r.object_key, r.byte_range.start, slice(r));
        }
        Ok(slice(first))
    }
}

impl ColdReader {
    /// Where the append holding the byte at `pos` starts, from the index row holding
    /// it (rows always begin on an append boundary).
    pub async fn append_start(&self, stream: &Cold<'_>, pos: Offset) -> Result<Offset> {
        let rows = self.meta.chunks_from(stream.stream_id, pos, 1).await?;
        let Some(row) = rows.first().filter(|r| r.start <= pos) else {
            trimmed_under(stream, pos)?;
            return Ok(pos);
        };
        let bytes = match self.chunk_bytes(&rows, 0, 0).await {
            Ok(bytes) => bytes,
            Err(e) => {
                trimmed_under(stream, pos)?;
                return Err(EngineError::Unavailable(format!(
                    "object store read of {}: {e}",
                    row.object_key
                )));
            }
        };
        let (_, ops) = format::decode_chunk(&bytes)
            .map_err(|e| EngineError::Internal(format!("{}: {e}", row.object_key)))?;
        let mut begins = row.start;
        for op in ops {
            let Op::Append(a) = op else { continue };
            let mut at = a.start;
            for record in &a.records {
                if at > pos {
                    return Ok(begins);
                }
                if record.flags & RECORD_BATCH_START != 0 {
                    begins = at;
                }
                at = at.advance(record.data.len() as u64);
            }
        }
        Ok(begins)
    }
}

/// The end (exclusive) of the window starting at `rows[j]`: the rows after it that
/// lie right behind it in the same object, up to `limit` bytes in all.
fn window_end(rows: &[ChunkRow], j: usize, limit: u64) -> usize {
    let first = &rows[j];
    let mut end = j + 1;
    while end < rows.len()
        && rows[end].object_key == first.object_key
        && rows[end].byte_range.start == rows[end - 1].byte_range.end
        && rows[end].byte_range.end - first.byte_range.start <= limit
    {
        end += 1;
    }
    end
}

/// Appends the records of one chunk that fall in `[out.next, until)`; `false` once
/// the budget is spent (at the start of an append: a read never ends inside one).
fn take_records(
    row: &ChunkRow,
    bytes: &Bytes,
    out: &mut ReadChunk,
    until: Offset,
    budget: &mut usize,
) -> Result<bool> {
    let (_, ops) = format::decode_chunk(bytes)
        .map_err(|e| EngineError::Internal(format!("{}: {e}", row.object_key)))?;
    for op in ops {
        let Op::Append(a) = op else { continue };
        let mut pos = a.start;
        for record in a.records {
            let len = record.data.len() as u64;
            let (start, end) = (pos, pos.advance(len));
            pos = end;
            if end <= out.next || start >= until {
                continue;
            }
            let starts_append = record.flags & RECORD_BATCH_START != 0;
            if *budget == 0 && !out.segments.is_empty() && starts_append && start >= out.next {
                return Ok(false);
            }
            let lo = out.next.0.max(start.0) - start.0;
            let hi = until.0.min(end.0) - start.0;
            let piece = record.data.slice(lo as usize..hi as usize);
            *budget = budget.saturating_sub(piece.len());
            out.flags.push(if lo == 0 {
                record.flags
            } else {
                record.flags & !RECORD_BATCH_START
            });
            out.segments.push(piece);
            out.next = Offset(start.0 + hi);
        }
    }
    Ok(true)
}

/// `Err(Trimmed)` if `pos` is now below the stream's start.
fn trimmed_under(stream: &Cold<'_>, pos: Offset) -> Result<()> {
    let start = (stream.start)();
    if pos < start {
        return Err(EngineError::Trimmed { start });
    }
    Ok(())
}
