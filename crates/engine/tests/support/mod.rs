//! Helpers for the engine's integration tests: stores on the shared S3 test server
//! (`picomq-testkit`), engines over them, and readers that return a whole stream.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use picomq_engine::meta::Meta;
use picomq_engine::store::{self, ObjectStore};
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, Engine, EngineConfig, EngineError, Offset,
    StreamName,
};

/// An `s3://` URL for a fresh prefix of the shared S3 test server's bucket.
pub fn s3_url(tag: &str) -> String {
    picomq_testkit::fresh_s3_url(tag)
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

/// `name` as the engine takes it.
pub fn name(name: &str) -> StreamName {
    StreamName::new(name, 1024).expect("a valid stream name")
}

fn content_type(ct: &str) -> ContentType {
    ContentType::new(ct, 256)
        .expect("a valid content type")
        .expect("not empty")
}

pub async fn create(engine: &Engine, stream: &str, ct: &str) {
    let mut req = CreateRequest::new(name(stream));
    req.content_type = Some(content_type(ct));
    engine.create(req).await.expect("create");
}

pub fn append_req(stream: &str, body: impl Into<bytes::Bytes>) -> AppendRequest {
    AppendRequest::new(name(stream), Some(content_type("text/plain")), body.into())
}

/// The whole stream, read in chunks of at most `chunk` bytes.
pub async fn read_all(engine: &Engine, name: &str, chunk: usize) -> Result<Vec<u8>, EngineError> {
    let stream = engine.stream(&self::name(name)).await?;
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

#[allow(unused_imports)]
pub use picomq_testkit::eventually;
