//! What every handler reads from a request before it knows what the request is
//! for: the body (under its size limit and deadline) and a stream name from a path
//! (percent-escapes decoded, traversal and control characters refused).

use axum::body::Body;
use axum::http::StatusCode;

use crate::error::ApiError;

/// Bytes past the limit a body may still bring that are read and dropped before its
/// 413 is sent (see [`read_body`]).
pub const DRAIN_BYTES_MAX: u64 = 16 << 20;

/// Reads a request body, refusing more than `limit` bytes with 413 and a body that
/// takes longer than `timeout` to arrive with 408.
///
/// The body is copied into an allocation of its own size. hyper hands a body over as
/// a slice of the connection's read buffer (8 KiB or more), and the records cut from
/// it live on in the tail cache, so a 1 KiB append kept that whole buffer alive and
/// made hyper allocate a fresh one for the next request on the connection: the cache
/// pinned ~8x the bytes it counted, and the fresh buffers were most of the server's
/// page faults under load. One memcpy of the body is cheaper than either.
///
/// A body over the limit is still read (and dropped) up to [`DRAIN_BYTES_MAX`] past
/// it: answered with its body unread, the connection is closed under a client that is
/// still sending, which then sees a reset rather than the 413. Past that allowance
/// the 413 goes out at once and the connection closes.
pub async fn read_body(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<bytes::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    };
    let limit_u64 = limit as u64;
    let drain_until = limit_u64.saturating_add(DRAIN_BYTES_MAX);
    let hint = axum::body::HttpBody::size_hint(&body);
    if hint.lower() > drain_until {
        return Err(too_large().with_header("connection", "close"));
    }
    let mut over = hint.lower() > limit_u64;
    // Sized by Content-Length, but never trusting a client's claim for more than 1 MiB
    // of memory up front.
    let mut out = Vec::with_capacity(if over {
        0
    } else {
        hint.lower().min(1 << 20) as usize
    });
    let mut seen = 0u64;
    let mut chunks = body.into_data_stream();
    let read = async {
        while let Some(chunk) = futures::StreamExt::next(&mut chunks).await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            })?;
            seen += chunk.len() as u64;
            if seen > drain_until {
                return Err(too_large().with_header("connection", "close"));
            }
            if seen > limit_u64 && !over {
                over = true;
                out = Vec::new();
            }
            if !over {
                out.extend_from_slice(&chunk);
            }
        }
        Ok(())
    };
    // A small body has usually arrived with its request (one read brought both), so
    // the deadline's timer is armed only if the first poll has to wait: creating and
    // dropping it was ~400 instructions of every append (callgrind).
    let mut read = std::pin::pin!(read);
    let read = match futures::FutureExt::now_or_never(read.as_mut()) {
        Some(done) => Ok(done),
        None => tokio::time::timeout(timeout, read).await,
    };
    match read {
        Err(_) if over => return Err(too_large().with_header("connection", "close")),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!("the request body did not arrive within {timeout:?}"),
            )
            .with_header("connection", "close"))
        }
        Ok(result) => result?,
    }
    if over {
        return Err(too_large());
    }
    out.shrink_to_fit();
    Ok(bytes::Bytes::from(out))
}

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
}
