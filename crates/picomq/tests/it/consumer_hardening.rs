//! The consumer surfaces under hostile input, on a production server (`--auth
//! required`):
//! - stream reads never run as a page of the server's origin;
//! - message bodies pass through as they were appended, at any depth.

use picomq_testkit as support;
use serde_json::{json, Value};
use support::{Server, TempDir, ADMIN_SECRET};

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
}
