//! The consumer surfaces under `--auth required`, tried as an attacker would: every
//! stream a subscription or a group reaches indirectly (wake streams, linked and
//! glob-matched streams, claimed bodies, dead letters, fork sources) is checked for
//! the operation performed on it, names stay inside a token's namespace, and a
//! stream the caller may not see answers exactly as a missing one.

use picomq_testkit as support;

use picomq_client::{HttpMethod, Response};
use serde_json::{json, Value};
use support::*;

async fn call(s: &Server, method: HttpMethod, path: &str, secret: &str, body: Value) -> Response {
    let auth = bearer(secret);
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    s.client
        .send(
            method,
            path,
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await
        .expect("request")
}

async fn json_stream(s: &Server, name: &str) {
    let r = call(
        s,
        HttpMethod::PUT,
        &format!("/{name}"),
        ADMIN_SECRET,
        Value::Null,
    )
    .await;
    assert!(r.status.is_success(), "{name}: {}", r.text());
}

async fn append(s: &Server, name: &str, body: Value) {
    let r = call(s, HttpMethod::POST, &format!("/{name}"), ADMIN_SECRET, body).await;
    assert!(r.status.is_success(), "{name}: {}", r.text());
}

async fn tail(s: &Server, name: &str) -> String {
    let r = call(
        s,
        HttpMethod::HEAD,
        &format!("/{name}"),
        ADMIN_SECRET,
        Value::Null,
    )
    .await;
    r.header("stream-next-offset").expect("offset").to_string()
}

async fn token(s: &Server, scopes: &[&str], namespace: &str) -> String {
    issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": scopes, "namespace": namespace }),
    )
    .await
    .1
}

fn code(r: &Response) -> String {
    serde_json::from_slice::<Value>(&r.body).map_or(String::new(), |v| {
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    })
}

/// A subscribe-only token cannot make a pull-wake subscription write wake events
/// into a stream it may not append to, nor link streams it may not read.
#[tokio::test]
async fn a_subscription_reaches_only_streams_its_token_may_use() {
    let dir = TempDir::new("authc-wake");
    let s = start_with_auth(dir.path(), &[]).await;
    for name in ["a/s1", "b/secret"] {
        json_stream(&s, name).await;
    }
    append(&s, "b/secret", json!({"k": 1})).await;
    let evil = token(&s, &["subscribe:__ds/subscriptions/evil"], "").await;
    let before = tail(&s, "b/secret").await;

    // The wake stream is appended to: append is needed there.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/evil",
        &evil,
        json!({"type":"pull-wake","streams":["a/s1"],"wake_stream":"b/secret","lease_ttl_ms":30000}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    append(&s, "a/s1", json!({"x": 1})).await;
    assert_eq!(tail(&s, "b/secret").await, before, "nothing was written");

    // Linked streams are read (names and tails go out with wakes): read is needed,
    // and the answer for an existing stream equals that for a missing one.
    let both = |streams: Value| json!({"type":"pull-wake","streams":streams,"wake_stream":"w","lease_ttl_ms":30000});
    let mine = token(
        &s,
        &["subscribe:__ds/subscriptions/**", "append:w", "read:a/**"],
        "",
    )
    .await;
    let existing = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/e1",
        &mine,
        both(json!(["b/secret"])),
    )
    .await;
    let missing = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/e1",
        &mine,
        both(json!(["b/nonexist"])),
    )
    .await;
    assert_eq!(existing.status.as_u16(), 403, "{}", existing.text());
    assert_eq!(existing.status, missing.status);
    assert_eq!(existing.body, missing.body);

    // A glob is read wherever it can match: `**` needs read on every stream, and
    // `a/**` also matches the stream `a` itself.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/g1",
        &mine,
        json!({"type":"pull-wake","pattern":"**","wake_stream":"w"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/g1",
        &mine,
        json!({"type":"pull-wake","pattern":"b/*","wake_stream":"w"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/g1",
        &mine,
        json!({"type":"pull-wake","pattern":"a/**","wake_stream":"w"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    // Within its rights it works, and lists only its own streams.
    json_stream(&s, "w").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/g2",
        &mine,
        json!({"type":"pull-wake","pattern":"a/*","wake_stream":"w"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let linked: Vec<String> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(linked, vec!["a/s1".to_string()], "{v}");

    // Adding links later takes read too.
    let r = call(
        &s,
        HttpMethod::POST,
        "/__ds/subscriptions/g2/streams",
        &mine,
        json!({"streams": ["b/secret"]}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    // Reserved streams are never a wake stream, even with every right.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__ds/subscriptions/r1",
        ADMIN_SECRET,
        json!({"type":"pull-wake","streams":["a/s1"],"wake_stream":"__groups/x/a/s1"}),
    )
    .await;
    assert!(r.status.is_client_error(), "{}", r.text());
}

/// Taking a group's messages reads the stream's bodies: claim without read does not.
/// Groups on the server's own streams cannot be made.
#[tokio::test]
async fn group_claims_need_read_and_reserved_streams_are_refused() {
    let dir = TempDir::new("authc-claim");
    let s = start_with_auth(dir.path(), &[]).await;
    json_stream(&s, "b/secret").await;
    append(&s, "b/secret", json!({"pin": "1234"})).await;
    let no_read = token(&s, &["subscribe,claim:b/**"], "").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/g1",
        &no_read,
        json!({"stream": "b/secret"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = call(
        &s,
        HttpMethod::POST,
        "/__picomq/groups/g1/claim",
        &no_read,
        json!({"consumer": "c", "max": 10}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 404, "{}", r.text());
    assert!(!r.text().contains("1234"));
    let reader = token(&s, &["claim,read:b/**"], "").await;
    let r = call(
        &s,
        HttpMethod::POST,
        "/__picomq/groups/g1/claim",
        &reader,
        json!({"consumer": "c", "max": 10}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(r.text().contains("1234"), "{}", r.text());

    // A group on another group's state stream: refused, whoever asks.
    for secret in [&no_read, &ADMIN_SECRET.to_string()] {
        let r = call(
            &s,
            HttpMethod::PUT,
            "/__picomq/groups/spy",
            secret,
            json!({"stream": "__groups/g1/b/secret"}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 404, "{}", r.text());
        assert_eq!(code(&r), "reserved_path");
    }
    // And so is a dead-letter stream the caller may not append to.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/g2",
        &no_read,
        json!({"stream": "b/secret", "deadLetter": "c/dlq"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
}

/// A group on a stream the caller may not use answers as a missing group; a taken
/// name does not name its stream; names are relative to the token's namespace.
#[tokio::test]
async fn groups_are_no_existence_oracle_and_keep_to_namespaces() {
    let dir = TempDir::new("authc-oracle");
    let s = start_with_auth(dir.path(), &[]).await;
    json_stream(&s, "b/secret").await;
    json_stream(&s, "ten1/x").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/hidden",
        ADMIN_SECRET,
        json!({"stream": "b/secret"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let a = token(&s, &["subscribe,claim,read:a/**"], "").await;
    for (method, suffix, body) in [
        (HttpMethod::GET, "", Value::Null),
        (HttpMethod::DELETE, "", Value::Null),
        (HttpMethod::POST, "/claim", json!({"consumer": "c"})),
        (HttpMethod::POST, "/ack", json!({"ids": []})),
    ] {
        let hidden = call(
            &s,
            method.clone(),
            &format!("/__picomq/groups/hidden{suffix}"),
            &a,
            body.clone(),
        )
        .await;
        let missing = call(
            &s,
            method.clone(),
            &format!("/__picomq/groups/nosuch{suffix}"),
            &a,
            body,
        )
        .await;
        assert_eq!(
            hidden.status.as_u16(),
            404,
            "{method:?}{suffix}: {}",
            hidden.text()
        );
        assert_eq!(missing.status, hidden.status);
        assert_eq!(
            hidden.text().replace("hidden", "NAME"),
            missing.text().replace("nosuch", "NAME"),
            "{method:?}{suffix}"
        );
    }
    let r = call(&s, HttpMethod::GET, "/__picomq/groups", &a, Value::Null).await;
    assert!(!r.text().contains("secret"), "{}", r.text());
    // The group survived the refused DELETE.
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/groups/hidden",
        ADMIN_SECRET,
        Value::Null,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());

    // A taken name: 409, without the stream's name.
    json_stream(&s, "a/mine").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/hidden",
        &a,
        json!({"stream": "a/mine"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 409, "{}", r.text());
    assert!(!r.text().contains("secret"), "{}", r.text());

    // A namespaced token names streams relative to its namespace, in and out.
    let t1 = token(&s, &["subscribe,claim,read:**"], "ten1/").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/t1g",
        &t1,
        json!({"stream": "x"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["stream"], "x", "{v}");
    let r = call(&s, HttpMethod::GET, "/__picomq/groups", &t1, Value::Null).await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["groups"], json!([{"group": "t1g", "stream": "x"}]), "{v}");
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/groups/t1g",
        ADMIN_SECRET,
        Value::Null,
    )
    .await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["stream"], "ten1/x", "{v}");
    // Its positions answer relative names too.
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/positions/me/x",
        &t1,
        json!({"offset": "0000000000000000_0000000000000000"}),
    )
    .await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["stream"], "x", "{v}");
}

/// `/info` of a fork names its source only as the caller may see it.
#[tokio::test]
async fn fork_info_never_names_a_source_outside_the_namespace() {
    let dir = TempDir::new("authc-fork");
    let s = start_with_auth(dir.path(), &[]).await;
    json_stream(&s, "other/src").await;
    append(&s, "other/src", json!({"a": 1})).await;
    let auth = bearer(ADMIN_SECRET);
    let r = s
        .client
        .send(
            HttpMethod::PUT,
            "/ten1/fork",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
                ("stream-forked-from", "/other/src"),
            ],
            String::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let t1 = token(&s, &["read:**"], "ten1/").await;
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/streams/fork/info",
        &t1,
        Value::Null,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["forked_from"]["stream"], Value::Null, "{v}");
    assert!(!r.text().contains("other"), "{}", r.text());
    // The admin sees it.
    let r = call(
        &s,
        HttpMethod::GET,
        "/__picomq/streams/ten1/fork/info",
        ADMIN_SECRET,
        Value::Null,
    )
    .await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["forked_from"]["stream"], "other/src", "{v}");
}

/// The native API and positions never reach the server's own streams.
#[tokio::test]
async fn reserved_streams_answer_only_through_their_apis() {
    let dir = TempDir::new("authc-reserved");
    let s = start_with_auth(dir.path(), &[]).await;
    json_stream(&s, "q").await;
    let r = call(
        &s,
        HttpMethod::PUT,
        "/__picomq/groups/g",
        ADMIN_SECRET,
        json!({"stream": "q"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    for path in [
        "/__picomq/streams/__groups/g/q/records?seq=0",
        "/__picomq/streams/__groups/g/q/info",
        "/__picomq/positions/c/__groups/g/q",
        "/__groups/g/q",
    ] {
        let r = call(&s, HttpMethod::GET, path, ADMIN_SECRET, Value::Null).await;
        assert_eq!(r.status.as_u16(), 404, "{path}: {}", r.text());
        assert_eq!(code(&r), "reserved_path", "{path}");
    }
}
