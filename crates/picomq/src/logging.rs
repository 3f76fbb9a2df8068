//! The server's log. tracing's fmt layer formats each line on the thread that logs
//! it; the lines are then handed to one background thread that writes them to
//! stderr in batches. A request thus pays for formatting its access-log line but
//! not for a `write(2)` of its own: at 15,000 appends/s the per-line write to stderr
//! was a visible share of the server's CPU (docs/performance.md).
//!
//! Nothing is dropped: past `PENDING_MAX` unwritten bytes (stderr stalled), loggers
//! wait for the writer, which is what a direct write to a stalled stderr did too.
//!
//! The access line (one per request, target `picomq::access`) has a layer of its own
//! that writes it without the fmt layer's generic machinery: formatting it there cost
//! ~10,700 instructions per request, 14% of an append (docs/performance.md). It keeps
//! the fmt layer's text and JSON shapes. The server's own requests do not even go
//! through tracing: `DirectAccess` takes them from the HTTP layer and writes the same
//! lines; the layer serves any `picomq::access` event logged otherwise.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{filter_fn, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Target of the per-request access line (crates/http).
const ACCESS_TARGET: &str = "picomq::access";

/// Unwritten log bytes held before loggers wait for the writer thread.
const PENDING_MAX: usize = 4 << 20;

/// The writer collects lines this long after the first one before writing them:
/// one wake-up and one `write(2)` per batch instead of per line.
const LINGER: Duration = Duration::from_millis(5);

/// How long [`Logging::flush`] waits for the writer (a stalled stderr must not hold
/// the process at exit).
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Installs the global subscriber. Keep the returned handle and call
/// [`Logging::flush`] before the process exits.
pub fn init(filter: &str, json: bool) -> Result<Logging, String> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| format!("--log {filter:?}: {e}"))?;
    let sink = Arc::new(Sink::default());
    {
        let sink = sink.clone();
        std::thread::Builder::new()
            .name("picomq-log".into())
            .spawn(move || sink.write_loop(&mut std::io::stderr()))
            .map_err(|e| format!("starting the log writer: {e}"))?;
    }
    // Colours only for a person watching; log files and collectors get plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(SinkWriter(sink.clone()));
    let not_access = filter_fn(|m| !(m.is_event() && m.target() == ACCESS_TARGET));
    let access = AccessLayer {
        sink: sink.clone(),
        json,
    }
    .with_filter(Targets::new().with_target(ACCESS_TARGET, Level::TRACE));
    let registry = tracing_subscriber::registry().with(filter).with(access);
    let installed = if json {
        registry.with(fmt.json().with_filter(not_access)).try_init()
    } else {
        registry.with(fmt.with_filter(not_access)).try_init()
    };
    installed.map_err(|e| format!("installing the logger: {e}"))?;
    // The filter is fixed for the process, so whether it lets access lines through
    // is asked once (outside any span: span-scoped directives do not apply to them).
    picomq_http::set_access_log(Box::new(DirectAccess {
        sink: sink.clone(),
        json,
        info: tracing::enabled!(target: ACCESS_TARGET, Level::INFO),
        warn: tracing::enabled!(target: ACCESS_TARGET, Level::WARN),
    }));
    Ok(Logging { sink })
}

pub struct Logging {
    sink: Arc<Sink>,
}

impl Logging {
    /// Waits (bounded) until every line logged so far is written.
    pub fn flush(&self) {
        self.sink.flush(FLUSH_WAIT);
    }
}

#[derive(Default)]
struct Sink {
    state: Mutex<Pending>,
    /// The writer waits here for lines.
    lines: Condvar,
    /// Loggers over `PENDING_MAX` and `flush` wait here for the writer.
    written: Condvar,
}

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// The writer holds a batch it has not finished writing.
    writing: bool,
    /// The writer sleeps until a line arrives (only then does a logger wake it).
    idle: bool,
}

impl Sink {
    fn push(&self, line: &[u8]) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.buf.len() >= PENDING_MAX {
            st = self.written.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.buf.extend_from_slice(line);
        let wake = std::mem::take(&mut st.idle);
        drop(st);
        if wake {
            self.lines.notify_one();
        }
    }

    fn write_loop(&self, out: &mut impl Write) {
        let mut batch = Vec::new();
        loop {
            {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                while st.buf.is_empty() {
                    st.idle = true;
                    st = self.lines.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.buf.len() < PENDING_MAX / 2 {
                    drop(st);
                    std::thread::sleep(LINGER);
                    st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                }
                std::mem::swap(&mut batch, &mut st.buf);
                st.writing = true;
            }
            self.written.notify_all();
            // A failing stderr (closed pipe) loses lines, as direct writes would.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            batch.clear();
            if batch.capacity() > PENDING_MAX {
                batch = Vec::new();
            }
            self.state.lock().unwrap_or_else(|e| e.into_inner()).writing = false;
            self.written.notify_all();
        }
    }

    fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !st.buf.is_empty() || st.writing {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            st = self
                .written
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// What tracing's fmt layer writes each formatted line to.
#[derive(Clone)]
struct SinkWriter(Arc<Sink>);

impl Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SinkWriter {
    type Writer = SinkWriter;

    fn make_writer(&'a self) -> SinkWriter {
        self.clone()
    }
}

/// Writes `picomq::access` events as the fmt layer would, without its generic
/// field formatting: text `<time>  INFO picomq::access: request id="…" … status=201`,
/// or JSON `{"timestamp":…,"level":…,"fields":{"message":…,…},"target":…}`.
struct AccessLayer {
    sink: Arc<Sink>,
    json: bool,
}

impl<S: Subscriber> Layer<S> for AccessLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = String::with_capacity(256);
        let level = meta.level().as_str();
        if self.json {
            json_head(&mut line, level);
            event.record(&mut JsonFields {
                line: &mut line,
                first: true,
            });
            json_tail(&mut line, meta.target());
        } else {
            text_head(&mut line, level, meta.target());
            event.record(&mut TextFields(&mut line));
            line.push('\n');
        }
        self.sink.push(line.as_bytes());
    }
}

/// Access lines straight from the HTTP layer (`picomq_http::AccessLog`), bypassing
/// tracing's dispatch, in the shapes [`AccessLayer`] writes.
struct DirectAccess {
    sink: Arc<Sink>,
    json: bool,
    /// The log's filter lets `picomq::access` through at info, at warn.
    info: bool,
    warn: bool,
}

impl picomq_http::AccessLog for DirectAccess {
    fn write(&self, l: &picomq_http::AccessLine<'_>) {
        let failed = l.status >= 500;
        if !(if failed { self.warn } else { self.info }) {
            return;
        }
        let (level, message) = if failed {
            (Level::WARN, "request failed")
        } else {
            (Level::INFO, "request")
        };
        let mut line = String::with_capacity(256);
        let strs = [("id", l.id), ("method", l.method), ("path", l.path)];
        let nums = [("status", l.status as u64), ("latency_us", l.latency_us)];
        if self.json {
            json_head(&mut line, level.as_str());
            push_json_str(&mut line, "message");
            line.push(':');
            push_json_str(&mut line, message);
            for (name, value) in strs {
                line.push(',');
                push_json_str(&mut line, name);
                line.push(':');
                push_json_str(&mut line, value);
            }
            for (name, value) in nums {
                line.push(',');
                push_json_str(&mut line, name);
                line.push(':');
                picomq_http::digits::push_decimal(&mut line, value);
            }
            json_tail(&mut line, ACCESS_TARGET);
        } else {
            text_head(&mut line, level.as_str(), ACCESS_TARGET);
            line.push(' ');
            line.push_str(message);
            for (name, value) in strs {
                push_text_str(&mut line, name, value);
            }
            for (name, value) in nums {
                push_text_u64(&mut line, name, value);
            }
            line.push('\n');
        }
        self.sink.push(line.as_bytes());
    }
}

/// `{"timestamp":"…","level":"…","fields":{`
// Log lines carry the real time, whatever clock the engine runs on.
#[allow(clippy::disallowed_methods)]
fn json_head(line: &mut String, level: &str) {
    line.push_str(r#"{"timestamp":""#);
    push_time(line, SystemTime::now());
    line.push_str(r#"","level":""#);
    line.push_str(level);
    line.push_str(r#"","fields":{"#);
}

/// `},"target":"…"}` and the line's end.
fn json_tail(line: &mut String, target: &str) {
    line.push_str(r#"},"target":"#);
    push_json_str(line, target);
    line.push_str("}\n");
}

/// `<time>  INFO target:`
#[allow(clippy::disallowed_methods)] // as in `json_head`
fn text_head(line: &mut String, level: &str, target: &str) {
    push_time(line, SystemTime::now());
    // ` {level:>5}`
    line.push_str(&"      "[level.len().min(5)..]);
    line.push_str(level);
    line.push(' ');
    line.push_str(target);
    line.push(':');
}

/// ` name="value"`, the value quoted and escaped as `{:?}` would.
fn push_text_str(line: &mut String, name: &str, value: &str) {
    line.push(' ');
    line.push_str(name);
    line.push('=');
    // What `{:?}` prints, without its per-character escape search for the usual
    // (printable ASCII) id, method and path.
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        line.push('"');
        line.push_str(value);
        line.push('"');
    } else {
        let _ = write!(line, "{value:?}");
    }
}

/// ` name=value`
fn push_text_u64(line: &mut String, name: &str, value: u64) {
    line.push(' ');
    line.push_str(name);
    line.push('=');
    picomq_http::digits::push_decimal(line, value);
}

/// Appends `time` as RFC 3339 with microseconds (`2026-12-01T05:34:16.659819Z`), as
/// `humantime::format_rfc3339_micros` writes it. The part up to the second is
/// formatted once per second per thread: the calendar arithmetic and `fmt` machinery
/// behind it were a tenth of the access line's cost.
fn push_time(line: &mut String, time: SystemTime) {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    SECOND.with_borrow_mut(|(cached, prefix)| {
        if *cached != secs {
            // `2026-12-01T05:34:16Z` without its `Z`.
            let whole = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs));
            prefix.clear();
            let _ = write!(prefix, "{whole}");
            prefix.pop();
            *cached = secs;
        }
        line.push_str(prefix);
    });
    line.push('.');
    let micros = since.subsec_micros();
    let digits = [100_000, 10_000, 1_000, 100, 10, 1].map(|d| b'0' + (micros / d % 10) as u8);
    line.push_str(std::str::from_utf8(&digits).unwrap_or("000000"));
    line.push('Z');
}

/// ` message key=value …`: strings quoted and escaped as `{:?}` would.
struct TextFields<'a>(&'a mut String);

impl Visit for TextFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        push_text_str(self.0, field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        push_text_u64(self.0, field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

/// `"key":value,…`: numbers as numbers, everything else as JSON strings.
struct JsonFields<'a> {
    line: &'a mut String,
    first: bool,
}

impl JsonFields<'_> {
    fn key(&mut self, field: &Field) {
        if !std::mem::take(&mut self.first) {
            self.line.push(',');
        }
        push_json_str(self.line, field.name());
        self.line.push(':');
    }
}

impl Visit for JsonFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.key(field);
        push_json_str(self.line, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        picomq_http::digits::push_decimal(self.line, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.key(field);
        push_json_str(self.line, &format!("{value:?}"));
    }
}

fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that records what reached it.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_from_every_thread_is_written_whole_and_flush_waits_for_them() {
        let sink = Arc::new(Sink::default());
        let out = Capture::default();
        {
            let (sink, mut out) = (sink.clone(), out.clone());
            std::thread::spawn(move || sink.write_loop(&mut out));
        }
        let loggers: Vec<_> = (0..4)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        sink.push(format!("thread {t} line {i}\n").as_bytes());
                    }
                })
            })
            .collect();
        for l in loggers {
            l.join().unwrap();
        }
        sink.flush(Duration::from_secs(10));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 20_000);
        for t in 0..4 {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let expected: Vec<String> =
                (0..5_000).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, expected, "thread {t}'s lines, whole and in order");
        }
    }

    /// What `write` pushes into a sink with a running writer, once flushed.
    fn sink_output(write: impl FnOnce(&Arc<Sink>)) -> String {
        let sink = Arc::new(Sink::default());
        let out = Capture::default();
        {
            let (sink, mut out) = (sink.clone(), out.clone());
            std::thread::spawn(move || sink.write_loop(&mut out));
        }
        write(&sink);
        sink.flush(Duration::from_secs(10));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// Runs `log` under a subscriber with only the access layer; returns its output.
    fn access_output(json: bool, log: impl FnOnce()) -> String {
        sink_output(|sink| {
            let layer = AccessLayer {
                sink: sink.clone(),
                json,
            };
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), log);
        })
    }

    fn log_request(path: &str) {
        tracing::info!(target: "picomq::access", id = "1-a", method = "PUT", path, status = 201u16, latency_us = 42u64, "request");
    }

    /// What a [`DirectAccess`] with the given filter answers writes for `line`.
    fn direct_output(json: bool, info: bool, warn: bool, line: &picomq_http::AccessLine) -> String {
        use picomq_http::AccessLog as _;
        sink_output(|sink| {
            let direct = DirectAccess {
                sink: sink.clone(),
                json,
                info,
                warn,
            };
            direct.write(line);
        })
    }

    /// A line without its timestamp (what differs between two writes of it).
    fn untimed(line: &str) -> &str {
        match line.find(r#"","level""#) {
            Some(i) => &line[i..],
            None => line.split_once(' ').map_or(line, |(_, rest)| rest),
        }
    }

    #[test]
    fn direct_access_lines_read_as_the_layers_lines() {
        for json in [false, true] {
            for (path, status) in [("/v1/stream/a", 201u16), ("/x\"y\n\u{e9}\u{1}\\", 503)] {
                let line = picomq_http::AccessLine {
                    id: "1-a",
                    method: "PUT",
                    path,
                    status,
                    latency_us: 42,
                };
                let layered = access_output(json, || {
                    if status >= 500 {
                        tracing::warn!(target: "picomq::access", id = "1-a", method = "PUT", path, status, latency_us = 42u64, "request failed");
                    } else {
                        tracing::info!(target: "picomq::access", id = "1-a", method = "PUT", path, status, latency_us = 42u64, "request");
                    }
                });
                let direct = direct_output(json, true, true, &line);
                assert!(!direct.is_empty());
                assert_eq!(untimed(&direct), untimed(&layered), "json {json}");
            }
        }
        // The filter's answers: `picomq::access=warn` keeps only failures.
        let line = |status| picomq_http::AccessLine {
            id: "1",
            method: "GET",
            path: "/",
            status,
            latency_us: 1,
        };
        assert_eq!(direct_output(false, false, true, &line(200)), "");
        assert!(direct_output(false, false, true, &line(500)).contains(" WARN "));
        assert_eq!(direct_output(true, false, false, &line(500)), "");
    }

    #[test]
    fn times_and_numbers_read_as_the_formatters_write_them() {
        let epoch = UNIX_EPOCH;
        for t in [
            epoch,
            epoch + Duration::from_micros(1_764_567_256_000_001),
            epoch + Duration::from_micros(1_764_567_256_999_999),
            // The next second on the same thread: the cached part must change.
            epoch + Duration::from_micros(1_764_567_257_000_000),
            epoch + Duration::from_micros(1_764_567_257_123_456),
            epoch + Duration::from_micros(4_102_444_799_999_999),
            epoch + Duration::from_nanos(1_764_567_257_123_456_789),
        ] {
            let mut line = String::from("x");
            push_time(&mut line, t);
            assert_eq!(line, format!("x{}", humantime::format_rfc3339_micros(t)));
        }
        for v in [0, 7, 10, 42, 999, 1_000_000, u64::MAX] {
            let mut line = String::new();
            picomq_http::digits::push_decimal(&mut line, v);
            assert_eq!(line, v.to_string());
        }
    }

    #[test]
    fn access_lines_keep_the_fmt_layers_text_shape() {
        let text = access_output(false, || log_request("/v1/stream/a"));
        let (time, rest) = text.split_once(' ').unwrap();
        assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
        assert_eq!(
            rest,
            " INFO picomq::access: request id=\"1-a\" method=\"PUT\" path=\"/v1/stream/a\" status=201 latency_us=42\n"
        );
        // Anything unusual in a string is escaped as `{:?}` escapes it.
        let odd = "/a\"b\\c\u{e9}\u{1}";
        let text = access_output(false, || log_request(odd));
        assert!(text.contains(&format!(" path={odd:?} ")), "{text}");
    }

    #[test]
    fn access_lines_in_json_carry_every_field() {
        let text = access_output(true, || {
            log_request("/x\"y\n");
            tracing::warn!(target: "picomq::access", id = "1-b", status = 503u16, "request failed");
        });
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2);
        let v = &lines[0];
        assert!(humantime::parse_rfc3339(v["timestamp"].as_str().unwrap()).is_ok());
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "picomq::access");
        assert_eq!(
            v["fields"],
            serde_json::json!({"message": "request", "id": "1-a", "method": "PUT", "path": "/x\"y\n", "status": 201, "latency_us": 42})
        );
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["fields"]["message"], "request failed");
        assert_eq!(lines[1]["fields"]["status"], 503);
    }
}
