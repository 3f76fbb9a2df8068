//! Durable Streams subscriptions end to end: webhooks verified by an independent
//! Ed25519 implementation (Node's crypto, `tests-ecosystem/webhooks`), the retry
//! schedule surviving `kill -9`, pull-wake state surviving a restart, and the
//! scopes they need with `--auth required`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use picomq_testkit as support;
use serde_json::{json, Value};
use support::{eventually, Server, TempDir};

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];

/// The Node receiver, running until dropped.
struct Receiver {
    child: Child,
    log: PathBuf,
    url: String,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    async fn start(dir: &Path, jwks: &str, fail_first: u32) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests-ecosystem/webhooks/receiver.mjs");
        let log = dir.join("deliveries.jsonl");
        let port_file = dir.join("receiver.port");
        let child = Command::new("node")
            .arg(script)
            .args(["--jwks", jwks])
            .arg("--log")
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .args(["--fail-first", &fail_first.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("node runs (the subscription tests need Node.js)");
        let port = eventually(Duration::from_secs(10), || async {
            std::fs::read_to_string(&port_file)
                .ok()
                .filter(|s| !s.is_empty())
        })
        .await;
        Receiver {
            child,
            log,
            url: format!("http://127.0.0.1:{port}/hook"),
        }
    }

    fn deliveries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Value> {
        eventually(limit, || async {
            let d = self.deliveries();
            (d.len() >= n).then_some(d)
        })
        .await
    }
}

async fn put_json(c: &support::Client, path: &str, body: Value) -> (u16, Value) {
    let r = c.put(path, &JSON, body.to_string()).await.unwrap();
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status.as_u16(), v)
}

async fn get_json(c: &support::Client, path: &str) -> Value {
    let r = c.get(path).await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// Every delivery verifies against the JWKS, a tampered body does not; failed
/// deliveries back off 1, 2, 4, 8 s (20% jitter) and keep that schedule across a
/// `kill -9` of the server; the delivery that succeeds acks the stream's tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_and_their_retries_keep_their_schedule_across_kill_9() {
    let dir = TempDir::new("webhooks");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let c = server.client.clone();
    let jwks = format!("{}/v1/stream/__ds/jwks.json", server.url);
    let receiver = Receiver::start(dir.path(), &jwks, 4).await;
    let (status, created) = put_json(
        &c,
        "/v1/stream/__ds/subscriptions/hooks",
        json!({"type": "webhook", "pattern": "orders/*", "webhook": {"url": receiver.url}}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["webhook"]["signing"]["jwks_url"], json!(jwks));
    let r = c
        .put("/v1/stream/orders/1", &JSON, r#"{"id":1}"#)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201);
    let tail = r.header("stream-next-offset").unwrap().to_string();

    // Three failed attempts (at 0, 1 and 3 s), then the server dies.
    receiver.wait_for(3, Duration::from_secs(15)).await;
    let state = get_json(&c, "/v1/stream/__ds/subscriptions/hooks").await;
    assert_eq!(state["status"], "failed", "{state}");
    server.restart().await; // kill -9, then start again
    let c = server.client.clone();

    let all = receiver.wait_for(5, Duration::from_secs(30)).await;
    for d in &all {
        assert_eq!(d["valid"], true, "signature did not verify: {d}");
        assert_eq!(d["tamperRejected"], true, "a tampered body verified: {d}");
        assert_eq!(d["fresh"], true, "timestamp outside the window: {d}");
        assert_eq!(d["body"]["subscription_id"], "hooks");
    }
    let at: Vec<u64> = all.iter().map(|d| d["at_ms"].as_u64().unwrap()).collect();
    for (i, base) in [1_000u64, 2_000, 4_000, 8_000].iter().enumerate() {
        let gap = at[i + 1] - at[i];
        let (lo, hi) = (base * 8 / 10 - 50, base * 12 / 10 + 700);
        assert!(
            (lo..=hi).contains(&gap),
            "attempt {} came {gap} ms after the one before; the schedule says {base} ms ± 20%: {at:?}",
            i + 2
        );
    }
    let generations: Vec<u64> = all
        .iter()
        .map(|d| d["body"]["generation"].as_u64().unwrap())
        .collect();
    assert!(
        generations.windows(2).all(|w| w[1] > w[0]),
        "{generations:?}"
    );
    assert_eq!(all[4]["failed"], false);

    // The fifth answered done: the tail it carried is acked, the status active.
    let state = eventually(Duration::from_secs(5), || async {
        let s = get_json(&c, "/v1/stream/__ds/subscriptions/hooks").await;
        (s["status"] == "active" && s["streams"][0]["acked_offset"] == json!(tail)).then_some(s)
    })
    .await;
    assert_eq!(state["streams"][0]["path"], "orders/1");

    // A new append wakes it again, signed with the same key.
    c.post("/v1/stream/orders/1", &JSON, r#"{"id":2}"#)
        .await
        .unwrap();
    let all = receiver.wait_for(6, Duration::from_secs(10)).await;
    assert_eq!(all[5]["valid"], true);
    assert_eq!(all[5]["kid"], all[0]["kid"]);
}

/// A pull-wake claim held across a `kill -9`: the restarted server still fences
/// the holder's token by generation, refuses a second claim while the lease runs,
/// and lapses it after its TTL so another worker can claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_wake_claim_survives_kill_9_and_lapses_after_its_lease() {
    let dir = TempDir::new("pull-wake");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let c = server.client.clone();
    c.put("/s/wake/pool", &JSON, "[]").await.unwrap();
    let (status, _) = put_json(
        &c,
        "/s/__ds/subscriptions/jobs",
        json!({"type": "pull-wake", "streams": ["jobs/a"], "wake_stream": "wake/pool", "lease_ttl_ms": 3000}),
    )
    .await;
    assert_eq!(status, 201);
    c.put("/s/jobs/a", &JSON, r#"{"job":1}"#).await.unwrap();
    let wake = eventually(Duration::from_secs(5), || async {
        let r = c.get("/s/wake/pool").await.unwrap();
        let events: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
        events.into_iter().find(|e| e["subscription_id"] == "jobs")
    })
    .await;
    assert_eq!(wake["type"], "wake");
    assert_eq!(wake["stream"], "jobs/a");

    let claim = c
        .post(
            "/s/__ds/subscriptions/jobs/claim",
            &JSON,
            r#"{"worker":"w1"}"#,
        )
        .await
        .unwrap();
    assert_eq!(claim.status.as_u16(), 200, "{}", claim.text());
    let claimed: Value = serde_json::from_slice(&claim.body).unwrap();

    server.restart().await;
    let c = server.client.clone();
    let busy = c
        .post(
            "/s/__ds/subscriptions/jobs/claim",
            &JSON,
            r#"{"worker":"w2"}"#,
        )
        .await
        .unwrap();
    assert_eq!(busy.status.as_u16(), 409, "{}", busy.text());
    let busy: Value = serde_json::from_slice(&busy.body).unwrap();
    assert_eq!(busy["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(busy["error"]["current_holder"], "w1");

    // A heartbeat with the holder's token still works after the restart.
    let token = format!("Bearer {}", claimed["token"].as_str().unwrap());
    let auth = [
        ("content-type", "application/json"),
        ("authorization", token.as_str()),
    ];
    let beat = json!({"wake_id": claimed["wake_id"], "generation": claimed["generation"]});
    let r = c
        .post("/s/__ds/subscriptions/jobs/ack", &auth, beat.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());

    // Without more heartbeats the lease lapses; w2 claims a new generation and the
    // old token is fenced.
    let claim2 = eventually(Duration::from_secs(10), || async {
        let r = c
            .post(
                "/s/__ds/subscriptions/jobs/claim",
                &JSON,
                r#"{"worker":"w2"}"#,
            )
            .await
            .unwrap();
        (r.status.as_u16() == 200).then(|| serde_json::from_slice::<Value>(&r.body).unwrap())
    })
    .await;
    assert!(claim2["generation"].as_u64() > claimed["generation"].as_u64());
    let stale = c
        .post("/s/__ds/subscriptions/jobs/ack", &auth, beat.to_string())
        .await
        .unwrap();
    assert_eq!(stale.status.as_u16(), 409);
    assert!(stale.text().contains("FENCED"), "{}", stale.text());

    // w2 acks the tail: nothing is pending, a claim finds no work.
    let tail = claim2["streams"][0]["tail_offset"].clone();
    let token2 = format!("Bearer {}", claim2["token"].as_str().unwrap());
    let auth2 = [
        ("content-type", "application/json"),
        ("authorization", token2.as_str()),
    ];
    let done = json!({"wake_id": claim2["wake_id"], "generation": claim2["generation"],
        "acks": [{"stream": "jobs/a", "offset": tail}], "done": true});
    let r = c
        .post("/s/__ds/subscriptions/jobs/ack", &auth2, done.to_string())
        .await
        .unwrap();
    assert_eq!(r.text(), r#"{"next_wake":false,"ok":true}"#);
    let idle = c
        .post(
            "/s/__ds/subscriptions/jobs/claim",
            &JSON,
            r#"{"worker":"w3"}"#,
        )
        .await
        .unwrap();
    assert!(idle.text().contains("NO_PENDING_WORK"), "{}", idle.text());
}

/// Bad subscription requests get 400 with the protocol's codes, not a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscription_requests_are_refused_with_a_reason() {
    let dir = TempDir::new("sub-bad");
    let server = Server::start(dir.path(), &[]).await;
    let c = &server.client;
    for (body, code) in [
        (
            json!({"type": "webhook", "pattern": "a/*", "webhook": {"url": "http://10.0.0.1/x"}}),
            "WEBHOOK_URL_REJECTED",
        ),
        (
            json!({"type": "webhook", "pattern": "a/*", "webhook": {"url": "https://169.254.169.254/x"}}),
            "WEBHOOK_URL_REJECTED",
        ),
        (
            json!({"type": "webhook", "pattern": "a/*"}),
            "INVALID_REQUEST",
        ),
        (
            json!({"type": "pull-wake", "pattern": "a/*"}),
            "INVALID_REQUEST",
        ),
        (
            json!({"type": "pull-wake", "wake_stream": "w"}),
            "INVALID_REQUEST",
        ),
        (
            json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 10}),
            "INVALID_REQUEST",
        ),
        (json!({"type": "nope", "pattern": "a/*"}), "INVALID_REQUEST"),
    ] {
        let (status, answer) = put_json(c, "/v1/__ds/subscriptions/bad", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], code, "{body} -> {answer}");
    }
    let r = c
        .put("/v1/__ds/subscriptions/has%20space", &JSON, "{}")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400);
    let r = c.get("/v1/__ds/subscriptions/absent").await.unwrap();
    assert_eq!(r.status.as_u16(), 404);
    let r = c.get("/v1/__ds/other").await.unwrap();
    assert_eq!(r.status.as_u16(), 404);
    // A second PUT with another configuration is a conflict.
    let ok = json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "w"});
    assert_eq!(put_json(c, "/v1/__ds/subscriptions/s", ok).await.0, 201);
    let other = json!({"type": "pull-wake", "pattern": "b/*", "wake_stream": "w"});
    assert_eq!(put_json(c, "/v1/__ds/subscriptions/s", other).await.0, 409);
    // The reserved prefix is not a stream anyone can create.
    let r = c.put("/v1/__ds/mine", &JSON, "[]").await.unwrap();
    assert_eq!(r.status.as_u16(), 404);

    // A rotation makes a new key active and keeps the old one published.
    let before = get_json(c, "/v1/__ds/jwks.json").await;
    assert_eq!(before["keys"].as_array().unwrap().len(), 1);
    let r = c
        .post("/__picomq/webhook-keys/rotate", &JSON, "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let after = get_json(c, "/v1/__ds/jwks.json").await;
    let kids: Vec<&str> = after["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap())
        .collect();
    assert_eq!(kids.len(), 2);
    assert_eq!(kids[0], before["keys"][0]["kid"].as_str().unwrap());
    let sub = get_json(c, "/v1/__ds/subscriptions/s").await;
    assert_eq!(
        sub["webhook"],
        Value::Null,
        "a pull-wake subscription has no webhook"
    );
}

/// With `--auth required`: managing subscriptions needs `subscribe` (and read on
/// what they link, append on their wake stream), claiming needs `claim`, callbacks
/// and acks take the wake's own token; the JWKS is public.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_subscriptions_need_their_scopes() {
    let dir = TempDir::new("sub-auth");
    let server = support::start_with_auth(dir.path(), &[]).await;
    let c = &server.client;
    let issue = |scopes: &'static [&'static str]| {
        support::issue_token(c, support::ADMIN_SECRET, json!({ "scopes": scopes }))
    };
    let (_, writer) = issue(&["create:**", "append:**", "read:**"]).await;
    // Managing a subscription also reads its linked streams and appends to its
    // wake stream: the manager needs those rights too.
    let (_, manager) = issue(&["subscribe:**", "create:**", "append:**", "read:**"]).await;
    let (_, worker) = issue(&["claim:**"]).await;
    let as_token = |t: &str| support::bearer(t);

    let r = c.get("/v1/__ds/jwks.json").await.unwrap();
    assert_eq!(r.status.as_u16(), 200);
    let body =
        json!({"type": "pull-wake", "streams": ["q/a"], "wake_stream": "q/wake"}).to_string();
    let w = as_token(&writer);
    let r = c
        .put(
            "/v1/__ds/subscriptions/s",
            &[
                ("content-type", "application/json"),
                ("authorization", w.as_str()),
            ],
            body.clone(),
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    let r = c
        .put("/v1/__ds/subscriptions/s", &JSON, body.clone())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
    let m = as_token(&manager);
    let mh = [
        ("content-type", "application/json"),
        ("authorization", m.as_str()),
    ];
    let r = c.put("/v1/q/wake", &mh, "[]").await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = c.put("/v1/__ds/subscriptions/s", &mh, body).await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = c.put("/v1/q/a", &mh, r#"{"n":1}"#).await.unwrap();
    assert_eq!(r.status.as_u16(), 201);

    let r = c
        .post("/v1/__ds/subscriptions/s/claim", &mh, r#"{"worker":"x"}"#)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    let k = as_token(&worker);
    let kh = [
        ("content-type", "application/json"),
        ("authorization", k.as_str()),
    ];
    let claim = eventually(Duration::from_secs(5), || async {
        let r = c
            .post("/v1/__ds/subscriptions/s/claim", &kh, r#"{"worker":"x"}"#)
            .await
            .unwrap();
        (r.status.as_u16() == 200).then(|| serde_json::from_slice::<Value>(&r.body).unwrap())
    })
    .await;
    let t = format!("Bearer {}", claim["token"].as_str().unwrap());
    let th = [
        ("content-type", "application/json"),
        ("authorization", t.as_str()),
    ];
    let ack = json!({"wake_id": claim["wake_id"], "generation": claim["generation"], "done": true});
    let r = c
        .post("/v1/__ds/subscriptions/s/ack", &th, ack.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

/// `GET /__picomq/subscriptions` lists, by name, the subscriptions a token may
/// manage (the `subscribe` scope on their paths), each path as it is addressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_list_shows_what_a_token_may_manage() {
    let dir = TempDir::new("sub-list");
    let server = support::start_with_auth(dir.path(), &[]).await;
    let c = &server.client;
    let admin = support::bearer(support::ADMIN_SECRET);
    let ah = [
        ("content-type", "application/json"),
        ("authorization", admin.as_str()),
    ];
    for (root, id) in [("v1", "b"), ("team", "jobs"), ("v1", "a")] {
        let r = c.put(&format!("/{root}/wake"), &ah, "[]").await.unwrap();
        assert!(r.status.is_success(), "{}", r.text());
        let body = json!({"type": "pull-wake", "streams": [format!("{root}/q")],
            "wake_stream": format!("{root}/wake")});
        let r = c
            .put(
                &format!("/{root}/__ds/subscriptions/{id}"),
                &ah,
                body.to_string(),
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    }
    let list = |token: String| async move {
        let auth = support::bearer(&token);
        let r = c
            .send(
                picomq_client::HttpMethod::GET,
                "/__picomq/subscriptions",
                &[("authorization", auth.as_str())],
                "",
            )
            .await
            .unwrap();
        (r.status.as_u16(), r.text())
    };
    let (status, body) = list(support::ADMIN_SECRET.to_string()).await;
    assert_eq!(status, 200, "{body}");
    let paths: Vec<String> = serde_json::from_str::<Value>(&body).unwrap()["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "team/__ds/subscriptions/jobs",
            "v1/__ds/subscriptions/a",
            "v1/__ds/subscriptions/b"
        ]
    );
    // Each listed path is where the subscription is read.
    for p in &paths {
        let r = c
            .send(
                picomq_client::HttpMethod::GET,
                &format!("/{p}"),
                &[("authorization", admin.as_str())],
                "",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 200, "{p}: {}", r.text());
    }

    let (_, team) = support::issue_token(
        c,
        support::ADMIN_SECRET,
        json!({"scopes": ["subscribe:team/**"]}),
    )
    .await;
    let (status, body) = list(team).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"subscriptions": [{"path": "team/__ds/subscriptions/jobs"}]})
    );
    let (_, reader) =
        support::issue_token(c, support::ADMIN_SECRET, json!({"scopes": ["read:**"]})).await;
    assert_eq!(list(reader).await.0, 403);
    let r = c.get("/__picomq/subscriptions").await.unwrap();
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
}
