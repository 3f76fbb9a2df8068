//! Reads at offsets a client computed rather than was given, as the reference server
//! answers them (docs/protocol.md, "Offsets a client computes"): past the tail is an
//! empty, up-to-date answer at the tail (a long-poll does not wait); inside an append
//! is the whole append; and a read hands out only append boundaries, so resuming
//! from any answer never repeats data.

use picomq_testkit as support;

use std::time::{Duration, Instant};

use picomq_client::{HttpMethod, SseParser};
use support::{Client, Server, TempDir};

fn offset(pos: u64) -> String {
    format!("0000000000000000_{pos:016}")
}

async fn append(c: &Client, path: &str, ct: &str, body: &str) {
    let r = c
        .post(path, &[("content-type", ct)], body.to_string())
        .await
        .unwrap();
    assert!(r.status.is_success(), "append to {path}: {}", r.text());
}

async fn get(c: &Client, path: &str) -> picomq_client::Response {
    let r = c.get(path).await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "GET {path}: {}", r.text());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_past_the_tail_and_inside_appends() {
    let dir = TempDir::new("read-offsets");
    let server = Server::start(dir.path(), &["--long-poll-timeout", "20s"]).await;
    let c = server.client.clone();
    c.put("/b", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    append(&c, "/b", "text/plain", "hello").await;
    append(&c, "/b", "text/plain", "world!").await;
    let tail = offset(11);

    // One past the tail and far past it: 200, nothing, at the tail.
    for past in [12, 1_000] {
        let r = get(&c, &format!("/b?offset={}", offset(past))).await;
        assert_eq!(r.text(), "");
        assert_eq!(r.header("stream-next-offset"), Some(tail.as_str()));
        assert_eq!(r.header("stream-up-to-date"), Some("true"));
    }
    // Inside an append: that whole append, from its start.
    for inside in [6, 7, 10] {
        let r = get(&c, &format!("/b?offset={}", offset(inside))).await;
        assert_eq!(r.text(), "world!", "from {inside}");
        assert_eq!(r.header("stream-next-offset"), Some(tail.as_str()));
    }
    let r = get(&c, &format!("/b?offset={}", offset(2))).await;
    assert_eq!(r.text(), "helloworld!");

    // A long-poll past the tail answers at once, like a catch-up read.
    let started = Instant::now();
    let r = get(&c, &format!("/b?offset={}&live=long-poll", offset(12))).await;
    assert!(started.elapsed() < Duration::from_secs(5), "it waited");
    assert_eq!(r.text(), "");
    assert_eq!(r.header("stream-next-offset"), Some(tail.as_str()));
    assert!(r.header("stream-cursor").is_some());
    // Inside an append, a long-poll answers at once with the append.
    let r = get(&c, &format!("/b?offset={}&live=long-poll", offset(8))).await;
    assert_eq!(r.text(), "world!");

    // SSE past the tail: a control event at the tail, up to date.
    let mut sse = c
        .open(
            HttpMethod::GET,
            &format!("/b?offset={}&live=sse", offset(12)),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200);
    let mut parser = SseParser::default();
    let control = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(10), sse.next_chunk())
            .await
            .expect("an event within 10 s")
            .expect("the stream stays open")
            .unwrap();
        if let Some(e) = parser
            .feed(&chunk)
            .into_iter()
            .find(|e| e.event == "control")
        {
            break e;
        }
    };
    let control: serde_json::Value = serde_json::from_str(&control.data).unwrap();
    assert_eq!(control["streamNextOffset"], tail.as_str());
    assert_eq!(control["upToDate"], true);

    // A closed stream says so past its tail too.
    c.post("/b", &[("stream-closed", "true")], "")
        .await
        .unwrap();
    let r = get(&c, &format!("/b?offset={}", offset(40))).await;
    assert_eq!(r.header("stream-closed"), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_appends_are_never_split() {
    let dir = TempDir::new("read-offsets-json");
    let server = Server::start(dir.path(), &[]).await;
    let c = server.client.clone();
    c.put("/j", &[("content-type", "application/json")], "")
        .await
        .unwrap();
    append(&c, "/j", "application/json", r#"[{"a":1},{"b":2},{"c":3}]"#).await;
    append(&c, "/j", "application/json", r#"{"d":4}"#).await;
    // Inside the first append, in a message or between two of its messages: the
    // whole append, then the rest.
    for inside in [1, 7, 8, 15] {
        let r = get(&c, &format!("/j?offset={}", offset(inside))).await;
        assert_eq!(r.text(), r#"[{"a":1},{"b":2},{"c":3},{"d":4}]"#, "{inside}");
    }
    let r = get(&c, &format!("/j?offset={}", offset(25))).await;
    assert_eq!(r.text(), r#"[{"d":4}]"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_end_only_where_appends_end() {
    let dir = TempDir::new("read-offsets-bounds");
    let server = Server::start(dir.path(), &["--max-read-bytes", "1024"]).await;
    let c = server.client.clone();
    c.put("/big", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    let big = "x".repeat(3_000);
    append(&c, "/big", "text/plain", &big).await;
    for i in 0..20 {
        append(&c, "/big", "text/plain", &format!("{i:03}")).await;
    }
    // Bigger than --max-read-bytes: sent whole rather than cut.
    let r = get(&c, "/big?offset=-1").await;
    assert_eq!(r.body.len(), 3_000);
    assert_eq!(r.header("stream-next-offset"), Some(offset(3_000).as_str()));
    // Resuming from every answer reads each byte exactly once.
    let mut all = String::new();
    let mut from = "-1".to_string();
    loop {
        let r = get(&c, &format!("/big?offset={from}")).await;
        all.push_str(&r.text());
        if r.header("stream-up-to-date") == Some("true") {
            break;
        }
        from = r.header("stream-next-offset").unwrap().to_string();
    }
    let expected: String = std::iter::once(big)
        .chain((0..20).map(|i| format!("{i:03}")))
        .collect();
    assert_eq!(all, expected);
}
