//! Record bodies and the timestamps inside them. Every record is
//! `{"t":MICROS,"p":"xxx…"}`, exactly `record_bytes` long: valid JSON for JSON
//! streams, plain bytes otherwise, and found again by readers whatever framing the
//! server puts around it (JSON array, SSE lines, base64), so end-to-end latency
//! needs no knowledge of the server.
//!
//! With `--message-file`, every message is instead one fixed JSON document (e.g. one
//! a stream's schema accepts); it carries no timestamp.

use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

const MARKER: &[u8] = b"{\"t\":";
/// Timestamps are written with exactly this many digits: micros since the bench
/// clock's origin plus 10^15.
const DIGITS: usize = 16;
const OFFSET_US: u64 = 1_000_000_000_000_000;
/// Bytes of a record besides its padding: `{"t":` + digits + `,"p":"` + `"}`.
pub const RECORD_OVERHEAD: usize = MARKER.len() + DIGITS + 6 + 2;

/// Microseconds on a monotonic clock shared by the writers and readers of this
/// process (never compared across processes).
pub fn now_us() -> u64 {
    origin().elapsed().as_micros() as u64
}

/// The instant [`now_us`] counts from.
pub fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// A request body with `batch` records; only the timestamps change per request.
pub struct BodyTemplate {
    bytes: Vec<u8>,
    stamp_at: Vec<usize>,
    records: usize,
}

impl BodyTemplate {
    pub fn new(record_bytes: usize, batch: usize, json: bool) -> BodyTemplate {
        assert!(record_bytes > RECORD_OVERHEAD, "record too small");
        let pad = record_bytes - RECORD_OVERHEAD;
        let mut bytes = Vec::with_capacity(batch * (record_bytes + 1) + 2);
        let mut stamp_at = Vec::with_capacity(batch);
        if json {
            bytes.push(b'[');
        }
        for i in 0..batch {
            if json && i > 0 {
                bytes.push(b',');
            }
            bytes.extend_from_slice(MARKER);
            stamp_at.push(bytes.len());
            bytes.extend_from_slice(&[b'0'; DIGITS]);
            bytes.extend_from_slice(b",\"p\":\"");
            bytes.resize(bytes.len() + pad, b'x');
            bytes.extend_from_slice(b"\"}");
        }
        if json {
            bytes.push(b']');
        }
        BodyTemplate {
            bytes,
            stamp_at,
            records: batch,
        }
    }

    /// A request body with `batch` copies of `document` (checked by
    /// [`check_document`]): a JSON array of them for JSON streams, concatenated
    /// otherwise. Nothing in it changes per request.
    pub fn document(document: &[u8], batch: usize, json: bool) -> BodyTemplate {
        let mut bytes = Vec::with_capacity(batch * (document.len() + 1) + 2);
        if json {
            bytes.push(b'[');
        }
        for i in 0..batch {
            if json && i > 0 {
                bytes.push(b',');
            }
            bytes.extend_from_slice(document);
        }
        if json {
            bytes.push(b']');
        }
        BodyTemplate {
            bytes,
            stamp_at: Vec::new(),
            records: batch,
        }
    }

    pub fn records(&self) -> usize {
        self.records
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A body whose records all carry `at_us`.
    pub fn render(&self, at_us: u64) -> Bytes {
        let mut out = BytesMut::from(&self.bytes[..]);
        let digits = stamp_digits(at_us);
        for &at in &self.stamp_at {
            out[at..at + DIGITS].copy_from_slice(&digits);
        }
        out.freeze()
    }
}

fn stamp_digits(at_us: u64) -> [u8; DIGITS] {
    let mut v = at_us.min(OFFSET_US - 1) + OFFSET_US;
    let mut d = [b'0'; DIGITS];
    for slot in d.iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
    d
}

/// The largest document `--message-file` accepts.
pub const DOCUMENT_BYTES_MAX: usize = 1 << 20;

/// Reads the document of `--message-file` and checks it (see [`check_document`]).
pub fn load_document(path: &Path) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    std::fs::File::open(path)
        // Whitespace around the document is allowed, so read a little past the limit
        // before judging; never the whole of a huge file.
        .and_then(|f| f.take(2 * DOCUMENT_BYTES_MAX as u64).read_to_end(&mut raw))
        .map_err(|e| format!("--message-file {}: {e}", path.display()))?;
    check_document(&raw).map_err(|e| format!("--message-file {}: {e}", path.display()))
}

/// One JSON value to send as a message: not empty, at most [`DOCUMENT_BYTES_MAX`]
/// bytes once the whitespace around it is trimmed, and not an array (a JSON stream
/// stores an array's elements as separate messages). Returned as written, trimmed.
pub fn check_document(raw: &[u8]) -> Result<Vec<u8>, String> {
    let text = raw.trim_ascii();
    if text.is_empty() {
        return Err("empty: it must hold one JSON document".into());
    }
    if text.len() > DOCUMENT_BYTES_MAX {
        return Err(format!(
            "the document is larger than {DOCUMENT_BYTES_MAX} bytes"
        ));
    }
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("not one JSON document: {e}"))?;
    if value.is_array() {
        return Err(
            "a JSON array: a JSON stream stores each element as its own message; \
             put one message in the file (--batch sends several per request)"
                .into(),
        );
    }
    Ok(text.to_vec())
}

/// Calls `found(timestamp_us)` for every record in `data`; returns how many.
/// Records split across two calls are missed (readers hand in whole responses or
/// whole SSE events, so this does not happen with either framing).
pub fn scan(data: &[u8], mut found: impl FnMut(u64)) -> u64 {
    let mut n = 0;
    let mut i = 0;
    while let Some(p) = memchr::memchr(b'{', &data[i..]) {
        let at = i + p;
        if data[at..].starts_with(MARKER) {
            let start = at + MARKER.len();
            if let Some(digits) = data.get(start..start + DIGITS) {
                if let Some(v) = parse_digits(digits) {
                    found(v.saturating_sub(OFFSET_US));
                    n += 1;
                    i = start + DIGITS;
                    continue;
                }
            }
        }
        i = at + 1;
    }
    n
}

fn parse_digits(d: &[u8]) -> Option<u64> {
    d.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + (b - b'0') as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_are_valid_and_sized_exactly() {
        let t = BodyTemplate::new(100, 3, true);
        let body = t.render(123_456);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let items = v.as_array().unwrap();
        assert_eq!(items.len(), 3);
        for item in items {
            assert_eq!(serde_json::to_vec(item).unwrap().len(), 100);
            assert_eq!(item["t"].as_u64().unwrap(), OFFSET_US + 123_456);
        }
        assert_eq!(body.len(), 3 * 100 + 2 + 2);
    }

    #[test]
    fn raw_bodies_are_concatenated_records() {
        let t = BodyTemplate::new(64, 4, false);
        assert_eq!(t.render(0).len(), 256);
    }

    #[test]
    fn document_bodies_repeat_the_document_unchanged() {
        let doc = check_document(b" \n{\"a\": 1, \"b\": [\"x\"]}\n").unwrap();
        assert_eq!(doc, b"{\"a\": 1, \"b\": [\"x\"]}");
        let t = BodyTemplate::document(&doc, 3, true);
        assert_eq!(t.records(), 3);
        let body = t.render(42);
        assert_eq!(body.len(), t.len());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let items = v.as_array().unwrap();
        assert_eq!(items.len(), 3);
        for item in items {
            assert_eq!(item, &serde_json::json!({"a": 1, "b": ["x"]}));
        }
        // One per request: still an array of one (the document's own message).
        let one = BodyTemplate::document(&doc, 1, true).render(0);
        assert_eq!(&one[..], b"[{\"a\": 1, \"b\": [\"x\"]}]");
        let raw = BodyTemplate::document(&doc, 2, false).render(0);
        assert_eq!(raw.len(), 2 * doc.len());
        // No timestamp marker: readers find no records in it.
        assert_eq!(scan(&body, |_| {}), 0);
    }

    #[test]
    fn documents_that_are_not_one_message_are_refused() {
        assert!(check_document(b"").is_err());
        assert!(check_document(b" \n ").is_err());
        assert!(check_document(b"{\"a\":").is_err());
        assert!(check_document(b"{} {}").is_err());
        assert!(check_document(b"[{\"a\":1}]").is_err());
        let big = format!("\"{}\"", "x".repeat(DOCUMENT_BYTES_MAX));
        assert!(check_document(big.as_bytes()).is_err());
        assert!(check_document(b"\"just a string\"").is_ok());
        let dir = std::env::temp_dir().join(format!("picomq-bench-doc-{}", std::process::id()));
        assert!(load_document(&dir.join("missing.json"))
            .unwrap_err()
            .starts_with("--message-file "));
    }

    #[test]
    fn scan_finds_every_timestamp_in_any_framing() {
        let t = BodyTemplate::new(40, 5, false);
        let a = t.render(7);
        let b = BodyTemplate::new(50, 2, true).render(9);
        let mut framed = b"event: data\ndata:".to_vec();
        framed.extend_from_slice(&a);
        framed.extend_from_slice(b"\ndata:");
        framed.extend_from_slice(&b);
        framed.extend_from_slice(b"{\"t\":12}");
        let mut seen = Vec::new();
        assert_eq!(scan(&framed, |t| seen.push(t)), 7);
        assert_eq!(seen, vec![7, 7, 7, 7, 7, 9, 9]);
    }
}
