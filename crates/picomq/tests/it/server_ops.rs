//! Day-two operations of `picomq serve`: readiness that waits for recovery, request
//! ids in responses and structured logs, the reserved listing endpoint, and
//! HTTP/1.1 plus HTTP/2 (h2c) on one port.

use picomq_testkit as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use picomq_client::{Client, HttpMethod, SseParser};
use support::cli::Cli;
use support::{eventually, free_port, metric, read_all, Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_after_recovery() {
    let dir = TempDir::new("ops-ready");
    let mut server = Server::start_process(dir.path(), &[]).await;
    for i in 0..20 {
        let r = server
            .client
            .put(&format!("/r/{i}"), &[("content-type", "text/plain")], "x")
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201);
    }
    server.kill9();

    // Restart on a slow store: recovery takes a while, and the port is open meanwhile.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin_port = free_port();
    let log = std::fs::File::create(dir.path().join("slow-start.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin_port}"),
            "--store-latency",
            "400ms",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let client = Client::new(&url);
    let admin = Client::new(&format!("http://127.0.0.1:{admin_port}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut saw_alive_not_ready = false;
    let mut admin_alive_not_ready = false;
    loop {
        assert!(Instant::now() < deadline, "never became ready");
        assert!(
            child.try_wait().unwrap().is_none(),
            "server exited during start-up"
        );
        let (Ok(ready), Ok(alive)) = (client.get("/readyz").await, client.get("/healthz").await)
        else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if ready.status.as_u16() == 200 {
            break;
        }
        // Alive, not ready; and stream requests are refused until recovery ends.
        assert_eq!((ready.status.as_u16(), alive.status.as_u16()), (503, 200));
        assert!(ready.text().contains("starting"), "{}", ready.text());
        saw_alive_not_ready = true;
        match client.get("/r/0").await {
            Ok(early) if early.status.as_u16() == 503 => {
                assert_eq!(early.header("retry-after"), Some("1"));
            }
            // Recovery ended in between: the stand-in closed its connection, or the
            // real server answered.
            Err(_) => {}
            Ok(r) => assert_eq!(r.status.as_u16(), 200, "{}", r.text()),
        }
        if let (Ok(ready), Ok(alive)) = (admin.get("/readyz").await, admin.get("/healthz").await) {
            if ready.status.as_u16() == 503 && alive.status.as_u16() == 200 {
                admin_alive_not_ready = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        admin_alive_not_ready,
        "the admin port was not alive-but-not-ready during recovery"
    );
    support::eventually(Duration::from_secs(10), || async {
        let r = admin.get("/readyz").await.ok()?;
        (r.status.as_u16() == 200).then_some(())
    })
    .await;
    assert!(
        saw_alive_not_ready,
        "the port opened only once recovery had finished"
    );
    assert_eq!(read_all(&client, "/r/19").await, b"x");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_in_responses_and_json_logs() {
    let dir = TempDir::new("ops-logs");
    let server = Server::start_process(dir.path(), &["--log-format", "json"]).await;
    let r = server
        .client
        .put(
            "/logged",
            &[
                ("content-type", "text/plain"),
                ("x-request-id", "trace-abc-123"),
            ],
            "",
        )
        .await
        .unwrap();
    assert_eq!(
        r.header("x-request-id"),
        Some("trace-abc-123"),
        "a given id is echoed"
    );
    let r = server.client.get("/logged?offset=-1").await.unwrap();
    let generated = r
        .header("x-request-id")
        .expect("an id is generated")
        .to_string();
    let r2 = server.client.get("/nope").await.unwrap();
    assert_ne!(
        r2.header("x-request-id"),
        Some(generated.as_str()),
        "ids are unique"
    );

    // One JSON log line per request, carrying the id, method, path, status, latency.
    let entry = support::eventually(Duration::from_secs(5), || {
        let text = server.log_text();
        async move {
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["fields"]["id"] == "trace-abc-123" && v["target"] == "picomq::access")
        }
    })
    .await;
    assert_eq!(entry["fields"]["method"], "PUT");
    assert_eq!(entry["fields"]["path"], "/logged");
    assert_eq!(entry["fields"]["status"], 201);
    assert!(entry["fields"]["latency_us"].is_u64(), "{entry}");
    // Lines reach the log from a background writer: wait for the last request's.
    let text = support::eventually(Duration::from_secs(5), || {
        let text = server.log_text();
        let found = text.contains(&generated);
        async move { found.then_some(text) }
    })
    .await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "every log line is JSON"
    );
    assert!(text.contains(&generated), "generated ids are logged too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_endpoint_pages_and_is_reserved() {
    let dir = TempDir::new("ops-listing");
    let server = Server::start(dir.path(), &[]).await;
    let c = &server.client;
    for name in ["p/a", "p/b", "p/c", "q/a"] {
        assert_eq!(
            c.put(&format!("/{name}"), &[("content-type", "text/plain")], "hi")
                .await
                .unwrap()
                .status
                .as_u16(),
            201
        );
    }
    let page = |query: &'static str| async move {
        let r = c.get(&format!("/__picomq/streams?{query}")).await.unwrap();
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()
    };
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    let first = page("prefix=p%2F&limit=2").await;
    assert_eq!(names(&first), ["p/a", "p/b"]);
    assert_eq!(first["next"], "p/b");
    let second = page("prefix=p%2F&limit=2&after=p%2Fb").await;
    assert_eq!(names(&second), ["p/c"]);
    assert_eq!(
        second["next"],
        serde_json::Value::Null,
        "the last page says so"
    );
    assert_eq!(
        second["streams"][0]["nextOffset"]
            .as_str()
            .map(|o| o.ends_with("2")),
        Some(true)
    );
    assert_eq!(names(&page("").await), ["p/a", "p/b", "p/c", "q/a"]);
    for bad in ["limit=0", "limit=5000", "colour=red"] {
        let r = c.get(&format!("/__picomq/streams?{bad}")).await.unwrap();
        assert_eq!(r.status.as_u16(), 400, "{bad}: {}", r.text());
    }
    // Nothing can be created on the reserved path, so it never shadows a stream.
    let r = c
        .put("/__picomq/streams", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    assert!(r.status.is_client_error(), "{}", r.status);
    let r = c
        .put("/__anything", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_h2c_share_the_port() {
    let dir = TempDir::new("ops-h2c");
    let server = Server::start(dir.path(), &[]).await;
    let h2 = Client::with_options(&server.url, true);
    let h1 = &server.client;
    let text = [("content-type", "text/plain")];
    assert_eq!(
        h2.put("/both", &text, "a").await.unwrap().status.as_u16(),
        201
    );
    assert_eq!(
        h1.post("/both", &text, "b").await.unwrap().status.as_u16(),
        204
    );
    // Many concurrent requests multiplexed on the one HTTP/2 connection.
    let appends: Vec<_> = (0..50)
        .map(|i| {
            let h2 = h2.clone();
            tokio::spawn(async move {
                h2.post(&format!("/h2/{i}"), &[("content-type", "text/plain")], "x")
                    .await
            })
        })
        .collect();
    for (i, a) in appends.into_iter().enumerate() {
        // Streams /h2/i do not exist: each gets its own 404 over the shared connection.
        assert_eq!(
            a.await.unwrap().unwrap().status.as_u16(),
            404,
            "request {i}"
        );
    }
    assert_eq!(read_all(&h2, "/both").await, b"ab");
    assert_eq!(read_all(h1, "/both").await, b"ab");

    // Live reads over h2: SSE delivers an append made over HTTP/1.1.
    let mut sse = h2
        .open(HttpMethod::GET, "/both?offset=now&live=sse", &[], "")
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200);
    assert_eq!(
        h1.post("/both", &text, "c").await.unwrap().status.as_u16(),
        204
    );
    let mut parser = SseParser::default();
    let data = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let chunk = sse.next_chunk().await.expect("open").expect("chunk");
            if let Some(e) = parser.feed(&chunk).into_iter().find(|e| e.event == "data") {
                return e.data;
            }
        }
    })
    .await
    .expect("SSE data over h2");
    assert_eq!(data, "c");

    // And the CLI speaks h2c on request.
    let cli = Cli::new(&server.url);
    let r = cli.run(&["read", "both", "--http2"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, "abc"), "{r:?}");
}

/// `picomq_index_lag_objects` counts WAL objects that are durable but not yet in the
/// metadata index: an append shows in it while the indexer gathers its batch (200
/// ms), and it returns to 0 once the batch is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_lag_counts_durable_objects_until_indexed() {
    let dir = TempDir::new("index-lag");
    let server = Server::start(dir.path(), &[]).await;
    let c = &server.client;
    let text = [("content-type", "text/plain")];
    assert_eq!(c.put("/lag", &text, "").await.unwrap().status.as_u16(), 201);
    let caught_up = || async {
        eventually(Duration::from_secs(10), || async {
            (metric(c, "picomq_index_lag_objects").await == 0.0).then_some(())
        })
        .await
    };
    caught_up().await;
    // Right after an acknowledged append its object is durable, and (unless the
    // scrape came more than the linger later) not indexed yet.
    let mut seen = Vec::new();
    for i in 0..5 {
        let r = c.post("/lag", &text, format!("r{i}")).await.unwrap();
        assert_eq!(r.status.as_u16(), 204);
        seen.push(metric(c, "picomq_index_lag_objects").await);
        caught_up().await;
    }
    assert!(
        seen.iter().any(|&lag| lag >= 1.0),
        "lag after each append: {seen:?}"
    );
}
