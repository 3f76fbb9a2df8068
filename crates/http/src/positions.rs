//! Server-kept positions, for consumers that keep no state (a function invoked per
//! event): a consumer names itself, commits the Durable Streams offset it reached,
//! and reads on from it with `?consumer=NAME` instead of `?offset=`. Offsets stay
//! the protocol's opaque tokens; a client that knows nothing of positions reads as
//! it always did.
//!
//! ```text
//! PUT    /__picomq/positions/{consumer}/{stream}   {"offset": "..."}  commit
//! GET    /__picomq/positions/{consumer}/{stream}   -> {"offset": "..."}
//! DELETE /__picomq/positions/{consumer}/{stream}
//! GET    /{stream}?consumer={consumer}             read from the committed position
//! ```
//!
//! A position is a companion stream `__positions/{consumer}/{stream}` (in the
//! stream's slot: the member serving the stream keeps its positions), one JSON
//! message per commit; the last one is the position. Trimmed to its last message
//! every [`TRIM_EVERY`] commits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, Response, StatusCode};
use bytes::Bytes;
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, Engine, EngineError, Offset, StreamName,
};
use serde_json::json;

use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::{json_response, AppState};

pub const PATH: &str = "/__picomq/positions/{*rest}";
const PREFIX: &str = "__positions/";
const TRIM_EVERY: u64 = 64;
const CONSUMER_BYTES_MAX: usize = 128;
/// Positions a node keeps in memory (a lookup past it reads the stream).
const CACHE_MAX: usize = 100_000;

pub struct Positions {
    engine: Engine,
    /// Companion name -> (offset, commits since the last trim).
    cache: Mutex<HashMap<String, (Offset, u64)>>,
}

pub fn check_consumer(consumer: &str) -> Result<(), ApiError> {
    check_key_name("consumer", consumer, CONSUMER_BYTES_MAX)
}

/// A group or consumer name, the key of a companion stream: it must not hold `/`
/// (`cluster::slots::placed_by` splits at the first one).
pub fn check_key_name(what: &str, name: &str, max: usize) -> Result<(), ApiError> {
    // `.` and `..` would be path segments of the companion stream's name.
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "a {what} name has 1 to {max} characters of A-Z a-z 0-9 - _ . (and is not . or ..)"
        )))
    }
}

impl Positions {
    pub fn new(engine: Engine) -> Arc<Positions> {
        Arc::new(Positions {
            engine,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn companion(&self, consumer: &str, stream: &str) -> Result<StreamName, ApiError> {
        StreamName::new(
            format!("{PREFIX}{consumer}/{stream}"),
            self.engine.config().stream_name_bytes_max,
        )
        .map_err(ApiError::from)
    }

    /// The committed position of `consumer` on `stream`, if any.
    pub async fn get(&self, consumer: &str, stream: &str) -> Result<Option<Offset>, ApiError> {
        let name = self.companion(consumer, stream)?;
        if let Some((o, _)) = self
            .cache
            .lock()
            .expect("positions lock")
            .get(name.as_str())
        {
            return Ok(Some(*o));
        }
        let handle = match self.engine.stream(&name).await {
            Ok(h) => h,
            Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut from = self.engine.retained_start(&handle).await?;
        let mut last = None;
        loop {
            let chunk = self.engine.read(&handle, from, 1 << 20).await?;
            if let Some(seg) = chunk.segments.last() {
                last = Some(seg.clone());
            }
            let done = chunk.up_to_date || chunk.next == from;
            from = chunk.next;
            if done {
                break;
            }
        }
        let offset = last
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["offset"].as_str().and_then(|s| Offset::parse(s).ok()));
        if let Some(o) = offset {
            self.remember(name.as_str(), o, 0);
        }
        Ok(offset)
    }

    fn remember(&self, name: &str, offset: Offset, commits: u64) {
        let mut cache = self.cache.lock().expect("positions lock");
        if cache.len() >= CACHE_MAX && !cache.contains_key(name) {
            cache.clear();
        }
        cache.insert(name.to_string(), (offset, commits));
    }

    /// Commits `offset` (durable on return). It must be an offset of the stream,
    /// at most its tail.
    pub async fn commit(
        &self,
        consumer: &str,
        stream: &str,
        offset: Offset,
    ) -> Result<(), ApiError> {
        let data = StreamName::new(
            stream.to_string(),
            self.engine.config().stream_name_bytes_max,
        )?;
        let info = self.engine.head(&data).await?;
        if offset > info.tail {
            return Err(ApiError::bad_request(format!(
                "offset {offset} is past the stream's tail {}",
                info.tail
            )));
        }
        let name = self.companion(consumer, stream)?;
        let mut create = CreateRequest::new(name.clone());
        create.content_type = Some(ContentType::json());
        self.engine.create(create).await?;
        let body = json!({ "offset": offset.to_string(), "at": self.engine.clock().now_ms() });
        let req = AppendRequest::new(
            name.clone(),
            Some(ContentType::json()),
            Bytes::from(body.to_string()),
        );
        let before = self.engine.head(&name).await?.tail;
        self.engine.append(req).await?;
        let commits = {
            let cache = self.cache.lock().expect("positions lock");
            cache.get(name.as_str()).map_or(0, |c| c.1) + 1
        };
        if commits >= TRIM_EVERY {
            let _ = self.engine.trim_at_boundary(&name, before).await;
            self.remember(name.as_str(), offset, 0);
        } else {
            self.remember(name.as_str(), offset, commits);
        }
        Ok(())
    }

    pub async fn delete(&self, consumer: &str, stream: &str) -> Result<(), ApiError> {
        let name = self.companion(consumer, stream)?;
        self.cache
            .lock()
            .expect("positions lock")
            .remove(name.as_str());
        match self.engine.delete(&name).await {
            Ok(()) | Err(EngineError::NotFound | EngineError::Gone) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Every request on one position.
pub async fn handle(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let principal = parts.extensions.remove::<Principal>();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/__picomq/positions/")
        .unwrap_or("")
        .to_string();
    let (consumer, path) = rest
        .split_once('/')
        .ok_or_else(|| ApiError::bad_request("use /__picomq/positions/{consumer}/{stream}"))?;
    check_consumer(consumer)?;
    let mut stream = crate::ds::stream_name(
        &format!("/{path}"),
        app.engine.config().stream_name_bytes_max,
    )?;
    // A position is the consumer's own place in a stream it may read: every
    // operation on it takes read on the stream.
    if let Some(auth) = &app.auth {
        stream = auth.authorize_stream(principal.as_ref(), Op::Read, stream)?;
    }
    let body = crate::ds::read_body(body, 64 << 10, app.body_read_timeout).await?;
    if let Some(r) = crate::cluster::answered_elsewhere(&app, &stream, &parts, &body).await? {
        return Ok(r);
    }
    let positions = &app.positions;
    match parts.method {
        Method::GET => match positions.get(consumer, &stream).await? {
            Some(o) => Ok(json_response(
                StatusCode::OK,
                json!({ "consumer": consumer, "stream": stream, "offset": o.to_string() }),
            )),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "no_position",
                format!("consumer {consumer:?} has no position on this stream"),
            )),
        },
        Method::PUT | Method::POST => {
            let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("body must be {{\"offset\": \"...\"}}: {e}"))
            })?;
            let raw = v["offset"]
                .as_str()
                .ok_or_else(|| ApiError::bad_request("body must be {\"offset\": \"...\"}"))?;
            let offset = Offset::parse(raw).map_err(|e| ApiError::bad_request(e.to_string()))?;
            positions.commit(consumer, &stream, offset).await?;
            Ok(json_response(
                StatusCode::OK,
                json!({ "consumer": consumer, "stream": stream, "offset": offset.to_string() }),
            ))
        }
        Method::DELETE => {
            positions.delete(consumer, &stream).await?;
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("static response"))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET, PUT or DELETE on a position",
        )),
    }
}
