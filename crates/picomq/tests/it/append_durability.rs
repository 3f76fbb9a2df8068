//! Acknowledged means durable: concurrent writers append while the server is killed
//! with SIGKILL at several points; after each restart every acknowledged append is
//! readable exactly once, in order, at the offset it was acknowledged with, and no
//! offset is ever reused.

use picomq_testkit as support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{read_all, Server, TempDir};

const STREAMS: usize = 4;
const WRITERS: usize = 8;

#[derive(Clone, Debug)]
struct Acked {
    stream: usize,
    payload: String,
    /// Stream-Next-Offset returned for this append, as a byte position.
    end: u64,
}

fn position(offset: &str) -> u64 {
    offset
        .split('_')
        .nth(1)
        .expect("offset has two fields")
        .parse()
        .expect("numeric offset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_loses_no_acknowledged_append() {
    let dir = TempDir::new("durability");
    let mut server = Server::start_process(dir.path(), &[]).await;
    for s in 0..STREAMS {
        let r = server
            .client
            .put(
                &format!("/v1/stream/dur-{s}"),
                &[("content-type", "text/plain")],
                "",
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 201);
    }
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let mut sent_total = 0usize;
    for (round, kill_after_ms) in [120u64, 350, 600, 900, 1300].into_iter().enumerate() {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let client = server.client.clone();
            let acked = acked.clone();
            writers.push(tokio::spawn(async move {
                let stream = w % STREAMS;
                let mut sent = 0;
                for i in 0.. {
                    let payload = format!("r{round}-w{w}-{i:06}\n");
                    sent += 1;
                    let r = client
                        .post(
                            &format!("/v1/stream/dur-{stream}"),
                            &[("content-type", "text/plain")],
                            payload.clone(),
                        )
                        .await;
                    match r {
                        Ok(r) if r.status.as_u16() == 204 => {
                            let end = position(
                                r.header("stream-next-offset").expect("offset on success"),
                            );
                            acked.lock().unwrap().push(Acked {
                                stream,
                                payload,
                                end,
                            });
                        }
                        // The server died under us: this append was never acknowledged.
                        _ => return sent,
                    }
                }
                sent
            }));
        }
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        server.kill9();
        for w in writers {
            sent_total += w.await.unwrap();
        }
        server.restart().await;
        let snapshot = acked.lock().unwrap().clone();
        verify(&server, &snapshot).await;
    }
    let n = acked.lock().unwrap().len();
    assert!(
        n > 500,
        "too few appends were acknowledged to prove anything ({n})"
    );
    eprintln!("{n} acknowledged of {sent_total} sent over 5 SIGKILLs: all present exactly once");
}

async fn verify(server: &Server, acked: &[Acked]) {
    let mut by_stream: HashMap<usize, Vec<&Acked>> = HashMap::new();
    for a in acked {
        by_stream.entry(a.stream).or_default().push(a);
    }
    for s in 0..STREAMS {
        let data = read_all(&server.client, &format!("/v1/stream/dur-{s}")).await;
        let text = String::from_utf8(data.clone()).expect("utf-8 payloads");
        // Every line appears once: nothing duplicated, acknowledged or not.
        let mut seen = HashSet::new();
        for line in text.lines() {
            assert!(seen.insert(line), "duplicate record {line:?} in stream {s}");
        }
        let mut last_i_per_writer: HashMap<String, usize> = HashMap::new();
        for line in text.lines() {
            let (prefix, i) = line.rsplit_once('-').expect("payload shape");
            let i: usize = i.parse().expect("index");
            if let Some(prev) = last_i_per_writer.insert(prefix.to_string(), i) {
                assert!(i > prev, "records of {prefix} out of order in stream {s}");
            }
        }
        for a in by_stream.get(&s).into_iter().flatten() {
            let end = a.end as usize;
            let start = end - a.payload.len();
            assert!(
                end <= data.len(),
                "acknowledged record {:?} at {end} missing (stream has {} bytes)",
                a.payload,
                data.len()
            );
            assert_eq!(
                &data[start..end],
                a.payload.as_bytes(),
                "offset {end} does not hold the acknowledged record"
            );
        }
    }
    // New appends get fresh offsets past everything acknowledged before.
    for s in 0..STREAMS {
        let before = by_stream
            .get(&s)
            .map_or(0, |v| v.iter().map(|a| a.end).max().unwrap_or(0));
        let r = server
            .client
            .post(
                &format!("/v1/stream/dur-{s}"),
                &[("content-type", "text/plain")],
                format!("probe-{s}-{before}\n"),
            )
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
        assert!(
            position(r.header("stream-next-offset").unwrap()) > before,
            "offset reused after restart"
        );
    }
}
