//! Server-kept positions over HTTP: a consumer commits the Durable Streams offset
//! it reached, and reads on from it with `?consumer=NAME` instead of `?offset=`.
//! The positions themselves are the consumers layer's
//! (`picomq_consumers::positions`); every operation here takes read on the stream.
//!
//! ```text
//! PUT    /__picomq/positions/{consumer}/{stream}   {"offset": "..."}  commit
//! GET    /__picomq/positions/{consumer}/{stream}   -> {"offset": "..."}
//! DELETE /__picomq/positions/{consumer}/{stream}
//! GET    /{stream}?consumer={consumer}             read from the committed position
//! ```

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, Response, StatusCode};
use picomq_consumers::positions::check_consumer;
use picomq_engine::Offset;
use serde_json::json;

use crate::app::{json_response, AppState};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;

pub const PATH: &str = "/__picomq/positions/{*rest}";

/// Every request on one position.
pub async fn handle(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let principal = parts.extensions.remove::<Principal>();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/__picomq/positions/")
        .unwrap_or("")
        .to_string();
    let (consumer, path) = rest
        .split_once('/')
        .ok_or_else(|| ApiError::bad_request("use /__picomq/positions/{consumer}/{stream}"))?;
    check_consumer(consumer)?;
    let mut stream = crate::request::stream_name(
        &format!("/{path}"),
        app.engine.config().stream_name_bytes_max,
    )?;
    // A position is the consumer's own place in a stream it may read: every
    // operation on it takes read on the stream.
    let access = Access::new(app.auth.as_ref(), principal.as_ref());
    stream = access.stream(Op::Read, stream)?;
    let shown = access.shown(&stream).unwrap_or(&stream).to_string();
    let body = crate::request::read_body(body, 64 << 10, app.body_read_timeout).await?;
    if let Some(r) = crate::cluster::answered_elsewhere(&app, &stream, &parts, &body).await? {
        return Ok(r);
    }
    let positions = &app.consumers.positions;
    match parts.method {
        Method::GET => match positions.get(consumer, &stream).await? {
            Some(o) => Ok(json_response(
                StatusCode::OK,
                json!({ "consumer": consumer, "stream": shown, "offset": o.to_string() }),
            )),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "no_position",
                format!("consumer {consumer:?} has no position on this stream"),
            )),
        },
        Method::PUT | Method::POST => {
            let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("body must be {{\"offset\": \"...\"}}: {e}"))
            })?;
            let raw = v["offset"]
                .as_str()
                .ok_or_else(|| ApiError::bad_request("body must be {\"offset\": \"...\"}"))?;
            let offset = Offset::parse(raw).map_err(|e| ApiError::bad_request(e.to_string()))?;
            positions.commit(consumer, &stream, offset).await?;
            Ok(json_response(
                StatusCode::OK,
                json!({ "consumer": consumer, "stream": shown, "offset": offset.to_string() }),
            ))
        }
        Method::DELETE => {
            positions.delete(consumer, &stream).await?;
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("static response"))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET, PUT or DELETE on a position",
        )),
    }
}
