//! PicoMQ on a real S3-compatible server (the in-process s3s-fs test server, spoken
//! to over HTTP with SigV4): fencing between processes, rebuilding a node from the
//! bucket alone, outages, a separate WAL store, and what /metrics says it costs.

use picomq_testkit as support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use picomq_s3_test_server::{S3Server, ACCESS_KEY, REGION, SECRET_KEY};
use support::{eventually, metric, read_all, Client, Server, TempDir};

const BUCKET: &str = "picomq-tests";
const WAL_BUCKET: &str = "picomq-tests-wal";

fn start_s3(tag: &str) -> S3Server {
    let root = std::env::temp_dir().join(format!("picomq-s3-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    picomq_s3_test_server::start_in_background(&root, &[BUCKET, WAL_BUCKET]).unwrap()
}

/// The S3 server shared by the tests of this binary (one that is never switched down).
fn shared_s3() -> &'static S3Server {
    static S3: OnceLock<S3Server> = OnceLock::new();
    S3.get_or_init(|| start_s3("shared"))
}

/// A store URL on `s3` with every setting in the query string.
fn url(s3: &S3Server, bucket: &str, prefix: &str) -> String {
    format!(
        "s3://{bucket}/{prefix}-{}?endpoint={}&region={REGION}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}&allow_http=true",
        std::process::id(),
        s3.endpoint()
    )
}

const TEXT: &[(&str, &str)] = &[("content-type", "text/plain")];

async fn put(c: &Client, path: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    c.put(path, headers, body.to_string())
        .await
        .unwrap()
        .status
        .as_u16()
}

async fn post(c: &Client, path: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    c.post(path, headers, body.to_string())
        .await
        .unwrap()
        .status
        .as_u16()
}

/// Two processes on one bucket, each with its own data directory (a second one on
/// the same directory is refused at once: `cluster_identity`): the second fences the
/// first, which stops acknowledging; every acknowledged record is in the second's
/// view exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_process_with_its_own_data_dir_fences_the_first() {
    let s3 = shared_s3();
    let store = url(s3, BUCKET, "fence-diff");
    let dir_a = TempDir::new("fence-a");
    let dir_b = TempDir::new("fence-b");
    let flags = ["--store", store.as_str(), "--fence-check-interval", "100ms"];
    let a = Server::start(dir_a.path(), &flags).await;
    assert_eq!(put(&a.client, "/f", TEXT, "").await, 201);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (client, acked, stop) = (a.client.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let line = format!("a{w}-{i:05}\n");
                i += 1;
                match client.post("/f", TEXT, line.clone()).await {
                    Ok(r) if r.status.as_u16() == 204 => acked.lock().unwrap().push(line),
                    Ok(r) => {
                        assert_eq!(r.status.as_u16(), 503, "{}", r.text());
                        assert!(
                            r.text().contains("\"error\""),
                            "not a JSON error: {}",
                            r.text()
                        );
                    }
                    Err(_) => {}
                }
            }
        }));
    }
    eventually(Duration::from_secs(10), || async {
        (acked.lock().unwrap().len() > 50).then_some(())
    })
    .await;
    let b = Server::start(dir_b.path(), &flags).await;
    // From here on A must not acknowledge anything: its next writes fail.
    let acked_before_b = acked.lock().unwrap().len();
    let r = a.client.post("/f", TEXT, "a-after-b\n").await.unwrap();
    assert_eq!(
        r.status.as_u16(),
        503,
        "A still accepts writes: {}",
        r.text()
    );
    assert!(r.text().contains("fenced"), "{}", r.text());
    // ... and it notices without writing, too: not ready any more.
    eventually(Duration::from_secs(5), || async {
        let r = a.client.get("/readyz").await.ok()?;
        (r.status.as_u16() == 503).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= acked_before_b);
    assert_eq!(post(&b.client, "/f", TEXT, "b-0\n").await, 204);
    let text = String::from_utf8(read_all(&b.client, "/f").await).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let unique: HashSet<&str> = lines.iter().copied().collect();
    assert_eq!(unique.len(), lines.len(), "duplicated records");
    for line in &acked {
        assert!(
            unique.contains(line.trim_end()),
            "acknowledged {line:?} lost"
        );
    }
    assert!(!unique.contains("a-after-b"));
    assert_eq!(lines.last(), Some(&"b-0"));
    eprintln!(
        "A acknowledged {} appends; after B started every A write failed; B holds {} records",
        acked.len(),
        lines.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_rebuilds_every_stream_from_the_bucket_alone() {
    rebuild_from_bucket(false).await;
}

/// The same, with a metadata checkpoint in between and every WAL object it covers
/// deleted from the bucket (what GC will do): the new node can only get the state
/// before the checkpoint from the checkpoint, and the rest from the WAL after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_rebuilds_from_a_checkpoint_and_the_wal_after_it() {
    rebuild_from_bucket(true).await;
}

async fn rebuild_from_bucket(checkpoint: bool) {
    let s3 = shared_s3();
    let tag = if checkpoint {
        "rebuild-ckpt"
    } else {
        "rebuild"
    };
    let store = url(s3, BUCKET, tag);
    let dir = TempDir::new(&format!("{tag}-old"));
    let interval = if checkpoint { "200ms" } else { "0" };
    let mut old = Server::start_process(
        dir.path(),
        &["--store", &store, "--checkpoint-interval", interval],
    )
    .await;
    let mut c = old.client.clone();
    assert_eq!(put(&c, "/plain", TEXT, "hello ").await, 201);
    assert_eq!(post(&c, "/plain", TEXT, "world").await, 204);
    assert_eq!(put(&c, "/closed", TEXT, "all").await, 201);
    assert_eq!(
        post(
            &c,
            "/closed",
            &[("content-type", "text/plain"), ("stream-closed", "true")],
            ""
        )
        .await,
        204
    );
    assert_eq!(
        put(
            &c,
            "/ttl",
            &[("content-type", "text/plain"), ("stream-ttl", "3600")],
            "t"
        )
        .await,
        201
    );
    let json = [("content-type", "application/json")];
    assert_eq!(put(&c, "/json", &json, "").await, 201);
    assert_eq!(post(&c, "/json", &json, r#"[{"a":1},{"b":2}]"#).await, 204);
    assert_eq!(
        put(&c, "/fork", &[("stream-forked-from", "/plain")], "").await,
        201
    );
    assert_eq!(post(&c, "/fork", TEXT, "+fork").await, 204);
    assert_eq!(put(&c, "/gone", TEXT, "bye").await, 201);
    assert_eq!(c.delete("/gone").await.unwrap().status.as_u16(), 204);
    // A deleted source that a fork still reads: 410 for clients, data kept.
    assert_eq!(put(&c, "/src", TEXT, "src-data").await, 201);
    assert_eq!(
        put(&c, "/src-fork", &[("stream-forked-from", "/src")], "").await,
        201
    );
    assert_eq!(c.delete("/src").await.unwrap().status.as_u16(), 204);
    let producer = |seq: &'static str| {
        [
            ("content-type", "text/plain"),
            ("producer-id", "p1"),
            ("producer-epoch", "3"),
            ("producer-seq", seq),
        ]
    };
    assert_eq!(put(&c, "/prod", TEXT, "").await, 201);
    assert_eq!(post(&c, "/prod", &producer("0"), "p0").await, 200);
    assert_eq!(post(&c, "/prod", &producer("1"), "p1").await, 200);
    let mut plain_before_bang = String::new();
    if checkpoint {
        // Wait for a checkpoint of everything above (no new one for 1 s), then
        // change things after it (an append, a create, a delete) on a restarted node
        // that writes no checkpoints.
        let mut last = (0.0, Instant::now());
        while last.0 < 1.0 || last.1.elapsed() < Duration::from_secs(1) {
            let n = metric(&c, "picomq_checkpoints_total").await;
            if n != last.0 {
                last = (n, Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        old.terminate(Duration::from_secs(20));
        old = Server::start_process(
            dir.path(),
            &["--store", &store, "--checkpoint-interval", "0"],
        )
        .await;
        c = old.client.clone();
        plain_before_bang = c
            .head("/plain")
            .await
            .unwrap()
            .header("stream-next-offset")
            .unwrap()
            .to_string();
        assert_eq!(post(&c, "/plain", TEXT, "!").await, 204);
        assert_eq!(put(&c, "/after", TEXT, "late").await, 201);
        assert_eq!(c.delete("/ttl").await.unwrap().status.as_u16(), 204);
    }
    let mut before = Vec::new();
    let mut streams = vec!["/plain", "/closed", "/json", "/fork", "/prod", "/src-fork"];
    streams.push(if checkpoint { "/after" } else { "/ttl" });
    for p in streams {
        let r = c.head(p).await.unwrap();
        before.push((p, r.header("stream-next-offset").unwrap().to_string()));
    }

    old.terminate(Duration::from_secs(20));
    drop(old);
    std::fs::remove_dir_all(dir.path()).unwrap();
    if checkpoint {
        let deleted = delete_wal_below_newest_checkpoint(&store).await;
        assert!(deleted > 0, "the checkpoint covered no WAL object");
    }
    let fresh = TempDir::new(&format!("{tag}-new"));
    let new = Server::start_process(fresh.path(), &["--store", &store]).await;
    let c = new.client.clone();
    for (p, offset) in &before {
        let r = c.head(p).await.unwrap();
        assert_eq!(r.status.as_u16(), 200, "{p} missing after rebuild");
        assert_eq!(
            r.header("stream-next-offset"),
            Some(offset.as_str()),
            "{p} offset"
        );
    }
    if checkpoint {
        // Everything before the checkpoint came from it (its WAL objects are gone, and
        // with them the bytes: GC may only delete data that compaction has copied);
        // only the WAL after the checkpoint was replayed: the 3 writes, and the
        // commit of what the graceful stop packed (its relocations go through the
        // WAL: one object or two, and the last flush after it).
        let replayed = metric(&c, "picomq_recovery_objects_replayed").await;
        assert!(
            (1.0..=6.0).contains(&replayed),
            "replayed {replayed} WAL objects, expected only the 3 after the checkpoint and the stop's pack"
        );
        assert_eq!(metric(&c, "picomq_recovery_checkpoint_restored").await, 1.0);
        let r = c
            .get(&format!("/plain?offset={plain_before_bang}"))
            .await
            .unwrap();
        assert_eq!(r.body.as_ref(), b"!");
    } else {
        assert_eq!(metric(&c, "picomq_recovery_checkpoint_restored").await, 0.0);
        assert_eq!(read_all(&c, "/plain").await, b"hello world");
        assert_eq!(read_all(&c, "/fork").await, b"hello world+fork");
        assert_eq!(read_all(&c, "/src-fork").await, b"src-data");
        assert_eq!(read_all(&c, "/json").await, br#"[{"a":1},{"b":2}]"#);
    }
    assert_eq!(
        c.head("/closed").await.unwrap().header("stream-closed"),
        Some("true")
    );
    assert_eq!(post(&c, "/closed", TEXT, "more").await, 409);
    if checkpoint {
        assert_eq!(read_all(&c, "/after").await, b"late");
        assert_eq!(c.head("/ttl").await.unwrap().status.as_u16(), 404);
    } else {
        assert_eq!(
            c.head("/ttl").await.unwrap().header("stream-ttl"),
            Some("3600")
        );
    }
    assert_eq!(
        c.head("/gone").await.unwrap().status.as_u16(),
        404,
        "deleted stream came back"
    );
    assert_eq!(c.head("/src").await.unwrap().status.as_u16(), 410);
    // Producer state: seq 1 is a duplicate, 3 is a gap, 2 is next.
    let r = c.post("/prod", &producer("1"), "p1").await.unwrap();
    assert_eq!(
        r.status.as_u16(),
        204,
        "duplicate not recognised: {}",
        r.text()
    );
    assert_eq!(post(&c, "/prod", &producer("3"), "p3").await, 409);
    assert_eq!(post(&c, "/prod", &producer("2"), "p2").await, 200);
    if !checkpoint {
        assert_eq!(read_all(&c, "/prod").await, b"p0p1p2");
    }
}

/// Deletes every WAL object older than the newest checkpoint's watermark, as GC
/// will once it exists; returns how many it deleted.
async fn delete_wal_below_newest_checkpoint(store_url: &str) -> usize {
    use futures::TryStreamExt;
    use picomq_engine::store::{ObjectPath as Path, ObjectStore, ObjectStoreExt};
    let store = picomq_engine::store::open(store_url).unwrap();
    let keys = |prefix: &'static str| {
        let store = store.clone();
        async move {
            let found: Vec<Path> = store
                .list(Some(&Path::from(prefix)))
                .map_ok(|o| o.location)
                .try_collect()
                .await
                .unwrap();
            found
        }
    };
    let newest = keys("checkpoints")
        .await
        .into_iter()
        .max()
        .expect("a checkpoint");
    // checkpoints/{epoch:010}-{seq:012}-{ms}.ckpt covers what is below wal/{epoch}/{seq}.
    let name = newest
        .filename()
        .unwrap()
        .trim_end_matches(".ckpt")
        .to_string();
    let mut parts = name.split('-');
    let (epoch, seq) = (parts.next().unwrap(), parts.next().unwrap());
    let covered_below = format!("{epoch}/{seq}");
    let mut deleted = 0;
    for key in keys("wal").await {
        let rest = key
            .as_ref()
            .trim_start_matches("wal/")
            .trim_end_matches(".wal");
        if rest < covered_below.as_str() {
            store.delete(&key).await.unwrap();
            deleted += 1;
        }
    }
    deleted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_outage_gives_503_json_then_recovers_by_itself() {
    let s3 = start_s3("outage");
    let dir = TempDir::new("outage");
    let store = url(&s3, BUCKET, "outage");
    let server = Server::start(
        dir.path(),
        &[
            "--store",
            &store,
            "--store-down-after",
            "500ms",
            "--append-timeout",
            "20s",
        ],
    )
    .await;
    let c = &server.client;
    assert_eq!(put(c, "/o", TEXT, "").await, 201);
    assert_eq!(post(c, "/o", TEXT, "before\n").await, 204);

    s3.control.set_down(true);
    let started = Instant::now();
    let r = c.post("/o", TEXT, "during\n").await.unwrap();
    let first = started.elapsed();
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("object store"),
        "{body}"
    );
    assert!(
        first < Duration::from_secs(5),
        "first failure took {first:?}"
    );
    let started = Instant::now();
    let r = c.post("/o", TEXT, "during-2\n").await.unwrap();
    assert_eq!(r.status.as_u16(), 503);
    let fast = started.elapsed();
    assert!(
        fast < Duration::from_millis(200),
        "later failures took {fast:?}"
    );
    assert_eq!(c.get("/readyz").await.unwrap().status.as_u16(), 503);

    s3.control.set_down(false);
    let recovered = Instant::now();
    eventually(Duration::from_secs(15), || async {
        let r = c.post("/o", TEXT, "after\n").await.ok()?;
        (r.status.as_u16() == 204).then_some(())
    })
    .await;
    eprintln!(
        "first 503 after {first:?}, then {fast:?}; recovered {:?} after the store returned",
        recovered.elapsed()
    );
    let text = String::from_utf8(read_all(c, "/o").await).unwrap();
    // "during" was accepted before the outage was known (outcome unknown to its
    // client) and landed later; "during-2" was refused. Nothing twice.
    assert_eq!(text, "before\nduring\nafter\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wal_store_holds_the_wal_and_reads_follow_it() {
    use picomq_engine::store;
    let s3 = shared_s3();
    let data_url = url(s3, BUCKET, "split-data");
    let wal_url = url(s3, WAL_BUCKET, "split-wal");
    let dir = TempDir::new("split");
    let mut server =
        Server::start_process(dir.path(), &["--store", &data_url, "--wal-store", &wal_url]).await;
    assert_eq!(put(&server.client, "/s", TEXT, "one ").await, 201);
    assert_eq!(post(&server.client, "/s", TEXT, "two").await, 204);
    let keys = |u: String| async move {
        use futures::TryStreamExt;
        let s = store::open(&u).unwrap();
        let all: Vec<_> = s.list(None).try_collect().await.unwrap();
        all.into_iter()
            .map(|m| m.location.to_string())
            .collect::<Vec<_>>()
    };
    let wal_keys = keys(wal_url.clone()).await;
    assert!(
        wal_keys.iter().any(|k| k.starts_with("wal/")),
        "{wal_keys:?}"
    );
    assert!(
        wal_keys.iter().any(|k| k.starts_with("epochs/")),
        "{wal_keys:?}"
    );
    let data_keys = keys(data_url.clone()).await;
    assert!(
        !data_keys.iter().any(|k| k.starts_with("wal/")),
        "{data_keys:?}"
    );
    server.restart().await;
    assert_eq!(read_all(&server.client, "/s").await, b"one two");
    let wal_puts = metric_labels(
        &server.client,
        "picomq_object_store_requests_total",
        &["store=\"wal\"", "op=\"put\""],
    )
    .await;
    assert!(wal_puts >= 1.0);
}

/// Sum of a metric's samples whose labels contain every one of `labels`.
async fn metric_labels(client: &Client, name: &str, labels: &[&str]) -> f64 {
    let text = client.get("/metrics").await.unwrap().text();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_requests_bytes_and_cost() {
    let s3 = shared_s3();
    let dir = TempDir::new("metrics");
    let admin_port = support::free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    let server = Server::start(
        dir.path(),
        &[
            "--store",
            &url(s3, BUCKET, "metrics"),
            "--admin-listen",
            &admin,
        ],
    )
    .await;
    let c = &server.client;
    const CLIENTS: usize = 50;
    const PER_CLIENT: usize = 20;
    for i in 0..CLIENTS {
        assert_eq!(put(c, &format!("/m/{i}"), TEXT, "").await, 201);
    }
    let puts = |c: Client| async move {
        metric_labels(&c, "picomq_object_store_requests_total", &["op=\"put\""]).await
    };
    let puts_before = puts(c.clone()).await;
    let appends_before = metric(c, "picomq_appends_total").await;
    let timed_before = metric(c, "picomq_append_duration_seconds_count").await;
    let commits_before = metric(c, "picomq_wal_commit_seconds_count").await;
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..PER_CLIENT {
                let r = c
                    .post(&format!("/m/{i}"), TEXT, format!("{i}-{j}\n"))
                    .await
                    .unwrap();
                assert_eq!(r.status.as_u16(), 204, "{}", r.text());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let appends = metric(c, "picomq_appends_total").await - appends_before;
    let put_requests = puts(c.clone()).await - puts_before;
    eprintln!("{appends} appends from {CLIENTS} clients -> {put_requests} object-store PUTs");
    assert_eq!(appends as usize, CLIENTS * PER_CLIENT);
    assert_eq!(
        metric(c, "picomq_append_records_total").await as usize,
        CLIENTS * PER_CLIENT
    );
    assert!(put_requests >= 1.0);
    // Every acknowledged append was timed; every WAL object's commit too (one PUT each).
    let timed = metric(c, "picomq_append_duration_seconds_count").await - timed_before;
    assert_eq!(timed as usize, CLIENTS * PER_CLIENT);
    let commits = metric(c, "picomq_wal_commit_seconds_count").await - commits_before;
    assert!(
        commits >= 1.0 && commits <= put_requests,
        "{commits} commits, {put_requests} PUTs"
    );
    assert!(metric(c, "picomq_append_duration_seconds_sum").await > 0.0);
    assert!(
        metric_labels(c, "picomq_append_duration_seconds_bucket", &["le=\"+Inf\""]).await >= timed
    );
    assert!(
        put_requests * 5.0 <= appends,
        "{put_requests} PUTs for {appends} appends"
    );
    // Bytes and latency were recorded, and the bill estimate moved.
    assert!(
        metric_labels(
            c,
            "picomq_object_store_bytes_total",
            &["direction=\"written\""]
        )
        .await
            > 10_000.0
    );
    assert!(
        metric_labels(
            c,
            "picomq_object_store_request_duration_seconds_count",
            &["op=\"put\""]
        )
        .await
            >= put_requests
    );
    let cost = metric_labels(
        c,
        "picomq_object_store_cost_dollars_total",
        &["component=\"put_requests\""],
    )
    .await;
    // PUT-class requests: PUT, COPY and LIST.
    let mut put_class = 0.0;
    for op in ["put", "copy", "list"] {
        put_class += metric_labels(
            c,
            "picomq_object_store_requests_total",
            &[&format!("op=\"{op}\"")],
        )
        .await;
    }
    assert!(
        (cost - put_class * 0.005 / 1000.0).abs() < 1e-9,
        "cost {cost} for {put_class} PUT-class requests"
    );
    // Reads by tier: a fresh read is served from memory.
    let _ = read_all(c, "/m/0").await;
    assert!(metric_labels(c, "picomq_reads_total", &["tier=\"memory\""]).await > 0.0);
    // Counted in the index, which trails the acknowledgements by up to its batch linger.
    eventually(Duration::from_secs(10), || async {
        (metric(c, "picomq_streams").await >= CLIENTS as f64).then_some(())
    })
    .await;
    // The admin port serves the same families.
    let admin_client = Client::new(&format!("http://{admin}"));
    let text = admin_client.get("/metrics").await.unwrap().text();
    assert!(
        text.contains(
            "picomq_object_store_requests_total{store=\"data\",op=\"put\",outcome=\"ok\"}"
        ),
        "{text}"
    );
    assert_eq!(
        admin_client.get("/readyz").await.unwrap().status.as_u16(),
        200
    );
}

/// Token changes travel in the WAL like stream lifecycle changes: a node killed right
/// after issuing and revoking tokens, with no checkpoint ever written, is rebuilt from
/// the bucket alone and knows them, the bootstrap token and the read-token key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_come_back_from_the_bucket_alone() {
    use picomq_client::HttpMethod;
    use support::{bearer, issue_token, start_with_auth_as, ADMIN_SECRET};
    let store = url(shared_s3(), BUCKET, "tokens");
    let dir = TempDir::new("tokens-old");
    let mut old = start_with_auth_as(
        dir.path(),
        &["--store", &store, "--checkpoint-interval", "0"],
        true,
    )
    .await;
    let c = old.client.clone();
    let (_, kept) = issue_token(
        &c,
        ADMIN_SECRET,
        serde_json::json!({"scopes": ["all:t/**"]}),
    )
    .await;
    let (revoked_id, revoked) = issue_token(
        &c,
        ADMIN_SECRET,
        serde_json::json!({"scopes": ["all:t/**"]}),
    )
    .await;
    let admin = bearer(ADMIN_SECRET);
    let r = c
        .send(
            HttpMethod::DELETE,
            &format!("/__picomq/tokens/{revoked_id}"),
            &[("authorization", &admin)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    let link = c
        .send(
            HttpMethod::POST,
            "/__picomq/read-tokens",
            &[
                ("authorization", &admin),
                ("content-type", "application/json"),
            ],
            serde_json::json!({"stream": "/t/1", "expiresInSeconds": 600}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(link.status.as_u16(), 201, "{}", link.text());
    let link: serde_json::Value = serde_json::from_slice(&link.body).unwrap();
    let link = link["token"].as_str().expect("read token").to_string();
    assert_eq!(
        support::metric_as(&c, Some(ADMIN_SECRET), "picomq_checkpoints_total").await,
        0.0
    );
    old.kill9();
    drop(old);
    std::fs::remove_dir_all(dir.path()).unwrap();

    // No bootstrap file this time: the bootstrap token itself must come back.
    let fresh = TempDir::new("tokens-new");
    let new = Server::start(fresh.path(), &["--store", &store, "--auth", "required"]).await;
    let put = |token: String| {
        let c = new.client.clone();
        async move {
            let auth = bearer(&token);
            c.send(HttpMethod::PUT, "/t/1", &[("authorization", &auth)], "")
                .await
                .unwrap()
                .status
                .as_u16()
        }
    };
    assert_eq!(put(kept).await, 201, "a token from the log");
    assert_eq!(put(revoked).await, 401, "a revocation from the log");
    assert_eq!(
        put(ADMIN_SECRET.to_string()).await,
        200,
        "the bootstrap token"
    );
    let r = new
        .client
        .get(&format!("/t/1?offset=-1&token={link}"))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "the read-token key: {}", r.text());
}

/// A row of a piece's size or more (here one 1.5 MiB append) stays in its WAL object
/// for good: the packer and compaction leave it, so its bytes are written once; the
/// small rows around it are packed as usual, GC keeps the WAL object while the row
/// lives, and after a kill -9 the stream reads back whole, the big row in one GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_wal_rows_stay_where_the_wal_wrote_them() {
    let s3 = shared_s3();
    let store = url(s3, BUCKET, "big-rows");
    let dir = TempDir::new("big-rows");
    let mut server = Server::start_process(
        dir.path(),
        &[
            "--store",
            &store,
            "--compaction-interval",
            "0",
            "--compaction-delay",
            "0s",
            "--checkpoint-interval",
            "150ms",
            "--gc-interval",
            "150ms",
            "--tail-cache-bytes",
            "0",
        ],
    )
    .await;
    let c = server.client.clone();
    const BIN: &[(&str, &str)] = &[("content-type", "application/octet-stream")];
    assert_eq!(put(&c, "/big", BIN, "").await, 201);
    assert_eq!(put(&c, "/small", TEXT, "").await, 201);
    let big: Vec<u8> = (0..(3usize << 19)).map(|i| (i * 7 % 251) as u8).collect();
    let mut expected = b"head;".to_vec();
    let r = c.post("/big", BIN, "head;").await.unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    let r = c.post("/big", BIN, big.clone()).await.unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    expected.extend_from_slice(&big);
    for i in 0..20 {
        assert_eq!(post(&c, "/small", TEXT, &format!("s{i};")).await, 204);
        let r = c.post("/big", BIN, format!("t{i};")).await.unwrap();
        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
        expected.extend_from_slice(format!("t{i};").as_bytes());
    }
    // The small rows go into L0 packs within about a second (three pieces: /big's
    // head, /big's rows past the big one, /small's); the big one does not.
    eventually(Duration::from_secs(20), || async {
        let l0 = metric_labels(&c, "picomq_pack_pieces_total", &["level=\"l0\""]).await;
        (l0 >= 3.0).then_some(())
    })
    .await;
    let packed = metric(&c, "picomq_pack_bytes_written_total").await;
    assert!(
        packed > 0.0 && packed < (1 << 20) as f64,
        "packed {packed} bytes"
    );
    // Written through into the block cache as a pack would be: a reader just
    // behind the tail (no tail cache here) misses the cache nowhere. (Store GETs
    // are no measure here: GC, every 150 ms, reads small objects to tell seals.)
    let misses = metric(&c, "picomq_block_cache_misses_total").await;
    assert_eq!(read_all(&c, "/big").await, expected);
    assert_eq!(
        metric(&c, "picomq_block_cache_misses_total").await - misses,
        0.0,
        "block cache misses reading /big"
    );
    // Compaction of everything in the WAL leaves it too.
    let r = c.post("/__picomq/compact?delay=0s", &[], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let report: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        report["bytes_read"].as_u64().unwrap() < 1 << 20,
        "compaction read the big row: {report}"
    );
    // Two GC passes later (every 150 ms), the WAL object holding the row stays.
    let passes = metric(&c, "picomq_gc_passes_total").await;
    eventually(Duration::from_secs(20), || async {
        (metric(&c, "picomq_gc_passes_total").await >= passes + 2.0).then_some(())
    })
    .await;
    let wal_sizes = {
        use futures::TryStreamExt;
        use picomq_engine::store::{self, ObjectPath};
        let s = store::open(&store).unwrap();
        let all: Vec<_> = s
            .list(Some(&ObjectPath::from("wal")))
            .try_collect()
            .await
            .unwrap();
        all.into_iter().map(|m| m.size).collect::<Vec<_>>()
    };
    assert!(
        wal_sizes.iter().any(|&n| n >= big.len() as u64),
        "no WAL object holds the big row: {wal_sizes:?}"
    );
    server.restart().await;
    let c = server.client.clone();
    let before = gets(&c).await;
    assert_eq!(read_all(&c, "/big").await, expected);
    let gets = gets(&c).await - before;
    assert!(gets <= 4.0, "{gets} GETs to read /big back");
    let small: String = (0..20).map(|i| format!("s{i};")).collect();
    assert_eq!(read_all(&c, "/small").await, small.as_bytes());
}

async fn gets(c: &Client) -> f64 {
    metric_labels(c, "picomq_object_store_requests_total", &["op=\"get\""]).await
}

use picomq_engine::store::{
    Attribute, Attributes, ObjectPath as Path, ObjectStore, ObjectStoreError, ObjectStoreExt,
    PutMode, PutOptions, PutPayload, UpdateVersion,
};

/// The test server's own objects, through object_store as the node's store.
fn test_store(s3: &S3Server, unsigned: bool) -> Arc<dyn ObjectStore> {
    let base = url(s3, BUCKET, "etags");
    let base = &base[..base.find('?').unwrap()];
    let base = base.rsplit_once('/').unwrap().0;
    picomq_engine::store::open(&format!(
        "{base}?endpoint={}&region={REGION}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}&allow_http=true&unsigned_payload={unsigned}",
        s3.endpoint()
    ))
    .unwrap()
}

fn test_prefix() -> String {
    format!("etags-{}", std::process::id())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// PUTs through a real S3 client (SigV4 over HTTP): the ones the test server writes
/// itself (signed body, ETag from its SHA-256) and the ones it leaves to s3s-fs
/// (unsigned body, MD5 ETag) read back alike, and conditional PUTs hold on both.
#[tokio::test]
async fn test_server_signed_puts_take_their_etag_from_the_signed_digest_and_read_back_like_any_other(
) {
    let server = shared_s3();
    let signed = test_store(server, false);
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sha = hex(ring::digest::digest(&ring::digest::SHA256, &body).as_ref());

    // Written by the server itself: the ETag is the digest's first 128 bits, and the
    // bytes, length and attributes read back through s3s-fs's GET and HEAD.
    let key = Path::from(format!("{}/one", test_prefix()));
    let mut attributes = Attributes::new();
    attributes.insert(Attribute::ContentType, "application/x-test".into());
    let put = signed
        .put_opts(
            &key,
            PutPayload::from(body.clone()),
            PutOptions {
                attributes,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let want = format!("\"{}\"", &sha[..32]);
    assert_eq!(put.e_tag.as_deref(), Some(want.as_str()));
    let got = signed.get(&key).await.unwrap();
    assert_eq!(got.meta.e_tag.as_deref(), Some(want.as_str()));
    assert_eq!(got.meta.size, body.len() as u64);
    assert_eq!(
        got.attributes
            .get(&Attribute::ContentType)
            .map(|v| v.as_ref()),
        Some("application/x-test")
    );
    assert_eq!(got.bytes().await.unwrap().as_ref(), &body[..]);
    let listed = signed
        .list_with_delimiter(Some(&Path::from(test_prefix())))
        .await
        .unwrap();
    assert_eq!(listed.objects.len(), 1);

    // Create-only on an existing key fails; an update with the current ETag
    // succeeds once, and the stale ETag then fails.
    let err = signed
        .put_opts(&key, PutPayload::from_static(b"x"), PutMode::Create.into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ObjectStoreError::AlreadyExists { .. }),
        "{err}"
    );
    let version = UpdateVersion {
        e_tag: put.e_tag.clone(),
        version: None,
    };
    let updated = signed
        .put_opts(
            &key,
            PutPayload::from_static(b"second"),
            PutMode::Update(version.clone()).into(),
        )
        .await
        .unwrap();
    assert_ne!(updated.e_tag, put.e_tag);
    let err = signed
        .put_opts(
            &key,
            PutPayload::from_static(b"third"),
            PutMode::Update(version).into(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ObjectStoreError::Precondition { .. }),
        "{err}"
    );
    assert_eq!(
        signed
            .get(&key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"second"
    );

    // Left to s3s-fs (unsigned body): an MD5 ETag, and the two kinds mix.
    let unsigned = test_store(server, true);
    let other = Path::from(format!("{}/two", test_prefix()));
    let put = unsigned
        .put(&other, PutPayload::from_static(b"abc"))
        .await
        .unwrap();
    assert_eq!(
        put.e_tag.as_deref(),
        Some("\"900150983cd24fb0d6963f7d28e17f72\"")
    );
    assert_eq!(
        signed
            .get(&other)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"abc"
    );
    assert_eq!(
        unsigned
            .get(&key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"second"
    );
}
