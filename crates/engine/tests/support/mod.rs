//! Shared helpers for the engine's integration tests: a real S3-compatible server
//! (in-process, one per test binary), stores on it, engines over them, and readers
//! that return a whole stream.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use picomq_engine::meta::Meta;
use picomq_engine::store::{self, ObjectStore};
use picomq_engine::{AppendRequest, Engine, EngineConfig, EngineError, Offset};
use picomq_s3_test_server::{S3Server, ACCESS_KEY, REGION, SECRET_KEY};

pub const BUCKET: &str = "engine-tests";

fn server() -> &'static S3Server {
    static SERVER: OnceLock<S3Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("picomq-engine-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("s3 root");
        picomq_s3_test_server::start_in_background(&root, &[BUCKET]).expect("start s3 server")
    })
}

/// An `s3://` URL for a fresh prefix of the test bucket, all settings in the query.
pub fn s3_url(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "s3://{BUCKET}/{tag}-{n}?endpoint={}&region={REGION}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}&allow_http=true",
        server().endpoint()
    )
}

/// A store on a fresh prefix of the S3 test server.
pub fn s3_store(tag: &str) -> Arc<dyn ObjectStore> {
    store::open(&s3_url(tag)).expect("open s3 store")
}

pub async fn open_engine(config: EngineConfig, store: Arc<dyn ObjectStore>) -> Engine {
    let meta = Meta::open("sqlite::memory:").await.expect("meta");
    Engine::open(config, store, meta)
        .await
        .expect("open engine")
}

pub fn fast_config() -> EngineConfig {
    let mut c = EngineConfig::default();
    c.wal.store_down_after = Duration::from_millis(500);
    c.wal.retry_backoff_max = Duration::from_millis(100);
    c.append_timeout = Duration::from_secs(10);
    c.fence_check_interval = None;
    c
}

pub async fn create(engine: &Engine, name: &str, content_type: &str) {
    engine
        .create(picomq_engine::CreateRequest {
            name: name.into(),
            content_type: Some(content_type.into()),
            ..Default::default()
        })
        .await
        .expect("create");
}

pub fn append_req(name: &str, body: impl Into<bytes::Bytes>) -> AppendRequest {
    AppendRequest {
        name: name.into(),
        content_type: Some("text/plain".into()),
        body: body.into(),
        ..Default::default()
    }
}

/// The whole stream, read in chunks of at most `chunk` bytes.
pub async fn read_all(engine: &Engine, name: &str, chunk: usize) -> Result<Vec<u8>, EngineError> {
    let stream = engine.stream(name).await?;
    let mut out = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let r = engine.read(&stream, from, chunk).await?;
        for s in &r.segments {
            out.extend_from_slice(s);
        }
        assert!(r.next >= from, "read went backwards");
        if r.up_to_date {
            return Ok(out);
        }
        assert!(r.next > from, "read made no progress");
        from = r.next;
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
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
