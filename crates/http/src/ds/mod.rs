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

use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::AppState;

pub use query::{addressable_name, percent_decode, read_params, stream_name};

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
        Method::HEAD => Box::pin(read::head(&app, name)).await,
        Method::GET => Box::pin(read::get(&app, &caller, name, uri.query(), &headers)).await,
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

/// Bytes past the limit a body may still bring that are read and dropped before its
/// 413 is sent (see [`read_body`]).
const DRAIN_BYTES_MAX: u64 = 16 << 20;

/// Reads a request body, refusing more than `limit` bytes with 413 and a body that
/// takes longer than `timeout` to arrive with 408.
///
/// The body is copied into an allocation of its own size. hyper hands a body over as
/// a slice of the connection's read buffer (8 KiB or more), and the records cut from
/// it live on in the tail cache, so a 1 KiB append kept that whole buffer alive and
/// made hyper allocate a fresh one for the next request on the connection: the cache
/// pinned ~8x the bytes it counted, and the fresh buffers were most of the server's
/// page faults under load. One memcpy of the body is cheaper than either.
///
/// A body over the limit is still read (and dropped) up to [`DRAIN_BYTES_MAX`] past
/// it: answered with its body unread, the connection is closed under a client that is
/// still sending, which then sees a reset rather than the 413. Past that allowance
/// the 413 goes out at once and the connection closes.
pub async fn read_body(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<bytes::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    };
    let limit_u64 = limit as u64;
    let drain_until = limit_u64.saturating_add(DRAIN_BYTES_MAX);
    let hint = axum::body::HttpBody::size_hint(&body);
    if hint.lower() > drain_until {
        return Err(too_large().with_header("connection", "close"));
    }
    let mut over = hint.lower() > limit_u64;
    // Sized by Content-Length, but never trusting a client's claim for more than 1 MiB
    // of memory up front.
    let mut out = Vec::with_capacity(if over {
        0
    } else {
        hint.lower().min(1 << 20) as usize
    });
    let mut seen = 0u64;
    let mut chunks = body.into_data_stream();
    let read = async {
        while let Some(chunk) = futures::StreamExt::next(&mut chunks).await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            })?;
            seen += chunk.len() as u64;
            if seen > drain_until {
                return Err(too_large().with_header("connection", "close"));
            }
            if seen > limit_u64 && !over {
                over = true;
                out = Vec::new();
            }
            if !over {
                out.extend_from_slice(&chunk);
            }
        }
        Ok(())
    };
    // A small body has usually arrived with its request (one read brought both), so
    // the deadline's timer is armed only if the first poll has to wait: creating and
    // dropping it was ~400 instructions of every append (callgrind).
    let mut read = std::pin::pin!(read);
    let read = match futures::FutureExt::now_or_never(read.as_mut()) {
        Some(done) => Ok(done),
        None => tokio::time::timeout(timeout, read).await,
    };
    match read {
        Err(_) if over => return Err(too_large().with_header("connection", "close")),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!("the request body did not arrive within {timeout:?}"),
            )
            .with_header("connection", "close"))
        }
        Ok(result) => result?,
    }
    if over {
        return Err(too_large());
    }
    out.shrink_to_fit();
    Ok(bytes::Bytes::from(out))
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
        let past = 100 + DRAIN_BYTES_MAX as usize + 1;
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
