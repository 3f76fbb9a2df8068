//! `GET /__picomq/nodes`: the cluster's identity (its id, its store and its
//! metadata, see `engine::identity`), its members, their state, lease and how many
//! slots (and so what share of the streams) each serves. `POST
//! /__picomq/nodes/{id}/drain` hands a node's streams to the others without
//! stopping it; `POST /__picomq/nodes/{id}/resume` lets it take its share again.
//! Admin scope when auth is on.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Response, StatusCode};
use axum::Extension;
use picomq_engine::cluster::{MemberState, SLOTS};
use serde_json::json;

use crate::app::{json_response, AppState};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;

pub const NODES_PATH: &str = "/__picomq/nodes";
pub const DRAIN_PATH: &str = "/__picomq/nodes/{id}/drain";
pub const RESUME_PATH: &str = "/__picomq/nodes/{id}/resume";

/// Finished members (left, or taken over) listed at most.
const FINISHED_SHOWN: usize = 20;

fn admin(app: &AppState, principal: Option<&Principal>) -> Result<(), ApiError> {
    Access::new(app.auth.as_ref(), principal).node(Op::Admin)?;
    Ok(())
}

fn cluster(app: &AppState) -> Result<&Arc<picomq_engine::cluster::Cluster>, ApiError> {
    app.engine.cluster().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_in_cluster",
            "this node runs alone (start it with --meta postgres://... to form a cluster)",
        )
    })
}

pub async fn list(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
) -> Result<Response<Body>, ApiError> {
    admin(&app, principal.as_deref())?;
    let cluster = cluster(&app)?;
    let members = cluster.members_now().await?;
    let (running, finished): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|m| !m.row.state.is_finished());
    let shown = running
        .iter()
        .chain(finished.iter().rev().take(FINISHED_SHOWN));
    let nodes: Vec<_> = shown
        .map(|m| {
            json!({
                "nodeId": m.row.node_id,
                "epoch": m.row.epoch,
                "advertise": m.row.advertise,
                "kafka": m.row.kafka,
                "state": if m.row.state.is_running() && m.row.lease_left_ms <= 0 { "lapsed" } else { m.row.state.as_str() },
                "leaseExpiresInMs": m.row.lease_left_ms,
                "slots": m.slots,
                "share": f64::from(m.slots) / f64::from(SLOTS),
                "indexedThroughSeq": m.row.applied_seq,
                "joinedAt": picomq_engine::units::format_rfc3339_ms(m.row.joined_unix_ms),
                "thisNode": m.this_node,
            })
        })
        .collect();
    let b = app.engine.binding();
    let identity = json!({
        "clusterId": b.cluster_id,
        "store": b.store,
        "meta": { "kind": b.meta_kind, "id": b.meta_id },
    });
    Ok(json_response(
        StatusCode::OK,
        json!({ "cluster": identity, "nodes": nodes, "slots": SLOTS }),
    ))
}

pub async fn drain(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<Response<Body>, ApiError> {
    set_state(&app, principal.as_deref(), &id, MemberState::Draining).await
}

pub async fn resume(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<Response<Body>, ApiError> {
    set_state(&app, principal.as_deref(), &id, MemberState::Live).await
}

async fn set_state(
    app: &AppState,
    principal: Option<&Principal>,
    node_id: &str,
    state: MemberState,
) -> Result<Response<Body>, ApiError> {
    admin(app, principal)?;
    let cluster = cluster(app)?;
    match cluster.set_node_state(node_id, state).await? {
        Some(epoch) => Ok(json_response(
            StatusCode::OK,
            json!({ "nodeId": node_id, "epoch": epoch, "state": state.as_str() }),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "node_not_found",
            format!("no running node has the id {node_id:?} (see GET {NODES_PATH})"),
        )),
    }
}
