//! Many nodes on one Postgres database and one bucket (the S3 test server), behind
//! HAProxy: streams spread over the nodes, any node answers for any stream (live
//! reads included), and nodes killed with `kill -9`, paused past their lease,
//! drained or joined under load lose nothing acknowledged and duplicate nothing.
//! Needs `PICOMQ_TEST_PG_URL` (see `picomq_testkit::postgres`) and HAProxy (which
//! `.ci/haproxy.sh` installs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use picomq_client::{Client, HttpMethod};
use picomq_testkit as support;
use support::cluster::TestCluster;

/// Short leases keep the tests short; the default (5 s) is the benchmark's.
const LEASE: &[&str] = &["--lease", "2s"];

/// A PUT retried while the answer is 503 (a lease renewal late on a loaded
/// machine, a slot changing hands), as a client honouring `Retry-After` does; at
/// most 20 s.
async fn put_until_not_503(
    client: &Client,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> picomq_client::Response {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = client.put(path, headers, body).await.unwrap();
        if r.status.as_u16() != 503 || std::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn served_by(r: &picomq_client::Response) -> String {
    r.header("picomq-served-by").unwrap_or("?").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_spread_evenly_and_every_node_answers_for_every_stream() {
    let cluster = TestCluster::start("spread", 3, LEASE).await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    let mut owners: HashMap<String, usize> = HashMap::new();
    for i in 0..3000 {
        let node = cluster.node(i % 3);
        let r = node
            .client
            .put(
                &format!("/spread/s{i}"),
                &[("content-type", "text/plain")],
                "",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
        *owners.entry(served_by(&r)).or_default() += 1;
    }
    assert_eq!(owners.len(), 3, "{owners:?}");
    for (node, n) in &owners {
        assert!(
            (750..=1260).contains(n),
            "{node} serves {n} of 3000 streams ({owners:?})"
        );
    }
    // Every node reads and writes every stream (forwarded to the owner).
    for i in 0..30 {
        let path = format!("/spread/s{i}");
        for (k, node) in cluster.nodes.iter().enumerate() {
            let r = node
                .client
                .post(&path, &[("content-type", "text/plain")], format!("{k};"))
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 204, "{}", r.text());
        }
        for node in &cluster.nodes {
            let body = support::read_all(&node.client, &path).await;
            assert_eq!(body, b"0;1;2;", "{path} through {}", node.url);
        }
    }
    // So does the native record API: appends numbered on from the Durable Streams
    // records, reads by number and time, info, trims, through any member.
    for i in 0..10 {
        let records = format!("/__picomq/streams/spread/s{i}/records");
        for (k, node) in cluster.nodes.iter().enumerate() {
            let batch = serde_json::json!({"records": [{"body": format!("n{k};"), "headers": [["k", k.to_string()]]}]});
            let r = node
                .client
                .post(&records, &[], batch.to_string())
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let ack: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(ack["first_seq"], 3 + k as u64, "{ack}");
        }
        for node in &cluster.nodes {
            let r = node
                .client
                .get(&format!("{records}?seq=2&count=3"))
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let page: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            let bodies: Vec<&str> = page["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["body"].as_str().unwrap())
                .collect();
            assert_eq!(bodies, ["2;", "n0;", "n1;"], "through {}", node.url);
            assert_eq!(
                page["records"][1]["headers"],
                serde_json::json!([["k", "0"]])
            );
            let t = page["records"][2]["timestamp"].as_u64().unwrap();
            let r = node
                .client
                .get(&format!("{records}?timestamp={t}&count=1"))
                .await
                .unwrap();
            let at: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert!(at["records"][0]["seq"].as_u64().unwrap() <= 4, "{at}");
        }
        let r = cluster
            .node(i % 3)
            .client
            .post(
                &format!("/__picomq/streams/spread/s{i}/trim?before_seq=4"),
                &[],
                "",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let r = cluster
            .node((i + 1) % 3)
            .client
            .get(&format!("/__picomq/streams/spread/s{i}/info"))
            .await
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (info["first_seq"].as_u64(), info["next_seq"].as_u64()),
            (Some(4), Some(6)),
            "{info}"
        );
    }
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_reads_through_another_node_follow_the_tail() {
    let cluster = TestCluster::start("live", 2, LEASE).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    // A stream each node does not serve.
    let mut paths = Vec::new();
    for i in 0.. {
        let path = format!("/live/s{i}");
        let r = cluster
            .node(0)
            .client
            .put(&path, &[("content-type", "text/plain")], "")
            .await
            .unwrap();
        if served_by(&r) == TestCluster::node_id(1) {
            paths.push(path);
            break;
        }
    }
    let path = paths.pop().unwrap();
    let reader = cluster.node(0).client.clone();
    let poll_path = format!("{path}?offset=-1&live=long-poll");
    let poll = tokio::spawn(async move {
        // The first long-poll answers at once with nothing (empty stream, up to date)
        // or waits; ask from the tail instead.
        reader.get(&poll_path.replace("-1", "now")).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = cluster
        .node(1)
        .client
        .post(&path, &[("content-type", "text/plain")], "hello")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204);
    let got = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status.as_u16(), 200, "{}", got.text());
    assert_eq!(got.text(), "hello");
    assert_eq!(served_by(&got), TestCluster::node_id(1));
    // SSE through the non-owner: the event arrives as it is appended.
    let mut sse = cluster
        .node(0)
        .client
        .open(
            HttpMethod::GET,
            &format!("{path}?offset=-1&live=sse"),
            &[],
            bytes::Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200);
    let r = cluster
        .node(1)
        .client
        .post(&path, &[("content-type", "text/plain")], " again")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204);
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("again") {
        let chunk = tokio::time::timeout_at(deadline, sse.next_chunk())
            .await
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap()));
    }
    assert!(seen.contains("hello"), "{seen}");
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redirect_mode_sends_clients_to_the_owner() {
    let flags = ["--lease", "2s", "--route", "redirect"];
    let cluster = TestCluster::start("redirect", 2, &flags).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    for i in 0..20 {
        let path = format!("/redirect/s{i}");
        let r = put_until_not_503(
            &cluster.node(0).client,
            &path,
            &[("content-type", "text/plain")],
            "",
        )
        .await;
        match r.status.as_u16() {
            201 => assert_eq!(served_by(&r), TestCluster::node_id(0)),
            307 => {
                let location = r.header("location").unwrap();
                assert!(
                    location.starts_with(&cluster.node(1).url) && location.ends_with(&path),
                    "{location}"
                );
            }
            other => panic!("PUT {path}: {other} {}", r.text()),
        }
    }
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forks_and_deletes_across_nodes() {
    let cluster = TestCluster::start("forks", 2, LEASE).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    // A source on one node and a fork on the other.
    let owner_of = |r: &picomq_client::Response| served_by(r);
    let c = &cluster.node(0).client;
    let r = put_until_not_503(c, "/forks/src", &[("content-type", "text/plain")], "abc").await;
    let src_owner = owner_of(&r);
    let mut fork = None;
    for i in 0..64 {
        let path = format!("/forks/f{i}");
        let headers = [
            ("content-type", "text/plain"),
            ("stream-forked-from", "/forks/src"),
        ];
        let r = put_until_not_503(c, &path, &headers, "").await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
        if owner_of(&r) != src_owner {
            fork = Some(path);
            break;
        }
        let d = c.delete(&path).await.unwrap();
        assert_eq!(d.status.as_u16(), 204);
    }
    let fork = fork.expect("a fork on the other node");
    let r = c
        .post(&fork, &[("content-type", "text/plain")], "def")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204);
    assert_eq!(support::read_all(c, &fork).await, b"abcdef");
    // Deleting the source keeps it for its fork (410); deleting the fork cascades.
    assert_eq!(c.delete("/forks/src").await.unwrap().status.as_u16(), 204);
    assert_eq!(c.head("/forks/src").await.unwrap().status.as_u16(), 410);
    assert_eq!(support::read_all(c, &fork).await, b"abcdef");
    assert_eq!(c.delete(&fork).await.unwrap().status.as_u16(), 204);
    support::eventually(Duration::from_secs(10), || async {
        (c.head("/forks/src").await.unwrap().status.as_u16() == 404).then_some(())
    })
    .await;
    cluster.shut_down().await;
}

/// Forks created at once in both directions between two nodes (sources on each,
/// forks owned by the other) all complete: a node pins a fork point on the other
/// without holding its own lifecycle lock, so two nodes forking each other's streams
/// never wait on each other. Before, each held its lock while calling the other,
/// which waited for that same lock: both stuck, and with them every fork and delete
/// on either node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forks_in_both_directions_at_once_never_wait_on_each_other() {
    let cluster = TestCluster::start("forks-cross", 2, LEASE).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    let c = cluster.node(0).client.clone();
    // Sources by owner; each source gets forks under many names, about half of
    // them owned by the other node.
    let mut sources: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..16 {
        let path = format!("/cross/s{i}");
        let r = put_until_not_503(&c, &path, &[("content-type", "text/plain")], "abc").await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
        sources.entry(served_by(&r)).or_default().push(path);
    }
    assert_eq!(sources.len(), 2, "sources on both nodes: {sources:?}");
    let nodes: Vec<String> = sources.keys().cloned().collect();
    let mut tasks = Vec::new();
    for round in 0..8 {
        for (k, node) in nodes.iter().enumerate() {
            for (j, source) in sources[node].iter().take(4).enumerate() {
                let c = cluster.node(k % 2).client.clone();
                let (source, fork) = (source.clone(), format!("/cross/f{round}-{k}-{j}"));
                tasks.push(tokio::spawn(async move {
                    let headers = [
                        ("content-type", "text/plain"),
                        ("stream-forked-from", source.as_str()),
                    ];
                    let r = put_until_not_503(&c, &fork, &headers, "").await;
                    (fork, source, r.status.as_u16(), served_by(&r), r.text())
                }));
            }
        }
    }
    let mut crossed = 0;
    let all = futures::future::join_all(tasks);
    let done = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("fork creations stuck: nodes waiting on each other");
    for t in done {
        let (fork, source, status, owner, text) = t.unwrap();
        assert_eq!(status, 201, "{fork} from {source}: {text}");
        let source_owner = nodes
            .iter()
            .find(|n| sources[*n].contains(&source))
            .unwrap();
        if &owner != source_owner {
            crossed += 1;
        }
        assert_eq!(support::read_all(&c, &fork).await, b"abc", "{fork}");
    }
    assert!(
        crossed > 0,
        "some forks were owned by the other node than their source"
    );
    cluster.shut_down().await;
}

/// A delete of a source served by one node while a fork of it, served by the
/// other, is still being indexed: the fork is counted (soft delete, 410), whether
/// the source's owner still holds its pin or the fork's row has landed. Every index
/// write is held back 2 s and the delete waits 3 s between its two counts, so the
/// fork's row commits and its pin is released between them: counted metadata
/// first, pins second, as before, the delete saw neither and went hard (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_deleted_while_its_fork_is_being_indexed_is_deleted_soft() {
    let mut cluster = TestCluster::start("fork-race", 0, &["--lease", "5s"]).await;
    let pauses = [(
        "PICOMQ_FAILPOINT_PAUSES",
        "index-before-apply=2000,between-fork-counts=3000",
    )];
    cluster.add_node_with_env(&pauses).await;
    cluster.add_node_with_env(&pauses).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(60)).await;
    let c = cluster.node(0).client.clone();
    let text = [("content-type", "text/plain")];
    let mut crossed = 0;
    for i in 0..12 {
        let (source, fork) = (format!("/race/s{i}"), format!("/race/f{i}"));
        let r = put_until_not_503(&c, &source, &text, "abc").await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
        let source_owner = served_by(&r);
        // No wait for the source's own (held back) index write: pinning the fork
        // point waits for it on the source's owner, so the delete's barrier there
        // finds nothing pending and counts at once.
        let headers = [
            ("content-type", "text/plain"),
            ("stream-forked-from", source.as_str()),
        ];
        let f = put_until_not_503(&c, &fork, &headers, "").await;
        assert_eq!(f.status.as_u16(), 201, "{fork}: {}", f.text());
        let crossing = served_by(&f) != source_owner;
        let d = c.delete(&source).await.unwrap();
        assert_eq!(d.status.as_u16(), 204, "{source}: {}", d.text());
        // Soft: the source answers 410 and its name cannot be taken again.
        let g = c.get(&format!("{source}?offset=-1")).await.unwrap();
        assert_eq!(
            g.status.as_u16(),
            410,
            "{source} (fork on {}, source on {source_owner}) was deleted hard under its fork",
            served_by(&f)
        );
        assert_eq!(support::read_all(&c, &fork).await, b"abc", "{fork}");
        // The last fork gone, the source goes with it.
        assert_eq!(c.delete(&fork).await.unwrap().status.as_u16(), 204);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let g = c.get(&format!("{source}?offset=-1")).await.unwrap();
            if g.status.as_u16() == 404 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{source} outlived its last fork: {}",
                g.status
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if crossing {
            crossed += 1;
            if crossed == 3 {
                break;
            }
        }
    }
    assert!(
        crossed > 0,
        "no fork landed on another node than its source"
    );
    cluster.shut_down().await;
}

/// One writer's stream and what it was told.
struct Writer {
    path: String,
    idempotent: bool,
    /// Records acknowledged, in order, with the offset each acknowledgement gave.
    acked: Vec<(String, String)>,
    /// Records whose outcome is unknown (an error, a timeout): present at most once.
    unknown: Vec<String>,
    /// Answers that were not a success, by status (0: no answer).
    failures: HashMap<u16, u64>,
}

/// Appends records to `path` through `url` until `stop`: plain appends once each
/// (an unknown outcome is recorded, never retried: a retry could duplicate),
/// idempotent ones (Producer-Id) retried until acknowledged.
async fn write(url: String, mut w: Writer, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> Writer {
    let client = Client::new(&url);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let record = format!("{}#{n:08};", w.path);
        let seq = n.to_string();
        let mut headers = vec![("content-type", "text/plain")];
        if w.idempotent {
            headers.extend([
                ("producer-id", "p"),
                ("producer-epoch", "0"),
                ("producer-seq", seq.as_str()),
            ]);
        }
        loop {
            let sent = tokio::time::timeout(
                Duration::from_secs(30),
                client.post(&w.path, &headers, record.clone()),
            )
            .await;
            match sent {
                Ok(Ok(r)) if r.status.is_success() => {
                    let next = r.header("stream-next-offset").unwrap_or("").to_string();
                    w.acked.push((record.clone(), next));
                    count.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                other => {
                    let status = match &other {
                        Ok(Ok(r)) => r.status.as_u16(),
                        _ => 0,
                    };
                    *w.failures.entry(status).or_default() += 1;
                    // 0: no answer; 502: HAProxy lost the node mid-request (it was
                    // killed); 503: retry. The outcome of all three is unknown.
                    if !matches!(status, 0 | 502 | 503) {
                        let text = match other {
                            Ok(Ok(r)) => r.text(),
                            _ => String::new(),
                        };
                        panic!("{}: append answered {status}: {text}", w.path);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if !w.idempotent {
                        w.unknown.push(record.clone());
                        break;
                    }
                }
            }
        }
        n += 1;
    }
    w
}

/// Reads `w.path` whole and checks it: every acknowledged record once, in order,
/// unknown ones at most once, nothing else; acknowledged offsets strictly rising.
async fn verify(client: &Client, w: &Writer) {
    let body = support::read_all(client, &w.path).await;
    let text = String::from_utf8(body).unwrap();
    let records: Vec<&str> = text.split_terminator(';').collect();
    let mut acked = w
        .acked
        .iter()
        .map(|(r, _)| r.trim_end_matches(';'))
        .peekable();
    let unknown: std::collections::HashSet<&str> =
        w.unknown.iter().map(|r| r.trim_end_matches(';')).collect();
    let mut seen = std::collections::HashSet::new();
    for rec in &records {
        assert!(seen.insert(*rec), "{}: {rec} appears twice", w.path);
        if acked.peek() == Some(rec) {
            acked.next();
        } else {
            assert!(
                unknown.contains(rec),
                "{}: {rec} was never sent, or is out of order",
                w.path
            );
        }
    }
    assert!(
        acked.peek().is_none(),
        "{}: acknowledged {:?} is missing",
        w.path,
        acked.peek()
    );
    let offsets: Vec<&str> = w.acked.iter().map(|(_, o)| o.as_str()).collect();
    for pair in offsets.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{}: offsets not rising: {pair:?}",
            w.path
        );
    }
}

/// Starts `n` writers through `url`, half of them idempotent.
fn start_writers(
    url: &str,
    tag: &str,
    n: usize,
    stop: &Arc<AtomicBool>,
    count: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<Writer>> {
    (0..n)
        .map(|i| {
            let w = Writer {
                path: format!("/{tag}/w{i}"),
                idempotent: i % 2 == 1,
                acked: Vec::new(),
                unknown: Vec::new(),
                failures: HashMap::new(),
            };
            tokio::spawn(write(url.to_string(), w, stop.clone(), count.clone()))
        })
        .collect()
}

/// Until `stop`: creates a new stream, appends one record to it at once (the two
/// may straddle a hand-over of its slot) and reads it back. Only 503s and lost
/// answers are retried; a stream that is missing right after its creation was
/// acknowledged, or a record that is not there once, fails the test. Returns how
/// many streams it created.
async fn create_and_append(url: String, tag: &'static str, stop: Arc<AtomicBool>) -> u64 {
    let client = Client::new(&url);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let path = format!("/{tag}/c{n}");
        let record = format!("c{n};");
        let mut tries = 0;
        loop {
            tries += 1;
            assert!(tries < 400, "{path}: no answer but 503 for too long");
            let created = client
                .put(&path, &[("content-type", "text/plain")], "")
                .await;
            match created {
                Ok(r) if r.status.is_success() => break,
                Ok(r) if r.status.as_u16() == 503 => {}
                Ok(r) => panic!("{path}: create answered {}: {}", r.status, r.text()),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let headers = [
            ("content-type", "text/plain"),
            ("producer-id", "creator"),
            ("producer-epoch", "0"),
            ("producer-seq", "0"),
        ];
        loop {
            tries += 1;
            assert!(tries < 800, "{path}: no answer but 503 for too long");
            match client.post(&path, &headers, record.clone()).await {
                Ok(r) if r.status.is_success() => break,
                Ok(r) if r.status.as_u16() == 503 => {}
                Ok(r) => panic!(
                    "{path}: append right after the create answered {}: {}",
                    r.status,
                    r.text()
                ),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        loop {
            tries += 1;
            assert!(tries < 1200, "{path}: no answer but 503 for too long");
            match client.get(&format!("{path}?offset=-1")).await {
                Ok(r) if r.status.as_u16() == 200 => {
                    assert_eq!(r.text(), record, "{path}");
                    break;
                }
                Ok(r) if r.status.as_u16() == 503 => {}
                Ok(r) => panic!("{path}: read answered {}: {}", r.status, r.text()),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        n += 1;
    }
    n
}

async fn create_streams(client: &Client, tag: &str, n: usize) {
    for i in 0..n {
        let r = client
            .put(
                &format!("/{tag}/w{i}"),
                &[("content-type", "text/plain")],
                "",
            )
            .await
            .unwrap();
        assert!(r.status.is_success(), "{}", r.text());
    }
}

/// Waits until the writers have had `more` more acknowledgements.
async fn progress(count: &AtomicU64, more: u64, limit: Duration) {
    let target = count.load(Ordering::Relaxed) + more;
    support::eventually(limit, || async {
        (count.load(Ordering::Relaxed) >= target).then_some(())
    })
    .await;
}

async fn finish(
    cluster: &TestCluster,
    writers: Vec<tokio::task::JoinHandle<Writer>>,
    stop: &AtomicBool,
) -> HashMap<u16, u64> {
    stop.store(true, Ordering::Relaxed);
    let mut failures: HashMap<u16, u64> = HashMap::new();
    for w in writers {
        let w = w.await.unwrap();
        assert!(!w.acked.is_empty(), "{}: nothing acknowledged", w.path);
        verify(&cluster.haproxy().client, &w).await;
        for (status, n) in &w.failures {
            *failures.entry(*status).or_default() += n;
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_nodes_are_taken_over_without_losing_acknowledged_appends() {
    let mut cluster = TestCluster::start("failover", 3, LEASE).await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    let lb = cluster.start_haproxy().await;
    create_streams(&cluster.haproxy().client, "failover", 6).await;
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers = start_writers(&lb, "failover", 6, &stop, &count);
    progress(&count, 200, Duration::from_secs(30)).await;
    for round in 0..3 {
        let victim = round % 3;
        cluster.kill9(victim);
        // The others take the victim's streams over: appends to them go on.
        progress(&count, 300, Duration::from_secs(60)).await;
        cluster.restart(victim).await;
        cluster
            .wait_balanced((victim + 1) % 3, 3, Duration::from_secs(60))
            .await;
        progress(&count, 200, Duration::from_secs(30)).await;
    }
    let failures = finish(&cluster, writers, &stop).await;
    eprintln!(
        "failover: {} acknowledged, failures by status {failures:?}",
        count.load(Ordering::Relaxed)
    );
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_paused_past_its_lease_is_fenced_and_rejoins() {
    let mut cluster = TestCluster::start("zombie", 3, LEASE).await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    let lb = cluster.start_haproxy().await;
    create_streams(&cluster.haproxy().client, "zombie", 6).await;
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers = start_writers(&lb, "zombie", 6, &stop, &count);
    progress(&count, 200, Duration::from_secs(30)).await;
    cluster.signal(1, "STOP");
    // Past its lease, the others take its streams over and appends go on. The
    // writers to the other nodes' streams alone can make the progress well within
    // the lease, so the take-over itself is awaited: the node must be resumed
    // only once it has really been replaced.
    cluster.wait_balanced(0, 2, Duration::from_secs(60)).await;
    progress(&count, 300, Duration::from_secs(60)).await;
    cluster.signal(1, "CONT");
    // It finds itself taken over and rejoins as a new member.
    cluster.wait_balanced(0, 3, Duration::from_secs(60)).await;
    progress(&count, 200, Duration::from_secs(30)).await;
    let failures = finish(&cluster, writers, &stop).await;
    eprintln!(
        "zombie: {} acknowledged, failures by status {failures:?}",
        count.load(Ordering::Relaxed)
    );
    let log = cluster.node(1).log_text();
    // Without the access log: the node's own account of what happened to it.
    let events: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains("picomq::access"))
        .collect();
    assert!(
        log.contains("rejoining as a new member"),
        "{}",
        events.join("\n")
    );
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drains_and_joins_under_load_fail_nothing_but_retryable_503s() {
    let mut cluster = TestCluster::start("drain", 2, LEASE).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    let lb = cluster.start_haproxy().await;
    create_streams(&cluster.haproxy().client, "drain", 6).await;
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers = start_writers(&lb, "drain", 6, &stop, &count);
    let creator = tokio::spawn(create_and_append(lb.clone(), "drain", stop.clone()));
    progress(&count, 200, Duration::from_secs(30)).await;
    // Drain node-2 without stopping it: node-1 serves everything.
    let r = cluster
        .node(0)
        .client
        .post("/__picomq/nodes/node-2/drain", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    cluster.wait_balanced(0, 1, Duration::from_secs(30)).await;
    progress(&count, 200, Duration::from_secs(30)).await;
    let r = cluster
        .node(0)
        .client
        .post("/__picomq/nodes/node-2/resume", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    progress(&count, 200, Duration::from_secs(30)).await;
    // A third node joins and takes its share.
    cluster.add_node().await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    progress(&count, 200, Duration::from_secs(30)).await;
    // SIGTERM hands node-1's streams over before it exits.
    let status = cluster.node_mut(0).terminate(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    cluster.wait_balanced(1, 2, Duration::from_secs(30)).await;
    progress(&count, 200, Duration::from_secs(30)).await;
    let failures = finish(&cluster, writers, &stop).await;
    let created = creator.await.unwrap();
    eprintln!(
        "drain and join: {} acknowledged, failures by status {failures:?}; {created} streams created and appended to meanwhile",
        count.load(Ordering::Relaxed)
    );
    assert!(created > 0, "no stream created during the moves");
    assert!(
        failures.keys().all(|s| *s == 503 || *s == 0),
        "only retryable failures: {failures:?}"
    );
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cut_off_for_30s_fails_fast_with_503_and_heals() {
    // The nodes reach Postgres through a relay that can cut them off: a network
    // partition from the metadata store, Postgres itself staying up.
    let relay = support::tcp_cut::TcpCut::start(support::postgres::server_addr()).await;
    let port = relay.port;
    let mut cluster = TestCluster::start_reaching_db("pgcut", 2, LEASE, |db| {
        support::postgres::with_port(db, port)
    })
    .await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    let lb = cluster.start_haproxy().await;
    create_streams(&cluster.haproxy().client, "pgcut", 4).await;
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers = start_writers(&lb, "pgcut", 4, &stop, &count);
    progress(&count, 200, Duration::from_secs(30)).await;

    relay.cut();
    let cut_at = std::time::Instant::now();
    // Within a lease no node can prove it owns anything: each turns unready, and
    // an unready node acknowledges nothing.
    support::eventually(Duration::from_secs(10), || async {
        for i in 0..2 {
            let r = cluster.node(i).client.get("/readyz").await.ok()?;
            if r.status.as_u16() != 503 {
                return None;
            }
        }
        Some(())
    })
    .await;
    let stalled = count.load(Ordering::Relaxed);
    let node = &cluster.node(0).client;
    let started = std::time::Instant::now();
    let r = node
        .post("/pgcut/w0", &[("content-type", "text/plain")], "x;")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "the 503 took {:?}",
        started.elapsed()
    );
    let ready = node.get("/readyz").await.unwrap();
    assert_eq!(ready.status.as_u16(), 503, "{}", ready.text());
    // The rest of the 30 s outage.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(cut_at.elapsed())).await;
    assert_eq!(
        count.load(Ordering::Relaxed),
        stalled,
        "appends acknowledged while no node could reach Postgres"
    );

    relay.heal();
    // By itself: leases come back (or a node is taken over and rejoins).
    cluster.wait_balanced(0, 2, Duration::from_secs(60)).await;
    progress(&count, 200, Duration::from_secs(60)).await;
    let failures = finish(&cluster, writers, &stop).await;
    eprintln!(
        "postgres cut off: {} acknowledged, failures by status {failures:?}",
        count.load(Ordering::Relaxed)
    );
    assert!(
        failures.keys().all(|s| matches!(s, 0 | 502 | 503)),
        "only retryable failures: {failures:?}"
    );
    cluster.shut_down().await;
}

/// Sums of `metric` over the nodes, by node id.
async fn per_node(cluster: &TestCluster, metric: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let n = support::metric(&node.client, metric).await as u64;
        out.insert(TestCluster::node_id(i), n);
    }
    out
}

/// Creates `n` streams `/bg/{kind}{i}` through the nodes in turn; how many each
/// node id owns.
async fn create_owned(
    cluster: &TestCluster,
    kind: &str,
    n: usize,
    headers: &[(&str, &str)],
) -> HashMap<String, u64> {
    let mut owners: HashMap<String, u64> = HashMap::new();
    for i in 0..n {
        let client = &cluster.node(i % 3).client;
        let r = put_until_not_503(client, &format!("/bg/{kind}{i}"), headers, "").await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
        *owners.entry(served_by(&r)).or_default() += 1;
    }
    owners
}

/// Background work runs once per cluster: TTL expiry and age retention by each
/// stream's owner alone (each node's count equals the streams it owns), compaction
/// on the one member holding the maintenance job. And it collects nothing another
/// node still needs: after compaction and GC, with every node killed and restarted,
/// every kept record reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_work_runs_once_per_cluster() {
    let mut flags = LEASE.to_vec();
    flags.extend([
        "--dormancy",
        "2s",
        "--retention-interval",
        "500ms",
        "--compaction-interval",
        "1s",
        "--compaction-delay",
        "0s",
        "--gc-interval",
        "1s",
    ]);
    let mut cluster = TestCluster::start("bg", 3, &flags).await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    let text = ("content-type", "text/plain");
    let ttl_owners = create_owned(&cluster, "ttl", 30, &[text, ("stream-ttl", "3")]).await;
    let ret_owners = create_owned(&cluster, "ret", 30, &[text, ("stream-retention", "1")]).await;
    let keep_owners = create_owned(&cluster, "keep", 30, &[text]).await;
    assert_eq!(keep_owners.len(), 3, "{keep_owners:?}");
    let mut kept: Vec<String> = vec![String::new(); 30];
    for round in 0..10 {
        for (i, body) in kept.iter_mut().enumerate() {
            let record = format!("{round}.{i};");
            let client = &cluster.node(round % 3).client;
            let r = client
                .post(&format!("/bg/keep{i}"), &[text], record.clone())
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 204, "{}", r.text());
            body.push_str(&record);
        }
    }
    for i in 0..30 {
        let r = cluster
            .node(i % 3)
            .client
            .post(&format!("/bg/ret{i}"), &[text], "old;")
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    }

    // Each stream expired once, by its owner; each retained one trimmed once, by
    // its owner (one record, one index row: one trim).
    let expired = support::eventually(Duration::from_secs(60), || async {
        let by_node = per_node(&cluster, "picomq_streams_expired_total").await;
        (by_node.values().sum::<u64>() >= 30).then_some(by_node)
    })
    .await;
    let trimmed = support::eventually(Duration::from_secs(60), || async {
        let by_node = per_node(&cluster, "picomq_trims_total").await;
        (by_node.values().sum::<u64>() >= 30).then_some(by_node)
    })
    .await;
    for id in (0..3).map(TestCluster::node_id) {
        let owned = |m: &HashMap<String, u64>| m.get(&id).copied().unwrap_or(0);
        assert_eq!(
            owned(&expired),
            owned(&ttl_owners),
            "{id}: expired {expired:?}, owners {ttl_owners:?}"
        );
        assert_eq!(
            owned(&trimmed),
            owned(&ret_owners),
            "{id}: trimmed {trimmed:?}, owners {ret_owners:?}"
        );
    }
    for i in 0..30 {
        let r = cluster
            .node(0)
            .client
            .get(&format!("/bg/ttl{i}"))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 404, "/bg/ttl{i} outlived its TTL");
    }

    // Compaction ran, on one member only; GC then collected what it replaced.
    let compacted = support::eventually(Duration::from_secs(60), || async {
        let by_node = per_node(&cluster, "picomq_compaction_objects_written_total").await;
        (by_node.values().sum::<u64>() > 0).then_some(by_node)
    })
    .await;
    support::eventually(Duration::from_secs(60), || async {
        let by_node = per_node(&cluster, "picomq_gc_objects_deleted_total").await;
        (by_node.values().sum::<u64>() > 0).then_some(())
    })
    .await;
    let passes = per_node(&cluster, "picomq_compaction_passes_total").await;
    let compactors: Vec<&String> = passes
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        compactors.len(),
        1,
        "compaction passes by node: {passes:?}, objects written {compacted:?}"
    );

    // Nothing needed was collected: every node killed and restarted (their logs
    // now belong to finished members, collected by the maintenance job), every
    // kept record reads back whole through every node.
    for i in 0..3 {
        cluster.kill9(i);
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    cluster.wait_balanced(0, 3, Duration::from_secs(60)).await;
    // The restarted nodes' GC has run (their counters start at zero), so whatever
    // it would wrongly collect is gone before the reads.
    support::eventually(Duration::from_secs(30), || async {
        let by_node = per_node(&cluster, "picomq_gc_passes_total").await;
        by_node.values().all(|n| *n >= 2).then_some(())
    })
    .await;
    for (i, expected) in kept.iter().enumerate() {
        for node in &cluster.nodes {
            let path = format!("/bg/keep{i}");
            let r = node.client.get(&format!("{path}?offset=-1")).await.unwrap();
            if r.status.as_u16() != 200 {
                panic!(
                    "read {path} through {}: {} {}\n{}",
                    node.url,
                    r.status,
                    r.text(),
                    explain_stream(&cluster, &format!("bg/keep{i}")).await
                );
            }
            let body = support::read_all(&node.client, &path).await;
            assert_eq!(
                String::from_utf8_lossy(&body),
                *expected,
                "/bg/keep{i} through {}",
                node.url
            );
        }
    }
    for i in 0..30 {
        let body = support::read_all(&cluster.node(i % 3).client, &format!("/bg/ret{i}")).await;
        assert!(
            body.is_empty(),
            "/bg/ret{i} kept records past its retention"
        );
    }
    cluster.shut_down().await;
}

/// What the metadata holds for stream `name` (its row, its index rows) and what
/// the nodes logged (without the access log), for a failure message.
async fn explain_stream(cluster: &TestCluster, name: &str) -> String {
    let row = cluster
        .db
        .scalar(&format!(
            "SELECT row_to_json(s)::text FROM streams s WHERE name = '{name}'"
        ))
        .await;
    let chunks = cluster
        .db
        .scalar(&format!(
            "SELECT string_agg(row_to_json(c)::text, E'\\n' ORDER BY start_pos) FROM chunks c \
             WHERE stream_id = (SELECT id FROM streams WHERE name = '{name}')"
        ))
        .await;
    let mut out = format!(
        "stream row: {row:?}\nindex rows:\n{}\n",
        chunks.unwrap_or_default()
    );
    for (i, node) in cluster.nodes.iter().enumerate() {
        out.push_str(&format!("--- node {i} ({}) ---\n", node.url));
        for line in node.log_text().lines() {
            if !line.contains("picomq::access") {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The members' admin call (`/__picomq/cluster/admin`, the Kafka listener's topic
/// administration on a cluster) acts only on streams the member serves, never
/// forwards, and answers bad input with 400 and a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_members_admin_call_acts_only_where_the_stream_is_served() {
    let cluster = TestCluster::start("admincall", 2, LEASE).await;
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    let key = cluster
        .db
        .scalar("SELECT key FROM cluster_key")
        .await
        .expect("cluster key");
    let call = |i: usize, body: String| {
        let client = cluster.node(i).client.clone();
        let key = key.clone();
        async move {
            client
                .post(
                    picomq_http::cluster::peers::ADMIN_PATH,
                    &[
                        ("picomq-cluster-key", key.as_str()),
                        ("content-type", "application/json"),
                    ],
                    body,
                )
                .await
                .unwrap()
        }
    };
    let (mut here, mut elsewhere) = (Vec::new(), Vec::new());
    for n in 0..40 {
        let name = format!("adm-{n}");
        let body = serde_json::json!({"op": "create", "stream": name, "retention_secs": 3600});
        let r = call(0, body.to_string()).await;
        match r.status.as_u16() {
            200 => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["created"], true, "{v}");
                assert_eq!(v["retention_secs"], 3600, "{v}");
                assert!(v["id"].as_u64() > Some(0), "{v}");
                here.push(name);
            }
            503 => {
                assert!(r.text().contains("not_owner"), "{}", r.text());
                elsewhere.push(name);
            }
            s => panic!("create {name}: {s} {}", r.text()),
        }
    }
    assert!(
        !here.is_empty() && !elsewhere.is_empty(),
        "{here:?} {elsewhere:?}"
    );
    // What node 0 made is there for every node; what it refused, nowhere.
    for (names, want) in [(&here, 200), (&elsewhere, 404)] {
        for name in names.iter() {
            let r = cluster
                .node(1)
                .client
                .head(&format!("/{name}"))
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), want, "{name}");
        }
    }
    // Again: an existing stream is found, not made twice.
    let again = serde_json::json!({"op": "create", "stream": here[0]});
    let r = call(0, again.to_string()).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(r.text().contains("\"created\":false"), "{}", r.text());
    // Retention, info, delete.
    let set = serde_json::json!({"op": "set_retention", "stream": here[0], "retention_secs": 60});
    let r = call(0, set.to_string()).await;
    assert!(r.text().contains("\"retention_secs\":60"), "{}", r.text());
    let del = serde_json::json!({"op": "delete", "stream": here[0]});
    assert_eq!(call(0, del.to_string()).await.status.as_u16(), 200);
    let info = serde_json::json!({"op": "info", "stream": here[0]});
    assert_eq!(call(0, info.to_string()).await.status.as_u16(), 404);
    // Bad input: 400 with a reason, nothing made.
    for bad in [
        "not json".to_string(),
        r#"{"op":"explode","stream":"x"}"#.to_string(),
        r#"{"op":"create"}"#.to_string(),
        r#"{"op":"create","stream":""}"#.to_string(),
        format!(r#"{{"op":"create","stream":"{}"}}"#, "n".repeat(100_000)),
        format!(
            r#"{{"op":"set_retention","stream":"{}","retention_secs":0}}"#,
            here[1]
        ),
        format!(
            r#"{{"op":"create","stream":"{}","content_type":"{}"}}"#,
            here[1],
            "t".repeat(300)
        ),
        // A publish only moves records from a companion of the stream (a Kafka
        // transaction's staging stream), never from another stream.
        format!(
            r#"{{"op":"publish","stream":"{}","from":"{}","producer":"p","epoch":1,"create":false}}"#,
            here[1], here[0]
        ),
        format!(
            r#"{{"op":"publish","stream":"{}","from":"__kafka/stage/1.0/{}","producer":"","epoch":1,"create":false}}"#,
            here[1], here[1]
        ),
        r#"{"op":"publish","stream":"x"}"#.to_string(),
        // A table export's read and tiering: numbers, not anything else.
        r#"{"op":"read","stream":"x"}"#.to_string(),
        r#"{"op":"read","stream":"x","seq":-1,"bytes":10}"#.to_string(),
        r#"{"op":"read","stream":"x","seq":0,"bytes":"lots"}"#.to_string(),
        r#"{"op":"read","stream":"x","seq":0,"bytes":1e400}"#.to_string(),
        r#"{"op":"tier","stream":"x"}"#.to_string(),
        r#"{"op":"tier","stream":"x","exported":1.5}"#.to_string(),
        format!(r#"{{"op":"tier","stream":"{}","exported":null}}"#, here[1]),
    ] {
        let r = call(0, bad.clone()).await;
        let s = r.status.as_u16();
        assert!(
            s == 400 || s == 413,
            "{}: {s} {}",
            &bad[..bad.len().min(60)],
            r.text()
        );
        assert!(r.text().contains("\"error\""), "{}", r.text());
    }
    // The largest numbers are no error: a read is bounded by the member, and a
    // tier trims nothing younger than the stream's retention (an hour).
    let r = call(
        0,
        r#"{"op":"read","stream":"S","seq":0,"bytes":18446744073709551615}"#.replace('S', &here[1]),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["read"]["records"], serde_json::json!([]), "{v}");
    let r = call(
        0,
        r#"{"op":"tier","stream":"S","exported":18446744073709551615}"#.replace('S', &here[1]),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(r.text().contains("\"first_seq\":0"), "{}", r.text());
    cluster.shut_down().await;
}
