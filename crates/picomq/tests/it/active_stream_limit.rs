//! The active-stream limit: when it is reached, streams that have been idle for a
//! second give way to new ones before their dormancy timeout; streams still in use
//! keep their place and the newcomer gets 429.

use picomq_testkit as support;

use std::time::Duration;

use support::{eventually, metric, read_all, Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_idle_streams_make_room_for_new_ones() {
    let dir = TempDir::new("active-limit");
    let server = Server::start(
        dir.path(),
        &["--max-active-streams", "8", "--dormancy", "10m"],
    )
    .await;
    let c = &server.client;
    let text = [("content-type", "text/plain")];
    for i in 0..8 {
        let r = c
            .put(&format!("/limit/{i}"), &text, format!("s{i};"))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    }
    // All eight were used just now: none gives way.
    let full = c.put("/limit/8", &text, "s8;").await.unwrap();
    assert_eq!(full.status.as_u16(), 429, "{}", full.text());

    // Once they have been idle for a while, new streams get in (well before the
    // ten-minute dormancy timeout), and the evicted ones load again on demand.
    let created = eventually(Duration::from_secs(10), || async {
        let r = c.put("/limit/8", &text, "s8;").await.unwrap();
        (r.status.as_u16() == 201).then_some(r)
    })
    .await;
    assert_eq!(created.status.as_u16(), 201);
    assert!(metric(c, "picomq_active_streams").await <= 8.0);
    // An evicted stream loads again on demand; at the limit that may take a 429 and
    // a retry (early evictions are swept at most every 100 ms).
    eventually(Duration::from_secs(10), || async {
        let r = c.get("/limit/0?offset=-1").await.unwrap();
        (r.status.as_u16() != 429).then_some(())
    })
    .await;
    assert_eq!(read_all(c, "/limit/0").await, b"s0;");
    assert_eq!(read_all(c, "/limit/8").await, b"s8;");
}
