//! An S3-compatible server for tests and CI: the `s3s` protocol layer over the
//! `s3s-fs` directory backend, with two fixes that make it trustworthy for PicoMQ:
//!
//! - conditional PUTs (`If-None-Match: *`, `If-Match`) are atomic: s3s-fs checks and
//!   then writes, so two racing create-only PUTs could both succeed; here every PUT
//!   holds a per-key lock across check and write;
//! - accepted sockets get TCP_NODELAY (otherwise Nagle + delayed ACKs add ~40 ms);
//! - a plain PUT whose body is signed (`x-amz-content-sha256` carries its SHA-256,
//!   which s3s verifies as the body streams in) takes its ETag from that digest
//!   instead of computing an MD5 of the body, as s3s-fs does: on one machine the
//!   store's MD5 was 0.42 s of its 0.76 s of CPU while a Kafka producer wrote 200 MB,
//!   CPU that a real object store spends on its own machines (S3's ETag is opaque
//!   to clients: "may or may not be an MD5 digest"). Such a PUT is written in
//!   s3s-fs's layout, so every other call reads it as its own;
//! - a listing without a delimiter walks only the directory its prefix names, not
//!   the whole bucket for every page (s3s-fs's way, which makes a LIST of a few keys
//!   take seconds once a bucket holds 100,000 objects; S3's cost follows the keys
//!   returned).
//!
//! It can also be switched "down" (every request answers 503), to test outages
//! against a real HTTP object store. It is not a mock: object_store's S3 client
//! talks to it over HTTP with SigV4, exactly as it talks to AWS.

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

/// Credentials the server accepts (any SigV4 signature with this key pair).
pub const ACCESS_KEY: &str = "picomq-test";
pub const SECRET_KEY: &str = "picomq-test-secret";
pub const REGION: &str = "us-east-1";

const LOCK_STRIPES: usize = 256;

/// Switches shared between a running server and its owner.
#[derive(Default, Debug)]
pub struct Control {
    down: AtomicBool,
    pub requests: AtomicU64,
}

impl Control {
    /// While down, every request answers 503 ServiceUnavailable.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
    fn check(&self) -> S3Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::SeqCst) {
            return Err(s3_error!(ServiceUnavailable, "test server switched down"));
        }
        Ok(())
    }
}

struct AtomicFs {
    fs: s3s_fs::FileSystem,
    /// The directory holding one subdirectory per bucket.
    root: PathBuf,
    stripes: Vec<Mutex<()>>,
    hasher: std::collections::hash_map::RandomState,
    control: Arc<Control>,
    tmp_counter: AtomicU64,
}

impl AtomicFs {
    fn stripe(&self, bucket: &str, key: &str) -> &Mutex<()> {
        &self.stripes[self.hasher.hash_one((bucket, key)) as usize % LOCK_STRIPES]
    }
}

/// The ETag of a PUT whose body is signed: the first 128 bits of the SHA-256 that
/// `x-amz-content-sha256` names (s3s fails the body's stream unless the bytes have
/// that digest), like MD5 a digest of the content.
fn signed_digest_e_tag(req: &S3Request<PutObjectInput>) -> Option<String> {
    let digest = req.headers.get("x-amz-content-sha256")?.to_str().ok()?;
    (digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| digest[..32].to_ascii_lowercase())
}

/// s3s-fs's record of an object's standard attributes (`fs.rs`, `ObjectAttributes`,
/// s3s-fs 0.14.1), written beside every object.
#[derive(serde::Serialize)]
struct ObjectAttributes<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    user_metadata: Option<&'a Metadata>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_encoding: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_disposition: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_language: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    website_redirect_location: Option<&'a str>,
}

impl AtomicFs {
    /// Where a PUT goes if it is one this server writes itself: nothing but a body
    /// and the attributes s3s-fs keeps (no checksum to check, no Content-MD5, no
    /// expiry, no storage class, no directory key) under a key that stays inside
    /// its bucket. Anything else goes to s3s-fs.
    fn plain_put_path(&self, input: &PutObjectInput) -> Option<PathBuf> {
        let plain = input.content_md5.is_none()
            && input.checksum_algorithm.is_none()
            && input.checksum_crc32.is_none()
            && input.checksum_crc32c.is_none()
            && input.checksum_crc64nvme.is_none()
            && input.checksum_sha1.is_none()
            && input.checksum_sha256.is_none()
            && input.storage_class.is_none()
            && input.expires.is_none()
            && !input.key.is_empty()
            && !input.key.ends_with('/');
        let bucket = Path::new(&input.bucket);
        let key = Path::new(&input.key);
        let normal = |p: &Path| {
            p.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        };
        (plain && normal(bucket) && normal(key) && !input.bucket.starts_with('.'))
            .then(|| self.root.join(bucket).join(key))
    }

    /// s3s-fs's name for a file beside the objects (`fs.rs`, s3s-fs 0.14.1).
    fn side_path(&self, bucket: &str, key: &str, what: &str) -> PathBuf {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        self.root.join(format!(
            ".bucket-{}.object-{}.{what}.json",
            b64(bucket),
            b64(key)
        ))
    }

    /// Writes `bytes` to `path` through a temporary file and a rename, as s3s-fs
    /// does (its start-up removes temporary files left by a crash).
    async fn write_atomically(&self, path: &Path, bytes: &[u8]) -> S3Result<()> {
        let tmp = self.tmp_path();
        let done = async {
            tokio::fs::write(&tmp, bytes).await?;
            tokio::fs::rename(&tmp, path).await
        };
        if let Err(e) = done.await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(s3_error!(InternalError, "writing {}: {e}", path.display()));
        }
        Ok(())
    }

    fn tmp_path(&self) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!(".tmp.picomq-{n}.internal.part"))
    }

    async fn put_plain(
        &self,
        input: PutObjectInput,
        path: PathBuf,
        e_tag: String,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        use futures::StreamExt as _;
        use tokio::io::AsyncWriteExt as _;
        let bucket_dir = self.root.join(&input.bucket);
        if !tokio::fs::metadata(&bucket_dir)
            .await
            .is_ok_and(|m| m.is_dir())
        {
            return Err(s3_error!(NoSuchBucket));
        }
        let info_path = self.side_path(&input.bucket, &input.key, "internal");
        let exists = tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_file());
        if input.if_none_match.as_ref().is_some_and(|c| c.is_any()) && exists {
            return Err(s3_error!(PreconditionFailed, "Object already exists"));
        }
        if let Some(condition) = &input.if_match {
            if !exists {
                return Err(s3_error!(PreconditionFailed, "Object does not exist"));
            }
            if let ETagCondition::ETag(expected) = condition {
                let current = match tokio::fs::read(&info_path).await {
                    Ok(info) => serde_json::from_slice::<serde_json::Value>(&info)
                        .ok()
                        .and_then(|v| v.get("e_tag")?.as_str().map(str::to_string)),
                    Err(_) => None,
                };
                // An object written before without a recorded ETag: s3s-fs knows
                // how to work it out.
                let Some(current) = current else {
                    return Err(s3_error!(
                        PreconditionFailed,
                        "no ETag recorded for the object"
                    ));
                };
                if !ETag::Strong(current).strong_cmp(expected) {
                    return Err(s3_error!(PreconditionFailed, "ETag does not match"));
                }
            }
        }
        let Some(mut body) = input.body else {
            return Err(s3_error!(IncompleteBody));
        };
        let tmp = self.tmp_path();
        let written = async {
            let file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| s3_error!(InternalError, "writing the object: {e}"))?;
            let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
            while let Some(chunk) = body.next().await {
                // A body whose bytes do not match its signed digest fails here.
                let chunk = chunk.map_err(|e| {
                    if e.to_string().contains("Sha256Mismatch") {
                        s3_error!(BadDigest, "the body does not match x-amz-content-sha256")
                    } else {
                        s3_error!(IncompleteBody, "the body did not arrive whole: {e}")
                    }
                })?;
                out.write_all(&chunk)
                    .await
                    .map_err(|e| s3_error!(InternalError, "writing the object: {e}"))?;
            }
            let placed = async {
                out.flush().await?;
                if let Some(dir) = path.parent() {
                    tokio::fs::create_dir_all(dir).await?;
                }
                tokio::fs::rename(&tmp, &path).await
            };
            placed
                .await
                .map_err(|e| s3_error!(InternalError, "writing the object: {e}"))
        };
        if let Err(e) = written.await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        let attributes = ObjectAttributes {
            user_metadata: input.metadata.as_ref(),
            content_encoding: input.content_encoding.as_deref(),
            content_type: input.content_type.as_deref(),
            content_disposition: input.content_disposition.as_deref(),
            content_language: input.content_language.as_deref(),
            cache_control: input.cache_control.as_deref(),
            website_redirect_location: input.website_redirect_location.as_deref(),
        };
        let attributes = serde_json::to_vec(&attributes)
            .map_err(|e| s3_error!(InternalError, "object attributes: {e}"))?;
        let metadata_path = self.side_path(&input.bucket, &input.key, "metadata");
        self.write_atomically(&metadata_path, &attributes).await?;
        let info = serde_json::to_vec(&serde_json::json!({ "e_tag": e_tag }))
            .map_err(|e| s3_error!(InternalError, "object info: {e}"))?;
        self.write_atomically(&info_path, &info).await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(e_tag)),
            ..Default::default()
        }))
    }
}

#[async_trait::async_trait]
impl S3 for AtomicFs {
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.control.check()?;
        let _guard = self.stripe(&req.input.bucket, &req.input.key).lock().await;
        if let Some(e_tag) = signed_digest_e_tag(&req) {
            if let Some(path) = self.plain_put_path(&req.input) {
                return self.put_plain(req.input, path, e_tag).await;
            }
        }
        self.fs.put_object(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.control.check()?;
        let _guard = self.stripe(&req.input.bucket, &req.input.key).lock().await;
        self.fs.delete_object(req).await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.control.check()?;
        self.fs.create_bucket(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.control.check()?;
        self.fs.head_bucket(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.control.check()?;
        self.fs.list_buckets(req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.control.check()?;
        self.fs.get_bucket_location(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.control.check()?;
        self.fs.get_object(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.control.check()?;
        self.fs.head_object(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.control.check()?;
        self.fs.list_objects(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.control.check()?;
        if req.input.delimiter.is_some() {
            return self.fs.list_objects_v2(req).await;
        }
        let input = req.input;
        let bucket_dir = self.root.join(&input.bucket);
        if input.bucket.contains(['/', '\\'])
            || input.bucket.starts_with('.')
            || !bucket_dir.is_dir()
        {
            return Err(s3_error!(NoSuchBucket));
        }
        let prefix = input.prefix.clone().unwrap_or_default();
        let after = match (input.continuation_token.clone(), input.start_after.clone()) {
            (Some(c), Some(a)) => Some(c.max(a)),
            (c, a) => c.or(a),
        };
        let max_keys = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let walk_prefix = prefix.clone();
        let listed = tokio::task::spawn_blocking(move || list_keys(&bucket_dir, &walk_prefix))
            .await
            .map_err(|e| s3_error!(InternalError, "listing: {e}"))?
            .map_err(|e| s3_error!(InternalError, "listing: {e}"))?;
        let mut contents: Vec<Object> = listed
            .into_iter()
            .filter(|(key, _, _)| after.as_ref().is_none_or(|a| key > a))
            .take(max_keys + 1)
            .map(|(key, size, modified)| Object {
                key: Some(key),
                size: Some(size as i64),
                last_modified: Some(Timestamp::from(modified)),
                ..Default::default()
            })
            .collect();
        let truncated = contents.len() > max_keys;
        contents.truncate(max_keys);
        let next = truncated
            .then(|| contents.last().and_then(|o| o.key.clone()))
            .flatten();
        Ok(S3Response::new(ListObjectsV2Output {
            key_count: Some(contents.len() as i32),
            contents: Some(contents),
            name: Some(input.bucket),
            prefix: input.prefix,
            max_keys: Some(max_keys as i32),
            is_truncated: Some(truncated),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            start_after: input.start_after,
            ..Default::default()
        }))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.control.check()?;
        self.fs.delete_objects(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.control.check()?;
        self.fs.copy_object(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.control.check()?;
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.control.check()?;
        self.fs.upload_part(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.control.check()?;
        self.fs.complete_multipart_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.control.check()?;
        self.fs.abort_multipart_upload(req).await
    }
}

/// A running server.
pub struct S3Server {
    pub addr: SocketAddr,
    pub root: PathBuf,
    pub control: Arc<Control>,
}

impl S3Server {
    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Environment for an S3 client of this server (`AWS_*` variables).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }
}

/// Serves buckets from subdirectories of `root`, creating `buckets` up front, on
/// `listener`. Runs until the runtime it was spawned on stops.
pub async fn start(
    listener: TcpListener,
    root: &Path,
    buckets: &[&str],
) -> std::io::Result<S3Server> {
    for bucket in buckets {
        std::fs::create_dir_all(root.join(bucket))?;
    }
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    let control = Arc::new(Control::default());
    let store = AtomicFs {
        fs,
        root: root.canonicalize()?,
        stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
        hasher: Default::default(),
        control: control.clone(),
        tmp_counter: AtomicU64::new(0),
    };
    let service = {
        let mut b = S3ServiceBuilder::new(store);
        b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        b.build()
    };
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let _ = socket.set_nodelay(true);
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    Ok(S3Server {
        addr,
        root: root.to_path_buf(),
        control,
    })
}

/// Starts a server on its own thread and runtime (so it outlives any one test's
/// runtime), on an ephemeral loopback port.
pub fn start_in_background(root: &Path, buckets: &[&str]) -> std::io::Result<S3Server> {
    let root = root.to_path_buf();
    let buckets: Vec<String> = buckets.iter().map(|b| b.to_string()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("s3-test-server".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("s3 test server runtime");
            runtime.block_on(async move {
                let started = async {
                    let listener = TcpListener::bind("127.0.0.1:0").await?;
                    let names: Vec<&str> = buckets.iter().map(String::as_str).collect();
                    start(listener, &root, &names).await
                };
                let _ = tx.send(started.await);
                std::future::pending::<()>().await;
            });
        })?;
    rx.recv()
        .map_err(|_| std::io::Error::other("s3 test server thread died"))?
}

/// The objects of the bucket in `bucket_dir` whose keys start with `prefix`, sorted
/// by key: (key, size, modified). Only the directory the prefix names (up to its
/// last `/`) is walked.
fn list_keys(
    bucket_dir: &Path,
    prefix: &str,
) -> std::io::Result<Vec<(String, u64, std::time::SystemTime)>> {
    let (dir, base) = match prefix.rsplit_once('/') {
        Some((dir, _)) => (bucket_dir.join(dir), format!("{dir}/")),
        None => (bucket_dir.to_path_buf(), String::new()),
    };
    let mut out = Vec::new();
    let mut queue = vec![(dir, base)];
    while let Some((dir, key_base)) = queue.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let key = format!("{key_base}{name}");
            let kind = entry.file_type()?;
            if kind.is_dir() {
                // Only directories that can hold keys under the prefix.
                let dir_key = format!("{key}/");
                if dir_key.starts_with(prefix) || prefix.starts_with(&dir_key) {
                    queue.push((entry.path(), dir_key));
                }
            } else if kind.is_file() && key.starts_with(prefix) {
                let meta = entry.metadata()?;
                out.push((key, meta.len(), meta.modified()?));
            }
        }
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
