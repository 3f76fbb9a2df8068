//! What PicoMQ's tests share: fresh temp directories and ports, a real
//! S3-compatible server (in-process s3s-fs, one per test binary), polling with a
//! deadline, and servers: a node started in-process from the very flags `picomq
//! serve` takes ([`Server::start`]), or the real binary as a process where the test
//! needs a process boundary: `kill -9`, signals, logs, environment
//! ([`Server::start_process`]).
//!
//! `PICOMQ_TEST_STORE=s3` runs every server these helpers start (unless a test picks
//! its own `--store`) on the S3 test server instead of the local directory: CI runs
//! the suite both ways. Tests of the Postgres metadata store get a database each
//! from [`postgres`].

pub mod cli;
pub mod cluster;
pub mod postgres;
mod server;
pub mod tcp_cut;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use picomq_client::Client;
pub use server::{picomq_bin, start_refused, Refused, Server};

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("picomq-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind ephemeral port")
        .local_addr()
        .expect("addr")
        .port()
}

/// The S3 test server's bucket.
pub const S3_BUCKET: &str = "picomq-tests";

/// The S3 test server of this test binary (started at first use).
pub fn s3() -> &'static picomq_s3_test_server::S3Server {
    static S3: OnceLock<picomq_s3_test_server::S3Server> = OnceLock::new();
    S3.get_or_init(|| {
        remove_dead_processes_dirs("picomq-test-s3-");
        let root = std::env::temp_dir().join(format!("picomq-test-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("s3 root");
        picomq_s3_test_server::start_in_background(&root, &[S3_BUCKET])
            .expect("start the S3 test server")
    })
}

/// Removes the temp directories `PREFIX{pid}` of test processes that no longer run:
/// a static is never dropped, so the S3 test server's directory (a few hundred MB
/// after a suite) outlives its process. Linux only (`/proc/PID`).
fn remove_dead_processes_dirs(prefix: &str) {
    let (Ok(entries), true) = (
        std::fs::read_dir(std::env::temp_dir()),
        Path::new("/proc/self").exists(),
    ) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// An `s3://` URL for `prefix` of the test bucket, every setting in the query.
pub fn s3_url(prefix: &str) -> String {
    let s3 = s3();
    format!(
        "s3://{S3_BUCKET}/{prefix}?endpoint={}&region={}&access_key_id={}&secret_access_key={}&allow_http=true",
        s3.endpoint(),
        picomq_s3_test_server::REGION,
        picomq_s3_test_server::ACCESS_KEY,
        picomq_s3_test_server::SECRET_KEY,
    )
}

/// A fresh prefix of the test bucket, as an `s3://` URL.
pub fn fresh_s3_url(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    s3_url(&format!("{tag}-{}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// Whether `PICOMQ_TEST_STORE` asks for the S3 test server.
pub fn testing_on_s3() -> bool {
    match std::env::var("PICOMQ_TEST_STORE").as_deref() {
        Err(_) | Ok("") | Ok("local") => false,
        Ok("s3") => true,
        Ok(other) => panic!("PICOMQ_TEST_STORE={other:?}: expected \"s3\" or \"local\""),
    }
}

/// The store URL a server on `data_dir` uses: a prefix of the S3 test bucket named
/// after the data directory (so a restart on the same directory finds its data), or
/// the local directory under it.
pub fn store_url_for(data_dir: &Path) -> String {
    if testing_on_s3() {
        let name = data_dir
            .file_name()
            .expect("data dir name")
            .to_string_lossy();
        s3_url(&name)
    } else {
        format!("file://{}", data_dir.join("objects").display())
    }
}

/// Every key under a store URL's prefix, sorted.
pub async fn store_keys(store_url: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let store = picomq_engine::store::open(store_url).expect("open the test store");
    let mut keys: Vec<String> = store
        .list(None)
        .map_ok(|o| o.location.to_string())
        .try_collect()
        .await
        .expect("list the test store");
    keys.sort();
    keys
}

/// Polls `check` until it returns `Some`, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a whole stream from the beginning with catch-up reads.
pub async fn read_all(client: &Client, path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let r = client
            .get(&format!("{path}?offset={offset}"))
            .await
            .expect("read");
        assert_eq!(
            r.status.as_u16(),
            200,
            "read {path} at {offset}: {}",
            r.text()
        );
        out.extend_from_slice(&r.body);
        let next = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
        if r.header("stream-up-to-date") == Some("true") {
            return out;
        }
        assert_ne!(next, offset, "read made no progress");
        offset = next;
    }
}

/// A metric's value from /metrics (sum over label sets), or 0 if absent.
pub async fn metric(client: &Client, name: &str) -> f64 {
    metric_as(client, None, name).await
}

/// [`metric`] with a bearer token (`/metrics` needs the admin scope when auth is on).
pub async fn metric_as(client: &Client, token: Option<&str>, name: &str) -> f64 {
    let auth = token.map(bearer);
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let text = client
        .send(picomq_client::HttpMethod::GET, "/metrics", &headers, "")
        .await
        .expect("metrics")
        .text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A metric's value summed over the label sets whose labels contain `label`
/// (e.g. `op="get"`), or 0 if absent.
pub async fn metric_where(client: &Client, name: &str, label: &str) -> f64 {
    let text = client.get("/metrics").await.expect("metrics").text();
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Flags of a node that checkpoints and collects garbage every 100 ms and keeps no
/// tail cache (reads go to the store): what GC tests start.
pub const COLLECTING: &[&str] = &[
    "--checkpoint-interval",
    "100ms",
    "--gc-interval",
    "100ms",
    "--tail-cache-bytes",
    "0",
];

/// The bootstrap admin secret the auth tests start servers with.
pub const ADMIN_SECRET: &str = "test-admin-secret-0123456789abcdef0123456789abcdef";

/// Starts a server with `--auth required` and `ADMIN_SECRET` as its bootstrap token.
pub async fn start_with_auth(data_dir: &Path, extra: &[&str]) -> Server {
    start_with_auth_as(data_dir, extra, false).await
}

/// [`start_with_auth`], as a process or in-process.
pub async fn start_with_auth_as(data_dir: &Path, extra: &[&str], process: bool) -> Server {
    let file = data_dir.join("bootstrap-token");
    std::fs::write(&file, format!("{ADMIN_SECRET}\n")).expect("write bootstrap token");
    let mut args = vec![
        "--auth",
        "required",
        "--bootstrap-token-file",
        file.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    if process {
        Server::start_process(data_dir, &args).await
    } else {
        Server::start(data_dir, &args).await
    }
}

/// `Authorization: Bearer SECRET`.
pub fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// Issues a token through the API with `issuer`'s secret; returns (id, secret) or
/// panics with the server's answer.
pub async fn issue_token(
    client: &Client,
    issuer: &str,
    body: serde_json::Value,
) -> (String, String) {
    let auth = bearer(issuer);
    let r = client
        .send(
            picomq_client::HttpMethod::POST,
            "/__picomq/tokens",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            body.to_string(),
        )
        .await
        .expect("token request");
    assert_eq!(r.status.as_u16(), 201, "issuing {body}: {}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    (
        v["id"].as_str().expect("id").to_string(),
        v["token"].as_str().expect("token").to_string(),
    )
}
