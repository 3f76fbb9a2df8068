//! A one-line progress display on stderr for `append`: records, records/s, bytes and,
//! when the input size is known, a bar and an ETA. Redrawn five times a second by its
//! own task from counters the sender bumps; shown only on a terminal, and only when
//! the input is large (a big file, or a pipe still running after a second).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Inputs smaller than this finish too fast for a display to help.
const LARGE_INPUT_BYTES: u64 = 4 << 20;
/// A pipe of unknown size gets a display once it has run this long.
const SHOW_PIPE_AFTER: Duration = Duration::from_secs(1);
const REDRAW_EVERY: Duration = Duration::from_millis(200);
const BAR_WIDTH: usize = 24;

/// Counters of acknowledged work, shared with the drawing task.
#[derive(Default)]
pub struct Counters {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    done: AtomicBool,
}

pub struct Progress {
    pub counters: Arc<Counters>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// `input_bytes`: the size of stdin if it is a regular file.
    pub fn start(enabled: bool, input_bytes: Option<u64>) -> Progress {
        let counters = Arc::new(Counters::default());
        let show_after = match input_bytes {
            Some(n) if n >= LARGE_INPUT_BYTES => Some(Duration::ZERO),
            Some(_) => None,
            None => Some(SHOW_PIPE_AFTER),
        };
        let task = match show_after {
            Some(after) if enabled && std::io::stderr().is_terminal() => {
                Some(tokio::spawn(draw(counters.clone(), input_bytes, after)))
            }
            _ => None,
        };
        Progress { counters, task }
    }

    /// Stops drawing and clears the line.
    pub async fn finish(mut self) {
        self.counters.done.store(true, Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn draw(c: Arc<Counters>, total_bytes: Option<u64>, after: Duration) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(REDRAW_EVERY);
    let mut drawn = false;
    // Rate over the last few redraws, so it follows changes but does not flicker.
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    while !c.done.load(Relaxed) {
        tick.tick().await;
        if started.elapsed() < after {
            continue;
        }
        let now = Instant::now();
        let records = c.records.load(Relaxed);
        let bytes = c.bytes.load(Relaxed);
        window.push_back((now, records));
        if window.len() > 10 {
            window.pop_front();
        }
        let (t0, r0) = window.front().copied().unwrap_or((started, 0));
        let secs = now.duration_since(t0).as_secs_f64();
        let rate = if secs > 0.0 {
            (records - r0) as f64 / secs
        } else {
            0.0
        };
        let line = render(records, bytes, rate, total_bytes, started.elapsed());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
        drawn = true;
    }
    if drawn {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K");
        let _ = err.flush();
    }
}

fn render(records: u64, bytes: u64, rate: f64, total: Option<u64>, elapsed: Duration) -> String {
    let mut line = String::with_capacity(96);
    if let Some(total) = total.filter(|t| *t > 0) {
        let frac = (bytes as f64 / total as f64).min(1.0);
        let filled = (frac * BAR_WIDTH as f64).round() as usize;
        line.push_str(&format!(
            "{:3.0}% [{}{}] ",
            frac * 100.0,
            "#".repeat(filled),
            "-".repeat(BAR_WIDTH - filled)
        ));
    }
    line.push_str(&format!(
        "{} records  {} rec/s  {}",
        group(records),
        group(rate as u64),
        size(bytes)
    ));
    if let Some(total) = total {
        let secs = elapsed.as_secs_f64();
        if bytes > 0 && bytes < total && secs > 0.0 {
            let eta = (total - bytes) as f64 / (bytes as f64 / secs);
            line.push_str(&format!("  ETA {}s", eta.ceil() as u64));
        }
    }
    line
}

/// 1234567 -> "1,234,567".
fn group(n: u64) -> String {
    let digits = n.to_string();
    let first = match digits.len() % 3 {
        0 => 3,
        r => r,
    };
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    out.push_str(&digits[..first]);
    for chunk in digits.as_bytes()[first..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(chunk).expect("ASCII digits"));
    }
    out
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_readable_line() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(3 << 20), "3.0 MiB");
        assert_eq!(
            render(
                1000,
                512 << 10,
                2500.0,
                Some(1 << 20),
                Duration::from_secs(2)
            ),
            " 50% [############------------] 1,000 records  2,500 rec/s  512.0 KiB  ETA 2s"
        );
        assert_eq!(
            render(10, 100, 5.0, None, Duration::from_secs(2)),
            "10 records  5 rec/s  100 B"
        );
    }
}
