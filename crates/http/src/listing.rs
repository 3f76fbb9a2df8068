//! `GET /__picomq/streams?prefix=P&after=NAME&limit=N`: the stream listing, one page
//! at a time in name order. It lives under the reserved `__` namespace so it can never
//! collide with a stream's URL. It reads the metadata index (idle streams stay idle)
//! and asks the stream service only about rows that look expired.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{Response, StatusCode};
use axum::Extension;
use picomq_engine::units::format_rfc3339_ms;
use serde_json::json;

use crate::app::{json_response, AppState};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;
use crate::request::percent_decode;

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

pub async fn list(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
    RawQuery(raw): RawQuery,
) -> Response<Body> {
    let access = Access::new(app.auth.as_ref(), principal.as_deref());
    if let Err(e) = access.node(Op::Read) {
        return axum::response::IntoResponse::into_response(e);
    }
    match list_page(&app, access, raw.as_deref()).await {
        Ok(r) => r,
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}

/// With auth on, `viewer` sees only the streams it may read, named relative to its
/// namespace; `prefix` and `after` are relative to it too.
async fn list_page(
    app: &AppState,
    viewer: Access<'_>,
    raw: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let mut p = params(raw)?;
    let namespace = viewer.namespace();
    if !namespace.is_empty() {
        p.prefix = format!("{namespace}{}", p.prefix);
        if !p.after.is_empty() {
            p.after = format!("{namespace}{}", p.after);
        }
    }
    let page = app.engine.list(&p.prefix, &p.after, p.limit).await?;
    let shown = |name: &str| name.strip_prefix(namespace).unwrap_or(name).to_string();
    let next = page.next.as_deref().map(shown);
    let mut streams = Vec::with_capacity(page.streams.len());
    for info in page.streams {
        // The server's own streams (consumer state: `__subscriptions/`, `__groups/`,
        // `__positions/`) are reached through their APIs only.
        if !viewer.allows(Op::Read, &info.name) {
            continue;
        }
        streams.push(json!({
            "name": shown(&info.name),
            "contentType": info.content_type,
            "nextOffset": info.tail.to_string(),
            "closed": info.closed,
            "createdAt": format_rfc3339_ms(info.created_ms),
            "ttlSeconds": info.ttl_secs,
            "expiresAt": info.expires_at,
            "startOffset": info.start.to_string(),
            "retentionSeconds": info.retention_secs,
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
        assert_eq!(
            format_rfc3339_ms(1_700_000_000_123),
            "2023-11-14T22:13:20.123Z"
        );
    }
}
