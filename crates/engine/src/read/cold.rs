//! Cold reads: records that left a stream's tail cache, found through the object
//! index and fetched with ranged GETs, through the block cache.
//!
//! - A read looks up to [`COLD_ROWS`] index rows at once; one GET covers a *window*
//!   of rows lying next to each other in one object (packs and segments are laid
//!   out that way), up to `readahead_bytes`, and up to [`WINDOWS_IN_FLIGHT`]
//!   windows go out in parallel. Everything fetched goes into the block cache.
//! - Fetches run as tasks of their own and are shared: a second reader of a window
//!   being fetched waits for the same GET, and a fetch a read stopped waiting for
//!   still lands in the cache for the next one.
//! - A read waits for the store at most until its deadline (`--read-budget`): past
//!   it, it answers with what it has (a partial response; the client reads on from
//!   its `Stream-Next-Offset`), even with nothing.
//! - After a read, the windows that follow are fetched ahead (sequential readahead),
//!   so a catch-up reader's next request finds them in the cache.
//!
//! - After a restart the warm-up (`Packer::warm`) announces the objects it is about
//!   to fetch ([`ColdReader::warming`]); a reader that misses the cache on one of
//!   them waits for the warm-up's GET instead of sending its own.
//!
//! Compaction may move a row and GC delete its old object between the index lookup
//! and the GET: then the index is read again, once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::time::Instant;

use super::block_cache::BlockCache;
use super::checked::RecentlyChecked;
use super::{ReadChunk, RecordMeta};
use crate::error::{EngineError, Result};
use crate::meta::{ChunkRow, Meta};
use crate::metrics::Counter;
use crate::offset::Offset;
use crate::wal::format::{self, Op, RECORD_BATCH_START};

/// Index rows one cold read looks up at once (readahead spans up to this many).
const COLD_ROWS: u32 = 64;
/// Windows one read fetches in parallel, at most.
const WINDOWS_IN_FLIGHT: usize = 8;

/// Counters of the store tier of reads.
pub struct ColdStats {
    /// Windows fetched by ranged GETs (one each), and their bytes.
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

/// The bytes of one window: `bytes` begin at byte `base` of its object.
#[derive(Clone)]
struct Window {
    base: u64,
    bytes: Bytes,
    /// Every chunk in it passed its checksum (so its readers need not check again).
    intact: bool,
}

/// A fetch of one window, shared by every reader that wants it.
type Fetch = Shared<BoxFuture<'static, std::result::Result<Window, Arc<object_store::Error>>>>;

struct Inner {
    store: Arc<dyn ObjectStore>,
    cache: Arc<BlockCache>,
    readahead_bytes: u64,
    stats: ColdStats,
    /// Windows being fetched, by (object, first byte).
    inflight: Mutex<HashMap<(String, u64), Fetch>>,
    /// Objects the warm-up is fetching or about to: done when it has (or gave up).
    warming: Mutex<HashMap<String, Warming>>,
    /// Chunks of mapped local files whose checksum passed a moment ago.
    checked: RecentlyChecked,
}

/// The end of the warm-up's fetch of one object, shared by the readers waiting for it.
type Warming = Shared<BoxFuture<'static, ()>>;

/// The warm-up's promises ([`ColdReader::warming`]): each object is released when
/// the warm-up is done with it, and every one left when this is dropped.
pub struct WarmTickets {
    inner: Arc<Inner>,
    senders: HashMap<String, futures::channel::oneshot::Sender<()>>,
}

impl WarmTickets {
    /// The warm-up is done with `key` (its chunks are in the cache, or it gave up):
    /// its readers look again.
    pub fn done(&mut self, key: &str) {
        if self.senders.remove(key).is_some() {
            self.inner.warming.lock().expect("warming lock").remove(key);
        }
    }
}

impl Drop for WarmTickets {
    fn drop(&mut self) {
        let mut warming = self.inner.warming.lock().expect("warming lock");
        for key in self.senders.keys() {
            warming.remove(key);
        }
    }
}

pub struct ColdReader {
    meta: Meta,
    inner: Arc<Inner>,
}

/// Why a chunk is not at hand.
enum Miss {
    /// The deadline passed first (the fetch goes on).
    Late,
    Store(Arc<object_store::Error>),
}

impl ColdReader {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        meta: Meta,
        cache_bytes: usize,
        readahead_bytes: usize,
    ) -> ColdReader {
        ColdReader {
            meta,
            inner: Arc::new(Inner {
                store,
                cache: Arc::new(BlockCache::new(cache_bytes)),
                readahead_bytes: readahead_bytes as u64,
                stats: ColdStats::default(),
                inflight: Mutex::default(),
                warming: Mutex::default(),
                checked: RecentlyChecked::default(),
            }),
        }
    }

    /// Announces that the warm-up is about to fetch `keys` (whole objects' worth of
    /// rows): until it says it is done with one, readers missing the cache on that
    /// object wait for it rather than fetching it themselves.
    pub fn warming(&self, keys: impl IntoIterator<Item = String>) -> WarmTickets {
        let mut senders = HashMap::new();
        let mut warming = self.inner.warming.lock().expect("warming lock");
        for key in keys {
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            warming.insert(key.clone(), rx.map(|_| ()).boxed().shared());
            senders.insert(key, tx);
        }
        WarmTickets {
            inner: self.inner.clone(),
            senders,
        }
    }

    fn warming_of(&self, key: &str) -> Option<Warming> {
        self.inner
            .warming
            .lock()
            .expect("warming lock")
            .get(key)
            .cloned()
    }

    pub fn cache(&self) -> &BlockCache {
        &self.inner.cache
    }

    /// The block cache, for writers that put what they write into it (the packer).
    pub fn shared_cache(&self) -> Arc<BlockCache> {
        self.inner.cache.clone()
    }

    pub fn stats(&self) -> &ColdStats {
        &self.inner.stats
    }

    /// Appends `[out.next, until)` of the stream's own records to `out`, about
    /// `budget` bytes (at least one piece), ending where an append ends; waits for the
    /// store no later than `deadline` (then `out` has what was ready).
    pub async fn read(
        &self,
        stream: &Cold<'_>,
        out: &mut ReadChunk,
        until: Offset,
        budget: &mut usize,
        deadline: Instant,
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
                    self.read_ahead(&rows[i..]);
                    return Ok(());
                }
                let chunk = match self.chunk_bytes(&rows, i, deadline).await {
                    Ok(chunk) => chunk,
                    Err(Miss::Late) => {
                        out.partial = true;
                        return Ok(());
                    }
                    // What was read before the failure is an answer of its own: the
                    // client reads on from there (and meets the failure, if it lasts).
                    Err(Miss::Store(_)) if !out.segments.is_empty() => {
                        out.partial = true;
                        return Ok(());
                    }
                    Err(Miss::Store(e)) => {
                        if matches!(*e, object_store::Error::NotFound { .. }) && !retried {
                            retried = true;
                            continue 'lookup;
                        }
                        // GC may delete a trimmed row's object under a reader.
                        trimmed_under(stream, out.next)?;
                        return Err(EngineError::Unavailable(format!(
                            "object store read of {}: {e}",
                            rows[i].object_key
                        )));
                    }
                };
                if !take_records(&rows[i], &chunk, out, until, budget)? {
                    self.read_ahead(&rows[i..]);
                    return Ok(());
                }
            }
            return Ok(());
        }
    }

    /// The bytes of `rows[i]`'s chunk: from the block cache, or by waiting (until
    /// `deadline`) for the window that holds it, after starting it and the windows
    /// after it.
    async fn chunk_bytes(
        &self,
        rows: &[ChunkRow],
        i: usize,
        deadline: Instant,
    ) -> std::result::Result<Chunk, Miss> {
        let row = &rows[i];
        let hit = |bytes| Chunk {
            bytes,
            checked: true,
        };
        if let Some(bytes) = self.inner.cache.get(&row.object_key, row.byte_range.start) {
            return Ok(hit(bytes));
        }
        if let Some(warming) = self.warming_of(&row.object_key) {
            if tokio::time::timeout_at(deadline, warming).await.is_err() {
                return Err(Miss::Late);
            }
            if let Some(bytes) = self.inner.cache.get(&row.object_key, row.byte_range.start) {
                return Ok(hit(bytes));
            }
        }
        // Without a cache, windows beyond the one asked for would be thrown away.
        let most = if self.inner.cache.enabled() {
            WINDOWS_IN_FLIGHT
        } else {
            1
        };
        // The row's own window always starts here, even if another reader cached
        // it meanwhile (then it is fetched again; rare).
        let fetch = self.start_windows(&rows[i..], most).unwrap_or_else(|| {
            self.fetch(&rows[i..window_end(rows, i, self.inner.readahead_bytes)])
        });
        match tokio::time::timeout_at(deadline, fetch).await {
            Err(_) => Err(Miss::Late),
            Ok(Err(e)) => Err(Miss::Store(e)),
            Ok(Ok(w)) => {
                let r = &row.byte_range;
                Ok(Chunk {
                    bytes: w
                        .bytes
                        .slice((r.start - w.base) as usize..(r.end - w.base) as usize),
                    checked: w.intact,
                })
            }
        }
    }

    /// Starts fetching up to `most` windows from `rows[0]` on that are neither cached
    /// nor being fetched; returns the fetch of the first row's window.
    fn start_windows(&self, rows: &[ChunkRow], most: usize) -> Option<Fetch> {
        let mut first = None;
        let mut started = 0;
        let mut j = 0;
        while j < rows.len() && started < most {
            let end = window_end(rows, j, self.inner.readahead_bytes);
            let cached = self
                .inner
                .cache
                .contains(&rows[j].object_key, rows[j].byte_range.start)
                || self.warming_of(&rows[j].object_key).is_some();
            if !cached {
                let fetch = self.fetch(&rows[j..end]);
                if j == 0 {
                    first = Some(fetch);
                }
                started += 1;
            }
            j = end;
        }
        first
    }

    /// After a read, the windows that follow it go into the cache for the reader's
    /// next request (they are fetched by tasks of their own).
    fn read_ahead(&self, rest: &[ChunkRow]) {
        if self.inner.cache.enabled() && !rest.is_empty() {
            let _ = self.start_windows(rest, WINDOWS_IN_FLIGHT / 2);
        }
    }

    /// The shared fetch of the window `rows` (adjacent chunks of one object): one
    /// ranged GET, each chunk into the cache.
    fn fetch(&self, rows: &[ChunkRow]) -> Fetch {
        let key = (rows[0].object_key.clone(), rows[0].byte_range.start);
        let mut inflight = self.inner.inflight.lock().expect("inflight lock");
        if let Some(fetch) = inflight.get(&key) {
            return fetch.clone();
        }
        let inner = self.inner.clone();
        let rows: Vec<ChunkRow> = rows.to_vec();
        let task_key = key.clone();
        let task = tokio::spawn(async move {
            let result = inner.fetch_window(&rows).await.map_err(Arc::new);
            inner
                .inflight
                .lock()
                .expect("inflight lock")
                .remove(&task_key);
            result
        });
        let fetch: Fetch = async move {
            match task.await {
                Ok(result) => result,
                Err(e) => Err(Arc::new(object_store::Error::Generic {
                    store: "cold read",
                    source: Box::new(e),
                })),
            }
        }
        .boxed()
        .shared();
        inflight.insert(key, fetch.clone());
        fetch
    }

    /// Where the append holding the byte at `pos` starts, from the index row holding
    /// it (rows always begin on an append boundary).
    pub async fn append_start(&self, stream: &Cold<'_>, pos: Offset) -> Result<Offset> {
        let rows = self.meta.chunks_from(stream.stream_id, pos, 1).await?;
        let Some(row) = rows.first().filter(|r| r.start <= pos) else {
            trimmed_under(stream, pos)?;
            return Ok(pos);
        };
        let no_deadline = Instant::now() + std::time::Duration::from_secs(3600);
        let chunk = match self.chunk_bytes(&rows, 0, no_deadline).await {
            Ok(chunk) => chunk,
            Err(Miss::Late) => return Ok(row.start),
            Err(Miss::Store(e)) => {
                trimmed_under(stream, pos)?;
                return Err(EngineError::Unavailable(format!(
                    "object store read of {}: {e}",
                    row.object_key
                )));
            }
        };
        let ops = chunk.decode(row)?;
        let mut begins = row.start;
        for op in ops {
            let Op::Append(a) = op else { continue };
            let mut at = a.start;
            for record in a.records.iter() {
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

impl Inner {
    async fn fetch_window(&self, rows: &[ChunkRow]) -> object_store::Result<Window> {
        let first = &rows[0];
        let range = first.byte_range.start..rows[rows.len() - 1].byte_range.end;
        let bytes = self
            .store
            .get_range(&Path::from(first.object_key.as_str()), range.clone())
            .await?;
        self.stats.reads.inc();
        self.stats.read_bytes.add(bytes.len() as u64);
        let mut intact = true;
        // A mapped local file's chunk that passed a moment ago is not checksummed
        // again (`checked`).
        let local = crate::store::mapped::is_mapped(&bytes);
        let now = std::time::Instant::now();
        for r in rows {
            let piece = bytes.slice(
                (r.byte_range.start - range.start) as usize
                    ..(r.byte_range.end - range.start) as usize,
            );
            let passed = if local && self.checked.recently(&r.object_key, &r.byte_range, now) {
                true
            } else {
                let passed = format::verify_chunk(&piece).is_ok();
                if local && passed {
                    self.checked.passed(&r.object_key, &r.byte_range, now);
                }
                passed
            };
            // The cache holds only checked chunks: a hit is not checksummed again. A
            // piece that fails stays out, and its reader meets the error on decoding.
            if passed {
                self.cache.insert(&r.object_key, r.byte_range.start, piece);
            } else {
                intact = false;
            }
        }
        Ok(Window {
            base: range.start,
            bytes,
            intact,
        })
    }
}

/// One chunk's bytes, and whether they were checked (a block cache hit: the cache
/// holds only chunks whose checksum was verified when they went in, or that this
/// node encoded itself; or a window whose chunks all passed when it was fetched) or
/// still need their checksum verified (a window where one failed: its reader gets
/// the error).
struct Chunk {
    bytes: Bytes,
    checked: bool,
}

impl Chunk {
    fn decode(&self, row: &ChunkRow) -> Result<Vec<Op>> {
        let decoded = if self.checked {
            format::decode_verified_chunk(&self.bytes)
        } else {
            format::decode_chunk(&self.bytes)
        };
        decoded
            .map(|(_, ops)| ops)
            .map_err(|e| EngineError::Internal(format!("{}: {e}", row.object_key)))
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
    chunk: &Chunk,
    out: &mut ReadChunk,
    until: Offset,
    budget: &mut usize,
) -> Result<bool> {
    let ops = chunk.decode(row)?;
    for op in ops {
        let Op::Append(a) = op else { continue };
        let mut pos = a.start;
        for (i, record) in std::sync::Arc::unwrap_or_clone(a.records)
            .into_iter()
            .enumerate()
        {
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
            out.meta.push(RecordMeta {
                seq: a.start_seq + i as u64,
                ts_ms: record.ts_ms,
                ext: record.ext,
            });
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use object_store::memory::InMemory;
    use object_store::PutPayload;

    use super::*;
    use crate::store::fault::FaultyStore;

    /// A reader over an in-memory object `obj` (bytes 0..100), with its store's
    /// request counter.
    async fn reader() -> (Arc<ColdReader>, Arc<crate::store::fault::FaultControl>) {
        let memory = Arc::new(InMemory::new());
        let bytes: Vec<u8> = (0..100).collect();
        memory
            .put(&Path::from("obj"), PutPayload::from(bytes))
            .await
            .unwrap();
        let (store, control) = FaultyStore::new(memory);
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        (
            Arc::new(ColdReader::new(store, meta, 1 << 20, 1 << 20)),
            control,
        )
    }

    fn row() -> ChunkRow {
        ChunkRow {
            start: Offset(0),
            end: Offset(10),
            object_key: "obj".into(),
            byte_range: 10..20,
            start_seq: 0,
            last_ts_ms: 0,
        }
    }

    fn read(cold: &Arc<ColdReader>) -> tokio::task::JoinHandle<Option<Bytes>> {
        let cold = cold.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            cold.chunk_bytes(&[row()], 0, deadline)
                .await
                .ok()
                .map(|c| c.bytes)
        })
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_warm_up_instead_of_fetching_the_object_again() {
        let (cold, control) = reader().await;
        let mut tickets = cold.warming(["obj".to_string()]);
        let waiting = read(&cold);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the reader waits for the warm-up");
        // The warm-up's GET lands in the cache.
        let got = cold.inner.store.get(&Path::from("obj")).await.unwrap();
        let bytes = got.bytes().await.unwrap();
        cold.cache().insert("obj", 10, bytes.slice(10..20));
        tickets.done("obj");
        let read = waiting.await.unwrap().expect("the chunk");
        assert_eq!(&read[..], &(10u8..20).collect::<Vec<_>>()[..]);
        assert_eq!(
            control.requests.load(Ordering::Relaxed),
            1,
            "only the warm-up's GET"
        );
    }

    #[tokio::test]
    async fn a_chunk_that_fails_its_checksum_stays_out_of_the_cache_and_fails_its_reader() {
        // Bytes 10..20 of `obj` are no chunk at all.
        let (cold, _) = reader().await;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let Ok(chunk) = cold.chunk_bytes(&[row()], 0, deadline).await else {
            panic!("the GET itself succeeds");
        };
        assert!(
            !chunk.checked,
            "a window with a bad chunk is not taken as checked"
        );
        assert!(
            !cold.cache().contains("obj", 10),
            "nothing unchecked in the cache"
        );
        assert!(chunk.decode(&row()).is_err());
    }

    /// One good chunk of 100 KiB (long enough to be mapped), then 100 KiB of bytes
    /// that are no chunk: the object and the two ranges.
    fn good_and_bad() -> (Bytes, std::ops::Range<usize>, std::ops::Range<usize>) {
        use crate::wal::format::Record;
        let op = Op::Append(format::AppendOp {
            start: Offset(0),
            start_seq: 0,
            records: Arc::new(vec![Record::plain(
                1,
                RECORD_BATCH_START,
                Bytes::from(vec![7u8; 100 * 1024]),
            )]),
            close: false,
            producer: None,
            stream_seq: None,
        });
        let mut object = bytes::BytesMut::new();
        let good = format::encode_chunk(&mut object, 1, std::iter::once(&op));
        let bad = object.len()..object.len() + 100 * 1024;
        object.extend_from_slice(&vec![3u8; 100 * 1024]);
        (object.freeze(), good, bad)
    }

    fn chunk_row(range: std::ops::Range<usize>) -> ChunkRow {
        ChunkRow {
            start: Offset(0),
            end: Offset(100 * 1024),
            object_key: "packs/p".into(),
            byte_range: range.start as u64..range.end as u64,
            start_seq: 0,
            last_ts_ms: 0,
        }
    }

    #[tokio::test]
    async fn a_mapped_local_chunk_is_checksummed_once_a_minute_and_a_bad_one_every_time() {
        let dir = std::env::temp_dir().join(format!("picomq-cold-checked-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let local = crate::store::open_dir(&dir).unwrap();
        let (object, good, bad) = good_and_bad();
        local
            .put(&Path::from("packs/p"), PutPayload::from(object))
            .await
            .unwrap();
        // A block cache too small for either: every read fetches again.
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let cold = ColdReader::new(local, meta, 1024, 1 << 20);
        let row = chunk_row;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        for pass in 0..3 {
            let Ok(chunk) = cold.chunk_bytes(&[row(good.clone())], 0, deadline).await else {
                panic!("pass {pass}: the good chunk reads");
            };
            assert!(crate::store::mapped::is_mapped(&chunk.bytes), "pass {pass}");
            assert!(chunk.checked, "pass {pass}");
            assert_eq!(chunk.decode(&row(good.clone())).unwrap().len(), 1);
            let Ok(chunk) = cold.chunk_bytes(&[row(bad.clone())], 0, deadline).await else {
                panic!("pass {pass}: the GET itself succeeds");
            };
            assert!(!chunk.checked, "pass {pass}: a bad chunk is never trusted");
            assert!(chunk.decode(&row(bad.clone())).is_err(), "pass {pass}");
        }
        assert_eq!(
            cold.inner.checked.len(),
            1,
            "only the good chunk is remembered"
        );
        assert_eq!(cold.stats().reads.get(), 6, "every read fetched its window");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn chunks_that_are_not_mapped_are_checksummed_on_every_fetch() {
        let memory = Arc::new(InMemory::new());
        let (object, good, _) = good_and_bad();
        memory
            .put(&Path::from("packs/p"), PutPayload::from(object))
            .await
            .unwrap();
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let cold = ColdReader::new(memory, meta, 1024, 1 << 20);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        for _ in 0..2 {
            let chunk = cold
                .chunk_bytes(&[chunk_row(good.clone())], 0, deadline)
                .await;
            assert!(chunk.is_ok_and(|c| c.checked && !crate::store::mapped::is_mapped(&c.bytes)));
        }
        assert!(cold.inner.checked.is_empty(), "nothing remembered");
        assert_eq!(cold.stats().reads.get(), 2);
    }

    #[tokio::test]
    async fn a_reader_fetches_for_itself_what_the_warm_up_gave_up_on() {
        let (cold, control) = reader().await;
        let tickets = cold.warming(["obj".to_string()]);
        let waiting = read(&cold);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(tickets);
        let read = waiting.await.unwrap().expect("the chunk");
        assert_eq!(&read[..], &(10u8..20).collect::<Vec<_>>()[..]);
        assert_eq!(control.requests.load(Ordering::Relaxed), 1, "its own GET");
    }
}
