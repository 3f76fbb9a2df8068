//! Shared helpers for integration tests: start the real `picomq` binary on an
//! ephemeral port with its own data directory, wait until it is ready, kill it
//! (SIGKILL or SIGTERM) and start it again on the same data.
//!
//! `PICOMQ_TEST_STORE=s3` runs every server these helpers start (unless a test picks
//! its own `--store`) on a real S3-compatible server, the in-process s3s-fs test
//! server, instead of the local directory: CI runs the suite both ways.
#![allow(dead_code)]

pub mod cli;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use picomq_client::Client;

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

const S3_BUCKET: &str = "picomq-tests";

/// The test store chosen by `PICOMQ_TEST_STORE`: `None` = the local directory.
fn test_s3() -> Option<&'static picomq_s3_test_server::S3Server> {
    static S3: OnceLock<Option<picomq_s3_test_server::S3Server>> = OnceLock::new();
    S3.get_or_init(|| match std::env::var("PICOMQ_TEST_STORE").as_deref() {
        Err(_) | Ok("") | Ok("local") => None,
        Ok("s3") => {
            let root = std::env::temp_dir().join(format!("picomq-test-s3-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).expect("s3 root");
            Some(
                picomq_s3_test_server::start_in_background(&root, &[S3_BUCKET])
                    .expect("start the S3 test server"),
            )
        }
        Ok(other) => panic!("PICOMQ_TEST_STORE={other:?}: expected \"s3\" or \"local\""),
    })
    .as_ref()
}

/// The store URL a server on `data_dir` uses: a prefix of the S3 test bucket named
/// after the data directory (so a restart on the same directory finds its data), or
/// the local directory under it.
pub fn store_url_for(data_dir: &Path) -> String {
    match test_s3() {
        Some(s3) => format!(
            "s3://{S3_BUCKET}/{}?endpoint={}&region={}&access_key_id={}&secret_access_key={}&allow_http=true",
            data_dir.file_name().expect("data dir name").to_string_lossy(),
            s3.endpoint(),
            picomq_s3_test_server::REGION,
            picomq_s3_test_server::ACCESS_KEY,
            picomq_s3_test_server::SECRET_KEY,
        ),
        None => format!("file://{}", data_dir.join("objects").display()),
    }
}

pub struct Server {
    pub port: u16,
    pub url: String,
    pub client: Client,
    pub data_dir: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
}

/// `extra`, preceded by `--store` for the test store unless `extra` names one.
fn store_args(data_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = Vec::new();
    let own_store = extra
        .iter()
        .any(|a| *a == "--store" || a.starts_with("--store="));
    if !own_store && test_s3().is_some() {
        args.extend(["--store".to_string(), store_url_for(data_dir)]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

impl Server {
    /// The store this server writes to (an `s3://` or `file://` URL).
    pub fn store_url(&self) -> String {
        let mut args = self.args.iter();
        while let Some(a) = args.next() {
            if a == "--store" {
                return args.next().expect("--store value").clone();
            }
            if let Some(url) = a.strip_prefix("--store=") {
                return url.to_string();
            }
        }
        store_url_for(&self.data_dir)
    }

    /// Objects in this server's store under `prefix` whose key ends with `suffix`.
    pub async fn count_objects(&self, prefix: &str, suffix: &str) -> usize {
        use futures::TryStreamExt;
        use picomq_engine::store::ObjectPath;
        let store = picomq_engine::store::open(&self.store_url()).expect("open the test store");
        let keys: Vec<ObjectPath> = store
            .list(Some(&ObjectPath::from(prefix)))
            .map_ok(|o| o.location)
            .try_collect()
            .await
            .expect("list the test store");
        keys.iter().filter(|k| k.as_ref().ends_with(suffix)).count()
    }

    /// Starts `picomq serve` on a free port with `data_dir` and extra flags, and
    /// waits until it answers /readyz.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_env(data_dir, extra, &[]).await
    }

    /// [`Server::start`] with extra environment variables for the process.
    pub async fn start_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut server = Server {
            port,
            client: Client::new(&url),
            url,
            data_dir: data_dir.to_path_buf(),
            args: store_args(data_dir, extra),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            log: data_dir.join(format!("server-{port}.log")),
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open server log");
        let child = Command::new(env!("CARGO_BIN_EXE_picomq"))
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .env("PICOMQ_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn picomq");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(30)).await;
    }

    pub async fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            // Each probe is bounded: one CI run hung here for minutes with no socket
            // open to the server (cause not found; it never reproduced in 23 runs).
            let probe = tokio::time::timeout(Duration::from_secs(2), self.client.get("/readyz"));
            if let Ok(Ok(r)) = probe.await {
                if r.status.as_u16() == 200 {
                    return;
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "picomq exited during start-up ({status}); log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "picomq not ready within {limit:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// Waits (bounded) for a process that is meant to die on its own (a crash
    /// point) to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        self.reap(limit, "")
    }

    /// Waits up to `limit` for the process to exit (`after` says after what, for
    /// the panic message).
    fn reap(&mut self, limit: Duration, after: &str) -> ExitStatus {
        let mut child = self.child.take().expect("server running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "picomq did not exit within {limit:?}{after}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait (bounded) for the process to exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        self.reap(limit, " of SIGTERM")
    }

    /// Starts the server again on the same port and data directory.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
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
    let file = data_dir.join("bootstrap-token");
    std::fs::write(&file, format!("{ADMIN_SECRET}\n")).expect("write bootstrap token");
    let mut args = vec![
        "--auth",
        "required",
        "--bootstrap-token-file",
        file.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    Server::start(data_dir, &args).await
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
