//! The Durable Streams protocol on any URL path: thin translations of PUT / POST /
//! GET / HEAD / DELETE onto the stream service. Parsing lives in `headers` and
//! `query`, error mapping in `error`; handlers only wire them together.

pub(crate) mod query;
mod read;
pub(crate) mod sse;
pub(crate) mod write;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, Request, Response, StatusCode};

use picomq_engine::StreamName;

use crate::app::AppState;
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;

pub use crate::request::{percent_decode, read_body, stream_name};
pub use query::read_params;

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
    // The Durable Streams control APIs come before any stream (PROTOCOL.md 6).
    if let Some((root, rest)) = crate::subscriptions::split_reserved(uri.path()) {
        let (root, rest) = (root.to_string(), rest.to_string());
        return Box::pin(crate::subscriptions::handle(
            &app,
            principal.as_ref(),
            &root,
            &rest,
            &method,
            &uri,
            &headers,
            body,
        ))
        .await;
    }
    let name = crate::request::stream_name(uri.path(), app.engine.config().stream_name_bytes_max)?;
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
    let access = Access::new(app.auth.as_ref(), principal);
    let (name, caller) = match (&app.auth, principal) {
        // An unsupported method answers 405 below, whoever asks.
        _ if op == Op::Admin => {
            if crate::auth::access::is_reserved(&name) {
                return Err(crate::auth::access::reserved());
            }
            (name, Caller::Open)
        }
        (None, _) => (access.stream(op, name)?, Caller::Open),
        (Some(_), _) => {
            let name = access.stream(op, name)?;
            let principal = principal.expect("authorized callers have a principal");
            (name, Caller::Authorized { principal })
        }
    };
    // The name as the engine takes it: checked once, here.
    let max = app.engine.config().stream_name_bytes_max;
    let name = StreamName::new(name, max).map_err(ApiError::from)?;
    // In a cluster, the member serving the stream answers (see `cluster`). Boxed:
    // a single node's requests do not carry the routing's future.
    let body = if app.cluster.is_none() {
        body
    } else {
        match Box::pin(crate::cluster::route(
            &app, &name, &method, &uri, &headers, body,
        ))
        .await?
        {
            crate::cluster::Decision::Here(body) => body,
            crate::cluster::Decision::Answered(response) => return Ok(response),
        }
    };
    // Every request's future is as large as its largest branch and is moved into a
    // box per request: the append's branch is inline, the others are boxed, so an
    // append's future is 3,456 bytes instead of 5,096 (with the engine's rare
    // branches boxed too).
    match method {
        Method::PUT => Box::pin(write::create(&app, &caller, name, &headers, body)).await,
        Method::POST => write::append(&app, name, &headers, body).await,
        Method::DELETE => Box::pin(write::delete(&app, name)).await,
        Method::HEAD => {
            let r = Box::pin(read::head(&app, name.clone())).await;
            with_schema(&app, &name, r).await
        }
        Method::GET => {
            let r = Box::pin(read::get(
                &app,
                &caller,
                name.clone(),
                uri.query(),
                &headers,
            ))
            .await
            .map_err(|e| crate::tables::name_holder(&app, name.as_str(), e));
            with_schema(&app, &name, r).await
        }
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

/// `Stream-Next-Offset` and friends: the wire form straight into a header value, with
/// no formatter and no intermediate `String` (one of these is on every response).
pub fn offset_value(offset: picomq_engine::Offset) -> HeaderValue {
    let v =
        HeaderValue::from_bytes(&offset.encode()).expect("an offset is digits and one underscore");
    crate::headers::never_indexed(v)
}

/// A header value from server-controlled or validated text.
pub fn value(s: impl AsRef<str>) -> HeaderValue {
    HeaderValue::from_str(s.as_ref())
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
}

/// The subject (and version) the stream `name` is bound to, if any: a version for
/// a pinned binding, or the subject's latest for a JSON stream.
pub async fn schema_of(app: &AppState, name: &StreamName) -> Option<(String, Option<u32>)> {
    let state = app.registry.snapshot();
    let binding = state.bindings.get(name.as_str())?;
    let stream = app.engine.stream(name).await.ok()?;
    if stream.info().id != binding.stream_id {
        return None;
    }
    let version = binding.version.or_else(|| {
        stream
            .handle
            .config
            .json
            .then(|| state.latest(&binding.subject, false).map(|(v, _)| v))
            .flatten()
    });
    Some((binding.subject.clone(), version))
}

/// A read's answer, naming the contract of a bound stream.
pub(crate) async fn with_schema(app: &AppState, name: &StreamName, r: HttpResult) -> HttpResult {
    let mut resp = r?;
    if resp.status().is_success() && !app.registry.snapshot().bindings.is_empty() {
        if let Some((subject, version)) = schema_of(app, name).await {
            let h = resp.headers_mut();
            if let Ok(v) = axum::http::HeaderValue::from_str(&subject) {
                h.insert(crate::headers::STREAM_SCHEMA_SUBJECT, v);
            }
            if let Some(v) = version {
                h.insert(crate::headers::STREAM_SCHEMA_VERSION, v.into());
            }
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A body that arrives as a slice of a larger buffer (as hyper hands it over)
    /// comes back in an allocation of its own, so what the tail cache keeps of it
    /// does not hold the connection's buffer.
    #[tokio::test]
    async fn a_body_does_not_keep_the_buffer_it_was_read_from() {
        let buffer = bytes::Bytes::from(vec![b'x'; 8192]);
        let body = Body::from(buffer.slice(100..1124));
        let read = read_body(body, 1 << 20, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(read.len(), 1024);
        let inside = buffer.as_ptr_range();
        assert!(
            !inside.contains(&read.as_ptr()),
            "the body still points into the read buffer"
        );
    }

    /// A body of unknown length (chunked), arriving in `chunks`.
    fn streamed(chunks: Vec<Vec<u8>>) -> Body {
        Body::from_stream(futures::stream::iter(
            chunks.into_iter().map(Ok::<_, std::io::Error>),
        ))
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_413_whether_its_length_is_known_or_not() {
        let limit = |body| read_body(body, 100, Duration::from_secs(5));
        let known = Body::from(vec![0u8; 101]);
        let err = limit(known).await.unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);

        let err = limit(streamed(vec![vec![0; 60], vec![0; 60]]))
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);

        let read = limit(streamed(vec![vec![1; 50], vec![2; 50]]))
            .await
            .unwrap();
        assert_eq!(&read[..], [[1u8; 50], [2u8; 50]].concat());

        // Within the drain allowance the body is read to its end and the connection
        // kept; past it the answer is at once and the connection closes.
        let closes = |e: &ApiError| {
            e.headers
                .iter()
                .any(|(n, v)| n == "connection" && v == "close")
        };
        let err = limit(Body::from(vec![0u8; 200])).await.unwrap_err();
        assert!(!closes(&err), "{err:?}");
        let past = 100 + crate::request::DRAIN_BYTES_MAX as usize + 1;
        let err = limit(Body::from(vec![0u8; past])).await.unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(closes(&err), "{err:?}");
        let err = limit(streamed(vec![vec![0; past - 1], vec![0; 1]]))
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(closes(&err), "{err:?}");
    }
}
