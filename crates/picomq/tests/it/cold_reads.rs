//! Recent history read back after a restart, at every age (still only in the WAL,
//! in L0 packs, in L1 pieces), with nothing in memory to help (no tail cache, no
//! block cache), while the store fails a tenth of its requests and the process is
//! killed with `kill -9` in the middle of packing: every record comes back exactly
//! once, in order, on byte streams, JSON streams and a fork.

use std::time::Duration;

use picomq_client::Client;

use picomq_testkit as support;
use support::{Server, TempDir};

const FLAGS: &[&str] = &[
    "--store-error-rate",
    "0.1",
    "--tail-cache-bytes",
    "0",
    "--block-cache-bytes",
    "0",
    "--pack-delay",
    "300ms",
    "--dormancy",
    "200ms",
];

/// The streams, and what each should hold.
struct Model {
    streams: Vec<(String, bool, Vec<String>)>,
    producer_seq: Vec<u64>,
}

impl Model {
    fn new() -> Model {
        let streams = ["j0", "j1", "j2", "t0", "t1"]
            .iter()
            .map(|n| (format!("/cold/{n}"), n.starts_with('j'), Vec::new()))
            .collect();
        Model {
            streams,
            producer_seq: vec![0; 5],
        }
    }
}

/// A request retried through the store's injected failures (503).
async fn send_retrying(
    c: &Client,
    method: picomq_client::HttpMethod,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> picomq_client::Response {
    for _ in 0..200 {
        let r = c.send(method.clone(), path, headers, body.clone()).await;
        match r {
            Ok(r) if r.status.as_u16() != 503 => return r,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("{method} {path}: still failing after 200 tries");
}

async fn create_all(c: &Client, model: &Model) {
    for (path, json, _) in &model.streams {
        let ct = if *json {
            "application/json"
        } else {
            "text/plain"
        };
        let r = send_retrying(
            c,
            picomq_client::HttpMethod::PUT,
            path,
            &[("content-type", ct)],
            String::new(),
        )
        .await;
        assert!(r.status.is_success(), "create {path}: {}", r.text());
    }
}

/// `n` appends to every stream, each with a producer stamp so a retry after a
/// failure is never written twice.
async fn write_round(c: &Client, model: &mut Model, round: usize, n: usize) {
    for i in 0..n {
        for (s, (path, json, expected)) in model.streams.iter_mut().enumerate() {
            let body = if *json {
                format!("{{\"r\":{round},\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(60))
            } else {
                format!("r{round}-i{i}-{}\n", "y".repeat(60))
            };
            let seq = model.producer_seq[s].to_string();
            let ct = if *json {
                "application/json"
            } else {
                "text/plain"
            };
            let headers = [
                ("content-type", ct),
                ("producer-id", "cold-test"),
                ("producer-epoch", "0"),
                ("producer-seq", seq.as_str()),
            ];
            let r = send_retrying(
                c,
                picomq_client::HttpMethod::POST,
                path,
                &headers,
                body.clone(),
            )
            .await;
            assert!(r.status.is_success(), "append to {path}: {}", r.text());
            model.producer_seq[s] += 1;
            expected.push(body);
        }
    }
}

/// The whole stream from -1, through 503s and partial answers.
async fn read_back(c: &Client, path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = "-1".to_string();
    for _ in 0..100_000 {
        let r = c.get(&format!("{path}?offset={offset}")).await;
        let Ok(r) = r else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        match r.status.as_u16() {
            200 => {}
            503 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            other => panic!("read {path} at {offset}: {other} {}", r.text()),
        }
        out.push(r.body.to_vec());
        if r.header("stream-up-to-date") == Some("true") {
            return out.concat();
        }
        offset = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
    }
    panic!("read {path}: no end in sight");
}

/// JSON pages are arrays: join them into one list of messages.
fn messages(pages: &[u8]) -> Vec<String> {
    let text = String::from_utf8(pages.to_vec()).unwrap();
    let mut all = Vec::new();
    for page in text.split("][") {
        let page = format!("[{}]", page.trim_start_matches('[').trim_end_matches(']'));
        let values: Vec<serde_json::Value> = serde_json::from_str(&page).unwrap();
        all.extend(values.into_iter().map(|v| v.to_string()));
    }
    all
}

async fn check(c: &Client, model: &Model, when: &str) {
    for (path, json, expected) in &model.streams {
        let got = read_back(c, path).await;
        if *json {
            let want: Vec<String> = expected
                .iter()
                .map(|e| {
                    serde_json::from_str::<serde_json::Value>(e)
                        .unwrap()
                        .to_string()
                })
                .collect();
            assert_eq!(messages(&got), want, "{path} {when}");
        } else {
            assert_eq!(
                String::from_utf8(got).unwrap(),
                expected.concat(),
                "{path} {when}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recent_history_survives_kill_9_at_every_age() {
    let dir = TempDir::new("cold-reads");
    let mut server = Server::start_process(dir.path(), FLAGS).await;
    let mut model = Model::new();
    create_all(&server.client, &model).await;
    // Ages at the kill: nothing packed yet; L0 packed; L1 pieces (a second round
    // on top of the first); and the same again after the restart's warm-up.
    for (round, age) in [(0, 0), (1, 1_000), (2, 3_000), (3, 100), (4, 2_000)] {
        write_round(&server.client, &mut model, round, 40).await;
        tokio::time::sleep(Duration::from_millis(age)).await;
        server.kill9();
        server.restart().await;
        check(
            &server.client,
            &model,
            &format!("after round {round} (kill at {age} ms)"),
        )
        .await;
    }
    // A fork of a byte stream reads its source's packed history.
    let c = &server.client;
    let r = send_retrying(
        c,
        picomq_client::HttpMethod::PUT,
        "/cold/fork",
        &[("stream-forked-from", "/cold/t0")],
        String::new(),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let fork = read_back(c, "/cold/fork").await;
    assert_eq!(
        String::from_utf8(fork).unwrap(),
        model.streams[3].2.concat()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_between_a_packs_write_and_its_commit_loses_nothing() {
    let dir = TempDir::new("cold-reads-crash");
    // Without injected errors: the crash point must be reached by the first pack.
    let mut server = Server::start_process_env(
        dir.path(),
        &FLAGS[2..],
        &[("PICOMQ_FAILPOINTS", "pack-after-write")],
    )
    .await;
    let mut model = Model::new();
    create_all(&server.client, &model).await;
    write_round(&server.client, &mut model, 0, 20).await;
    // The first pack is written, then the process aborts before its relocations.
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "the failpoint should have aborted the server"
    );
    let mut server = Server::start_process(dir.path(), FLAGS).await;
    check(&server.client, &model, "after the crash").await;
    write_round(&server.client, &mut model, 1, 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await;
    check(&server.client, &model, "after packing again").await;
}

const WRITERS: usize = 8;

/// Creates `/load/s0..s7` (JSON) and appends to each without a pause, one append in
/// flight per stream, for at least 1.5 s and until the packer has written a pack and
/// `pack_bytes_min` bytes of packs (so L0 packs exist beside a tail only in the WAL,
/// however slow the machine); then stops the server (`kill` = kill -9, else SIGTERM)
/// with every writer's append in flight. Returns what each writer had acknowledged.
async fn load_then_stop(server: &mut Server, stop: &str, pack_bytes_min: f64) -> Vec<usize> {
    for w in 0..WRITERS {
        let r = server
            .client
            .put(
                &format!("/load/s{w}"),
                &[("content-type", "application/json")],
                "",
            )
            .await
            .expect("create");
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    }
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = server.client.clone();
            tokio::spawn(async move {
                // Acknowledged appends; the writer ends at its first failure
                // (the server went away: that append is in doubt).
                let mut acked = 0usize;
                loop {
                    let body =
                        format!("{{\"w\":{w},\"i\":{acked},\"pad\":\"{}\"}}", "p".repeat(60));
                    match c
                        .post(
                            &format!("/load/s{w}"),
                            &[("content-type", "application/json")],
                            body,
                        )
                        .await
                    {
                        Ok(r) if r.status.is_success() => acked += 1,
                        _ => break,
                    }
                }
                acked
            })
        })
        .collect();
    let started = std::time::Instant::now();
    support::eventually(Duration::from_secs(60), || async {
        let packs = support::metric(&server.client, "picomq_pack_objects_written_total").await;
        let bytes = support::metric(&server.client, "picomq_pack_bytes_written_total").await;
        (packs > 0.0
            && bytes >= pack_bytes_min
            && started.elapsed() >= Duration::from_millis(1_500))
        .then_some(())
    })
    .await;
    match stop {
        "kill" => server.kill9(),
        _ => {
            server.terminate(Duration::from_secs(30));
        }
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.expect("writer"));
    }
    assert!(
        acked.iter().all(|&n| n > 0),
        "every writer wrote: {acked:?}"
    );
    acked
}

/// Stream `w` of [`load_then_stop`] read from -1: exactly the records its writer had
/// acknowledged, in order, once each, plus the one in flight if it landed.
async fn check_load_stream(c: &Client, w: usize, acked: usize, what: &str) {
    let got: Vec<u64> = messages(&read_back(c, &format!("/load/s{w}")).await)
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(m).unwrap();
            assert_eq!(v["w"], w, "stream {w} holds another writer's record: {m}");
            v["i"].as_u64().unwrap()
        })
        .collect();
    let want: Vec<u64> = (0..acked as u64).collect();
    let with_doubt: Vec<u64> = (0..=acked as u64).collect();
    assert!(
        got == want || got == with_doubt,
        "{what}: stream {w} read {} records ({:?}..), acknowledged {acked}",
        got.len(),
        got.iter().take(3).collect::<Vec<_>>()
    );
}

/// Writers append without a pause (one append in flight each, eight streams) when
/// the server is stopped, by `kill -9` or SIGTERM; it restarts with the store failing
/// a tenth of its requests, and every stream is read from -1 at once, while the
/// warm-up races the first reads. Each stream holds exactly the records its writer
/// had acknowledged, in order, once each, plus the one in flight if it landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_under_load_reads_back_exactly_what_was_acknowledged() {
    for stop in ["kill", "term"] {
        let dir = TempDir::new(&format!("cold-reads-load-{stop}"));
        let mut server = Server::start_process(dir.path(), &["--pack-delay", "300ms"]).await;
        let acked = load_then_stop(&mut server, stop, 0.0).await;
        drop(server);
        let server = Server::start_process(
            dir.path(),
            &["--pack-delay", "300ms", "--store-error-rate", "0.1"],
        )
        .await;
        // Every stream at once, racing the warm-up.
        let reads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (c, n) = (server.client.clone(), acked[w]);
                tokio::spawn(async move { check_load_stream(&c, w, n, stop).await })
            })
            .collect();
        for read in reads {
            read.await.expect("reader");
        }
        // The warm-up read objects whose rows are not in byte order; nothing in the
        // background may have failed on that (a panicking task leaves no other trace).
        let log = server.log_text();
        assert!(!log.contains("panicked"), "{stop}: a task panicked:\n{log}");
    }
}

/// A kill under load leaves the last of the log only in WAL objects, one small chunk
/// per stream in each. The warm-up reads them back before the node is ready, however
/// much of the packer's buffer the packs before them fill: the reads that follow send
/// (almost) no store GETs. The warm-up used to stop at half the buffer's record
/// bytes, oldest packs first, so with a buffer smaller than the packs it never
/// reached those objects, and each reader paid a GET per WAL chunk (5,035 GETs for
/// 18,460 records in a release build). The buffer must still hold the unpacked
/// tail of the 300 ms pack delay: a buffer that sheds it leaves records in WAL
/// objects for compaction across the whole load, past the warm-up's window. At
/// 512 KiB of records it did on a host that acknowledged 28,000 appends/s here
/// (1,784-12,394 GETs), so the buffer holds twice what that host writes in 300 ms:
/// 2 MiB of these ~85-byte records, which with each append's bookkeeping (the
/// buffer's bound counts it, about 520 bytes an append) is 12 MiB. The load runs
/// until the packs written hold 4 MiB of records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_kill_under_load_the_warm_up_reads_back_the_unpacked_tail() {
    let dir = TempDir::new("cold-reads-warm-tail");
    const PACKED: f64 = (4 << 20) as f64;
    let flags = ["--pack-delay", "300ms", "--pack-buffer-bytes", "12MiB"];
    let mut server = Server::start_process(dir.path(), &flags).await;
    let acked = load_then_stop(&mut server, "kill", PACKED).await;
    drop(server);
    let server = Server::start_process(dir.path(), &flags).await;
    let before = gets(&server.client).await;
    for (w, &n) in acked.iter().enumerate() {
        check_load_stream(&server.client, w, n, "after the kill").await;
    }
    let during = gets(&server.client).await - before;
    let log = server.log_text();
    assert!(
        during <= 2.0,
        "reading back {} acknowledged records cost {during} store GETs; the warm-up left them to the readers:\n{log}",
        acked.iter().sum::<usize>()
    );
}

async fn gets(c: &Client) -> f64 {
    support::metric_where(c, "picomq_object_store_requests_total", "op=\"get\"").await
}
