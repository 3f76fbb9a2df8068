//! Consumer groups over HTTP, PicoMQ's own API under `/__picomq/groups`: requests
//! parsed, every stream they touch authorized (`auth::access`), answers written.
//! What a group is and does lives in the consumers layer (`picomq_consumers::groups`).
//!
//! ```text
//! GET    /__picomq/groups                     every group the token may manage
//! PUT    /__picomq/groups/{group}             create {stream, maxDeliveries, deadLetter, leaseMs, from}
//! GET    /__picomq/groups/{group}             configuration and counts
//! DELETE /__picomq/groups/{group}
//! POST   /__picomq/groups/{group}/claim       {consumer, max, waitMs} -> {messages: [...]}
//! POST   /__picomq/groups/{group}/ack         {ids: [...]}
//! POST   /__picomq/groups/{group}/nack        {ids: [...], delayMs}
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, Response, StatusCode};
use base64::Engine as _;
use picomq_consumers::groups::{self, ClaimRequest, Message, NewGroup};
use picomq_engine::Offset;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::{json_response, AppState};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;

pub const PATH: &str = "/__picomq/groups";
pub const ITEM_PATH: &str = "/__picomq/groups/{*rest}";
const BODY_BYTES_MAX: usize = 1 << 20;
/// Most groups one listing shows.
const LISTED_MAX: usize = 10_000;

/// Whether the caller may do what `action` does to a group on the stream `name`
/// (absolute): manage it (`subscribe`), or take its messages, which carry the
/// stream's bodies (`claim` and `read`).
fn permits(access: &Access<'_>, action: &str, name: &str) -> bool {
    match action {
        "claim" => access.allows(Op::Claim, name) && access.allows(Op::Read, name),
        "ack" | "nack" => access.allows(Op::Claim, name),
        _ => access.allows(Op::Subscribe, name),
    }
}

/// A group's description as the caller names streams (relative to its namespace).
fn shown(access: &Access<'_>, mut v: Value) -> Value {
    for key in ["stream", "deadLetter"] {
        if let Some(name) = v[key].as_str() {
            v[key] = access.shown(name).map_or(Value::Null, |n| json!(n));
        }
    }
    v
}

/// `GET /__picomq/groups`: the groups on streams the caller may manage
/// (`subscribe`), named as it names streams.
pub async fn list(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let principal = request.extensions().get::<Principal>().cloned();
    let access = Access::new(app.auth.as_ref(), principal.as_ref());
    access.authenticated()?;
    let all = app.consumers.groups.list(LISTED_MAX).await?;
    let visible: Vec<Value> = all
        .into_iter()
        .filter(|(_, stream)| permits(&access, "", stream))
        .filter_map(|(g, stream)| {
            let stream = access.shown(&stream)?.to_string();
            Some(json!({ "group": g, "stream": stream }))
        })
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
        .map_err(|e| ApiError::bad_request(format!("request body is not the expected JSON: {e}")))
}

fn ids(ids: &[String]) -> Result<Vec<u64>, ApiError> {
    if ids.len() > groups::CLAIM_MAX * 10 {
        return Err(ApiError::bad_request("too many ids in one request"));
    }
    ids.iter()
        .map(|id| {
            Offset::parse(id)
                .map(|o| o.0)
                .map_err(|e| ApiError::bad_request(format!("id {id:?}: {e}")))
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
    groups::check_group_name(group)?;
    let access = Access::new(app.auth.as_ref(), principal.as_ref());
    access.authenticated()?;
    let body = crate::request::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    let groups = &app.consumers.groups;
    // The stream decides which member answers (the group lives in its slot).
    let (stream, create) = match (&parts.method, action) {
        (&Method::PUT, "") => {
            let b: CreateBody = parse(&body)?;
            // Decided on the name alone, before any lookup.
            let stream = access.stream(Op::Subscribe, stream_arg(&b.stream))?;
            (stream, Some(b))
        }
        // A group on a stream the caller may not use is answered as a missing one:
        // the same status and body, after the same lookup.
        _ => match groups.stream_of(group).await? {
            Some(s) if permits(&access, action, &s) => (s, None),
            _ => return Err(groups::not_found(group).into()),
        },
    };
    if let Some(r) = crate::cluster::answered_elsewhere(&app, &stream, &parts, &body).await? {
        return Ok(r);
    }
    match (&parts.method, action) {
        (&Method::PUT, "") => {
            let b = create.expect("parsed above");
            // The group appends its dead letters: the caller must be allowed to.
            let dead_letter = match &b.dead_letter {
                Some(dlq) => {
                    // A name a client can later read and delete.
                    let max = app.engine.config().stream_name_bytes_max;
                    let dlq = crate::request::addressable_name(&stream_arg(dlq), max)
                        .map_err(|e| ApiError::bad_request(format!("deadLetter: {}", e.message)))?;
                    let dlq = access.absolute(&dlq);
                    access.reach(Op::Append, &dlq)?;
                    Some(dlq)
                }
                None => None,
            };
            let new = NewGroup {
                group: group.to_string(),
                stream,
                max_deliveries: b.max_deliveries,
                dead_letter,
                lease_ms: b.lease_ms,
                from: b.from,
            };
            let (created, described) = groups.open(new).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, shown(&access, described)))
        }
        (&Method::GET, "") => {
            let g = groups.named(group, &stream).await?;
            Ok(json_response(
                StatusCode::OK,
                shown(&access, groups.describe(&g).await?),
            ))
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
            let req = ClaimRequest {
                consumer: b.consumer,
                max: b.max,
                wait: Duration::from_millis(b.wait_ms.unwrap_or(0)),
            };
            let (messages, lease_until) = tokio::select! {
                r = groups.claim_for(group, &stream, req) => r?,
                _ = app.shutdown.fired() => (Vec::new(), 0),
            };
            let data = picomq_engine::StreamName::new(
                stream.clone(),
                app.engine.config().stream_name_bytes_max,
            )?;
            let json_stream = app
                .engine
                .head(&data)
                .await
                .map(|i| i.content_type.starts_with("application/json"))
                .unwrap_or(true);
            Ok(claim_response(&messages, json_stream, lease_until))
        }
        (&Method::POST, "ack") => {
            let b: IdsBody = parse(&body)?;
            let n = groups.ack_for(group, &stream, ids(&b.ids)?).await?;
            Ok(json_response(StatusCode::OK, json!({ "acked": n })))
        }
        (&Method::POST, "nack") => {
            let b: IdsBody = parse(&body)?;
            let delay = Duration::from_millis(b.delay_ms.unwrap_or(0));
            let n = groups.nack_for(group, &stream, ids(&b.ids)?, delay).await?;
            Ok(json_response(StatusCode::OK, json!({ "nacked": n })))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET, PUT or DELETE on a group, POST on its claim, ack and nack",
        )),
    }
}

/// A claim's answer. Built by serializing, never through a `Value`: a JSON
/// message's body goes out as the bytes that were appended, at any depth the append
/// accepted (a `Value` stops at 128 levels).
fn claim_response(messages: &[Message], json_stream: bool, lease_until: u64) -> Response<Body> {
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

fn message_json(m: &Message, json_stream: bool) -> MessageJson<'_> {
    let raw = if json_stream {
        groups::raw_json(&m.body)
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
