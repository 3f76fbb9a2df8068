//! PUT (create, fork), POST (append, close) and DELETE.

use axum::body::Body;
use axum::http::{header, HeaderMap, Response, StatusCode};
use picomq_engine::{
    AppendOutcome, AppendRequest, ContentType, CreateRequest, ForkRequest, Invalid, Offset,
    Producer, ProducerId, StreamName,
};

use super::{offset_value, read_body, value, Caller, HttpResult};
use crate::app::AppState;
use crate::auth::quota::Admitted;
use crate::auth::{Access, Op};
use crate::error::ApiError;
use crate::headers::{self, *};

/// The request's Content-Type as the client sent it (trimmed), if any.
fn content_type(app: &AppState, headers: &HeaderMap) -> Result<Option<ContentType>, ApiError> {
    let max = app.engine.config().content_type_bytes_max;
    match headers::text(headers, &header::CONTENT_TYPE)? {
        None => Ok(None),
        Some(raw) => Ok(ContentType::new(raw, max)?),
    }
}

pub async fn create(
    app: &AppState,
    caller: &Caller<'_>,
    name: StreamName,
    headers: &HeaderMap,
    body: Body,
) -> HttpResult {
    let lifetime = lifetime(headers)?;
    let fork = fork(app, caller, headers)?;
    let schema = schema_binding(headers)?;
    let body = read_body(
        body,
        app.engine.config().append_bytes_max,
        app.body_read_timeout,
    )
    .await?;
    // Held until the create finished, so concurrent creates count it.
    let _admitted = check_namespace_quota(app, caller, &name).await?;
    // A value that is not shaped like a media type is treated as absent.
    let content_type = content_type(app, headers)?.filter(ContentType::is_media_type);
    let fork_source = fork.as_ref().map(|f| f.source.clone());
    if let Some((subject, version)) = &schema {
        // The subject must exist, and a first message must pass it, before the
        // stream does.
        let registry = &app.registry;
        let v = version.map_or(
            picomq_registry::VersionRef::Latest,
            picomq_registry::VersionRef::Number,
        );
        let target = registry
            .version(subject, v, false)
            .await
            .map_err(registry_error)?;
        let json = content_type.as_ref().is_some_and(ContentType::is_json);
        if json && target.schema.kind != "JSON" {
            return Err(registry_error(picomq_registry::RegistryError::new(
                picomq_registry::error::INVALID_SCHEMA,
                format!(
                    "a JSON stream's messages are checked against a JSON Schema; subject {subject:?} holds {}",
                    target.schema.kind
                ),
            )));
        }
        if !body.is_empty() {
            let records = first_records(&body, json)?;
            registry.check_against(subject, *version, json, &records)?;
        }
    }
    let request = CreateRequest {
        name: name.clone(),
        content_type,
        ttl_secs: lifetime.ttl_secs,
        expires_at: lifetime.expires_at,
        retention_secs: lifetime.retention_secs,
        closed: headers::flag_true(headers, &STREAM_CLOSED),
        fork,
        body,
    };
    let (created, info) = app.engine.create(request).await?;
    if created {
        app.written(&info.name);
    }
    // The binding, decided under the registry's lock (a stream bound to another
    // subject is a conflict). A fork created without one takes its source's: its
    // writers are held to the same contract.
    let inherited = match (&schema, &fork_source) {
        (None, Some(source)) if created => match app.engine.stream(source).await {
            Ok(s) => app
                .registry
                .binding(source.as_str(), s.info().id)
                .map(|b| (b.subject, b.version)),
            Err(_) => None,
        },
        _ => None,
    };
    if let Some((subject, version)) = schema.or(inherited) {
        let json = picomq_engine::domain::is_json(&info.content_type);
        let (registry, name, id) = (app.registry.clone(), info.name.clone(), info.id);
        crate::schemas::detached(async move {
            registry
                .bind_on_create(&name, id, json, &subject, version)
                .await
        })
        .await
        .map_err(registry_error)?;
    }
    let mut resp = Response::builder()
        .status(if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        })
        .header(header::CONTENT_TYPE, value(&info.content_type))
        .header(STREAM_NEXT_OFFSET, offset_value(info.tail));
    if created {
        let host = headers::text(headers, &header::HOST)?.unwrap_or("localhost");
        let shown = caller.display_name(&name);
        resp = resp.header(header::LOCATION, value(format!("http://{host}/{shown}")));
    }
    if info.closed {
        resp = resp.header(STREAM_CLOSED, "true");
    }
    Ok(resp.body(Body::empty()).expect("valid response"))
}

/// `Stream-TTL`, `Stream-Expires-At` and `Stream-Retention` of a create.
struct Lifetime {
    ttl_secs: Option<u64>,
    expires_at: Option<String>,
    retention_secs: Option<u64>,
}

fn lifetime(headers: &HeaderMap) -> Result<Lifetime, ApiError> {
    let ttl = headers::text(headers, &STREAM_TTL)?;
    let expires_at = headers::text(headers, &STREAM_EXPIRES_AT)?;
    if ttl.is_some() && expires_at.is_some() {
        return Err(Invalid::TtlWithExpiry.into());
    }
    let ttl_secs = ttl
        .map(|t| headers::strict_uint(t, "Stream-TTL", u32::MAX as u64))
        .transpose()?;
    if expires_at.is_some_and(|at| picomq_engine::units::parse_rfc3339_ms(at).is_none()) {
        return Err(Invalid::ExpiryNotRfc3339.into());
    }
    let retention_secs = headers::text(headers, &STREAM_RETENTION)?
        .map(|r| {
            let secs = headers::strict_uint(
                r.trim(),
                "Stream-Retention",
                picomq_engine::config::RETENTION_SECS_MAX,
            )?;
            if secs == 0 {
                return Err(ApiError::bad_request(
                    "Stream-Retention must be a positive number of seconds",
                ));
            }
            Ok(secs)
        })
        .transpose()?;
    Ok(Lifetime {
        ttl_secs,
        expires_at: expires_at.map(str::to_string),
        retention_secs,
    })
}

/// `Stream-Forked-From` (with `Stream-Fork-Offset` and `Stream-Fork-Sub-Offset`): a
/// fork reads its source, so the caller needs read on it too.
fn fork(
    app: &AppState,
    caller: &Caller<'_>,
    headers: &HeaderMap,
) -> Result<Option<ForkRequest>, ApiError> {
    let forked_from = headers::text(headers, &STREAM_FORKED_FROM)?;
    let fork_offset = headers::text(headers, &STREAM_FORK_OFFSET)?;
    let sub_offset = headers::text(headers, &STREAM_FORK_SUB_OFFSET)?;
    let Some(source) = forked_from else {
        if fork_offset.is_some() || sub_offset.is_some() {
            return Err(ApiError::bad_request(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let max = app.engine.config().stream_name_bytes_max;
    let source = crate::request::stream_name(source.trim(), max)?;
    let principal = match caller {
        Caller::Authorized { principal } => Some(*principal),
        Caller::Open => None,
    };
    let source = Access::new(app.auth.as_ref(), principal).stream(Op::Read, source)?;
    let offset = fork_offset
        .map(|o| {
            Offset::parse(o).map_err(|e| ApiError::bad_request(format!("Stream-Fork-Offset: {e}")))
        })
        .transpose()?;
    let sub_offset = sub_offset
        .map(|s| headers::strict_uint(s, "Stream-Fork-Sub-Offset", u32::MAX as u64))
        .transpose()?
        .unwrap_or(0);
    Ok(Some(ForkRequest {
        source: StreamName::new(source, max)?,
        offset,
        sub_offset,
    }))
}

/// `--max-streams-per-namespace`: a namespaced token creates no more streams than
/// this under its namespace (re-creating an existing one is always fine). The admitted
/// create counts as pending until the returned guard drops (see auth/quota.rs).
async fn check_namespace_quota(
    app: &AppState,
    caller: &Caller<'_>,
    name: &StreamName,
) -> Result<Option<Admitted>, ApiError> {
    let (
        Some(auth),
        Caller::Authorized {
            principal: crate::auth::Principal::Token(t),
            ..
        },
    ) = (&app.auth, caller)
    else {
        return Ok(None);
    };
    let Some(max) = auth.config.streams_per_namespace_max else {
        return Ok(None);
    };
    if t.namespace.is_empty() {
        return Ok(None);
    }
    let count = app.engine.count_with_prefix(&t.namespace, max);
    if let Some(admitted) = auth.quota.admit(&t.namespace, max, count).await? {
        return Ok(Some(admitted));
    }
    match app.engine.head(name).await {
        Ok(_) => Ok(None),
        Err(picomq_engine::EngineError::NotFound | picomq_engine::EngineError::Gone) => {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "namespace_quota_exceeded",
                format!("this token's namespace already holds its maximum of {max} streams (--max-streams-per-namespace); delete some first"),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn producer(app: &AppState, headers: &HeaderMap) -> Result<Option<Producer>, ApiError> {
    let id = headers::text(headers, &PRODUCER_ID)?;
    let epoch = headers::text(headers, &PRODUCER_EPOCH)?;
    let seq = headers::text(headers, &PRODUCER_SEQ)?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            let max = app.engine.config().producer_id_bytes_max;
            Ok(Some(Producer {
                id: ProducerId::new(id, max)?,
                epoch: headers::producer_uint(epoch, "Producer-Epoch")?,
                first_seq: None,
                seq: headers::producer_uint(seq, "Producer-Seq")?,
            }))
        }
        _ => Err(ApiError::bad_request(
            "Producer-Id, Producer-Epoch and Producer-Seq must be sent together",
        )),
    }
}

pub async fn append(
    app: &AppState,
    name: StreamName,
    headers: &HeaderMap,
    body: Body,
) -> HttpResult {
    let producer = producer(app, headers)?;
    let close = headers::flag_true(headers, &STREAM_CLOSED);
    let stream_seq = headers::text(headers, &STREAM_SEQ)?.map(str::to_string);
    let content_type = content_type(app, headers)?;
    let body = read_body(
        body,
        app.engine.config().append_bytes_max,
        app.body_read_timeout,
    )
    .await?;
    if !body.is_empty() && content_type.is_none() {
        return Err(ApiError::bad_request(
            "Content-Type is required on an append with a body",
        ));
    }
    let has_body = !body.is_empty();
    let has_producer = producer.is_some();
    // Only while subscriptions exist does an append pay for telling them.
    let watched = app.watching_writes().then(|| name.clone());
    let outcome = app
        .engine
        .append(AppendRequest {
            name,
            content_type,
            body,
            close,
            stream_seq,
            producer,
            records: None,
            match_seq: None,
            schema_topic: None,
            schema_checked: false,
        })
        .await?;
    if let Some(name) = watched {
        app.written(&name);
    }
    let resp = match outcome {
        AppendOutcome::Appended {
            tail,
            closed,
            producer,
            ..
        } => {
            let status = if has_producer && has_body {
                StatusCode::OK
            } else {
                StatusCode::NO_CONTENT
            };
            let mut r = Response::builder()
                .status(status)
                .header(STREAM_NEXT_OFFSET, offset_value(tail));
            if closed {
                r = r.header(STREAM_CLOSED, "true");
            }
            if let Some((epoch, seq)) = producer {
                r = r.header(PRODUCER_EPOCH, epoch).header(PRODUCER_SEQ, seq);
            }
            r
        }
        AppendOutcome::Duplicate {
            tail,
            closed,
            epoch,
            last_seq,
        } => {
            let mut r = Response::builder()
                .status(StatusCode::NO_CONTENT)
                .header(STREAM_NEXT_OFFSET, offset_value(tail))
                .header(PRODUCER_EPOCH, epoch)
                .header(PRODUCER_SEQ, last_seq);
            if closed {
                r = r.header(STREAM_CLOSED, "true");
            }
            r
        }
    };
    Ok(resp.body(Body::empty()).expect("valid response"))
}

pub async fn delete(app: &AppState, name: StreamName) -> HttpResult {
    app.engine.delete(&name).await?;
    // Its binding goes with it (one left behind would never apply again: it names
    // the deleted stream's id, but it would count against the registry's limit).
    if app.registry.snapshot().bindings.contains_key(name.as_str()) {
        let (registry, name) = (app.registry.clone(), name.to_string());
        let unbound =
            crate::schemas::detached(
                async move { registry.bind(&name, 0, false, None, None).await },
            )
            .await;
        if let Err(e) = unbound {
            tracing::warn!(error = %e, "a deleted stream's schema binding stays");
        }
    }
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Body::empty())
        .expect("valid response"))
}

/// `Stream-Schema-Subject` (and `Stream-Schema-Version`) of a create.
fn schema_binding(headers: &HeaderMap) -> Result<Option<(String, Option<u32>)>, ApiError> {
    let subject = headers::text(headers, &STREAM_SCHEMA_SUBJECT)?;
    let version = headers::text(headers, &STREAM_SCHEMA_VERSION)?;
    let Some(subject) = subject else {
        if version.is_some() {
            return Err(ApiError::bad_request(
                "Stream-Schema-Version needs Stream-Schema-Subject",
            ));
        }
        return Ok(None);
    };
    picomq_registry::registry::check_subject(subject)
        .map_err(|e| ApiError::bad_request(format!("Stream-Schema-Subject: {}", e.message)))?;
    let version = version
        .map(|v| headers::strict_uint(v, "Stream-Schema-Version", i32::MAX as u64))
        .transpose()?
        .map(|v| v as u32)
        .filter(|v| *v > 0);
    Ok(Some((subject.to_string(), version)))
}

/// A create's body as the records it will hold: a JSON array's elements (one
/// level), any other JSON value, or the bytes as one record.
fn first_records(
    body: &bytes::Bytes,
    json: bool,
) -> Result<Vec<picomq_engine::NewRecord>, ApiError> {
    if !json {
        return Ok(vec![picomq_engine::NewRecord::plain(body.clone())]);
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    let values = match value {
        serde_json::Value::Array(items) => items,
        other => vec![other],
    };
    Ok(values
        .into_iter()
        .map(|v| picomq_engine::NewRecord::plain(bytes::Bytes::from(v.to_string())))
        .collect())
}

/// A registry refusal as the edge words errors: its status, its code as a field.
pub(crate) fn registry_error(e: picomq_registry::RegistryError) -> ApiError {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = match e.code {
        picomq_registry::error::BINDING_CONFLICT => "schema_binding_conflict",
        _ => "schema_registry",
    };
    ApiError::new(status, code, e.message).with_json_field("error_code", serde_json::json!(e.code))
}
