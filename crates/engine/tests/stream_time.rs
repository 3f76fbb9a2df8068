//! Time as the engine sees it, on a manual clock that the test moves instead of
//! sleeping: sliding TTLs count from the last access, Expires-At is absolute, and a
//! HEAD does not slide a TTL.

mod support;

use std::time::Duration;

use picomq_engine::{Clock, CreateRequest, EngineError, OffsetQuery};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_and_expiry_follow_the_engines_clock() {
    let (clock, hand) = Clock::manual(1_900_000_000_000);
    let mut config = fast_config();
    config.clock = clock;
    let engine = open_engine(config, picomq_engine::store::open("memory://").unwrap()).await;

    let mut ttl = CreateRequest::new(name("ttl"));
    ttl.ttl_secs = Some(60);
    engine.create(ttl).await.unwrap();
    let mut at = CreateRequest::new(name("at"));
    at.expires_at = Some("2030-03-17T17:47:00Z".into()); // 1,900,000,020,000 ms
    engine.create(at).await.unwrap();

    // An access at 50 s slides the TTL; a HEAD does not.
    hand.advance(Duration::from_secs(50));
    let s = engine.stream(&name("ttl")).await.unwrap();
    engine.read_start(&s, OffsetQuery::Start).await.unwrap();
    hand.advance(Duration::from_secs(50));
    engine.head(&name("ttl")).await.unwrap();
    assert!(matches!(
        engine.head(&name("at")).await,
        Err(EngineError::NotFound)
    ));
    hand.advance(Duration::from_secs(11));
    assert!(matches!(
        engine.head(&name("ttl")).await,
        Err(EngineError::NotFound)
    ));
    engine.shutdown().await;
}
