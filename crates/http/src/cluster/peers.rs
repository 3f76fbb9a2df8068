//! Members' calls to each other, under `/__picomq/cluster/`: pinning a fork point
//! on a source this member serves, releasing the pin, cascading a delete to a
//! soft-deleted source (see the engine's `stream::cluster`), and telling a member
//! that a takeover finished. Each call carries the cluster key ([`CLUSTER_KEY`]),
//! which only members read from the metadata store.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use bytes::Bytes;
use picomq_engine::cluster::ForkPin;
use serde::Deserialize;

use super::CLUSTER_KEY;
use crate::app::AppState;
use crate::error::ApiError;
use crate::members::client::{Append, Cascade, Tails, Unpin, TAILS_MAX};
pub use crate::members::client::{
    ADMIN_PATH, APPEND_PATH, CASCADE_PATH, NUDGE_PATH, PIN_PATH, TAILS_PATH, UNPIN_PATH,
};

/// Equal bytes, compared without an early exit (the time says nothing of how much
/// of a guess was right).
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a call without this cluster's key (compared in constant time).
fn check_key(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let expected = app.cluster.as_ref().map(|e| e.key.as_bytes());
    let given = headers.get(CLUSTER_KEY).map(|v| v.as_bytes());
    match (expected, given) {
        (Some(e), Some(g)) if same_key(e, g) => Ok(()),
        (None, _) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_in_cluster",
            "this node is not a cluster member",
        )),
        _ => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "cluster calls need the cluster key",
        )),
    }
}

/// Bodies of cluster calls are a few fields of JSON.
const BODY_BYTES_MAX: usize = 64 << 10;

async fn json_body<T: for<'de> Deserialize<'de>>(
    app: &AppState,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = crate::request::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!("cluster call body is not the expected JSON: {e}"))
    })
}

pub async fn pin(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let req: ForkPin = json_body(&app, body).await?;
    let pinned = app.engine.pin_fork(&req).await?;
    let value = serde_json::to_value(pinned).expect("serializable");
    Ok(crate::app::json_response(StatusCode::OK, value))
}

pub async fn unpin(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let req: Unpin = json_body(&app, body).await?;
    app.engine.unpin_fork(req.source_id, req.pin);
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::json!({}),
    ))
}

pub async fn cascade(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let req: Cascade = json_body(&app, body).await?;
    app.engine.cascade_from_peer(req.source_id).await?;
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::json!({}),
    ))
}

/// Another member finished a takeover: this one looks at the cluster now.
pub async fn nudge(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    app.engine.cluster_changed();
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::json!({}),
    ))
}

/// Another member appends to a stream this one serves.
pub async fn append(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let req: Append = json_body(&app, body).await?;
    let max = app.engine.config().stream_name_bytes_max;
    let name = picomq_engine::StreamName::new(req.stream, max)?;
    app.engine
        .append(picomq_engine::AppendRequest::new(
            name.clone(),
            Some(picomq_engine::ContentType::json()),
            Bytes::from(req.body),
        ))
        .await?;
    app.written(&name);
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::json!({}),
    ))
}

/// Another member makes an operation on a stream this one serves (the Kafka
/// listener's topic administration); never forwarded again (`NotOwner` instead).
pub async fn admin(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let op: picomq_engine::cluster::StreamAdmin = json_body(&app, body).await?;
    let answer = app.engine.admin_here(&op).await?;
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::to_value(answer).expect("serializable"),
    ))
}

/// Another member asks for the tails of streams this one serves.
pub async fn tails(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    check_key(&app, &headers)?;
    let req: Tails = json_body(&app, body).await?;
    if req.streams.len() > TAILS_MAX {
        return Err(ApiError::bad_request(format!(
            "at most {TAILS_MAX} streams per call"
        )));
    }
    let max = app.engine.config().stream_name_bytes_max;
    let mut out = serde_json::Map::new();
    for name in req.streams {
        let Ok(stream) = picomq_engine::StreamName::new(name.clone(), max) else {
            continue;
        };
        if let Ok(info) = app.engine.head(&stream).await {
            out.insert(name, serde_json::json!(info.tail.0));
        }
    }
    Ok(crate::app::json_response(
        StatusCode::OK,
        serde_json::Value::Object(out),
    ))
}
