//! The workload: `picomq bench` flags, checked once into a [`Workload`] the driver
//! trusts. Defaults live here and nowhere else.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use crate::BenchError;

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub table: Option<TableCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Tables over saved `--output json` reports (no server needed).
#[derive(Subcommand, Debug, Clone)]
pub enum TableCommand {
    /// Side by side: one column per report, then (with two or more) the ratio
    /// first/second for every figure.
    Compare {
        /// JSON reports written with `--output json`.
        #[arg(required = true, num_args = 1..)]
        reports: Vec<PathBuf>,
    },
    /// One row per report (e.g. a rate sweep): target and achieved rate, PUTs/s, latency.
    Curve {
        #[arg(required = true)]
        reports: Vec<PathBuf>,
    },
    /// Consumer groups: messages/s acknowledged by N consumers, and append-to-claim
    /// latency; with --redis, Redis Streams consumer groups side by side.
    Groups(crate::consumers::GroupsArgs),
    /// Webhook deliveries per second of Durable Streams subscriptions.
    Webhooks(crate::consumers::WebhooksArgs),
    /// PicoMQ's native record API against the Durable Streams path: appends,
    /// catch-up reads, and reads by time (each answer checked).
    Native(crate::native::NativeArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// Append to --streams streams for --duration (plus live readers and catch-up).
    Append,
    /// Create --streams streams with one small append each, then probe a random sample.
    Create,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Live {
    Off,
    Sse,
    LongPoll,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Base URL the bench streams are created under (any Durable Streams server).
    #[arg(default_value = "http://127.0.0.1:4437/v1/stream")]
    pub url: String,
    #[arg(long, value_enum, default_value_t = Kind::Append)]
    pub workload: Kind,
    /// Bytes per record (each carries its send timestamp).
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// Send the JSON document in FILE (at most 1 MiB, not an array) as every message
    /// instead of timestamped records of --record-bytes, e.g. one a stream's schema
    /// accepts. Append workload on JSON streams only; no live readers or catch-up
    /// (the document carries no timestamp to find).
    #[arg(long, value_name = "FILE", conflicts_with = "record_bytes")]
    pub message_file: Option<PathBuf>,
    /// Records per append request: a JSON array for application/json streams,
    /// concatenated records otherwise.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Append requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// TCP connections for appends [default: --in-flight with HTTP/1.1; with HTTP/2
    /// one per 128 in flight, since servers commonly cap a connection's concurrent
    /// streams at 100-250 (PicoMQ at 200)].
    #[arg(long)]
    pub connections: Option<usize>,
    /// Streams written (round robin); for --workload create, streams created.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Target append rate in records per second, sent on schedule whatever the
    /// answers (open loop; latency counts from the scheduled time). Unset: as fast as
    /// --in-flight allows.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured time (after the warm-up).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub duration: Duration,
    /// Load before measuring starts; nothing sent in it is counted.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub warmup: Duration,
    /// Speak HTTP/2 without TLS (h2c, prior knowledge).
    #[arg(long)]
    pub http2: bool,
    /// Content type of the bench streams.
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// Live readers (end-to-end latency): one per stream up to --readers.
    #[arg(long, value_enum, default_value_t = Live::Off)]
    pub live: Live,
    /// Most live readers [default: one per stream, at most 64].
    #[arg(long)]
    pub readers: Option<usize>,
    /// After the appends, read every stream from the start for at most this long.
    #[arg(long, value_parser = duration)]
    pub catch_up: Option<Duration>,
    /// Server process to sample for CPU seconds and RSS (/proc; any server).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Prometheus endpoint [default: /metrics on the URL's host]; "off" to skip.
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Name of this run in reports and tables.
    #[arg(long, default_value = "run")]
    pub label: String,
    /// Stream names are URL/PREFIX-N [default: bench-RANDOM].
    #[arg(long)]
    pub stream_prefix: Option<String>,
    /// --workload create: streams probed (append, then read) afterwards.
    #[arg(long, default_value_t = 1000)]
    pub sample: usize,
    /// --workload create: wait this long before probing (e.g. past the server's
    /// dormancy timeout) and sample RSS again.
    #[arg(long, value_parser = duration)]
    pub idle_wait: Option<Duration>,
    /// --workload create: create each stream with its record as the PUT's body (the
    /// protocol's initial data: one request per stream) instead of a PUT, then a POST.
    #[arg(long)]
    pub create_with_body: bool,
    /// Append workload: write one line per request to FILE (when it was due, sent and
    /// acknowledged, its status), warm-up included, to see where a tail came from
    /// (benchmarks/stalls.py summarizes one).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// A checked workload. Everything the driver needs, nothing it must re-validate.
#[derive(Debug, Clone)]
pub struct Workload {
    pub kind: Kind,
    /// Scheme, host and port, e.g. `http://127.0.0.1:4437`.
    pub origin: String,
    pub addr: SocketAddr,
    /// Host header value.
    pub authority: String,
    /// Path of the stream base, without a trailing slash (may be empty).
    pub base_path: String,
    /// Bytes per message (the document's, with --message-file).
    pub record_bytes: usize,
    /// `--message-file`: the document sent as every message, checked.
    pub message: Option<Vec<u8>>,
    pub batch: usize,
    pub in_flight: usize,
    pub connections: usize,
    pub streams: usize,
    /// Records per second, open loop.
    pub rate: Option<f64>,
    pub duration: Duration,
    pub warmup: Duration,
    pub http2: bool,
    pub content_type: String,
    pub json: bool,
    pub live: Live,
    pub readers: usize,
    pub catch_up: Option<Duration>,
    pub server_pid: Option<u32>,
    pub metrics_url: Option<String>,
    pub label: String,
    pub prefix: String,
    pub sample: usize,
    pub idle_wait: Option<Duration>,
    pub create_with_body: bool,
    pub trace: Option<std::path::PathBuf>,
    pub output: Output,
    pub progress: bool,
}

/// The smallest record that still carries a timestamp marker.
pub const RECORD_BYTES_MIN: usize = 32;
/// Bounds that keep a typo from exhausting the machine.
pub const IN_FLIGHT_MAX: usize = 100_000;
pub const STREAMS_MAX: usize = 100_000_000;
pub const BODY_BYTES_MAX: usize = 64 << 20;
/// Requests in flight per HTTP/2 connection when `--connections` is not given: under
/// the 100-250 concurrent streams servers commonly allow one connection.
pub const H2_STREAMS_PER_CONNECTION: usize = 128;

impl Workload {
    pub fn from_args(a: &RunArgs) -> Result<Workload, BenchError> {
        let bad = |m: String| Err(BenchError::Config(m));
        let (origin, authority, base_path) = split_url(&a.url)?;
        if hyper::header::HeaderValue::from_str(&authority).is_err() {
            return bad(format!("{}: the host is not a valid Host header", a.url));
        }
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| BenchError::Config(format!("{}: {e}", a.url)))?
            .next()
            .ok_or_else(|| BenchError::Config(format!("{}: no address", a.url)))?;
        let media = a.content_type.split(';').next().unwrap_or("").trim();
        let json = media.eq_ignore_ascii_case("application/json");
        let message = match &a.message_file {
            Some(path) => {
                if a.workload != Kind::Append
                    || !json
                    || a.live != Live::Off
                    || a.catch_up.is_some()
                {
                    return bad(
                        "--message-file needs --workload append on application/json streams, \
                         without --live or --catch-up"
                            .into(),
                    );
                }
                Some(crate::payload::load_document(path).map_err(BenchError::Config)?)
            }
            None => None,
        };
        let record_bytes = message.as_ref().map_or(a.record_bytes, Vec::len);
        if message.is_none() && record_bytes < RECORD_BYTES_MIN {
            return bad(format!(
                "--record-bytes must be at least {RECORD_BYTES_MIN}"
            ));
        }
        if a.batch == 0 || record_bytes.saturating_mul(a.batch) > BODY_BYTES_MAX {
            return bad(format!(
                "--batch must be at least 1 and --record-bytes x --batch at most {BODY_BYTES_MAX}"
            ));
        }
        if a.in_flight == 0 || a.in_flight > IN_FLIGHT_MAX {
            return bad(format!("--in-flight must be in 1..={IN_FLIGHT_MAX}"));
        }
        if a.streams == 0 || a.streams > STREAMS_MAX {
            return bad(format!("--streams must be in 1..={STREAMS_MAX}"));
        }
        if let Some(r) = a.rate {
            if !(r.is_finite() && r > 0.0) {
                return bad("--rate must be a positive number of records per second".into());
            }
        }
        if a.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        let connections = match a.connections {
            Some(0) => return bad("--connections must be at least 1".into()),
            Some(c) => c.min(a.in_flight),
            None if a.http2 => a.in_flight.div_ceil(H2_STREAMS_PER_CONNECTION),
            None => a.in_flight,
        };
        let readers = match a.live {
            Live::Off => 0,
            _ => a.readers.unwrap_or(64).min(a.streams),
        };
        let metrics_url = match a.metrics_url.as_deref() {
            Some("off") => None,
            Some(u) => Some(u.to_string()),
            None => Some(format!("{origin}/metrics")),
        };
        let prefix = a
            .stream_prefix
            .clone()
            .unwrap_or_else(|| format!("bench-{:08x}", fastrand::u32(..)));
        Ok(Workload {
            kind: a.workload,
            origin,
            addr,
            authority,
            base_path,
            record_bytes,
            message,
            batch: a.batch,
            in_flight: a.in_flight,
            connections,
            streams: a.streams,
            rate: a.rate,
            duration: a.duration,
            warmup: a.warmup,
            http2: a.http2,
            content_type: a.content_type.clone(),
            json,
            live: a.live,
            readers,
            catch_up: a.catch_up,
            server_pid: a.server_pid,
            metrics_url,
            label: a.label.clone(),
            prefix,
            sample: a.sample,
            idle_wait: a.idle_wait,
            create_with_body: a.create_with_body,
            trace: a.trace.clone(),
            output: a.output,
            progress: !a.quiet,
        })
    }

    /// A request body of `batch` messages: timestamped records, or the document of
    /// --message-file.
    pub fn body_template(&self, batch: usize) -> crate::payload::BodyTemplate {
        match &self.message {
            Some(doc) => crate::payload::BodyTemplate::document(doc, batch, self.json),
            None => crate::payload::BodyTemplate::new(self.record_bytes, batch, self.json),
        }
    }

    /// Path of bench stream `i`.
    pub fn stream_path(&self, i: usize) -> String {
        format!("{}/{}-{i}", self.base_path, self.prefix)
    }
}

/// `http://host:port/base` into (origin, authority, base path). Plain HTTP only: the
/// bench measures servers on loopback.
pub(crate) fn split_url(url: &str) -> Result<(String, String, String), BenchError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        BenchError::Config(format!(
            "{url}: only http:// URLs are supported (h2c for HTTP/2)"
        ))
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(BenchError::Config(format!("{url}: no host")));
    }
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((
        format!("http://{authority}"),
        authority,
        path.trim_end_matches('/').to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn workload(args: &[&str]) -> Result<Workload, BenchError> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| BenchError::Config(e.to_string()))?;
        Workload::from_args(&cli.bench.run)
    }

    #[test]
    fn urls_split_into_origin_and_stream_base() {
        let w = workload(&["http://127.0.0.1:4437/v1/stream/"]).unwrap();
        assert_eq!(w.origin, "http://127.0.0.1:4437");
        assert_eq!(w.base_path, "/v1/stream");
        assert_eq!(
            w.metrics_url.as_deref(),
            Some("http://127.0.0.1:4437/metrics")
        );
        assert!(w.stream_path(3).starts_with("/v1/stream/bench-"));
        assert!(w.stream_path(3).ends_with("-3"));
        assert!(workload(&["https://127.0.0.1:1/x"]).is_err());
    }

    #[test]
    fn http1_uses_a_connection_per_request_in_flight() {
        let w = workload(&["http://127.0.0.1:1", "--in-flight", "32"]).unwrap();
        assert_eq!(w.connections, 32);
        let w = workload(&["http://127.0.0.1:1", "--in-flight", "32", "--http2"]).unwrap();
        assert_eq!(w.connections, 1);
        // Past one connection's worth of streams, another connection.
        let w = workload(&["http://127.0.0.1:1", "--in-flight", "512", "--http2"]).unwrap();
        assert_eq!(w.connections, 4);
        let w = workload(&["http://127.0.0.1:1", "--in-flight", "129", "--http2"]).unwrap();
        assert_eq!(w.connections, 2);
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(workload(&["http://127.0.0.1:1", "--record-bytes", "8"]).is_err());
        assert!(workload(&["http://127.0.0.1:1", "--batch", "0"]).is_err());
        assert!(workload(&["http://127.0.0.1:1", "--rate", "-1"]).is_err());
        assert!(workload(&["http://127.0.0.1:1", "--streams", "0"]).is_err());
    }

    #[test]
    fn a_message_file_sets_the_message() {
        let path =
            std::env::temp_dir().join(format!("picomq-bench-message-{}.json", std::process::id()));
        std::fs::write(&path, "{\"n\": 1}\n").unwrap();
        let file = path.to_str().unwrap();
        let w = workload(&["http://127.0.0.1:1", "--message-file", file, "--batch", "4"]).unwrap();
        assert_eq!(w.message.as_deref(), Some(&b"{\"n\": 1}"[..]));
        assert_eq!(w.record_bytes, 8);
        assert_eq!(w.body_template(4).render(0).len(), 4 * 8 + 3 + 2);
        // Not with flags it cannot honour, nor a non-JSON stream.
        for extra in [
            &["--record-bytes", "100"][..],
            &["--content-type", "text/plain"],
            &["--live", "sse"],
            &["--catch-up", "5s"],
            &["--workload", "create"],
        ] {
            let mut args = vec!["http://127.0.0.1:1", "--message-file", file];
            args.extend_from_slice(extra);
            assert!(workload(&args).is_err(), "{extra:?}");
        }
        std::fs::write(&path, "[{\"n\": 1}]").unwrap();
        let e = workload(&["http://127.0.0.1:1", "--message-file", file]).unwrap_err();
        assert!(e.to_string().contains("array"), "{e}");
        std::fs::remove_file(&path).unwrap();
        assert!(workload(&["http://127.0.0.1:1", "--message-file", file]).is_err());
        // Without the flag, records as before.
        let w = workload(&["http://127.0.0.1:1"]).unwrap();
        assert!(w.message.is_none());
        assert_eq!(w.record_bytes, 1024);
    }
}
