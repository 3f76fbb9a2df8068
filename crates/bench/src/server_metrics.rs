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

#[cfg(test)]
mod tests {
    use super::*;

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
