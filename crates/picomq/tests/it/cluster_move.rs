//! A single node's streams moved into a cluster with `picomq store move-to-postgres`:
//! after a clean stop and after `kill -9` (acknowledged appends not yet in its
//! SQLite), two cluster nodes on the database and the single node's prefix serve
//! every record as it was written (JSON, bytes, a closed stream, a TTL, a fork, a
//! trim), appends go on at the right offsets, an idempotent producer's retry is
//! still a duplicate, tokens (revoked ones too) come along, and the single node
//! itself is refused from then on. A move that failed before its last step runs
//! again over its own copy. The command refuses, writing nothing to the database or
//! the prefix, while the single node runs, onto a database a cluster uses, and for
//! a prefix the node's metadata does not belong to; bad input fails with a clear
//! message. Real processes throughout, on the S3 test server and Postgres
//! (`PICOMQ_TEST_PG_URL`).

use std::path::Path;
use std::time::Duration;

use picomq_engine::store::{ObjectPath, ObjectStoreExt};
use picomq_testkit as support;
use support::cli::{Cli, Run};
use support::cluster::TestCluster;
use support::postgres::Database;
use support::{fresh_s3_url, read_all, start_refused, Client, Server, TempDir};

const LEASE: &[&str] = &["--lease", "2s"];
const JSON: (&str, &str) = ("content-type", "application/json");
const BYTES: (&str, &str) = ("content-type", "application/octet-stream");
const TEXT: (&str, &str) = ("content-type", "text/plain");
/// Every stream the single node writes.
const STREAMS: &[&str] = &[
    "/m/json",
    "/m/bytes",
    "/m/producer",
    "/m/closed",
    "/m/ttl",
    "/m/fork",
    "/m/trimmed",
];

/// The prefix's `identity.json`.
async fn identity(store_url: &str) -> serde_json::Value {
    let store = picomq_engine::store::open(store_url).expect("open the test store");
    let got = store
        .get(&ObjectPath::from("identity.json"))
        .await
        .expect("identity.json");
    serde_json::from_slice(&got.bytes().await.expect("read identity.json")).expect("JSON")
}

async fn run_move(dir: &Path, store: &str, meta: &str, yes: bool) -> Run {
    let dir = dir.display().to_string();
    let mut args = vec![
        "store",
        "move-to-postgres",
        "--data-dir",
        &dir,
        "--store",
        store,
        "--meta",
        meta,
    ];
    if yes {
        args.push("--yes");
    }
    Cli::new("http://127.0.0.1:1").run(&args).await
}

/// A refusal: exit 1, `why` in the message, no panic.
fn assert_refused(r: &Run, why: &str) {
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains(why), "{why:?} not in {r:?}");
    assert!(!r.stderr.contains("panicked"), "{r:?}");
}

/// A database nothing was written to: no binding, no streams, no members.
async fn assert_untouched(db: &Database) {
    assert_eq!(db.scalar("SELECT cluster_id FROM identity").await, None);
    for table in ["streams", "members", "tokens"] {
        let n = db
            .scalar(&format!("SELECT count(*)::text FROM {table}"))
            .await;
        assert!(matches!(n.as_deref(), None | Some("0")), "{table}: {n:?}");
    }
}

/// The status of a request's answer.
macro_rules! status {
    ($request:expr) => {
        $request.await.expect("request").status.as_u16()
    };
}

fn producer(epoch: &'static str, seq: &'static str) -> [(&'static str, &'static str); 4] {
    [
        TEXT,
        ("producer-id", "mover"),
        ("producer-epoch", epoch),
        ("producer-seq", seq),
    ]
}

/// JSON and byte streams, an idempotent producer, a closed stream, one with a TTL,
/// a fork (with appends to its source after the fork point) and a trimmed stream.
/// Returns an offset of the trimmed stream below its start.
async fn write_history(c: &Client) -> String {
    assert_eq!(status!(c.put("/m/json", &[JSON], r#"[{"n":0}]"#)), 201);
    for i in 1..=5 {
        let body = format!(r#"[{{"n":{i}}},{{"text":"x{i}"}}]"#);
        assert_eq!(status!(c.post("/m/json", &[JSON], body)), 204);
    }
    assert_eq!(
        status!(c.put("/m/bytes", &[BYTES], vec![0u8, 1, 2, 255])),
        201
    );
    for i in 0..20u32 {
        let body: Vec<u8> = (0..=i).map(|b| (b * 37 + i) as u8).collect();
        assert_eq!(status!(c.post("/m/bytes", &[BYTES], body)), 204);
    }
    assert_eq!(status!(c.put("/m/producer", &[TEXT], "")), 201);
    for (seq, body) in [("0", "p0;"), ("1", "p1;"), ("2", "p2;")] {
        let headers = producer("1", seq);
        assert_eq!(status!(c.post("/m/producer", &headers, body)), 200);
    }
    let closed = [TEXT, ("stream-closed", "true")];
    assert_eq!(status!(c.put("/m/closed", &closed, "done")), 201);
    let ttl = [TEXT, ("stream-ttl", "3600")];
    assert_eq!(status!(c.put("/m/ttl", &ttl, "lives an hour")), 201);
    let head = c.head("/m/bytes").await.expect("head");
    let at = head
        .header("stream-next-offset")
        .expect("offset")
        .to_string();
    let fork = [
        ("stream-forked-from", "/m/bytes"),
        ("stream-fork-offset", at.as_str()),
    ];
    assert_eq!(status!(c.put("/m/fork", &fork, "")), 201);
    assert_eq!(status!(c.post("/m/bytes", &[BYTES], "after the fork")), 204);
    assert_eq!(status!(c.post("/m/fork", &[BYTES], "the fork's own")), 204);
    assert_eq!(status!(c.put("/m/trimmed", &[TEXT], "")), 201);
    let mut offsets = Vec::new();
    for i in 0..10 {
        let r = c
            .post("/m/trimmed", &[TEXT], format!("r{i};"))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 204);
        offsets.push(r.header("stream-next-offset").expect("offset").to_string());
    }
    // Everything before r5 goes.
    let trim = format!("/__picomq/streams/m/trimmed/trim?before={}", offsets[4]);
    let r = c.post(&trim, &[], "").await.unwrap();
    assert!(r.status.is_success(), "{}", r.text());
    assert_eq!(read_all(c, "/m/trimmed").await, b"r5;r6;r7;r8;r9;");
    offsets.swap_remove(0)
}

/// Each stream's bytes, next offset and start offset as `c` serves them.
async fn snapshot(c: &Client) -> Vec<(Vec<u8>, String, String)> {
    let mut out = Vec::new();
    for path in STREAMS {
        let head = c.head(path).await.expect("head");
        assert_eq!(head.status.as_u16(), 200, "HEAD {path}");
        let offset = |name: &str| head.header(name).expect(name).to_string();
        let (next, start) = (offset("stream-next-offset"), offset("stream-start-offset"));
        out.push((read_all(c, path).await, next, start));
    }
    out
}

/// Waits until `c` serves every stream (slots settle after the nodes join).
async fn wait_served(c: &Client) {
    support::eventually(Duration::from_secs(30), || async {
        for path in STREAMS {
            let r = c.head(path).await.ok()?;
            if r.status.as_u16() != 200 {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// What the cluster must show after the move: everything as it was, then the
/// streams going on where they ended.
async fn check_moved(cluster: &TestCluster, before: &[(Vec<u8>, String, String)], trimmed: &str) {
    for i in 0..2 {
        let c = &cluster.node(i).client;
        wait_served(c).await;
        assert_eq!(snapshot(c).await, before, "as node {i} serves them");
    }
    let (a, b) = (&cluster.node(0).client, &cluster.node(1).client);
    let ttl = a.head("/m/ttl").await.expect("head");
    assert_eq!(ttl.header("stream-ttl"), Some("3600"));
    let closed = b.head("/m/closed").await.expect("head");
    assert_eq!(closed.header("stream-closed"), Some("true"));
    assert_eq!(status!(a.post("/m/closed", &[TEXT], "more")), 409);
    let below = b
        .get(&format!("/m/trimmed?offset={trimmed}"))
        .await
        .unwrap();
    assert_eq!(below.status.as_u16(), 410, "{}", below.text());
    // The producer's retry is a duplicate; its next sequence is appended; an older
    // epoch is fenced.
    let (retry, next, stale) = (producer("1", "2"), producer("1", "3"), producer("0", "0"));
    assert_eq!(status!(b.post("/m/producer", &retry, "p2;")), 204);
    assert_eq!(status!(a.post("/m/producer", &next, "p3;")), 200);
    assert_eq!(status!(b.post("/m/producer", &stale, "z")), 403);
    assert_eq!(read_all(a, "/m/producer").await, b"p0;p1;p2;p3;");
    // Appends go on at the offsets where the single node stopped.
    let bytes_tail = &before[1].1;
    assert_eq!(status!(b.post("/m/bytes", &[BYTES], "cluster")), 204);
    let r = a
        .get(&format!("/m/bytes?offset={bytes_tail}"))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    assert_eq!(&r.body[..], b"cluster");
    let json_tail = &before[0].1;
    assert_eq!(status!(a.post("/m/json", &[JSON], r#"{"n":99}"#)), 204);
    let r = b.get(&format!("/m/json?offset={json_tail}")).await.unwrap();
    assert_eq!(r.text(), r#"[{"n":99}]"#);
    let mut fork = before[5].0.clone();
    fork.extend_from_slice(b" and on");
    assert_eq!(status!(b.post("/m/fork", &[BYTES], " and on")), 204);
    assert_eq!(read_all(a, "/m/fork").await, fork);
    // New streams get ids of their own: the moved ones are unchanged by them.
    for i in 0..4 {
        let path = format!("/m/new-{i}");
        let c = if i % 2 == 0 { a } else { b };
        assert_eq!(status!(c.put(&path, &[TEXT], format!("new {i}"))), 201);
    }
    for i in 0..4 {
        assert_eq!(
            read_all(a, &format!("/m/new-{i}")).await,
            format!("new {i}").into_bytes()
        );
    }
    let mut json = before[0].0.clone();
    json.truncate(json.len() - 1);
    json.extend_from_slice(br#",{"n":99}]"#);
    assert_eq!(read_all(b, "/m/json").await, json);
    // The single node's logs are finished members of the cluster.
    let v = cluster.nodes_seen_by(0).await;
    let moved = v["nodes"].as_array().unwrap().iter();
    let moved: Vec<_> = moved
        .filter(|n| n["nodeId"] == "single-node (moved)")
        .collect();
    assert!(!moved.is_empty(), "{v}");
    assert!(moved.iter().all(|n| n["state"] == "left"), "{v}");
}

/// The number in "N WAL objects past its index" of a move's output.
fn unindexed(r: &Run) -> u64 {
    let (before, _) = r
        .stdout
        .split_once(" WAL objects past its index")
        .unwrap_or_else(|| panic!("no count of unindexed objects: {r:?}"));
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of unindexed objects: {r:?}"))
}

async fn moves_into_a_cluster(tag: &str, kill: bool) {
    let prefix = fresh_s3_url(tag);
    let dir = TempDir::new(tag);
    let mut single = Server::start_process(dir.path(), &["--store", &prefix]).await;
    let trimmed = write_history(&single.client).await;
    let mut before = snapshot(&single.client).await;
    let db = Database::create(tag).await;
    let dry = if kill {
        // Appends acknowledged just before a kill: the indexer (200 ms behind) has
        // not written them to the SQLite, only the bucket holds them. Should a batch
        // of the index land in the millisecond between the last answer and the kill,
        // the node is restarted (it recovers) and killed again after another burst.
        let mut attempt = 0;
        loop {
            for i in 0..10u8 {
                let body = vec![i + 10 * attempt; 3];
                before[1].0.extend_from_slice(&body);
                let r = single
                    .client
                    .post("/m/bytes", &[BYTES], body)
                    .await
                    .unwrap();
                assert_eq!(r.status.as_u16(), 204);
                before[1].1 = r.header("stream-next-offset").expect("offset").to_string();
            }
            single.kill9();
            let dry = run_move(dir.path(), &prefix, &db.url, false).await;
            assert_eq!(dry.code, 0, "{dry:?}");
            if unindexed(&dry) > 0 {
                break dry;
            }
            attempt += 1;
            assert!(
                attempt < 3,
                "every burst was indexed before the kill: {dry:?}"
            );
            single.restart().await;
        }
    } else {
        assert!(single.terminate(Duration::from_secs(30)).success());
        let dry = run_move(dir.path(), &prefix, &db.url, false).await;
        assert_eq!(dry.code, 0, "{dry:?}");
        assert_eq!(unindexed(&dry), 0, "{dry:?}");
        dry
    };
    assert!(dry.stdout.contains("--yes"), "{dry:?}");
    assert_untouched(&db).await;
    assert_eq!(identity(&prefix).await["metaKind"], "sqlite");
    let done = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.stdout.contains("bound: cluster"), "{done:?}");
    let id = identity(&prefix).await;
    assert_eq!(id["metaKind"], "postgres", "{id}");
    // Run again: done already, nothing changes.
    let again = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("already moved"), "{again:?}");
    assert_eq!(identity(&prefix).await, id);
    // The single node is refused on its old prefix from now on.
    let refused = start_refused(dir.path(), &["--store", &prefix], Duration::from_secs(30));
    assert!(
        refused
            .log
            .contains("single node (SQLite) cannot serve a cluster's prefix"),
        "{}",
        refused.log
    );
    let cluster = TestCluster::start_on(db, &prefix, 2, LEASE).await;
    check_moved(&cluster, &before, &trimmed).await;
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_single_node_moves_into_a_cluster() {
    moves_into_a_cluster("mvstop", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_single_node_moves_into_a_cluster_with_its_unindexed_appends() {
    moves_into_a_cluster("mvkill", true).await;
}

/// A single node on a fresh prefix that wrote one stream, stopped.
async fn stopped_single(tag: &str) -> (TempDir, String) {
    let prefix = fresh_s3_url(tag);
    let dir = TempDir::new(tag);
    let mut single = Server::start_process(dir.path(), &["--store", &prefix]).await;
    let r = single.client.put("/s/one", &[TEXT], "one");
    assert_eq!(status!(r), 201);
    assert!(single.terminate(Duration::from_secs(30)).success());
    (dir, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_moves_write_nothing() {
    // The single node still runs.
    let prefix = fresh_s3_url("mvrun");
    let dir = TempDir::new("mvrun");
    let mut single = Server::start_process(dir.path(), &["--store", &prefix]).await;
    assert_eq!(status!(single.client.put("/s/one", &[TEXT], "one")), 201);
    let db = Database::create("mvrefused").await;
    let before = support::store_keys(&prefix).await;
    let r = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_refused(&r, "the single node still runs");
    assert!(r.stderr.contains(&format!("pid {}", single.pid())), "{r:?}");
    assert_untouched(&db).await;
    assert!(single.terminate(Duration::from_secs(30)).success());
    let after_stop = support::store_keys(&prefix).await;
    assert!(before.iter().all(|k| after_stop.contains(k)));

    // A prefix the node's metadata does not belong to: another single node's.
    let (other_dir, other) = stopped_single("mvother").await;
    let other_keys = support::store_keys(&other).await;
    let r = run_move(dir.path(), &other, &db.url, true).await;
    assert_refused(&r, "do not belong to each other");
    assert_untouched(&db).await;
    assert_eq!(
        support::store_keys(&other).await,
        other_keys,
        "nothing written to it"
    );
    assert_eq!(
        support::store_keys(&prefix).await,
        after_stop,
        "nor to its own"
    );
    drop(other_dir);

    // A database a cluster uses: while its node runs, and after it stopped.
    let mut cluster = TestCluster::start("mvbusy", 1, LEASE).await;
    let c = &cluster.node(0).client;
    assert_eq!(status!(c.put("/c/one", &[TEXT], "c")), 201);
    let r = run_move(dir.path(), &prefix, &cluster.db.url, true).await;
    assert_refused(&r, "nodes still run on");
    assert!(r.stderr.contains("node-1"), "{r:?}");
    cluster.node_mut(0).stop().await;
    let r = run_move(dir.path(), &prefix, &cluster.db.url, true).await;
    assert_refused(&r, "is bound to cluster");
    assert_eq!(
        support::store_keys(&prefix).await,
        after_stop,
        "the prefix is untouched"
    );
    assert_eq!(identity(&prefix).await["metaKind"], "sqlite");
    let streams = "SELECT count(*)::text FROM streams";
    assert_eq!(cluster.db.scalar(streams).await.as_deref(), Some("1"));
    cluster.shut_down().await;

    // Onto an empty database it would go.
    let r = run_move(dir.path(), &prefix, &db.url, false).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_untouched(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_fails_with_a_clear_message() {
    let (dir, prefix) = stopped_single("mvbad").await;
    let before = support::store_keys(&prefix).await;
    let db = Database::create("mvbad").await;
    let missing = dir.path().join("not-there");
    let r = run_move(&missing, &prefix, &db.url, true).await;
    assert_refused(&r, "no such directory");
    assert!(!missing.exists(), "the missing directory was not created");
    let empty = TempDir::new("mvbad-empty");
    let r = run_move(empty.path(), &prefix, &db.url, true).await;
    assert_refused(&r, "no single node's metadata");
    let not_pg = format!("sqlite://{}", dir.path().join("meta.sqlite").display());
    let r = run_move(dir.path(), &prefix, &not_pg, true).await;
    assert_refused(&r, "must be a postgres://");
    let r = run_move(dir.path(), &prefix, "http://127.0.0.1:1/db", true).await;
    assert_refused(&r, "must be a postgres://");
    let unreachable = "postgres://picomq:secret@127.0.0.1:1/nowhere";
    let r = run_move(dir.path(), &prefix, unreachable, true).await;
    assert_refused(&r, "cannot connect");
    assert!(!r.stderr.contains("secret"), "{r:?}");
    assert_eq!(
        support::store_keys(&prefix).await,
        before,
        "nothing written to the prefix"
    );
    assert_untouched(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_that_did_not_finish_is_run_again_over_its_own_copy() {
    let prefix = fresh_s3_url("mvagain");
    let dir = TempDir::new("mvagain");
    let mut single = Server::start_process(dir.path(), &["--store", &prefix]).await;
    let trimmed = write_history(&single.client).await;
    assert!(single.terminate(Duration::from_secs(30)).success());
    let store = picomq_engine::store::open(&prefix).expect("open the test store");
    let path = ObjectPath::from("identity.json");
    let saved = store.get(&path).await.unwrap().bytes().await.unwrap();
    let db = Database::create("mvagain").await;
    let done = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_eq!(done.code, 0, "{done:?}");
    // As if the last step, the prefix's identity, had failed: the database holds
    // the copy and is bound, the prefix still says it is the single node's.
    store.put(&path, saved.into()).await.unwrap();
    let member = [
        "--meta",
        db.url.as_str(),
        "--store",
        prefix.as_str(),
        "--node-id",
        "early",
        "--lease",
        "2s",
    ];
    let early = TempDir::new("mvagain-early");
    let refused = start_refused(early.path(), &member, Duration::from_secs(30));
    assert!(
        refused.log.contains("written by a single node"),
        "{}",
        refused.log
    );
    // So the single node may start again, and write on.
    let mut single = Server::start_process(dir.path(), &["--store", &prefix]).await;
    let late = single
        .client
        .post("/m/bytes", &[BYTES], "after the first copy");
    assert_eq!(status!(late), 204);
    let before = snapshot(&single.client).await;
    assert!(single.terminate(Duration::from_secs(30)).success());
    let dry = run_move(dir.path(), &prefix, &db.url, false).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(dry.stdout.contains("did not finish"), "{dry:?}");
    let done = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_eq!(done.code, 0, "{done:?}");
    assert_eq!(identity(&prefix).await["metaKind"], "postgres");
    let cluster = TestCluster::start_on(db, &prefix, 2, LEASE).await;
    check_moved(&cluster, &before, &trimmed).await;
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_move_with_the_streams() {
    use picomq_client::HttpMethod;
    use support::{bearer, issue_token, ADMIN_SECRET};
    let prefix = fresh_s3_url("mvauth");
    let dir = TempDir::new("mvauth");
    let mut single = support::start_with_auth_as(dir.path(), &["--store", &prefix], true).await;
    let c = &single.client;
    let admin = bearer(ADMIN_SECRET);
    let headers = [TEXT, ("authorization", admin.as_str())];
    assert_eq!(status!(c.put("/a/one", &headers, "kept")), 201);
    let read = serde_json::json!({ "scopes": ["read"] });
    let (_, reader) = issue_token(c, ADMIN_SECRET, read.clone()).await;
    let (revoked_id, revoked) = issue_token(c, ADMIN_SECRET, read).await;
    let path = format!("/__picomq/tokens/{revoked_id}");
    let headers = [("authorization", admin.as_str())];
    assert_eq!(
        status!(c.send(HttpMethod::DELETE, &path, &headers, "")),
        204
    );
    assert!(single.terminate(Duration::from_secs(30)).success());
    let db = Database::create("mvauth").await;
    let done = run_move(dir.path(), &prefix, &db.url, true).await;
    assert_eq!(done.code, 0, "{done:?}");
    // The bootstrap token and the two issued, with the server's signing key.
    assert!(done.stdout.contains("3 tokens, 1 server key"), "{done:?}");
    let boot = TempDir::new("mvauth-boot");
    let file = boot.path().join("bootstrap-token");
    std::fs::write(&file, format!("{ADMIN_SECRET}\n")).unwrap();
    let file = file.display().to_string();
    let mut flags = LEASE.to_vec();
    flags.extend([
        "--auth",
        "required",
        "--bootstrap-token-file",
        file.as_str(),
    ]);
    let cluster = TestCluster::start_on(db, &prefix, 2, &flags).await;
    for i in 0..2 {
        let c = &cluster.node(i).client;
        let with = |secret: &str| {
            let auth = bearer(secret);
            async move {
                let r = c
                    .send(
                        HttpMethod::GET,
                        "/a/one?offset=-1",
                        &[("authorization", &auth)],
                        "",
                    )
                    .await
                    .unwrap();
                (r.status.as_u16(), r.text())
            }
        };
        let kept = support::eventually(Duration::from_secs(30), || async {
            let (code, text) = with(&reader).await;
            (code == 200).then_some(text)
        })
        .await;
        assert_eq!(kept, "kept", "the token issued on the single node reads");
        assert_eq!(with(&revoked).await.0, 401, "a revoked token stays revoked");
        assert_eq!(with("not-a-token").await.0, 401);
    }
    cluster.shut_down().await;
}
