//! The Durable Streams protocol on any URL path: thin translations of PUT / POST /
//! GET / HEAD / DELETE onto the stream service. Parsing lives in `headers` and
//! `query`, error mapping in `error`; handlers only wire them together.

mod query;
mod read;
mod sse;
mod write;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, Request, Response, StatusCode};

use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::AppState;

pub use query::{percent_decode, read_params, stream_name};

pub type HttpResult = Result<Response<Body>, ApiError>;

/// Entry point for every request that is not a reserved path. Takes the request
/// whole: the `HeaderMap`/`Uri` extractors would clone them on every request.
pub async fn handle(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let principal = parts.extensions.remove::<Principal>();
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    if method == Method::OPTIONS {
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Body::empty())
            .expect("static response"));
    }
    let mut name = query::stream_name(uri.path(), app.engine.config().stream_name_bytes_max)?;
    if name.starts_with("__") {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "reserved_path",
            "paths whose first segment starts with __ are reserved for server APIs",
        ));
    }
    let op = match method {
        Method::PUT => Op::Create,
        Method::POST => Op::Append,
        Method::DELETE => Op::Delete,
        Method::HEAD | Method::GET => Op::Read,
        _ => Op::Admin,
    };
    // Authorization comes before any lookup: a refusal says nothing about whether the
    // stream exists. With a namespaced token, `name` becomes the absolute name.
    let principal = principal.as_ref();
    let caller = match &app.auth {
        None => Caller::Open,
        Some(auth) if op != Op::Admin => {
            name = auth.authorize_stream(principal, op, name)?;
            Caller::Authorized {
                principal: principal.expect("authorized callers have a principal"),
            }
        }
        Some(_) => Caller::Open,
    };
    match method {
        Method::PUT => write::create(&app, &caller, name, &headers, body).await,
        Method::POST => write::append(&app, name, &headers, body).await,
        Method::DELETE => write::delete(&app, name).await,
        Method::HEAD => read::head(&app, name).await,
        Method::GET => read::get(&app, &caller, name, uri.query(), &headers).await,
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not supported on a stream; use PUT, POST, GET, HEAD or DELETE"),
        )
        .with_header(
            axum::http::header::ALLOW,
            "GET, POST, PUT, DELETE, HEAD, OPTIONS",
        )),
    }
}

/// Who is calling a stream handler, as far as the handler needs to know.
pub enum Caller<'a> {
    /// `--auth off`: anyone may do anything.
    Open,
    /// Authorized for the request's operation on its stream.
    Authorized { principal: &'a Principal },
}

impl Caller<'_> {
    /// The name to show the caller for the absolute `name`.
    pub fn display_name<'n>(&self, name: &'n str) -> &'n str {
        match self {
            Caller::Authorized {
                principal: Principal::Token(t),
                ..
            } => name.strip_prefix(t.namespace.as_str()).unwrap_or(name),
            _ => name,
        }
    }

    /// The credential the request was authorized with (none with `--auth off`).
    pub fn principal(&self) -> Option<&Principal> {
        match self {
            Caller::Authorized { principal } => Some(principal),
            Caller::Open => None,
        }
    }

    /// The token id live-reader limits count against.
    pub fn token_id(&self) -> Option<&str> {
        match self {
            Caller::Authorized {
                principal: Principal::Token(t),
                ..
            } => Some(&t.id),
            _ => None,
        }
    }
}

/// Reads a request body, refusing more than `limit` bytes with 413 and a body that
/// takes longer than `timeout` to arrive with 408.
pub async fn read_body(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<bytes::Bytes, ApiError> {
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await;
    let read = read.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the request body did not arrive within {timeout:?}"),
        )
        .with_header("connection", "close")
    })?;
    read.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.to_string().contains("length limit"))
            || e.to_string().contains("length limit");
        if too_large {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body exceeds the limit of {limit} bytes"),
            )
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// `Stream-Next-Offset` and friends: the wire form straight into a header value, with
/// no formatter and no intermediate `String` (one of these is on every response).
pub fn offset_value(offset: picomq_engine::Offset) -> HeaderValue {
    HeaderValue::from_bytes(&offset.encode()).expect("an offset is digits and one underscore")
}

/// A header value from server-controlled or validated text.
pub fn value(s: impl AsRef<str>) -> HeaderValue {
    HeaderValue::from_str(s.as_ref())
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
}
