//! SIGTERM: the server stops accepting, lets in-flight appends finish (or fail
//! cleanly), ends SSE and long-polls with a proper response, flushes the WAL and
//! exits within `--shutdown-timeout`. Every append either succeeded (and is there
//! after a restart) or got an error; none hangs.

use picomq_testkit as support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use picomq_client::{HttpMethod, SseParser};
use support::{eventually, read_all, Server, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WRITERS: usize = 16;
/// Longer than any append may take; reaching it means the request hung.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

struct Writer {
    /// Sequence numbers whose append was acknowledged.
    acked: Vec<u64>,
    /// Every sequence number sent (acknowledged or not).
    attempted: u64,
    hung: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_concurrent_appends_loses_no_acknowledged_append() {
    let dir = TempDir::new("graceful-appends");
    // A store as slow as S3, so appends are in flight when the signal lands.
    let mut server = Server::start_process(dir.path(), &["--store-latency", "15ms"]).await;
    let text = [("content-type", "text/plain")];
    for w in 0..WRITERS {
        let r = server
            .client
            .put(&format!("/gs/{w}"), &text, "")
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201);
    }
    assert_eq!(
        server
            .client
            .put("/gs/idle", &text, "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );

    // Live readers parked on a stream that gets no data.
    let mut sse = server
        .client
        .open(HttpMethod::GET, "/gs/idle?offset=now&live=sse", &[], "")
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200);
    let poller = server.client.clone();
    let long_poll =
        tokio::spawn(async move { poller.get("/gs/idle?offset=now&live=long-poll").await });

    let acked_total = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = server.client.clone();
        let acked_total = acked_total.clone();
        writers.push(tokio::spawn(async move {
            let mut me = Writer {
                acked: Vec::new(),
                attempted: 0,
                hung: false,
            };
            for i in 0.. {
                me.attempted = i + 1;
                let path = format!("/gs/{w}");
                let append = client.post(
                    &path,
                    &[("content-type", "text/plain")],
                    format!("{w}:{i}\n"),
                );
                match tokio::time::timeout(REQUEST_LIMIT, append).await {
                    Err(_) => {
                        me.hung = true;
                        break;
                    }
                    Ok(Ok(r)) if r.status.as_u16() == 204 => {
                        me.acked.push(i);
                        acked_total.fetch_add(1, Ordering::Relaxed);
                    }
                    // An error answer (503 while shutting down) or a closed
                    // connection: this writer is done.
                    Ok(_) => break,
                }
            }
            me
        }));
    }
    eventually(Duration::from_secs(30), || {
        let n = acked_total.load(Ordering::Relaxed);
        async move { (n >= 300).then_some(()) }
    })
    .await;

    let signalled = Instant::now();
    let status = server.terminate(Duration::from_secs(20));
    let shutdown_took = signalled.elapsed();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log_text()
    );
    eprintln!("shutdown under load took {shutdown_took:?}");

    // Live readers got a proper ending, not a reset.
    let lp = long_poll
        .await
        .unwrap()
        .expect("the long-poll was answered");
    assert_eq!(lp.status.as_u16(), 204, "{}", lp.text());
    assert!(lp.header("stream-next-offset").is_some());
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), sse.next_chunk()).await {
            Ok(Some(Ok(chunk))) => events.extend(parser.feed(&chunk)),
            Ok(None) => break,
            Ok(Some(Err(e))) => panic!("SSE ended with an error, not a clean end: {e}"),
            Err(_) => panic!("SSE still open 5s after SIGTERM"),
        }
    }
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("control"),
        "{events:?}"
    );

    let mut results = Vec::new();
    for w in writers {
        let r = tokio::time::timeout(REQUEST_LIMIT * 2, w)
            .await
            .expect("writer finished")
            .unwrap();
        assert!(!r.hung, "an append hung through shutdown");
        results.push(r);
    }

    server.restart().await;
    let mut acked = 0;
    for (w, r) in results.iter().enumerate() {
        let content =
            String::from_utf8(read_all(&server.client, &format!("/gs/{w}")).await).unwrap();
        let seqs: Vec<u64> = content
            .lines()
            .map(|l| {
                let (writer, seq) = l.split_once(':').expect("w:i");
                assert_eq!(writer, w.to_string());
                seq.parse().unwrap()
            })
            .collect();
        // In order, at most once each, only what was sent.
        assert!(
            seqs.windows(2).all(|p| p[0] < p[1]),
            "writer {w}: out of order or repeated: {seqs:?}"
        );
        assert!(
            seqs.iter().all(|s| *s < r.attempted),
            "writer {w}: a record nobody sent"
        );
        let present: BTreeSet<u64> = seqs.into_iter().collect();
        for i in &r.acked {
            assert!(
                present.contains(i),
                "writer {w}: acknowledged append {i} lost"
            );
        }
        acked += r.acked.len();
    }
    eprintln!("{acked} acknowledged appends from {WRITERS} writers, all present after restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_cannot_hold_shutdown_past_its_timeout() {
    let dir = TempDir::new("graceful-bound");
    let mut server = Server::start_process(dir.path(), &["--shutdown-timeout", "2s"]).await;
    let r = server
        .client
        .put("/stall", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201);
    // An append whose body never finishes arriving.
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    stalled
        .write_all(b"POST /stall HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\ncontent-length: 100\r\n\r\npartial")
        .await
        .unwrap();
    // A round trip on another connection: the stalled request is being served by now.
    assert_eq!(
        server.client.get("/healthz").await.unwrap().status.as_u16(),
        200
    );

    let signalled = Instant::now();
    let status = server.terminate(Duration::from_secs(10));
    let took = signalled.elapsed();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log_text()
    );
    // It waited for the request (the drain gets 3/4 of the timeout), then gave up on it.
    assert!(
        took >= Duration::from_millis(1000),
        "did not wait for the in-flight request: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3500),
        "exceeded --shutdown-timeout 2s: {took:?}"
    );
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read_to_end(&mut rest)).await;
    assert!(n.is_ok(), "the stalled connection was not closed");
    // The stream was untouched by the half-sent append, and the server restarts fine.
    server.restart().await;
    assert_eq!(read_all(&server.client, "/stall").await, b"");
}
