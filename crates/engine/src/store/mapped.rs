//! Range reads of the local store's files by `mmap`, not `pread`.
//!
//! object_store's `LocalFileSystem` answers a range read by zeroing a fresh buffer
//! and copying the range into it: for a catch-up read of packs that is a `memset`,
//! a copy out of the page cache and the first touch of every page of the buffer
//! (`docs/performance.md`, "Catch-up as frames"). A mapping of the range instead
//! hands out the page cache's own pages: the bytes go to the socket with one copy,
//! as they would from any other buffer.
//!
//! Why a mapping is safe here: every file behind this store is written whole under a
//! temporary name and renamed into place (`LocalFileSystem::put`), never changed or
//! truncated afterwards, so a mapped range always stays backed by the file (a
//! truncated mapping would fault with SIGBUS). Deleting a file (GC) unlinks it;
//! its pages live until the last mapping of them is dropped, like an open file.
//! The WAL log's files, which are reused, are not read through here (`routed`).
//!
//! A mapping also keeps its file open (up to [`SOURCES_MAX`] at once) and is listed
//! by address, so that the HTTP/1.1 loop, finding a response slice inside one
//! ([`source`]), can have the kernel send the file's range to the socket with
//! `sendfile`: the page cache's pages go into the socket buffer by reference, and
//! the copy from user memory is skipped (`docs/performance.md`, "sendfile").
//!
//! The mapping is made in a blocking task with `MAP_POPULATE`, so the disk reads
//! for a range not yet in the page cache happen there and not on a runtime thread
//! when a reader first touches the bytes.
//!
//! The trade-off: a page the kernel evicts while mapped is read again on its next
//! touch, and a disk error at that moment is a SIGBUS, where `pread` would have
//! returned an error. The same disk holds the WAL log the process trusts for every
//! acknowledgement, so a failing disk stops the node either way.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Ranges shorter than this are read as before: a mapping costs two system calls
/// and page-table work, more than copying a few pages.
pub const MAP_FROM_BYTES: u64 = 64 * 1024;

#[derive(Debug)]
pub struct MappedFiles<S> {
    inner: S,
}

impl<S> MappedFiles<S> {
    pub fn new(inner: S) -> MappedFiles<S> {
        MappedFiles { inner }
    }
}

impl<S: fmt::Display> fmt::Display for MappedFiles<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mapped({})", self.inner)
    }
}

/// A read-only shared mapping, unmapped when the last `Bytes` slicing it drops.
/// Listed in [`SOURCES`] while it lives.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    file: Option<std::fs::File>,
}

/// Every live mapping, by start address: a writer that finds a slice inside one
/// holding its file open can have the kernel send the file's range to a socket
/// (`sendfile`) instead of copying the mapped bytes ([`source`]), and a reader can
/// tell bytes of an immutable local file from others ([`is_mapped`]).
static SOURCES: RwLock<BTreeMap<usize, Source>> = RwLock::new(BTreeMap::new());

/// Mappings that keep their file open at once; past it a mapping closes its file
/// as before and its bytes are copied like any others. Each one costs a file
/// descriptor for as long as a reader holds its bytes.
pub const SOURCES_MAX: usize = 512;
static HOLDING_FILES: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy)]
struct Source {
    len: usize,
    fd: Option<RawFd>,
    /// The file offset of the mapping's first byte.
    offset: u64,
}

/// The mapping `bytes` lie in, with their start address in it.
fn mapping_of(bytes: &Bytes) -> Option<(Source, usize)> {
    if bytes.is_empty() {
        return None;
    }
    let at = bytes.as_ptr() as usize;
    let sources = SOURCES.read().unwrap_or_else(|e| e.into_inner());
    let (&start, src) = sources.range(..=at).next_back()?;
    (at + bytes.len() <= start + src.len).then_some((*src, at - start))
}

/// Where in a file `bytes` lie, if they are a slice of a mapping made here that
/// holds its file open: the file's descriptor and the offset of `bytes[0]`.
///
/// The descriptor is valid only while `bytes` (or another slice of the same
/// mapping) is alive; the caller must use it before dropping them.
pub fn source(bytes: &Bytes) -> Option<(RawFd, u64)> {
    let (src, skip) = mapping_of(bytes)?;
    Some((src.fd?, src.offset + skip as u64))
}

/// Whether `bytes` are a slice of a mapping made here: bytes of a local file that
/// is never changed in place (module doc), read straight from the page cache.
pub fn is_mapped(bytes: &Bytes) -> bool {
    mapping_of(bytes).is_some()
}

// SAFETY: the mapping is read-only and never written through; its pages belong to
// a file that is not changed in place (module doc), so any thread may read them.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        SOURCES
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(self.ptr as usize));
        if self.file.is_some() {
            HOLDING_FILES.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: `ptr`/`len` are exactly what mmap returned, unmapped once. The
        // file closes after this, when the fields drop.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    })
}

/// `range` of `file` (which must hold it: the caller checked it against the
/// file's size) as bytes backed by a mapping of the file, which keeps the file
/// open for [`source`] while fewer than [`SOURCES_MAX`] mappings do.
fn map_range(file: std::fs::File, range: Range<u64>) -> std::io::Result<Bytes> {
    let start = range.start - range.start % page_size();
    let len = usize::try_from(range.end - start).map_err(std::io::Error::other)?;
    let offset = libc::off_t::try_from(start).map_err(std::io::Error::other)?;
    // SAFETY: a fresh read-only shared mapping of an open file; the kernel picks the
    // address. Errors come back as MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            file.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let skip = (range.start - start) as usize;
    let mut mapping = Mapping {
        ptr,
        len,
        file: None,
    };
    let held = HOLDING_FILES
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < SOURCES_MAX).then_some(n + 1)
        })
        .is_ok();
    let fd = held.then(|| file.as_raw_fd());
    if held {
        mapping.file = Some(file);
    }
    SOURCES.write().unwrap_or_else(|e| e.into_inner()).insert(
        ptr as usize,
        Source {
            len,
            fd,
            offset: start,
        },
    );
    Ok(Bytes::from_owner(mapping).slice(skip..))
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for MappedFiles<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let ranged = options.range.is_some() && !options.head;
        // The inner store opens the file, checks the conditions and the range
        // against its size, and names the range; only the read is done here.
        let got = self.inner.get_opts(location, options).await?;
        let range = got.range.clone();
        let (file, path) = match got.payload {
            GetResultPayload::File(file, path)
                if ranged && range.end - range.start >= MAP_FROM_BYTES =>
            {
                (file, path)
            }
            payload => return Ok(GetResult { payload, ..got }),
        };
        let mapped = tokio::task::spawn_blocking(move || map_range(file, range))
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "mapped local files",
                source: Box::new(e),
            })?
            .map_err(|e| object_store::Error::Generic {
                store: "mapped local files",
                source: format!("mapping {}: {e}", path.display()).into(),
            })?;
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(mapped) }).boxed(),
            ),
            ..got
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn range_reads_answer_as_the_plain_store_does_mapped_or_not() {
        let dir = std::env::temp_dir().join(format!("picomq-mapped-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = MappedFiles::new(LocalFileSystem::new_with_prefix(&dir).unwrap());
        let plain = LocalFileSystem::new_with_prefix(&dir).unwrap();
        let body: Vec<u8> = (0..1_000_003u32).map(|i| (i * 31 % 253) as u8).collect();
        let key = Path::from("packs/p1");
        store.put(&key, body.clone().into()).await.unwrap();
        // Unaligned starts and ends, below and above the mapping threshold, the
        // whole object, its last byte, and ranges running past its end.
        for range in [
            0..10,
            5..70_000,
            4095..4097 + 200_000,
            123_457..999_999,
            0..1_000_003,
            1_000_002..1_000_003,
            999_000..1_100_000,
            1_000_003..1_100_000,
            2_000_000..2_100_000,
        ] {
            let got = store.get_range(&key, range.clone()).await;
            let want = plain.get_range(&key, range.clone()).await;
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{range:?}"),
                (Err(_), Err(_)) => {}
                (got, want) => panic!("{range:?}: {got:?} against {want:?}"),
            }
            if range.end <= body.len() as u64 {
                let got = store.get_range(&key, range.clone()).await.unwrap();
                assert_eq!(&got[..], &body[range.start as usize..range.end as usize]);
            }
        }
        // Long ranges are answered from a mapping, short ones and whole objects by
        // the plain store's file reads.
        let payload = |range: Range<u64>| {
            let store = &store;
            let key = &key;
            async move {
                let options = GetOptions::new().with_range(Some(range));
                store.get_opts(key, options).await.unwrap().payload
            }
        };
        assert!(matches!(
            payload(5..70_000).await,
            GetResultPayload::Stream(_)
        ));
        assert!(matches!(payload(0..10).await, GetResultPayload::File(..)));
        assert!(matches!(
            store
                .get_opts(&key, GetOptions::new())
                .await
                .unwrap()
                .payload,
            GetResultPayload::File(..)
        ));
        // A whole-object GET and a HEAD are the plain store's.
        assert_eq!(
            store.get(&key).await.unwrap().bytes().await.unwrap(),
            &body[..]
        );
        assert_eq!(store.head(&key).await.unwrap().size, body.len() as u64);
        // The bytes outlive the file's name, as an open file would.
        let held = store.get_range(&key, 100..300_100).await.unwrap();
        store.delete(&key).await.unwrap();
        assert_eq!(&held[..], &body[100..300_100]);
        let missing = store.get_range(&key, 0..100_000).await;
        assert!(
            matches!(missing, Err(object_store::Error::NotFound { .. })),
            "{missing:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_mapped_range_names_its_file_and_offset_while_it_lives() {
        let dir = std::env::temp_dir().join(format!("picomq-mapped-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = MappedFiles::new(LocalFileSystem::new_with_prefix(&dir).unwrap());
        let body: Vec<u8> = (0..777_777u32).map(|i| (i * 7 % 251) as u8).collect();
        let key = Path::from("packs/p2");
        store.put(&key, body.clone().into()).await.unwrap();
        let read_at = |fd: RawFd, offset: u64, len: usize| {
            let mut buf = vec![0u8; len];
            // SAFETY: `buf` is writable for `len` bytes; `fd` is open while the
            // mapped bytes it came from live (the caller holds them).
            let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), len, offset as libc::off_t) };
            assert_eq!(n, len as isize);
            buf
        };
        let got = store.get_range(&key, 4097..700_001).await.unwrap();
        let (fd, offset) = source(&got).expect("a mapped range names its file");
        assert_eq!(offset, 4097);
        assert_eq!(read_at(fd, offset, 5000), &got[..5000]);
        // A slice inside it names its own offset.
        let inner = got.slice(123_456..200_000);
        let (fd2, offset2) = source(&inner).unwrap();
        assert_eq!((fd2, offset2), (fd, 4097 + 123_456));
        assert_eq!(read_at(fd2, offset2, inner.len()), &inner[..]);
        // Bytes that are not a mapping name nothing, nor do short ranges, which
        // are read, not mapped.
        assert!(is_mapped(&got) && is_mapped(&inner));
        let copied = Bytes::from(body[..100_000].to_vec());
        assert!(source(&copied).is_none() && !is_mapped(&copied));
        let short = store.get_range(&key, 0..10).await.unwrap();
        assert!(source(&short).is_none() && !is_mapped(&short));
        // Once the last slice drops, the mapping is no longer listed.
        let listed = |len: usize, offset: u64| {
            SOURCES
                .read()
                .unwrap()
                .values()
                .filter(|s| s.len == len && s.offset == offset)
                .count()
        };
        let len = 700_001 - 4096;
        assert_eq!(listed(len, 4096), 1);
        drop(got);
        assert_eq!(listed(len, 4096), 1, "a slice still holds it");
        drop(inner);
        assert_eq!(listed(len, 4096), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_local_directory_store_reads_its_files_through_mappings() {
        let dir = std::env::temp_dir().join(format!("picomq-mapped-dir-{}", std::process::id()));
        let store = crate::store::open_dir(&dir).unwrap();
        assert!(store.to_string().contains("data: Mapped("), "{store}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
