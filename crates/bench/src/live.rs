//! Live readers for end-to-end latency: each follows one stream with SSE or
//! long-poll from its start, resumes from the last offset it was given when the
//! server ends a connection, and records, for every record it receives, the time
//! since the record's send timestamp.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use tokio::sync::watch;

use crate::conn::Target;
use crate::driver::Window;
use crate::payload::{now_us, scan};
use crate::stats::Stats;

/// Incremental `text/event-stream` parser over bytes: feed chunks, get whole events.
#[derive(Default)]
pub struct SseParser {
    /// Bytes of an incomplete line.
    line: Vec<u8>,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct SseEvent<'a> {
    pub event: &'a [u8],
    pub data: &'a [u8],
}

impl SseParser {
    /// Feeds a chunk; calls `on_event` for each event it completes.
    pub fn feed(&mut self, mut chunk: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        // memchr, not a byte loop: a 1 KiB record is one line, and searching it a byte
        // at a time was a quarter of the reader's instructions (callgrind).
        while let Some(nl) = memchr::memchr(b'\n', chunk) {
            let piece = &chunk[..nl];
            chunk = &chunk[nl + 1..];
            if self.line.is_empty() {
                self.line_done(piece, &mut on_event);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(piece);
                self.line_done(&line, &mut on_event);
                line.clear();
                self.line = line;
            }
        }
        self.line.extend_from_slice(chunk);
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.has_data || !self.event.is_empty() {
                on_event(SseEvent {
                    event: if self.event.is_empty() {
                        b"message"
                    } else {
                        &self.event
                    },
                    data: &self.data,
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

/// Percent-encodes an offset for a query string (offsets are opaque).
pub fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Records one delivery: `received_us - sent_us` for every record in `data`.
fn delivered(stats: &Stats, window: &Window, task: usize, data: &[u8]) {
    let now = now_us();
    let (from, to) = window.bounds();
    let n = scan(data, |sent| {
        if sent >= from && sent < to {
            stats.e2e.record(task, now.saturating_sub(sent));
        }
    });
    stats.live_records.fetch_add(n, Ordering::Relaxed);
}

pub struct Reader {
    pub target: Target,
    pub path: String,
    pub sse: bool,
    pub task: usize,
    pub stats: Arc<Stats>,
    pub window: Arc<Window>,
    /// Counts up once this reader's first request got its answer head.
    pub ready: Arc<tokio::sync::Semaphore>,
}

impl Reader {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut offset = "-1".to_string();
        let mut cursor: Option<String> = None;
        let mut conn = self.target.conn();
        let mut first = true;
        while !*stop.borrow() {
            let mode = if self.sse { "sse" } else { "long-poll" };
            let mut url = format!("{}?offset={}&live={mode}", self.path, encode_query(&offset));
            if let Some(c) = &cursor {
                url.push_str("&cursor=");
                url.push_str(&encode_query(c));
            }
            let opened = tokio::select! {
                r = conn.open(Method::GET, &url, None, &[], Bytes::new()) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            if first {
                first = false;
                self.ready.add_permits(1);
            }
            let resp = match opened {
                Ok(r) => r,
                Err(_) => {
                    self.failed().await;
                    continue;
                }
            };
            let status = resp.status();
            if status == StatusCode::NO_CONTENT {
                if let Some(o) = header(resp.headers(), "stream-next-offset") {
                    offset = o;
                }
                cursor = header(resp.headers(), "stream-cursor").or(cursor);
                continue;
            }
            if status != StatusCode::OK {
                self.failed().await;
                continue;
            }
            let base64 = header(resp.headers(), "stream-sse-data-encoding")
                .is_some_and(|e| e.eq_ignore_ascii_case("base64"));
            let next = header(resp.headers(), "stream-next-offset");
            cursor = header(resp.headers(), "stream-cursor").or(cursor);
            let mut body = resp.into_body();
            if !self.sse {
                let collected = tokio::select! {
                    b = body.collect() => b,
                    _ = stop.wait_for(|s| *s) => return,
                };
                match collected {
                    Ok(b) => {
                        delivered(&self.stats, &self.window, self.task, &b.to_bytes());
                        if let Some(o) = next {
                            offset = o;
                        }
                    }
                    Err(_) => self.failed().await,
                }
                continue;
            }
            let mut parser = SseParser::default();
            loop {
                let frame = tokio::select! {
                    f = body.frame() => f,
                    _ = stop.wait_for(|s| *s) => return,
                };
                let Some(Ok(frame)) = frame else { break };
                let Ok(chunk) = frame.into_data() else {
                    continue;
                };
                parser.feed(&chunk, |ev| match ev.event {
                    b"data" | b"message" => {
                        if base64 {
                            let compact: Vec<u8> =
                                ev.data.iter().copied().filter(|b| *b != b'\n').collect();
                            if let Ok(raw) =
                                base64::engine::general_purpose::STANDARD.decode(compact)
                            {
                                delivered(&self.stats, &self.window, self.task, &raw);
                            }
                        } else {
                            delivered(&self.stats, &self.window, self.task, ev.data);
                        }
                    }
                    b"control" => {
                        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(ev.data) {
                            if let Some(o) = v["streamNextOffset"].as_str() {
                                offset = o.to_string();
                            }
                            if let Some(c) = v["streamCursor"].as_str() {
                                cursor = Some(c.to_string());
                            }
                        }
                    }
                    _ => {}
                });
            }
        }
    }

    async fn failed(&self) {
        self.stats.reader_errors.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn header(h: &hyper::HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |e| {
                out.push((
                    String::from_utf8_lossy(e.event).into_owned(),
                    String::from_utf8_lossy(e.data).into_owned(),
                ))
            });
        }
        out
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let got = events(&[
            b"event: data\nda",
            b"ta:[1,\ndata: 2]\n",
            b"\nevent: control\r\ndata:{\"streamNextOffset\":\"5\"}\r\n\r\n: comment\n\n",
        ]);
        assert_eq!(
            got,
            vec![
                ("data".into(), "[1,\n2]".into()),
                ("control".into(), "{\"streamNextOffset\":\"5\"}".into()),
            ]
        );
    }

    #[test]
    fn offsets_are_percent_encoded() {
        assert_eq!(encode_query("0000_0012"), "0000_0012");
        assert_eq!(encode_query("a+b/c"), "a%2Bb%2Fc");
    }
}
