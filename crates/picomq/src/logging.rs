//! The server's log. tracing's fmt layer formats each line on the thread that logs
//! it; the lines are then handed to one background thread that writes them to
//! stderr in batches. A request thus pays for formatting its access-log line but
//! not for a `write(2)` of its own: at 15,000 appends/s the per-line write to stderr
//! was a visible share of the server's CPU (docs/performance.md).
//!
//! Nothing is dropped: past `PENDING_MAX` unwritten bytes (stderr stalled), loggers
//! wait for the writer, which is what a direct write to a stalled stderr did too.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(SinkWriter(sink.clone()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
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
}
