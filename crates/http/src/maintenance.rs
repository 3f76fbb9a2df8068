//! `POST /__picomq/compact[?delay=DURATION]`: runs a compaction pass now, over data
//! older than `delay` (default: the server's `--compaction-delay`), and answers
//! with what it did as JSON. Admin scope when auth is on. The pass runs under the
//! request; a client that hangs up does not stop it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{Response, StatusCode};
use axum::response::IntoResponse;
use axum::Extension;

use crate::app::{json_response, AppState};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;
use crate::request::percent_decode;

pub const COMPACT_PATH: &str = "/__picomq/compact";

/// The longest `delay` a request may give.
const DELAY_MAX: Duration = Duration::from_secs(365 * 24 * 3600);

fn delay(raw: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let mut delay = None;
    for pair in raw.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "delay" {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?}; use delay"
            )));
        }
        let parsed = percent_decode(value)
            .and_then(|v| humantime::parse_duration(&v).ok())
            .filter(|d| *d <= DELAY_MAX)
            .ok_or_else(|| {
                ApiError::bad_request(
                    "delay must be a duration of at most a year (examples: 0s, 500ms, 10m)",
                )
            })?;
        delay = Some(parsed);
    }
    Ok(delay)
}

pub async fn compact(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
    RawQuery(raw): RawQuery,
) -> Response<Body> {
    if let Err(e) = Access::new(app.auth.as_ref(), principal.as_deref()).node(Op::Admin) {
        return e.into_response();
    }
    let delay = match delay(raw.as_deref()) {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let engine = app.engine.clone();
    // Its own task: the pass holds the maintenance lock and must finish cleanly
    // even if the client goes away.
    match tokio::spawn(async move { engine.compact(delay).await }).await {
        Ok(Ok(report)) => json_response(
            StatusCode::OK,
            serde_json::to_value(report).expect("a report serializes"),
        ),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("compaction task failed: {e}"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_delay() {
        assert_eq!(delay(None).unwrap(), None);
        assert_eq!(delay(Some("delay=0s")).unwrap(), Some(Duration::ZERO));
        assert_eq!(
            delay(Some("delay=10m")).unwrap(),
            Some(Duration::from_secs(600))
        );
        assert!(delay(Some("delay=soon")).is_err());
        assert!(delay(Some("delay=1000y")).is_err());
        assert!(delay(Some("other=1")).is_err());
    }
}
