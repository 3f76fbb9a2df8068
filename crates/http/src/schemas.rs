//! The schema registry's HTTP surface under `/__picomq/schemas/`: the Confluent
//! Schema Registry REST API (docs/schemas.md), so its clients and serializers work
//! with `url=http://HOST:4437/__picomq/schemas` and nothing else changed.
//!
//! Answers are `application/vnd.schemaregistry.v1+json`; errors are the
//! registry's own body, `{"error_code": N, "message": "..."}`, with the HTTP
//! status of the code's first three digits, because that is what clients parse.
//! Reading needs a token that may read something (or register schemas);
//! registering, deleting and configuring need the `schemas` scope on the subject
//! (the global settings: on every name) or `admin`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Method, Request, Response, StatusCode};
use picomq_registry::error::{
    BAD_REQUEST, INVALID_COMPATIBILITY, INVALID_MODE, INVALID_SCHEMA, SCHEMA_NOT_FOUND,
};
use picomq_registry::{NewSchema, Reference, RegistryError, VersionRef, VersionView};
use picomq_schemas::compat::Level;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::auth::{Op, Principal};
use crate::error::ApiError;
use crate::request::percent_decode;

pub const PATH: &str = "/__picomq/schemas";
pub const ITEM_PATH: &str = "/__picomq/schemas/{*rest}";
const PREFIX: &str = "/__picomq/schemas";

/// Request bodies: a schema at its limit, JSON-escaped, and the rest.
const BODY_BYTES_MAX: usize = 2 * picomq_registry::registry::SCHEMA_BYTES_MAX + 64 * 1024;
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

fn answer(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, CONTENT_TYPE)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("valid response")
}

fn refusal(e: RegistryError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer(
        status,
        &json!({ "error_code": e.code, "message": e.message }),
    )
}

/// The edge's own errors (authentication, a body too large) in the registry's form.
fn from_api(e: ApiError) -> RegistryError {
    RegistryError::new(u32::from(e.status.as_u16()) * 100 + 1, e.message)
}

fn bad(message: impl Into<String>) -> RegistryError {
    RegistryError::new(BAD_REQUEST, message)
}

fn not_found(path: &str) -> RegistryError {
    RegistryError::new(40400, format!("no such registry endpoint: {path}"))
}

/// The query's parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Result<Query, RegistryError> {
        let mut out = Vec::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k).ok_or_else(|| bad("a malformed query parameter"))?;
            let v = percent_decode(&v.replace('+', " "))
                .ok_or_else(|| bad(format!("query parameter {k} is malformed")))?;
            if out.len() >= 32 {
                return Err(bad("too many query parameters"));
            }
            out.push((k, v));
        }
        Ok(Query(out))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True only for a case-insensitive `true` (clients send `False`, `false`).
    fn flag(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// Who may do what here.
struct Caller<'a> {
    app: &'a AppState,
    principal: Option<Principal>,
}

impl Caller<'_> {
    fn token(&self) -> Result<Option<Arc<crate::auth::Token>>, RegistryError> {
        crate::auth::token_of(
            self.app.auth.is_some(),
            self.principal.as_ref(),
            "the schema registry",
        )
        .map_err(from_api)
    }

    /// Reading: a token that may read something (or register schemas).
    fn read(&self) -> Result<(), RegistryError> {
        match self.token()? {
            None => Ok(()),
            Some(t) if t.has_op(Op::Read) || t.has_op(Op::Schemas) => Ok(()),
            Some(_) => Err(from_api(crate::auth::forbidden(
                "reading schemas needs a token with the read or schemas scope",
            ))),
        }
    }

    /// Changing `subject` (`None`: the global settings): `schemas` on a pattern
    /// matching it (on every name for the global settings), or `admin` on every
    /// name. The registry is the node's: a namespace's admin is not its admin.
    fn write(&self, subject: Option<&str>) -> Result<(), RegistryError> {
        match self.token()? {
            None => Ok(()),
            Some(t)
                if t.has_op_everywhere(Op::Admin)
                    || match subject {
                        Some(s) => t.allows(Op::Schemas, s),
                        None => t.has_op_everywhere(Op::Schemas),
                    } =>
            {
                Ok(())
            }
            Some(_) => Err(from_api(crate::auth::forbidden(match subject {
                Some(s) => format!("changing subject {s:?} needs the schemas scope on it, or admin"),
                None => "changing the registry's global settings needs the schemas scope on every name (schemas:**), or admin".into(),
            }))),
        }
    }
}

pub async fn handle(State(app): State<Arc<AppState>>, request: Request<Body>) -> Response<Body> {
    match serve(&app, request).await {
        Ok(r) => r,
        Err(e) => refusal(e),
    }
}

async fn serve(
    app: &Arc<AppState>,
    request: Request<Body>,
) -> Result<Response<Body>, RegistryError> {
    let (mut parts, body) = request.into_parts();
    let caller = Caller {
        app,
        principal: parts.extensions.remove::<Principal>(),
    };
    let path = parts.uri.path().to_string();
    let rest = path.strip_prefix(PREFIX).unwrap_or("");
    let mut segments = Vec::new();
    for raw in rest.split('/').filter(|s| !s.is_empty()) {
        if segments.len() >= 8 {
            return Err(not_found(&path));
        }
        segments.push(percent_decode(raw).ok_or_else(|| bad("a malformed path segment"))?);
    }
    let query = Query::parse(parts.uri.query())?;
    let method = parts.method.clone();
    let body = if method == Method::POST || method == Method::PUT {
        let bytes = crate::request::read_body(body, BODY_BYTES_MAX, app.body_read_timeout)
            .await
            .map_err(from_api)?;
        if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice::<Value>(&bytes).map_err(|e| {
                RegistryError::new(BAD_REQUEST, format!("the body is not JSON: {e}"))
            })?
        }
    } else {
        Value::Null
    };
    let registry = &app.registry;
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let ok = |v: Value| Ok(answer(StatusCode::OK, &v));
    match (&method, seg.as_slice()) {
        (&Method::GET, []) => {
            caller.read()?;
            ok(json!({}))
        }
        (&Method::GET, ["schemas", "types"]) => {
            caller.read()?;
            ok(json!(["JSON", "PROTOBUF", "AVRO"]))
        }
        (&Method::GET, ["schemas", "ids", id, tail @ ..]) => {
            caller.read()?;
            let id = schema_id(id)?;
            match tail {
                [] => {
                    let row = registry.schema(id).await?;
                    let serialized = query.get("format") == Some("serialized");
                    ok(schema_body(&row, serialized))
                }
                ["schema"] => {
                    let row = registry.schema(id).await?;
                    Ok(Response::builder()
                        .status(StatusCode::OK)
                        .header(header::CONTENT_TYPE, CONTENT_TYPE)
                        .body(Body::from(row.schema.clone()))
                        .expect("valid response"))
                }
                ["subjects"] => {
                    let uses = registry.uses_of(id, query.flag("deleted")).await?;
                    let mut subjects: Vec<String> = uses.into_iter().map(|(s, _)| s).collect();
                    subjects.dedup();
                    ok(json!(subjects))
                }
                ["versions"] => {
                    let uses = registry.uses_of(id, query.flag("deleted")).await?;
                    ok(Value::Array(
                        uses.into_iter()
                            .map(|(s, v)| json!({"subject": s, "version": v}))
                            .collect(),
                    ))
                }
                _ => Err(not_found(&path)),
            }
        }
        (&Method::GET, ["subjects"]) => {
            caller.read()?;
            let deleted_only = query.flag("deletedOnly") || query.flag("deleted_only");
            let all = registry
                .subjects(
                    query.get("subjectPrefix").unwrap_or(""),
                    query.flag("deleted"),
                    deleted_only,
                )
                .await?;
            let offset = count(&query, "offset", 0)?;
            let limit = match query.get("limit") {
                None | Some("-1") => usize::MAX,
                Some(_) => count(&query, "limit", usize::MAX)?,
            };
            ok(json!(all
                .into_iter()
                .skip(offset)
                .take(limit)
                .collect::<Vec<_>>()))
        }
        (&Method::POST, ["subjects", subject]) => {
            caller.read()?;
            let new = new_schema(&body)?;
            let found = registry
                .lookup(subject, &new, query.flag("deleted"))
                .await?;
            ok(version_body(&found, false))
        }
        (&Method::DELETE, ["subjects", subject]) => {
            caller.write(Some(subject))?;
            let (r, subject, permanent) = (
                registry.clone(),
                subject.to_string(),
                query.flag("permanent"),
            );
            let versions =
                detached(async move { r.delete_subject(&subject, permanent).await }).await?;
            ok(json!(versions))
        }
        (&Method::GET, ["subjects", subject, "versions"]) => {
            caller.read()?;
            ok(json!(
                registry.versions(subject, query.flag("deleted")).await?
            ))
        }
        (&Method::POST, ["subjects", subject, "versions"]) => {
            caller.write(Some(subject))?;
            let new = new_schema(&body)?;
            let (r, subject) = (registry.clone(), subject.to_string());
            let registered = detached(async move { r.register(&subject, &new).await }).await?;
            ok(json!({
                "id": registered.id,
                "version": registered.version,
                "schemaType": registered.schema.kind,
                "schema": registered.schema.schema,
                "references": registered.schema.references,
            }))
        }
        (&Method::GET, ["subjects", subject, "versions", v, tail @ ..]) => {
            caller.read()?;
            let v = VersionRef::parse(v)?;
            match tail {
                [] => {
                    let found = registry.version(subject, v, query.flag("deleted")).await?;
                    let serialized = query.get("format") == Some("serialized");
                    ok(version_body(&found, serialized))
                }
                ["schema"] => {
                    let found = registry.version(subject, v, query.flag("deleted")).await?;
                    Ok(Response::builder()
                        .status(StatusCode::OK)
                        .header(header::CONTENT_TYPE, CONTENT_TYPE)
                        .body(Body::from(found.schema.schema.clone()))
                        .expect("valid response"))
                }
                ["referencedby"] => ok(json!(registry.referenced_by(subject, v).await?)),
                _ => Err(not_found(&path)),
            }
        }
        (&Method::DELETE, ["subjects", subject, "versions", v]) => {
            caller.write(Some(subject))?;
            let v = VersionRef::parse(v)?;
            let (r, subject, permanent) = (
                registry.clone(),
                subject.to_string(),
                query.flag("permanent"),
            );
            let version =
                detached(async move { r.delete_version(&subject, v, permanent).await }).await?;
            ok(json!(version))
        }
        (&Method::GET, ["config"]) => {
            caller.read()?;
            let level = registry.config(None, true).await?;
            ok(json!({ "compatibilityLevel": level.as_str() }))
        }
        (&Method::GET, ["config", subject]) => {
            caller.read()?;
            let level = registry
                .config(Some(subject), query.flag("defaultToGlobal"))
                .await?;
            ok(json!({ "compatibilityLevel": level.as_str() }))
        }
        (&Method::PUT, ["config", tail @ ..]) if tail.len() <= 1 => {
            let subject = tail.first().copied();
            caller.write(subject)?;
            let level = level(&body)?;
            let (r, subject) = (registry.clone(), subject.map(str::to_string));
            detached(async move { r.set_config(subject.as_deref(), level).await }).await?;
            ok(json!({ "compatibility": level.as_str() }))
        }
        (&Method::DELETE, ["config", tail @ ..]) if tail.len() <= 1 => {
            let subject = tail.first().copied();
            caller.write(subject)?;
            let (r, subject) = (registry.clone(), subject.map(str::to_string));
            let old = detached(async move { r.delete_config(subject.as_deref()).await }).await?;
            ok(json!({ "compatibilityLevel": old.as_str() }))
        }
        (&Method::POST, ["compatibility", "subjects", subject, "versions", tail @ ..])
            if tail.len() <= 1 =>
        {
            caller.read()?;
            let version = tail.first().map(|v| VersionRef::parse(v)).transpose()?;
            let new = new_schema(&body)?;
            let problems = registry.test_compatibility(subject, version, &new).await?;
            let mut out = json!({ "is_compatible": problems.is_empty() });
            if query.flag("verbose") {
                out["messages"] = json!(problems);
            }
            ok(out)
        }
        (&Method::GET, ["mode", tail @ ..]) if tail.len() <= 1 => {
            caller.read()?;
            ok(json!({ "mode": "READWRITE" }))
        }
        (&Method::PUT, ["mode", tail @ ..]) if tail.len() <= 1 => {
            caller.write(tail.first().copied())?;
            match body.get("mode").and_then(Value::as_str) {
                Some("READWRITE") => ok(json!({ "mode": "READWRITE" })),
                _ => Err(RegistryError::new(
                    INVALID_MODE,
                    "Invalid mode: only READWRITE is served",
                )),
            }
        }
        (_, ["schemas" | "subjects" | "config" | "compatibility" | "mode", ..])
            if !matches!(
                method,
                Method::GET | Method::POST | Method::PUT | Method::DELETE
            ) =>
        {
            Err(RegistryError::new(
                40501,
                format!("{method} is not allowed here"),
            ))
        }
        _ => {
            caller.read()?;
            Err(not_found(&path))
        }
    }
}

/// Runs a registry change in a task of its own: a client that hangs up must not
/// stop it between logging the change and answering from what was stored.
pub(crate) async fn detached<T: Send + 'static>(
    change: impl std::future::Future<Output = Result<T, RegistryError>> + Send + 'static,
) -> Result<T, RegistryError> {
    tokio::spawn(change).await.unwrap_or_else(|e| {
        Err(RegistryError::new(
            picomq_registry::error::STORE_ERROR,
            format!("the registry change stopped: {e}"),
        ))
    })
}

fn schema_id(raw: &str) -> Result<u32, RegistryError> {
    raw.parse::<u32>()
        .ok()
        .filter(|id| *id >= 1 && *id <= i32::MAX as u32)
        .ok_or_else(|| RegistryError::new(SCHEMA_NOT_FOUND, format!("Schema {raw} not found")))
}

fn count(query: &Query, name: &str, default: usize) -> Result<usize, RegistryError> {
    match query.get(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<u32>()
            .map(|n| n as usize)
            .map_err(|_| bad(format!("{name} must be a whole number"))),
    }
}

fn level(body: &Value) -> Result<Level, RegistryError> {
    let raw = body
        .get("compatibility")
        .or_else(|| body.get("compatibilityLevel"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            RegistryError::new(
                INVALID_COMPATIBILITY,
                "Invalid compatibility level: send {\"compatibility\": LEVEL}",
            )
        })?;
    raw.parse::<Level>().map_err(|_| {
        RegistryError::new(
            INVALID_COMPATIBILITY,
            format!("Invalid compatibility level {raw:?}. Valid values are NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE"),
        )
    })
}

/// A schema request's body: `{schema, schemaType?, references?, metadata?, ruleSet?}`.
fn new_schema(body: &Value) -> Result<NewSchema, RegistryError> {
    let invalid = |m: &str| RegistryError::new(INVALID_SCHEMA, m.to_string());
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("the body must be a JSON object with a schema"))?;
    let schema = obj
        .get("schema")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("Empty schema: the body needs \"schema\", a string"))?
        .to_string();
    if schema.trim().is_empty() {
        return Err(invalid("Empty schema"));
    }
    let schema_type = match obj.get("schemaType") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid("schemaType must be a string")),
    };
    let references = match obj.get("references") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(refs)) => refs
            .iter()
            .map(|r| {
                let name = r.get("name").and_then(Value::as_str);
                let subject = r.get("subject").and_then(Value::as_str);
                let version = r.get("version").and_then(Value::as_u64);
                match (name, subject, version) {
                    (Some(n), Some(s), Some(v)) if v >= 1 && v <= i32::MAX as u64 => {
                        Ok(Reference {
                            name: n.to_string(),
                            subject: s.to_string(),
                            version: v as u32,
                        })
                    }
                    _ => Err(invalid(
                        "each reference needs a name, a subject and a version (1 or more)",
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(invalid("references must be an array")),
    };
    let object_or_null = |key: &str| -> Result<Option<Value>, RegistryError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
            Some(_) => Err(invalid(&format!("{key} must be an object"))),
        }
    };
    Ok(NewSchema {
        schema,
        schema_type,
        references,
        metadata: object_or_null("metadata")?,
        rule_set: object_or_null("ruleSet")?,
    })
}

fn schema_fields(row: &picomq_registry::SchemaRow, serialized: bool, out: &mut Value) {
    let text = if serialized && row.kind == "PROTOBUF" {
        row.canonical.clone()
    } else {
        row.schema.clone()
    };
    out["schema"] = json!(text);
    if row.kind != "AVRO" {
        out["schemaType"] = json!(row.kind);
    }
    out["references"] = json!(row.references);
    if let Some(m) = &row.metadata {
        out["metadata"] = m.clone();
    }
    if let Some(r) = &row.rule_set {
        out["ruleSet"] = r.clone();
    }
}

fn schema_body(row: &picomq_registry::SchemaRow, serialized: bool) -> Value {
    let mut out = json!({});
    schema_fields(row, serialized, &mut out);
    out
}

fn version_body(v: &VersionView, serialized: bool) -> Value {
    let mut out = json!({
        "subject": v.subject,
        "version": v.version,
        "id": v.id,
    });
    schema_fields(&v.schema, serialized, &mut out);
    if v.deleted {
        out["deleted"] = json!(true);
    }
    out
}
