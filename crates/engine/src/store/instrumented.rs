//! An object-store wrapper that counts what the bucket is asked to do: requests by
//! operation and outcome, bytes each way, latency, and from these an estimated bill.
//! It changes nothing about the requests themselves.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::config::CostConfig;
use crate::metrics::{Desc, Exposition, Histogram, LATENCY_BOUNDS_S};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    Head,
    List,
    Delete,
    Copy,
}

impl Op {
    const ALL: [Op; 6] = [Op::Put, Op::Get, Op::Head, Op::List, Op::Delete, Op::Copy];
    fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::Head => "head",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Copy => "copy",
        }
    }
    /// S3 bills PUT, COPY, POST and LIST at the PUT rate, GET and HEAD at the GET
    /// rate; DELETE is free.
    fn billed_as_put(self) -> Option<bool> {
        match self {
            Op::Put | Op::Copy | Op::List => Some(true),
            Op::Get | Op::Head => Some(false),
            Op::Delete => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    NotFound,
    AlreadyExists,
    Precondition,
    Error,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::NotFound,
        Outcome::AlreadyExists,
        Outcome::Precondition,
        Outcome::Error,
    ];
    fn of<T>(r: &object_store::Result<T>) -> Outcome {
        match r {
            Ok(_) => Outcome::Ok,
            Err(object_store::Error::NotFound { .. }) => Outcome::NotFound,
            Err(object_store::Error::AlreadyExists { .. }) => Outcome::AlreadyExists,
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::NotModified { .. }) => Outcome::Precondition,
            Err(_) => Outcome::Error,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::AlreadyExists => "already_exists",
            Outcome::Precondition => "precondition_failed",
            Outcome::Error => "error",
        }
    }
}

/// Counters of one store (one `store` label value).
pub struct StoreStats {
    label: &'static str,
    /// `[op][outcome]`
    requests: [[AtomicU64; 5]; 6],
    latency: [Histogram; 6],
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    /// Estimate of the bytes held: what recovery listed plus what was written since.
    stored_bytes: AtomicU64,
    storage: Mutex<StorageAccrual>,
    prices: CostConfig,
}

struct StorageAccrual {
    since: Instant,
    usd: f64,
}

const SECS_PER_MONTH: f64 = 30.0 * 24.0 * 3600.0;
const BYTES_PER_GB: f64 = 1e9;

impl StoreStats {
    pub fn new(label: &'static str, prices: CostConfig) -> Arc<StoreStats> {
        Arc::new(StoreStats {
            label,
            requests: Default::default(),
            latency: std::array::from_fn(|_| Histogram::new(&DURATION, LATENCY_BOUNDS_S)),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            storage: Mutex::new(StorageAccrual {
                since: Instant::now(),
                usd: 0.0,
            }),
            prices,
        })
    }

    pub fn label(&self) -> &'static str {
        self.label
    }

    fn record(&self, op: Op, outcome: Outcome, started: Instant) {
        self.requests[op as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.latency[op as usize].observe(started.elapsed().as_secs_f64());
    }

    /// Requests of `op` that ended with `outcome` (`"ok"`, `"error"`, ...).
    pub fn requests(&self, op: Op, outcome: &str) -> u64 {
        Outcome::ALL
            .iter()
            .filter(|o| o.name() == outcome)
            .map(|o| self.requests[op as usize][*o as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// Requests of `op`, whatever their outcome.
    pub fn requests_total(&self, op: Op) -> u64 {
        self.requests[op as usize]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }

    /// Bytes already in the store when this process started (from recovery's listing).
    pub fn add_stored_bytes(&self, n: u64) {
        self.accrue();
        self.stored_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes deleted from the store (by garbage collection).
    pub fn sub_stored_bytes(&self, n: u64) {
        self.accrue();
        let _ = self
            .stored_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// Adds the storage cost of the bytes held since the last call.
    fn accrue(&self) -> f64 {
        let mut s = self.storage.lock().expect("storage accrual lock");
        let now = Instant::now();
        let gb = self.stored_bytes.load(Ordering::Relaxed) as f64 / BYTES_PER_GB;
        let months = now.duration_since(s.since).as_secs_f64() / SECS_PER_MONTH;
        s.usd += gb * months * self.prices.storage_gb_month_usd;
        s.since = now;
        s.usd
    }

    fn request_cost_usd(&self, put_class: bool) -> f64 {
        let n: u64 = Op::ALL
            .iter()
            .filter(|op| op.billed_as_put() == Some(put_class))
            .map(|op| self.requests_total(*op))
            .sum();
        let per_1000 = if put_class {
            self.prices.put_per_1000_usd
        } else {
            self.prices.get_per_1000_usd
        };
        n as f64 * per_1000 / 1000.0
    }

    /// Estimated spend so far in dollars: PUT-class requests, GET-class requests,
    /// storage.
    pub fn cost_usd(&self) -> (f64, f64, f64) {
        (
            self.request_cost_usd(true),
            self.request_cost_usd(false),
            self.accrue(),
        )
    }
}

static REQUESTS: Desc = Desc::counter(
    "picomq_object_store_requests_total",
    "Object-store requests by store, operation and outcome.",
);
static BYTES: Desc = Desc::counter(
    "picomq_object_store_bytes_total",
    "Payload bytes sent to (written) and received from (read) the object store.",
);
static DURATION: Desc = Desc::histogram(
    "picomq_object_store_request_duration_seconds",
    "Object-store request latency (to the response head), by store and operation.",
);
static STORED: Desc = Desc::gauge(
    "picomq_object_store_stored_bytes",
    "Estimated bytes held in the store: listed at start-up plus written since.",
);
static COST: Desc = Desc::counter(
    "picomq_object_store_cost_dollars_total",
    "Estimated object-store bill since start-up, from the configured prices, by component (put_requests, get_requests, storage).",
);

/// Writes the object-store families for every store.
pub fn write_metrics(out: &mut Exposition, stores: &[Arc<StoreStats>]) {
    for s in stores {
        for op in Op::ALL {
            for outcome in Outcome::ALL {
                let n = s.requests[op as usize][outcome as usize].load(Ordering::Relaxed);
                if n > 0 || outcome == Outcome::Ok {
                    let labels = [
                        ("store", s.label),
                        ("op", op.name()),
                        ("outcome", outcome.name()),
                    ];
                    out.value(&REQUESTS, &labels, n as f64);
                }
            }
        }
    }
    for s in stores {
        for (direction, n) in [("written", &s.bytes_written), ("read", &s.bytes_read)] {
            let labels = [("store", s.label), ("direction", direction)];
            out.value(&BYTES, &labels, n.load(Ordering::Relaxed) as f64);
        }
    }
    for s in stores {
        for op in Op::ALL {
            out.histogram(
                &s.latency[op as usize],
                &[("store", s.label), ("op", op.name())],
            );
        }
    }
    for s in stores {
        let stored = s.stored_bytes.load(Ordering::Relaxed) as f64;
        out.value(&STORED, &[("store", s.label)], stored);
    }
    for s in stores {
        let (put, get, storage) = s.cost_usd();
        for (component, usd) in [
            ("put_requests", put),
            ("get_requests", get),
            ("storage", storage),
        ] {
            out.value(&COST, &[("store", s.label), ("component", component)], usd);
        }
    }
}

/// The wrapper. Every request is timed and counted once, whatever its outcome.
#[derive(Clone)]
pub struct InstrumentedStore {
    inner: Arc<dyn ObjectStore>,
    stats: Arc<StoreStats>,
}

impl InstrumentedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, stats: Arc<StoreStats>) -> InstrumentedStore {
        InstrumentedStore { inner, stats }
    }

    /// A listing that records its requests: S3 returns 1,000 keys per LIST
    /// request, so one request per page begun, and at least one for an empty one.
    fn counted_listing(
        &self,
        listing: BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        struct Listing {
            inner: BoxStream<'static, object_store::Result<ObjectMeta>>,
            stats: Arc<StoreStats>,
            started: Instant,
            in_page: u32,
            pages: u32,
        }
        let state = Listing {
            inner: listing,
            stats: self.stats.clone(),
            started: Instant::now(),
            in_page: 0,
            pages: 0,
        };
        futures::stream::unfold(Some(state), |state| async move {
            let mut l = state?;
            match l.inner.next().await {
                Some(r) => {
                    l.in_page += 1;
                    if r.is_err() || l.in_page == 1000 {
                        l.stats.record(Op::List, Outcome::of(&r), l.started);
                        l.started = Instant::now();
                        l.in_page = 0;
                        l.pages += 1;
                    }
                    let next = if r.is_err() { None } else { Some(l) };
                    Some((r, next))
                }
                None => {
                    if l.in_page > 0 || l.pages == 0 {
                        l.stats.record(Op::List, Outcome::Ok, l.started);
                    }
                    None
                }
            }
        })
        .boxed()
    }
}

impl fmt::Debug for InstrumentedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "InstrumentedStore({}, {:?})",
            self.stats.label, self.inner
        )
    }
}

impl fmt::Display for InstrumentedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl ObjectStore for InstrumentedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let len = payload.content_length() as u64;
        let started = Instant::now();
        let r = self.inner.put_opts(location, payload, opts).await;
        self.stats.record(Op::Put, Outcome::of(&r), started);
        if r.is_ok() {
            self.stats.bytes_written.fetch_add(len, Ordering::Relaxed);
            self.stats.add_stored_bytes(len);
        }
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // Multipart parts are not counted individually; PicoMQ does not use them.
        let started = Instant::now();
        let r = self.inner.put_multipart_opts(location, opts).await;
        self.stats.record(Op::Put, Outcome::of(&r), started);
        r
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let op = if options.head { Op::Head } else { Op::Get };
        let started = Instant::now();
        let r = self.inner.get_opts(location, options).await;
        self.stats.record(op, Outcome::of(&r), started);
        if let (Op::Get, Ok(got)) = (op, &r) {
            self.stats
                .bytes_read
                .fetch_add(got.range.end - got.range.start, Ordering::Relaxed);
        }
        r
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        // Counted as one request: stores may coalesce ranges into fewer GETs.
        let started = Instant::now();
        let r = self.inner.get_ranges(location, ranges).await;
        self.stats.record(Op::Get, Outcome::of(&r), started);
        if let Ok(parts) = &r {
            let n: usize = parts.iter().map(Bytes::len).sum();
            self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let stats = self.stats.clone();
        self.inner
            .delete_stream(locations)
            .map(move |r| {
                stats.record(Op::Delete, Outcome::of(&r), Instant::now());
                r
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counted_listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counted_listing(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let started = Instant::now();
        let r = self.inner.list_with_delimiter(prefix).await;
        self.stats.record(Op::List, Outcome::of(&r), started);
        r
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let started = Instant::now();
        let r = self.inner.copy_opts(from, to, options).await;
        self.stats.record(Op::Copy, Outcome::of(&r), started);
        r
    }
}
