//! `GET /__picomq/streams?prefix=P&after=NAME&limit=N`: the stream listing, one page
//! at a time in name order. It lives under the reserved `__` namespace so it can never
//! collide with a stream's URL. It reads the metadata index (idle streams stay idle)
//! and asks the stream service only about rows that look expired.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{Response, StatusCode};
use axum::Extension;
use picomq_engine::meta::StreamRow;
use picomq_engine::stream::{now_ms, parse_rfc3339_ms};
use picomq_engine::EngineError;
use serde_json::json;

use crate::auth::{Op, Principal, Token};
use crate::ds::percent_decode;
use crate::error::ApiError;
use crate::{json_response, AppState};

/// The path of the listing endpoint.
pub const PATH: &str = "/__picomq/streams";
/// Streams per page when the request does not say.
pub const PAGE_LIMIT_DEFAULT: u32 = 100;
/// Largest page a request may ask for.
pub const PAGE_LIMIT_MAX: u32 = 1000;

#[derive(Debug, Default, PartialEq, Eq)]
struct ListParams {
    prefix: String,
    after: String,
    limit: u32,
}

fn params(raw: Option<&str>) -> Result<ListParams, ApiError> {
    let mut p = ListParams {
        limit: PAGE_LIMIT_DEFAULT,
        ..ListParams::default()
    };
    for pair in raw.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)
            .ok_or_else(|| ApiError::bad_request(format!("query parameter {key} is malformed")))?;
        match key {
            "prefix" => p.prefix = value,
            "after" => p.after = value,
            "limit" => {
                p.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=PAGE_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "limit must be an integer from 1 to {PAGE_LIMIT_MAX}"
                        ))
                    })?
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}; use prefix, after and limit"
                )))
            }
        }
    }
    Ok(p)
}

/// By the metadata alone this stream may have expired (its sliding TTL counts
/// accesses the index has not seen yet, so only the stream service can tell).
fn maybe_expired(row: &StreamRow, now_ms: u64) -> bool {
    let by_deadline = row
        .expires_at
        .as_deref()
        .and_then(parse_rfc3339_ms)
        .is_some_and(|at| at <= now_ms);
    let by_ttl = row.ttl_secs.is_some_and(|ttl| {
        row.last_access_ms.max(row.created_ms) + ttl.saturating_mul(1000) <= now_ms
    });
    by_deadline || by_ttl
}

fn rfc3339_ms(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

pub async fn list(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
    RawQuery(raw): RawQuery,
) -> Response<Body> {
    let viewer = match &app.auth {
        None => None,
        Some(auth) => match auth.require_op(principal.as_deref(), Op::Read) {
            Ok(t) => Some(t),
            Err(e) => return axum::response::IntoResponse::into_response(e),
        },
    };
    match list_page(&app, viewer.as_deref(), raw.as_deref()).await {
        Ok(r) => r,
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}

/// With auth on, `viewer` sees only the streams it may read, named relative to its
/// namespace; `prefix` and `after` are relative to it too.
async fn list_page(
    app: &AppState,
    viewer: Option<&Token>,
    raw: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let mut p = params(raw)?;
    let namespace = viewer.map_or("", |t| t.namespace.as_str());
    if !namespace.is_empty() {
        p.prefix = format!("{namespace}{}", p.prefix);
        if !p.after.is_empty() {
            p.after = format!("{namespace}{}", p.after);
        }
    }
    // One extra row says whether another page exists, so the last page says so.
    let mut rows = app.engine.list(&p.prefix, &p.after, p.limit + 1).await?;
    let more = rows.len() > p.limit as usize;
    rows.truncate(p.limit as usize);
    let shown = |name: &str| name.strip_prefix(namespace).unwrap_or(name).to_string();
    let next = more.then(|| rows.last().map(|r| shown(&r.name))).flatten();
    let now = now_ms();
    let mut streams = Vec::with_capacity(rows.len());
    for row in rows {
        if viewer.is_some_and(|t| !t.allows(Op::Read, &row.name)) {
            continue;
        }
        let (tail, closed) = if maybe_expired(&row, now) {
            match app.engine.head(&row.name).await {
                Ok(info) => (info.tail, info.closed),
                Err(EngineError::NotFound | EngineError::Gone) => continue,
                Err(e) => return Err(e.into()),
            }
        } else {
            (row.tail, row.closed)
        };
        streams.push(json!({
            "name": shown(&row.name),
            "contentType": row.content_type,
            "nextOffset": tail.to_string(),
            "closed": closed,
            "createdAt": rfc3339_ms(row.created_ms),
            "ttlSeconds": row.ttl_secs,
            "expiresAt": row.expires_at,
            "startOffset": row.start.to_string(),
            "retentionSeconds": row.retention_secs,
        }));
    }
    Ok(json_response(
        StatusCode::OK,
        json!({ "streams": streams, "next": next }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_validated() {
        assert_eq!(
            params(Some("prefix=a%2Fb&after=a%2Fb%2F1&limit=2")).unwrap(),
            ListParams {
                prefix: "a/b".into(),
                after: "a/b/1".into(),
                limit: 2
            }
        );
        assert_eq!(params(None).unwrap().limit, PAGE_LIMIT_DEFAULT);
        for bad in ["limit=0", "limit=1001", "limit=x", "prefx=a", "prefix=%zz"] {
            assert!(params(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_creation_time() {
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
