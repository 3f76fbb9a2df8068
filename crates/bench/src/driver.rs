//! The append workload: create the streams, start live readers, run the writers
//! through warm-up and the measured window (closed loop, or open loop at --rate),
//! then catch-up reads; sample the server (/metrics, /proc) at the window's edges.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::{Method, Uri};
use tokio::sync::{watch, Mutex};

use crate::config::{Live, Workload};
use crate::conn::{Conn, Target};
use crate::h1::H1;
use crate::h2c::H2;
use crate::live::{encode_query, Reader};
use crate::pacer::{due_at, Pacer};
use crate::payload::{now_us, origin, scan, BodyTemplate};
use crate::progress::Progress;
use crate::report::{mb, AppendReport, CatchUpReport, EndToEndReport, Latency, Report};
use crate::server_metrics::{self, Scrape, Scraper};
use crate::stats::Stats;
use crate::{proc, BenchError};

/// How long writers still waiting for an answer when the run ends are given.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stream creation retries 503 answers (a server recovering or busy).
const CREATE_RETRY_FOR: Duration = Duration::from_secs(30);
/// After the last append, how long live readers get to receive what was acked.
const LIVE_DRAIN_MAX: Duration = Duration::from_secs(5);

/// The measured window on the [`now_us`] clock; unset (empty) until the writers start.
pub struct Window {
    from_us: AtomicU64,
    to_us: AtomicU64,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            from_us: AtomicU64::new(u64::MAX),
            to_us: AtomicU64::new(u64::MAX),
        }
    }
}

impl Window {
    pub fn bounds(&self) -> (u64, u64) {
        (
            self.from_us.load(Ordering::Relaxed),
            self.to_us.load(Ordering::Relaxed),
        )
    }
    pub fn set(&self, from_us: u64, to_us: u64) {
        self.to_us.store(to_us, Ordering::Relaxed);
        self.from_us.store(from_us, Ordering::Relaxed);
    }
}

pub fn sleep_until_us(at_us: u64) -> tokio::time::Sleep {
    tokio::time::sleep_until(tokio::time::Instant::from_std(
        origin() + Duration::from_micros(at_us),
    ))
}

/// A writer's way to the server: its own HTTP/1.1 connection or a turn on a shared
/// one (see h1.rs for why not hyper), or a handle on a multiplexed HTTP/2 connection.
enum Lane {
    H1(H1),
    SharedH1(Arc<Mutex<H1>>),
    H2(H2),
}

impl Lane {
    /// Has no deadline of its own: a writer still waiting when the run ends is
    /// given [`REQUEST_TIMEOUT`] and then abandoned (see [`join_writers`]). A timer
    /// per request cost the client ~1 us of CPU per append.
    async fn post(&mut self, to: &Dest, ct: &HeaderValue, body: Bytes) -> Result<u16, BenchError> {
        match self {
            Lane::H1(c) => c.post(&to.path, ct_str(ct), &body).await,
            Lane::SharedH1(c) => c.lock().await.post(&to.path, ct_str(ct), &body).await,
            Lane::H2(c) => c.post(&to.uri, ct, body).await,
        }
    }
}

fn ct_str(ct: &HeaderValue) -> &str {
    // Checked when the workload was built (`--content-type` must be a valid header).
    ct.to_str().unwrap_or("application/octet-stream")
}

/// Makes one lane per writer: its own connection where there are as many
/// connections as writers, else a share of `connections` connections.
async fn lanes(w: &Workload, target: &Target) -> Result<Vec<Lane>, BenchError> {
    if w.http2 {
        let mut conns = Vec::with_capacity(w.connections);
        for _ in 0..w.connections {
            conns.push(H2::connect(target.addr).await?);
        }
        return Ok((0..w.in_flight)
            .map(|i| Lane::H2(conns[i % conns.len()].share()))
            .collect());
    }
    let mut conns = Vec::with_capacity(w.connections);
    for _ in 0..w.connections {
        let mut c = H1::new(target.addr, &target.authority);
        c.establish().await?;
        conns.push(c);
    }
    if w.connections == w.in_flight {
        return Ok(conns.into_iter().map(Lane::H1).collect());
    }
    let shared: Vec<Arc<Mutex<H1>>> = conns.into_iter().map(|c| Arc::new(Mutex::new(c))).collect();
    Ok((0..w.in_flight)
        .map(|i| Lane::SharedH1(shared[i % shared.len()].clone()))
        .collect())
}

/// Runs `n` tasks over `items`, `f(task, item)` each, at most `concurrency` at once.
pub async fn for_each_concurrent<F, Fut>(items: usize, concurrency: usize, f: F)
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let f = Arc::new(f);
    let mut tasks = Vec::new();
    for task in 0..concurrency.clamp(1, items.max(1)) {
        let next = next.clone();
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items {
                    break;
                }
                f(task, i).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Creates the bench streams; returns the `Server` header of the first answer.
pub async fn create_streams(w: &Workload, target: &Target) -> Result<Option<String>, BenchError> {
    let ct = HeaderValue::from_str(&w.content_type)
        .map_err(|_| BenchError::Config("--content-type is not a valid header".into()))?;
    let failures = Arc::new(crate::stats::Errors::default());
    let server = Arc::new(std::sync::Mutex::new(None::<String>));
    {
        let (failures, server, target, ct) = (failures.clone(), server.clone(), target.clone(), ct);
        let paths: Arc<Vec<String>> = Arc::new((0..w.streams).map(|i| w.stream_path(i)).collect());
        let conns: Arc<Vec<Mutex<Conn>>> =
            Arc::new((0..64).map(|_| Mutex::new(target.conn())).collect());
        for_each_concurrent(w.streams, 64, move |task, i| {
            let (failures, server, paths, conns, ct) = (
                failures.clone(),
                server.clone(),
                paths.clone(),
                conns.clone(),
                ct.clone(),
            );
            async move {
                let mut conn = conns[task].lock().await;
                // A server still starting (or shedding load) answers 503: give it
                // up to CREATE_RETRY_FOR before counting a failure.
                let mut answer = conn
                    .send(Method::PUT, &paths[i], Some(&ct), &[], Bytes::new())
                    .await;
                let give_up = now_us() + CREATE_RETRY_FOR.as_micros() as u64;
                while matches!(&answer, Ok(a) if a.status.as_u16() == 503) && now_us() < give_up {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    answer = conn
                        .send(Method::PUT, &paths[i], Some(&ct), &[], Bytes::new())
                        .await;
                }
                match answer {
                    Ok(a) if a.status.is_success() => {
                        if let Some(s) = a.header("server") {
                            server
                                .lock()
                                .expect("server lock")
                                .get_or_insert(s.to_string());
                        }
                    }
                    Ok(a) => failures.add(&format!(
                        "status {}: {}",
                        a.status.as_u16(),
                        String::from_utf8_lossy(&a.body)
                    )),
                    Err(e) => failures.add(&e.to_string()),
                }
            }
        })
        .await;
    }
    if failures.total() > 0 {
        return Err(BenchError::Setup(format!(
            "creating {} streams under {}{} failed {} times: {:?}",
            w.streams,
            w.origin,
            w.base_path,
            failures.total(),
            failures.kinds()
        )));
    }
    let server = server.lock().expect("server lock").clone();
    Ok(server)
}

/// Where a writer's request goes: the path (HTTP/1.1 request line) and the absolute
/// URI (HTTP/2's pseudo-headers), both made once per stream.
struct Dest {
    path: String,
    uri: Uri,
}

struct Ctx {
    dests: Vec<Dest>,
    ct: HeaderValue,
    template: BodyTemplate,
    stats: Arc<Stats>,
    window: Arc<Window>,
    next_request: AtomicU64,
    start_us: u64,
    end_us: u64,
    /// Requests per second (open loop), from --rate in records.
    requests_per_s: Option<f64>,
    /// Releases the open-loop requests on schedule (with --rate).
    pacer: Option<Pacer>,
    /// Requests each writer may keep for --trace (0 = no trace).
    trace_rows: usize,
}

/// Rows --trace keeps at most, over all writers (~24 bytes each).
const TRACE_ROWS_MAX: usize = 8_000_000;

/// One request, for --trace: when it was due, sent and acknowledged ([`now_us`]
/// clock), and its status (0: no answer).
#[derive(Clone, Copy)]
struct TraceRow {
    due_us: u64,
    sent_us: u64,
    acked_us: u64,
    status: u16,
}

async fn writer(ctx: Arc<Ctx>, task: usize, mut lane: Lane) -> Vec<TraceRow> {
    let mut trace = Vec::new();
    let (from_us, to_us) = ctx.window.bounds();
    let records = ctx.template.records() as u64;
    let bytes = ctx.template.len() as u64;
    loop {
        // Open loop: a permit first, then the request number, so the numbered
        // request is always due (see pacer.rs).
        if let Some(pacer) = &ctx.pacer {
            if !pacer.next().await {
                break;
            }
        }
        let k = ctx.next_request.fetch_add(1, Ordering::Relaxed);
        let scheduled_us = match ctx.requests_per_s {
            Some(rps) => due_at(ctx.start_us, k, rps),
            None => now_us(),
        };
        // A server slower than --rate leaves a backlog of scheduled sends; the run
        // still ends on time (what was never sent shows as a lower achieved rate).
        if scheduled_us >= ctx.end_us || now_us() >= ctx.end_us {
            break;
        }
        let dest = &ctx.dests[(k % ctx.dests.len() as u64) as usize];
        // Records carry the instant they were due, so end-to-end latency counts from
        // the same start as the acknowledgement: under --rate, time a record waited in
        // the client for an in-flight slot behind a slow server is charged to it too.
        let body = ctx.template.render(scheduled_us);
        let sent_us = now_us();
        let result = lane.post(dest, &ctx.ct, body).await;
        let acked_us = now_us();
        if trace.len() < ctx.trace_rows {
            trace.push(TraceRow {
                due_us: scheduled_us,
                sent_us,
                acked_us,
                status: *result.as_ref().unwrap_or(&0),
            });
        }
        match result {
            Ok(status) if (200..300).contains(&status) => {
                ctx.stats
                    .acked_records
                    .fetch_add(records, Ordering::Relaxed);
                if acked_us >= from_us && acked_us < to_us {
                    ctx.stats.window_requests.fetch_add(1, Ordering::Relaxed);
                    ctx.stats
                        .window_records
                        .fetch_add(records, Ordering::Relaxed);
                    ctx.stats.window_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                if scheduled_us >= from_us {
                    ctx.stats.ack.record(task, acked_us - scheduled_us);
                    if ctx.pacer.is_some() {
                        let sent_us = sent_us.max(scheduled_us);
                        ctx.stats.send_lag.record(task, sent_us - scheduled_us);
                        ctx.stats.from_send.record(task, acked_us - sent_us);
                    }
                }
            }
            Ok(status) => {
                ctx.stats.errors.add(&format!("status {status}"));
                if status == 429 || status == 503 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Err(e) => {
                ctx.stats.errors.add(&e.to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    trace
}

/// Waits for the writers to finish their last requests, at most [`REQUEST_TIMEOUT`]
/// past the run's end; a writer still waiting then is abandoned and its request
/// counted as an error. Returns the writers' trace rows and whether any writer filled
/// its share of them.
async fn join_writers(
    writers: Vec<tokio::task::JoinHandle<Vec<TraceRow>>>,
    ctx: &Ctx,
) -> (Vec<TraceRow>, bool) {
    let give_up = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    let mut trace = Vec::new();
    let mut truncated = false;
    for mut t in writers {
        match tokio::time::timeout_at(give_up, &mut t).await {
            Ok(Ok(rows)) => {
                truncated |= ctx.trace_rows > 0 && rows.len() == ctx.trace_rows;
                trace.extend(rows);
            }
            Ok(Err(_)) => {}
            Err(_) => {
                t.abort();
                ctx.stats.errors.add(&format!(
                    "timeout (no answer {}s after the run ended)",
                    REQUEST_TIMEOUT.as_secs()
                ));
            }
        }
    }
    (trace, truncated)
}

/// Writes --trace: a header naming the columns, the measured window and where the
/// run's clock starts on CLOCK_MONOTONIC (what `perf record -k CLOCK_MONOTONIC`
/// stamps events with), then one line per request in the order they were due.
fn write_trace(
    path: &std::path::Path,
    mut rows: Vec<TraceRow>,
    window: (u64, u64),
    truncated: bool,
) -> Result<(), BenchError> {
    use std::io::Write;
    rows.sort_unstable_by_key(|r| r.due_us);
    let fail = |e: std::io::Error| BenchError::Report(format!("--trace {}: {e}", path.display()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(fail)?);
    writeln!(
        out,
        "# picomq bench --trace: due_us sent_us acked_us status (us on the run's clock; \
         status 0 = no answer)"
    )
    .map_err(fail)?;
    writeln!(out, "# window_us {} {}", window.0, window.1).map_err(fail)?;
    writeln!(
        out,
        "# clock_monotonic_us_at_zero {}",
        monotonic_us() - now_us()
    )
    .map_err(fail)?;
    if truncated {
        writeln!(out, "# truncated: each writer kept its first requests only").map_err(fail)?;
    }
    for r in &rows {
        writeln!(
            out,
            "{} {} {} {}",
            r.due_us, r.sent_us, r.acked_us, r.status
        )
        .map_err(fail)?;
    }
    out.flush().map_err(fail)
}

fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Server figures at one edge of the window.
struct Edge {
    scrape: Option<Scrape>,
    proc: Option<proc::ProcSample>,
}

async fn edge(scraper: Option<&Scraper>, pid: Option<u32>) -> Edge {
    Edge {
        scrape: match scraper {
            Some(s) => s.scrape().await,
            None => None,
        },
        proc: pid.and_then(proc::sample),
    }
}

pub async fn run_append(w: Workload, report: &mut Report) -> Result<(), BenchError> {
    let target = Target {
        addr: w.addr,
        authority: w.authority.clone(),
        http2: w.http2,
    };
    report.target.server_header = create_streams(&w, &target).await?;
    let scraper = w.metrics_url.as_deref().map(Scraper::new).transpose()?;
    let stats = Arc::new(Stats::default());
    let window = Arc::new(Window::default());

    // Live readers first, so they are parked at the tail when appends begin.
    let (stop_tx, stop_rx) = watch::channel(false);
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let mut readers = Vec::new();
    for i in 0..w.readers {
        let reader = Reader {
            target: Target {
                http2: false,
                ..target.clone()
            },
            path: w.stream_path(i),
            sse: w.live == Live::Sse,
            task: i,
            stats: stats.clone(),
            window: window.clone(),
            ready: ready.clone(),
        };
        readers.push(tokio::spawn(reader.run(stop_rx.clone())));
    }
    if w.readers > 0 {
        // A long-poll reader answers its first request only when data arrives:
        // count "request sent" rather than "answer received" by giving it a moment.
        let wait = ready.acquire_many(w.readers as u32);
        let limit = if w.live == Live::Sse { 10 } else { 1 };
        let _ = tokio::time::timeout(Duration::from_secs(limit), wait).await;
    }

    let lanes = lanes(&w, &target).await?;
    let start_us = now_us() + 1_000;
    let from_us = start_us + w.warmup.as_micros() as u64;
    let end_us = from_us + w.duration.as_micros() as u64;
    window.set(from_us, end_us);
    let requests_per_s = w.rate.map(|r| r / w.batch as f64);
    let ctx = Arc::new(Ctx {
        dests: (0..w.streams)
            .map(|i| {
                let path = w.stream_path(i);
                let uri = format!("http://{}{path}", target.authority)
                    .parse()
                    .map_err(|e| BenchError::Config(format!("stream URL {path}: {e}")))?;
                Ok(Dest { path, uri })
            })
            .collect::<Result<_, BenchError>>()?,
        ct: HeaderValue::from_str(&w.content_type)
            .map_err(|_| BenchError::Config("--content-type is not a valid header".into()))?,
        template: w.body_template(w.batch),
        stats: stats.clone(),
        window: window.clone(),
        next_request: AtomicU64::new(0),
        start_us,
        end_us,
        requests_per_s,
        pacer: requests_per_s.map(|rps| Pacer::start(start_us, end_us, rps)),
        trace_rows: match w.trace {
            Some(_) => TRACE_ROWS_MAX / lanes.len().max(1),
            None => 0,
        },
    });
    let progress = Progress::start(&w, stats.clone(), window.clone(), start_us);
    let client_before = proc::sample_self();
    sleep_until_us(start_us).await;
    let writers: Vec<_> = lanes
        .into_iter()
        .enumerate()
        .map(|(task, lane)| tokio::spawn(writer(ctx.clone(), task, lane)))
        .collect();

    sleep_until_us(from_us).await;
    let before = edge(scraper.as_ref(), w.server_pid).await;
    let client_from = proc::sample_self();
    let machine_from = proc::machine_ticks();
    sleep_until_us(end_us).await;
    let after = edge(scraper.as_ref(), w.server_pid).await;
    let client_to = proc::sample_self();
    if let Some((idle, steal)) = machine_from
        .zip(proc::machine_ticks())
        .and_then(|(a, b)| a.shares_until(&b))
    {
        report.machine.cpu_idle_share = Some(idle);
        report.machine.cpu_steal_share = Some(steal);
    }
    let (trace, truncated) = join_writers(writers, &ctx).await;
    if let Some(path) = &w.trace {
        write_trace(path, trace, (from_us, end_us), truncated)?;
    }

    if w.readers > 0 {
        // Readers follow only w.readers of the streams: expect their share.
        let acked = stats.acked_records.load(Ordering::Relaxed);
        let expected = acked * w.readers as u64 / w.streams as u64;
        let deadline = now_us() + LIVE_DRAIN_MAX.as_micros() as u64;
        while stats.live_records.load(Ordering::Relaxed) < expected && now_us() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _ = stop_tx.send(true);
    for r in readers {
        let _ = r.await;
    }
    let peak_rss = progress.stop().await;

    let window_s = w.duration.as_secs_f64();
    let records = stats.window_records.load(Ordering::Relaxed);
    let bytes = stats.window_bytes.load(Ordering::Relaxed);
    let requests = stats.window_requests.load(Ordering::Relaxed);
    report.append = Some(AppendReport {
        requests,
        records,
        bytes,
        records_per_s: records as f64 / window_s,
        mib_per_s: bytes as f64 / window_s / (1024.0 * 1024.0),
        requests_per_s: requests as f64 / window_s,
        errors: stats.errors.total(),
        error_kinds: stats.errors.kinds(),
        ack_latency_ms: Latency::from_us(&stats.ack.merged()),
        send_lag_ms: requests_per_s.map(|_| Latency::from_us(&stats.send_lag.merged())),
        from_send_ms: requests_per_s.map(|_| Latency::from_us(&stats.from_send.merged())),
    });
    if w.readers > 0 {
        report.end_to_end = Some(EndToEndReport {
            mode: if w.live == Live::Sse {
                "sse"
            } else {
                "long-poll"
            }
            .into(),
            readers: w.readers,
            records: stats.live_records.load(Ordering::Relaxed),
            latency_ms: Latency::from_us(&stats.e2e.merged()),
            reader_errors: stats.reader_errors.load(Ordering::Relaxed),
        });
    }
    fill_server(report, &before, &after, records, window_s, peak_rss);
    if let (Some(a), Some(b)) = (client_from, client_to) {
        report.client.cpu_s = Some(b.cpu_secs - a.cpu_secs);
        report.client.cpu_cores_busy = Some((b.cpu_secs - a.cpu_secs) / window_s);
    } else if let Some(a) = client_before {
        report.client.cpu_s = proc::sample_self().map(|b| b.cpu_secs - a.cpu_secs);
    }

    if let Some(limit) = w.catch_up {
        report.catch_up = Some(catch_up(&w, &target, limit).await);
    }
    Ok(())
}

fn fill_server(
    report: &mut Report,
    before: &Edge,
    after: &Edge,
    records: u64,
    window_s: f64,
    peak_rss: Option<u64>,
) {
    let s = &mut report.server;
    if let (Some(b), Some(a)) = (&before.scrape, &after.scrape) {
        use server_metrics::*;
        s.has_metrics = true;
        s.wal_puts = delta(b, a, WAL_OBJECTS, &[]);
        s.store_puts = delta(b, a, STORE_REQUESTS, &[("op", "put")]).or(s.wal_puts);
        s.store_puts_per_s = s.store_puts.map(|p| p / window_s);
        if records > 0 {
            s.store_puts_per_1000_records = s.store_puts.map(|p| p * 1000.0 / records as f64);
        }
        let n = delta(b, a, &format!("{STORE_DURATION}_count"), &[("op", "put")]);
        let sum = delta(b, a, &format!("{STORE_DURATION}_sum"), &[("op", "put")]);
        if let (Some(n), Some(sum)) = (n, sum) {
            if n > 0.0 {
                s.store_put_ms_mean = Some(sum / n * 1000.0);
            }
        }
        let ms = |name: &str, want: &[(&str, &str)], q: f64| {
            quantile(b, a, name, want, q).map(|v| v * 1000.0)
        };
        s.append_ms_p50 = ms(APPEND_DURATION, &[], 0.5);
        s.append_ms_p99 = ms(APPEND_DURATION, &[], 0.99);
        s.wal_commit_ms_p50 = ms(WAL_COMMIT, &[], 0.5);
        s.wal_commit_ms_p99 = ms(WAL_COMMIT, &[], 0.99);
        s.store_put_ms_p99 = ms(STORE_DURATION, &[("op", "put")], 0.99);
        s.cpu_s = delta(b, a, PROCESS_CPU, &[]);
        s.rss_mb_end = a.sum(PROCESS_RSS, &[]).map(|v| mb(v as u64));
    }
    if let (Some(b), Some(a)) = (before.proc, after.proc) {
        s.cpu_s = Some(a.cpu_secs - b.cpu_secs);
        s.rss_mb_end = Some(mb(a.rss_bytes));
        s.vm_hwm_mb = Some(mb(a.rss_peak_bytes));
    }
    s.rss_mb_peak_sampled = peak_rss.map(mb);
    if records > 0 {
        s.cpu_s_per_million_records = s.cpu_s.map(|c| c * 1e6 / records as f64);
    }
}

/// Reads every bench stream from its start, `min(streams, 8)` at a time, until each
/// is up to date or `limit` passed.
async fn catch_up(w: &Workload, target: &Target, limit: Duration) -> CatchUpReport {
    let records = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let unfinished = Arc::new(AtomicU64::new(0));
    let started = now_us();
    let deadline = started + limit.as_micros() as u64;
    let paths: Arc<Vec<String>> = Arc::new((0..w.streams).map(|i| w.stream_path(i)).collect());
    let concurrency = w.streams.min(8);
    let conns: Arc<Vec<Mutex<Conn>>> = Arc::new(
        (0..concurrency)
            .map(|_| Mutex::new(target.conn()))
            .collect(),
    );
    {
        let (records, bytes, errors, unfinished) = (
            records.clone(),
            bytes.clone(),
            errors.clone(),
            unfinished.clone(),
        );
        for_each_concurrent(w.streams, concurrency, move |task, i| {
            let (records, bytes, errors, unfinished, paths, conns) = (
                records.clone(),
                bytes.clone(),
                errors.clone(),
                unfinished.clone(),
                paths.clone(),
                conns.clone(),
            );
            async move {
                let mut conn = conns[task].lock().await;
                let mut offset = "-1".to_string();
                loop {
                    if now_us() >= deadline {
                        unfinished.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let url = format!("{}?offset={}", paths[i], encode_query(&offset));
                    let a = match conn.get(&url).await {
                        Ok(a) if a.status.as_u16() == 200 => a,
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            unfinished.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                    bytes.fetch_add(a.body.len() as u64, Ordering::Relaxed);
                    records.fetch_add(scan(&a.body, |_| {}), Ordering::Relaxed);
                    let up_to_date = a
                        .header("stream-up-to-date")
                        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                    let next = a.header("stream-next-offset").map(str::to_string);
                    match next {
                        Some(n) if !up_to_date && n != offset && !a.body.is_empty() => offset = n,
                        _ => return,
                    }
                }
            }
        })
        .await;
    }
    let secs = (now_us() - started) as f64 / 1e6;
    let records = records.load(Ordering::Relaxed);
    let bytes = bytes.load(Ordering::Relaxed);
    CatchUpReport {
        streams: w.streams,
        records,
        bytes,
        secs,
        records_per_s: records as f64 / secs.max(1e-9),
        mib_per_s: bytes as f64 / secs.max(1e-9) / (1024.0 * 1024.0),
        complete: unfinished.load(Ordering::Relaxed) == 0,
        errors: errors.load(Ordering::Relaxed),
    }
}
