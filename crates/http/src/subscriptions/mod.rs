//! The Durable Streams subscription APIs (PROTOCOL.md sections 6 and 7) under the
//! reserved `{stream-root}/__ds/` prefix: subscriptions, their stream links, the
//! webhook signing keys (`__ds/jwks.json`), webhook callbacks and pull-wake claims.
//! Parsing is `config`, the state machine `state`, durability and delivery
//! `manager`, keys `signing`; this module routes and answers.

pub mod config;
pub mod manager;
pub mod signing;
pub mod state;
pub mod webhook;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Response, StatusCode, Uri};
use picomq_engine::metrics::{Counter, Desc, Exposition, Source};
use serde_json::{json, Value};

use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::AppState;
pub use manager::{Settings, Subscriptions};

/// Wake tokens (webhook callback tokens, pull-wake claim tokens) start with this;
/// authentication leaves them to the handlers here.
pub const WAKE_TOKEN_PREFIX: &str = "dsw_";
/// The largest subscription request body.
const BODY_BYTES_MAX: usize = 256 << 10;

pub fn rfc3339_ms(ms: u64) -> String {
    picomq_engine::units::format_rfc3339_ms(ms)
}

/// Where a request path meets the reserved prefix: the stream root before it (as
/// an absolute name prefix, e.g. `v1/stream/`) and what follows `__ds/`.
pub fn split_reserved(path: &str) -> Option<(&str, &str)> {
    let path = path.strip_prefix('/').unwrap_or(path);
    if path == "__ds" {
        return Some(("", ""));
    }
    if let Some(rest) = path.strip_prefix("__ds/") {
        return Some(("", rest));
    }
    let i = path
        .find("/__ds/")
        .map(|i| (i, &path[i + 6..]))
        .or_else(|| path.strip_suffix("/__ds").map(|p| (p.len(), "")))?;
    Some((&path[..i.0 + 1], i.1))
}

enum Action<'a> {
    Jwks,
    Subscription(&'a str),
    Streams(&'a str),
    Unlink(&'a str, String),
    Callback(&'a str),
    Claim(&'a str),
    Ack(&'a str),
    Release(&'a str),
}

fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such Durable Streams control API (paths under __ds are reserved)",
    )
}

fn parse_action(rest: &str) -> Result<Action<'_>, ApiError> {
    if rest == "jwks.json" {
        return Ok(Action::Jwks);
    }
    let rest = rest.strip_prefix("subscriptions/").ok_or_else(not_found)?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    check_id(id)?;
    Ok(match tail {
        "" => Action::Subscription(id),
        "streams" => Action::Streams(id),
        "callback" => Action::Callback(id),
        "claim" => Action::Claim(id),
        "ack" => Action::Ack(id),
        "release" => Action::Release(id),
        t => match t.strip_prefix("streams/") {
            Some(p) => {
                let path = crate::ds::percent_decode(p).ok_or_else(|| {
                    ApiError::bad_request("stream path has a malformed percent-escape")
                })?;
                Action::Unlink(id, path)
            }
            None => return Err(not_found()),
        },
    })
}

fn check_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= config::ID_BYTES_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "a subscription id has 1 to {} characters of A-Z a-z 0-9 - _ . ~",
            config::ID_BYTES_MAX
        ))
        .with_code("INVALID_REQUEST"))
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("static response")
}

fn no_content() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Body::empty())
        .expect("static response")
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Where clients reach the stream root, for the URLs handed out in bodies.
fn root_url(app: &AppState, headers: &HeaderMap, root: &str) -> String {
    if let Some(public) = &app.public_url {
        return format!("{}/{root}", public.trim_end_matches('/'));
    }
    let host = headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(header::HOST))
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.len() <= 255 && !h.contains(['/', ' ', '@']))
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or(if app.tls { "https" } else { "http" });
    format!("{scheme}://{host}/{root}")
}

/// Serves a request under the reserved prefix; `root` and `rest` as
/// [`split_reserved`] found them.
#[allow(clippy::too_many_arguments)]
pub async fn handle(
    app: &Arc<AppState>,
    principal: Option<&Principal>,
    root: &str,
    rest: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    let action = parse_action(rest)?;
    if let Action::Jwks = action {
        if *method != Method::GET && *method != Method::HEAD {
            return Err(method_not_allowed("GET"));
        }
        let jwks = app.subscriptions.signer.jwks(&app.engine).await?;
        return Ok(Response::builder()
            .header(header::CONTENT_TYPE, "application/jwk-set+json")
            .header(header::CACHE_CONTROL, "public, max-age=300")
            .body(Body::from(jwks.to_string()))
            .expect("static response"));
    }
    let id = match &action {
        Action::Subscription(id)
        | Action::Streams(id)
        | Action::Unlink(id, _)
        | Action::Callback(id)
        | Action::Claim(id)
        | Action::Ack(id)
        | Action::Release(id) => *id,
        Action::Jwks => unreachable!("answered above"),
    };
    // The subscription's path; with a namespaced token, within its namespace.
    let mut path = format!("{root}__ds/subscriptions/{id}");
    let op = match &action {
        Action::Callback(_) | Action::Ack(_) | Action::Release(_) => None,
        Action::Claim(_) => Some(Op::Claim),
        _ => Some(Op::Subscribe),
    };
    if let (Some(auth), Some(op)) = (&app.auth, op) {
        path = auth.authorize_stream(principal, op, path)?;
    }
    let root = path[..path.len() - "__ds/subscriptions/".len() - id.len()].to_string();
    // In a cluster, the member serving the subscription's state stream answers.
    let body = if app.cluster.is_none() {
        body
    } else {
        let state = manager::state_stream(&path);
        match Box::pin(crate::cluster::route(
            app, &state, method, uri, headers, body,
        ))
        .await?
        {
            crate::cluster::Decision::Here(body) => body,
            crate::cluster::Decision::Answered(response) => return Ok(response),
        }
    };
    let body = crate::ds::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    let subs = &app.subscriptions;
    match (action, method.clone()) {
        (Action::Subscription(_), Method::PUT) => {
            let config = config::parse_put(&body, subs.settings.webhook_allow_private)?;
            let url = root_url(app, headers, &root);
            let (created, sub) = subs.create(&path, id, &root, &url, config).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &describe(app, &sub).await?))
        }
        (Action::Subscription(_), Method::GET | Method::HEAD) => {
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            Ok(json_response(StatusCode::OK, &describe(app, &sub).await?))
        }
        (Action::Subscription(_), Method::DELETE) => {
            subs.delete(&path).await?;
            Ok(no_content())
        }
        (Action::Subscription(_), _) => Err(method_not_allowed("GET, PUT, DELETE")),
        (Action::Streams(_), Method::POST) => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Add {
                streams: Vec<String>,
            }
            let add: Add = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("body must be {{\"streams\": [...]}}: {e}"))
                    .with_code("INVALID_REQUEST")
            })?;
            let mut paths = Vec::with_capacity(add.streams.len());
            for s in &add.streams {
                paths.push(config::check_path(s)?);
            }
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            let mut tails = Vec::with_capacity(paths.len());
            for p in &paths {
                tails.push(subs.tail_of(&format!("{root}{p}")).await?.unwrap_or(0));
            }
            subs.with_state(&sub, false, |live, _| {
                let mut write = false;
                for (p, tail) in paths.into_iter().zip(tails) {
                    let links = &mut live.state.links;
                    if !links.contains_key(&p) && links.len() >= config::STREAMS_MAX {
                        return Err(ApiError::bad_request(format!(
                            "a subscription links at most {} streams",
                            config::STREAMS_MAX
                        )));
                    }
                    let link = links.entry(p.clone()).or_insert_with(|| state::Link {
                        acked: tail,
                        ..Default::default()
                    });
                    if !link.explicit {
                        link.explicit = true;
                        write = true;
                    }
                    live.tails.entry(p).or_insert(tail);
                }
                Ok(((), write))
            })
            .await?;
            Ok(no_content())
        }
        (Action::Unlink(_, p), Method::DELETE) => {
            let p = p.trim_matches('/').to_string();
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            subs.with_state(&sub, false, |live, _| {
                let Some(link) = live.state.links.get_mut(&p) else {
                    return Ok(((), false));
                };
                if !link.explicit {
                    return Ok(((), false));
                }
                link.explicit = false;
                if !link.glob {
                    live.state.links.remove(&p);
                    live.tails.remove(&p);
                }
                Ok(((), true))
            })
            .await?;
            Ok(no_content())
        }
        (Action::Callback(_), Method::POST) => {
            let req = manager::wake_request(&body)?;
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            let token = bearer(headers).map(str::to_string);
            let next = subs
                .with_state(&sub, false, |live, now| {
                    if live.state.config.kind != config::Kind::Webhook {
                        return Err(wrong_kind("webhook", "callback"));
                    }
                    live.state.check_fence(token.as_deref(), &req)?;
                    live.state.apply_acks(&req.acks, &live.tails)?;
                    live.state.retry = None;
                    if req.done {
                        live.state.wake = None;
                    } else {
                        live.state.extend_lease(now);
                    }
                    let next = req.done && live.state.pending(&live.tails);
                    Ok((next, true))
                })
                .await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({ "ok": true, "next_wake": next }),
            ))
        }
        (Action::Claim(_), Method::POST) => {
            #[derive(serde::Deserialize)]
            struct Claim {
                worker: String,
            }
            let claim: Claim = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("body must be {{\"worker\": \"name\"}}: {e}"))
                    .with_code("INVALID_REQUEST")
            })?;
            if claim.worker.is_empty() || claim.worker.len() > config::WORKER_BYTES_MAX {
                return Err(ApiError::bad_request(format!(
                    "worker must have 1 to {} bytes",
                    config::WORKER_BYTES_MAX
                ))
                .with_code("INVALID_REQUEST"));
            }
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            let answer = subs
                .with_state(&sub, true, |live, now| {
                    if live.state.config.kind != config::Kind::PullWake {
                        return Err(wrong_kind("pull-wake", "claim"));
                    }
                    let token = live.state.claim(&claim.worker, &live.tails, now)?;
                    let wake = live.state.wake.as_ref().expect("claimed");
                    let tails = wake.snapshot.clone().into_iter().collect();
                    let answer = json!({
                        "wake_id": wake.wake_id,
                        "generation": live.state.generation,
                        "token": token,
                        "streams": live.state.stream_infos(&tails),
                        "lease_ttl_ms": live.state.config.lease_ttl_ms,
                    });
                    Ok((answer, true))
                })
                .await?;
            subs.counters.claims.inc();
            Ok(json_response(StatusCode::OK, &answer))
        }
        (Action::Ack(_), Method::POST) => {
            let req = manager::wake_request(&body)?;
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            let token = bearer(headers).map(str::to_string);
            let next = subs
                .with_state(&sub, req.done, |live, now| {
                    if live.state.config.kind != config::Kind::PullWake {
                        return Err(wrong_kind("pull-wake", "ack"));
                    }
                    live.state.check_fence(token.as_deref(), &req)?;
                    live.state.apply_acks(&req.acks, &live.tails)?;
                    if req.done {
                        live.state.wake = None;
                    } else {
                        live.state.extend_lease(now);
                    }
                    let next = req.done && live.state.pending(&live.tails);
                    Ok((next, true))
                })
                .await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({ "ok": true, "next_wake": next }),
            ))
        }
        (Action::Release(_), Method::POST) => {
            let req = manager::wake_request(&body)?;
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            let token = bearer(headers).map(str::to_string);
            subs.with_state(&sub, false, |live, _| {
                if live.state.config.kind != config::Kind::PullWake {
                    return Err(wrong_kind("pull-wake", "release"));
                }
                live.state.check_fence(token.as_deref(), &req)?;
                live.state.wake = None;
                Ok(((), true))
            })
            .await?;
            Ok(no_content())
        }
        (Action::Streams(_), _) => Err(method_not_allowed("POST")),
        (Action::Unlink(..), _) => Err(method_not_allowed("DELETE")),
        _ => Err(method_not_allowed("POST")),
    }
}

async fn describe(app: &AppState, sub: &Arc<manager::Sub>) -> Result<Value, ApiError> {
    let kid = app
        .subscriptions
        .signer
        .active(&app.engine)
        .await?
        .kid
        .clone();
    app.subscriptions
        .with_state(sub, false, |live, _| {
            let mut out = live.state.describe(Some(&kid));
            if live.state.config.kind == config::Kind::PullWake {
                out["webhook"] = Value::Null;
            }
            Ok((out, false))
        })
        .await
}

/// `GET /__picomq/subscriptions`: the subscriptions a token may manage (the
/// `subscribe` scope on their path), as `{"subscriptions": [{"path"}]}` in name
/// order, at most `SUBSCRIPTIONS_LISTED_MAX`. Each one's state is then a `GET` of
/// its path (routed to the member serving it).
pub const LIST_PATH: &str = "/__picomq/subscriptions";
const SUBSCRIPTIONS_LISTED_MAX: usize = 1_000;

pub async fn list(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    principal: Option<axum::Extension<Principal>>,
) -> Result<Response<Body>, ApiError> {
    let viewer = match &app.auth {
        None => None,
        Some(auth) => Some(auth.require_op(principal.as_deref(), Op::Subscribe)?),
    };
    let namespace = viewer.as_ref().map_or("", |t| t.namespace.as_str());
    let prefix = manager::state_stream(namespace);
    let mut paths = Vec::new();
    let mut after = String::new();
    'pages: loop {
        let page = app.engine.list(&prefix, &after, 500).await?;
        for s in &page.streams {
            let path = &s.name[manager::STATE_PREFIX.len()..];
            if viewer
                .as_ref()
                .is_some_and(|t| !t.allows(Op::Subscribe, path))
            {
                continue;
            }
            paths.push(json!({ "path": path.strip_prefix(namespace).unwrap_or(path) }));
            if paths.len() == SUBSCRIPTIONS_LISTED_MAX {
                break 'pages;
            }
        }
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({ "subscriptions": paths }),
    ))
}

/// `POST /__picomq/webhook-keys/rotate` (the admin scope): a new signing key
/// becomes the active one; every earlier key stays in the JWK Set.
pub const ROTATE_PATH: &str = "/__picomq/webhook-keys/rotate";

pub async fn rotate(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    principal: Option<axum::Extension<Principal>>,
) -> Result<Response<Body>, ApiError> {
    if let Some(auth) = &app.auth {
        auth.require_op(principal.as_deref(), Op::Admin)?;
    }
    let kid = app.subscriptions.signer.rotate(&app.engine).await?;
    let jwks = app.subscriptions.signer.jwks(&app.engine).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "active": kid, "keys": jwks["keys"] }),
    ))
}

fn wrong_kind(kind: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("{what} is for {kind} subscriptions"))
        .with_code("INVALID_REQUEST")
}

fn method_not_allowed(allow: &'static str) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("use {allow}"),
    )
    .with_header(header::ALLOW, allow)
}

static CREATED: Desc = Desc::counter(
    "picomq_subscriptions_created_total",
    "Durable Streams subscriptions created on this node.",
);
static WAKES: Desc = Desc::counter(
    "picomq_subscription_wakes_total",
    "Wakes issued (webhook notifications and pull-wake wake events).",
);
static DELIVERIES: Desc = Desc::counter(
    "picomq_subscription_webhook_deliveries_total",
    "Webhook wakes a receiver answered with 2xx.",
);
static DELIVERY_FAILURES: Desc = Desc::counter(
    "picomq_subscription_webhook_failures_total",
    "Webhook attempts that failed (error, timeout, non-2xx); each schedules a retry.",
);
static CLAIMS: Desc = Desc::counter(
    "picomq_subscription_claims_total",
    "Pull-wake claims granted.",
);
static LEASES_LAPSED: Desc = Desc::counter(
    "picomq_subscription_leases_lapsed_total",
    "Wakes whose lease ran out before they were acked or released.",
);

pub struct Counters {
    pub created: Counter,
    pub wakes: Counter,
    pub deliveries: Counter,
    pub delivery_failures: Counter,
    pub claims: Counter,
    pub leases_lapsed: Counter,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            created: Counter::new(&CREATED),
            wakes: Counter::new(&WAKES),
            deliveries: Counter::new(&DELIVERIES),
            delivery_failures: Counter::new(&DELIVERY_FAILURES),
            claims: Counter::new(&CLAIMS),
            leases_lapsed: Counter::new(&LEASES_LAPSED),
        }
    }
}

impl Source for Subscriptions {
    fn export(&self, out: &mut Exposition) {
        let c = &self.counters;
        out.counter(&c.created)
            .counter(&c.wakes)
            .counter(&c.deliveries)
            .counter(&c.delivery_failures)
            .counter(&c.claims)
            .counter(&c.leases_lapsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_prefix_is_found_under_any_root() {
        assert_eq!(
            split_reserved("/v1/stream/__ds/subscriptions/a"),
            Some(("v1/stream/", "subscriptions/a"))
        );
        assert_eq!(split_reserved("/__ds/jwks.json"), Some(("", "jwks.json")));
        assert_eq!(split_reserved("/v1/__ds"), Some(("v1/", "")));
        assert_eq!(split_reserved("/v1/stream/events/a"), None);
        assert_eq!(split_reserved("/v1/stream/x__ds/a"), None);
        assert!(matches!(
            parse_action("subscriptions/s1/streams/manual%2Fb"),
            Ok(Action::Unlink("s1", p)) if p == "manual/b"
        ));
        assert!(parse_action("subscriptions/a b").is_err());
        assert!(parse_action("other").is_err());
    }
}
