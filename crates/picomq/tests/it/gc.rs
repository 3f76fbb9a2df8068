//! Garbage collection of WAL objects: a deleted stream's objects are removed from the
//! store once a checkpoint covers them, even when the node crashed between the delete
//! and the collection; live data, seals and the rebuild from the bucket are untouched.

use picomq_testkit as support;

use std::time::Duration;

use futures::TryStreamExt;
use picomq_engine::store::{ObjectPath, ObjectStore, ObjectStoreError, ObjectStoreExt};
use support::{eventually, metric, read_all, Client, Server, TempDir};

const TEXT: &[(&str, &str)] = &[("content-type", "text/plain")];

/// WAL objects in `store_url`: (data objects, seals).
async fn wal_objects(store_url: &str) -> (usize, usize) {
    let store = picomq_engine::store::open(store_url).unwrap();
    let keys: Vec<ObjectPath> = store
        .list(Some(&ObjectPath::from("wal")))
        .map_ok(|o| o.location)
        .try_collect()
        .await
        .unwrap();
    let (mut data, mut seals) = (0, 0);
    for key in keys {
        // GC keeps running: an object listed a moment ago may be gone now.
        let bytes = match store.get(&key).await {
            Ok(got) => got.bytes().await.unwrap(),
            Err(ObjectStoreError::NotFound { .. }) => continue,
            Err(e) => panic!("reading {key}: {e}"),
        };
        if bytes.starts_with(b"PMQS") {
            seals += 1;
        } else {
            data += 1;
        }
    }
    (data, seals)
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

async fn append(c: &Client, path: &str, body: &str) {
    let r = c.post(path, TEXT, body.to_string()).await.unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_streams_objects_are_collected_after_a_crash_live_data_and_seals_stay() {
    let dir = TempDir::new("gc");
    // First node: checkpoints, but no collection.
    let mut first = Server::start_process(
        dir.path(),
        &["--checkpoint-interval", "100ms", "--gc-interval", "0"],
    )
    .await;
    let store = first.store_url();
    let c = first.client.clone();
    // One append at a time: on an idle WAL each is its own object.
    assert_eq!(
        c.put("/doomed", TEXT, "").await.unwrap().status.as_u16(),
        201
    );
    for i in 0..3 {
        append(&c, "/doomed", &format!("d{i}")).await;
    }
    assert_eq!(c.put("/keep", TEXT, "").await.unwrap().status.as_u16(), 201);
    for i in 0..3 {
        append(&c, "/keep", &format!("k{i}")).await;
    }
    assert_eq!(c.delete("/doomed").await.unwrap().status.as_u16(), 204);
    // A checkpoint past the delete, then a crash before any collection.
    settled(
        &c,
        "picomq_checkpoints_total",
        1.0,
        Duration::from_millis(500),
    )
    .await;
    first.kill9();
    let (data_before, _) = wal_objects(&store).await;
    assert!(data_before >= 8, "{data_before} WAL objects");

    // Second node on the same data: collects what the first left behind.
    let mut second = Server::start_process(dir.path(), support::COLLECTING).await;
    let c = second.client.clone();
    // Two more writes, two more checkpoints: the oldest kept checkpoint (the floor)
    // moves past the first node's seal, which must survive collection anyway.
    for i in 3..5 {
        append(&c, "/keep", &format!("k{i}")).await;
        settled(
            &c,
            "picomq_checkpoints_total",
            1.0,
            Duration::from_millis(300),
        )
        .await;
    }
    eventually(Duration::from_secs(20), || {
        let c = c.clone();
        async move { (metric(&c, "picomq_gc_objects_deleted_total").await >= 3.0).then_some(()) }
    })
    .await;
    settled(&c, "picomq_gc_passes_total", 2.0, Duration::from_millis(0)).await;
    let deleted = metric(&c, "picomq_gc_objects_deleted_total").await;
    let (data_after, seals) = wal_objects(&store).await;
    eprintln!("WAL objects: {data_before} before, {data_after} after collection ({deleted} deleted), {seals} seals");
    assert!(seals >= 1, "the first node's seal was collected");
    assert!(data_after + 3 <= data_before + 2, "no object was collected");
    // Live data is read back from the store (no tail cache), the deleted stream is gone.
    assert_eq!(read_all(&c, "/keep").await, b"k0k1k2k3k4");
    assert_eq!(c.head("/doomed").await.unwrap().status.as_u16(), 404);
    second.terminate(Duration::from_secs(20));

    // A node with an empty data directory rebuilds from the checkpoint and the WAL
    // that is left.
    let fresh = TempDir::new("gc-rebuild");
    let third = Server::start_process(
        fresh.path(),
        &["--store", &store, "--tail-cache-bytes", "0"],
    )
    .await;
    let c = third.client.clone();
    assert_eq!(metric(&c, "picomq_recovery_checkpoint_restored").await, 1.0);
    assert_eq!(read_all(&c, "/keep").await, b"k0k1k2k3k4");
    assert_eq!(c.head("/doomed").await.unwrap().status.as_u16(), 404);
}

/// A node that goes quiet right after a delete still collects the deleted stream's
/// objects. GC's floor is the older of the two kept checkpoints; the checkpoint after
/// the delete is the newer one, so without one more checkpoint of the unchanged state
/// the floor would stay below the stream's objects until the node wrote again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gone_quiet_collects_what_its_last_writes_freed() {
    let dir = TempDir::new("gc-quiet");
    let server = Server::start(
        dir.path(),
        &[
            "--checkpoint-interval",
            "300ms",
            "--gc-interval",
            "100ms",
            "--compaction-interval",
            "0",
        ],
    )
    .await;
    let c = server.client.clone();
    // Two checkpoints of earlier writes, so the floor is below what follows.
    assert_eq!(c.put("/keep", TEXT, "").await.unwrap().status.as_u16(), 201);
    for i in 0..2 {
        append(&c, "/keep", &format!("k{i}")).await;
        let before = metric(&c, "picomq_checkpoints_total").await;
        let next = settled(&c, "picomq_checkpoints_total", before + 1.0, Duration::ZERO);
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("a checkpoint within 10 s");
    }
    // A stream written and deleted within one checkpoint interval, then nothing.
    let deleted_before = metric(&c, "picomq_gc_objects_deleted_total").await;
    assert_eq!(c.put("/gone", TEXT, "").await.unwrap().status.as_u16(), 201);
    for i in 0..5 {
        append(&c, "/gone", &format!("g{i}")).await;
    }
    assert_eq!(c.delete("/gone").await.unwrap().status.as_u16(), 204);
    // Its create, five appends and delete are one WAL object each.
    eventually(Duration::from_secs(15), || {
        let c = c.clone();
        async move {
            let deleted = metric(&c, "picomq_gc_objects_deleted_total").await;
            (deleted >= deleted_before + 6.0).then_some(())
        }
    })
    .await;
    assert_eq!(read_all(&c, "/keep").await, b"k0k1");
    assert_eq!(c.head("/gone").await.unwrap().status.as_u16(), 404);
}
