//! TTL and absolute expiry: reads and writes slide a TTL, an expired stream is gone
//! for every operation (none of which hangs), and its path can be created again.

use picomq_testkit as support;

use std::time::{Duration, Instant};

use support::{Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_streams_are_gone_and_reusable() {
    let dir = TempDir::new("ttl");
    let server = Server::start(dir.path(), &[]).await;
    let c = &server.client;
    let text = [("content-type", "text/plain")];
    for name in ["/ttl/get", "/ttl/delete", "/ttl/put", "/ttl/fork-src"] {
        let r = c
            .put(
                name,
                &[("content-type", "text/plain"), ("stream-ttl", "1")],
                "x",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201);
    }
    // Keep one alive by reading it while the others lapse.
    let started = Instant::now();
    let r = c
        .put(
            "/ttl/kept",
            &[("content-type", "text/plain"), ("stream-ttl", "1")],
            "k",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201);
    while started.elapsed() < Duration::from_millis(1600) {
        assert_eq!(
            c.get("/ttl/kept?offset=-1").await.unwrap().status.as_u16(),
            200
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Read within its TTL of the last touch (the requests below may take longer
    // than its 1 s on a loaded machine): its data is all there.
    assert_eq!(support::read_all(c, "/ttl/kept").await, b"k");
    // Every kind of request on an expired stream answers promptly.
    let deadline = Duration::from_secs(5);
    let get = tokio::time::timeout(deadline, c.get("/ttl/get?offset=-1"))
        .await
        .expect("GET hung")
        .unwrap();
    assert_eq!(get.status.as_u16(), 404);
    let del = tokio::time::timeout(deadline, c.delete("/ttl/delete"))
        .await
        .expect("DELETE hung")
        .unwrap();
    assert_eq!(del.status.as_u16(), 404);
    let put = tokio::time::timeout(deadline, c.put("/ttl/put", &text, "new"))
        .await
        .expect("PUT hung")
        .unwrap();
    assert_eq!(
        put.status.as_u16(),
        201,
        "an expired path can be created again: {}",
        put.text()
    );
    let fork = tokio::time::timeout(
        deadline,
        c.put("/ttl/fork", &[("stream-forked-from", "/ttl/fork-src")], ""),
    )
    .await
    .expect("fork PUT hung")
    .unwrap();
    assert_eq!(fork.status.as_u16(), 404);
    assert_eq!(support::read_all(c, "/ttl/put").await, b"new");
}

/// Streams that nobody touches again still expire: once dormant, the metadata scan
/// finds them and deletes them through the WAL (so GC can reclaim their bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dormant_streams_expire_without_being_touched() {
    let dir = TempDir::new("ttl-dormant");
    let server = Server::start(dir.path(), &["--dormancy", "100ms"]).await;
    let c = &server.client;
    // Whole seconds, truncated: 2 to 3 s from now. Both lapse well after the first
    // check below has seen all three (with `now + 1s` the expiry could land a few ms
    // out and the stream vanish before the count ever read 3).
    let expires_at = time_in(Duration::from_secs(3));
    for (name, header, value) in [
        ("/ttl/dormant-ttl", "stream-ttl", "2".to_string()),
        ("/ttl/dormant-at", "stream-expires-at", expires_at),
        ("/ttl/alive", "stream-ttl", "3600".to_string()),
    ] {
        let r = c
            .put(
                name,
                &[("content-type", "text/plain"), (header, value.as_str())],
                "x",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201, "{name}: {}", r.text());
    }
    let started = Instant::now();
    // The count follows the index, which trails the acknowledgements a little.
    support::eventually(Duration::from_secs(5), || async {
        (support::metric(c, "picomq_streams").await == 3.0).then_some(())
    })
    .await;
    support::eventually(Duration::from_secs(10), || async {
        (support::metric(c, "picomq_streams").await == 1.0).then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "expired too early"
    );
    assert_eq!(c.head("/ttl/alive").await.unwrap().status.as_u16(), 200);
    for name in ["/ttl/dormant-ttl", "/ttl/dormant-at"] {
        assert_eq!(c.head(name).await.unwrap().status.as_u16(), 404);
    }
}

/// RFC 3339 (UTC, whole seconds) for about now + `d` (the server under test runs on
/// the system clock).
#[allow(clippy::disallowed_methods)]
fn time_in(d: Duration) -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now() + d).to_string()
}
