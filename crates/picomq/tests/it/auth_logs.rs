//! Credentials never reach the logs: bearer secrets (valid, unknown, malformed),
//! issued secrets and signed read tokens in query strings, even at debug level.

use picomq_testkit as support;

use picomq_client::HttpMethod;
use serde_json::{json, Value};
use support::*;

#[tokio::test]
async fn tokens_and_query_credentials_never_appear_in_logs() {
    let dir = TempDir::new("auth-logs");
    let s = start_with_auth_as(
        dir.path(),
        &["--log", "debug", "--log-format", "json"],
        true,
    )
    .await;
    let admin = bearer(ADMIN_SECRET);
    let (_, issued) = issue_token(
        &s.client,
        ADMIN_SECRET,
        json!({ "scopes": ["read,append"] }),
    )
    .await;
    let r = s
        .client
        .put(
            "/logged",
            &[("authorization", &admin), ("content-type", "text/plain")],
            "x",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201);
    let r = s
        .client
        .send(
            HttpMethod::POST,
            "/__picomq/read-tokens",
            &[("authorization", &bearer(&issued))],
            json!({ "stream": "logged" }).to_string(),
        )
        .await
        .unwrap();
    let link = serde_json::from_slice::<Value>(&r.body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let unknown = "pmq_unknownunknownunknownunknownunknownunknown";
    let requests: Vec<(HttpMethod, String, Option<String>)> = vec![
        (
            HttpMethod::GET,
            format!("/logged?offset=-1&token={link}"),
            None,
        ),
        (
            HttpMethod::GET,
            format!("/logged?offset=-1&live=long-poll&token={link}"),
            None,
        ),
        // Refused query credentials: a write, and a tampered token.
        (HttpMethod::POST, format!("/logged?token={link}"), None),
        (HttpMethod::GET, format!("/logged?token={link}x"), None),
        (
            HttpMethod::GET,
            "/logged?offset=-1".into(),
            Some(bearer(&issued)),
        ),
        (
            HttpMethod::GET,
            "/logged?offset=-1".into(),
            Some(bearer(unknown)),
        ),
        (
            HttpMethod::GET,
            "/logged".into(),
            Some(format!("Basic {ADMIN_SECRET}")),
        ),
        // Not a stream (500s and 404s log too).
        (
            HttpMethod::GET,
            format!("/__picomq/nothing?token={link}"),
            Some(admin.clone()),
        ),
    ];
    for (method, path, auth) in requests {
        let mut headers = vec![("content-type", "text/plain")];
        if let Some(a) = &auth {
            headers.push(("authorization", a));
        }
        s.client.send(method, &path, &headers, "y").await.unwrap();
    }
    // Requests were logged (so the check below is not vacuous; lines reach the log
    // from a background writer) ...
    let log = support::eventually(std::time::Duration::from_secs(5), || {
        let log = s.log_text();
        async move { (log.matches("picomq::access").count() >= 10).then_some(log) }
    })
    .await;
    assert!(log.contains("/logged"));
    // ... but no credential, not even the MAC part of the read token.
    let mac = link.rsplit('.').next().unwrap();
    for secret in [ADMIN_SECRET, issued.as_str(), link.as_str(), mac, unknown] {
        assert!(
            !log.contains(secret),
            "{secret} leaked into the log:\n{log}"
        );
    }
}
