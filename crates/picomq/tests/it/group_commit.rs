//! Group commit: appends to many streams arriving together share object-store writes.

use picomq_testkit as support;

use std::time::Duration;

use support::{metric, Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_across_streams_share_writes() {
    let dir = TempDir::new("group-commit");
    // A store slower than the append rate, as S3 is: 20 ms per PUT.
    let server = Server::start(dir.path(), &["--store-latency", "20ms"]).await;
    const CLIENTS: usize = 50;
    const PER_CLIENT: usize = 20;
    for c in 0..CLIENTS {
        let r = server
            .client
            .put(&format!("/gc/{c}"), &[("content-type", "text/plain")], "")
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201);
    }
    let puts_before = metric(&server.client, "picomq_wal_objects_written_total").await;
    let files_before = server.count_objects("wal", ".wal").await;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = server.client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..PER_CLIENT {
                let r = client
                    .post(
                        &format!("/gc/{c}"),
                        &[("content-type", "text/plain")],
                        format!("{c}-{i}\n"),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.status.as_u16(), 204, "{}", r.text());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let appends = (CLIENTS * PER_CLIENT) as f64;
    let puts = metric(&server.client, "picomq_wal_objects_written_total").await - puts_before;
    let files = server.count_objects("wal", ".wal").await - files_before;
    eprintln!("{appends} appends from {CLIENTS} clients on {CLIENTS} streams -> {puts} WAL objects ({files} files)");
    assert_eq!(puts as usize, files, "metric and the bucket disagree");
    assert!(puts > 0.0);
    assert!(
        puts * 5.0 <= appends,
        "{puts} PUTs for {appends} appends: writes are not being shared"
    );
    // And every append is there.
    for c in 0..CLIENTS {
        let data = support::read_all(&server.client, &format!("/gc/{c}")).await;
        assert_eq!(String::from_utf8(data).unwrap().lines().count(), PER_CLIENT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_budget_caps_puts_while_appends_keep_flowing() {
    let dir = TempDir::new("write-budget");
    let server = Server::start(dir.path(), &["--max-writes-per-sec", "10"]).await;
    let c = server.client.clone();
    assert_eq!(
        c.put("/budget", &[("content-type", "text/plain")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    let puts_before = metric(&c, "picomq_wal_objects_written_total").await;
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < Duration::from_millis(2000) {
                let r = c
                    .post(
                        "/budget",
                        &[("content-type", "text/plain")],
                        format!("{w}-{n}\n"),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.status.as_u16(), 204, "{}", r.text());
                n += 1;
            }
            n
        }));
    }
    let mut appends = 0;
    for t in tasks {
        appends += t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let puts = metric(&c, "picomq_wal_objects_written_total").await - puts_before;
    eprintln!("{appends} appends in {secs:.2}s with a budget of 10 PUT/s -> {puts} PUTs");
    // Spacing is 100 ms: at most one PUT per 100 ms of the run, plus the first.
    assert!(
        puts <= (secs * 10.0).ceil() + 1.0,
        "{puts} PUTs in {secs:.2}s exceeds the budget"
    );
    assert!(
        appends as f64 >= puts * 10.0,
        "batches did not grow under the budget"
    );
}
