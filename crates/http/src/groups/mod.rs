//! Consumer groups, PicoMQ's own API under `/__picomq/groups`: a named group on a
//! stream whose members compete for its messages, each message out to one member
//! at a time under a lease, acked, nacked (again after a delay) or, after too many
//! deliveries, moved to a dead-letter stream. The state machine is `state`,
//! durability and delivery `manager`; this module routes and answers.
//!
//! ```text
//! GET    /__picomq/groups                     every group
//! PUT    /__picomq/groups/{group}             create {stream, maxDeliveries, deadLetter, leaseMs, from}
//! GET    /__picomq/groups/{group}             configuration and counts
//! DELETE /__picomq/groups/{group}
//! POST   /__picomq/groups/{group}/claim       {consumer, max, waitMs} -> {messages: [...]}
//! POST   /__picomq/groups/{group}/ack         {ids: [...]}
//! POST   /__picomq/groups/{group}/nack        {ids: [...], delayMs}
//! ```

pub mod manager;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, Response, StatusCode};
use base64::Engine as _;
use picomq_engine::metrics::Desc;
use picomq_engine::Offset;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::{json_response, AppState};
pub use manager::Groups;

pub const PATH: &str = "/__picomq/groups";
pub const ITEM_PATH: &str = "/__picomq/groups/{*rest}";
const BODY_BYTES_MAX: usize = 1 << 20;
/// Lease bounds and default.
const LEASE_MS_MIN: u64 = 100;
const LEASE_MS_MAX: u64 = 12 * 3600 * 1000;
const LEASE_MS_DEFAULT: u64 = 30_000;
const MAX_DELIVERIES_DEFAULT: u32 = 5;
/// Longest a claim waits for messages.
const WAIT_MS_MAX: u64 = 60_000;
const NACK_DELAY_MS_MAX: u64 = 24 * 3600 * 1000;

pub static PENDING: Desc = Desc::gauge(
    "picomq_group_pending",
    "Messages of a consumer group handed back (nacked or lapsed), waiting to be delivered again.",
);
pub static IN_FLIGHT: Desc = Desc::gauge(
    "picomq_group_in_flight",
    "Messages of a consumer group out to a member under a lease.",
);
pub static LAG: Desc = Desc::gauge(
    "picomq_group_lag_bytes",
    "Bytes of a group's stream past the last message it handed out.",
);
pub static ACKED: Desc = Desc::gauge(
    "picomq_group_acked",
    "Messages a consumer group acknowledged.",
);
pub static REDELIVERIES: Desc = Desc::gauge(
    "picomq_group_redeliveries",
    "Deliveries of a consumer group's messages after the first.",
);
pub static PARKED: Desc = Desc::gauge(
    "picomq_group_parked",
    "Messages of a consumer group out of deliveries that its dead-letter stream did not take (closed, not JSON, unreachable): kept, never delivered again, dead-lettering retried.",
);
pub static DEAD_LETTERED: Desc = Desc::gauge(
    "picomq_group_dead_lettered",
    "Messages a consumer group moved to its dead-letter stream.",
);

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// With `--auth required`: `op` on the stream `name` (absolute).
fn authorize(
    app: &AppState,
    principal: Option<&Principal>,
    op: Op,
    name: &str,
) -> Result<(), ApiError> {
    let Some(_) = &app.auth else { return Ok(()) };
    match principal {
        Some(Principal::Token(t)) if t.allows(op, name) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token may not {} on this group's stream", op.name()),
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this needs a token (Authorization: Bearer ...)",
        )),
    }
}

/// `GET /__picomq/groups`.
pub async fn list(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let principal = request.extensions().get::<Principal>().cloned();
    let groups = app.groups.list(10_000).await?;
    let visible: Vec<Value> = groups
        .into_iter()
        .filter(|(_, stream)| {
            authorize(&app, principal.as_ref(), Op::Subscribe, stream).is_ok()
                || authorize(&app, principal.as_ref(), Op::Claim, stream).is_ok()
        })
        .map(|(g, stream)| json!({ "group": g, "stream": stream }))
        .collect();
    Ok(json_response(StatusCode::OK, json!({ "groups": visible })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateBody {
    stream: String,
    max_deliveries: Option<u32>,
    dead_letter: Option<String>,
    lease_ms: Option<u64>,
    from: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClaimBody {
    consumer: String,
    max: Option<usize>,
    wait_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IdsBody {
    ids: Vec<String>,
    delay_ms: Option<u64>,
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| invalid(format!("request body is not the expected JSON: {e}")))
}

fn ids(ids: &[String]) -> Result<Vec<u64>, ApiError> {
    if ids.len() > manager::CLAIM_MAX * 10 {
        return Err(invalid("too many ids in one request"));
    }
    ids.iter()
        .map(|id| {
            Offset::parse(id)
                .map(|o| o.0)
                .map_err(|e| invalid(format!("id {id:?}: {e}")))
        })
        .collect()
}

fn stream_arg(name: &str) -> String {
    name.trim_start_matches('/').to_string()
}

/// Every request on one group.
pub async fn handle(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let principal = parts.extensions.remove::<Principal>();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/__picomq/groups/")
        .unwrap_or("")
        .to_string();
    let (group, action) = rest.split_once('/').unwrap_or((rest.as_str(), ""));
    manager::check_group_name(group)?;
    let body = crate::ds::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    // The stream decides which member answers (the group lives in its slot).
    let (stream, create) = match (&parts.method, action) {
        (&Method::PUT, "") => {
            let b: CreateBody = parse(&body)?;
            (stream_arg(&b.stream), Some(b))
        }
        _ => match app.groups.stream_of(group).await? {
            Some(s) => (s, None),
            None => return Err(manager::not_found(group)),
        },
    };
    let op = match (&parts.method, action) {
        (&Method::POST, "claim" | "ack" | "nack") => Op::Claim,
        _ => Op::Subscribe,
    };
    authorize(&app, principal.as_ref(), op, &stream)?;
    if let Some(r) = crate::cluster::answered_elsewhere(&app, &stream, &parts, &body).await? {
        return Ok(r);
    }
    let groups = &app.groups;
    match (&parts.method, action) {
        (&Method::PUT, "") => {
            let b = create.expect("parsed above");
            let lease_ms = b.lease_ms.unwrap_or(LEASE_MS_DEFAULT);
            if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
                return Err(invalid(format!(
                    "leaseMs must be from {LEASE_MS_MIN} to {LEASE_MS_MAX}"
                )));
            }
            if let Some(dlq) = &b.dead_letter {
                let dlq = stream_arg(dlq);
                authorize(&app, principal.as_ref(), Op::Append, &dlq)?;
                if dlq == stream || dlq.starts_with("__") || dlq.is_empty() {
                    return Err(invalid("deadLetter must be another stream"));
                }
            }
            let config = state::GroupConfig {
                group: group.to_string(),
                stream: stream.clone(),
                max_deliveries: b.max_deliveries.unwrap_or(MAX_DELIVERIES_DEFAULT),
                dead_letter: b.dead_letter.as_deref().map(stream_arg),
                lease_ms,
                created_at: String::new(),
            };
            let created = groups
                .create(config, b.from.as_deref().unwrap_or("-1"))
                .await?;
            let g = groups
                .get(group, &stream)
                .await?
                .ok_or_else(|| manager::not_found(group))?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, groups.describe(&g).await?))
        }
        (&Method::GET, "") => {
            let g = group_of(&app, group, &stream).await?;
            Ok(json_response(StatusCode::OK, groups.describe(&g).await?))
        }
        (&Method::DELETE, "") => {
            groups.delete(group, &stream).await?;
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("static response"))
        }
        (&Method::POST, "claim") => {
            let b: ClaimBody = parse(&body)?;
            if b.consumer.is_empty() || b.consumer.len() > 256 {
                return Err(invalid("consumer must have 1 to 256 bytes"));
            }
            let max = b.max.unwrap_or(1).clamp(1, manager::CLAIM_MAX);
            let wait = Duration::from_millis(b.wait_ms.unwrap_or(0).min(WAIT_MS_MAX));
            let g = group_of(&app, group, &stream).await?;
            let wait = tokio::select! {
                r = groups.claim(&g, &b.consumer, max, wait) => r?,
                _ = app.shutdown.fired() => (Vec::new(), 0),
            };
            let (messages, lease_until) = wait;
            let json_stream = app
                .engine
                .head(&g.stream)
                .await
                .map(|i| i.content_type.starts_with("application/json"))
                .unwrap_or(true);
            Ok(claim_response(&messages, json_stream, lease_until))
        }
        (&Method::POST, "ack") => {
            let b: IdsBody = parse(&body)?;
            let g = group_of(&app, group, &stream).await?;
            let n = groups.ack(&g, ids(&b.ids)?).await?;
            Ok(json_response(StatusCode::OK, json!({ "acked": n })))
        }
        (&Method::POST, "nack") => {
            let b: IdsBody = parse(&body)?;
            let delay = b.delay_ms.unwrap_or(0);
            if delay > NACK_DELAY_MS_MAX {
                return Err(invalid(format!("delayMs is at most {NACK_DELAY_MS_MAX}")));
            }
            let g = group_of(&app, group, &stream).await?;
            let n = groups
                .nack(&g, ids(&b.ids)?, Duration::from_millis(delay))
                .await?;
            Ok(json_response(StatusCode::OK, json!({ "nacked": n })))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET, PUT or DELETE on a group, POST on its claim, ack and nack",
        )),
    }
}

async fn group_of(
    app: &AppState,
    group: &str,
    stream: &str,
) -> Result<Arc<manager::Group>, ApiError> {
    match app.groups.get(group, stream).await? {
        Some(g) => Ok(g),
        None => {
            app.groups.forget_stream(group);
            Err(manager::not_found(group))
        }
    }
}

/// A claim's answer. Built by serializing, never through a `Value`: a JSON
/// message's body goes out as the bytes that were appended, at any depth the append
/// accepted (a `Value` stops at 128 levels).
fn claim_response(
    messages: &[manager::Message],
    json_stream: bool,
    lease_until: u64,
) -> Response<Body> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Claimed<'a> {
        messages: Vec<MessageJson<'a>>,
        lease_until: String,
    }
    let answer = Claimed {
        messages: messages
            .iter()
            .map(|m| message_json(m, json_stream))
            .collect(),
        lease_until: picomq_engine::units::format_rfc3339_ms(lease_until),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .header(axum::http::header::CACHE_CONTROL, "no-store")
        .body(Body::from(
            serde_json::to_vec(&answer).expect("a claim's answer serializes"),
        ))
        .expect("valid response")
}

/// One claimed message: `body` for a JSON stream's message, `bodyBase64` (and
/// `text` when it is UTF-8) for any other stream's append.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageJson<'a> {
    id: String,
    next_offset: String,
    deliveries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

fn message_json(m: &manager::Message, json_stream: bool) -> MessageJson<'_> {
    let raw = if json_stream {
        manager::raw_json(&m.body)
    } else {
        None
    };
    let (body_base64, text) = match raw {
        Some(_) => (None, None),
        None => (
            Some(base64::engine::general_purpose::STANDARD.encode(&m.body)),
            std::str::from_utf8(&m.body).ok(),
        ),
    };
    MessageJson {
        id: Offset(m.offset).to_string(),
        next_offset: Offset(m.end).to_string(),
        deliveries: m.deliveries,
        body: raw,
        body_base64,
        text,
    }
}
