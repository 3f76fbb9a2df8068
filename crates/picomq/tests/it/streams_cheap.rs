//! Idle streams cost no memory: active streams leave memory after the dormancy
//! timeout and come back on demand with all their state.

use picomq_testkit as support;

use std::time::Duration;

use support::{eventually, metric, read_all, Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_go_dormant_and_come_back() {
    let dir = TempDir::new("dormancy");
    let server = Server::start(dir.path(), &["--dormancy", "200ms"]).await;
    let c = &server.client;
    let text = [("content-type", "text/plain")];
    for i in 0..200 {
        assert_eq!(
            c.put(&format!("/cheap/{i}"), &text, format!("first-{i};"))
                .await
                .unwrap()
                .status
                .as_u16(),
            201
        );
    }
    let producer = [
        ("content-type", "text/plain"),
        ("producer-id", "p"),
        ("producer-epoch", "3"),
        ("producer-seq", "0"),
    ];
    assert_eq!(
        c.post("/cheap/0", &producer, "second;")
            .await
            .unwrap()
            .status
            .as_u16(),
        200
    );
    assert_eq!(
        c.post("/cheap/1", &[("stream-closed", "true")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        204
    );
    // Streams just written are in memory (older ones may already be dormant).
    assert!(metric(c, "picomq_active_streams").await >= 1.0);

    eventually(Duration::from_secs(10), || async {
        (metric(c, "picomq_active_streams").await == 0.0).then_some(())
    })
    .await;

    // Loaded on demand, with data, producer state and closed state intact.
    assert_eq!(read_all(c, "/cheap/0").await, b"first-0;second;");
    let dup = c.post("/cheap/0", &producer, "second;").await.unwrap();
    assert_eq!(
        dup.status.as_u16(),
        204,
        "retry must be deduplicated after reload"
    );
    assert_eq!(read_all(c, "/cheap/0").await, b"first-0;second;");
    let closed = c.post("/cheap/1", &text, "more").await.unwrap();
    assert_eq!(closed.status.as_u16(), 409);
    assert_eq!(closed.header("stream-closed"), Some("true"));
    assert_eq!(read_all(c, "/cheap/199").await, b"first-199;");
}
