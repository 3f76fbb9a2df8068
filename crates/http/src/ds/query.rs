//! The read parameters of a stream URL's query (the stream name from its path is
//! `request::stream_name`).

use crate::error::ApiError;
use crate::request::percent_decode;

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
