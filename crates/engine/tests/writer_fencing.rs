//! Fencing: engines sharing a bucket (each with its own metadata, as processes with
//! different data directories) never both acknowledge writes. The newest one wins;
//! the older one stops acknowledging, on its next write or earlier by noticing the
//! newer epoch claim; nothing it acknowledged is lost.

mod support;

use std::time::Duration;

use picomq_engine::EngineError;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_newer_engine_fences_the_older_one() {
    let store = s3_store("fence");
    let old = open_engine(fast_config(), store.clone()).await;
    create(&old, "f", "text/plain").await;
    for i in 0..10 {
        old.append(append_req("f", format!("old-{i}\n")))
            .await
            .unwrap();
    }
    let new = open_engine(fast_config(), store.clone()).await;
    assert!(new.epoch() > old.epoch());
    // Everything the old engine acknowledged is visible to the new one.
    let text = String::from_utf8(read_all(&new, "f", 1 << 20).await.unwrap()).unwrap();
    assert_eq!(text.lines().count(), 10);

    // The old engine's next write hits the sealed key: fenced, not acknowledged.
    let err = old.append(append_req("f", "old-late\n")).await.unwrap_err();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("fenced"), "{err}");
    let err = old
        .append(append_req("f", "old-later\n"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");

    new.append(append_req("f", "new-0\n")).await.unwrap();
    let text = String::from_utf8(read_all(&new, "f", 1 << 20).await.unwrap()).unwrap();
    assert!(
        !text.contains("old-late") && !text.contains("old-later"),
        "{text}"
    );
    assert!(text.ends_with("old-9\nnew-0\n"), "{text}");

    // A third engine replays both logs: still exactly the acknowledged records.
    new.shutdown().await;
    let third = open_engine(fast_config(), store).await;
    let again = String::from_utf8(read_all(&third, "f", 1 << 20).await.unwrap()).unwrap();
    assert_eq!(again, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_engine_notices_without_writing() {
    let store = s3_store("fence-watch");
    let mut config = fast_config();
    config.fence_check_interval = Some(Duration::from_millis(50));
    let old = open_engine(config.clone(), store.clone()).await;
    create(&old, "w", "text/plain").await;
    assert!(old.health().is_ok());
    let _new = open_engine(config, store).await;
    let err = eventually(Duration::from_secs(5), || async { old.health().err() }).await;
    assert!(err.to_string().contains("fenced"), "{err}");
    // And it refuses writes at once, before touching the store.
    let err = old.append(append_req("w", "x")).await.unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_started_together_leave_exactly_one_writer() {
    let store = s3_store("fence-race");
    let first = open_engine(fast_config(), store.clone()).await;
    create(&first, "race", "text/plain").await;
    first.shutdown().await;
    // Three engines recover concurrently on the same bucket.
    let engines =
        futures::future::join_all((0..3).map(|_| open_engine(fast_config(), store.clone()))).await;
    let mut epochs: Vec<u64> = engines.iter().map(|e| e.epoch()).collect();
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 3, "two engines share an epoch");
    let mut accepted = Vec::new();
    for (i, e) in engines.iter().enumerate() {
        if e.append(append_req("race", format!("from-{i}\n")))
            .await
            .is_ok()
        {
            accepted.push(e.epoch());
        }
    }
    assert_eq!(
        accepted,
        vec![*epochs.last().unwrap()],
        "exactly the newest engine may write"
    );
}
