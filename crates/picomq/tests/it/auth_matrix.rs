//! Who may do what, end to end against the real binary with `--auth required`: for
//! each operation the right scope succeeds, a missing one gets 403 whether or not the
//! stream exists, no token gets 401 with a challenge; expired and revoked tokens fail;
//! namespaced tokens stay inside their namespace; issued tokens never exceed their
//! issuer; admin endpoints need the admin scope; query tokens only ever read; SSE
//! connections end when their token is revoked or expires.

use picomq_testkit as support;

use std::time::Duration;

use picomq_client::{HttpMethod, Response};
use serde_json::{json, Value};
use support::*;

async fn call(
    s: &Server,
    method: HttpMethod,
    path: &str,
    secret: Option<&str>,
    extra: &[(&str, &str)],
    body: &str,
) -> Response {
    let auth = secret.map(bearer);
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    s.client
        .send(method, path, &headers, body.to_string())
        .await
        .expect("request")
}

fn error_of(r: &Response) -> Value {
    serde_json::from_slice::<Value>(&r.body).expect("JSON error body")["error"].clone()
}

/// One operation: its method, a path shape, and the body it sends.
struct OpCase {
    op: &'static str,
    method: HttpMethod,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    /// Status when allowed, on the stream that exists / on the one that does not.
    ok_existing: u16,
}

fn cases() -> Vec<OpCase> {
    vec![
        OpCase {
            op: "create",
            method: HttpMethod::PUT,
            headers: &[("content-type", "text/plain")],
            body: "",
            ok_existing: 200,
        },
        OpCase {
            op: "append",
            method: HttpMethod::POST,
            headers: &[("content-type", "text/plain")],
            body: "x",
            ok_existing: 204,
        },
        OpCase {
            op: "read",
            method: HttpMethod::GET,
            headers: &[],
            body: "",
            ok_existing: 200,
        },
        OpCase {
            op: "read",
            method: HttpMethod::HEAD,
            headers: &[],
            body: "",
            ok_existing: 200,
        },
        OpCase {
            op: "delete",
            method: HttpMethod::DELETE,
            headers: &[],
            body: "",
            ok_existing: 204,
        },
    ]
}

#[tokio::test]
async fn every_operation_needs_its_scope_and_refusals_reveal_nothing() {
    let dir = TempDir::new("auth-matrix");
    let s = start_with_auth(dir.path(), &[]).await;
    let all_ops = ["create", "append", "read", "delete"];
    for case in cases() {
        let others: Vec<&str> = all_ops.iter().copied().filter(|o| *o != case.op).collect();
        let (_, without) = issue_token(
            &s.client,
            ADMIN_SECRET,
            json!({ "scopes": [format!("{}:m/**", others.join(","))] }),
        )
        .await;
        let (_, with) = issue_token(
            &s.client,
            ADMIN_SECRET,
            json!({ "scopes": [format!("{}:m/**", case.op)] }),
        )
        .await;
        let (_, elsewhere) = issue_token(
            &s.client,
            ADMIN_SECRET,
            json!({ "scopes": ["all:other/**"] }),
        )
        .await;
        // A fresh existing stream per case (delete removes it).
        let r = call(
            &s,
            HttpMethod::PUT,
            "/m/exists",
            Some(ADMIN_SECRET),
            &[("content-type", "text/plain")],
            "",
        )
        .await;
        assert!(r.status.is_success(), "{}", r.text());
        let label = format!("{} {:?}", case.op, case.method);

        // No token: 401 with a Bearer challenge, existing or not.
        for path in ["/m/exists", "/m/missing"] {
            let r = call(&s, case.method.clone(), path, None, case.headers, case.body).await;
            assert_eq!(r.status.as_u16(), 401, "{label} {path}");
            assert!(
                r.header("www-authenticate")
                    .unwrap()
                    .starts_with("Bearer realm=\"picomq\""),
                "{label}"
            );
        }
        // Missing scope (or scope on other streams): 403, identical for both paths.
        for secret in [&without, &elsewhere] {
            let a = call(
                &s,
                case.method.clone(),
                "/m/exists",
                Some(secret),
                case.headers,
                case.body,
            )
            .await;
            let b = call(
                &s,
                case.method.clone(),
                "/m/missing",
                Some(secret),
                case.headers,
                case.body,
            )
            .await;
            assert_eq!(a.status.as_u16(), 403, "{label}: {}", a.text());
            assert_eq!(b.status.as_u16(), 403, "{label}: {}", b.text());
            assert_eq!(
                a.body, b.body,
                "{label}: a refusal must not depend on existence"
            );
            assert_eq!(a.header("stream-next-offset"), None);
            if case.method != HttpMethod::HEAD {
                assert_eq!(error_of(&a)["code"], "forbidden");
            }
        }
        // The right scope: the operation happens.
        let r = call(
            &s,
            case.method.clone(),
            "/m/exists",
            Some(&with),
            case.headers,
            case.body,
        )
        .await;
        assert_eq!(r.status.as_u16(), case.ok_existing, "{label}: {}", r.text());
        if case.op == "create" {
            let r = call(&s, HttpMethod::PUT, "/m/new", Some(&with), case.headers, "").await;
            assert_eq!(r.status.as_u16(), 201, "{label}");
        }
    }
    // After the delete case the stream is gone: the admin sees 404.
    let r = call(
        &s,
        HttpMethod::GET,
        "/m/exists",
        Some(ADMIN_SECRET),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 404);
}

#[tokio::test]
async fn expired_revoked_and_unknown_tokens_fail_at_once() {
    let dir = TempDir::new("auth-lifecycle");
    let s = start_with_auth_as(dir.path(), &[], true).await;
    call(&s, HttpMethod::PUT, "/s", Some(ADMIN_SECRET), &[], "").await;
    let (_, short) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["read"], "expiresInSeconds": 1 }),
    )
    .await;
    assert_eq!(
        call(&s, HttpMethod::GET, "/s", Some(&short), &[], "")
            .await
            .status
            .as_u16(),
        200
    );
    eventually(Duration::from_secs(5), || async {
        let r = call(&s, HttpMethod::GET, "/s", Some(&short), &[], "").await;
        (r.status.as_u16() == 401).then_some(r)
    })
    .await;
    let r = call(&s, HttpMethod::GET, "/s", Some(&short), &[], "").await;
    assert!(r
        .header("www-authenticate")
        .unwrap()
        .contains("invalid_token"));
    assert!(error_of(&r)["message"]
        .as_str()
        .unwrap()
        .contains("expired"));

    // Revocation: the very next request fails, and so do tokens issued under it.
    let (parent_id, parent) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["read,tokens"] }),
    )
    .await;
    let (_, child) = issue_token(&s.client, &parent, json!({ "scopes": ["read"] })).await;
    assert_eq!(
        call(&s, HttpMethod::GET, "/s", Some(&child), &[], "")
            .await
            .status
            .as_u16(),
        200
    );
    let r = call(
        &s,
        HttpMethod::DELETE,
        &format!("/__picomq/tokens/{parent_id}"),
        Some(ADMIN_SECRET),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    for secret in [&parent, &child] {
        let r = call(&s, HttpMethod::GET, "/s", Some(secret), &[], "").await;
        assert_eq!(r.status.as_u16(), 401);
        assert!(error_of(&r)["message"]
            .as_str()
            .unwrap()
            .contains("revoked"));
    }
    // Unknown and malformed credentials.
    for bad in ["pmq_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "short"] {
        let r = call(&s, HttpMethod::GET, "/s", Some(bad), &[], "").await;
        assert_eq!(r.status.as_u16(), 401, "{bad}");
    }
    let r = call(
        &s,
        HttpMethod::GET,
        "/s",
        None,
        &[("authorization", "Basic abc")],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 401);

    // Revocation survives a restart (the table is the truth, the cache follows it).
    let mut s = s;
    s.restart().await;
    assert_eq!(
        call(&s, HttpMethod::GET, "/s", Some(&child), &[], "")
            .await
            .status
            .as_u16(),
        401
    );
    assert_eq!(
        call(&s, HttpMethod::GET, "/s", Some(ADMIN_SECRET), &[], "")
            .await
            .status
            .as_u16(),
        200
    );
}

/// Reads an SSE body until it ends; `Err` with what arrived if it is still open
/// after `within`.
async fn ends_within(sse: &mut picomq_client::Streaming, within: Duration) -> Result<(), String> {
    let mut seen = String::new();
    let read = async {
        while let Some(chunk) = sse.next_chunk().await {
            match chunk {
                Ok(c) => seen.push_str(&String::from_utf8_lossy(&c)),
                Err(_) => break, // cut mid-body: ended too
            }
        }
    };
    match tokio::time::timeout(within, read).await {
        Ok(()) => Ok(()),
        Err(_) => Err(seen),
    }
}

#[tokio::test]
async fn sse_ends_when_its_token_is_revoked_or_expires() {
    let dir = TempDir::new("auth-sse-revoke");
    let s = start_with_auth(dir.path(), &[]).await;
    call(
        &s,
        HttpMethod::PUT,
        "/s",
        Some(ADMIN_SECRET),
        &[("content-type", "text/plain")],
        "",
    )
    .await;
    let (revoked_id, revoked) =
        issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read"] })).await;
    let (_, expiring) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["read"], "expiresInSeconds": 3 }),
    )
    .await;
    let (_, kept) = issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read"] })).await;
    let open = |secret: String| {
        let client = s.client.clone();
        async move {
            let auth = bearer(&secret);
            let mut sse = client
                .open(
                    HttpMethod::GET,
                    "/s?offset=-1&live=sse",
                    &[("authorization", auth.as_str())],
                    "",
                )
                .await
                .unwrap();
            assert_eq!(sse.status.as_u16(), 200);
            // The first control event: the connection is being served.
            let first = sse.next_chunk().await.unwrap().unwrap();
            assert!(String::from_utf8_lossy(&first).contains("control"));
            sse
        }
    };
    let mut sse_revoked = open(revoked.clone()).await;
    let mut sse_expiring = open(expiring.clone()).await;
    let mut sse_kept = open(kept.clone()).await;

    let r = call(
        &s,
        HttpMethod::DELETE,
        &format!("/__picomq/tokens/{revoked_id}"),
        Some(ADMIN_SECRET),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    ends_within(&mut sse_revoked, Duration::from_secs(2))
        .await
        .expect("the revoked token's SSE connection ended");
    // Coming back with it is refused.
    let r = call(
        &s,
        HttpMethod::GET,
        "/s?offset=-1&live=sse",
        Some(&revoked),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 401);

    // The kept token's connection was woken by the revocation too, and stays open:
    // new data arrives.
    let r = call(
        &s,
        HttpMethod::POST,
        "/s",
        Some(ADMIN_SECRET),
        &[("content-type", "text/plain")],
        "after-revocation",
    )
    .await;
    assert!(r.status.is_success(), "{}", r.text());
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        let mut seen = String::new();
        while !seen.contains("after-revocation") {
            let chunk = sse_kept.next_chunk().await.unwrap().unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(got.is_ok(), "data reached an SSE reader whose token holds");

    // The expiring token's connection ends when the token does (3 s after issue),
    // without waiting for --sse-max-duration or for data.
    ends_within(&mut sse_expiring, Duration::from_secs(6))
        .await
        .expect("the expired token's SSE connection ended");
    assert!(
        ends_within(&mut sse_kept, Duration::from_millis(500))
            .await
            .is_err(),
        "a valid token's SSE connection stays open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_quota_holds_under_concurrent_creates() {
    let dir = TempDir::new("auth-quota-race");
    let s = start_with_auth(dir.path(), &["--max-streams-per-namespace", "5"]).await;
    let (_, tenant) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["all"], "namespace": "tenant-q/" }),
    )
    .await;
    let mut creates = Vec::new();
    for i in 0..40 {
        let client = s.client.clone();
        let auth = bearer(&tenant);
        creates.push(tokio::spawn(async move {
            let headers = [
                ("authorization", auth.as_str()),
                ("content-type", "text/plain"),
            ];
            let r = client
                .send(HttpMethod::PUT, &format!("/s{i}"), &headers, "x")
                .await
                .expect("request");
            (r.status.as_u16(), r.text())
        }));
    }
    let mut created = 0;
    for c in creates {
        let (status, body) = c.await.unwrap();
        match status {
            201 => created += 1,
            403 => assert!(body.contains("namespace_quota_exceeded"), "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(created, 5, "exactly the quota, however many race for it");
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/streams?prefix=tenant-q/",
        Some(ADMIN_SECRET),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let listed: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        listed["streams"].as_array().map(Vec::len),
        Some(5),
        "{listed}"
    );
}

#[tokio::test]
async fn namespaced_tokens_cannot_reach_outside_their_namespace() {
    let dir = TempDir::new("auth-namespace");
    let s = start_with_auth(dir.path(), &["--max-streams-per-namespace", "3"]).await;
    call(
        &s,
        HttpMethod::PUT,
        "/secret",
        Some(ADMIN_SECRET),
        &[("content-type", "text/plain")],
        "top secret",
    )
    .await;
    let (_, tenant) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["all"], "namespace": "tenant-a/" }),
    )
    .await;

    // Its names are relative: /orders is tenant-a/orders.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/orders",
        Some(&tenant),
        &[("content-type", "text/plain")],
        "o1",
    )
    .await;
    assert_eq!(r.status.as_u16(), 201);
    assert!(
        r.header("location").unwrap().ends_with("/orders"),
        "{:?}",
        r.header("location")
    );
    let r = call(
        &s,
        HttpMethod::GET,
        "/tenant-a/orders?offset=-1",
        Some(ADMIN_SECRET),
        &[],
        "",
    )
    .await;
    assert_eq!(r.text(), "o1");
    // The admin's /secret is out of reach: /secret means tenant-a/secret.
    let r = call(
        &s,
        HttpMethod::GET,
        "/secret?offset=-1",
        Some(&tenant),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 404);
    for path in ["/../secret", "/%2e%2e/secret"] {
        let r = call(&s, HttpMethod::GET, path, Some(&tenant), &[], "").await;
        assert!(
            r.status.as_u16() == 400 || r.status.as_u16() == 404,
            "{path}: {}",
            r.status
        );
        assert!(!r.text().contains("top secret"));
    }
    // Forking reads the source, which is namespaced too.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/copy",
        Some(&tenant),
        &[("stream-forked-from", "/secret")],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 404, "{}", r.text());
    // Listing shows only its own streams, by their relative names.
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/streams",
        Some(&tenant),
        &[],
        "",
    )
    .await;
    let names: Vec<String> = serde_json::from_slice::<Value>(&r.body).unwrap()["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["orders"]);
    // A token it issues lives inside its namespace, nested further.
    let (_, sub) = issue_token(
        &s.client,
        &tenant,
        json!({ "scopes": ["read"], "namespace": "team/" }),
    )
    .await;
    call(
        &s,
        HttpMethod::PUT,
        "/team/x",
        Some(&tenant),
        &[("content-type", "text/plain")],
        "tx",
    )
    .await;
    let r = call(&s, HttpMethod::GET, "/x?offset=-1", Some(&sub), &[], "").await;
    assert_eq!(r.text(), "tx");
    // The namespace quota: three streams, then 403 (re-creating one is fine).
    let r = call(
        &s,
        HttpMethod::PUT,
        "/third",
        Some(&tenant),
        &[("content-type", "text/plain")],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 201);
    let r = call(
        &s,
        HttpMethod::PUT,
        "/fourth",
        Some(&tenant),
        &[("content-type", "text/plain")],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    assert_eq!(error_of(&r)["code"], "namespace_quota_exceeded");
    let r = call(
        &s,
        HttpMethod::PUT,
        "/orders",
        Some(&tenant),
        &[("content-type", "text/plain")],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

#[tokio::test]
async fn issued_tokens_never_exceed_their_issuer() {
    let dir = TempDir::new("auth-escalation");
    let s = start_with_auth(dir.path(), &[]).await;
    let (_, manager) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["read,append,tokens:m/**"], "expiresInSeconds": 3600 }),
    )
    .await;
    let (_, reader) =
        issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read:m/**"] })).await;
    let post = |secret: String, body: Value| {
        let s = &s;
        async move {
            call(
                s,
                HttpMethod::POST,
                "/__picomq/tokens",
                Some(&secret),
                &[("content-type", "application/json")],
                &body.to_string(),
            )
            .await
        }
    };
    for (body, why) in [
        (json!({ "scopes": ["read:**"] }), "wider pattern"),
        (json!({ "scopes": ["delete:m/**"] }), "operation it lacks"),
        (
            json!({ "scopes": ["read:m/*"], "expiresInSeconds": 7200 }),
            "later expiry",
        ),
        (json!({ "scopes": ["admin"] }), "admin"),
        (json!({ "scopes": ["read:*/x"] }), "glob reaching outside"),
    ] {
        let r = post(manager.clone(), body).await;
        assert_eq!(r.status.as_u16(), 403, "{why}: {}", r.text());
    }
    // Within its rights it may issue, and the child inherits its expiry.
    let r = post(
        manager.clone(),
        json!({ "scopes": ["read:m/a", "append:m/x/**"] }),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    assert!(serde_json::from_slice::<Value>(&r.body).unwrap()["expiresAt"].is_string());
    // Without the tokens scope it may not issue at all, nor list.
    assert_eq!(
        post(reader.clone(), json!({ "scopes": ["read:m/a"] }))
            .await
            .status
            .as_u16(),
        403
    );
    assert_eq!(
        call(
            &s,
            HttpMethod::GET,
            "/__picomq/tokens",
            Some(&reader),
            &[],
            ""
        )
        .await
        .status
        .as_u16(),
        403
    );
    // Bad requests are 400 with a reason.
    for body in [
        json!({ "scopes": [] }),
        json!({ "scopes": ["fly:x"] }),
        json!({ "scopes": ["read"], "namespace": "no-slash" }),
        json!({ "nope": 1 }),
    ] {
        let r = post(ADMIN_SECRET.to_string(), body.clone()).await;
        assert_eq!(r.status.as_u16(), 400, "{body}: {}", r.text());
    }
    // The manager lists itself and its child, never the admin's other tokens.
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/tokens",
        Some(&manager),
        &[],
        "",
    )
    .await;
    let listed = serde_json::from_slice::<Value>(&r.body).unwrap()["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(listed, 2, "{}", r.text());
    assert!(
        !r.text().contains("pmq_"),
        "listing must never show secrets"
    );
}

#[tokio::test]
async fn admin_endpoints_and_query_tokens() {
    let dir = TempDir::new("auth-admin");
    let s = start_with_auth(dir.path(), &[]).await;
    let (_, reader) = issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read:**"] })).await;
    assert_eq!(
        call(&s, HttpMethod::GET, "/metrics", None, &[], "")
            .await
            .status
            .as_u16(),
        401
    );
    assert_eq!(
        call(&s, HttpMethod::GET, "/metrics", Some(&reader), &[], "")
            .await
            .status
            .as_u16(),
        403
    );
    assert_eq!(
        call(&s, HttpMethod::GET, "/metrics", Some(ADMIN_SECRET), &[], "")
            .await
            .status
            .as_u16(),
        200
    );
    assert_eq!(
        call(&s, HttpMethod::GET, "/healthz", None, &[], "")
            .await
            .status
            .as_u16(),
        200
    );

    call(
        &s,
        HttpMethod::PUT,
        "/feed",
        Some(ADMIN_SECRET),
        &[("content-type", "text/plain")],
        "hello",
    )
    .await;
    call(
        &s,
        HttpMethod::PUT,
        "/other",
        Some(ADMIN_SECRET),
        &[("content-type", "text/plain")],
        "nope",
    )
    .await;
    let r = call(
        &s,
        HttpMethod::POST,
        "/__picomq/read-tokens",
        Some(&reader),
        &[],
        &json!({ "stream": "feed", "expiresInSeconds": 60 }).to_string(),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let link = v["token"].as_str().unwrap().to_string();
    assert_eq!(v["path"], "/feed");
    // Reads with it work, SSE included.
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("/feed?offset=-1&token={link}"),
        None,
        &[],
        "",
    )
    .await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "hello"));
    assert_eq!(
        call(
            &s,
            HttpMethod::HEAD,
            &format!("/feed?token={link}"),
            None,
            &[],
            ""
        )
        .await
        .status
        .as_u16(),
        200
    );
    let mut sse = s
        .client
        .open(
            HttpMethod::GET,
            &format!("/feed?offset=-1&live=sse&token={link}"),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200);
    let first = sse.next_chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("hello"));
    // Never for writes, never for another stream, never tampered with.
    for method in [HttpMethod::POST, HttpMethod::PUT, HttpMethod::DELETE] {
        let r = call(
            &s,
            method.clone(),
            &format!("/feed?token={link}"),
            None,
            &[("content-type", "text/plain")],
            "x",
        )
        .await;
        assert_eq!(r.status.as_u16(), 401, "{method:?}");
    }
    assert_eq!(
        call(
            &s,
            HttpMethod::GET,
            &format!("/other?offset=-1&token={link}"),
            None,
            &[],
            ""
        )
        .await
        .status
        .as_u16(),
        401
    );
    let tampered = link.replacen("pmqr1.", "pmqr1.9", 1);
    assert_eq!(
        call(
            &s,
            HttpMethod::GET,
            &format!("/feed?offset=-1&token={tampered}"),
            None,
            &[],
            ""
        )
        .await
        .status
        .as_u16(),
        401
    );
    // Nor can it mint, list or see metrics.
    assert_eq!(
        call(
            &s,
            HttpMethod::GET,
            &format!("/__picomq/streams?token={link}"),
            None,
            &[],
            ""
        )
        .await
        .status
        .as_u16(),
        403
    );
    // Minting needs read on that stream, and a bounded lifetime.
    let (_, appender) =
        issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["append:**"] })).await;
    let r = call(
        &s,
        HttpMethod::POST,
        "/__picomq/read-tokens",
        Some(&appender),
        &[],
        &json!({ "stream": "feed" }).to_string(),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403);
    let r = call(
        &s,
        HttpMethod::POST,
        "/__picomq/read-tokens",
        Some(&reader),
        &[],
        &json!({ "stream": "feed", "expiresInSeconds": 86400 }).to_string(),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400);
}

#[tokio::test]
async fn startup_refuses_unsafe_configurations() {
    let dir = TempDir::new("auth-startup");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_picomq"))
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .args(args)
            .env_remove("PICOMQ_AUTH")
            .output()
            .expect("run picomq")
    };
    // Public address without auth: refused, and the message says how to proceed.
    let out = run(&["--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-unauthenticated-public"), "{err}");
    // Auth required without any token: refused.
    let out = run(&["--listen", "127.0.0.1:0", "--auth", "required"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bootstrap-token-file"));
    // A weak bootstrap secret: refused.
    let weak = dir.path().join("weak");
    std::fs::write(&weak, "admin").unwrap();
    let out = run(&[
        "--listen",
        "127.0.0.1:0",
        "--auth",
        "required",
        "--bootstrap-token-file",
        weak.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("too short"));
}

#[tokio::test]
async fn public_address_allowed_when_explicit() {
    let dir = TempDir::new("auth-public");
    // The support server listens on 127.0.0.1; the flag must be accepted and harmless.
    let s = Server::start(dir.path(), &["--allow-unauthenticated-public"]).await;
    assert_eq!(s.client.get("/healthz").await.unwrap().status.as_u16(), 200);
}
