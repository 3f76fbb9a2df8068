//! Record bodies and the timestamps inside them. Every record is
//! `{"t":MICROS,"p":"xxx…"}`, exactly `record_bytes` long: valid JSON for JSON
//! streams, plain bytes otherwise, and found again by readers whatever framing the
//! server puts around it (JSON array, SSE lines, base64), so end-to-end latency
//! needs no knowledge of the server.

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
