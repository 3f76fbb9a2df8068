//! The edge of a cluster member: a request for a stream that another member serves
//! goes there, forwarded (the default) or redirected (`--route redirect`), with at
//! most one extra hop; the members' calls to each other (`peers`); the nodes
//! endpoint (`nodes`). Which member serves what is the engine's (`Engine::cluster`).
//!
//! A request whose answer was lost after it was sent (the owner died under it) is
//! sent again to the next owner only if doing so cannot apply it twice (reads,
//! creates, appends with producer headers); any other gets 503 at once.
//!
//! At most one hop: a forwarded request carries [`FORWARDED_BY`]. A member that gets
//! one for a stream it does not serve never forwards it again: it reads the slot's
//! owner from the store (the sender may know of a hand-over this member has not
//! seen yet), serves it if the slot is now its own, and otherwise answers 503 at
//! once, marked [`NOT_OWNER`]. The sender then knows its own view is stale: it
//! reads the slot from the store too and routes the request again, until the
//! stream has a live owner or [`OWNER_WAIT`] passed (then 503 with `Retry-After`).

pub mod nodes;
pub mod peers;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use picomq_engine::cluster::{slot_of, Cluster, Route};

use crate::app::AppState;
use crate::error::ApiError;
pub use crate::members::{
    ClusterEdge, EdgeStats, RouteMode, CLUSTER_KEY, FORWARDED_BY, NOT_OWNER, SERVED_BY,
};

/// How long a request waits for a stream to get a live owner (a hand-over, a
/// takeover after a member died) before it is answered 503.
const OWNER_WAIT: Duration = Duration::from_secs(5);

/// Where a stream request goes after routing.
pub enum Decision {
    /// Serve it here; the body is handed back untouched.
    Here(Body),
    /// Answered (forwarded, redirected, or refused).
    Answered(Response<Body>),
}

/// [`route`] for a handler that has read its (small) body already: `Some` answer
/// when another member answered for the stream, `None` to serve it here.
pub async fn answered_elsewhere(
    app: &Arc<AppState>,
    name: &str,
    parts: &axum::http::request::Parts,
    body: &bytes::Bytes,
) -> Result<Option<Response<Body>>, ApiError> {
    if app.cluster.is_none() {
        return Ok(None);
    }
    let routed = Box::pin(route(
        app,
        name,
        &parts.method,
        &parts.uri,
        &parts.headers,
        Body::from(body.clone()),
    ))
    .await?;
    Ok(match routed {
        Decision::Here(_) => None,
        Decision::Answered(r) => Some(r),
    })
}

/// Routes a stream request: `Here` when this member serves the stream (or no
/// cluster), else the owner's answer.
pub async fn route(
    app: &Arc<AppState>,
    name: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Decision, ApiError> {
    let (Some(cluster), Some(edge)) = (app.engine.cluster(), app.cluster.as_ref()) else {
        return Ok(Decision::Here(body));
    };
    let forwarded = headers.contains_key(FORWARDED_BY);
    let slot = slot_of(name);
    let deadline = tokio::time::Instant::now() + OWNER_WAIT;
    let mut body = Some(body);
    let mut buffered = None;
    loop {
        let route = match cluster.route(name) {
            Route::Remote { .. } | Route::Unowned if forwarded => {
                cluster.refresh_slot(slot).await?
            }
            other => other,
        };
        match route {
            Route::Local => {
                let body = match buffered.take() {
                    Some(bytes) => Body::from(bytes),
                    None => body.take().unwrap_or_else(Body::empty),
                };
                return Ok(Decision::Here(body));
            }
            Route::NoLease => return Err(no_lease()),
            Route::Remote { url, node_id } if !forwarded => {
                if edge.mode == RouteMode::Redirect {
                    edge.stats.redirected.inc();
                    return Ok(Decision::Answered(crate::members::redirect(&url, uri)));
                }
                // The body is read once, so a failed attempt can be retried.
                if buffered.is_none() {
                    let limit = app.engine.config().append_bytes_max;
                    let taken = body.take().unwrap_or_else(Body::empty);
                    buffered =
                        Some(crate::request::read_body(taken, limit, app.body_read_timeout).await?);
                }
                let bytes = buffered.clone().expect("buffered above");
                match edge
                    .proxy
                    .forward(&url, &cluster.config.node_id, method, uri, headers, bytes)
                    .await
                {
                    Ok(resp) if resp.headers().contains_key(NOT_OWNER) => {
                        // The slot moved on and this member has not seen it yet.
                        edge.stats.stale_routes.inc();
                        tracing::debug!(owner = %node_id, "the member taken for the owner does not serve the stream; reading the slot again");
                        if cluster.refresh_slot(slot).await? == (Route::Remote { url, node_id })
                            && !wait_for_owner(cluster, deadline).await
                        {
                            return Err(ApiError::from(picomq_engine::EngineError::NotOwner));
                        }
                    }
                    Ok(resp) => {
                        edge.stats.forwarded.inc();
                        return Ok(Decision::Answered(resp));
                    }
                    Err(crate::members::ForwardError::Lost(e)) if !repeatable(method, headers) => {
                        // The owner may have made it durable before it went: sending
                        // it again could apply it twice. The client decides.
                        edge.stats.forward_failures.inc();
                        return Err(ApiError::from(picomq_engine::EngineError::Unavailable(format!(
                            "the node serving this stream ({node_id}) failed while handling the request ({e}), so whether it took effect is unknown; appends with Producer-Id headers can be retried safely"
                        ))));
                    }
                    Err(e) => {
                        edge.stats.forward_failures.inc();
                        tracing::debug!(owner = %node_id, error = %e, "forwarding failed; waiting for the stream's owner to change");
                        if !wait_for_owner(cluster, deadline).await {
                            return Err(ApiError::from(picomq_engine::EngineError::Unavailable(format!(
                                "the node serving this stream ({node_id}) is unreachable ({e}); retry"
                            ))));
                        }
                    }
                }
            }
            // Forwarded here by a member that took this one for the owner: the
            // sender re-routes (it may know the owner, or wait for one).
            Route::Remote { .. } | Route::Unowned if forwarded => {
                return Err(ApiError::from(picomq_engine::EngineError::NotOwner));
            }
            Route::Remote { .. } | Route::Unowned => {
                if !wait_for_owner(cluster, deadline).await {
                    return Err(ApiError::from(picomq_engine::EngineError::NotOwner));
                }
            }
        }
    }
}

/// Whether a request whose answer was lost may be sent again to the next owner:
/// reads, creates (a second create of the same stream is answered 200), and
/// appends an idempotent producer sends (the owner drops the duplicate).
fn repeatable(method: &Method, headers: &HeaderMap) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT
    ) || (*method == Method::POST && headers.contains_key(crate::headers::PRODUCER_ID))
}

/// Waits for the cluster table to change; `false` once `deadline` passed.
async fn wait_for_owner(cluster: &Cluster, deadline: tokio::time::Instant) -> bool {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if left.is_zero() {
        return false;
    }
    cluster.changed(left.min(Duration::from_millis(250))).await;
    true
}

fn no_lease() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_lease",
        "this node cannot renew its cluster lease (is Postgres reachable?), so it may not serve the streams it owns; retry",
    )
    .with_header(axum::http::header::RETRY_AFTER, 1)
}
