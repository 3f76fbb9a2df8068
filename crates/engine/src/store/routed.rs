//! Two stores behind one: WAL objects (keys under `wal/`, and the epoch claims that
//! fence WAL writers, under `epochs/`) go to the WAL store, everything else to the
//! data store. This is what `--wal-store` plugs in: e.g. a low-latency bucket
//! (S3 Express One Zone) for the WAL, a standard bucket for the rest.
//!
//! Reads follow the same rule, so a key is always read from the store that holds it:
//! today every record lives in a WAL object, so record reads go to the WAL store too.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

#[derive(Debug)]
pub struct RoutedStore {
    data: Arc<dyn ObjectStore>,
    wal: Arc<dyn ObjectStore>,
}

impl RoutedStore {
    pub fn new(data: Arc<dyn ObjectStore>, wal: Arc<dyn ObjectStore>) -> RoutedStore {
        RoutedStore { data, wal }
    }

    fn is_wal(location: &Path) -> bool {
        crate::layout::home(location.as_ref()) == crate::layout::Home::Wal
    }

    fn route(&self, location: &Path) -> &Arc<dyn ObjectStore> {
        if Self::is_wal(location) {
            &self.wal
        } else {
            &self.data
        }
    }

    fn unsupported(what: &str) -> object_store::Error {
        object_store::Error::NotSupported {
            source: format!("{what} across the data and WAL stores").into(),
        }
    }
}

impl fmt::Display for RoutedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Routed(data: {}, wal: {})", self.data, self.wal)
    }
}

#[async_trait]
impl ObjectStore for RoutedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.route(location).put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.route(location)
            .put_multipart_opts(location, opts)
            .await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.route(location).get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.route(location).get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // One key at a time, each to its own store: deletes are rare (GC) and this
        // keeps the routing rule in one place.
        let data = self.data.clone();
        let wal = self.wal.clone();
        locations
            .then(move |location| {
                let data = data.clone();
                let wal = wal.clone();
                async move {
                    let location = location?;
                    let store = if RoutedStore::is_wal(&location) {
                        wal
                    } else {
                        data
                    };
                    store.delete(&location).await.map(|()| location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match prefix {
            Some(p) => self.route(p).list(Some(p)),
            // The whole bucket: both stores, data first. The data store's keys under
            // the WAL prefixes are not its own (a local store's WAL log files).
            None => self
                .data
                .list(None)
                .filter(|meta| {
                    let wal = meta
                        .as_ref()
                        .is_ok_and(|m| RoutedStore::is_wal(&m.location));
                    futures::future::ready(!wal)
                })
                .chain(self.wal.list(None))
                .boxed(),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match prefix {
            Some(p) => self.route(p).list_with_offset(Some(p), offset),
            None => {
                let offset = offset.clone();
                self.list(None)
                    .try_filter(move |m| std::future::ready(m.location > offset))
                    .boxed()
            }
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        match prefix {
            Some(p) => self.route(p).list_with_delimiter(Some(p)).await,
            None => Err(Self::unsupported("listing the root")),
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        if Self::is_wal(from) != Self::is_wal(to) {
            return Err(Self::unsupported("copying"));
        }
        self.route(from).copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn wal_keys_go_to_the_wal_store() {
        let data: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let wal: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let routed = RoutedStore::new(data.clone(), wal.clone());
        for key in [
            "wal/0000000001/000000000000.wal",
            "epochs/0000000001",
            "meta/x",
        ] {
            routed
                .put(&Path::from(key), PutPayload::from_static(b"x"))
                .await
                .unwrap();
            assert!(routed.head(&Path::from(key)).await.is_ok());
        }
        assert!(wal
            .head(&Path::from("wal/0000000001/000000000000.wal"))
            .await
            .is_ok());
        assert!(wal.head(&Path::from("epochs/0000000001")).await.is_ok());
        assert!(data.head(&Path::from("meta/x")).await.is_ok());
        assert!(data.head(&Path::from("epochs/0000000001")).await.is_err());
        let listed: Vec<_> = routed
            .list(Some(&Path::from("wal")))
            .collect::<Vec<_>>()
            .await;
        assert_eq!(listed.len(), 1);
    }
}
