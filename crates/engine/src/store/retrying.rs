//! An object store that retries each request that failed transiently, for work
//! that makes many requests and must finish as a whole: recovery and takeover read
//! and seal a log one object at a time, and restarting all of it after one failed
//! request never converges when a store fails a few percent of its requests.
//!
//! Only answers that say nothing about the object are retried (network errors,
//! 5xx, timeouts); `NotFound`, `AlreadyExists`, `Precondition`, `NotModified`,
//! `NotImplemented` and invalid requests are answers and go back at once. A
//! create-only PUT that failed ambiguously and is retried may find its own first
//! attempt (`AlreadyExists`): callers already treat that as "someone wrote it" and
//! read what is there, which is what makes the retry safe.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Attempts per request, the first included.
const ATTEMPTS: u32 = 8;
/// Backoff after the first failure, doubled after each (20 ms .. 2.56 s, ~5 s in all).
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

pub struct RetryingStore {
    inner: Arc<dyn ObjectStore>,
}

impl RetryingStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> RetryingStore {
        RetryingStore { inner }
    }
}

/// Whether `e` says nothing about the object, so the same request may succeed.
fn transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::NotFound { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented { .. }
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
            | E::UnknownConfigurationKey { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
    )
}

async fn retry<T, F, Fut>(what: &str, location: &str, mut attempt: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e) if tries < ATTEMPTS && transient(&e) => {
                tracing::debug!(what, location, error = %e, ?backoff, "object-store request failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

impl fmt::Display for RetryingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RetryingStore({})", self.inner)
    }
}

impl fmt::Debug for RetryingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[async_trait]
impl ObjectStore for RetryingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        retry("put", location.as_ref(), || {
            self.inner.put_opts(location, payload.clone(), opts.clone())
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    /// The request is retried; a body that fails while it is read is not (the
    /// caller sees the error, as without this wrapper).
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        retry("get", location.as_ref(), || {
            self.inner.get_opts(location, options.clone())
        })
        .await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        retry("get", location.as_ref(), || {
            self.inner.get_ranges(location, ranges)
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    /// The whole listing is read, retried from its start if a page fails, and then
    /// handed out: the listings this serves (a log, the claims) fit in memory.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let shown = prefix.as_ref().map_or("", |p| p.as_ref()).to_string();
            retry("list", &shown, || {
                inner.list(prefix.as_ref()).try_collect::<Vec<_>>()
            })
            .await
        })
        .flat_map(|listed| match listed {
            Ok(all) => futures::stream::iter(all.into_iter().map(Ok)).boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let (prefix, offset) = (prefix.cloned(), offset.clone());
        futures::stream::once(async move {
            let shown = prefix.as_ref().map_or("", |p| p.as_ref()).to_string();
            retry("list", &shown, || {
                inner
                    .list_with_offset(prefix.as_ref(), &offset)
                    .try_collect::<Vec<_>>()
            })
            .await
        })
        .flat_map(|listed| match listed {
            Ok(all) => futures::stream::iter(all.into_iter().map(Ok)).boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let shown = prefix.map_or("", |p| p.as_ref()).to_string();
        retry("list", &shown, || self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        retry("copy", from.as_ref(), || {
            self.inner.copy_opts(from, to, options.clone())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fault::FaultyStore;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutMode};

    #[tokio::test]
    async fn requests_succeed_through_a_store_failing_a_third_of_them() {
        // The faults are drawn from this thread's generator (the test runs on a
        // current-thread runtime): seeded, the run is the same every time. Unseeded,
        // eight failures in a row (0.3^8 per request, ~100 requests) failed about one
        // run in 150.
        fastrand::seed(0x5eed_0042);
        let (faulty, control) = FaultyStore::new(Arc::new(InMemory::new()));
        control.set_error_rate(0.3);
        let store = RetryingStore::new(faulty);
        for i in 0..50 {
            let key = Path::from(format!("k/{i:03}"));
            store
                .put(&key, PutPayload::from_static(b"x"))
                .await
                .unwrap();
            let got = store.get(&key).await.unwrap().bytes().await.unwrap();
            assert_eq!(&got[..], b"x");
        }
        let listed: Vec<_> = store
            .list(Some(&Path::from("k")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed.len(), 50);
        assert!(
            control
                .injected_errors
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
    }

    #[tokio::test]
    async fn answers_are_not_retried() {
        let (faulty, control) = FaultyStore::new(Arc::new(InMemory::new()));
        let store = RetryingStore::new(faulty);
        let key = Path::from("once");
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&key, PutPayload::from_static(b"a"), create.clone())
            .await
            .unwrap();
        let before = control.requests.load(std::sync::atomic::Ordering::Relaxed);
        let again = store
            .put_opts(&key, PutPayload::from_static(b"b"), create)
            .await;
        assert!(matches!(
            again,
            Err(object_store::Error::AlreadyExists { .. })
        ));
        assert!(matches!(
            store.get(&Path::from("missing")).await,
            Err(object_store::Error::NotFound { .. })
        ));
        let after = control.requests.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(after - before, 2, "one request each");
    }
}
