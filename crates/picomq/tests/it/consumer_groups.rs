//! Consumer groups under crashes: 8 `picomq consume --exec` workers share 10,000
//! messages while workers are killed with `kill -9` and the server (or, on the
//! cluster, the node serving the stream) is killed once. Every message is handled
//! at least once; a message is delivered again only if it was unacknowledged at a
//! crash (its worker was killed, or the server died between its delivery and its
//! ack); messages whose handler always fails end in the dead-letter stream after
//! the configured deliveries. Plus the API's own rules: leases, nacks with a delay,
//! positions.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use picomq_testkit as support;
use serde_json::{json, Value};
use support::cluster::TestCluster;
use support::{Server, TempDir};

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const MESSAGES: u64 = 10_000;
const WORKERS: usize = 8;
const MAX_DELIVERIES: u64 = 3;

fn poison(n: u64) -> bool {
    n % 500 == 7
}

/// What each delivery runs: logs `n deliveries worker epoch`, fails poison
/// messages, logs the others as handled.
const HANDLER: &str = r#"msg=$(cat); n=${msg#*\"n\":}; n=${n%%[,\}]*}; e=$(cat "$DIR/epoch"); echo "$n $PICOMQ_DELIVERIES $W $e" >> "$DIR/d.$W"; case "$msg" in *'"p":true'*) exit 1;; esac; echo "$n" >> "$DIR/ok.$W""#;

struct Workers {
    dir: PathBuf,
    url: String,
    running: Vec<(String, Child)>,
    killed: HashSet<String>,
    started: usize,
}

impl Workers {
    fn spawn(&mut self) {
        self.started += 1;
        let name = format!("w{}", self.started);
        let child = Command::new(support::picomq_bin())
            .args(["consume", "g", "--exec", HANDLER, "--batch", "8"])
            .args(["--consumer", &name, "--url", &self.url, "--timeout", "15s"])
            .env("DIR", &self.dir)
            .env("W", &name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a consumer");
        self.running.push((name, child));
    }

    fn kill_one(&mut self) {
        let i = fastrand::usize(..self.running.len());
        let (name, mut child) = self.running.remove(i);
        let _ = child.kill();
        let _ = child.wait();
        self.killed.insert(name);
        self.spawn();
    }

    fn stop(&mut self) {
        for (_, mut c) in self.running.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Every delivery logged: n -> [(deliveries, worker, epoch)].
    fn deliveries(&self) -> BTreeMap<u64, Vec<(u64, String, u64)>> {
        let mut out: BTreeMap<u64, Vec<(u64, String, u64)>> = BTreeMap::new();
        for line in read_prefixed(&self.dir, "d.") {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() == 4 {
                if let (Ok(n), Ok(d), Ok(e)) = (f[0].parse(), f[1].parse(), f[3].parse()) {
                    out.entry(n).or_default().push((d, f[2].to_string(), e));
                }
            }
        }
        out
    }

    fn handled(&self) -> BTreeSet<u64> {
        read_prefixed(&self.dir, "ok.")
            .iter()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_prefixed(dir: &Path, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            // A line cut by a kill -9 mid-write is no delivery record.
            out.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
        }
    }
    out
}

async fn fill(c: &support::Client) {
    let r = c.put("/work", &JSON, "[]").await.unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    for batch in 0..MESSAGES / 100 {
        let msgs: Vec<Value> = (batch * 100..(batch + 1) * 100)
            .map(|n| json!({"n": n, "p": poison(n)}))
            .collect();
        let r = c
            .post("/work", &JSON, Value::Array(msgs).to_string())
            .await
            .unwrap();
        assert!(r.status.is_success(), "{}", r.text());
    }
    let group = json!({"stream": "work", "maxDeliveries": MAX_DELIVERIES,
        "deadLetter": "work-dlq", "leaseMs": 3000});
    let r = c
        .put("/__picomq/groups/g", &JSON, group.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
}

/// Runs the workers to the end, killing six of them along the way and calling
/// `crash` once halfway; then checks what the issue asks.
async fn run_and_check<F, Fut>(dir: &Path, url: &str, reader: &support::Client, crash: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    std::fs::write(dir.join("epoch"), "0").unwrap();
    let mut workers = Workers {
        dir: dir.to_path_buf(),
        url: url.to_string(),
        running: Vec::new(),
        killed: HashSet::new(),
        started: 0,
    };
    for _ in 0..WORKERS {
        workers.spawn();
    }
    let wanted: BTreeSet<u64> = (0..MESSAGES).filter(|n| !poison(*n)).collect();
    let mut kills = 0;
    let mut crash = Some(crash);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let handled = workers.handled().len() as u64;
        if kills < 6 && handled >= (kills + 1) * MESSAGES / 8 {
            workers.kill_one();
            kills += 1;
        }
        if handled >= MESSAGES / 2 {
            if let Some(crash) = crash.take() {
                crash().await;
                std::fs::write(dir.join("epoch"), "1").unwrap();
            }
        }
        let dead = dead_letters(reader).await;
        if workers.handled().is_superset(&wanted) && dead.len() as u64 >= MESSAGES / 500 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done in 300 s: {handled} handled, {} dead-lettered",
            dead.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.stop();
    assert!(crash.is_none(), "the crash never came");

    // Dead letters: exactly the poison messages, each after its deliveries.
    let dead = dead_letters(reader).await;
    let dead_set: BTreeSet<u64> = dead.iter().map(|d| d.0).collect();
    let poison_set: BTreeSet<u64> = (0..MESSAGES).filter(|n| poison(*n)).collect();
    assert_eq!(
        dead_set, poison_set,
        "the dead-letter stream holds the poison messages"
    );
    for (n, deliveries) in &dead {
        assert!(
            *deliveries >= MAX_DELIVERIES,
            "message {n} dead after {deliveries}"
        );
    }

    // A message delivered again was unacknowledged at a crash: an earlier delivery
    // went to a worker killed later, or came before the server's crash.
    let all = workers.deliveries();
    let mut again = 0;
    for (n, ds) in &all {
        if poison(*n) || ds.len() < 2 {
            continue;
        }
        again += 1;
        let explained = ds.iter().any(|(_, w, _)| workers.killed.contains(w))
            || (ds.iter().any(|d| d.2 == 0) && ds.iter().any(|d| d.2 == 1));
        assert!(
            explained,
            "message {n} was delivered {} times with no crash in between: {ds:?}",
            ds.len()
        );
    }
    let handled_twice = read_prefixed(dir, "ok.").len() - wanted.len();
    eprintln!(
        "consumer groups: {MESSAGES} messages, {} workers killed, {again} delivered again, {handled_twice} handled twice",
        workers.killed.len()
    );
    let stats: Value =
        serde_json::from_slice(&reader.get("/__picomq/groups/g").await.unwrap().body).unwrap();
    assert_eq!(stats["inFlight"], 0, "{stats}");
    assert_eq!(stats["pending"], 0, "{stats}");
    assert_eq!(
        stats["deadLettered"].as_u64(),
        Some(MESSAGES / 500),
        "{stats}"
    );
}

/// `(n, deliveries)` of every dead letter so far.
async fn dead_letters(c: &support::Client) -> Vec<(u64, u64)> {
    let r = c.get("/work-dlq").await.unwrap();
    if !r.status.is_success() {
        return Vec::new();
    }
    let v: Vec<Value> = serde_json::from_slice(&r.body).unwrap_or_default();
    v.iter()
        .filter_map(|d| Some((d["body"]["n"].as_u64()?, d["deliveries"].as_u64()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_share_a_group_through_worker_and_server_crashes() {
    let dir = TempDir::new("groups-crash");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut server = Server::start_process(&data, &[]).await;
    fill(&server.client).await;
    let url = server.url.clone();
    let reader = server.client.clone();
    let server_ref = &mut server;
    run_and_check(&work, &url, &reader, || async move {
        server_ref.restart().await; // kill -9, then start again
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_workers_share_a_group_on_the_cluster_through_a_node_crash() {
    let dir = TempDir::new("groups-cluster");
    let mut cluster = TestCluster::start("groups", 3, &["--lease", "2s"]).await;
    cluster.wait_balanced(0, 3, Duration::from_secs(30)).await;
    let lb = cluster.start_haproxy().await;
    let client = cluster.haproxy().client.clone();
    fill(&client).await;
    let owner = client.head("/work").await.unwrap();
    let owner = owner.header("picomq-served-by").unwrap().to_string();
    let victim = (0..3)
        .find(|i| TestCluster::node_id(*i) == owner)
        .expect("the owner is a node");
    let cluster_ref = &mut cluster;
    run_and_check(dir.path(), &lb, &client, || async move {
        cluster_ref.kill9(victim);
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster_ref.restart(victim).await;
    })
    .await;
    cluster.shut_down().await;
}

/// The API's rules one by one: a lease lapses and the message goes to another
/// consumer; a nack with a delay holds it back; acks are idempotent; a claim
/// long-polls and wakes on an append; positions resume a read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_nacks_long_polls_and_positions() {
    let dir = TempDir::new("groups-rules");
    let server = Server::start(dir.path(), &[]).await;
    let c = &server.client;
    c.put("/q", &JSON, r#"[{"a":1},{"a":2}]"#).await.unwrap();
    let g = json!({"stream": "q", "leaseMs": 300, "maxDeliveries": 0});
    let r = c
        .put("/__picomq/groups/rules", &JSON, g.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = c
        .put("/__picomq/groups/rules", &JSON, g.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "same group again: {}", r.text());
    // The group's own stream is not in the listing.
    let r = c.get("/__picomq/streams").await.unwrap();
    let listed: Value = serde_json::from_slice(&r.body).unwrap();
    let names: Vec<&str> = listed["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["q"], "{listed}");
    let other = json!({"stream": "other"});
    let r = c
        .put("/__picomq/groups/rules", &JSON, other.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 409);

    let claim = |who: &str, max: usize, wait: u64| {
        let body = json!({"consumer": who, "max": max, "waitMs": wait}).to_string();
        async move {
            let r = c
                .post("/__picomq/groups/rules/claim", &JSON, body)
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            v["messages"].as_array().cloned().unwrap()
        }
    };
    let first = claim("a", 1, 0).await;
    assert_eq!(first[0]["body"], json!({"a":1}));
    assert_eq!(first[0]["deliveries"], 1);
    let second = claim("b", 5, 0).await;
    assert_eq!(second.len(), 1, "the first is out to a: {second:?}");
    assert_eq!(second[0]["body"], json!({"a":2}));
    // a's lease lapses: b gets the first message again.
    let again = claim("b", 5, 2_000).await;
    assert_eq!(again[0]["id"], first[0]["id"]);
    assert_eq!(again[0]["deliveries"], 2);
    let ids = json!({"ids": [again[0]["id"], second[0]["id"]]}).to_string();
    let r = c
        .post("/__picomq/groups/rules/ack", &JSON, ids.clone())
        .await
        .unwrap();
    assert_eq!(r.text(), r#"{"acked":2}"#);
    let r = c
        .post("/__picomq/groups/rules/ack", &JSON, ids)
        .await
        .unwrap();
    assert_eq!(r.text(), r#"{"acked":0}"#, "acks are idempotent");

    // A claim waits for an append and wakes at once.
    let started = Instant::now();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move {
            let body = json!({"consumer": "w", "max": 1, "waitMs": 10_000}).to_string();
            let r = c
                .post("/__picomq/groups/rules/claim", &JSON, body)
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&r.body).unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.post("/q", &JSON, r#"{"a":3}"#).await.unwrap();
    let woke = waiting.await.unwrap();
    assert_eq!(woke["messages"][0]["body"], json!({"a":3}));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the claim slept through the append"
    );

    // A nack with a delay holds the message back until then.
    let id = woke["messages"][0]["id"].clone();
    let nack = json!({"ids": [id], "delayMs": 700}).to_string();
    let r = c
        .post("/__picomq/groups/rules/nack", &JSON, nack)
        .await
        .unwrap();
    assert_eq!(r.text(), r#"{"nacked":1}"#);
    assert!(claim("x", 1, 0).await.is_empty(), "held back by its delay");
    let later = claim("x", 1, 3_000).await;
    assert_eq!(later[0]["id"], id);

    // Positions: commit, then resume with ?consumer=.
    let r = c.get("/q?consumer=fn-a").await.unwrap();
    assert_eq!(
        r.text(),
        r#"[{"a":1},{"a":2},{"a":3}]"#,
        "no position yet: from the start"
    );
    // A read's Stream-Next-Offset is what a consumer commits.
    let mid = r.header("stream-next-offset").unwrap().to_string();
    c.post("/q", &JSON, r#"{"a":4}"#).await.unwrap();
    let body = json!({"offset": mid}).to_string();
    let r = c
        .put("/__picomq/positions/fn-a/q", &JSON, body)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let r = c.get("/q?consumer=fn-a").await.unwrap();
    assert_eq!(r.text(), r#"[{"a":4}]"#);
    let r = c.get("/__picomq/positions/fn-a/q").await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["offset"], json!(mid));
    let past = json!({"offset": "0000000000000000_0000000000099999"}).to_string();
    let r = c
        .put("/__picomq/positions/fn-a/q", &JSON, past)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400, "past the tail");
    let r = c.get("/__picomq/positions/nobody/q").await.unwrap();
    assert_eq!(r.status.as_u16(), 404);

    // Bad input gets reasons.
    for (path, body) in [
        ("/__picomq/groups/bad%20name", json!({"stream": "q"})),
        ("/__picomq/groups/x", json!({"stream": "q", "leaseMs": 1})),
        ("/__picomq/groups/x", json!({"nope": 1})),
        ("/__picomq/groups/y", json!({"stream": "absent-stream"})),
    ] {
        let r = c.put(path, &JSON, body.to_string()).await.unwrap();
        assert!(
            matches!(r.status.as_u16(), 400 | 404),
            "{path} {body}: {} {}",
            r.status,
            r.text()
        );
        assert!(r.text().contains("\"error\""), "{}", r.text());
    }
    let r = c
        .post("/__picomq/groups/rules/ack", &JSON, r#"{"ids":["zzz"]}"#)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400);
}
