//! Per-stream endpoints under the reserved `__picomq` namespace:
//!
//! - `POST /__picomq/streams/{name}/trim?before=OFFSET`: drop the stream's data below
//!   `OFFSET` (a `Stream-Next-Offset` token); answers `{"stream", "start"}`.
//!   `?before_seq=N` trims below record `N` (the native record API's numbers) and
//!   answers `first_seq` too.
//! - `POST /__picomq/streams/{name}/retention?seconds=N|none`: set or clear the
//!   stream's age retention; answers `{"stream", "retentionSeconds", "start"}`.
//!
//! - `.../records` and `.../info`: the native record API (`records.rs`).
//!
//! `{name}` is the stream's path and may contain `/`: the last segment names the
//! action. Trim and retention drop data, so with auth on they need the `delete` scope
//! on the stream. The stream service does the work (`Engine::trim`,
//! `Engine::set_retention`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Method, Request, Response, StatusCode};
use picomq_engine::config::RETENTION_SECS_MAX;
use picomq_engine::Offset;
use serde_json::json;

use crate::app::AppState;
use crate::auth::{Access, Op, Principal};
use crate::error::ApiError;
use crate::headers;
use crate::records;
use crate::request::{percent_decode, stream_name};

/// Route of both endpoints: everything after it is `{name}/{action}`.
pub const PATH: &str = "/__picomq/streams/{*rest}";
const PREFIX: &str = "/__picomq/streams/";

#[derive(Debug, PartialEq, Eq)]
enum Action {
    Trim { before: Offset },
    TrimSeq { before: u64 },
    Retention { secs: Option<u64> },
}

const ACTIONS: [&str; 5] = ["trim", "retention", "records", "info", "schema"];

/// The stream name (as addressed, percent-escapes kept) and the action of a path.
fn target(path: &str, max_name_bytes: usize) -> Result<(String, &str), ApiError> {
    let rest = path.strip_prefix(PREFIX).unwrap_or(path);
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint: use /__picomq/streams/{name}/ and trim, retention, records, info or schema",
        )
    };
    let (name, action) = rest.rsplit_once('/').ok_or_else(not_found)?;
    if !ACTIONS.contains(&action) {
        return Err(not_found());
    }
    Ok((stream_name(&format!("/{name}"), max_name_bytes)?, action))
}

/// The query of `action`: exactly its one parameter.
fn action(action: &str, raw: Option<&str>) -> Result<Action, ApiError> {
    let wanted = if action == "trim" {
        "before"
    } else {
        "seconds"
    };
    let mut value = None;
    for pair in raw.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (key, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)
            .ok_or_else(|| ApiError::bad_request(format!("query parameter {key} is malformed")))?;
        if action == "trim" && key == "before_seq" {
            if value.is_some() {
                return Err(ApiError::bad_request("give before or before_seq, once"));
            }
            let before = headers::strict_uint(&v, "before_seq", u64::MAX >> 1)?;
            return Ok(Action::TrimSeq { before });
        }
        if key != wanted {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?}; {action} takes only {wanted}"
            )));
        }
        value = Some(v);
    }
    let value = value
        .ok_or_else(|| ApiError::bad_request(format!("{action} needs the {wanted} parameter")))?;
    if action == "trim" {
        let before =
            Offset::parse(&value).map_err(|e| ApiError::bad_request(format!("before: {e}")))?;
        return Ok(Action::Trim { before });
    }
    if value == "none" {
        return Ok(Action::Retention { secs: None });
    }
    let secs = headers::strict_uint(&value, "seconds", RETENTION_SECS_MAX)?;
    if secs == 0 {
        return Err(ApiError::bad_request(
            "seconds must be positive (or none to keep everything)",
        ));
    }
    Ok(Action::Retention { secs: Some(secs) })
}

pub async fn handle(
    State(app): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let principal = parts.extensions.remove::<Principal>();
    let (mut name, verb) = target(parts.uri.path(), app.engine.config().stream_name_bytes_max)?;
    let native = verb == "records" || verb == "info";
    let allowed = if native {
        records::allowed(verb, &parts.method)
    } else if verb == "schema" {
        parts.method == Method::POST || parts.method == Method::GET
    } else {
        parts.method == Method::POST
    };
    if !allowed {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on .../{verb}", parts.method),
        ));
    }
    let shown = name.clone();
    let op = match (verb, &parts.method) {
        ("records", &Method::POST) => Op::Append,
        ("records" | "info" | "schema", &Method::GET) | ("info", _) => Op::Read,
        // Binding a stream sets what may be written to it: the stream's owner's call.
        ("schema", _) => Op::Create,
        _ => Op::Delete,
    };
    let access = Access::new(app.auth.as_ref(), principal.as_ref());
    name = access.stream(op, name)?;

    let query = parts.uri.query().map(str::to_string);
    let action = if native || verb == "schema" {
        None
    } else {
        Some(action(verb, query.as_deref())?)
    };
    let body = if verb == "records" && parts.method == Method::POST {
        records::read_append_body(&app, body).await?
    } else if verb == "schema" && parts.method == Method::POST {
        crate::request::read_body(body, 64 * 1024, app.body_read_timeout).await?
    } else {
        bytes::Bytes::new()
    };
    if let Some(r) = crate::cluster::answered_elsewhere(&app, &name, &parts, &body).await? {
        return Ok(r);
    }
    let name = picomq_engine::StreamName::new(name, app.engine.config().stream_name_bytes_max)?;
    if verb == "schema" {
        return schema(&app, name, &shown, &parts.method, body).await;
    }
    let Some(action) = action else {
        return match verb {
            "info" => records::info(&app, name, &shown, access).await,
            _ if parts.method == Method::POST => {
                records::append(&app, name, &shown, &parts.headers, body).await
            }
            _ => {
                let read = records::read(&app, name.clone(), query.as_deref(), principal)
                    .await
                    .map_err(|e| crate::tables::name_holder(&app, name.as_str(), e));
                crate::ds::with_schema(&app, &name, read).await
            }
        };
    };
    let body = match action {
        Action::Trim { before } => {
            let start = app.engine.trim(&name, before).await?;
            json!({ "stream": shown, "start": start.to_string() })
        }
        Action::TrimSeq { before } => {
            let stream = app.engine.stream(&name).await?;
            let tail = stream.handle.view().tail_seq;
            if before > tail {
                return Err(ApiError::bad_request(format!(
                    "before_seq {before} is past the stream's next sequence number, {tail}"
                )));
            }
            let at = app
                .engine
                .seek(&stream, picomq_engine::Seek::Seq(before))
                .await?;
            let start = app.engine.trim(&name, at.offset).await?;
            let first = app
                .engine
                .first_record(&app.engine.stream(&name).await?)
                .await?;
            json!({ "stream": shown, "start": start.to_string(), "first_seq": first.seq })
        }
        Action::Retention { secs } => {
            app.engine.set_retention(&name, secs).await?;
            let info = app.engine.head(&name).await?;
            json!({
                "stream": shown,
                "retentionSeconds": info.retention_secs,
                "start": info.start.to_string(),
            })
        }
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("valid response"))
}

/// `GET|POST /__picomq/streams/{name}/schema`: the stream's binding, or a new one
/// (`{"subject": S, "version": N}`; `{"subject": null}` unbinds). Every node
/// shares the registry, so any member answers.
async fn schema(
    app: &AppState,
    name: picomq_engine::StreamName,
    shown: &str,
    method: &Method,
    raw: bytes::Bytes,
) -> Result<Response<Body>, ApiError> {
    use crate::ds::write::registry_error;
    let stream = app.engine.stream(&name).await?;
    let info = stream.info();
    if method == Method::POST {
        let req: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
        let obj = req.as_object().ok_or_else(|| {
            ApiError::bad_request(
                "send {\"subject\": NAME, \"version\": N} (version optional; subject null unbinds)",
            )
        })?;
        if let Some(k) = obj.keys().find(|k| *k != "subject" && *k != "version") {
            return Err(ApiError::bad_request(format!(
                "unknown field {k:?}: a binding has subject and version"
            )));
        }
        let subject = match obj.get("subject") {
            Some(serde_json::Value::String(s)) => Some(s.as_str()),
            Some(serde_json::Value::Null) => None,
            _ => {
                return Err(ApiError::bad_request(
                    "subject must be a string (or null to unbind)",
                ))
            }
        };
        let version = match obj.get("version") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|v| (1..=i32::MAX as u64).contains(v))
                    .ok_or_else(|| ApiError::bad_request("version must be a whole number from 1"))?
                    as u32,
            ),
        };
        if subject.is_none() && version.is_some() {
            return Err(ApiError::bad_request("a version needs a subject"));
        }
        let (registry, name, id) = (app.registry.clone(), info.name.clone(), info.id);
        let (json, subject) = (stream.handle.config.json, subject.map(str::to_string));
        crate::schemas::detached(async move {
            registry
                .bind(&name, id, json, subject.as_deref(), version)
                .await
        })
        .await
        .map_err(registry_error)?;
    }
    let bound = crate::ds::schema_of(app, &name).await;
    let body = match bound {
        Some((subject, version)) => {
            json!({ "stream": shown, "subject": subject, "version": version })
        }
        None => json!({ "stream": shown, "subject": null, "version": null }),
    };
    Ok(crate::app::json_response(StatusCode::OK, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_a_stream_and_an_action() {
        let t = |p: &str| target(p, 1024).map(|(n, a)| (n, a.to_string()));
        assert_eq!(
            t("/__picomq/streams/a/b/trim").unwrap(),
            ("a/b".into(), "trim".into())
        );
        assert_eq!(
            t("/__picomq/streams/x/trim/retention").unwrap(),
            ("x/trim".into(), "retention".into())
        );
        for bad in [
            "/__picomq/streams/trim",
            "/__picomq/streams/a/cut",
            "/__picomq/streams/records",
            "/__picomq/streams/a/../trim",
            "/__picomq/streams//trim",
        ] {
            assert!(t(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queries_are_validated() {
        let off = Offset(7).to_string();
        assert_eq!(
            action("trim", Some(&format!("before={off}"))).unwrap(),
            Action::Trim { before: Offset(7) }
        );
        assert_eq!(
            action("trim", Some("before_seq=12")).unwrap(),
            Action::TrimSeq { before: 12 }
        );
        assert_eq!(
            action("retention", Some("seconds=60")).unwrap(),
            Action::Retention { secs: Some(60) }
        );
        assert_eq!(
            action("retention", Some("seconds=none")).unwrap(),
            Action::Retention { secs: None }
        );
        for (verb, bad) in [
            ("trim", None),
            ("trim", Some("before=12")),
            ("trim", Some("before=-1")),
            ("trim", Some(&*format!("before={off}&x=1"))),
            ("trim", Some(&*format!("before={off}&before_seq=1"))),
            ("trim", Some("before_seq=-1")),
            ("retention", Some("seconds=0")),
            ("retention", Some("seconds=-5")),
            ("retention", Some("seconds=1e3")),
            ("retention", Some("seconds=99999999999")),
        ] {
            assert!(action(verb, bad).is_err(), "{verb} {bad:?}");
        }
    }
}
