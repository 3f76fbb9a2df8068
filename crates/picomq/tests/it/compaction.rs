//! Compaction: many streams written through many small WAL objects are rewritten into
//! a few packed objects while appends and a live reader go on; every record reads
//! back identically, the store holds far fewer objects once GC has run, replaying a
//! stream costs a GET instead of one per WAL object, and a node rebuilt from the
//! bucket alone (checkpoint + WAL with the relocations) reads the same bytes.
//! Crash points between compaction's and GC's steps lose nothing and leak nothing:
//! the orphan of a crash before the commit and every replaced WAL object go.

use picomq_testkit as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use support::{eventually, metric, metric_where, read_all, Client, Server, TempDir};

const TEXT: &[(&str, &str)] = &[("content-type", "text/plain")];
const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
const STREAMS: usize = 12;
const APPENDS: usize = 25;

/// Flags of a node that compacts only when asked, at once, and checkpoints and
/// collects garbage often; no tail cache, so every read goes to the store.
/// Compaction of WAL data: the packer is off, so data stays in WAL objects until a
/// compaction pass takes it (as when the packer is behind or disabled).
const FLAGS: &[&str] = &[
    "--pack-delay",
    "0",
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
];

fn path(i: usize) -> String {
    format!("/many/s{i}")
}

/// `STREAMS` streams (the last one JSON), `APPENDS` appends each, written by four
/// concurrent writers one append at a time: hundreds of small WAL objects, most
/// holding a few streams.
async fn write_history(c: &Client) {
    for i in 0..STREAMS {
        let headers = if i == STREAMS - 1 { JSON } else { TEXT };
        let r = c.put(&path(i), headers, "").await.unwrap();
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    }
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let c = c.clone();
            tokio::spawn(async move {
                for n in 0..APPENDS {
                    for i in (w..STREAMS).step_by(4) {
                        let (headers, body) = if i == STREAMS - 1 {
                            (JSON, format!("[{{\"n\":{n}}},{{\"m\":\"{n}\"}}]"))
                        } else {
                            (TEXT, format!("s{i}-r{n};"))
                        };
                        let r = c.post(&path(i), headers, body).await.unwrap();
                        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
}

async fn read_everything(c: &Client) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for i in 0..STREAMS {
        out.insert(path(i), read_all(c, &path(i)).await);
    }
    out
}

async fn gets(c: &Client) -> f64 {
    metric_where(c, "picomq_object_store_requests_total", "op=\"get\"").await
}

/// Store GETs a full replay of `stream` costs.
async fn replay_gets(c: &Client, stream: &str) -> (Vec<u8>, f64) {
    let before = gets(c).await;
    let bytes = read_all(c, stream).await;
    (bytes, gets(c).await - before)
}

/// Returns once everything acknowledged is indexed, so tail caches no longer hold what
/// the index has: the compaction endpoint indexes first, and with a day's delay it
/// compacts nothing.
async fn indexed(c: &Client) {
    let r = c
        .post("/__picomq/compact?delay=24h", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

async fn compact(c: &Client) -> serde_json::Value {
    let r = c.post("/__picomq/compact?delay=0s", &[], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// A node on `dir` that aborts when it reaches crash point `point`.
async fn crashing_at(dir: &std::path::Path, point: &str) -> Server {
    Server::start_process_env(dir, FLAGS, &[("PICOMQ_FAILPOINTS", point)]).await
}

/// Keys of the objects under `prefix` in `server`'s store.
async fn keys(server: &Server, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    use picomq_engine::store::{ObjectPath, ObjectStore};
    let store = picomq_engine::store::open(&server.store_url()).unwrap();
    store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|o| o.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

async fn data_objects(server: &Server) -> usize {
    server.count_objects("wal", ".wal").await + server.count_objects("seg", ".seg").await
}

/// Appends `n` records to `/live` one by one while a long-poll reader follows it;
/// returns what the reader received.
async fn live_traffic(c: Client, n: usize) -> (Vec<u8>, Vec<u8>) {
    let expected: Vec<u8> = (0..n)
        .flat_map(|i| format!("live{i};").into_bytes())
        .collect();
    let reader = {
        let c = c.clone();
        let len = expected.len();
        tokio::spawn(async move {
            let mut got = Vec::new();
            let mut offset = "-1".to_string();
            while got.len() < len {
                let r = c
                    .get(&format!("/live?offset={offset}&live=long-poll"))
                    .await
                    .unwrap();
                assert!(matches!(r.status.as_u16(), 200 | 204), "{}", r.text());
                got.extend_from_slice(&r.body);
                offset = r.header("stream-next-offset").unwrap().to_string();
            }
            got
        })
    };
    for i in 0..n {
        let r = c.post("/live", TEXT, format!("live{i};")).await.unwrap();
        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (expected, reader.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_keeps_every_record_and_cuts_objects_and_gets() {
    let dir = TempDir::new("compaction");
    let server = Server::start(dir.path(), FLAGS).await;
    let c = server.client.clone();
    write_history(&c).await;
    assert_eq!(c.put("/live", TEXT, "").await.unwrap().status.as_u16(), 201);
    // The first read of a stream is cold (the block cache starts empty, and with
    // --tail-cache-bytes 0 a stream keeps only records not yet indexed).
    indexed(&c).await;
    let (first, gets_before) = replay_gets(&c, &path(0)).await;
    let before = read_everything(&c).await;
    assert_eq!(first, before[&path(0)]);
    let objects_before = data_objects(&server).await;
    eprintln!(
        "before: {objects_before} data objects; replaying one stream took {gets_before} GETs"
    );
    assert!(objects_before >= 40, "{objects_before} WAL objects");
    assert!(gets_before >= APPENDS as f64 / 2.0, "{gets_before} GETs");

    // Compaction while a writer appends and a live reader follows.
    let live = tokio::spawn(live_traffic(c.clone(), 100));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = compact(&c).await;
    eprintln!("compaction: {report}");
    let (expected, received) = live.await.unwrap();
    assert_eq!(
        received, expected,
        "the live reader lost or reordered records"
    );
    assert!(report["rows_replaced"].as_u64().unwrap() >= (STREAMS * APPENDS) as u64);
    assert!(report["objects_written"].as_u64().unwrap() >= 1);

    // (a) every record reads back identically.
    let after = read_everything(&c).await;
    assert_eq!(after, before, "compaction changed what the streams hold");
    assert_eq!(read_all(&c, "/live").await, expected);
    let json = String::from_utf8(after[&path(STREAMS - 1)].clone()).unwrap();
    let messages: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(messages.len(), 2 * APPENDS, "JSON message boundaries");

    // A second pass takes what was appended during the first.
    compact(&c).await;

    // (b) once checkpoints pass the moves, GC deletes the replaced WAL objects, with
    // nothing written meanwhile: GC's floor is the older of the two newest
    // checkpoints, and a node gone quiet takes one more to bring it up.
    let objects_after = eventually(Duration::from_secs(30), || {
        let server = &server;
        async move {
            let n = data_objects(server).await;
            (n <= 10).then_some(n)
        }
    })
    .await;
    eprintln!("data objects: {objects_before} before, {objects_after} after compaction and GC");
    assert_eq!(read_everything(&c).await, before);
    assert!(metric(&c, "picomq_gc_objects_deleted_total").await >= (objects_before / 2) as f64);

    // A node with an empty data directory rebuilds from the bucket alone and
    // reads the same bytes from the compacted objects.
    let store = server.store_url();
    eprintln!("store: {store}");
    drop(server);
    let fresh = TempDir::new("compaction-rebuild");
    let rebuilt = Server::start(
        fresh.path(),
        &[
            "--store",
            &store,
            "--tail-cache-bytes",
            "0",
            "--pack-delay",
            "0",
        ],
    )
    .await;
    let c = rebuilt.client.clone();
    // (c) replaying one stream's history (cold: a new node) now costs a GET or
    // two, not one per WAL object it was written through.
    let (again, gets_after) = replay_gets(&c, &path(0)).await;
    assert_eq!(again, before[&path(0)]);
    let (live_again, live_gets) = replay_gets(&c, "/live").await;
    assert_eq!(live_again, expected);
    eprintln!(
        "replaying one stream: {gets_before} GETs before compaction, {gets_after} after; /live: {live_gets}"
    );
    assert!(gets_after <= 2.0, "{gets_after} GETs after compaction");
    assert!(
        live_gets <= 3.0,
        "{live_gets} GETs for /live after compaction"
    );
    assert_eq!(read_everything(&c).await, before);
}

/// `kill -9` in the middle of a compaction pass, then crashes (abort at a crash
/// point) between compaction's write and its commit, after its commit, and in the
/// middle of a GC pass; each time the next node reads every record back, and the
/// orphaned object of the crash before the commit is collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_during_compaction_and_gc_lose_nothing_and_leak_nothing() {
    let dir = TempDir::new("compaction-crash");
    let server = Server::start_process(dir.path(), FLAGS).await;
    let c = server.client.clone();
    write_history(&c).await;
    let before = read_everything(&c).await;
    // The first node's WAL objects (no seal among them yet): all of them must go.
    let history = keys(&server, "wal").await;
    drop(server);

    // 0. kill -9 in the middle of a pass slowed down by its request budget (about
    // 150 WAL objects at 40 GETs per second: several seconds).
    let mut paced = FLAGS.to_vec();
    paced.extend(["--compaction-requests-per-sec", "40"]);
    let mut killed = Server::start_process(dir.path(), &paced).await;
    let c = killed.client.clone();
    let pass = tokio::spawn(async move { c.post("/__picomq/compact?delay=0s", &[], "").await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    killed.kill9();
    assert!(
        pass.await.unwrap().is_err(),
        "the pass finished before the kill"
    );
    let server = Server::start_process(dir.path(), FLAGS).await;
    assert_eq!(
        read_everything(&server.client).await,
        before,
        "after kill -9"
    );
    drop(server);

    // 1. Object written, relocations never logged: the object is an orphan.
    let mut crashing = crashing_at(dir.path(), "compaction-after-write").await;
    let c = crashing.client.clone();
    assert!(c.post("/__picomq/compact?delay=0s", &[], "").await.is_err());
    crashing.wait_exit(Duration::from_secs(20));
    let orphans = keys(&crashing, "seg").await;
    assert!(
        !orphans.is_empty(),
        "the crash came before the object was written"
    );

    // 2. Relocations committed, nothing collected yet.
    let mut crashing = crashing_at(dir.path(), "compaction-after-commit").await;
    let c = crashing.client.clone();
    assert_eq!(read_everything(&c).await, before, "after crash 1");
    assert!(c.post("/__picomq/compact?delay=0s", &[], "").await.is_err());
    crashing.wait_exit(Duration::from_secs(20));

    // 3. GC dies after its first delete.
    let mut crashing = crashing_at(dir.path(), "gc-after-delete").await;
    let c = crashing.client.clone();
    assert_eq!(read_everything(&c).await, before, "after crash 2");
    // Checkpoints advance with writes; GC then deletes its first object and dies.
    let writer = Arc::new(c.clone());
    eventually(Duration::from_secs(30), || {
        let c = writer.clone();
        async move {
            match c.post(&path(0), TEXT, "x").await {
                Ok(r) if r.status.as_u16() == 204 => None,
                _ => Some(()),
            }
        }
    })
    .await;
    crashing.wait_exit(Duration::from_secs(20));

    // 4. A healthy node: nothing readable is lost, compaction finishes, and GC
    // removes the orphan of crash 1 and every replaced WAL object.
    let server = Server::start_process(dir.path(), FLAGS).await;
    let c = server.client.clone();
    let mut now = read_everything(&c).await;
    let extra = now.get(&path(0)).unwrap().len() - before[&path(0)].len();
    assert!(now[&path(0)].ends_with(&vec![b'x'; extra]));
    now.get_mut(&path(0))
        .unwrap()
        .truncate(before[&path(0)].len());
    assert_eq!(now, before, "after crash 3");
    compact(&c).await;
    eventually(Duration::from_secs(30), || {
        let c = c.clone();
        let (server, orphans, history) = (&server, &orphans, &history);
        async move {
            // Writes move the checkpoints (and so the GC floor) along.
            let _ = c.post(&path(1), TEXT, "y").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let seg = keys(server, "seg").await;
            let wal = keys(server, "wal").await;
            let left = history.iter().filter(|k| wal.contains(*k)).count();
            (orphans.iter().all(|k| !seg.contains(k)) && left == 0).then_some(())
        }
    })
    .await;
    let now = read_everything(&c).await;
    assert!(now[&path(0)].starts_with(&before[&path(0)]));
    assert!(now[&path(1)].starts_with(&before[&path(1)]));
    for i in 2..STREAMS {
        assert_eq!(now[&path(i)], before[&path(i)]);
    }
}

/// Total bytes of the objects under `prefix` in `server`'s store, and their count.
async fn stored(server: &Server, prefix: &str) -> (u64, usize) {
    use futures::TryStreamExt;
    use picomq_engine::store::{ObjectPath, ObjectStore};
    let store = picomq_engine::store::open(&server.store_url()).unwrap();
    let sizes: Vec<u64> = store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|o| o.size)
        .try_collect()
        .await
        .unwrap();
    (sizes.iter().sum(), sizes.len())
}

/// A deleted stream, an expired one and a trimmed one share a pack with a live one:
/// once most of the pack is dead, compaction rewrites the live part and GC deletes
/// the old pack, so their bytes leave the store; what is left reads back unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_expired_and_trimmed_bytes_leave_shared_packs() {
    let dir = TempDir::new("compaction-reclaim");
    let mut flags = FLAGS.to_vec();
    flags.extend(["--dormancy", "1s"]);
    let server = Server::start(dir.path(), &flags).await;
    let c = server.client.clone();
    let ttl: &[(&str, &str)] = &[("content-type", "text/plain"), ("stream-ttl", "2")];
    for (name, headers) in [
        ("/keep", TEXT),
        ("/gone", TEXT),
        ("/ttl", ttl),
        ("/cut", TEXT),
    ] {
        assert_eq!(c.put(name, headers, "").await.unwrap().status.as_u16(), 201);
    }
    let record = "r".repeat(1000);
    for _ in 0..20 {
        for name in ["/keep", "/gone", "/ttl", "/cut"] {
            let r = c.post(name, TEXT, record.clone()).await.unwrap();
            assert_eq!(r.status.as_u16(), 204, "{}", r.text());
        }
    }
    let keep = read_all(&c, "/keep").await;
    compact(&c).await;
    let (packed, packs) = stored(&server, "seg").await;
    assert_eq!(packs, 1, "three small streams share one pack");
    assert!(packed >= 60_000, "{packed} bytes packed");

    assert_eq!(c.delete("/gone").await.unwrap().status.as_u16(), 204);
    // /cut is trimmed to its tail (a compacted chunk straddling the new start would
    // stay whole: trimming reclaims whole index rows).
    let tail = c.head("/cut").await.unwrap();
    let tail = tail.header("stream-next-offset").unwrap().to_string();
    let r = c
        .post(
            &format!("/__picomq/streams/cut/trim?before={tail}"),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // /ttl is not touched again: it expires and the background scan deletes it.
    let (left, objects) = eventually(Duration::from_secs(30), || {
        let (c, server) = (c.clone(), &server);
        async move {
            let report = compact(&c).await;
            let _ = c.post("/keep", TEXT, "k").await; // moves the GC floor along
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (bytes, n) = stored(server, "seg").await;
            eprintln!("pass: {report}; seg/ now {bytes} bytes in {n} objects");
            (bytes * 3 < packed).then_some((bytes, n))
        }
    })
    .await;
    eprintln!("packed bytes: {packed} in {packs} object before, {left} in {objects} after");
    assert_eq!(c.head("/gone").await.unwrap().status.as_u16(), 404);
    assert_eq!(c.head("/ttl").await.unwrap().status.as_u16(), 404);
    assert!(read_all(&c, "/keep").await.starts_with(&keep));
    assert!(read_all(&c, "/cut").await.is_empty());
    let below = c
        .get("/cut?offset=0000000000000000_0000000000000000")
        .await
        .unwrap();
    assert_eq!(below.status.as_u16(), 410, "{}", below.text());
}

/// A trickle compacted pass after pass makes one small pack per pass; once eight of
/// a size tier exist they are merged, so objects do not pile up and the stream's
/// history stays a GET or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_packs_from_many_passes_are_merged() {
    let dir = TempDir::new("compaction-merge");
    let server = Server::start(dir.path(), FLAGS).await;
    let c = server.client.clone();
    assert_eq!(
        c.put("/trickle", TEXT, "").await.unwrap().status.as_u16(),
        201
    );
    let mut expected = Vec::new();
    let mut most = 0;
    for i in 0..20 {
        let record = format!("t{i};");
        let r = c.post("/trickle", TEXT, record.clone()).await.unwrap();
        assert_eq!(r.status.as_u16(), 204);
        expected.extend_from_slice(record.as_bytes());
        compact(&c).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(stored(&server, "seg").await.1);
    }
    let (_, packs) = eventually(Duration::from_secs(20), || {
        let (c, server) = (c.clone(), &server);
        async move {
            let _ = c.post("/other", TEXT, "x").await; // moves the GC floor along
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = stored(server, "seg").await;
            (now.1 <= 8).then_some(now)
        }
    })
    .await;
    eprintln!("20 passes: at most {most} compacted objects at once, {packs} at the end");
    assert!(most <= 12, "{most} compacted objects piled up");
    drop(server);
    let cold = Server::start(dir.path(), FLAGS).await;
    let (bytes, gets) = replay_gets(&cold.client, "/trickle").await;
    assert_eq!(bytes, expected);
    assert!(gets <= 8.0, "{gets} GETs");
}
