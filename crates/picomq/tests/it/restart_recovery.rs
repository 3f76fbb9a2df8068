//! A restart (graceful or SIGKILL) recovers streams, offsets, producer state, closed
//! state, Stream-Seq, forks and deletes from the object store.

use picomq_testkit as support;

use support::{read_all, Server, TempDir};

async fn write_history(c: &support::Client) {
    let text = [("content-type", "text/plain")];
    assert_eq!(
        c.put("/r/a", &text, "a0;").await.unwrap().status.as_u16(),
        201
    );
    let p = |seq: &'static str| {
        [
            ("content-type", "text/plain"),
            ("producer-id", "w"),
            ("producer-epoch", "1"),
            ("producer-seq", seq),
        ]
    };
    assert_eq!(
        c.post("/r/a", &p("0"), "a1;")
            .await
            .unwrap()
            .status
            .as_u16(),
        200
    );
    assert_eq!(
        c.post("/r/a", &p("1"), "a2;")
            .await
            .unwrap()
            .status
            .as_u16(),
        200
    );
    assert_eq!(
        c.post(
            "/r/a",
            &[("content-type", "text/plain"), ("stream-seq", "0005")],
            "a3;"
        )
        .await
        .unwrap()
        .status
        .as_u16(),
        204
    );
    assert_eq!(
        c.put(
            "/r/closed",
            &[("content-type", "text/plain"), ("stream-closed", "true")],
            "done"
        )
        .await
        .unwrap()
        .status
        .as_u16(),
        201
    );
    let head = c.head("/r/a").await.unwrap();
    let fork_at = head.header("stream-next-offset").unwrap().to_string();
    assert_eq!(
        c.put(
            "/r/fork",
            &[
                ("stream-forked-from", "/r/a"),
                ("stream-fork-offset", fork_at.as_str())
            ],
            ""
        )
        .await
        .unwrap()
        .status
        .as_u16(),
        201
    );
    assert_eq!(
        c.post("/r/fork", &text, "f1;")
            .await
            .unwrap()
            .status
            .as_u16(),
        204
    );
    assert_eq!(
        c.put("/r/gone", &text, "x").await.unwrap().status.as_u16(),
        201
    );
    assert_eq!(c.delete("/r/gone").await.unwrap().status.as_u16(), 204);
    assert_eq!(
        c.put("/r/src", &text, "s").await.unwrap().status.as_u16(),
        201
    );
    assert_eq!(
        c.put("/r/src-fork", &[("stream-forked-from", "/r/src")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    assert_eq!(c.delete("/r/src").await.unwrap().status.as_u16(), 204);
}

async fn check_history(c: &support::Client) {
    let text = [("content-type", "text/plain")];
    assert_eq!(read_all(c, "/r/a").await, b"a0;a1;a2;a3;");
    // Producer state: a retry of seq 1 is a duplicate, seq 2 is next.
    let p = |seq: &'static str| {
        [
            ("content-type", "text/plain"),
            ("producer-id", "w"),
            ("producer-epoch", "1"),
            ("producer-seq", seq),
        ]
    };
    assert_eq!(
        c.post("/r/a", &p("1"), "a2;")
            .await
            .unwrap()
            .status
            .as_u16(),
        204
    );
    let stale = c
        .post(
            "/r/a",
            &[
                ("content-type", "text/plain"),
                ("producer-id", "w"),
                ("producer-epoch", "0"),
                ("producer-seq", "0"),
            ],
            "z",
        )
        .await
        .unwrap();
    assert_eq!(stale.status.as_u16(), 403);
    // Stream-Seq regression still rejected.
    assert_eq!(
        c.post(
            "/r/a",
            &[("content-type", "text/plain"), ("stream-seq", "0004")],
            "z"
        )
        .await
        .unwrap()
        .status
        .as_u16(),
        409
    );
    // Closed stays closed.
    let closed = c.post("/r/closed", &text, "more").await.unwrap();
    assert_eq!(closed.status.as_u16(), 409);
    assert_eq!(read_all(c, "/r/closed").await, b"done");
    // Forks read through their source.
    assert_eq!(read_all(c, "/r/fork").await, b"a0;a1;a2;a3;f1;");
    // Deleted stays deleted; soft-deleted stays gone but its fork still reads it.
    assert_eq!(c.get("/r/gone").await.unwrap().status.as_u16(), 404);
    assert_eq!(c.get("/r/src").await.unwrap().status.as_u16(), 410);
    assert_eq!(read_all(c, "/r/src-fork").await, b"s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_sigkill() {
    let dir = TempDir::new("recovery-kill");
    let mut server = Server::start_process(dir.path(), &[]).await;
    write_history(&server.client).await;
    server.restart().await; // SIGKILL, then start on the same data directory
    check_history(&server.client).await;
    // And the appends made by check_history survive another crash.
    server.restart().await;
    assert_eq!(read_all(&server.client, "/r/a").await, b"a0;a1;a2;a3;");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_database_is_rebuilt_from_the_bucket() {
    let dir = TempDir::new("recovery-rebuild");
    let mut server = Server::start_process(dir.path(), &[]).await;
    write_history(&server.client).await;
    server.kill9();
    for f in ["meta.sqlite", "meta.sqlite-wal", "meta.sqlite-shm"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    server.restart().await;
    check_history(&server.client).await;
}

/// With Postgres metadata (the metadata of record) the data directory holds no
/// database and no checkpoint is written: a SIGKILL recovers everything by
/// replaying the WAL from the watermark stored in Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_sigkill_on_postgres_metadata() {
    support::postgres::with_database("recovery", |url| async move {
        let dir = TempDir::new("recovery-pg");
        let flags = ["--meta", url.as_str(), "--checkpoint-interval", "100ms"];
        let mut server = Server::start_process(dir.path(), &flags).await;
        write_history(&server.client).await;
        server.restart().await;
        check_history(&server.client).await;
        server.restart().await;
        assert_eq!(read_all(&server.client, "/r/a").await, b"a0;a1;a2;a3;");
        assert!(!dir.path().join("meta.sqlite").exists());
        let log = server.log_text();
        assert!(log.contains("metadata checkpoints off"), "{log}");
        if let Some(password) = support::postgres::password_of(&url) {
            assert!(!log.contains(&password), "the log shows no password");
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(server.count_objects("checkpoints", "").await, 0);
        drop(server);
    })
    .await;
}
