//! The server's own counters, when it serves Prometheus text at /metrics: scraped
//! before and after the measured window, compared by name. Servers without /metrics
//! (most peers) simply have none.

use std::collections::HashMap;

use crate::conn::Target;
use crate::BenchError;

/// Series names this bench reads, as PicoMQ exposes them.
pub const WAL_OBJECTS: &str = "picomq_wal_objects_written_total";
pub const STORE_REQUESTS: &str = "picomq_object_store_requests_total";
pub const STORE_DURATION: &str = "picomq_object_store_request_duration_seconds";
pub const ACTIVE_STREAMS: &str = "picomq_active_streams";
/// Server-side latency histograms (seconds): an append inside the engine, and a WAL
/// object's commit (oldest op buffered until durable).
pub const APPEND_DURATION: &str = "picomq_append_duration_seconds";
pub const WAL_COMMIT: &str = "picomq_wal_commit_seconds";
/// The standard process collector's names (any server that has one).
pub const PROCESS_CPU: &str = "process_cpu_seconds_total";
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";

/// A sample's labels, as (name, value) pairs.
type Labels = Vec<(String, String)>;

/// One scrape: every sample, keyed by name, with its labels.
#[derive(Debug, Default, Clone)]
pub struct Scrape {
    samples: HashMap<String, Vec<(Labels, f64)>>,
}

pub struct Scraper {
    target: Target,
    path: String,
}

impl Scraper {
    pub fn new(url: &str) -> Result<Scraper, BenchError> {
        let (_, authority, path) = crate::config::split_url(url)?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&authority)
            .map_err(|e| BenchError::Config(format!("--metrics-url {url}: {e}")))?
            .next()
            .ok_or_else(|| BenchError::Config(format!("--metrics-url {url}: no address")))?;
        Ok(Scraper {
            target: Target {
                addr,
                authority,
                http2: false,
            },
            path: if path.is_empty() { "/".into() } else { path },
        })
    }

    /// `None` when the server has no Prometheus endpoint there.
    pub async fn scrape(&self) -> Option<Scrape> {
        let mut conn = self.target.conn();
        let answer = conn.get(&self.path).await.ok()?;
        if !answer.status.is_success() {
            return None;
        }
        let text = std::str::from_utf8(&answer.body).ok()?;
        let scrape = Scrape::parse(text);
        (!scrape.samples.is_empty()).then_some(scrape)
    }
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut samples: HashMap<String, Vec<(Labels, f64)>> = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = match line.rsplit_once(' ') {
                Some(p) => p,
                None => continue,
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
                None => (series.trim(), Vec::new()),
            };
            samples
                .entry(name.to_string())
                .or_default()
                .push((labels, value));
        }
        Scrape { samples }
    }

    /// Sum of the samples of `name` whose labels include all of `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let series = self.samples.get(name)?;
        let mut total = None;
        for (labels, v) in series {
            let matches = want
                .iter()
                .all(|(k, wv)| labels.iter().any(|(lk, lv)| lk == k && lv == wv));
            if matches {
                *total.get_or_insert(0.0) += v;
            }
        }
        total
    }
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(',').trim().to_string(), value));
        rest = &after[end..];
    }
    out
}

/// Counter growth between two scrapes (`None` if either lacks the series).
pub fn delta(before: &Scrape, after: &Scrape, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    Some(after.sum(name, want)? - before.sum(name, want)?)
}

/// The `q` quantile (0..1) of what a histogram observed between two scrapes, in the
/// histogram's unit: linear within the bucket it falls in (Prometheus's
/// `histogram_quantile`), so only as fine as the bucket bounds. `None` without the
/// series or without observations; the last finite bound when `q` falls past it.
pub fn quantile(
    before: &Scrape,
    after: &Scrape,
    name: &str,
    want: &[(&str, &str)],
    q: f64,
) -> Option<f64> {
    let bucket = format!("{name}_bucket");
    // Cumulative counts by upper bound, summed over the series matching `want`.
    let by_le = |scrape: &Scrape| -> Option<Vec<(f64, f64)>> {
        let mut out: Vec<(f64, f64)> = Vec::new();
        for (labels, v) in scrape.samples.get(&bucket)? {
            let matches = want
                .iter()
                .all(|(k, wv)| labels.iter().any(|(lk, lv)| lk == k && lv == wv));
            let le = labels.iter().find(|(k, _)| k == "le").and_then(|(_, v)| {
                if v == "+Inf" {
                    Some(f64::INFINITY)
                } else {
                    v.parse::<f64>().ok()
                }
            });
            let (true, Some(le)) = (matches, le) else {
                continue;
            };
            match out.iter_mut().find(|(l, _)| *l == le) {
                Some((_, c)) => *c += v,
                None => out.push((le, *v)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(out)
    };
    let was = by_le(before).unwrap_or_default();
    let buckets: Vec<(f64, f64)> = by_le(after)?
        .into_iter()
        .map(|(le, c)| {
            let before = was.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, c)| *c);
            (le, c - before)
        })
        .collect();
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, cumulative) in &buckets {
        if cumulative >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = cumulative - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        (lower, below) = (le, cumulative);
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_window_only_and_interpolate_in_a_bucket() {
        let hist = |b: [f64; 4]| {
            Scrape::parse(&format!(
                "h_bucket{{le=\"0.001\"}} {}\nh_bucket{{le=\"0.002\"}} {}\nh_bucket{{le=\"0.005\"}} {}\nh_bucket{{le=\"+Inf\"}} {}\n",
                b[0], b[1], b[2], b[3]
            ))
        };
        // Before the window: 50 fast observations. In it: 10 under 1 ms, 80 in
        // 1-2 ms, 10 in 2-5 ms.
        let before = hist([50.0, 50.0, 50.0, 50.0]);
        let after = hist([60.0, 140.0, 150.0, 150.0]);
        let p50 = quantile(&before, &after, "h", &[], 0.5).unwrap();
        assert!((p50 - 0.0015).abs() < 1e-9, "{p50}");
        let p99 = quantile(&before, &after, "h", &[], 0.99).unwrap();
        assert!((p99 - 0.0047).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(&before, &before, "h", &[], 0.5), None);
        assert_eq!(quantile(&before, &after, "missing", &[], 0.5), None);
        // Past the last finite bound: that bound.
        let slow = hist([60.0, 60.0, 60.0, 150.0]);
        assert_eq!(quantile(&before, &slow, "h", &[], 0.99), Some(0.005));
        // Series filtered by label and summed over the others.
        let labelled = |put: f64, get: f64| {
            Scrape::parse(&format!(
                "d_bucket{{op=\"put\",store=\"a\",le=\"0.001\"}} {put}\nd_bucket{{op=\"put\",store=\"b\",le=\"0.001\"}} {put}\n\
                 d_bucket{{op=\"put\",store=\"a\",le=\"+Inf\"}} {put}\nd_bucket{{op=\"put\",store=\"b\",le=\"+Inf\"}} {put}\n\
                 d_bucket{{op=\"get\",le=\"0.001\"}} 0\nd_bucket{{op=\"get\",le=\"+Inf\"}} {get}\n"
            ))
        };
        let (b, a) = (labelled(0.0, 0.0), labelled(4.0, 9.0));
        assert!((quantile(&b, &a, "d", &[("op", "put")], 0.5).unwrap() - 0.0005).abs() < 1e-12);
        assert_eq!(quantile(&b, &a, "d", &[("op", "get")], 0.5), Some(0.001));
    }

    #[test]
    fn labelled_samples_are_summed_by_filter() {
        let text = "# HELP x y\n# TYPE x counter\n\
            picomq_object_store_requests_total{store=\"wal\",op=\"put\",outcome=\"ok\"} 10\n\
            picomq_object_store_requests_total{store=\"meta\",op=\"put\",outcome=\"ok\"} 2\n\
            picomq_object_store_requests_total{store=\"wal\",op=\"get\",outcome=\"ok\"} 7\n\
            odd{a=\"q\\\"uote,d\"} 1.5\n\
            picomq_wal_objects_written_total 42\n";
        let s = Scrape::parse(text);
        assert_eq!(s.sum(STORE_REQUESTS, &[("op", "put")]), Some(12.0));
        assert_eq!(s.sum(STORE_REQUESTS, &[]), Some(19.0));
        assert_eq!(s.sum(WAL_OBJECTS, &[]), Some(42.0));
        assert_eq!(s.sum("odd", &[("a", "q\"uote,d")]), Some(1.5));
        assert_eq!(s.sum("missing", &[]), None);
    }
}
