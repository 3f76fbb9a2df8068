//! Object-store faults: transient write failures are retried without losing or
//! duplicating anything; an outage makes appends fail fast with a clear error and
//! the engine recovers by itself; reads that hit a failing store fail instead of
//! returning a shortened stream. All against a real S3-compatible server (in
//! process), with faults injected between the engine and its S3 client.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use picomq_engine::store::fault::{FaultyStore, OpKind};
use picomq_engine::EngineError;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_write_failures_lose_and_duplicate_nothing() {
    let s3 = s3_store("transient");
    let (store, faults) = FaultyStore::new(s3.clone());
    let mut config = fast_config();
    // Small objects, so the 1,000 appends take a few hundred PUTs to fail at 10%.
    config.wal.flush_bytes_max = 256;
    let engine = open_engine(config, store).await;
    const STREAMS: usize = 8;
    const WRITERS: usize = 40;
    const PER_WRITER: usize = 25;
    for s in 0..STREAMS {
        create(&engine, &format!("t/{s}"), "text/plain").await;
    }
    faults.fail(OpKind::Put, false);
    faults.set_error_rate(0.10);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..PER_WRITER {
                let line = format!("w{w:02}-{i:03}\n");
                let r = engine
                    .append(append_req(&format!("t/{}", w % STREAMS), line.clone()))
                    .await;
                outcomes.push((line, r));
            }
            outcomes
        }));
    }
    let mut acked: HashMap<usize, Vec<String>> = HashMap::new();
    let mut failed = 0;
    for (w, t) in tasks.into_iter().enumerate() {
        for (line, r) in t.await.unwrap() {
            match r {
                Ok(_) => acked.entry(w % STREAMS).or_default().push(line),
                // A clear, retryable error is the only acceptable failure.
                Err(EngineError::Unavailable(msg)) => {
                    assert!(!msg.is_empty());
                    failed += 1;
                }
                Err(e) => panic!("append failed with an unexpected error: {e}"),
            }
        }
    }
    faults.set_error_rate(0.0);
    let injected = faults.injected_errors.load(Ordering::Relaxed);
    let retries = engine.stats().wal.upload_retries.get();
    eprintln!(
        "{} acked, {failed} failed; {injected} injected PUT failures, {retries} upload retries",
        WRITERS * PER_WRITER - failed
    );
    assert!(
        injected > 0,
        "no faults were injected: the test proves nothing"
    );
    assert!(retries > 0);
    // Retries absorb 10% transient failures: nothing should have failed.
    assert_eq!(failed, 0, "transient failures leaked to appends");
    verify(&engine, &acked, STREAMS).await;
    // The bucket alone holds the same: a fresh engine with empty metadata agrees.
    engine.shutdown().await;
    let rebuilt = open_engine(fast_config(), s3).await;
    verify(&rebuilt, &acked, STREAMS).await;
}

/// Each stream holds exactly its acknowledged lines, each once, in writer order.
async fn verify(
    engine: &picomq_engine::Engine,
    acked: &HashMap<usize, Vec<String>>,
    streams: usize,
) {
    for s in 0..streams {
        let data = read_all(engine, &format!("t/{s}"), 64 << 10).await.unwrap();
        let text = String::from_utf8(data).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        let mut expected: Vec<&str> = acked[&s].iter().map(|l| l.trim_end()).collect();
        // Writers interleave; per writer the order is fixed, so compare sorted sets
        // and then per-writer order.
        let mut last: HashMap<&str, &str> = HashMap::new();
        for l in &lines {
            let (w, i) = l.split_once('-').unwrap();
            if let Some(prev) = last.insert(w, i) {
                assert!(i > prev, "{w}: {i} after {prev} in stream {s}");
            }
        }
        lines.sort_unstable();
        expected.sort_unstable();
        assert_eq!(
            lines, expected,
            "stream {s} differs from what was acknowledged"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_outage_fails_appends_fast_then_recovers() {
    let (store, faults) = FaultyStore::new(s3_store("outage"));
    let mut config = fast_config();
    config.wal.store_down_after = Duration::from_millis(300);
    config.append_timeout = Duration::from_secs(20);
    let engine = open_engine(config, store).await;
    create(&engine, "o", "text/plain").await;
    engine.append(append_req("o", "before\n")).await.unwrap();

    faults.set_down(true);
    // The append caught by the outage fails once the store is declared down, long
    // before its 20 s timeout.
    let started = Instant::now();
    let err = engine
        .append(append_req("o", "during-1\n"))
        .await
        .unwrap_err();
    let first_fail = started.elapsed();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err}");
    assert!(first_fail < Duration::from_secs(3), "took {first_fail:?}");
    // Later appends fail at once.
    let started = Instant::now();
    for i in 0..20 {
        let err = engine
            .append(append_req("o", format!("during-fast-{i}\n")))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("object store unavailable"),
            "{err}"
        );
    }
    let fast = started.elapsed() / 20;
    assert!(
        fast < Duration::from_millis(50),
        "{fast:?} per failing append"
    );
    assert!(engine.health().is_err());

    faults.set_down(false);
    // Recovers by itself: health returns and appends succeed again.
    eventually(Duration::from_secs(10), || async { engine.health().ok() }).await;
    engine.append(append_req("o", "after\n")).await.unwrap();
    eprintln!("first failure after {first_fail:?}, then {fast:?} per append; recovered");

    // "during-1" was accepted before the outage was known: its outcome was unknown
    // to the client, and it landed once the store came back. The fast failures were
    // never accepted. Nothing appears twice.
    let text = String::from_utf8(read_all(&engine, "o", 1 << 20).await.unwrap()).unwrap();
    assert_eq!(text, "before\nduring-1\nafter\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_from_a_failing_store_fail_instead_of_shortening() {
    let (store, faults) = FaultyStore::new(s3_store("reads"));
    let mut config = fast_config();
    // Nothing stays in memory once indexed: every read goes to the store.
    config.tail_cache_bytes_per_stream = 0;
    config.block_cache_bytes = 0;
    let engine = Arc::new(open_engine(config, store).await);
    create(&engine, "r", "text/plain").await;
    let mut expected = Vec::new();
    for i in 0..40 {
        let line = format!("record-{i:04}\n");
        engine.append(append_req("r", line.clone())).await.unwrap();
        expected.extend_from_slice(line.as_bytes());
    }
    // Once indexed, reads are served by the store.
    eventually(Duration::from_secs(10), || async {
        let before = engine.cold_stats().reads.get();
        let data = read_all(&engine, "r", 64).await.ok()?;
        let after = engine.cold_stats().reads.get();
        (data == expected && after > before).then_some(())
    })
    .await;

    faults.fail(OpKind::Get, true);
    let err = read_all(&engine, "r", 1 << 20).await.unwrap_err();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err}");
    faults.fail(OpKind::Get, false);

    // Flaky GETs: every read either fails or returns exactly the right bytes. A
    // read takes a few GETs (windows coalesce them), so read until both outcomes
    // were seen, up to a bound.
    faults.set_error_rate(0.02);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..1_000 {
        if ok > 0 && failed > 0 && ok + failed >= 30 {
            break;
        }
        match read_all(&engine, "r", 100).await {
            Ok(data) => {
                assert_eq!(data, expected, "a read returned a different stream");
                ok += 1;
            }
            Err(EngineError::Unavailable(_)) => failed += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    faults.set_error_rate(0.0);
    eprintln!("{ok} complete reads, {failed} failed reads, none shortened");
    assert!(failed > 0, "no read hit an injected failure");
    assert!(ok > 0, "no read succeeded: the comparison proves nothing");
}

/// `overlap_after`: while a slow upload is in flight, the next batch gets an upload of
/// its own once the newest has run that long, instead of waiting for it; without it,
/// one upload at a time. Acknowledgements keep the log's order either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_upload_is_overlapped_only_when_configured() {
    for overlap in [None, Some(Duration::from_millis(50)), Some(Duration::ZERO)] {
        let tag = match overlap {
            None => "one-at-a-time",
            Some(d) if d.is_zero() => "overlap-at-once",
            Some(_) => "overlap",
        };
        let (store, faults) = FaultyStore::new(s3_store(tag));
        let mut config = fast_config();
        config.wal.overlap_after = overlap;
        // A 600 ms upload is slow, not hanging.
        config.wal.store_down_after = Duration::from_secs(10);
        let engine = Arc::new(open_engine(config, store).await);
        create(&engine, "o", "text/plain").await;
        faults.set_latency(Duration::from_millis(600));
        faults.max_puts_in_flight.store(0, Ordering::Relaxed);
        let first = tokio::spawn({
            let engine = engine.clone();
            async move {
                engine.append(append_req("o", "first\n")).await.unwrap();
                Instant::now()
            }
        });
        // Well inside the first upload, and past `overlap_after`.
        tokio::time::sleep(Duration::from_millis(150)).await;
        engine.append(append_req("o", "second\n")).await.unwrap();
        let second_acked = Instant::now();
        let first_acked = first.await.unwrap();
        assert!(first_acked <= second_acked, "acknowledged out of order");
        let most = faults.max_puts_in_flight.load(Ordering::Relaxed);
        match overlap {
            Some(_) => assert_eq!(most, 2, "the second batch waited for the first upload"),
            None => assert_eq!(most, 1, "uploads overlapped without overlap_after"),
        }
        faults.set_latency(Duration::ZERO);
        assert_eq!(
            read_all(&engine, "o", 1 << 20).await.unwrap(),
            b"first\nsecond\n"
        );
    }
}
