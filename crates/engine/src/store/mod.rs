//! Object-store backends by URL. Everything durable goes through `object_store`;
//! this module only decides which backend a URL means and how it is configured.
//!
//! - `fault`: a fault-injecting wrapper for tests and benchmarks;
//! - `instrumented`: counts requests, bytes, latency and estimated cost per store;
//! - `local_log`: the local store's WAL objects, packed into preallocated log files;
//! - `routed`: sends WAL objects to their own store (`--wal-store`).

use std::path::Path;
use std::sync::{Arc, Once};
use std::time::Duration;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

pub use object_store::path::Path as ObjectPath;
pub use object_store::{
    Attribute, Attributes, Error as ObjectStoreError, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, UpdateVersion,
};

use crate::error::{EngineError, Result};

pub mod fault;
pub mod instrumented;
pub mod local_log;
pub mod mapped;
pub mod retrying;
pub mod routed;

/// A put hint (in `PutOptions::extensions`): run the write and its sync on the
/// calling thread rather than handing them to the blocking pool. The WAL writer sets
/// it for a commit of one small op with no other upload in flight (a lone append, or
/// one connection appending in sequence): there the pool's two thread hand-offs,
/// each a wake-up of a sleeping core on a VM, cost about as much as the sync itself
/// (docs/performance.md, "The lone append"). Blocking a runtime worker for one sync
/// is cheap only while the node is that quiet, hence the conditions. Stores that do
/// not write local files ignore it.
#[derive(Clone, Copy, Debug)]
pub struct WriteOnCaller;

/// Opens the object store named by `url`:
/// - `file:///abs/path`: a local directory; every write is fsynced (file and
///   directory) before it returns, so an acknowledged append survives power loss.
/// - `memory://`: in-process, for tests and demos; nothing survives a restart.
/// - `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]`:
///   cloud stores. Settings come from the standard environment variables (`AWS_*`,
///   `GOOGLE_*`, `AZURE_*`), overridden by URL query parameters named like
///   object_store's config keys, e.g.
///   `s3://b/p?endpoint=http://127.0.0.1:9000&region=auto&allow_http=true`.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>> {
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(EngineError::bad_request(format!(
                "store URL {url:?}: file:// needs an absolute path, e.g. file:///var/lib/picomq"
            )));
        }
        return open_dir(Path::new(path));
    }
    if url == "memory://" || url == "memory:" || url == "memory:///" {
        return Ok(Arc::new(InMemory::new()));
    }
    let scheme = url.split("://").next().unwrap_or(url);
    match scheme {
        "s3" | "gs" | "az" => open_cloud(url),
        _ => Err(EngineError::bad_request(format!(
            "store URL {url:?}: unsupported scheme {scheme:?} (supported: file:///path, memory://, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix)"
        ))),
    }
}

/// The store a URL names, without its settings or credentials: `scheme://bucket/prefix`
/// for cloud stores, the path for local ones. Stable across changes of endpoint or
/// keys, so a prefix's identity can record it and messages can show it.
pub fn name(url: &str) -> String {
    if url.starts_with("file://") || url.starts_with("memory:") {
        return url.trim_end_matches('/').to_string();
    }
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}/{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.path().trim_matches('/')
        )
        .trim_end_matches('/')
        .to_string(),
        Err(_) => url.split('?').next().unwrap_or(url).to_string(),
    }
}

/// Deletes the staging files a crashed process left in a `file://` store (the local
/// backend writes `KEY#N`, then links it to `KEY`; a crash in between leaves the
/// staging file, which no listing shows): the local form of an abandoned upload.
/// Only files older than `older_than` go, so a live process sharing the directory
/// keeps its uploads in progress. Other stores have none: PicoMQ writes every object
/// with one PUT, never a multipart upload. Returns the number of files deleted.
pub fn remove_abandoned_uploads(url: &str, older_than: Duration) -> std::io::Result<u64> {
    let Some(root) = url.strip_prefix("file://") else {
        return Ok(0);
    };
    let mut deleted = 0;
    walk_files(vec![std::path::PathBuf::from(root)], |entry| {
        let staging = entry.file_name().to_string_lossy().contains('#');
        let old = entry
            .metadata()?
            .modified()?
            .elapsed()
            .is_ok_and(|age| age >= older_than);
        if staging && old {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })?;
    Ok(deleted)
}

/// Calls `f` with every regular file under the directories `roots` (recursively;
/// a root or directory that does not exist, or vanishes meanwhile, is skipped).
fn walk_files(
    mut dirs: Vec<std::path::PathBuf>,
    mut f: impl FnMut(&std::fs::DirEntry) -> std::io::Result<()>,
) -> std::io::Result<()> {
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                f(&entry)?;
            }
        }
    }
    Ok(())
}

/// A durable local-directory store rooted at `dir` (created if missing): WAL keys
/// in log files under `dir/wal-log` (`local_log`), every other key a file.
pub fn open_dir(dir: &Path) -> Result<Arc<dyn ObjectStore>> {
    std::fs::create_dir_all(dir).map_err(|e| {
        EngineError::Unavailable(format!(
            "cannot create store directory {}: {e}",
            dir.display()
        ))
    })?;
    let files = || -> Result<LocalFileSystem> {
        Ok(LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| EngineError::Unavailable(format!("cannot open {}: {e}", dir.display())))?
            .with_fsync(true))
    };
    let log = local_log::LocalLogStore::open(
        &dir.join(crate::layout::LOCAL_LOG_DIR),
        Arc::new(files()?),
        dir,
    )
    .map_err(|e| {
        EngineError::Unavailable(format!("cannot open the WAL log in {}: {e}", dir.display()))
    })?;
    // Packs and the other files are read by mapping their ranges; the WAL log's
    // files are reused, so they are not (`mapped`).
    let data: Arc<dyn ObjectStore> = Arc::new(mapped::MappedFiles::new(files()?));
    Ok(Arc::new(routed::RoutedStore::new(data, Arc::new(log))))
}

/// What a reader of files in this store needs to know besides credentials, as
/// Iceberg FileIO properties (`s3.endpoint`, `s3.region`, path-style access):
/// what the Iceberg catalog hands out. Never keys: readers bring their own.
pub fn reader_settings(raw: &str) -> std::collections::BTreeMap<String, String> {
    use object_store::aws::AmazonS3ConfigKey;
    let mut out = std::collections::BTreeMap::new();
    let Ok(url) = url::Url::parse(raw) else {
        return out;
    };
    if url.scheme() != "s3" {
        return out;
    }
    let (mut endpoint, mut region, mut virtual_hosted) = (None, None, None);
    for (k, v) in env_pairs("AWS_").into_iter().chain(query_pairs(&url)) {
        match k.parse::<AmazonS3ConfigKey>() {
            Ok(AmazonS3ConfigKey::Endpoint) => endpoint = Some(v),
            Ok(AmazonS3ConfigKey::Region) => region = Some(v),
            Ok(AmazonS3ConfigKey::VirtualHostedStyleRequest) => virtual_hosted = Some(v),
            _ => {}
        }
    }
    // Without a region readers look the bucket's up at AWS.
    out.insert(
        "s3.region".into(),
        region.unwrap_or_else(|| "us-east-1".into()),
    );
    if let Some(e) = endpoint {
        out.insert("s3.endpoint".into(), e);
        // A custom endpoint is path-style unless told otherwise.
        let path_style = virtual_hosted.is_none_or(|v| !v.eq_ignore_ascii_case("true"));
        out.insert("s3.path-style-access".into(), path_style.to_string());
    }
    out
}

/// The client's own retries stay short: the WAL retries a failing upload forever
/// (with its own backoff and store-down detection), and a read should fail in
/// seconds, not minutes, when the store is down.
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(30))
}

/// `(key, value)` pairs of the URL's query string, percent-decoded.
fn query_pairs(url: &url::Url) -> Vec<(String, String)> {
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Environment variables starting with `prefix`, as lowercase config keys.
fn env_pairs(prefix: &str) -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

fn open_cloud(raw: &str) -> Result<Arc<dyn ObjectStore>> {
    install_tls_provider();
    let bad = |msg: String| EngineError::bad_request(format!("store URL {raw:?}: {msg}"));
    let url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
    let bucket = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("missing bucket name (e.g. s3://my-bucket/prefix)".into()))?;
    let prefix = url.path().trim_matches('/').to_string();
    let base = format!("{}://{bucket}", url.scheme());
    let query = query_pairs(&url);
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut b = AmazonS3Builder::new()
                .with_client_options(client_options())
                .with_retry(retry_config());
            let mut payload_signing_set = false;
            for (k, v) in env_pairs("AWS_") {
                // Unknown AWS_* variables (AWS_PROFILE, ...) are not ours to reject.
                if let Ok(key) = k.parse::<AmazonS3ConfigKey>() {
                    payload_signing_set |= key == AmazonS3ConfigKey::UnsignedPayload;
                    b = b.with_config(key, v);
                }
            }
            for (k, v) in query {
                let key = k
                    .parse::<AmazonS3ConfigKey>()
                    .map_err(|_| bad(format!("unknown S3 option {k:?} in the query string")))?;
                payload_signing_set |= key == AmazonS3ConfigKey::UnsignedPayload;
                b = b.with_config(key, v);
            }
            if !payload_signing_set && unsigned_payload_by_default(&b) {
                b = b.with_config(AmazonS3ConfigKey::UnsignedPayload, "true");
            }
            Arc::new(b.with_url(base).build().map_err(|e| bad(e.to_string()))?)
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let mut b = GoogleCloudStorageBuilder::new()
                .with_client_options(client_options())
                .with_retry(retry_config());
            for (k, v) in env_pairs("GOOGLE_") {
                if let Ok(key) = k.parse::<GoogleConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
            for (k, v) in query {
                let key = k
                    .parse::<GoogleConfigKey>()
                    .map_err(|_| bad(format!("unknown GCS option {k:?} in the query string")))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.with_url(base).build().map_err(|e| bad(e.to_string()))?)
        }
        _ => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut b = MicrosoftAzureBuilder::new()
                .with_client_options(client_options())
                .with_retry(retry_config());
            for (k, v) in env_pairs("AZURE_") {
                if let Ok(key) = k.parse::<AzureConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
            for (k, v) in query {
                let key = k
                    .parse::<AzureConfigKey>()
                    .map_err(|_| bad(format!("unknown Azure option {k:?} in the query string")))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.with_url(base).build().map_err(|e| bad(e.to_string()))?)
        }
    };
    if prefix.is_empty() {
        return Ok(store);
    }
    let prefix = object_store::path::Path::parse(&prefix)
        .map_err(|e| bad(format!("bad prefix {prefix:?}: {e}")))?;
    Ok(Arc::new(PrefixStore::new(store, prefix)))
}

/// Whether S3 requests leave the body out of their signature (`UNSIGNED-PAYLOAD`)
/// when the operator did not say (`AWS_UNSIGNED_PAYLOAD`, `?unsigned_payload=`).
/// Signing the body means a SHA-256 of every byte written: 16% of the server's
/// CPU while a Kafka producer streamed 1 KiB records (docs/object-storage.md).
/// Over TLS, which already protects the body in transit, it buys nothing, so
/// requests to an `https` endpoint (AWS's own included) skip it; over plain HTTP
/// the signature is the body's only protection against a change on the way, so
/// it stays. (Every chunk also carries its own CRC32C, checked on every read.)
fn unsigned_payload_by_default(b: &object_store::aws::AmazonS3Builder) -> bool {
    use object_store::aws::AmazonS3ConfigKey;
    b.get_config_value(&AmazonS3ConfigKey::Endpoint)
        .is_none_or(|e| e.trim().to_ascii_lowercase().starts_with("https://"))
}

/// reqwest is built with rustls but no bundled crypto provider (to avoid building
/// aws-lc); install ring's, once per process.
fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_schemes_and_options() {
        assert!(open("ftp://x").is_err());
        assert!(open("file://relative").is_err());
        let err = open("s3://bucket/p?no_such_option=1").err().unwrap();
        assert!(err.to_string().contains("no_such_option"), "{err}");
        assert!(open("s3:///prefix-without-bucket").is_err());
    }

    #[test]
    fn abandoned_local_uploads_are_removed_once_old() {
        let root = std::env::temp_dir().join(format!("picomq-staging-{}", std::process::id()));
        let dir = root.join("wal/0000000001");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["000000000001.wal", "000000000002.wal#1"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let url = format!("file://{}", root.display());
        // Too young: kept (a live process may be writing it).
        assert_eq!(
            remove_abandoned_uploads(&url, Duration::from_secs(3600)).unwrap(),
            0
        );
        assert_eq!(remove_abandoned_uploads(&url, Duration::ZERO).unwrap(), 1);
        assert!(dir.join("000000000001.wal").exists());
        assert!(!dir.join("000000000002.wal#1").exists());
        assert_eq!(
            remove_abandoned_uploads("memory://", Duration::ZERO).unwrap(),
            0
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The `x-amz-content-sha256` header of one PUT through `open(url)`, as a
    /// plain-HTTP server at `{port}` in the URL receives it.
    async fn payload_hash_header(url: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let store = open(&url.replace("{port}", &port.to_string())).unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            sock.write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        store
            .put(
                &object_store::path::Path::from("k"),
                b"body".to_vec().into(),
            )
            .await
            .unwrap();
        let head = server.await.unwrap();
        head.lines()
            .find_map(|l| l.strip_prefix("x-amz-content-sha256:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn s3_bodies_are_signed_over_plain_http_unless_told_otherwise() {
        let base = "s3://b?endpoint=http://127.0.0.1:{port}&region=r&allow_http=true&access_key_id=a&secret_access_key=s";
        // The SHA-256 of "body".
        let signed = "230d8358dc8e8890b4c58deeb62912ee2f20357ae92a5cc861b98e68fe31acb5";
        assert_eq!(payload_hash_header(base).await, signed);
        assert_eq!(
            payload_hash_header(&format!("{base}&unsigned_payload=true")).await,
            "unsigned-payload"
        );
    }

    #[test]
    fn s3_bodies_are_unsigned_over_tls_by_default() {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        let with = |e: &str| AmazonS3Builder::new().with_config(AmazonS3ConfigKey::Endpoint, e);
        assert!(unsigned_payload_by_default(&AmazonS3Builder::new()));
        assert!(unsigned_payload_by_default(&with(
            "https://minio.internal:9000"
        )));
        assert!(unsigned_payload_by_default(&with("HTTPS://S3.example")));
        assert!(!unsigned_payload_by_default(&with("http://127.0.0.1:9000")));
    }

    #[test]
    fn opens_s3_with_query_options() {
        let store = open(
            "s3://bucket/some/prefix?endpoint=http://127.0.0.1:1&region=us-east-1&allow_http=true&access_key_id=a&secret_access_key=b",
        )
        .unwrap();
        assert!(store.to_string().contains("some/prefix"), "{store}");
        let store = open("s3://bucket?endpoint=http://127.0.0.1:1&region=r").unwrap();
        assert!(store.to_string().contains("bucket"), "{store}");
    }
}
