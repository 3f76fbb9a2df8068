//! Metrics: lock-free counters, gauges and histograms, and the one writer of the
//! Prometheus text exposition they are rendered into.
//!
//! Each metric is declared once, next to what it measures: a [`Desc`] (name, type,
//! help) and the counter that carries it, in the module that counts. Each module's
//! counters implement [`Source`]; `/metrics` asks every source to export itself into
//! one [`Exposition`], which groups samples by family and writes the text. No
//! registry, no global state, a handful of atomics per metric.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prometheus metric types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// What a metric family is: its name, type and help text.
#[derive(Debug)]
pub struct Desc {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Desc {
    pub const fn counter(name: &'static str, help: &'static str) -> Desc {
        Desc {
            name,
            kind: Kind::Counter,
            help,
        }
    }
    pub const fn gauge(name: &'static str, help: &'static str) -> Desc {
        Desc {
            name,
            kind: Kind::Gauge,
            help,
        }
    }
    pub const fn histogram(name: &'static str, help: &'static str) -> Desc {
        Desc {
            name,
            kind: Kind::Histogram,
            help,
        }
    }
}

/// Fixed labels of one sample of a family.
pub type Labels = &'static [(&'static str, &'static str)];

/// A monotonically increasing count.
pub struct Counter {
    desc: &'static Desc,
    labels: Labels,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(desc: &'static Desc) -> Counter {
        Counter::labelled(desc, &[])
    }
    pub const fn labelled(desc: &'static Desc, labels: Labels) -> Counter {
        Counter {
            desc,
            labels,
            value: AtomicU64::new(0),
        }
    }
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (never below zero).
pub struct Gauge {
    desc: &'static Desc,
    labels: Labels,
    value: AtomicU64,
}

impl Gauge {
    pub const fn new(desc: &'static Desc) -> Gauge {
        Gauge {
            desc,
            labels: &[],
            value: AtomicU64::new(0),
        }
    }
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }
    pub fn sub(&self, n: u64) {
        let _ = self
            .value
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }
    pub fn set(&self, v: u64) {
        self.value.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A Prometheus histogram over fixed bucket bounds.
pub struct Histogram {
    desc: &'static Desc,
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
    pub fn new(desc: &'static Desc, bounds: &'static [f64]) -> Histogram {
        Histogram {
            desc,
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

/// Something that owns metrics and exports them.
pub trait Source {
    fn export(&self, out: &mut Exposition);
}

/// The Prometheus text format (version 0.0.4). Samples are grouped by family in the
/// order families were first seen, whichever source contributed them.
#[derive(Default)]
pub struct Exposition {
    families: Vec<(&'static Desc, String)>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn samples_of(&mut self, desc: &'static Desc) -> &mut String {
        let i = match self.families.iter().position(|(d, _)| d.name == desc.name) {
            Some(i) => i,
            None => {
                self.families.push((desc, String::new()));
                self.families.len() - 1
            }
        };
        &mut self.families[i].1
    }

    /// One sample of `desc`'s family with `labels` (values are escaped).
    pub fn value(&mut self, desc: &'static Desc, labels: &[(&str, &str)], value: f64) -> &mut Self {
        sample(self.samples_of(desc), desc.name, "", labels, None, value);
        self
    }

    pub fn counter(&mut self, c: &Counter) -> &mut Self {
        self.value(c.desc, c.labels, c.get() as f64)
    }

    pub fn gauge(&mut self, g: &Gauge) -> &mut Self {
        self.value(g.desc, g.labels, g.get() as f64)
    }

    /// The samples of one histogram, with `labels`.
    pub fn histogram(&mut self, h: &Histogram, labels: &[(&str, &str)]) -> &mut Self {
        let out = self.samples_of(h.desc);
        let mut cumulative = 0u64;
        let mut le = String::new();
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            le.clear();
            match h.bounds.get(i) {
                Some(b) => {
                    let _ = write!(le, "{b}");
                }
                None => le.push_str("+Inf"),
            }
            sample(
                out,
                h.desc.name,
                "_bucket",
                labels,
                Some(&le),
                cumulative as f64,
            );
        }
        sample(out, h.desc.name, "_sum", labels, None, h.sum());
        sample(out, h.desc.name, "_count", labels, None, h.count() as f64);
        self
    }

    pub fn finish(self) -> String {
        let mut text = String::new();
        for (desc, samples) in self.families {
            let _ = writeln!(
                text,
                "# HELP {} {}\n# TYPE {} {}",
                desc.name,
                desc.help,
                desc.name,
                desc.kind.name()
            );
            text.push_str(&samples);
        }
        text
    }
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let all = labels.iter().copied().chain(le.map(|le| ("le", le)));
        for (i, (k, v)) in all.enumerate() {
            if i > 0 {
                out.push(',');
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(out, "{k}=\"{v}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    static X: Desc = Desc::histogram("x", "test");
    static Y: Desc = Desc::counter("y_total", "test counter");
    static Z: Desc = Desc::gauge("z", "test gauge");

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&X, &[1.0, 10.0]);
        for v in [0.5, 1.0, 5.0, 50.0] {
            h.observe(v);
        }
        let mut e = Exposition::new();
        e.histogram(&h, &[("op", "put")]);
        let text = e.finish();
        assert!(
            text.starts_with("# HELP x test\n# TYPE x histogram\n"),
            "{text}"
        );
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

    #[test]
    fn samples_of_one_family_stay_together_whoever_exports_them() {
        static A: Counter = Counter::labelled(&Y, &[("tier", "memory")]);
        static B: Counter = Counter::labelled(&Y, &[("tier", "store")]);
        let g = Gauge::new(&Z);
        A.add(2);
        B.inc();
        g.add(5);
        g.sub(7);
        let mut e = Exposition::new();
        e.counter(&A)
            .gauge(&g)
            .counter(&B)
            .value(&Z, &[("q", "a\"b")], 1.5);
        assert_eq!(
            e.finish(),
            "# HELP y_total test counter\n# TYPE y_total counter\ny_total{tier=\"memory\"} 2\ny_total{tier=\"store\"} 1\n\
             # HELP z test gauge\n# TYPE z gauge\nz 0\nz{q=\"a\\\"b\"} 1.5\n"
        );
    }
}
