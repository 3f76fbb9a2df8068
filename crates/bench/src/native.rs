//! `picomq bench native`: PicoMQ's native record API against the Durable Streams
//! path, on one server (docs/native-api.md). Three parts:
//!
//! - appends: W writers, one stream each, native batches of N records against
//!   Durable Streams appends of the same records (a JSON array of N messages, or the
//!   lone message), for each record size;
//! - reads: a catch-up read of one stream, `records?seq=..&count=..` against
//!   `?offset=..`;
//! - seeks: a long stream filled by concurrent writers, then reads by time at random
//!   targets, each answer checked against what the fill's acknowledgements said.
//!
//! The append bodies are built once per case and sent as they are on both paths
//! through the low-level [`Client`]: the SDK builds each native body anew from
//! `serde_json` values, and on two shared cores that client work would be charged to
//! the native path. Everything else (creates, fills, reads, seeks) goes through the
//! SDK, as an application would. Exits non-zero on any failed request or wrong answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use picomq_client::{
    stream_path, Client, CreateOptions, DurableStream, NewRecord, Offset, PicoMq, ReadBounds,
    ReadFrom,
};
use serde::Deserialize;
use serde_json::json;

use crate::stats::{histogram, Recorder};
use crate::BenchError;

#[derive(Args, Debug, Clone)]
pub struct NativeArgs {
    /// The PicoMQ server.
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// The parts to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "appends,reads,seeks"
    )]
    pub parts: Vec<Part>,
    /// Concurrent writers of the append part, each on a stream of its own.
    #[arg(long, default_value_t = 16)]
    pub writers: usize,
    /// Body sizes of the append part, bytes per record.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    pub record_bytes: Vec<usize>,
    /// Records per request of the append part.
    #[arg(long, value_delimiter = ',', default_value = "1,100")]
    pub batch: Vec<usize>,
    /// Measured time of each append case (per size, batch and path).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Load before each case is measured.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Records of the stream the catch-up reads read.
    #[arg(long, default_value_t = 1_000_000)]
    pub read_records: u64,
    /// Body bytes per record of that stream.
    #[arg(long, default_value_t = 100)]
    pub read_record_bytes: usize,
    /// Records one native catch-up read asks for (`count`).
    #[arg(long, default_value_t = 1_000)]
    pub read_count: u32,
    /// Records of the stream the reads by time seek in.
    #[arg(long, default_value_t = 10_000_000)]
    pub seek_records: u64,
    /// Body bytes per record of that stream (at least its tag, ~20 bytes).
    #[arg(long, default_value_t = 32)]
    pub seek_record_bytes: usize,
    /// Concurrent writers filling a stream (both fills).
    #[arg(long, default_value_t = 4)]
    pub fill_writers: usize,
    /// Records per native append of the fills (at most 1,000).
    #[arg(long, default_value_t = 1_000)]
    pub fill_batch: usize,
    /// Reads by time per kind of read, at random targets over the whole stream.
    #[arg(long, default_value_t = 1_000)]
    pub seeks: usize,
    /// The server's process, to charge it CPU seconds per record (/proc).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    Appends,
    Reads,
    Seeks,
}

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const MIB: f64 = 1024.0 * 1024.0;

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Request(e.to_string())
}

/// Runs the parts asked for; `false` if a request failed or an answer was wrong.
pub async fn run_native(a: NativeArgs) -> Result<bool, BenchError> {
    check(&a)?;
    let mq = PicoMq::new(&a.url);
    let prefix = format!("bench/native-{:08x}", fastrand::u32(..));
    let cpu = ServerCpu(a.server_pid);
    let mut ok = true;
    if a.parts.contains(&Part::Appends) {
        ok &= appends(&a, &mq, &prefix, &cpu).await?;
    }
    if a.parts.contains(&Part::Reads) {
        ok &= reads(&a, &mq, &prefix, &cpu).await?;
    }
    if a.parts.contains(&Part::Seeks) {
        ok &= seeks(&a, &mq, &prefix, &cpu).await?;
    }
    println!("result: {}", if ok { "ok" } else { "FAILED" });
    Ok(ok)
}

fn check(a: &NativeArgs) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::Config(m.to_string()));
    if a.writers == 0 || a.fill_writers == 0 || a.seeks == 0 {
        return bad("--writers, --fill-writers and --seeks must be at least 1");
    }
    if a.batch
        .iter()
        .chain([&a.fill_batch])
        .any(|&n| n == 0 || n > 1_000)
    {
        return bad("--batch and --fill-batch take 1 to 1,000 records (the server's limit)");
    }
    if a.record_bytes.iter().any(|&n| n < 8) || a.read_record_bytes < 8 {
        return bad("records are JSON messages of at least 8 bytes");
    }
    if a.read_count == 0 || a.read_count > 1_000 {
        return bad("--read-count takes 1 to 1,000");
    }
    Ok(())
}

/// CPU seconds of the server process, when its pid is known.
struct ServerCpu(Option<u32>);

impl ServerCpu {
    fn now(&self) -> Option<f64> {
        crate::proc::sample(self.0?).map(|s| s.cpu_secs)
    }

    /// `, server N us CPU/{unit}` over `n` units between `before` and now.
    fn per(&self, before: Option<f64>, n: u64, unit: &str) -> String {
        match (before, self.now()) {
            (Some(b), Some(a)) if n > 0 => {
                format!(", server {:.2} us CPU/{unit}", (a - b) * 1e6 / n as f64)
            }
            _ => String::new(),
        }
    }
}

/// After a fill the server indexes and packs what it took; reads measured then
/// would share the cores with that. Waits (at most a minute) until the server uses
/// under a tenth of a core, and says how long that took.
async fn settle(cpu: &ServerCpu) {
    const STEP: Duration = Duration::from_millis(500);
    let started = Instant::now();
    let Some(mut last) = cpu.now() else {
        return;
    };
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(STEP).await;
        let Some(now) = cpu.now() else {
            return;
        };
        if now - last < 0.1 * STEP.as_secs_f64() {
            break;
        }
        last = now;
    }
    println!(
        "settled: the server was busy for {:.1} s after the fill",
        started.elapsed().as_secs_f64()
    );
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

async fn create(mq: &PicoMq, name: &str) -> Result<DurableStream, BenchError> {
    let s = mq.stream(name);
    s.create(CreateOptions::json())
        .await
        .map_err(|e| BenchError::Setup(format!("create {name}: {e}")))?;
    Ok(s)
}

// ---------------------------------------------------------------- appends

/// One append case on one path: what the writers send.
struct Case {
    path_name: &'static str,
    /// Request paths, one per writer.
    paths: Vec<String>,
    body: Bytes,
    records_per_request: u64,
    record_bytes: usize,
}

/// What a case measured.
struct Load {
    requests: u64,
    errors: u64,
    latency: Histogram<u64>,
    secs: f64,
}

/// A JSON message of exactly `n` bytes.
fn message(n: usize) -> String {
    format!("{{\"p\":\"{}\"}}", "x".repeat(n - 8))
}

async fn appends(
    a: &NativeArgs,
    mq: &PicoMq,
    prefix: &str,
    cpu: &ServerCpu,
) -> Result<bool, BenchError> {
    println!(
        "## appends: {} writers (one stream each), {:?} measured per case after {:?}; MiB/s of record bodies",
        a.writers, a.duration, a.warmup
    );
    let mut ok = true;
    for &size in &a.record_bytes {
        for &batch in &a.batch {
            let mut rates = Vec::new();
            for path_name in ["native", "ds"] {
                let name = format!("{prefix}/append-{size}x{batch}");
                let case = append_case(mq, &name, a.writers, (size, batch), path_name).await?;
                let before = cpu.now();
                let load = append_load(mq.client(), &case, a.warmup, a.duration).await;
                let records = load.requests * case.records_per_request;
                let cost = cpu.per(before, records, "record");
                print_load(&case, &load, &cost);
                ok &= load.errors == 0 && load.requests > 0;
                rates.push(records as f64 / load.secs);
            }
            println!(
                "  {size} B x {batch}: native/ds records/s {:.2}x",
                rates[0] / rates[1].max(f64::MIN_POSITIVE)
            );
        }
    }
    Ok(ok)
}

/// Creates the case's streams and builds its one body.
async fn append_case(
    mq: &PicoMq,
    name: &str,
    writers: usize,
    (size, batch): (usize, usize),
    path_name: &'static str,
) -> Result<Case, BenchError> {
    let native = path_name == "native";
    let msg = message(size);
    let body = if native {
        let records: Vec<_> = (0..batch).map(|_| json!({ "body": msg })).collect();
        json!({ "records": records }).to_string()
    } else if batch == 1 {
        msg
    } else {
        format!("[{}]", vec![msg; batch].join(","))
    };
    let mut paths = Vec::with_capacity(writers);
    for i in 0..writers {
        let name = format!("{name}-{path_name}-{i}");
        create(mq, &name).await?;
        paths.push(if native {
            format!("/__picomq/streams{}/records", stream_path(&name))
        } else {
            stream_path(&name)
        });
    }
    Ok(Case {
        path_name,
        paths,
        body: Bytes::from(body),
        records_per_request: batch as u64,
        record_bytes: size,
    })
}

/// Every writer sends the case's body back to back for the warm-up and the window;
/// a request counts if it was sent inside the window and answered before its end.
async fn append_load(client: &Client, case: &Case, warmup: Duration, duration: Duration) -> Load {
    let start = Instant::now() + warmup;
    let end = start + duration;
    let recorder = Arc::new(Recorder::default());
    let (requests, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for (i, path) in case.paths.iter().enumerate() {
        let (client, path, body) = (client.clone(), path.clone(), case.body.clone());
        let (recorder, requests, errors) = (recorder.clone(), requests.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let sent = Instant::now();
                if sent >= end {
                    return;
                }
                let r = client.post(&path, &JSON, body.clone()).await;
                let done = Instant::now();
                if !matches!(&r, Ok(r) if r.status.is_success()) {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if sent >= start && done <= end {
                    requests.fetch_add(1, Ordering::Relaxed);
                    recorder.record(i, (done - sent).as_micros() as u64);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Load {
        requests: requests.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        latency: recorder.merged(),
        secs: duration.as_secs_f64(),
    }
}

fn print_load(case: &Case, load: &Load, cost: &str) {
    let records = load.requests * case.records_per_request;
    let rate = records as f64 / load.secs;
    println!(
        "{:>5} B x {:>4} {:<6} {:>9.0} records/s {:>7.2} MiB/s  request p50 {:.2} ms p99 {:.2} ms  ({} requests of {:.1} KiB, {} errors{cost})",
        case.record_bytes,
        case.records_per_request,
        case.path_name,
        rate,
        rate * case.record_bytes as f64 / MIB,
        ms(&load.latency, 0.5),
        ms(&load.latency, 0.99),
        load.requests,
        case.body.len() as f64 / 1024.0,
        load.errors,
    );
}

// ---------------------------------------------------------------- fills

/// What identifies a record of a fill: its writer, the writer's append, its index
/// in that append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
struct Tag {
    w: u64,
    k: u64,
    i: u64,
}

/// One acknowledged append of a fill.
#[derive(Clone, Copy, Debug)]
struct Acked {
    first_seq: u64,
    last_seq: u64,
    ts: u64,
    /// The tag of its first record (`i` = 0).
    tag: Tag,
}

fn tagged(tag: Tag, size: usize) -> String {
    let head = format!("{{\"w\":{},\"k\":{},\"i\":{},\"p\":\"", tag.w, tag.k, tag.i);
    format!(
        "{head}{}\"}}",
        "x".repeat(size.saturating_sub(head.len() + 2))
    )
}

/// Fills `stream` with `records` tagged records through the SDK: `writers` appenders,
/// `batch` records per append. Returns every acknowledgement, in sequence order.
async fn fill(
    stream: &DurableStream,
    records: u64,
    writers: usize,
    batch: usize,
    size: usize,
) -> Result<Vec<Acked>, BenchError> {
    let claimed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..writers as u64 {
        let (stream, claimed) = (stream.clone(), claimed.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for k in 0.. {
                let from = claimed.fetch_add(batch as u64, Ordering::Relaxed);
                if from >= records {
                    break;
                }
                let n = (records - from).min(batch as u64);
                let batch: Vec<NewRecord> = (0..n)
                    .map(|i| NewRecord::text(tagged(Tag { w, k, i }, size)))
                    .collect();
                let ack = stream.append_records(&batch, None).await.map_err(err)?;
                let (Some(first_seq), Some(last_seq), Some(ts)) =
                    (ack.first_seq, ack.last_seq, ack.first_timestamp)
                else {
                    return Err(BenchError::Request(format!("append answered {ack:?}")));
                };
                let tag = Tag { w, k, i: 0 };
                acked.push(Acked {
                    first_seq,
                    last_seq,
                    ts,
                    tag,
                });
            }
            Ok::<_, BenchError>(acked)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(err)??);
    }
    all.sort_by_key(|a| a.first_seq);
    Ok(all)
}

/// The acknowledgements tile the stream from 0 without gaps and their times never
/// decrease along it: what the seek answers are checked against.
fn check_fill(acked: &[Acked], records: u64) -> Result<(), String> {
    let mut next = 0;
    let mut ts = 0;
    for a in acked {
        if a.first_seq != next || a.last_seq < a.first_seq {
            return Err(format!(
                "append at {} after {next}: gap or overlap",
                a.first_seq
            ));
        }
        if a.ts < ts {
            return Err(format!("timestamp went back at record {}", a.first_seq));
        }
        (next, ts) = (a.last_seq + 1, a.ts);
    }
    if next != records {
        return Err(format!("{next} records acknowledged, {records} sent"));
    }
    Ok(())
}

async fn filled(
    a: &NativeArgs,
    mq: &PicoMq,
    name: &str,
    records: u64,
    size: usize,
) -> Result<(DurableStream, Vec<Acked>), BenchError> {
    let stream = create(mq, name).await?;
    let started = Instant::now();
    let acked = fill(&stream, records, a.fill_writers, a.fill_batch, size).await?;
    let secs = started.elapsed().as_secs_f64();
    check_fill(&acked, records).map_err(|e| BenchError::Setup(format!("fill of {name}: {e}")))?;
    let mut stamps: Vec<u64> = acked.iter().map(|a| a.ts).collect();
    stamps.dedup();
    let span_s = match (acked.first(), acked.last()) {
        (Some(f), Some(l)) => (l.ts - f.ts) as f64 / 1000.0,
        _ => 0.0,
    };
    println!(
        "fill: {records} records of {size} B in {secs:.1} s: {:.0} records/s, {:.2} MiB/s ({} writers, {} appends of {}, {} distinct timestamps over {span_s:.1} s)",
        records as f64 / secs,
        records as f64 * size as f64 / MIB / secs,
        a.fill_writers,
        acked.len(),
        a.fill_batch,
        stamps.len(),
    );
    Ok((stream, acked))
}

// ---------------------------------------------------------------- reads

/// What one catch-up read of the whole stream measured.
struct Scan {
    records: u64,
    body_bytes: u64,
    answer_bytes: u64,
    requests: u64,
    latency: Histogram<u64>,
    secs: f64,
}

async fn reads(
    a: &NativeArgs,
    mq: &PicoMq,
    prefix: &str,
    cpu: &ServerCpu,
) -> Result<bool, BenchError> {
    println!(
        "## catch-up reads: one reader, one stream of {} records of {} B; the SDK decodes every answer",
        a.read_records, a.read_record_bytes
    );
    let name = format!("{prefix}/reads");
    let (stream, _) = filled(a, mq, &name, a.read_records, a.read_record_bytes).await?;
    settle(cpu).await;
    let before = cpu.now();
    let native = scan_native(&stream, a.read_count).await?;
    print_scan(
        &format!("native count={}", a.read_count),
        &native,
        &cpu.per(before, native.records, "record"),
    );
    let before = cpu.now();
    let ds = scan_ds(&stream).await?;
    print_scan("ds offset", &ds, &cpu.per(before, ds.records, "record"));
    println!(
        "  native/ds records/s {:.2}x",
        (native.records as f64 / native.secs) / (ds.records as f64 / ds.secs)
    );
    let complete = native.records == a.read_records && ds.records == a.read_records;
    if !complete {
        println!(
            "  INCOMPLETE: native read {}, ds read {}, {} written",
            native.records, ds.records, a.read_records
        );
    }
    Ok(complete)
}

async fn scan_native(stream: &DurableStream, count: u32) -> Result<Scan, BenchError> {
    let mut scan = Scan::new();
    let started = Instant::now();
    let mut from = 0;
    loop {
        let sent = Instant::now();
        let batch = stream
            .read_records(&ReadFrom::Seq(from), &ReadBounds::count(count))
            .await
            .map_err(err)?;
        scan.latency
            .saturating_record(sent.elapsed().as_micros() as u64);
        scan.requests += 1;
        scan.records += batch.records.len() as u64;
        scan.body_bytes += batch
            .records
            .iter()
            .map(|r| r.body.len() as u64)
            .sum::<u64>();
        if batch.up_to_date || batch.next_seq == from {
            break;
        }
        from = batch.next_seq;
    }
    scan.secs = started.elapsed().as_secs_f64();
    Ok(scan)
}

async fn scan_ds(stream: &DurableStream) -> Result<Scan, BenchError> {
    let mut scan = Scan::new();
    let started = Instant::now();
    let mut offset = Offset::start();
    loop {
        let sent = Instant::now();
        let chunk = stream.read(&offset).await.map_err(err)?;
        scan.latency
            .saturating_record(sent.elapsed().as_micros() as u64);
        let n = chunk
            .messages::<serde::de::IgnoredAny>()
            .map_err(err)?
            .len() as u64;
        scan.requests += 1;
        scan.records += n;
        scan.answer_bytes += chunk.data.len() as u64;
        // `[m,m,...]`: the brackets and the commas are not record bytes.
        scan.body_bytes += (chunk.data.len() as u64).saturating_sub(n + 1);
        if chunk.up_to_date || chunk.next_offset == offset {
            break;
        }
        offset = chunk.next_offset;
    }
    scan.secs = started.elapsed().as_secs_f64();
    Ok(scan)
}

impl Scan {
    fn new() -> Scan {
        Scan {
            records: 0,
            body_bytes: 0,
            answer_bytes: 0,
            requests: 0,
            latency: histogram(),
            secs: 0.0,
        }
    }
}

fn print_scan(name: &str, s: &Scan, cost: &str) {
    let answer = if s.answer_bytes > 0 {
        format!(
            ", {:.0} KiB per answer",
            s.answer_bytes as f64 / 1024.0 / s.requests.max(1) as f64
        )
    } else {
        String::new()
    };
    println!(
        "{name:<18} {:>9.0} records/s {:>7.2} MiB/s  request p50 {:.2} ms p99 {:.2} ms max {:.2} ms  ({} requests, {:.0} records each{answer}{cost})",
        s.records as f64 / s.secs,
        s.body_bytes as f64 / MIB / s.secs,
        ms(&s.latency, 0.5),
        ms(&s.latency, 0.99),
        s.latency.max() as f64 / 1000.0,
        s.requests,
        s.records as f64 / s.requests.max(1) as f64,
    );
}

// ---------------------------------------------------------------- seeks

/// The reads by time, each kind measured on targets of its own.
#[derive(Clone, Copy)]
enum SeekKind {
    /// `records?timestamp=T&count=1` (the server reads up to its default 1 MiB).
    Native,
    /// The same with `bytes=1`: the smallest read that returns the record.
    NativeSmall,
    /// Durable Streams `GET /{s}?timestamp=T`: the whole answer (up to the server's
    /// read size).
    Ds,
}

impl SeekKind {
    fn name(self) -> &'static str {
        match self {
            SeekKind::Native => "native count=1",
            SeekKind::NativeSmall => "native count=1 bytes=1",
            SeekKind::Ds => "ds timestamp",
        }
    }
}

/// What one kind of seek measured.
struct Seeks {
    latency: Histogram<u64>,
    /// Durable Streams only: until the answer's head.
    head: Histogram<u64>,
    answer_bytes: u64,
    mismatches: u64,
    /// The slowest: (ms, target, the target's place along the stream 0..1).
    slowest: Vec<(f64, u64, f64)>,
    /// Native reads found right: (sequence number, target), for [`check_previous`].
    found: Vec<(u64, u64)>,
}

async fn seeks(
    a: &NativeArgs,
    mq: &PicoMq,
    prefix: &str,
    cpu: &ServerCpu,
) -> Result<bool, BenchError> {
    println!(
        "## reads by time: one stream of {} records, {} random targets per kind, one read at a time; each answer checked against the fill's acknowledgements",
        a.seek_records, a.seeks
    );
    let name = format!("{prefix}/seek");
    let (stream, acked) = filled(a, mq, &name, a.seek_records, a.seek_record_bytes).await?;
    settle(cpu).await;
    let mut ok = true;
    for (i, kind) in [SeekKind::Native, SeekKind::NativeSmall, SeekKind::Ds]
        .into_iter()
        .enumerate()
    {
        let mut rng = fastrand::Rng::with_seed(0x5eed + i as u64);
        let before = cpu.now();
        let mut s = seek_all(mq, &stream, &acked, kind, a.seeks, &mut rng).await?;
        let cost = cpu.per(before, a.seeks as u64, "read");
        s.mismatches += check_previous(&stream, &s.found).await?;
        print_seeks(kind, &s, a.seeks, &cost);
        ok &= s.mismatches == 0;
    }
    Ok(ok)
}

async fn seek_all(
    mq: &PicoMq,
    stream: &DurableStream,
    acked: &[Acked],
    kind: SeekKind,
    n: usize,
    rng: &mut fastrand::Rng,
) -> Result<Seeks, BenchError> {
    let (first, last) = match (acked.first(), acked.last()) {
        (Some(f), Some(l)) => (f.ts, l.ts),
        _ => return Err(BenchError::Setup("the seek stream is empty".into())),
    };
    let mut s = Seeks {
        latency: histogram(),
        head: histogram(),
        answer_bytes: 0,
        mismatches: 0,
        slowest: Vec::new(),
        found: Vec::new(),
    };
    let path = stream_path(stream.name());
    for _ in 0..n {
        let target = rng.u64(first..=last);
        // The first append at or after the target: times never decrease along the
        // stream, so the acknowledgements are sorted by time too.
        let expect = acked[acked.partition_point(|a| a.ts < target)];
        let (us, right) = match kind {
            SeekKind::Native | SeekKind::NativeSmall => {
                let (us, right) = seek_native(stream, kind, target, &expect).await?;
                if right {
                    s.found.push((expect.first_seq, target));
                }
                (us, right)
            }
            SeekKind::Ds => {
                let (us, head_us, bytes, right) =
                    seek_ds(mq.client(), &path, target, &expect).await?;
                s.head.saturating_record(head_us);
                s.answer_bytes += bytes;
                (us, right)
            }
        };
        s.latency.saturating_record(us);
        s.mismatches += u64::from(!right);
        let place = (target - first) as f64 / (last - first).max(1) as f64;
        s.slowest.push((us as f64 / 1000.0, target, place));
        s.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
        s.slowest.truncate(3);
    }
    Ok(s)
}

/// A native read by time: (microseconds, whether the answer is the expected record
/// and at or after the target).
async fn seek_native(
    stream: &DurableStream,
    kind: SeekKind,
    target: u64,
    expect: &Acked,
) -> Result<(u64, bool), BenchError> {
    let bounds = ReadBounds {
        count: Some(1),
        bytes: matches!(kind, SeekKind::NativeSmall).then_some(1),
        until_ms: None,
    };
    let sent = Instant::now();
    let batch = stream
        .read_records(&ReadFrom::Timestamp(target), &bounds)
        .await
        .map_err(err)?;
    let us = sent.elapsed().as_micros() as u64;
    let Some(r) = batch.records.first() else {
        return Ok((us, false));
    };
    let right = batch.records.len() == 1
        && r.seq == expect.first_seq
        && r.timestamp >= target
        && r.json::<Tag>().ok() == Some(expect.tag);
    Ok((us, right))
}

/// How many of the records found at `(seq, target)` have a predecessor that is not
/// earlier than the target (read after the timing, so its cost is not counted).
async fn check_previous(stream: &DurableStream, found: &[(u64, u64)]) -> Result<u64, BenchError> {
    let mut wrong = 0;
    for &(seq, target) in found.iter().filter(|(seq, _)| *seq > 0) {
        let before = stream
            .read_records(&ReadFrom::Seq(seq - 1), &ReadBounds::count(1))
            .await
            .map_err(err)?;
        wrong += u64::from(before.records.first().is_none_or(|b| b.timestamp >= target));
    }
    Ok(wrong)
}

/// A Durable Streams read by time through the low-level client, to time its head
/// apart from its whole answer: (microseconds to the whole answer, to the head, the
/// answer's bytes, whether its first message is the expected record's).
async fn seek_ds(
    client: &Client,
    path: &str,
    target: u64,
    expect: &Acked,
) -> Result<(u64, u64, u64, bool), BenchError> {
    let sent = Instant::now();
    let mut r = client
        .open(
            picomq_client::HttpMethod::GET,
            &format!("{path}?timestamp={target}"),
            &[],
            Bytes::new(),
        )
        .await
        .map_err(err)?;
    let head_us = sent.elapsed().as_micros() as u64;
    let mut body = Vec::new();
    while let Some(chunk) = r.next_chunk().await {
        body.extend_from_slice(&chunk.map_err(err)?);
    }
    let us = sent.elapsed().as_micros() as u64;
    if !r.status.is_success() {
        return Err(BenchError::Request(format!(
            "GET {path}?timestamp={target}: {}",
            r.status
        )));
    }
    // `[first,...]`: only the first message is decoded.
    let first = body
        .strip_prefix(b"[")
        .and_then(|rest| {
            serde_json::Deserializer::from_slice(rest)
                .into_iter::<Tag>()
                .next()
        })
        .and_then(Result::ok);
    Ok((us, head_us, body.len() as u64, first == Some(expect.tag)))
}

fn print_seeks(kind: SeekKind, s: &Seeks, n: usize, cost: &str) {
    let h = &s.latency;
    let ds = if matches!(kind, SeekKind::Ds) {
        format!(
            "; head p50 {:.2} ms p99 {:.2} ms; {:.0} KiB per answer",
            ms(&s.head, 0.5),
            ms(&s.head, 0.99),
            s.answer_bytes as f64 / 1024.0 / n as f64
        )
    } else {
        String::new()
    };
    println!(
        "{:<22} p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms max {:.2} ms mean {:.2} ms; {} mismatches of {n}{ds}{cost}",
        kind.name(),
        ms(h, 0.5),
        ms(h, 0.9),
        ms(h, 0.99),
        h.max() as f64 / 1000.0,
        h.mean() / 1000.0,
        s.mismatches,
    );
    let slowest: Vec<String> = s
        .slowest
        .iter()
        .map(|(ms, t, place)| format!("{ms:.2} ms at T={t} ({:.0}% along)", place * 100.0))
        .collect();
    println!("  slowest: {}", slowest.join(", "));
}
