//! Header names and header parsing: the one place that knows how a Durable Streams
//! header is spelled and what values it accepts. Names are `HeaderName` constants:
//! a `&str` name would be parsed and hashed again on every request and response.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// A header (or a header-like value) that is not what its rule allows; a 400 with
/// this message (`error.rs`).
#[derive(Debug)]
pub struct BadHeader(pub String);

pub const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static("stream-next-offset");
pub const STREAM_UP_TO_DATE: HeaderName = HeaderName::from_static("stream-up-to-date");
pub const STREAM_CURSOR: HeaderName = HeaderName::from_static("stream-cursor");
pub const STREAM_CLOSED: HeaderName = HeaderName::from_static("stream-closed");
pub const STREAM_TTL: HeaderName = HeaderName::from_static("stream-ttl");
pub const STREAM_EXPIRES_AT: HeaderName = HeaderName::from_static("stream-expires-at");
/// Extension: the first retained offset (reads below it answer 410).
pub const STREAM_START_OFFSET: HeaderName = HeaderName::from_static("stream-start-offset");
/// Extension: age retention in seconds (PUT sets it, HEAD reports it).
pub const STREAM_RETENTION: HeaderName = HeaderName::from_static("stream-retention");
/// The subject a stream is bound to (docs/schemas.md): on create, and on reads.
pub const STREAM_SCHEMA_SUBJECT: HeaderName = HeaderName::from_static("stream-schema-subject");
/// The version of that subject appends are checked against (a pinned one, or for
/// a JSON stream the latest).
pub const STREAM_SCHEMA_VERSION: HeaderName = HeaderName::from_static("stream-schema-version");
pub const STREAM_SEQ: HeaderName = HeaderName::from_static("stream-seq");
pub const STREAM_FORKED_FROM: HeaderName = HeaderName::from_static("stream-forked-from");
pub const STREAM_FORK_OFFSET: HeaderName = HeaderName::from_static("stream-fork-offset");
pub const STREAM_FORK_SUB_OFFSET: HeaderName = HeaderName::from_static("stream-fork-sub-offset");
pub const STREAM_SSE_DATA_ENCODING: HeaderName =
    HeaderName::from_static("stream-sse-data-encoding");
pub const PRODUCER_ID: HeaderName = HeaderName::from_static("producer-id");
pub const PRODUCER_EPOCH: HeaderName = HeaderName::from_static("producer-epoch");
pub const PRODUCER_SEQ: HeaderName = HeaderName::from_static("producer-seq");
pub const PRODUCER_EXPECTED_SEQ: HeaderName = HeaderName::from_static("producer-expected-seq");
pub const PRODUCER_RECEIVED_SEQ: HeaderName = HeaderName::from_static("producer-received-seq");
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const CROSS_ORIGIN_RESOURCE_POLICY: HeaderName =
    HeaderName::from_static("cross-origin-resource-policy");

pub const CORS_ALLOW_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";
pub const CORS_ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, stream-seq, stream-ttl, stream-expires-at, stream-retention, stream-closed, producer-id, producer-epoch, producer-seq, stream-forked-from, stream-fork-offset, stream-fork-sub-offset";
pub const CORS_EXPOSE_HEADERS: &str = "stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, stream-ttl, stream-expires-at, stream-start-offset, stream-retention, stream-schema-subject, stream-schema-version, stream-sse-data-encoding, producer-epoch, producer-seq, producer-expected-seq, producer-received-seq, etag, content-type, location, retry-after, x-request-id";

/// Marks a value that is new in (nearly) every response as never to be indexed by
/// HPACK, HTTP/2's header compression. Indexed, each response's offset, ETag or request
/// id went into the connection's 4 KiB header table, evicted the values that do repeat
/// (the CORS list, ~300 bytes, then sent again in full), and made the encoder compare
/// it with every earlier value of that header still in the table: ~6,600 instructions
/// per HTTP/2 append (callgrind). Never indexed, it is sent as a literal, which it
/// would have been anyway. HTTP/1.1 ignores the mark.
pub fn never_indexed(mut v: HeaderValue) -> HeaderValue {
    v.set_sensitive(true);
    v
}

/// Largest integer a JavaScript client can represent exactly (2^53 - 1).
pub const JS_SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;

/// A header's value as text; `Err` if present but not visible ASCII.
pub fn text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, BadHeader> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| BadHeader(format!("header {name} is not valid ASCII text"))),
    }
}

/// `Stream-Closed` counts only when it is exactly `true` (any case); other values are ignored.
pub fn flag_true(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A non-negative decimal integer without sign, leading zeros or exponent, at most `max`.
pub fn strict_uint(raw: &str, name: &str, max: u64) -> Result<u64, BadHeader> {
    let well_formed = !raw.is_empty()
        && raw.bytes().all(|b| b.is_ascii_digit())
        && (raw == "0" || !raw.starts_with('0'))
        && raw.len() <= 20;
    let value = well_formed
        .then(|| raw.parse::<u64>().ok())
        .flatten()
        .filter(|v| *v <= max);
    value.ok_or_else(|| {
        BadHeader(format!(
            "{name} must be a non-negative integer without sign or leading zeros, at most {max}"
        ))
    })
}

/// Digits only (leading zeros allowed), at most 2^53-1: the producer epoch/seq rule.
pub fn producer_uint(raw: &str, name: &str) -> Result<u64, BadHeader> {
    let value = (!raw.is_empty() && raw.len() <= 20 && raw.bytes().all(|b| b.is_ascii_digit()))
        .then(|| raw.parse::<u64>().ok())
        .flatten()
        .filter(|v| *v <= JS_SAFE_INTEGER_MAX);
    value.ok_or_else(|| {
        BadHeader(format!(
            "{name} must be a non-negative integer at most 2^53-1"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_uint_rejects_lookalikes() {
        assert_eq!(strict_uint("3600", "t", u64::MAX).unwrap(), 3600);
        assert_eq!(strict_uint("0", "t", u64::MAX).unwrap(), 0);
        for bad in ["+3600", "03600", "3600.0", "3.6e3", "", " 1", "-1", "1a"] {
            assert!(strict_uint(bad, "t", u64::MAX).is_err(), "{bad}");
        }
    }
}
