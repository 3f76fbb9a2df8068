//! `picomq bench groups` and `picomq bench webhooks`: the consumer side.
//!
//! groups: acknowledged messages per second with N consumers of one group (the
//! stream filled first), then end-to-end latency from append to claim at a steady
//! rate; against a PicoMQ server and, with `--redis`, the same on Redis Streams
//! consumer groups (XREADGROUP + XACK; run Redis with appendfsync always).
//!
//! webhooks: webhook deliveries per second to a receiver in this process, with S
//! subscriptions on streams that are appended to all the time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use picomq_client::{Client, HttpMethod};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::resp::Redis;
use crate::BenchError;

#[derive(Args, Debug, Clone)]
pub struct GroupsArgs {
    /// The PicoMQ server.
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// Also run on Redis Streams at HOST:PORT.
    #[arg(long)]
    pub redis: Option<String>,
    /// Consumers of the group.
    #[arg(long, default_value_t = 16)]
    pub consumers: usize,
    /// Messages for the throughput phase.
    #[arg(long, default_value_t = 50_000)]
    pub messages: u64,
    /// Messages one claim (XREADGROUP COUNT) takes at most.
    #[arg(long, default_value_t = 10)]
    pub batch: usize,
    /// Appends per second in the latency phase.
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// How long the latency phase runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Bytes of payload per message (besides its timestamp).
    #[arg(long, default_value_t = 100)]
    pub payload: usize,
}

#[derive(Args, Debug, Clone)]
pub struct WebhooksArgs {
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// Subscriptions, each on a stream of its own.
    #[arg(long, default_value_t = 64)]
    pub subscriptions: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
}

fn now_us() -> u64 {
    // Latency across processes needs the wall clock of both ends (one machine).
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Request(e.to_string())
}

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];

async fn post(c: &Client, path: &str, body: String) -> Result<Value, BenchError> {
    let r = c.post(path, &JSON, body).await.map_err(err)?;
    if !r.status.is_success() {
        return Err(BenchError::Request(format!(
            "{path}: {} {}",
            r.status,
            r.text()
        )));
    }
    Ok(serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

fn percentile(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// What one system did: msgs/s acked, and latency p50/p99 in ms.
struct Figures {
    acked_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    latency_samples: u64,
}

pub async fn run_groups(a: GroupsArgs) -> Result<(), BenchError> {
    println!(
        "# consumer groups: {} consumers, {} messages, batch {}, latency at {}/s for {:?}",
        a.consumers, a.messages, a.batch, a.rate, a.duration
    );
    let p = picomq_groups(&a).await?;
    print_figures("picomq", &p);
    if let Some(addr) = &a.redis {
        let r = redis_groups(&a, addr).await?;
        print_figures("redis", &r);
        println!(
            "picomq/redis: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
            p.acked_per_s / r.acked_per_s,
            p.p50_ms / r.p50_ms,
            p.p99_ms / r.p99_ms
        );
    }
    Ok(())
}

fn print_figures(name: &str, f: &Figures) {
    println!(
        "{name}: {:.0} messages/s acknowledged; append-to-claim latency p50 {:.2} ms, p99 {:.2} ms ({} samples)",
        f.acked_per_s, f.p50_ms, f.p99_ms, f.latency_samples
    );
}

fn payload(n: usize) -> String {
    "x".repeat(n)
}

async fn picomq_groups(a: &GroupsArgs) -> Result<Figures, BenchError> {
    let c = Client::new(&a.url);
    let tag = fastrand::u32(..);
    let stream = format!("bench/groups-{tag}");
    let r = c
        .put(&format!("/{stream}"), &JSON, "[]")
        .await
        .map_err(err)?;
    if !r.status.is_success() {
        return Err(BenchError::Setup(format!("create {stream}: {}", r.text())));
    }
    let fill = payload(a.payload);
    let mut sent = 0;
    while sent < a.messages {
        let n = (a.messages - sent).min(500);
        let batch: Vec<Value> = (0..n).map(|_| json!({"t": 0, "p": fill})).collect();
        post(&c, &format!("/{stream}"), Value::Array(batch).to_string()).await?;
        sent += n;
    }
    let group = format!("bench-{tag}");
    let body = json!({"stream": stream, "maxDeliveries": 0, "leaseMs": 60_000});
    let r = c
        .put(
            &format!("/__picomq/groups/{group}"),
            &JSON,
            body.to_string(),
        )
        .await
        .map_err(err)?;
    if !r.status.is_success() {
        return Err(BenchError::Setup(format!("create group: {}", r.text())));
    }
    // Throughput: every consumer claims and acks until the stream is drained.
    let acked = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let (c, group, acked, total, batch) =
            (c.clone(), group.clone(), acked.clone(), a.messages, a.batch);
        tasks.push(tokio::spawn(async move {
            while acked.load(Ordering::Relaxed) < total {
                let claim = json!({"consumer": format!("c{i}"), "max": batch, "waitMs": 200});
                let v = post(
                    &c,
                    &format!("/__picomq/groups/{group}/claim"),
                    claim.to_string(),
                )
                .await?;
                let ids: Vec<Value> = v["messages"]
                    .as_array()
                    .map_or(Vec::new(), |m| m.iter().map(|m| m["id"].clone()).collect());
                if ids.is_empty() {
                    continue;
                }
                let n = ids.len() as u64;
                post(
                    &c,
                    &format!("/__picomq/groups/{group}/ack"),
                    json!({"ids": ids}).to_string(),
                )
                .await?;
                acked.fetch_add(n, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }));
    }
    for t in tasks {
        t.await.map_err(err)??;
    }
    let acked_per_s = a.messages as f64 / started.elapsed().as_secs_f64();

    // Latency: appends at a steady rate, each carrying its send time.
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let (c, group, hist, stop, batch) = (
            c.clone(),
            group.clone(),
            hist.clone(),
            stop.clone(),
            a.batch,
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let claim = json!({"consumer": format!("l{i}"), "max": batch, "waitMs": 500});
                let v = post(
                    &c,
                    &format!("/__picomq/groups/{group}/claim"),
                    claim.to_string(),
                )
                .await?;
                let got = now_us();
                let msgs = v["messages"].as_array().cloned().unwrap_or_default();
                let mut ids = Vec::new();
                for m in &msgs {
                    let t = m["body"]["t"].as_u64().unwrap_or(0);
                    if t > 0 {
                        let _ = hist.lock().expect("hist").record(got.saturating_sub(t));
                    }
                    ids.push(m["id"].clone());
                }
                if !ids.is_empty() {
                    post(
                        &c,
                        &format!("/__picomq/groups/{group}/ack"),
                        json!({"ids": ids}).to_string(),
                    )
                    .await?;
                }
            }
            Ok::<(), BenchError>(())
        }));
    }
    let interval = Duration::from_secs_f64(1.0 / a.rate.max(1) as f64);
    let end = Instant::now() + a.duration;
    let mut tick = tokio::time::interval(interval);
    while Instant::now() < end {
        tick.tick().await;
        let body = json!({"t": now_us(), "p": fill}).to_string();
        post(&c, &format!("/{stream}"), body).await?;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(err)??;
    }
    let _ = c.delete(&format!("/__picomq/groups/{group}")).await;
    let _ = c.delete(&format!("/{stream}")).await;
    let h = hist.lock().expect("hist");
    Ok(Figures {
        acked_per_s,
        p50_ms: percentile(&h, 0.5),
        p99_ms: percentile(&h, 0.99),
        latency_samples: h.len(),
    })
}

async fn redis_groups(a: &GroupsArgs, addr: &str) -> Result<Figures, BenchError> {
    let mut r = Redis::connect(addr).await.map_err(err)?;
    let key = format!("bench:groups:{}", fastrand::u32(..));
    let fill = payload(a.payload);
    r.call(&[
        b"XGROUP",
        b"CREATE",
        key.as_bytes(),
        b"g",
        b"0",
        b"MKSTREAM",
    ])
    .await
    .map_err(err)?;
    for _ in 0..a.messages {
        r.call(&[
            b"XADD",
            key.as_bytes(),
            b"*",
            b"t",
            b"0",
            b"p",
            fill.as_bytes(),
        ])
        .await
        .map_err(err)?;
    }
    let acked = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let (addr, key, acked, total, batch) = (
            addr.to_string(),
            key.clone(),
            acked.clone(),
            a.messages,
            a.batch,
        );
        tasks.push(tokio::spawn(async move {
            let mut r = Redis::connect(&addr).await.map_err(err)?;
            let name = format!("c{i}");
            let count = batch.to_string();
            while acked.load(Ordering::Relaxed) < total {
                let v = r
                    .call(&[
                        b"XREADGROUP",
                        b"GROUP",
                        b"g",
                        name.as_bytes(),
                        b"COUNT",
                        count.as_bytes(),
                        b"BLOCK",
                        b"200",
                        b"STREAMS",
                        key.as_bytes(),
                        b">",
                    ])
                    .await
                    .map_err(err)?;
                let ids = redis_ids(&v)
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect::<Vec<_>>();
                if ids.is_empty() {
                    continue;
                }
                let mut args: Vec<&[u8]> = vec![b"XACK", key.as_bytes(), b"g"];
                args.extend(ids.iter().map(|i| i.as_slice()));
                r.call(&args).await.map_err(err)?;
                acked.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }));
    }
    for t in tasks {
        t.await.map_err(err)??;
    }
    let acked_per_s = a.messages as f64 / started.elapsed().as_secs_f64();

    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let (addr, key, hist, stop, batch) = (
            addr.to_string(),
            key.clone(),
            hist.clone(),
            stop.clone(),
            a.batch,
        );
        tasks.push(tokio::spawn(async move {
            let mut r = Redis::connect(&addr).await.map_err(err)?;
            let name = format!("l{i}");
            let count = batch.to_string();
            while !stop.load(Ordering::Relaxed) {
                let v = r
                    .call(&[
                        b"XREADGROUP",
                        b"GROUP",
                        b"g",
                        name.as_bytes(),
                        b"COUNT",
                        count.as_bytes(),
                        b"BLOCK",
                        b"500",
                        b"STREAMS",
                        key.as_bytes(),
                        b">",
                    ])
                    .await
                    .map_err(err)?;
                let got = now_us();
                let entries = redis_ids(&v);
                if entries.is_empty() {
                    continue;
                }
                for (_, t) in &entries {
                    if *t > 0 {
                        let _ = hist.lock().expect("hist").record(got.saturating_sub(*t));
                    }
                }
                let mut args: Vec<&[u8]> = vec![b"XACK", key.as_bytes(), b"g"];
                args.extend(entries.iter().map(|(i, _)| i.as_slice()));
                r.call(&args).await.map_err(err)?;
            }
            Ok::<(), BenchError>(())
        }));
    }
    let interval = Duration::from_secs_f64(1.0 / a.rate.max(1) as f64);
    let end = Instant::now() + a.duration;
    let mut tick = tokio::time::interval(interval);
    while Instant::now() < end {
        tick.tick().await;
        let t = now_us().to_string();
        r.call(&[
            b"XADD",
            key.as_bytes(),
            b"*",
            b"t",
            t.as_bytes(),
            b"p",
            fill.as_bytes(),
        ])
        .await
        .map_err(err)?;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(err)??;
    }
    let _ = r.call(&[b"DEL", key.as_bytes()]).await;
    let h = hist.lock().expect("hist");
    Ok(Figures {
        acked_per_s,
        p50_ms: percentile(&h, 0.5),
        p99_ms: percentile(&h, 0.99),
        latency_samples: h.len(),
    })
}

/// `(id, t)` of every entry of an XREADGROUP reply.
fn redis_ids(v: &crate::resp::Value) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    for stream in v.items() {
        let Some(entries) = stream.items().get(1) else {
            continue;
        };
        for e in entries.items() {
            let items = e.items();
            let (Some(id), Some(fields)) = (items.first().and_then(|i| i.bytes()), items.get(1))
            else {
                continue;
            };
            let f = fields.items();
            let mut t = 0;
            for pair in f.chunks(2) {
                if pair.len() == 2 && pair[0].bytes() == Some(b"t") {
                    t = pair[1]
                        .bytes()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                }
            }
            out.push((id.to_vec(), t));
        }
    }
    out
}

/// A webhook receiver: answers every POST `{"done": true}` and counts them.
async fn receiver(count: Arc<AtomicU64>) -> std::io::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(8192);
                loop {
                    // Read a head, then the body its Content-Length says.
                    let head_end = loop {
                        if let Some(i) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 8192];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 8192];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + len);
                    count.fetch_add(1, Ordering::Relaxed);
                    let body = br#"{"done":true}"#;
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if sock.write_all(resp.as_bytes()).await.is_err()
                        || sock.write_all(body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

pub async fn run_webhooks(a: WebhooksArgs) -> Result<(), BenchError> {
    let c = Client::new(&a.url);
    let count = Arc::new(AtomicU64::new(0));
    let port = receiver(count.clone()).await.map_err(err)?;
    let tag = fastrand::u32(..);
    for i in 0..a.subscriptions {
        let stream = format!("bench/hooks-{tag}/{i}");
        c.put(&format!("/{stream}"), &JSON, "[]")
            .await
            .map_err(err)?;
        let sub = json!({"type": "webhook", "streams": [format!("hooks-{tag}/{i}")],
            "webhook": {"url": format!("http://127.0.0.1:{port}/hook")}});
        let r = c
            .send(
                HttpMethod::PUT,
                &format!("/bench/__ds/subscriptions/hooks-{tag}-{i}"),
                &JSON,
                Bytes::from(sub.to_string()),
            )
            .await
            .map_err(err)?;
        if !r.status.is_success() {
            return Err(BenchError::Setup(format!("subscription: {}", r.text())));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (c, stop, appended, subs) =
            (c.clone(), stop.clone(), appended.clone(), a.subscriptions);
        writers.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let stream = format!("/bench/hooks-{tag}/{}", i % subs);
                if c.post(&stream, &JSON, r#"{"e":1}"#).await.is_ok() {
                    appended.fetch_add(1, Ordering::Relaxed);
                }
                i += 4;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (c0, a0, t0) = (
        count.load(Ordering::Relaxed),
        appended.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(a.duration).await;
    let secs = t0.elapsed().as_secs_f64();
    let (c1, a1) = (
        count.load(Ordering::Relaxed),
        appended.load(Ordering::Relaxed),
    );
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    println!(
        "webhooks: {} subscriptions, {:.0} deliveries/s (signed, answered done), {:.0} appends/s to their streams, {:.1} appends per delivery",
        a.subscriptions,
        (c1 - c0) as f64 / secs,
        (a1 - a0) as f64 / secs,
        (a1 - a0) as f64 / (c1 - c0).max(1) as f64
    );
    for i in 0..a.subscriptions {
        let _ = c
            .delete(&format!("/bench/__ds/subscriptions/hooks-{tag}-{i}"))
            .await;
    }
    Ok(())
}
