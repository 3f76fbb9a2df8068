//! The progress line on stderr (rewritten in place on a terminal, one line every
//! 5 s otherwise), and the server RSS sampler that rides along with it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Workload;
use crate::driver::Window;
use crate::payload::now_us;
use crate::proc;
use crate::stats::Stats;

pub struct Progress {
    stop: watch::Sender<bool>,
    task: JoinHandle<Option<u64>>,
}

const RSS_EVERY: Duration = Duration::from_millis(250);

impl Progress {
    /// Starts the line and the sampler; `start_us` is when the writers begin.
    pub fn start(w: &Workload, stats: Arc<Stats>, window: Arc<Window>, start_us: u64) -> Progress {
        let (stop, mut stopped) = watch::channel(false);
        let show = w.progress;
        let pid = w.server_pid;
        let tty = std::io::stderr().is_terminal();
        let print_every = if tty { 4 } else { 20 };
        let task = tokio::spawn(async move {
            let mut peak: Option<u64> = None;
            let mut tick = tokio::time::interval(RSS_EVERY);
            let mut ticks = 0u64;
            let mut last_records = 0u64;
            let mut last_us = now_us();
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.wait_for(|s| *s) => break,
                }
                if let Some(s) = pid.and_then(proc::sample) {
                    peak = Some(peak.unwrap_or(0).max(s.rss_bytes));
                }
                ticks += 1;
                if !show || !ticks.is_multiple_of(print_every) {
                    continue;
                }
                let now = now_us();
                let records = stats.acked_records.load(Ordering::Relaxed);
                let rate = (records - last_records) as f64 * 1e6 / (now - last_us).max(1) as f64;
                (last_records, last_us) = (records, now);
                let (from, to) = window.bounds();
                let phase = if now < from {
                    "warm-up"
                } else if now < to {
                    "measure"
                } else {
                    "drain"
                };
                let ack = stats.ack.merged();
                let mut line = format!(
                    "[{:6.1}s] {phase:<7} {:>10.0} rec/s  acked {:>11}  ack p99 {:>8.2} ms  errors {}",
                    now.saturating_sub(start_us) as f64 / 1e6,
                    rate,
                    records,
                    ack.value_at_quantile(0.99) as f64 / 1000.0,
                    stats.errors.total(),
                );
                let e2e = stats.e2e.merged();
                if !e2e.is_empty() {
                    line.push_str(&format!(
                        "  e2e p99 {:.2} ms",
                        e2e.value_at_quantile(0.99) as f64 / 1000.0
                    ));
                }
                if let Some(p) = peak {
                    line.push_str(&format!("  server RSS {} MiB", p >> 20));
                }
                let mut err = std::io::stderr().lock();
                if tty {
                    let _ = write!(err, "\r\x1b[2K{line}");
                } else {
                    let _ = writeln!(err, "{line}");
                }
                let _ = err.flush();
            }
            if show && tty {
                let _ = writeln!(std::io::stderr());
            }
            peak
        });
        Progress { stop, task }
    }

    /// Stops; returns the highest server RSS sampled, in bytes.
    pub async fn stop(self) -> Option<u64> {
        let _ = self.stop.send(true);
        self.task.await.ok().flatten()
    }
}
