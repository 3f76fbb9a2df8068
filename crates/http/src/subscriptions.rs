//! The Durable Streams subscription APIs (PROTOCOL.md sections 6 and 7) over HTTP,
//! under the reserved `{stream-root}/__ds/` prefix: subscriptions, their stream
//! links, the webhook signing keys (`__ds/jwks.json`), webhook callbacks and
//! pull-wake claims. Requests are parsed and every stream they reach authorized
//! here (`auth::access`); what subscriptions are and do is the consumers layer's
//! (`picomq_consumers::subscriptions`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Response, StatusCode, Uri};
use picomq_consumers::subscriptions::{self as subs, config, manager, WakeRequest};
use serde_json::{json, Value};

use crate::app::AppState;
use crate::auth::scope::{Pattern, Tok};
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;

pub use subs::WAKE_TOKEN_PREFIX;

/// The largest subscription request body.
const BODY_BYTES_MAX: usize = 256 << 10;
/// Subscriptions one listing shows.
const SUBSCRIPTIONS_LISTED_MAX: usize = 1_000;

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
    subs::check_id(id)?;
    Ok(match tail {
        "" => Action::Subscription(id),
        "streams" => Action::Streams(id),
        "callback" => Action::Callback(id),
        "claim" => Action::Claim(id),
        "ack" => Action::Ack(id),
        "release" => Action::Release(id),
        t => match t.strip_prefix("streams/") {
            Some(p) => {
                let path = crate::request::percent_decode(p).ok_or_else(|| {
                    ApiError::bad_request("stream path has a malformed percent-escape")
                })?;
                Action::Unlink(id, path)
            }
            None => return Err(not_found()),
        },
    })
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

fn wake_request(body: &[u8]) -> Result<WakeRequest, ApiError> {
    Ok(manager::wake_request(body)?)
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
    let subs = &app.consumers.subscriptions;
    let action = parse_action(rest)?;
    if let Action::Jwks = action {
        if *method != Method::GET && *method != Method::HEAD {
            return Err(method_not_allowed("GET"));
        }
        let jwks = subs.signer.jwks(&app.engine).await?;
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
    // Callbacks, acks and releases carry the wake's own token instead.
    let mut path = format!("{root}__ds/subscriptions/{id}");
    let op = match &action {
        Action::Callback(_) | Action::Ack(_) | Action::Release(_) => None,
        Action::Claim(_) => Some(Op::Claim),
        _ => Some(Op::Subscribe),
    };
    let access = Access::new(app.auth.as_ref(), principal);
    if let Some(op) = op {
        path = access.subscription(op, &path)?;
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
    let body = crate::request::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    let token = bearer(headers);
    match (action, method.clone()) {
        (Action::Subscription(_), Method::PUT) => {
            let config = config::parse_put(&body, subs.settings.webhook_allow_private)?;
            authorize_links(&access, &root, &config)?;
            let url = root_url(app, headers, &root);
            let (created, sub) = subs.create(&path, id, &root, &url, config).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &subs.describe(&sub).await?))
        }
        (Action::Subscription(_), Method::GET | Method::HEAD) => {
            let sub = subs.get(&path).await?.ok_or_else(manager::not_found)?;
            Ok(json_response(StatusCode::OK, &subs.describe(&sub).await?))
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
                let p = config::check_path(s)?;
                // A linked stream's tail and changes go to whoever the wakes reach.
                access.reach(Op::Read, &format!("{root}{p}"))?;
                paths.push(p);
            }
            subs.link(&path, &root, paths).await?;
            Ok(no_content())
        }
        (Action::Unlink(_, p), Method::DELETE) => {
            subs.unlink(&path, &p).await?;
            Ok(no_content())
        }
        (Action::Callback(_), Method::POST) => {
            let next = subs.callback(&path, token, wake_request(&body)?).await?;
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
            let answer = subs.claim(&path, &claim.worker).await?;
            Ok(json_response(StatusCode::OK, &answer))
        }
        (Action::Ack(_), Method::POST) => {
            let next = subs.ack(&path, token, wake_request(&body)?).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({ "ok": true, "next_wake": next }),
            ))
        }
        (Action::Release(_), Method::POST) => {
            subs.release(&path, token, wake_request(&body)?).await?;
            Ok(no_content())
        }
        (Action::Streams(_), _) => Err(method_not_allowed("POST")),
        (Action::Unlink(..), _) => Err(method_not_allowed("DELETE")),
        _ => Err(method_not_allowed("POST")),
    }
}

/// Every stream a subscription touches, for the operation it performs there: its
/// linked and glob-matched streams are read (their names and tails go out with every
/// wake), its wake stream appended to. `root` is absolute.
fn authorize_links(
    access: &Access<'_>,
    root: &str,
    config: &config::SubConfig,
) -> Result<(), ApiError> {
    for p in &config.streams {
        access.reach(Op::Read, &format!("{root}{p}"))?;
    }
    if let Some(pattern) = &config.pattern {
        for wanted in scope_patterns(root, pattern) {
            access.pattern(Op::Read, &wanted)?;
        }
    }
    if let Some(wake) = &config.wake_stream {
        access.reach(Op::Append, &format!("{root}{wake}"))?;
    }
    Ok(())
}

/// Most `**` segments whose zero-segment forms [`scope_patterns`] spells out; a
/// pattern with more needs a token that covers `**` under its root.
const DOUBLE_STARS_SPELLED_MAX: usize = 4;

/// What a subscription `pattern` under `root` can match, as token-scope patterns:
/// the pattern itself and each form with some `**` segments matching no segment
/// (`a/**` matches `a`). A caller who holds an operation on all of them holds it on
/// every stream the subscription can ever link.
fn scope_patterns(root: &str, pattern: &str) -> Vec<Pattern> {
    let segs: Vec<&str> = pattern.split('/').collect();
    let stars: Vec<usize> = (0..segs.len()).filter(|&i| segs[i] == "**").collect();
    if stars.len() > DOUBLE_STARS_SPELLED_MAX {
        let mut toks: Vec<Tok> = root.bytes().map(Tok::Lit).collect();
        toks.push(Tok::DoubleStar);
        return vec![Pattern::from_toks(toks)];
    }
    let mut out = Vec::new();
    for kept in 0u32..(1 << stars.len()) {
        let mut toks: Vec<Tok> = root.bytes().map(Tok::Lit).collect();
        let mut first = true;
        for (i, seg) in segs.iter().enumerate() {
            let dropped = stars
                .iter()
                .position(|&s| s == i)
                .is_some_and(|k| kept & (1 << k) == 0);
            if dropped {
                continue;
            }
            if !first {
                toks.push(Tok::Lit(b'/'));
            }
            first = false;
            if *seg == "**" {
                toks.push(Tok::DoubleStar);
                continue;
            }
            for b in seg.bytes() {
                toks.push(if b == b'*' { Tok::Star } else { Tok::Lit(b) });
            }
        }
        out.push(Pattern::from_toks(toks));
    }
    out
}

/// `GET /__picomq/subscriptions`: the subscriptions a token may manage (the
/// `subscribe` scope on their path), as `{"subscriptions": [{"path"}]}` in name
/// order, at most `SUBSCRIPTIONS_LISTED_MAX`. Each one's state is then a `GET` of
/// its path (routed to the member serving it).
pub const LIST_PATH: &str = "/__picomq/subscriptions";

pub async fn list(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    principal: Option<axum::Extension<Principal>>,
) -> Result<Response<Body>, ApiError> {
    let access = Access::new(app.auth.as_ref(), principal.as_deref());
    access.node(Op::Subscribe)?;
    let namespace = access.namespace();
    let paths = app
        .consumers
        .subscriptions
        .paths(namespace, SUBSCRIPTIONS_LISTED_MAX, |path| {
            access.allows_subscription(Op::Subscribe, path)
        })
        .await?;
    let paths: Vec<Value> = paths
        .iter()
        .map(|p| json!({ "path": access.shown(p).unwrap_or(p) }))
        .collect();
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
    Access::new(app.auth.as_ref(), principal.as_deref()).node(Op::Admin)?;
    let (kid, jwks) = app.consumers.subscriptions.rotate_key().await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "active": kid, "keys": jwks["keys"] }),
    ))
}

fn method_not_allowed(allow: &'static str) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("use {allow}"),
    )
    .with_header(header::ALLOW, allow)
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
        assert_eq!(split_reserved("/a/b"), None);
    }

    #[test]
    fn a_pattern_is_covered_with_every_form_of_its_double_stars() {
        let shown = |root: &str, p: &str| {
            scope_patterns(root, p)
                .into_iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
        };
        // `a/**` also matches `a`: two forms.
        assert_eq!(shown("", "a/**").len(), 2);
        assert_eq!(shown("r/", "a/*").len(), 1);
        let prefix = Pattern::parse("a/**").unwrap();
        let forms = scope_patterns("", "a/**");
        assert!(
            forms.iter().any(|f| !prefix.covers(f)),
            "a/** does not cover the stream a"
        );
        let all = Pattern::parse("**").unwrap();
        assert!(forms.iter().all(|f| all.covers(f)));
        // More `**` segments than are spelled out: the whole root is needed.
        assert_eq!(shown("", "**/**/**/**/**").len(), 1);
    }
}
