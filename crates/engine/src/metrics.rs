//! Metrics: lock-free counters and histograms, and the Prometheus text exposition
//! they are rendered into. Hand-rolled on purpose: a handful of atomics per metric,
//! no registry, no global state. Each layer owns its counters; `/metrics` asks each
//! to write itself into one [`Exposition`].

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A Prometheus histogram over fixed bucket bounds.
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bucket; the last one is `+Inf`.
    counts: Vec<AtomicU64>,
    /// Sum of observations, in millionths of the unit (atomics hold integers).
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// Latency buckets, in seconds, from about one local write (0.25 ms) to what a
/// stalled store makes of a request (10 s); fine enough between 1 and 100 ms that a
/// quantile read from them (`histogram_quantile`) is close to the true one.
pub const LATENCY_BOUNDS_S: &[f64] = &[
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Size buckets, in bytes: 256 B to 16 MiB.
pub const BYTES_BOUNDS: &[f64] = &[
    256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
];
/// Count buckets: 1 to 10,000.
pub const COUNT_BOUNDS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 10000.0,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn sum(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }
}

/// Prometheus text format (version 0.0.4), built family by family.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts a metric family: `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs (values are escaped).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The samples of one histogram (the caller starts the family).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match h.bounds.get(i) {
                Some(b) => b.to_string(),
                None => "+Inf".to_string(),
            };
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative as f64);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum());
        self.sample(&format!("{name}_count"), labels, h.count() as f64)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 5.0, 50.0] {
            h.observe(v);
        }
        let mut e = Exposition::new();
        e.family("x", "histogram", "test")
            .histogram("x", &[("op", "put")], &h);
        let text = e.finish();
        assert!(text.contains("x_bucket{op=\"put\",le=\"1\"} 2\n"), "{text}");
        assert!(
            text.contains("x_bucket{op=\"put\",le=\"10\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_bucket{op=\"put\",le=\"+Inf\"} 4\n"),
            "{text}"
        );
        assert!(text.contains("x_sum{op=\"put\"} 56.5\n"), "{text}");
        assert!(text.contains("x_count{op=\"put\"} 4\n"), "{text}");
    }
}
