//! A fault-injecting object store wrapper for tests and benchmarks: added latency,
//! a transient error rate, failing one kind of operation, hanging requests, or the
//! whole store down. Every knob can be turned while the store is in use.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Put,
    Get,
    List,
    Delete,
}

/// The knobs, shared between the wrapper and whoever drives the faults.
#[derive(Default, Debug)]
pub struct FaultControl {
    latency_us: AtomicU64,
    /// Probability (per million requests) that a request fails transiently.
    error_ppm: AtomicU64,
    fail_puts: AtomicBool,
    fail_gets: AtomicBool,
    down: AtomicBool,
    /// Requests never answer (the caller's timeout must fire).
    hang: AtomicBool,
    pub injected_errors: AtomicU64,
    pub requests: AtomicU64,
    /// PUTs under way now, and the most seen at once (reset it to watch a window).
    puts_in_flight: AtomicU64,
    pub max_puts_in_flight: AtomicU64,
}

impl FaultControl {
    pub fn set_latency(&self, d: Duration) {
        self.latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }
    pub fn set_error_rate(&self, rate: f64) {
        self.error_ppm
            .store((rate.clamp(0.0, 1.0) * 1e6) as u64, Ordering::Relaxed);
    }
    pub fn fail(&self, op: OpKind, on: bool) {
        match op {
            OpKind::Put => self.fail_puts.store(on, Ordering::Relaxed),
            OpKind::Get => self.fail_gets.store(on, Ordering::Relaxed),
            _ => {}
        }
    }
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }
    pub fn set_hang(&self, hang: bool) {
        self.hang.store(hang, Ordering::Relaxed);
    }

    async fn inject(&self, op: OpKind) -> object_store::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let latency = self.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        if self.hang.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let failing = self.down.load(Ordering::Relaxed)
            || (op == OpKind::Put && self.fail_puts.load(Ordering::Relaxed))
            || (op == OpKind::Get && self.fail_gets.load(Ordering::Relaxed))
            || fastrand::u64(0..1_000_000) < self.error_ppm.load(Ordering::Relaxed);
        if failing {
            self.injected_errors.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::Generic {
                store: "fault-injection",
                source: format!("injected {op:?} failure").into(),
            });
        }
        Ok(())
    }
}

/// Counts one PUT in flight until dropped (also when the caller gives up on it).
struct PutInFlight<'a>(&'a FaultControl);

impl<'a> PutInFlight<'a> {
    fn enter(control: &'a FaultControl) -> Self {
        let now = control.puts_in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        control.max_puts_in_flight.fetch_max(now, Ordering::AcqRel);
        PutInFlight(control)
    }
}

impl Drop for PutInFlight<'_> {
    fn drop(&mut self) {
        self.0.puts_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    control: Arc<FaultControl>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> (Arc<FaultyStore>, Arc<FaultControl>) {
        let control = Arc::new(FaultControl::default());
        (
            Arc::new(FaultyStore {
                inner,
                control: control.clone(),
            }),
            control,
        )
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let _counted = PutInFlight::enter(&self.control);
        self.control.inject(OpKind::Put).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.control.inject(OpKind::Put).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.control.inject(OpKind::Get).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.control.inject(OpKind::Get).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let control = self.control.clone();
        let inner = self.inner.clone();
        futures::stream::once(async move {
            match control.inject(OpKind::Delete).await {
                Ok(()) => inner.delete_stream(locations),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let control = self.control.clone();
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move { control.inject(OpKind::List).await })
            .flat_map(move |r| match r {
                Ok(()) => inner.list(prefix.as_ref()),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let control = self.control.clone();
        let inner = self.inner.clone();
        let (prefix, offset) = (prefix.cloned(), offset.clone());
        futures::stream::once(async move { control.inject(OpKind::List).await })
            .flat_map(move |r| match r {
                Ok(()) => inner.list_with_offset(prefix.as_ref(), &offset),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.control.inject(OpKind::List).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.control.inject(OpKind::Put).await?;
        self.inner.copy_opts(from, to, options).await
    }
}
