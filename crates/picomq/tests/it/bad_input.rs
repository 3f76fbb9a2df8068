//! Bad input gets a clear JSON error with the right status, never a crash or a hang.

use picomq_testkit as support;

use support::{Server, TempDir};

async fn expect_error(
    r: support::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
    status: u16,
) {
    let m = picomq_client::HttpMethod::from_bytes(method.as_bytes()).unwrap();
    let resp = r.send(m, path, headers, body).await.unwrap();
    assert_eq!(
        resp.status.as_u16(),
        status,
        "{method} {path}: {}",
        resp.text()
    );
    if method != "HEAD" {
        let json: serde_json::Value = serde_json::from_slice(&resp.body)
            .unwrap_or_else(|_| panic!("{method} {path}: error body is not JSON: {}", resp.text()));
        assert!(
            json["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{json}"
        );
        assert!(json["error"]["code"].is_string(), "{json}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_errors() {
    let dir = TempDir::new("bad-input");
    let server = Server::start(
        dir.path(),
        &["--max-append-bytes", "1024", "--max-name-bytes", "64"],
    )
    .await;
    let c = server.client.clone();
    let text = [("content-type", "text/plain")];
    let json = [("content-type", "application/json")];
    assert_eq!(
        c.put("/s/text", &text, "").await.unwrap().status.as_u16(),
        201
    );
    assert_eq!(
        c.put("/s/json", &json, "").await.unwrap().status.as_u16(),
        201
    );

    // Offsets
    expect_error(c.clone(), "GET", "/s/text?offset=abc", &[], "", 400).await;
    expect_error(c.clone(), "GET", "/s/text?offset=0,1", &[], "", 400).await;
    expect_error(c.clone(), "GET", "/s/text?offset=", &[], "", 400).await;
    expect_error(
        c.clone(),
        "GET",
        "/s/text?offset=-1&offset=now",
        &[],
        "",
        400,
    )
    .await;
    expect_error(c.clone(), "GET", "/s/text?live=long-poll", &[], "", 400).await;
    expect_error(
        c.clone(),
        "GET",
        "/s/text?offset=-1&live=forever",
        &[],
        "",
        400,
    )
    .await;
    // Bodies
    expect_error(c.clone(), "POST", "/s/json", &json, "{not json", 400).await;
    expect_error(c.clone(), "POST", "/s/json", &json, "[]", 400).await;
    expect_error(c.clone(), "POST", "/s/text", &text, "", 400).await;
    let big: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
    expect_error(c.clone(), "POST", "/s/text", &text, big, 413).await;
    expect_error(c.clone(), "PUT", "/s/big", &text, big, 413).await;
    // Headers
    expect_error(
        c.clone(),
        "POST",
        "/s/text",
        &[("content-type", "application/json")],
        "x",
        409,
    )
    .await;
    expect_error(c.clone(), "PUT", "/s/ttl", &[("stream-ttl", "+5")], "", 400).await;
    expect_error(
        c.clone(),
        "PUT",
        "/s/ttl",
        &[
            ("stream-ttl", "5"),
            ("stream-expires-at", "2030-01-01T00:00:00Z"),
        ],
        "",
        400,
    )
    .await;
    expect_error(
        c.clone(),
        "PUT",
        "/s/exp",
        &[("stream-expires-at", "tomorrow")],
        "",
        400,
    )
    .await;
    expect_error(
        c.clone(),
        "POST",
        "/s/text",
        &[("content-type", "text/plain"), ("producer-id", "p")],
        "x",
        400,
    )
    .await;
    expect_error(
        c.clone(),
        "POST",
        "/s/text",
        &[
            ("content-type", "text/plain"),
            ("producer-id", "p"),
            ("producer-epoch", "x"),
            ("producer-seq", "0"),
        ],
        "x",
        400,
    )
    .await;
    expect_error(
        c.clone(),
        "POST",
        "/s/text",
        &[
            ("content-type", "text/plain"),
            ("producer-id", "p"),
            ("producer-epoch", "9007199254740992"),
            ("producer-seq", "0"),
        ],
        "x",
        400,
    )
    .await;
    // Names
    expect_error(c.clone(), "PUT", "/s/../etc", &text, "", 400).await;
    expect_error(c.clone(), "PUT", "/s/%2e%2e/etc", &text, "", 400).await;
    expect_error(c.clone(), "PUT", "/s//double", &text, "", 400).await;
    let long: &'static str = Box::leak(format!("/{}", "n".repeat(100)).into_boxed_str());
    expect_error(c.clone(), "PUT", long, &text, "", 400).await;
    expect_error(c.clone(), "PUT", "/__reserved/x", &text, "", 404).await;
    // Methods and missing streams
    expect_error(c.clone(), "PATCH", "/s/text", &[], "", 405).await;
    expect_error(c.clone(), "GET", "/s/missing", &[], "", 404).await;
    expect_error(c.clone(), "POST", "/s/missing", &text, "x", 404).await;
    expect_error(c.clone(), "DELETE", "/s/missing", &[], "", 404).await;

    // After all that the server still serves.
    let r = c.post("/s/text", &text, "still fine").await.unwrap();
    assert_eq!(r.status.as_u16(), 204);
}

/// A body over the limit by less than the drain allowance (16 MiB) is read and
/// dropped before the 413: a server that answered and closed with the body unread
/// left a client still sending it a reset instead of the answer (the Durable Streams
/// conformance suite's 10 MiB append against the default 8 MiB limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_its_413_not_a_reset() {
    let dir = TempDir::new("big-body");
    let server = Server::start(dir.path(), &["--max-append-bytes", "1048576"]).await;
    let c = server.client.clone();
    let bytes = [("content-type", "application/octet-stream")];
    assert_eq!(
        c.put("/s/b", &bytes, "").await.unwrap().status.as_u16(),
        201
    );
    for size in [12 << 20, 2 << 20] {
        let resp = c
            .post("/s/b", &bytes, vec![7u8; size])
            .await
            .unwrap_or_else(|e| panic!("{size} bytes: no answer, {e}"));
        assert_eq!(resp.status.as_u16(), 413, "{size} bytes: {}", resp.text());
        let json: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(json["error"]["code"], "payload_too_large", "{json}");
    }
    // Nothing was appended, and the connection still serves.
    let resp = c.get("/s/b?offset=-1").await.unwrap();
    assert_eq!(resp.status.as_u16(), 200);
    assert!(resp.body.is_empty());
}
