//! The token API under the reserved prefix: `POST/GET /__picomq/tokens`,
//! `DELETE /__picomq/tokens/{id}` (the `tokens` scope) and
//! `POST /__picomq/read-tokens` (read on the stream). JSON in, JSON out.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Response, StatusCode};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::{json_response, AppState};
use crate::auth::{forbidden, scope, Access, Auth, Op, Principal, Scope, Token, TokenRequest};
use crate::error::ApiError;
use crate::request::read_body;

pub const TOKENS_PATH: &str = "/__picomq/tokens";
pub const TOKEN_PATH: &str = "/__picomq/tokens/{id}";
pub const READ_TOKENS_PATH: &str = "/__picomq/read-tokens";
/// Largest body of a token request.
const BODY_BYTES_MAX: usize = 64 * 1024;
/// Longest life a token can be given (about ten years).
const TOKEN_TTL_SECS_MAX: u64 = 10 * 366 * 24 * 3600;
/// A read token's life when the request does not say.
const READ_TOKEN_TTL_DEFAULT: Duration = Duration::from_secs(300);
/// Longest description of a token.
const DESCRIPTION_BYTES_MAX: usize = 256;

type Caller = Option<Extension<Principal>>;

fn auth(app: &AppState) -> Result<&Arc<Auth>, ApiError> {
    app.auth.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "auth_off",
            "authentication is off on this server (--auth off): there are no tokens to manage",
        )
    })
}

async fn json_body<T: for<'de> Deserialize<'de>>(
    app: &AppState,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("request body is not the expected JSON: {e}")))
}

fn rfc3339(ms: u64) -> Value {
    Value::String(picomq_engine::units::format_rfc3339_ms(ms))
}

/// A token as listed: never its secret or hash. Namespaces and scopes are shown
/// relative to the viewer's own namespace.
fn describe(t: &Token, viewer_ns: &str) -> Value {
    json!({
        "id": t.id,
        "parentId": t.parent_id,
        "description": t.description,
        "scopes": t.scopes.iter().map(|s| s.text.clone()).collect::<Vec<_>>(),
        "namespace": t.namespace.strip_prefix(viewer_ns).unwrap_or(&t.namespace),
        "createdAt": rfc3339(t.created_ms),
        "expiresAt": t.expires_ms.map_or(Value::Null, rfc3339),
        "revokedAt": t.revoked_ms.map_or(Value::Null, rfc3339),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateBody {
    scopes: Vec<String>,
    #[serde(default)]
    namespace: String,
    expires_in_seconds: Option<u64>,
    #[serde(default)]
    description: String,
}

pub async fn create(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    let auth = auth(&app)?;
    let issuer = Access::new(app.auth.as_ref(), caller.as_deref())
        .node(Op::Tokens)?
        .expect("authentication is on");
    let req: CreateBody = json_body(&app, body).await?;
    if req.scopes.len() > scope::SCOPES_MAX {
        return Err(ApiError::bad_request(format!(
            "at most {} scopes per token",
            scope::SCOPES_MAX
        )));
    }
    let scopes = req
        .scopes
        .iter()
        .map(|s| Scope::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ApiError::bad_request)?;
    let namespace = scope::parse_namespace(&req.namespace).map_err(ApiError::bad_request)?;
    let expires_ms = match req.expires_in_seconds {
        Some(0) => return Err(ApiError::bad_request("expiresInSeconds must be at least 1")),
        Some(s) if s > TOKEN_TTL_SECS_MAX => {
            return Err(ApiError::bad_request(format!(
                "expiresInSeconds is at most {TOKEN_TTL_SECS_MAX} (ten years)"
            )))
        }
        Some(s) => Some(app.engine.clock().now_ms() + s * 1000),
        None => None,
    };
    if req.description.len() > DESCRIPTION_BYTES_MAX
        || req.description.chars().any(char::is_control)
    {
        return Err(ApiError::bad_request(format!(
            "description: at most {DESCRIPTION_BYTES_MAX} bytes, no control characters"
        )));
    }
    let (token, secret) = auth
        .issue(
            &issuer,
            TokenRequest {
                scopes,
                namespace,
                expires_ms,
                description: req.description,
            },
        )
        .await?;
    tracing::info!(id = %token.id, issuer = %issuer.id, "token issued");
    let mut body = describe(&token, &issuer.namespace);
    body["token"] = Value::String(secret);
    Ok(json_response(StatusCode::CREATED, body))
}

pub async fn list(
    State(app): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Response<Body>, ApiError> {
    let auth = auth(&app)?;
    let viewer = Access::new(app.auth.as_ref(), caller.as_deref())
        .node(Op::Tokens)?
        .expect("authentication is on");
    let tokens: Vec<Value> = auth
        .visible(&viewer)
        .iter()
        .map(|t| describe(t, &viewer.namespace))
        .collect();
    Ok(json_response(StatusCode::OK, json!({ "tokens": tokens })))
}

pub async fn revoke(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response<Body>, ApiError> {
    let auth = auth(&app)?;
    let viewer = Access::new(app.auth.as_ref(), caller.as_deref())
        .node(Op::Tokens)?
        .expect("authentication is on");
    if id.len() > 64 || !auth.revoke(&viewer, &id).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no token {id:?} among those this token manages"),
        ));
    }
    tracing::info!(id = %id, by = %viewer.id, "token revoked (with every token issued under it)");
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Body::empty())
        .expect("valid response"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReadTokenBody {
    stream: String,
    expires_in_seconds: Option<u64>,
}

/// Mints a signed, read-only token for one stream, for clients that cannot send
/// headers (EventSource): `GET /STREAM?token=...`.
pub async fn mint_read_token(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    let auth = auth(&app)?;
    let caller = caller.as_deref();
    if matches!(caller, Some(Principal::ReadLink { .. })) {
        return Err(forbidden("a read token cannot mint read tokens"));
    }
    let req: ReadTokenBody = json_body(&app, body).await?;
    let path = format!("/{}", req.stream.trim_start_matches('/'));
    let name = crate::request::stream_name(&path, app.engine.config().stream_name_bytes_max)?;
    let name = Access::new(app.auth.as_ref(), caller).stream(Op::Read, name)?;
    let max = auth.config.read_token_ttl_max.as_secs().max(1);
    let ttl = req
        .expires_in_seconds
        .unwrap_or(READ_TOKEN_TTL_DEFAULT.as_secs().min(max));
    if ttl == 0 || ttl > max {
        return Err(ApiError::bad_request(format!(
            "expiresInSeconds must be from 1 to {max} (--read-token-max-ttl)"
        )));
    }
    let expires_secs = app.engine.clock().now_ms() / 1000 + ttl;
    let token = auth.read_key().mint(&name, expires_secs);
    Ok(json_response(
        StatusCode::CREATED,
        json!({
            "token": token,
            "path": format!("/{name}"),
            "expiresAt": rfc3339(expires_secs * 1000),
        }),
    ))
}
