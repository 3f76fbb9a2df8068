//! The consumer surfaces under hostile input, on a production server (`--auth
//! required`):
//! - stream reads never run as a page of the server's origin;
//! - message bodies pass through as they were appended, at any depth;
//! - a dead-letter stream that refuses never wedges its group;
//! - names no request could address are refused when they are given;
//! - webhooks reach public addresses only.

use std::time::Duration;

use picomq_testkit as support;
use serde_json::{json, Value};
use support::{eventually, Server, TempDir, ADMIN_SECRET};

/// Headers of an admin request, with a JSON body.
fn admin_json() -> Vec<(&'static str, String)> {
    vec![
        ("authorization", support::bearer(ADMIN_SECRET)),
        ("content-type", "application/json".to_string()),
    ]
}

fn as_refs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// An admin request; returns status and body text.
async fn admin(s: &Server, method: &str, path: &str, body: &str) -> (u16, String) {
    let h = admin_json();
    let method = picomq_client::HttpMethod::from_bytes(method.as_bytes()).unwrap();
    let r = s
        .client
        .send(method, path, &as_refs(&h), body.to_string())
        .await
        .unwrap();
    (r.status.as_u16(), r.text())
}

async fn append(s: &Server, path: &str, body: &str) {
    let (status, text) = admin(s, "POST", path, body).await;
    assert!(
        (200..300).contains(&status),
        "append to {path}: {status} {text}"
    );
}

/// A 400 with a JSON error body that says something.
fn assert_refused(what: &str, status: u16, text: &str) {
    assert_eq!(status, 400, "{what}: {text}");
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: not a JSON error: {text}"
    );
}

async fn group_status(s: &Server, group: &str) -> Value {
    let (status, text) = admin(s, "GET", &format!("/__picomq/groups/{group}"), "").await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

async fn claim(s: &Server, group: &str, wait_ms: u64) -> Value {
    let body = json!({"consumer": "c", "max": 10, "waitMs": wait_ms}).to_string();
    let (status, text) = admin(s, "POST", &format!("/__picomq/groups/{group}/claim"), &body).await;
    assert_eq!(status, 200, "claim: {text}");
    serde_json::from_str(&text).unwrap()
}

/// A `text/html` stream is served with `Content-Security-Policy: sandbox` and
/// `nosniff` on every kind of read (catch-up, HEAD, long-poll, SSE, native
/// records, a signed read token's plain link); the console keeps its own policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reads_never_run_as_a_page_of_the_server() {
    let dir = TempDir::new("hardening-csp");
    let s = support::start_with_auth(dir.path(), &[]).await;
    let auth = support::bearer(ADMIN_SECRET);
    let html = [
        ("authorization", auth.as_str()),
        ("content-type", "text/html"),
    ];
    let page = "<script>alert(sessionStorage.length)</script>";
    let r = s.client.put("/page", &html, page).await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let (status, text) = admin(
        &s,
        "POST",
        "/__picomq/read-tokens",
        &json!({"stream": "page"}).to_string(),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let token = serde_json::from_str::<Value>(&text).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let a = [("authorization", auth.as_str())];
    let check = |what: &str, csp: Option<&str>, nosniff: Option<&str>| {
        assert_eq!(csp, Some("sandbox"), "{what}");
        assert_eq!(nosniff, Some("nosniff"), "{what}");
    };
    let get = picomq_client::HttpMethod::GET;
    for (what, path) in [
        ("catch-up", "/page?offset=-1".to_string()),
        ("signed link", format!("/page?offset=-1&token={token}")),
        ("long-poll", "/page?offset=now&live=long-poll".to_string()),
        (
            "native records",
            "/__picomq/streams/page/records".to_string(),
        ),
    ] {
        let headers: &[(&str, &str)] = if what == "signed link" { &[] } else { &a };
        let r = s
            .client
            .send(get.clone(), &path, headers, "")
            .await
            .unwrap();
        assert!(r.status.is_success(), "{what}: {} {}", r.status, r.text());
        let h = |n: &str| r.headers.get(n).and_then(|v| v.to_str().ok());
        check(
            what,
            h("content-security-policy"),
            h("x-content-type-options"),
        );
    }
    let r = s
        .client
        .send(picomq_client::HttpMethod::HEAD, "/page", &a, "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    check(
        "HEAD",
        r.header("content-security-policy"),
        r.header("x-content-type-options"),
    );
    let r = s
        .client
        .open(get.clone(), "/page?offset=-1&live=sse", &a, "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    let h = |n: &str| r.headers.get(n).and_then(|v| v.to_str().ok());
    check(
        "SSE",
        h("content-security-policy"),
        h("x-content-type-options"),
    );
    drop(r);
    let r = s.client.get("/__picomq/console").await.unwrap();
    let csp = r.header("content-security-policy").unwrap_or("");
    assert!(csp.contains("default-src 'self'"), "console: {csp}");
}

/// A dead-letter stream that is closed (or not JSON) does not take a message out
/// of deliveries: the message is parked (status and metric say so), the group's
/// other messages keep flowing, and once the dead-letter stream can take it
/// again, it is dead-lettered: nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stream_that_refuses_never_wedges_its_group() {
    let dir = TempDir::new("hardening-dlq");
    let s = support::start_with_auth(dir.path(), &[]).await;
    assert_eq!(admin(&s, "PUT", "/work", "[]").await.0, 201);
    assert_eq!(admin(&s, "PUT", "/dlq", "[]").await.0, 201);
    let auth = support::bearer(ADMIN_SECRET);
    let close = [("authorization", auth.as_str()), ("stream-closed", "true")];
    let r = s.client.post("/dlq", &close, "").await.unwrap();
    assert!(r.status.is_success(), "{}", r.text());
    let text_plain = [
        ("authorization", auth.as_str()),
        ("content-type", "text/plain"),
    ];
    let r = s.client.put("/dlq-text", &text_plain, "").await.unwrap();
    assert_eq!(r.status.as_u16(), 201);
    for (group, dlq) in [("g", "dlq"), ("t", "dlq-text")] {
        let body = json!({"stream": "work", "maxDeliveries": 1, "deadLetter": dlq});
        let (status, text) = admin(
            &s,
            "PUT",
            &format!("/__picomq/groups/{group}"),
            &body.to_string(),
        )
        .await;
        assert_eq!(status, 201, "{text}");
    }
    append(&s, "/work", r#"{"n":1}"#).await;

    for group in ["g", "t"] {
        let first = claim(&s, group, 0).await;
        let id = first["messages"][0]["id"].clone();
        assert_eq!(first["messages"][0]["body"], json!({"n": 1}));
        let nack = json!({"ids": [id]}).to_string();
        let (status, text) =
            admin(&s, "POST", &format!("/__picomq/groups/{group}/nack"), &nack).await;
        assert_eq!(status, 200, "a refused dead letter fails nobody: {text}");
        let st = group_status(&s, group).await;
        assert_eq!(st["parked"]["messages"], 1, "{st}");
        assert!(
            st["parked"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains(if group == "g" { "closed" } else { "ontent" }),
            "{st}"
        );
        assert_eq!(st["deadLettered"], 0);
        assert_eq!(st["pending"], 0, "a parked message is not pending: {st}");
    }
    let parked = support::metric_as(&s.client, Some(ADMIN_SECRET), "picomq_group_parked").await;
    assert_eq!(parked, 2.0);

    // The group keeps flowing: the next message is claimed, the parked one is not
    // delivered again.
    append(&s, "/work", r#"{"n":2}"#).await;
    let next = claim(&s, "g", 0).await;
    let bodies: Vec<&Value> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["body"])
        .collect();
    assert_eq!(bodies, [&json!({"n": 2})]);
    let ack = json!({"ids": [next["messages"][0]["id"]]}).to_string();
    assert_eq!(
        admin(&s, "POST", "/__picomq/groups/g/ack", &ack).await.0,
        200
    );

    // The closed stream goes away: the next attempt creates it and dead-letters.
    assert_eq!(admin(&s, "DELETE", "/dlq", "").await.0, 204);
    eventually(Duration::from_secs(10), || async {
        let m = claim(&s, "g", 300).await;
        assert!(m["messages"].as_array().unwrap().is_empty(), "{m}");
        let st = group_status(&s, "g").await;
        (st["deadLettered"] == 1 && st["parked"]["messages"] == 0).then_some(())
    })
    .await;
    let h = admin_json();
    let r = s
        .client
        .send(
            picomq_client::HttpMethod::GET,
            "/dlq?offset=-1",
            &as_refs(&h),
            "",
        )
        .await
        .unwrap();
    let dead: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(dead[0]["body"], json!({"n": 1}), "{dead}");
    assert_eq!(dead[0]["group"], "g");
}

/// On a production server, webhook URLs to loopback are refused with a reason in
/// every literal form, as `localhost` and as `.localhost` names;
/// `--webhook-allow-private` opens local receivers on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_go_to_public_addresses_only_on_a_production_server() {
    let dir = TempDir::new("hardening-webhooks");
    let s = support::start_with_auth(dir.path(), &[]).await;
    let port = support::free_port();
    for url in [
        format!("http://2130706433:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://127.0.0.1:{port}/"),
        "https://127.0.0.1/".to_string(),
        "https://0x7f.1/".to_string(),
        "https://foo.localhost/".to_string(),
        "https://[64:ff9b::7f00:1]/".to_string(),
        "https://[2002:7f00:1::]/".to_string(),
        "https://[::ffff:127.0.0.1]/".to_string(),
        "https://[::1]/".to_string(),
    ] {
        let body = json!({"type": "webhook", "streams": ["a"], "webhook": {"url": url}});
        let (status, text) =
            admin(&s, "PUT", "/v1/__ds/subscriptions/hook", &body.to_string()).await;
        assert_refused(&url, status, &text);
        assert!(text.contains("WEBHOOK_URL_REJECTED"), "{url}: {text}");
    }
    let body = json!({"type": "webhook", "streams": ["a"],
        "webhook": {"url": "https://hooks.example.com/x"}});
    let (status, text) = admin(&s, "PUT", "/v1/__ds/subscriptions/hook", &body.to_string()).await;
    assert_eq!(status, 201, "a public https:// receiver is fine: {text}");
    drop(s);

    let dir = TempDir::new("hardening-webhooks-private");
    let s = support::start_with_auth(dir.path(), &["--webhook-allow-private"]).await;
    let body = json!({"type": "webhook", "streams": ["a"],
        "webhook": {"url": format!("http://127.0.0.1:{port}/")}});
    let (status, text) = admin(&s, "PUT", "/v1/__ds/subscriptions/hook", &body.to_string()).await;
    assert_eq!(status, 201, "allowed on purpose: {text}");
}

/// JSON nested deeper than a `serde_json::Value` goes (128) comes out of a claim
/// and out of the dead-letter stream as the bytes that were appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_pass_through_untouched_at_any_depth() {
    let dir = TempDir::new("hardening-raw");
    let s = support::start_with_auth(dir.path(), &[]).await;
    let deep = format!(
        "{}{}{}",
        "[".repeat(300),
        r#"{"x":"é\"q"}"#,
        "]".repeat(300)
    );
    let message = format!(r#"{{"deep":{deep}}}"#);
    assert_eq!(admin(&s, "PUT", "/raw", "[]").await.0, 201);
    append(&s, "/raw", &message).await;
    let body = json!({"stream": "raw", "maxDeliveries": 1, "deadLetter": "raw-dlq"});
    let (status, text) = admin(&s, "PUT", "/__picomq/groups/deep", &body.to_string()).await;
    assert_eq!(status, 201, "{text}");

    let (status, text) = admin(
        &s,
        "POST",
        "/__picomq/groups/deep/claim",
        r#"{"consumer":"c"}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        text.contains(&format!(r#""body":{message}"#)),
        "the claim carries the message as appended: {}",
        &text[..text.len().min(300)]
    );
    let id_at = text.find(r#""id":""#).unwrap() + 6;
    let id = &text[id_at..id_at + text[id_at..].find('"').unwrap()];
    let nack = json!({"ids": [id]}).to_string();
    assert_eq!(
        admin(&s, "POST", "/__picomq/groups/deep/nack", &nack)
            .await
            .0,
        200
    );
    let h = admin_json();
    let r = s
        .client
        .send(
            picomq_client::HttpMethod::GET,
            "/raw-dlq?offset=-1",
            &as_refs(&h),
            "",
        )
        .await
        .unwrap();
    assert!(
        r.text().contains(&format!(r#""body":{message}"#)),
        "the dead letter carries it too: {}",
        r.text()
    );
    // The Rust SDK hands the same bytes on.
    append(&s, "/raw", &message).await;
    let mq = picomq_client::PicoMq::builder(&s.url)
        .token(ADMIN_SECRET)
        .build()
        .unwrap();
    let claimed = mq
        .group("deep")
        .claim("sdk", 1, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(&claimed.messages[0].body[..], message.as_bytes());
    assert!(
        claimed.messages[0].json.is_none(),
        "deeper than a Value goes"
    );
}

/// Names no request could address afterwards are refused when given: dead-letter
/// streams with `..`, `.` or empty segments, reserved or unsendable names; group
/// names `.` and `..`; a position's consumer `..`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_no_request_could_address_are_refused() {
    let dir = TempDir::new("hardening-names");
    let s = support::start_with_auth(dir.path(), &[]).await;
    assert_eq!(admin(&s, "PUT", "/q", "[]").await.0, 201);
    for dlq in ["a/../b", "..", "a/./b", "a//b", "a/", "__x", "a b", "", "q"] {
        let body = json!({"stream": "q", "deadLetter": dlq}).to_string();
        let (status, text) = admin(&s, "PUT", "/__picomq/groups/g", &body).await;
        assert_refused(dlq, status, &text);
    }
    let body = json!({"stream": "q", "deadLetter": "dead/letters"}).to_string();
    assert_eq!(admin(&s, "PUT", "/__picomq/groups/g", &body).await.0, 201);
    for group in [".", ".."] {
        let body = json!({"stream": "q"}).to_string();
        let (status, text) = admin(&s, "PUT", &format!("/__picomq/groups/{group}"), &body).await;
        assert_refused(group, status, &text);
    }
    let commit = json!({"offset": "-1"}).to_string();
    let (status, text) = admin(&s, "PUT", "/__picomq/positions/../q", &commit).await;
    assert_refused("consumer ..", status, &text);
    let (status, text) = admin(&s, "GET", "/q?consumer=..", "").await;
    assert_refused("?consumer=..", status, &text);
}
