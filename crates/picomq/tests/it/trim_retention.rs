//! Trimming and age retention: a trim drops a stream's head (reads below the start
//! answer 410 with the start, `offset=-1` reads from it), survives a crash and a
//! rebuild from the bucket, and lets GC delete the WAL objects that held only trimmed
//! records; streams with `Stream-Retention` are trimmed by age in the background and
//! keep taking appends; bad input gets 400/404 with a JSON body.

use picomq_testkit as support;

use std::time::Duration;

use serde_json::Value;
use support::{eventually, metric, read_all, Client, Server, TempDir};

const TEXT: &[(&str, &str)] = &[("content-type", "text/plain")];

/// The wire form of byte position `pos`.
fn off(pos: u64) -> String {
    picomq_engine::Offset(pos).to_string()
}

fn json(r: &picomq_client::Response) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()))
}

async fn append(c: &Client, path: &str, body: &str) {
    let r = c.post(path, TEXT, body.to_string()).await.unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
}

async fn trim(c: &Client, name: &str, before: &str) -> picomq_client::Response {
    c.post(
        &format!("/__picomq/streams/{name}/trim?before={before}"),
        &[],
        "",
    )
    .await
    .unwrap()
}

/// Reads at `offset` must answer 410 with the stream's start in the body and header.
async fn assert_trimmed(c: &Client, path: &str, offset: &str, start: &str) {
    let r = c.get(&format!("{path}?offset={offset}")).await.unwrap();
    assert_eq!(r.status.as_u16(), 410, "{path} at {offset}: {}", r.text());
    let body = json(&r);
    assert_eq!(body["error"]["code"], "offset_trimmed", "{body}");
    assert_eq!(body["error"]["startOffset"], start, "{body}");
    assert_eq!(r.header("stream-start-offset"), Some(start));
}

async fn start_offset(c: &Client, path: &str) -> String {
    let r = c.head(path).await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    r.header("stream-start-offset")
        .expect("Stream-Start-Offset on HEAD")
        .to_string()
}

/// `/t/s` holds "r0;" .. "r9;" (3 bytes each), trimmed before r5, plus "r10;" after.
async fn check_trimmed(c: &Client) {
    let start = off(15);
    assert_eq!(start_offset(c, "/t/s").await, start);
    for below in [off(0), off(3), off(14)] {
        assert_trimmed(c, "/t/s", &below, &start).await;
    }
    assert_eq!(read_all(c, "/t/s").await, b"r5;r6;r7;r8;r9;r10;");
    let r = c.get(&format!("/t/s?offset={}", off(21))).await.unwrap();
    assert_eq!((r.status.as_u16(), r.text()), (200, "r7;r8;r9;r10;".into()));
    // The fork inherited r0..r9 from /t/s: below the source's start it is gone too.
    assert_eq!(start_offset(c, "/t/fork").await, start);
    assert_trimmed(c, "/t/fork", &off(0), &start).await;
    assert_eq!(read_all(c, "/t/fork").await, b"r5;r6;r7;r8;r9;f;");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_answers_410_below_the_start_and_survives_crash_and_rebuild() {
    let dir = TempDir::new("trim");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let c = server.client.clone();
    assert_eq!(c.put("/t/s", TEXT, "").await.unwrap().status.as_u16(), 201);
    // One append at a time: on an idle WAL each lands in its own object.
    for i in 0..10 {
        append(&c, "/t/s", &format!("r{i};")).await;
    }
    let fork = [
        ("content-type", "text/plain"),
        ("stream-forked-from", "/t/s"),
    ];
    assert_eq!(
        c.put("/t/fork", &fork, "").await.unwrap().status.as_u16(),
        201
    );
    append(&c, "/t/fork", "f;").await;

    // Before any trim the start is 0 and everything reads.
    assert_eq!(start_offset(&c, "/t/s").await, off(0));
    let etag = |r: picomq_client::Response| r.header("etag").map(str::to_string);
    let untrimmed = etag(c.get("/t/s?offset=-1").await.unwrap());
    let r = trim(&c, "t/s", &off(15)).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(json(&r)["stream"], "t/s");
    assert_eq!(json(&r)["start"], off(15));
    // Trimming below the start changes nothing; the stream keeps taking appends.
    let r = trim(&c, "t/s", &off(3)).await;
    assert_eq!(
        (r.status.as_u16(), json(&r)["start"].clone()),
        (200, off(15).into())
    );
    // Same tail, fewer bytes from -1: a cached copy must not revalidate.
    assert_ne!(etag(c.get("/t/s?offset=-1").await.unwrap()), untrimmed);
    append(&c, "/t/s", "r10;").await;
    check_trimmed(&c).await;

    // Live reads from below the start are refused up front, not started.
    for live in ["long-poll", "sse"] {
        assert_trimmed(&c, "/t/s", &format!("{}&live={live}", off(0)), &off(15)).await;
    }
    // A fork at an offset the source no longer retains would inherit nothing.
    let below = [
        ("content-type", "text/plain"),
        ("stream-forked-from", "/t/s"),
        ("stream-fork-offset", "0000000000000000_0000000000000003"),
    ];
    let r = c.put("/t/late-fork", &below, "").await.unwrap();
    assert_eq!(r.status.as_u16(), 410, "{}", r.text());

    // Crash: the trim is in the WAL and the index.
    server.restart().await;
    check_trimmed(&server.client).await;

    // Lose the metadata database: replaying the WAL trims again.
    server.kill9();
    for f in ["meta.sqlite", "meta.sqlite-wal", "meta.sqlite-shm"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    server.restart().await;
    check_trimmed(&server.client).await;
    let store = server.store_url();
    server.kill9();

    // An empty data directory against the same bucket, every read from the store.
    let fresh = TempDir::new("trim-rebuild");
    let rebuilt = Server::start_process(
        fresh.path(),
        &["--store", &store, "--tail-cache-bytes", "0"],
    )
    .await;
    check_trimmed(&rebuilt.client).await;
}

/// Waits until `name` has not changed for `quiet` and is at least `min`.
async fn settled(c: &Client, name: &str, min: f64, quiet: Duration) {
    let mut last = (f64::NAN, std::time::Instant::now());
    loop {
        let n = metric(c, name).await;
        if n != last.0 {
            last = (n, std::time::Instant::now());
        } else if n >= min && last.1.elapsed() >= quiet {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits for `n` more GC passes (each runs after the one before finished).
async fn gc_passes(c: &Client, n: f64) {
    let target = metric(c, "picomq_gc_passes_total").await + n;
    eventually(Duration::from_secs(20), || {
        let c = c.clone();
        async move { (metric(&c, "picomq_gc_passes_total").await >= target).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_wal_objects_that_held_only_trimmed_records() {
    let dir = TempDir::new("trim-gc");
    let server = Server::start(dir.path(), support::COLLECTING).await;
    let c = server.client.clone();
    assert_eq!(
        c.put("/g/big", TEXT, "").await.unwrap().status.as_u16(),
        201
    );
    assert_eq!(
        c.put("/g/keep", TEXT, "k;").await.unwrap().status.as_u16(),
        201
    );
    let record = "x".repeat(1000);
    for _ in 0..12 {
        append(&c, "/g/big", &record).await;
    }
    // Let GC collect what it can before the trim (create-only objects): what goes
    // after it is the trim's doing.
    settled(
        &c,
        "picomq_checkpoints_total",
        1.0,
        Duration::from_millis(400),
    )
    .await;
    gc_passes(&c, 2.0).await;
    let before = server.count_objects("wal/", ".wal").await;
    let deleted_before = metric(&c, "picomq_gc_objects_deleted_total").await;
    let written_before = metric(&c, "picomq_wal_objects_written_total").await;

    // Trim ten of the twelve records: their ten objects hold nothing else.
    let r = trim(&c, "g/big", &off(10_000)).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    eventually(Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let deleted = metric(&c, "picomq_gc_objects_deleted_total").await - deleted_before;
            (deleted >= 10.0).then_some(())
        }
    })
    .await;
    // Ten objects went from the bucket; the ones written since (the trim's own,
    // and whatever the node logged meanwhile) came and go later, like any object
    // without index rows.
    // (The deletion counter also counts other kinds of objects: the bucket says.)
    let (after, written) = eventually(Duration::from_secs(20), || {
        let (c, server) = (c.clone(), &server);
        async move {
            let after = server.count_objects("wal/", ".wal").await;
            let written = metric(&c, "picomq_wal_objects_written_total").await - written_before;
            (after as f64 + 10.0 <= before as f64 + written).then_some((after, written))
        }
    })
    .await;
    eprintln!("WAL objects: {before} before the trim, {after} after, {written} written since");
    // What is left still reads, from the store (no tail cache).
    assert_eq!(read_all(&c, "/g/big").await, record.repeat(2).as_bytes());
    assert_eq!(read_all(&c, "/g/keep").await, b"k;");
    assert_trimmed(&c, "/g/big", &off(0), &off(10_000)).await;

    // A node with an empty data directory restores the checkpoint: the trimmed
    // objects are gone, yet nothing it needs is missing.
    settled(
        &c,
        "picomq_checkpoints_total",
        1.0,
        Duration::from_millis(400),
    )
    .await;
    let store = server.store_url();
    drop(server);
    let fresh = TempDir::new("trim-gc-rebuild");
    let rebuilt = Server::start(
        fresh.path(),
        &["--store", &store, "--tail-cache-bytes", "0"],
    )
    .await;
    let c = rebuilt.client.clone();
    assert_eq!(read_all(&c, "/g/big").await, record.repeat(2).as_bytes());
    assert_eq!(read_all(&c, "/g/keep").await, b"k;");
    assert_trimmed(&c, "/g/big", &off(0), &off(10_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_retention_trims_old_records_and_the_stream_keeps_taking_appends() {
    let dir = TempDir::new("retention");
    let server = Server::start(
        dir.path(),
        &[
            "--retention-interval",
            "100ms",
            "--checkpoint-interval",
            "100ms",
            "--gc-interval",
            "100ms",
        ],
    )
    .await;
    let c = server.client.clone();
    let with_retention = [("content-type", "text/plain"), ("stream-retention", "1")];
    let r = c.put("/ret/s", &with_retention, "").await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = c.head("/ret/s").await.unwrap();
    assert_eq!(r.header("stream-retention"), Some("1"));
    // The same PUT again is idempotent; another retention conflicts.
    let r = c.put("/ret/s", &with_retention, "").await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let other = [("content-type", "text/plain"), ("stream-retention", "2")];
    let r = c.put("/ret/s", &other, "").await.unwrap();
    assert_eq!(r.status.as_u16(), 409, "{}", r.text());

    // A stream without retention, written alongside, is never trimmed.
    assert_eq!(
        c.put("/ret/forever", TEXT, "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    for i in 0..3 {
        append(&c, "/ret/s", &format!("old{i};")).await;
        append(&c, "/ret/forever", &format!("f{i};")).await;
    }
    let objects_before = server.count_objects("wal/", ".wal").await;
    // Older than a second, indexed: the pass trims all three.
    eventually(Duration::from_secs(20), || {
        let c = c.clone();
        async move { (start_offset(&c, "/ret/s").await == off(15)).then_some(()) }
    })
    .await;
    assert_trimmed(&c, "/ret/s", &off(0), &off(15)).await;
    let r = c.get("/ret/s?offset=-1").await.unwrap();
    assert_eq!((r.status.as_u16(), r.text()), (200, String::new()));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(metric(&c, "picomq_trims_total").await >= 1.0);

    append(&c, "/ret/s", "new;").await;
    assert_eq!(read_all(&c, "/ret/s").await, b"new;");
    assert_eq!(read_all(&c, "/ret/forever").await, b"f0;f1;f2;");
    assert_eq!(start_offset(&c, "/ret/forever").await, off(0));
    let r = c.get("/__picomq/streams?prefix=ret/").await.unwrap();
    let listed = json(&r)["streams"].clone();
    assert_eq!(listed[0]["name"], "ret/forever");
    assert_eq!(listed[0]["retentionSeconds"], Value::Null);
    assert_eq!(listed[1]["startOffset"], off(15));
    assert_eq!(listed[1]["retentionSeconds"], 1);

    // Retention set later through the API, on the stream that had none.
    let r = c
        .post("/__picomq/streams/ret/forever/retention?seconds=1", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(json(&r)["retentionSeconds"], 1);
    eventually(Duration::from_secs(20), || {
        let c = c.clone();
        async move { (start_offset(&c, "/ret/forever").await == off(9)).then_some(()) }
    })
    .await;
    // Objects of both streams' old records now hold nothing retained: GC takes them.
    eventually(Duration::from_secs(20), || {
        let server = &server;
        async move {
            let n = server.count_objects("wal/", ".wal").await;
            (n + 3 <= objects_before).then_some(())
        }
    })
    .await;
    // And cleared again: nothing more is trimmed.
    let r = c
        .post(
            "/__picomq/streams/ret/forever/retention?seconds=none",
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(json(&r)["retentionSeconds"], Value::Null, "{}", r.text());
    let r = c.head("/ret/forever").await.unwrap();
    assert_eq!(r.header("stream-retention"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_trim_and_retention_input_gets_a_json_error() {
    let dir = TempDir::new("trim-bad");
    let server = Server::start(dir.path(), &[]).await;
    let c = server.client.clone();
    for bad in ["abc", "0", "-1", "1.5", "01", "99999999999", ""] {
        let h = [("content-type", "text/plain"), ("stream-retention", bad)];
        let r = c.put("/bad/ret", &h, "").await.unwrap();
        assert_eq!(
            r.status.as_u16(),
            400,
            "Stream-Retention {bad:?}: {}",
            r.text()
        );
        assert_eq!(json(&r)["error"]["code"], "bad_request");
    }
    assert_eq!(c.head("/bad/ret").await.unwrap().status.as_u16(), 404);

    assert_eq!(
        c.put("/bad/s", TEXT, "abcdef")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    let cases = [
        ("/__picomq/streams/bad/s/trim?before=12", 400),
        ("/__picomq/streams/bad/s/trim?before=-1", 400),
        ("/__picomq/streams/bad/s/trim", 400),
        (
            "/__picomq/streams/bad/s/trim?before=0000000000000001_0000000000000000",
            400,
        ),
        (
            "/__picomq/streams/bad/s/trim?offset=0000000000000000_0000000000000001",
            400,
        ),
        // Beyond the tail (6 bytes).
        (
            "/__picomq/streams/bad/s/trim?before=0000000000000000_0000000000000007",
            400,
        ),
        (
            "/__picomq/streams/bad/missing/trim?before=0000000000000000_0000000000000001",
            404,
        ),
        ("/__picomq/streams/bad/s/retention?seconds=0", 400),
        ("/__picomq/streams/bad/s/retention?seconds=soon", 400),
        ("/__picomq/streams/bad/s/retention", 400),
        ("/__picomq/streams/bad/missing/retention?seconds=5", 404),
        (
            "/__picomq/streams/bad/s/shrink?before=0000000000000000_0000000000000001",
            404,
        ),
        (
            "/__picomq/streams/bad/../trim?before=0000000000000000_0000000000000001",
            400,
        ),
    ];
    for (path, status) in cases {
        let r = c.post(path, &[], "").await.unwrap();
        assert_eq!(r.status.as_u16(), status, "{path}: {}", r.text());
        assert!(
            json(&r)["error"]["message"].is_string(),
            "{path}: {}",
            r.text()
        );
    }
    // Nothing was trimmed by all that; trimming at the tail empties the stream.
    assert_eq!(read_all(&c, "/bad/s").await, b"abcdef");
    let r = trim(&c, "bad/s", &off(6)).await;
    assert_eq!(
        (r.status.as_u16(), json(&r)["start"].clone()),
        (200, off(6).into())
    );
    assert_eq!(read_all(&c, "/bad/s").await, b"");
    // On a JSON stream the start must be a message boundary.
    let json_type = [("content-type", "application/json")];
    let r = c.put("/bad/j", &json_type, r#"["a","bb"]"#).await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    for inside in [1, 4, 6] {
        let r = trim(&c, "bad/j", &off(inside)).await;
        assert_eq!(r.status.as_u16(), 400, "at {inside}: {}", r.text());
    }
    let r = trim(&c, "bad/j", &off(3)).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let r = c.get("/bad/j?offset=-1").await.unwrap();
    assert_eq!(r.text(), r#"["bb"]"#);
    // A deleted stream is not found.
    assert_eq!(c.delete("/bad/s").await.unwrap().status.as_u16(), 204);
    assert_eq!(trim(&c, "bad/s", &off(6)).await.status.as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_needs_the_delete_scope_on_the_stream() {
    let dir = TempDir::new("trim-auth");
    let server = support::start_with_auth(dir.path(), &[]).await;
    let c = server.client.clone();
    let (_, writer) = support::issue_token(
        &c,
        support::ADMIN_SECRET,
        serde_json::json!({ "scopes": ["create,append,read:a/**"] }),
    )
    .await;
    let (_, owner) = support::issue_token(
        &c,
        support::ADMIN_SECRET,
        serde_json::json!({ "scopes": ["create,append,read,delete:a/**"] }),
    )
    .await;
    let as_ = |secret: &str| support::bearer(secret);
    let w = as_(&writer);
    let h = [
        ("content-type", "text/plain"),
        ("authorization", w.as_str()),
    ];
    assert_eq!(c.put("/a/s", &h, "abc").await.unwrap().status.as_u16(), 201);
    let path = format!("/__picomq/streams/a/s/trim?before={}", off(1));
    let r = c.post(&path, &[], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
    let r = c
        .post(&path, &[("authorization", w.as_str())], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    let o = as_(&owner);
    let r = c
        .post(&path, &[("authorization", o.as_str())], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // Outside the token's names: refused before any lookup.
    let other = format!("/__picomq/streams/b/s/trim?before={}", off(1));
    let r = c
        .post(&other, &[("authorization", o.as_str())], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_trims_and_reports_the_start() {
    use support::cli::Cli;
    let dir = TempDir::new("trim-cli");
    let server = Server::start(dir.path(), &[]).await;
    let cli = Cli::new(&server.url);
    let r = cli
        .run(&["create", "cli/s", "--retention", "1h", "--output", "json"])
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    append(&server.client, "/cli/s", "abc").await;
    append(&server.client, "/cli/s", "def").await;

    let r = cli
        .run(&["trim", "cli/s", "--before", &off(3), "--output", "json"])
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["startOffset"], off(3));
    let r = cli.run(&["head", "cli/s", "--output", "json"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["startOffset"], off(3));
    assert_eq!(r.json()["retentionSeconds"], 3600);
    let r = cli.run(&["read", "cli/s"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, "def"), "{r:?}");
    // Text output names the new start.
    let r = cli.run(&["trim", "cli/s", "--before", &off(4)]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains(&off(4)), "{r:?}");

    // Exit codes: 2 for a bad offset or one beyond the tail, 3 for no such stream.
    let r = cli.run(&["trim", "cli/s", "--before", "12"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    let r = cli.run(&["trim", "cli/s", "--before", &off(99)]).await;
    assert_eq!(r.code, 2, "{r:?}");
    let r = cli
        .run(&[
            "trim",
            "cli/missing",
            "--before",
            &off(1),
            "--output",
            "json",
        ])
        .await;
    assert_eq!(r.code, 3, "{r:?}");
    let err: Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(err["error"]["status"], 404);
}
