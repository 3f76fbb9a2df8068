//! What a run found, as one serializable [`Report`]: printed as text, written as
//! JSON (`--output json`), and read back from JSON files for the side-by-side
//! (`bench compare`) and rate-sweep (`bench curve`) tables.

use std::collections::BTreeMap;
use std::fmt::Write;

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;

use crate::config::{Kind, Workload};

#[derive(Serialize, Debug, Default)]
pub struct Report {
    pub label: String,
    pub tool: String,
    pub started_unix: u64,
    pub target: TargetInfo,
    pub workload: WorkloadInfo,
    pub machine: Machine,
    pub append: Option<AppendReport>,
    pub end_to_end: Option<EndToEndReport>,
    pub catch_up: Option<CatchUpReport>,
    pub create: Option<CreateReport>,
    pub server: ServerReport,
    pub client: ClientReport,
}

#[derive(Serialize, Debug, Default)]
pub struct TargetInfo {
    pub url: String,
    pub http: String,
    /// The `Server` response header, when the server sends one.
    pub server_header: Option<String>,
}

#[derive(Serialize, Debug, Default)]
pub struct WorkloadInfo {
    pub kind: String,
    pub record_bytes: usize,
    pub records_per_request: usize,
    pub in_flight: usize,
    pub connections: usize,
    /// The writers' protocol: "1.1", or "2" (h2c).
    pub http: String,
    pub streams: usize,
    pub target_records_per_s: Option<f64>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub content_type: String,
    pub live: String,
    pub readers: usize,
}

#[derive(Serialize, Debug, Default)]
pub struct Machine {
    pub cpus: usize,
    pub load_1m_before: Option<f64>,
    pub load_1m_after: Option<f64>,
    /// Share of the whole machine's CPU time idle over the measured window (server,
    /// client and everything else together; /proc/stat).
    pub cpu_idle_share: Option<f64>,
    /// Share of it the hypervisor gave to something else (steal).
    pub cpu_steal_share: Option<f64>,
}

#[derive(Serialize, Debug, Default, Clone)]
pub struct Latency {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// Milliseconds from a histogram of microseconds.
    pub fn from_us(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| (us as f64 / 1000.0 * 1000.0).round() / 1000.0;
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: (h.mean() / 1000.0 * 1000.0).round() / 1000.0,
        }
    }

    fn line(&self) -> String {
        format!(
            "p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  mean {:.3} ms  (n={})",
            self.p50, self.p90, self.p99, self.p999, self.max, self.mean, self.count
        )
    }
}

#[derive(Serialize, Debug, Default)]
pub struct AppendReport {
    pub requests: u64,
    pub records: u64,
    pub bytes: u64,
    pub records_per_s: f64,
    pub mib_per_s: f64,
    pub requests_per_s: f64,
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// From the (scheduled, with --rate) send to the acknowledgement.
    pub ack_latency_ms: Latency,
    /// With --rate: from when a request was due until the client sent it. Large when
    /// every in-flight slot is taken or the client waits for a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_lag_ms: Option<Latency>,
    /// With --rate: from the actual send to the acknowledgement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_send_ms: Option<Latency>,
}

#[derive(Serialize, Debug, Default)]
pub struct EndToEndReport {
    pub mode: String,
    pub readers: usize,
    pub records: u64,
    /// From the send of an append to a live reader receiving its record.
    pub latency_ms: Latency,
    pub reader_errors: u64,
}

#[derive(Serialize, Debug, Default)]
pub struct CatchUpReport {
    pub streams: usize,
    pub records: u64,
    pub bytes: u64,
    pub secs: f64,
    pub records_per_s: f64,
    pub mib_per_s: f64,
    /// Every stream was read to its end within the time limit.
    pub complete: bool,
    pub errors: u64,
}

#[derive(Serialize, Debug, Default)]
pub struct CreateReport {
    pub streams: u64,
    pub secs: f64,
    pub streams_per_s: f64,
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// 2: a PUT, then a POST of the record; 1: a PUT with the record as its body.
    pub requests_per_stream: u32,
    /// One create plus its first append.
    pub create_latency_ms: Latency,
    pub rss_mb_after_create: Option<f64>,
    pub active_streams_after_create: Option<f64>,
    pub idle_wait_s: Option<f64>,
    pub rss_mb_after_idle: Option<f64>,
    pub active_streams_after_idle: Option<f64>,
    pub probe_append_ms: Latency,
    pub probe_read_ms: Latency,
}

#[derive(Serialize, Debug, Default)]
pub struct ServerReport {
    pub has_metrics: bool,
    /// WAL objects written in the measured window (PicoMQ's data PUTs).
    pub wal_puts: Option<f64>,
    /// Every object-store PUT in the window (data and metadata checkpoints).
    pub store_puts: Option<f64>,
    pub store_puts_per_s: Option<f64>,
    pub store_puts_per_1000_records: Option<f64>,
    /// Mean object-store PUT latency seen by the server in the window.
    pub store_put_ms_mean: Option<f64>,
    /// Its p99, from the store's latency histogram (interpolated within its buckets).
    pub store_put_ms_p99: Option<f64>,
    /// Server-side append latency (engine entry to durable) in the window, from its
    /// histogram: p50 and p99, as fine as the bucket bounds.
    pub append_ms_p50: Option<f64>,
    pub append_ms_p99: Option<f64>,
    /// WAL commit (oldest op buffered until durable), per object: p50 and p99.
    pub wal_commit_ms_p50: Option<f64>,
    pub wal_commit_ms_p99: Option<f64>,
    pub cpu_s: Option<f64>,
    pub cpu_s_per_million_records: Option<f64>,
    pub rss_mb_peak_sampled: Option<f64>,
    pub rss_mb_end: Option<f64>,
    pub vm_hwm_mb: Option<f64>,
}

#[derive(Serialize, Debug, Default)]
pub struct ClientReport {
    pub cpu_s: Option<f64>,
    /// CPU seconds per wall second: near the core count means the bench may be the
    /// bottleneck.
    pub cpu_cores_busy: Option<f64>,
}

impl WorkloadInfo {
    pub fn of(w: &Workload) -> WorkloadInfo {
        WorkloadInfo {
            kind: match w.kind {
                Kind::Append => "append".into(),
                Kind::Create => "create".into(),
            },
            record_bytes: w.record_bytes,
            records_per_request: w.batch,
            in_flight: w.in_flight,
            connections: w.connections,
            http: if w.http2 { "2" } else { "1.1" }.into(),
            streams: w.streams,
            target_records_per_s: w.rate,
            duration_s: w.duration.as_secs_f64(),
            warmup_s: w.warmup.as_secs_f64(),
            content_type: w.content_type.clone(),
            live: serde_json::to_value(w.live)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            readers: w.readers,
        }
    }
}

pub fn mb(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

fn opt(v: Option<f64>, unit: &str) -> String {
    match v {
        Some(v) => format!("{} {unit}", num(v)),
        None => "-".into(),
    }
}

/// A figure with a sensible number of digits.
fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        group_thousands(v.round() as i64)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn group_thousands(v: i64) -> String {
    let s = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0 {
        format!("-{out}")
    } else {
        out
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let w = &self.workload;
        let _ = writeln!(
            o,
            "{} ({}) -> {} over HTTP/{}{}",
            self.label,
            self.tool,
            self.target.url,
            self.target.http,
            self.target
                .server_header
                .as_deref()
                .map(|s| format!(" [server: {s}]"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            o,
            "workload: {} | {} B records x {}/request | {} in flight on {} HTTP/{} connections | {} streams | rate {} | {}s + {}s warm-up | {} | live {} ({} readers)",
            w.kind,
            w.record_bytes,
            w.records_per_request,
            w.in_flight,
            w.connections,
            w.http,
            w.streams,
            w.target_records_per_s
                .map(|r| format!("{} rec/s", num(r)))
                .unwrap_or_else(|| "max".into()),
            w.duration_s,
            w.warmup_s,
            w.content_type,
            w.live,
            w.readers
        );
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
        let _ = writeln!(
            o,
            "machine: {} cpus, load {} before, {} after; over the window idle {}, steal {}",
            self.machine.cpus,
            opt(self.machine.load_1m_before, ""),
            opt(self.machine.load_1m_after, ""),
            pct(self.machine.cpu_idle_share),
            pct(self.machine.cpu_steal_share)
        );
        if let Some(a) = &self.append {
            let _ = writeln!(
                o,
                "append:     {} records/s  {} MiB/s  {} requests/s  ({} records, {} errors{})",
                num(a.records_per_s),
                num(a.mib_per_s),
                num(a.requests_per_s),
                a.records,
                a.errors,
                if a.error_kinds.is_empty() {
                    String::new()
                } else {
                    format!(": {:?}", a.error_kinds)
                }
            );
            let _ = writeln!(o, "ack:        {}", a.ack_latency_ms.line());
            if let (Some(lag), Some(sent)) = (&a.send_lag_ms, &a.from_send_ms) {
                let _ = writeln!(o, "  send lag: {}", lag.line());
                let _ = writeln!(o, "  from send:{}", sent.line());
            }
        }
        if let Some(e) = &self.end_to_end {
            let _ = writeln!(
                o,
                "end-to-end: {}  [{} x {}, {} reader errors]",
                e.latency_ms.line(),
                e.readers,
                e.mode,
                e.reader_errors
            );
        }
        if let Some(c) = &self.catch_up {
            let _ = writeln!(
                o,
                "catch-up:   {} records/s  {} MiB/s  ({} records from {} streams in {:.2}s{}, {} errors)",
                num(c.records_per_s),
                num(c.mib_per_s),
                c.records,
                c.streams,
                c.secs,
                if c.complete { "" } else { ", time limit hit" },
                c.errors
            );
        }
        if let Some(c) = &self.create {
            let _ = writeln!(
                o,
                "create:     {} streams in {:.1}s = {} streams/s ({} request(s) each; {} errors{})",
                c.streams,
                c.secs,
                num(c.streams_per_s),
                c.requests_per_stream,
                c.errors,
                if c.error_kinds.is_empty() {
                    String::new()
                } else {
                    format!(": {:?}", c.error_kinds)
                }
            );
            let _ = writeln!(o, "  create+append: {}", c.create_latency_ms.line());
            let _ = writeln!(
                o,
                "  server RSS {} after create ({} active), {} after {} idle ({} active)",
                opt(c.rss_mb_after_create, "MiB"),
                opt(c.active_streams_after_create, ""),
                opt(c.rss_mb_after_idle, "MiB"),
                opt(c.idle_wait_s, "s"),
                opt(c.active_streams_after_idle, "")
            );
            let _ = writeln!(o, "  probe append:  {}", c.probe_append_ms.line());
            let _ = writeln!(o, "  probe read:    {}", c.probe_read_ms.line());
        }
        let s = &self.server;
        let _ = writeln!(
            o,
            "server:     PUTs {} ({}/s, {} per 1,000 records; WAL {}), PUT mean {}, CPU {} ({} per 1M records), RSS peak {} (VmHWM {}), end {}",
            opt(s.store_puts, ""),
            opt(s.store_puts_per_s, ""),
            opt(s.store_puts_per_1000_records, ""),
            opt(s.wal_puts, ""),
            opt(s.store_put_ms_mean, "ms"),
            opt(s.cpu_s, "s"),
            opt(s.cpu_s_per_million_records, "s"),
            opt(s.rss_mb_peak_sampled, "MiB"),
            opt(s.vm_hwm_mb, "MiB"),
            opt(s.rss_mb_end, "MiB"),
        );
        if s.append_ms_p50.is_some() || s.wal_commit_ms_p50.is_some() {
            let _ = writeln!(
                o,
                "server ms:  append p50 {} p99 {} (engine entry to durable); WAL commit p50 {} p99 {}; store PUT p99 {} (from /metrics buckets)",
                opt(s.append_ms_p50, ""),
                opt(s.append_ms_p99, ""),
                opt(s.wal_commit_ms_p50, ""),
                opt(s.wal_commit_ms_p99, ""),
                opt(s.store_put_ms_p99, ""),
            );
        }
        let _ = writeln!(
            o,
            "client:     CPU {} ({} cores busy)",
            opt(self.client.cpu_s, "s"),
            opt(self.client.cpu_cores_busy, "")
        );
        o
    }
}

/// Figures compared side by side: (row name, JSON pointer into a report).
const FIGURES: &[(&str, &str)] = &[
    ("append records/s", "/append/records_per_s"),
    ("append MiB/s", "/append/mib_per_s"),
    ("append errors", "/append/errors"),
    ("ack p50 ms", "/append/ack_latency_ms/p50"),
    ("ack p90 ms", "/append/ack_latency_ms/p90"),
    ("ack p99 ms", "/append/ack_latency_ms/p99"),
    ("ack p99.9 ms", "/append/ack_latency_ms/p999"),
    ("ack max ms", "/append/ack_latency_ms/max"),
    ("e2e p50 ms", "/end_to_end/latency_ms/p50"),
    ("e2e p99 ms", "/end_to_end/latency_ms/p99"),
    ("e2e p99.9 ms", "/end_to_end/latency_ms/p999"),
    ("e2e max ms", "/end_to_end/latency_ms/max"),
    ("catch-up records/s", "/catch_up/records_per_s"),
    ("catch-up MiB/s", "/catch_up/mib_per_s"),
    ("create streams/s", "/create/streams_per_s"),
    ("create requests per stream", "/create/requests_per_stream"),
    ("create p99 ms", "/create/create_latency_ms/p99"),
    ("RSS after create MiB", "/create/rss_mb_after_create"),
    ("RSS after idle MiB", "/create/rss_mb_after_idle"),
    (
        "active streams after create",
        "/create/active_streams_after_create",
    ),
    (
        "active streams after idle",
        "/create/active_streams_after_idle",
    ),
    ("probe append p50 ms", "/create/probe_append_ms/p50"),
    ("probe append p99 ms", "/create/probe_append_ms/p99"),
    ("probe read p50 ms", "/create/probe_read_ms/p50"),
    ("probe read p99 ms", "/create/probe_read_ms/p99"),
    ("server append p50 ms", "/server/append_ms_p50"),
    ("server append p99 ms", "/server/append_ms_p99"),
    ("WAL commit p50 ms", "/server/wal_commit_ms_p50"),
    ("WAL commit p99 ms", "/server/wal_commit_ms_p99"),
    ("store PUT p99 ms", "/server/store_put_ms_p99"),
    ("store PUTs/s", "/server/store_puts_per_s"),
    (
        "PUTs per 1,000 records",
        "/server/store_puts_per_1000_records",
    ),
    ("server CPU s", "/server/cpu_s"),
    (
        "server CPU s per 1M records",
        "/server/cpu_s_per_million_records",
    ),
    ("server RSS peak MiB", "/server/rss_mb_peak_sampled"),
    ("server VmHWM MiB", "/server/vm_hwm_mb"),
    ("client CPU cores busy", "/client/cpu_cores_busy"),
    ("machine idle share", "/machine/cpu_idle_share"),
    ("machine steal share", "/machine/cpu_steal_share"),
];

fn figure(report: &Value, pointer: &str) -> Option<f64> {
    let v = report.pointer(pointer)?;
    let f = v.as_f64()?;
    // A latency block with no samples is absent, not zero.
    if pointer.contains("latency_ms") || pointer.contains("_ms/") {
        let parent = &pointer[..pointer.rfind('/')?];
        if report.pointer(&format!("{parent}/count"))?.as_u64()? == 0 {
            return None;
        }
    }
    Some(f)
}

/// Two significant digits at least, so that 0.003x does not print as 0.00x.
fn ratio(r: f64) -> String {
    if r.abs() >= 0.1 || r == 0.0 {
        format!("{r:.2}x")
    } else {
        let decimals = (-r.abs().log10()).ceil() as usize + 1;
        format!("{r:.decimals$}x")
    }
}

fn cell(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "-".into())
}

fn render_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut o = String::new();
    let line = |o: &mut String, cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(o, "| {} |", parts.join(" | "));
    };
    line(&mut o, header);
    // Markdown: the first column left-aligned, figures right-aligned.
    let sep: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    let _ = writeln!(o, "|{}|", sep.join("|"));
    for r in rows {
        line(&mut o, r);
    }
    o
}

/// Side by side: a column per report, then first/second for every figure either has.
pub fn compare_table(reports: &[(String, Value)]) -> String {
    let mut header = vec!["figure".to_string()];
    header.extend(reports.iter().map(|(label, _)| label.clone()));
    if reports.len() >= 2 {
        header.push(format!("{} / {}", reports[0].0, reports[1].0));
    }
    let mut rows = Vec::new();
    for (name, pointer) in FIGURES {
        let values: Vec<Option<f64>> = reports.iter().map(|(_, r)| figure(r, pointer)).collect();
        if values.iter().all(Option::is_none) {
            continue;
        }
        let mut row = vec![name.to_string()];
        row.extend(values.iter().map(|v| cell(*v)));
        if reports.len() >= 2 {
            row.push(match (values[0], values[1]) {
                (Some(a), Some(b)) if b != 0.0 => ratio(a / b),
                _ => "-".into(),
            });
        }
        rows.push(row);
    }
    render_table(&header, &rows)
}

/// One row per report: offered vs achieved rate, store PUTs, ack latency.
pub fn curve_table(reports: &[(String, Value)]) -> String {
    let header: Vec<String> = [
        "run",
        "target rec/s",
        "achieved rec/s",
        "PUTs/s",
        "PUTs/1k rec",
        "ack p50 ms",
        "ack p99 ms",
        "errors",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|(label, r)| {
            vec![
                label.clone(),
                figure(r, "/workload/target_records_per_s")
                    .map(num)
                    .unwrap_or_else(|| "max".into()),
                cell(figure(r, "/append/records_per_s")),
                cell(figure(r, "/server/store_puts_per_s")),
                cell(figure(r, "/server/store_puts_per_1000_records")),
                cell(figure(r, "/append/ack_latency_ms/p50")),
                cell(figure(r, "/append/ack_latency_ms/p99")),
                cell(figure(r, "/append/errors")),
            ]
        })
        .collect();
    render_table(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rate: f64, p99: f64) -> Value {
        serde_json::json!({
            "label": "x",
            "workload": {"target_records_per_s": null},
            "append": {"records_per_s": rate, "mib_per_s": 1.0, "errors": 0,
                       "ack_latency_ms": {"count": 10, "p50": 1.0, "p90": 2.0, "p99": p99, "p999": 4.0, "max": 5.0}},
            "end_to_end": null,
            "server": {"store_puts_per_1000_records": null}
        })
    }

    #[test]
    fn compare_shows_the_ratio_of_the_first_to_the_second() {
        let t = compare_table(&[
            ("picomq".into(), report(60_000.0, 10.0)),
            ("peer".into(), report(20_000.0, 40.0)),
        ]);
        assert!(t.contains("| append records/s "), "{t}");
        assert!(t.lines().nth(1).unwrap().starts_with("|---"), "{t}");
        assert!(t.lines().nth(1).unwrap().ends_with(":|"), "{t}");
        assert!(t.contains("60,000"), "{t}");
        assert!(t.contains("3.00x"), "{t}");
        assert!(t.contains("0.25x"), "{t}");
        assert_eq!(ratio(0.00318), "0.0032x");
        assert!(!t.contains("e2e"), "figures nobody has are left out:\n{t}");
    }

    #[test]
    fn curve_has_a_row_per_report() {
        let t = curve_table(&[
            ("a".into(), report(1.0, 1.0)),
            ("b".into(), report(2.0, 2.0)),
        ]);
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(t.contains(" max |"), "{t}");
    }

    #[test]
    fn latency_comes_out_in_milliseconds() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in 1..=1000u64 {
            h.record(us * 10).unwrap();
        }
        let l = Latency::from_us(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50 - 5.0).abs() < 0.01, "{l:?}");
        assert!((l.max - 10.0).abs() < 0.01, "{l:?}");
    }
}
