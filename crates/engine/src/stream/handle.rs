//! One active stream in memory: its immutable configuration, the sequencer state
//! (assigned offsets, producers, close), the durable view readers and waiters see,
//! and the tail cache of recent durable records.
//!
//! Lock discipline: `state` is a short, synchronous lock, never held across an
//! await. The WAL calls back (`on_durable`, `on_indexed`) in log order.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::sync::watch;

use super::producer::ProducerState;
use crate::offset::Offset;
use crate::read::RecordMeta;
use crate::wal::format::{ForkOrigin, Op, ProducerStamp, Record, RECORD_BATCH_START};
use crate::wal::DurableListener;

#[derive(Clone, Debug)]
pub struct StreamConfig {
    pub id: u64,
    pub name: String,
    pub content_type: String,
    /// `application/json`: records are messages, reads return JSON arrays.
    pub json: bool,
    pub created_ms: u64,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub expires_at_ms: Option<u64>,
    pub fork: Option<ForkOrigin>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Live,
    /// Deleted by its owner but kept for its forks: 410 to clients.
    SoftDeleted,
    Deleted,
}

/// What is durable, as readers and waiters see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurableView {
    /// Last durable sequencer op.
    pub op: u64,
    /// First retained offset: reads below it answer 410 (trimmed).
    pub start: Offset,
    pub tail: Offset,
    /// The sequence number the next durable record gets.
    pub tail_seq: u64,
    pub closed: bool,
    /// Age retention in seconds (`None`: keep everything).
    pub retention_secs: Option<u64>,
    pub lifecycle: Lifecycle,
    /// This handle left memory; re-resolve the stream by name.
    pub evicted: bool,
}

pub struct State {
    /// Next sequencer op number; ops `1..next_op` were submitted.
    pub next_op: u64,
    /// Tail including ops not yet durable.
    pub tail: Offset,
    /// The next record's sequence number, including ops not yet durable.
    pub next_seq: u64,
    /// Start including trims not yet durable.
    pub start: Offset,
    pub retention_secs: Option<u64>,
    pub closed: bool,
    pub closed_by: Option<ProducerStamp>,
    pub close_op: u64,
    pub stream_seq: Option<String>,
    pub producers: HashMap<String, ProducerState>,
    pub lifecycle: Lifecycle,
    pub evicted: bool,
    pub last_ts_ms: u64,
    cache: VecDeque<Cached>,
    cache_bytes: usize,
    /// The cache holds every durable record from here to the durable tail.
    cache_floor: Offset,
    indexed_op: u64,
    /// Writers waiting for an op of this stream to become durable ([`DurableOp`]).
    /// An entry is here exactly while its op is above the durable op: `on_durable`
    /// takes out the ones it made durable under this lock, with the same update.
    op_waiters: Vec<OpWaiter>,
    next_waiter_key: u64,
    /// Where recent reads of records ended: `(seq, offset)` of the record each would
    /// read next, newest last, at most [`BOOKMARKS`]. A reader paging by sequence
    /// number asks next for exactly one of these, and finds it without a seek.
    bookmarks: Vec<(u64, Offset)>,
}

/// Read ends a stream remembers (one per reader paging through it at once, roughly).
const BOOKMARKS: usize = 4;

struct OpWaiter {
    op_no: u64,
    key: u64,
    waker: Waker,
}

/// One durable append in the tail cache: its records are the op's own list, shared
/// (one reference count per append, not one per record).
struct Cached {
    start: Offset,
    /// Where its last record ends.
    end: Offset,
    /// The first record's sequence number (they are dense).
    seq: u64,
    op_no: u64,
    records: Arc<Vec<Record>>,
    /// What its records hold (`Record::held_bytes`): what the cache's bound counts.
    held: usize,
}

impl Cached {
    /// Each record with its start offset and sequence number, in order.
    fn records(&self) -> impl Iterator<Item = (Offset, u64, &Record)> + '_ {
        let mut at = self.start.0;
        self.records.iter().enumerate().map(move |(i, r)| {
            let start = Offset(at);
            at += r.data.len() as u64;
            (start, self.seq + i as u64, r)
        })
    }
}

pub struct StreamHandle {
    pub config: StreamConfig,
    state: Mutex<State>,
    durable: watch::Sender<DurableView>,
    last_access_ms: AtomicU64,
    cache_bytes_max: usize,
    /// The ownership term of the stream's slot this handle was loaded or created
    /// under (`Cluster::term`; 0 outside a cluster). A handle of another term than
    /// the slot's current one predates a change of owner: another node may have
    /// written the stream since, so it is never served (see `Service::registered`).
    term: u64,
}

/// Durable records copied out of the cache for one read.
pub struct CachedRead {
    pub segments: Vec<Bytes>,
    /// Flags of each segment's record (a sliced record keeps its flags).
    pub flags: Vec<u8>,
    pub meta: Vec<RecordMeta>,
    pub end: Offset,
}

impl StreamHandle {
    /// A handle for a stream whose durable state is `start`/`tail`/`closed` (loaded or new).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: StreamConfig,
        start: Offset,
        retention_secs: Option<u64>,
        tail: Offset,
        tail_seq: u64,
        closed: bool,
        closed_by: Option<ProducerStamp>,
        stream_seq: Option<String>,
        producers: HashMap<String, ProducerState>,
        lifecycle: Lifecycle,
        last_access_ms: u64,
        cache_bytes_max: usize,
    ) -> StreamHandle {
        let (durable, _) = watch::channel(DurableView {
            op: 0,
            start,
            tail,
            tail_seq,
            closed,
            retention_secs,
            lifecycle,
            evicted: false,
        });
        StreamHandle {
            config,
            state: Mutex::new(State {
                next_op: 1,
                tail,
                next_seq: tail_seq,
                start,
                retention_secs,
                closed,
                closed_by,
                close_op: 0,
                stream_seq,
                producers,
                lifecycle,
                evicted: false,
                last_ts_ms: 0,
                cache: VecDeque::new(),
                cache_bytes: 0,
                cache_floor: tail,
                indexed_op: 0,
                op_waiters: Vec::new(),
                next_waiter_key: 0,
                bookmarks: Vec::new(),
            }),
            durable,
            last_access_ms: AtomicU64::new(last_access_ms),
            cache_bytes_max,
            term: 0,
        }
    }

    /// The handle, loaded or created under ownership term `term`.
    pub fn with_term(mut self, term: u64) -> StreamHandle {
        self.term = term;
        self
    }

    /// The ownership term this handle was loaded or created under.
    pub fn term(&self) -> u64 {
        self.term
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("stream state lock")
    }

    pub fn view(&self) -> DurableView {
        *self.durable.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<DurableView> {
        self.durable.subscribe()
    }

    /// Resolves with the durable view once op `op_no` of this stream is durable. It
    /// wakes only for that: a commit wakes the writers whose ops it carried, not
    /// every writer of the stream as the durable watch does (at the maximum ~0.77
    /// wake-ups per append found their op still in the buffer).
    pub fn durable_op(&self, op_no: u64) -> DurableOp<'_> {
        DurableOp {
            handle: self,
            op_no,
            key: None,
        }
    }

    pub fn touch(&self, now_ms: u64) {
        self.last_access_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn last_access_ms(&self) -> u64 {
        self.last_access_ms.load(Ordering::Relaxed)
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        if self.config.expires_at_ms.is_some_and(|at| now_ms >= at) {
            return true;
        }
        self.config
            .ttl_secs
            .is_some_and(|ttl| now_ms >= self.last_access_ms().saturating_add(ttl * 1000))
    }

    /// Drops the handle from memory if nothing is pending, indexed or waiting.
    /// Called by the registry sweeper with the registry lock held.
    pub fn try_evict(&self, idle_since_ms: u64) -> bool {
        let mut st = self.lock();
        let settled = st.next_op - 1 == self.durable.borrow().op && st.indexed_op + 1 >= st.next_op;
        let idle = self.last_access_ms() <= idle_since_ms && self.durable.receiver_count() == 0;
        if settled && idle && !st.evicted {
            st.evicted = true;
            self.durable.send_modify(|v| v.evicted = true);
            true
        } else {
            false
        }
    }

    /// Takes the handle out of service whatever it is doing (its slot is moving to
    /// another node): the sequencer refuses new ops, readers and waiters see
    /// `evicted` and re-resolve. Returns the last op submitted, which the caller
    /// waits to see durable and indexed before the stream is served elsewhere.
    pub fn retire(&self) -> u64 {
        let mut st = self.lock();
        if !st.evicted {
            st.evicted = true;
            self.durable.send_modify(|v| v.evicted = true);
        }
        st.next_op - 1
    }

    /// True once every submitted op is durable and indexed.
    pub fn settled(&self) -> bool {
        let st = self.lock();
        st.next_op - 1 == self.durable.borrow().op && st.indexed_op + 1 >= st.next_op
    }

    /// Durable records in `[from, until)` from the cache, about `max_bytes` of them
    /// (always at least one record), ending only where an append ends: every offset a
    /// read hands out is an append boundary. `None` when `from` is below what the
    /// cache holds.
    pub fn read_cached(&self, from: Offset, until: Offset, max_bytes: usize) -> Option<CachedRead> {
        let st = self.lock();
        if from < st.cache_floor {
            return None;
        }
        let mut out = CachedRead {
            segments: Vec::new(),
            flags: Vec::new(),
            meta: Vec::new(),
            end: from,
        };
        let first = first_ending_after(&st.cache, from);
        let mut taken = 0usize;
        // From the first record that ends after `from` on.
        let records = st
            .cache
            .range(first..)
            .flat_map(Cached::records)
            .skip_while(|(start, _, r)| start.0 + r.data.len() as u64 <= from.0);
        for (start, seq, record) in records {
            let starts_append = record.flags & RECORD_BATCH_START != 0;
            if start >= until || (taken >= max_bytes && starts_append && start >= from) {
                break;
            }
            let len = record.data.len() as u64;
            let lo = from.0.max(start.0) - start.0;
            let hi = (until.0.min(start.0 + len)) - start.0;
            let piece = record.data.slice(lo as usize..hi as usize);
            taken += piece.len();
            out.end = Offset(start.0 + hi);
            out.segments.push(piece);
            out.flags.push(if lo == 0 {
                record.flags
            } else {
                record.flags & !RECORD_BATCH_START
            });
            out.meta.push(RecordMeta {
                seq,
                ts_ms: record.ts_ms,
                ext: record.ext.clone(),
            });
        }
        Some(out)
    }

    /// Remembers that record `seq` starts at `offset` (a record boundary below the
    /// durable tail), where a read ended: the next page asks for it.
    pub fn bookmark(&self, seq: u64, offset: Offset) {
        let mut st = self.lock();
        if st.bookmarks.iter().any(|&(s, _)| s == seq) {
            return;
        }
        if st.bookmarks.len() == BOOKMARKS {
            st.bookmarks.remove(0);
        }
        st.bookmarks.push((seq, offset));
    }

    /// Where record `seq` starts, if a recent read ended there. Numbers and offsets
    /// of a record never change, but a trim may since have dropped it: the caller
    /// checks the offset against the stream's start.
    pub fn bookmarked(&self, seq: u64) -> Option<Offset> {
        let st = self.lock();
        st.bookmarks
            .iter()
            .find(|&&(s, _)| s == seq)
            .map(|&(_, o)| o)
    }

    /// Where the first cached record at or after `target` starts (the durable tail if
    /// none is), when the cache holds records before it; `None` when the cache is
    /// empty or begins at or after the target (look in the index).
    pub fn cached_before(&self, target: crate::stream::Seek) -> Option<Offset> {
        let st = self.lock();
        let reached = |seq: u64, r: &Record| {
            target.reached(&RecordMeta {
                seq,
                ts_ms: r.ts_ms,
                ext: None,
            })
        };
        let front = st.cache.front()?;
        if reached(front.seq, &front.records[0]) {
            return None;
        }
        // Numbers and times grow along the cache: first the appends whose last
        // record falls short, then the record that reaches it in the next one.
        let last = |c: &Cached| {
            let n = c.records.len() - 1;
            reached(c.seq + n as u64, &c.records[n])
        };
        let i = st.cache.partition_point(|c| !last(c));
        Some(match st.cache.get(i) {
            Some(c) => c
                .records()
                .find(|(_, seq, r)| reached(*seq, r))
                .map_or(c.start, |(start, _, _)| start),
            None => st.tail.min(self.view().tail),
        })
    }

    /// Where the append holding the durable byte at `pos` starts, if the cache holds
    /// that append from its first record.
    pub fn cached_append_start(&self, pos: Offset) -> Option<Offset> {
        let st = self.lock();
        if pos < st.cache_floor {
            return None;
        }
        let i = first_ending_after(&st.cache, pos);
        let holder = st.cache.get(i)?;
        if holder.start > pos {
            return None;
        }
        // The last record that begins an append, at or before the one holding `pos`.
        let begins = |c: &Cached, upto: Offset| {
            c.records()
                .take_while(|(start, _, _)| *start <= upto)
                .filter(|(_, _, r)| r.flags & RECORD_BATCH_START != 0)
                .last()
                .map(|(start, _, _)| start)
        };
        begins(holder, pos).or_else(|| {
            st.cache
                .range(..i)
                .rev()
                .find_map(|c| begins(c, Offset(u64::MAX)))
        })
    }
}

/// See [`StreamHandle::durable_op`].
pub struct DurableOp<'a> {
    handle: &'a StreamHandle,
    op_no: u64,
    /// Set while this waiter is in the stream's `op_waiters`.
    key: Option<u64>,
}

impl DurableOp<'_> {
    fn durable_now(&self) -> Option<DurableView> {
        let view = *self.handle.durable.borrow();
        (view.op >= self.op_no).then_some(view)
    }
}

impl Future for DurableOp<'_> {
    type Output = DurableView;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DurableView> {
        let this = &mut *self;
        // Durable already (the usual case once woken): no need for the stream's lock.
        // `on_durable` takes the entry out in the critical section that published
        // this view, if it has not already.
        if let Some(view) = this.durable_now() {
            this.key = None;
            return Poll::Ready(view);
        }
        let mut st = this.handle.lock();
        // Again under the lock: the update and the list change together there.
        if let Some(view) = this.durable_now() {
            this.key = None;
            return Poll::Ready(view);
        }
        let registered = this
            .key
            .and_then(|key| st.op_waiters.iter_mut().find(|w| w.key == key));
        match registered {
            Some(w) => w.waker.clone_from(cx.waker()),
            None => {
                let key = st.next_waiter_key;
                st.next_waiter_key += 1;
                // Most streams never have two appends waiting: room for one, not
                // the four a first push would take, on each of millions of handles.
                st.op_waiters.reserve_exact(1);
                st.op_waiters.push(OpWaiter {
                    op_no: this.op_no,
                    key,
                    waker: cx.waker().clone(),
                });
                this.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl StreamHandle {
    /// Wakes every writer waiting on this stream without completing its wait: the
    /// WAL's health changed, and each looks at it again (`Engine::wait_durable`).
    pub fn wake_op_waiters(&self) {
        let wakers: Vec<Waker> = self
            .lock()
            .op_waiters
            .iter()
            .map(|w| w.waker.clone())
            .collect();
        for w in wakers {
            w.wake();
        }
    }
}

impl Drop for DurableOp<'_> {
    /// A writer that stops waiting (its connection closed, a timeout) leaves the list.
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.handle.lock().op_waiters.retain(|w| w.key != key);
        }
    }
}

/// How many appends [`first_ending_after`] looks at from the back before it searches.
const TAIL_SCAN: usize = 4;

/// Index of the first cached append that ends after `from` (`cache.len()` if none).
/// Live readers ask for the last record or two, so the back is looked at first; a
/// binary search over the whole cache (up to a few hundred entries, cold in the CPU's
/// caches) was ~1% of the server's CPU with 64 SSE readers.
fn first_ending_after(cache: &VecDeque<Cached>, from: Offset) -> usize {
    let ends_after = |c: &Cached| c.end.0 > from.0;
    let mut i = cache.len();
    for _ in 0..TAIL_SCAN {
        match i.checked_sub(1) {
            Some(last) if ends_after(&cache[last]) => i = last,
            _ => return i,
        }
    }
    // Append ends grow with the index, so the answer is at or below `i`.
    cache.partition_point(|c| !ends_after(c))
}

impl DurableListener for StreamHandle {
    fn on_durable(&self, ops: &[(u64, Op)]) {
        let Some((last_op, _)) = ops.last() else {
            return;
        };
        let mut st = self.lock();
        let mut tail = None;
        let mut tail_seq = None;
        let mut close = false;
        let mut lifecycle = None;
        let mut start = None;
        let mut retention = None;
        for (op_no, op) in ops {
            match op {
                // The rest are system ops: never in a stream's own chunk.
                Op::Create(_)
                | Op::Relocate(_)
                | Op::PutToken(_)
                | Op::RevokeTokens { .. }
                | Op::PutServerKey { .. }
                | Op::RegistryPut { .. }
                | Op::RegistryDelete { .. } => {}
                Op::Append(a) => {
                    // One pass for both: this runs under the stream's lock.
                    let (len, held) = a.records.iter().fold((0, 0), |(len, held), r| {
                        (len + r.data.len() as u64, held + r.held_bytes())
                    });
                    let end = a.start.advance(len);
                    if !a.records.is_empty() {
                        st.cache_bytes += held;
                        st.cache.push_back(Cached {
                            start: a.start,
                            end,
                            seq: a.start_seq,
                            op_no: *op_no,
                            records: a.records.clone(),
                            held,
                        });
                    }
                    tail = Some(end);
                    tail_seq = Some(a.end_seq());
                    close |= a.close;
                }
                Op::Delete { soft } => {
                    lifecycle = Some(if *soft {
                        Lifecycle::SoftDeleted
                    } else {
                        Lifecycle::Deleted
                    });
                }
                Op::Trim { before } => start = Some(start.unwrap_or(Offset::ZERO).max(*before)),
                Op::SetRetention { secs } => retention = Some(*secs),
            }
        }
        let tail_now = tail.unwrap_or(self.durable.borrow().tail);
        let start = start.map(|s| s.min(tail_now).max(self.durable.borrow().start));
        if let Some(start) = start {
            // Nobody may read below the start again: its appends leave the cache
            // now, indexed or not (the index drops their rows too), and a read
            // below it misses the cache (and meets the trim), even where the start
            // falls inside an append the cache keeps.
            while let Some(front) = st.cache.front() {
                let end = front.end;
                if end > start {
                    break;
                }
                st.cache_bytes -= front.held;
                st.cache.pop_front();
            }
            st.cache_floor = st.cache_floor.max(start);
        }
        // Published under the state lock so no other update interleaves; once per
        // object, so each reader of this stream wakes once, not once per op.
        self.durable.send_modify(|v| {
            v.op = *last_op;
            if let Some(tail) = tail {
                v.tail = tail;
            }
            if let Some(seq) = tail_seq {
                v.tail_seq = seq;
            }
            v.closed |= close;
            if let Some(l) = lifecycle {
                v.lifecycle = l;
            }
            if let Some(start) = start {
                v.start = start;
            }
            if let Some(secs) = retention {
                v.retention_secs = secs;
            }
        });
        // Woken after the lock is let go: a woken writer may run at once on the
        // other core, and it must not find the lock held while the rest are woken.
        let done: Vec<OpWaiter> = st
            .op_waiters
            .extract_if(.., |w| w.op_no <= *last_op)
            .collect();
        drop(st);
        for w in done {
            w.waker.wake();
        }
    }

    fn on_indexed(&self, op_no: u64) {
        // The WAL hands an object to the indexer only after its ops were made
        // durable here: the index is never ahead of what is durable.
        assert!(
            op_no <= self.durable.borrow().op,
            "stream {}: op {op_no} indexed before it was durable",
            self.config.id
        );
        let mut st = self.lock();
        st.indexed_op = st.indexed_op.max(op_no);
        while st.cache_bytes > self.cache_bytes_max {
            let Some(front) = st.cache.front() else { break };
            if front.op_no > st.indexed_op {
                break;
            }
            let front = st.cache.pop_front().expect("front exists");
            st.cache_bytes -= front.held;
            st.cache_floor = front.end;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    use super::*;
    use crate::wal::format::AppendOp;

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn handle() -> StreamHandle {
        let config = StreamConfig {
            id: 7,
            name: "s".into(),
            content_type: "application/octet-stream".into(),
            json: false,
            created_ms: 0,
            ttl_secs: None,
            expires_at: None,
            expires_at_ms: None,
            fork: None,
        };
        StreamHandle::new(
            config,
            Offset::ZERO,
            None,
            Offset::ZERO,
            0,
            false,
            None,
            None,
            HashMap::new(),
            Lifecycle::Live,
            0,
            1 << 20,
        )
    }

    fn append_at(start: u64) -> Op {
        Op::Append(AppendOp {
            start: Offset(start),
            start_seq: start / 3,
            records: std::sync::Arc::new(vec![Record::plain(0, 0, Bytes::from_static(b"abc"))]),
            close: false,
            producer: None,
            stream_seq: None,
        })
    }

    fn poll(fut: &mut DurableOp<'_>, waker: &Arc<CountingWaker>) -> Poll<DurableView> {
        let waker = Waker::from(waker.clone());
        Pin::new(fut).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_commit_wakes_only_the_writers_whose_ops_it_made_durable() {
        let h = handle();
        let [w1, w2, w3]: [Arc<CountingWaker>; 3] = Default::default();
        let mut op1 = h.durable_op(1);
        let mut op2 = h.durable_op(2);
        let mut op2_again = h.durable_op(2);
        assert!(poll(&mut op1, &w1).is_pending());
        assert!(poll(&mut op2, &w2).is_pending());
        assert!(poll(&mut op2_again, &w3).is_pending());
        // Polled again with the same waker: still one entry each.
        assert!(poll(&mut op1, &w1).is_pending());
        assert_eq!(h.lock().op_waiters.len(), 3);

        h.on_durable(&[(1, append_at(0))]);
        assert_eq!(w1.0.load(Ordering::SeqCst), 1);
        assert_eq!(w2.0.load(Ordering::SeqCst), 0, "op 2 is not durable yet");
        assert_eq!(w3.0.load(Ordering::SeqCst), 0);
        assert!(matches!(poll(&mut op1, &w1), Poll::Ready(v) if v.op == 1));
        assert!(poll(&mut op2, &w2).is_pending());

        // A writer that gives up leaves the list.
        drop(op2_again);
        assert_eq!(h.lock().op_waiters.len(), 1);

        h.on_durable(&[(2, append_at(3))]);
        assert_eq!(w2.0.load(Ordering::SeqCst), 1);
        assert_eq!(w3.0.load(Ordering::SeqCst), 0);
        assert!(matches!(poll(&mut op2, &w2), Poll::Ready(v) if v.op == 2));
        assert!(h.lock().op_waiters.is_empty());

        // An op already durable answers at once and is never listed.
        let mut done = h.durable_op(2);
        assert!(poll(&mut done, &w1).is_ready());
        assert!(h.lock().op_waiters.is_empty());
    }

    /// One append of one record per length, from offset 100.
    fn cache_of(lens: &[usize]) -> VecDeque<Cached> {
        let mut at = 100u64;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                let record = Record::plain(0, 0, Bytes::from(vec![0u8; len]));
                let c = Cached {
                    start: Offset(at),
                    end: Offset(at + len as u64),
                    seq: i as u64,
                    op_no: i as u64,
                    held: record.held_bytes(),
                    records: Arc::new(vec![record]),
                };
                at += len as u64;
                c
            })
            .collect()
    }

    #[test]
    fn the_first_record_ending_after_an_offset_is_found_from_either_end() {
        for lens in [
            vec![],
            vec![5],
            vec![1, 2, 3],
            vec![10; 40],
            (1..30).collect::<Vec<_>>(),
        ] {
            let cache = cache_of(&lens);
            let end = 100 + lens.iter().sum::<usize>() as u64;
            for from in 90..end + 5 {
                let expected = cache
                    .iter()
                    .position(|c| c.end.0 > from)
                    .unwrap_or(cache.len());
                assert_eq!(
                    first_ending_after(&cache, Offset(from)),
                    expected,
                    "lens {lens:?}, from {from}"
                );
            }
        }
    }

    /// A record of the reference the cache's answers are checked against.
    struct Flat {
        start: u64,
        seq: u64,
        ts_ms: u64,
        flags: u8,
        data: Bytes,
    }

    /// Appends of several records each (one of them empty, one append without a
    /// batch-start flag, as a Kafka batch's inner records carry none), made
    /// durable; and the same records one by one, as the reference.
    fn multi_record_cache() -> (StreamHandle, Vec<Flat>) {
        let h = handle();
        let shapes: [&[usize]; 5] = [&[3, 1, 4], &[5], &[2, 0, 6, 1], &[7, 7], &[1, 2]];
        let (mut at, mut seq, mut flat, mut ops) = (0u64, 0u64, Vec::new(), Vec::new());
        for (n, lens) in shapes.iter().enumerate() {
            let ts_ms = 1_000 + n as u64 * 10;
            let records: Vec<Record> = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let start = i == 0 && n != 3;
                    let flags = if start { RECORD_BATCH_START } else { 0 };
                    Record::plain(ts_ms, flags, Bytes::from(vec![n as u8 + 1; len]))
                })
                .collect();
            let (start, start_seq) = (at, seq);
            for r in &records {
                flat.push(Flat {
                    start: at,
                    seq,
                    ts_ms,
                    flags: r.flags,
                    data: r.data.clone(),
                });
                at += r.data.len() as u64;
                seq += 1;
            }
            ops.push((
                n as u64 + 1,
                Op::Append(AppendOp {
                    start: Offset(start),
                    start_seq,
                    records: Arc::new(records),
                    close: false,
                    producer: None,
                    stream_seq: None,
                }),
            ));
        }
        h.on_durable(&ops);
        (h, flat)
    }

    #[test]
    fn reads_of_the_cache_match_the_records_one_by_one() {
        let (h, flat) = multi_record_cache();
        let end = flat.last().map_or(0, |r| r.start + r.data.len() as u64);
        for from in 0..=end {
            // Readers ask for something: `until` is past `from`.
            for until in [end, end / 2, from + 1].into_iter().filter(|u| *u > from) {
                for max_bytes in [0, 1, 4, 9, 100] {
                    // What a cache of one entry per record answered.
                    let (mut segments, mut flags, mut seqs, mut next) =
                        (Vec::new(), Vec::new(), Vec::new(), Offset(from));
                    let mut taken = 0;
                    let first = flat
                        .iter()
                        .position(|r| r.start + r.data.len() as u64 > from)
                        .unwrap_or(flat.len());
                    for r in &flat[first..] {
                        let starts = r.flags & RECORD_BATCH_START != 0;
                        if r.start >= until || (taken >= max_bytes && starts && r.start >= from) {
                            break;
                        }
                        let lo = from.max(r.start) - r.start;
                        let hi = until.min(r.start + r.data.len() as u64) - r.start;
                        let piece = r.data.slice(lo as usize..hi as usize);
                        taken += piece.len();
                        next = Offset(r.start + hi);
                        segments.push(piece);
                        flags.push(if lo == 0 {
                            r.flags
                        } else {
                            r.flags & !RECORD_BATCH_START
                        });
                        seqs.push(r.seq);
                    }
                    let got = h
                        .read_cached(Offset(from), Offset(until), max_bytes)
                        .expect("cached");
                    let at = format!("from {from} until {until} max {max_bytes}");
                    assert_eq!(got.segments, segments, "{at}");
                    assert_eq!(got.flags, flags, "{at}");
                    assert_eq!(
                        got.meta.iter().map(|m| m.seq).collect::<Vec<_>>(),
                        seqs,
                        "{at}"
                    );
                    assert_eq!(got.end, next, "{at}");
                }
            }
        }
        for pos in 0..end + 2 {
            let holder = flat
                .iter()
                .position(|r| r.start + r.data.len() as u64 > pos);
            let expected = holder.filter(|&i| flat[i].start <= pos).and_then(|i| {
                flat[..=i]
                    .iter()
                    .rev()
                    .find(|r| r.flags & RECORD_BATCH_START != 0)
                    .map(|r| Offset(r.start))
            });
            assert_eq!(h.cached_append_start(Offset(pos)), expected, "pos {pos}");
        }
        for target in (0..flat.len() as u64 + 2)
            .map(crate::stream::Seek::Seq)
            .chain((995..1_050).map(crate::stream::Seek::Time))
        {
            let meta = |r: &Flat| RecordMeta {
                seq: r.seq,
                ts_ms: r.ts_ms,
                ext: None,
            };
            // Past every record: the tail as the writer side knows it (this
            // handle's sequencer never ran, so that is 0 here).
            let tail = h.lock().tail.min(h.view().tail);
            let expected = if target.reached(&meta(&flat[0])) {
                None
            } else {
                Some(
                    flat.iter()
                        .find(|r| target.reached(&meta(r)))
                        .map_or(tail, |r| Offset(r.start)),
                )
            };
            assert_eq!(h.cached_before(target), expected, "{target:?}");
        }
    }

    #[test]
    fn a_trim_inside_an_append_sends_reads_below_it_to_the_index() {
        let (h, flat) = multi_record_cache();
        // Offset 5 is inside the first append (3, 1, 4): its record of 4 begins at 4.
        h.on_durable(&[(10, Op::Trim { before: Offset(5) })]);
        assert!(h.read_cached(Offset(4), Offset(20), 100).is_none());
        let read = h.read_cached(Offset(5), Offset(20), 100).expect("cached");
        assert_eq!(read.segments[0], flat[2].data.slice(1..));
        assert_eq!(read.meta[0].seq, 2);
    }
}
