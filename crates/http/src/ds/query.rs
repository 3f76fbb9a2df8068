//! Request-target parsing for stream URLs: the stream name from the path (rejecting
//! traversal and control characters) and the read parameters from the query.

use crate::error::ApiError;

/// Percent-decodes `s`; `None` if an escape is malformed or the result is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                out.push(v);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The stream name a request path addresses: the path without its leading `/`.
pub fn stream_name(path: &str, max_bytes: usize) -> Result<String, ApiError> {
    let name = path.strip_prefix('/').unwrap_or(path);
    if name.is_empty() {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            "no stream at /; streams live at any other path, e.g. /v1/stream/NAME",
        ));
    }
    if name.len() > max_bytes {
        return Err(ApiError::bad_request(format!(
            "stream name is {} bytes; the limit is {max_bytes}",
            name.len()
        )));
    }
    for segment in name.split('/') {
        // Most segments have nothing to decode: check them in place, no allocation.
        let decoded = if segment.bytes().any(|b| b == b'%' || b == b'+') {
            std::borrow::Cow::Owned(percent_decode(segment).ok_or_else(|| {
                ApiError::bad_request("stream path has a malformed percent-escape")
            })?)
        } else {
            std::borrow::Cow::Borrowed(segment)
        };
        if segment.is_empty() {
            return Err(ApiError::bad_request(
                "stream path has an empty segment (// or a trailing /)",
            ));
        }
        if decoded == "." || decoded == ".." || decoded.contains('/') || decoded.contains('\\') {
            return Err(ApiError::bad_request(
                "stream path must not contain . or .. segments or encoded slashes",
            ));
        }
        if decoded.chars().any(|c| c.is_control()) {
            return Err(ApiError::bad_request(
                "stream path must not contain control characters",
            ));
        }
    }
    Ok(name.to_string())
}

/// A stream name given in a request body (a dead-letter stream, say) that must be
/// one a request can create and then address: the characters of a URL path as
/// sent (escapes as `%XX`), the rules of [`stream_name`], and not reserved (`__`).
pub fn addressable_name(name: &str, max_bytes: usize) -> Result<String, ApiError> {
    let pchar = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@%/".contains(&b);
    if name.is_empty() {
        return Err(ApiError::bad_request("stream name is empty"));
    }
    if !name.bytes().all(pchar) {
        return Err(ApiError::bad_request(format!(
            "stream name {name:?} has characters a URL path cannot carry as they are (send them as %XX escapes)"
        )));
    }
    let name = stream_name(&format!("/{name}"), max_bytes)?;
    if name.starts_with("__") {
        return Err(ApiError::bad_request(format!(
            "stream name {name:?} is reserved (names starting with __ are the server's)"
        )));
    }
    Ok(name)
}

#[derive(Debug, Default)]
pub struct ReadParams {
    pub offset: Option<String>,
    pub live: Option<String>,
    pub cursor: Option<String>,
    /// `consumer=NAME`: without an offset, read from NAME's committed position.
    pub consumer: Option<String>,
    /// `timestamp=T` (ms since the Unix epoch, or RFC 3339): start at the first
    /// append at or after `T` instead of an offset (docs/native-api.md).
    pub timestamp: Option<u64>,
}

/// A time in a query: milliseconds since the Unix epoch, or RFC 3339.
pub fn timestamp_param(name: &str, value: &str) -> Result<u64, ApiError> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) && value.len() <= 15 {
        return value
            .parse()
            .map_err(|_| ApiError::bad_request(format!("{name} is not a time")));
    }
    picomq_engine::units::parse_rfc3339_ms(value).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{name}={value:?} is not a time: use milliseconds since the Unix epoch or RFC 3339 (2026-12-04T10:00:00Z)"
        ))
    })
}

pub fn read_params(query: Option<&str>) -> Result<ReadParams, ApiError> {
    let mut params = ReadParams::default();
    let mut offsets = 0;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)
            .ok_or_else(|| ApiError::bad_request(format!("query parameter {key} is malformed")))?;
        match key {
            "offset" => {
                offsets += 1;
                params.offset = Some(value);
            }
            "live" => params.live = Some(value),
            "cursor" => params.cursor = Some(value),
            "consumer" => params.consumer = Some(value),
            "timestamp" => {
                if params.timestamp.is_some() {
                    return Err(ApiError::bad_request("timestamp may be given only once"));
                }
                params.timestamp = Some(timestamp_param("timestamp", &value)?);
            }
            _ => {}
        }
    }
    if offsets > 1 {
        return Err(ApiError::bad_request("offset may be given only once"));
    }
    if offsets > 0 && params.timestamp.is_some() {
        return Err(ApiError::bad_request("give offset or timestamp, not both"));
    }
    if params.offset.as_deref() == Some("") {
        return Err(ApiError::bad_request("offset is empty"));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_bodies_must_be_addressable() {
        let ok = |n: &str| addressable_name(n, 100).is_ok();
        assert!(ok("dead/letters"));
        assert!(ok("a%20b"));
        for bad in [
            "",
            "a/../b",
            "..",
            "a/.",
            "a//b",
            "a/",
            "a b",
            "a?b",
            "a#b",
            "__x",
            "a%2Fb",
            "a%zz",
            "caf\u{e9}",
        ] {
            assert!(!ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_reject_traversal() {
        assert_eq!(stream_name("/v1/stream/a", 100).unwrap(), "v1/stream/a");
        for bad in [
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a/%2e%2e/b",
            "/a/%2F",
            "/a/b/",
            "/a/%00",
        ] {
            assert!(stream_name(bad, 100).is_err(), "{bad}");
        }
        assert!(stream_name(&format!("/{}", "x".repeat(101)), 100).is_err());
    }

    #[test]
    fn query_rejects_repeated_offset() {
        assert!(read_params(Some("offset=1&offset=2")).is_err());
        assert!(read_params(Some("offset=")).is_err());
        let p = read_params(Some("offset=-1&live=sse&cursor=5")).unwrap();
        assert_eq!(p.offset.as_deref(), Some("-1"));
        assert_eq!(p.live.as_deref(), Some("sse"));
        let t = read_params(Some("timestamp=2026-12-04T10:00:00Z&live=long-poll")).unwrap();
        assert_eq!(t.timestamp, Some(1_796_378_400_000));
        assert_eq!(read_params(Some("timestamp=7")).unwrap().timestamp, Some(7));
        for bad in [
            "timestamp=yesterday",
            "timestamp=1&timestamp=2",
            "timestamp=1&offset=-1",
            "timestamp=-5",
        ] {
            assert!(read_params(Some(bad)).is_err(), "{bad}");
        }
    }
}
