//! Iceberg tables fed by streams: their definitions under `/__picomq/tables`, and
//! a read-only Iceberg REST catalog under `/__picomq/iceberg` through which
//! pyiceberg, DuckDB, Spark and Trino find them (docs/tables.md).
//!
//! Access: defining or dropping a table needs `tables` and `read` on every stream
//! its sources can match (a table exports what it is fed), or `admin` on every
//! name. Seeing a table (its definition, and its data through the catalog) needs
//! `read` on all its sources, or admin.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, Response, StatusCode};
use picomq_engine::EngineError;
use picomq_tables::catalog::{self, Definition, Entry, Source, TableId};
use picomq_tables::exporter::Exporter;
use serde_json::{json, Value};

use crate::app::{json_response, AppState};
use crate::auth::{Op, Pattern, Principal};
use crate::error::ApiError;
use crate::request::percent_decode;

pub const PATH: &str = "/__picomq/tables";
pub const ITEM_PATH: &str = "/__picomq/tables/{*rest}";
pub const ICEBERG_PATH: &str = "/__picomq/iceberg/{*rest}";
const ICEBERG_PREFIX: &str = "/__picomq/iceberg";
const BODY_BYTES_MAX: usize = 64 * 1024;
/// Streams whose lag a table's `GET` reports (the rest are counted).
const LAG_STREAMS_MAX: usize = 100;
/// Positions a table's `GET` reads at once.
const LAG_READS_AT_ONCE: usize = 16;

/// The caller, for the access rules above.
struct Caller<'a> {
    app: &'a AppState,
    principal: Option<Principal>,
}

impl Caller<'_> {
    fn token(&self) -> Result<Option<Arc<crate::auth::Token>>, ApiError> {
        crate::auth::token_of(self.app.auth.is_some(), self.principal.as_ref(), "tables")
    }

    fn patterns(definition: &Definition) -> Vec<Pattern> {
        definition
            .sources()
            .into_iter()
            .map(|s| match s {
                Source::Exact(n) => Pattern::Exact(n),
                Source::Prefix(p) => Pattern::Prefix(p),
            })
            .collect()
    }

    /// May define or drop a table fed by `definition`'s sources.
    fn may_define(&self, definition: &Definition) -> Result<(), ApiError> {
        let Some(t) = self.token()? else {
            return Ok(());
        };
        if t.has_op_everywhere(Op::Admin) {
            return Ok(());
        }
        let patterns = Self::patterns(definition);
        for (p, text) in patterns.iter().zip(definition.source.patterns()) {
            if !(t.covers(Op::Tables, p) && t.covers(Op::Read, p)) {
                return Err(crate::auth::forbidden(format!(
                    "a table fed by {text:?} needs the tables and read scopes on every stream it matches, or admin"
                )));
            }
            // Tiering trims the streams: what a trim needs.
            if definition.trim_source && !t.covers(Op::Delete, p) {
                return Err(crate::auth::forbidden(format!(
                    "trimSource trims the streams: a table fed by {text:?} with it needs the delete scope on every stream it matches, or admin"
                )));
            }
        }
        Ok(())
    }

    /// May define or drop tables at all: checked before a table is looked up, so
    /// that a refusal does not depend on whether it exists.
    fn may_define_any(&self) -> Result<(), ApiError> {
        match self.token()? {
            Some(t) if !t.has_op(Op::Tables) && !t.has_op_everywhere(Op::Admin) => {
                Err(crate::auth::forbidden(
                    "defining or dropping a table needs the tables scope, or admin",
                ))
            }
            _ => Ok(()),
        }
    }

    /// May see the table (its definition and its data through the catalog).
    fn may_see(&self, definition: &Definition) -> Result<bool, ApiError> {
        let Some(t) = self.token()? else {
            return Ok(true);
        };
        if t.has_op_everywhere(Op::Admin) {
            return Ok(true);
        }
        Ok(Self::patterns(definition)
            .iter()
            .all(|p| t.covers(Op::Read, p)))
    }
}

fn segments(path: &str, prefix: &str) -> Result<Vec<String>, ApiError> {
    let rest = path.strip_prefix(prefix).unwrap_or("");
    let mut out = Vec::new();
    for raw in rest.split('/').filter(|s| !s.is_empty()) {
        if out.len() >= 8 {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no such path: {path}"),
            ));
        }
        out.push(
            percent_decode(raw).ok_or_else(|| ApiError::bad_request("a malformed path segment"))?,
        );
    }
    Ok(out)
}

fn table_id(ns: &str, t: &str) -> Result<TableId, ApiError> {
    TableId::new(ns, t).map_err(ApiError::bad_request)
}

fn engine_error(e: EngineError) -> ApiError {
    ApiError::from(e)
}

/// `/__picomq/tables` and `/__picomq/tables/{ns}/{table}`.
pub async fn handle(State(app): State<Arc<AppState>>, request: Request<Body>) -> Response<Body> {
    match serve(&app, request).await {
        Ok(r) => r,
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}

async fn serve(app: &Arc<AppState>, request: Request<Body>) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let caller = Caller {
        app,
        principal: parts.extensions.remove::<Principal>(),
    };
    caller.token()?;
    let path = parts.uri.path().to_string();
    let seg = segments(&path, PATH)?;
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    match (&parts.method, seg.as_slice()) {
        (&Method::GET, []) => {
            let tables = catalog::tables(&app.engine).await.map_err(engine_error)?;
            let mut out = Vec::new();
            for e in tables.values() {
                if caller.may_see(&e.row.definition)? {
                    out.push(summary(app, e));
                }
            }
            Ok(json_response(StatusCode::OK, json!({ "tables": out })))
        }
        (&Method::PUT, [ns, t]) => {
            caller.may_define_any()?;
            let id = table_id(ns, t)?;
            let bytes =
                crate::request::read_body(body, BODY_BYTES_MAX, app.body_read_timeout).await?;
            let definition: Definition = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::bad_request(format!("the table definition is not valid: {e}"))
            })?;
            definition.validate().map_err(ApiError::bad_request)?;
            // Partition fields name columns: checked against the table's columns now,
            // not at the first export.
            let fields = picomq_tables::exporter::base_fields();
            for (i, p) in definition.partition_by.iter().enumerate() {
                picomq_tables::partition::parse(p, &fields, 1000 + i as i32)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            }
            caller.may_define(&definition)?;
            let existing = catalog::tables(&app.engine)
                .await
                .map_err(engine_error)?
                .remove(&id);
            if let Some(e) = &existing {
                caller.may_define(&e.row.definition)?;
                if e.row.definition.partition_by != definition.partition_by
                    || e.row.definition.schema_subject != definition.schema_subject
                {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "table_exists",
                        format!("table {id} exists with another partitionBy or schemaSubject; drop it first"),
                    ));
                }
            }
            let location = |uuid: &str| format!("tables/{}/{}/{uuid}", id.namespace, id.table);
            let (row, created) = catalog::put(&app.engine, &id, definition, location)
                .await
                .map_err(engine_error)?;
            let entry = Entry {
                id,
                row,
                commit: None,
            };
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, summary(app, &entry)))
        }
        (&Method::GET, [ns, t]) => {
            let id = table_id(ns, t)?;
            let entry = find(app, &id).await?;
            if !caller.may_see(&entry.row.definition)? {
                return Err(no_table(&id));
            }
            Ok(json_response(StatusCode::OK, detail(app, &entry).await?))
        }
        (&Method::DELETE, [ns, t]) => {
            caller.may_define_any()?;
            let id = table_id(ns, t)?;
            let entry = find(app, &id).await?;
            if !caller.may_see(&entry.row.definition)? {
                return Err(no_table(&id));
            }
            caller.may_define(&entry.row.definition)?;
            let Some(row) = catalog::delete(&app.engine, &id)
                .await
                .map_err(engine_error)?
            else {
                return Err(no_table(&id));
            };
            // The files go in the background: a table of many files takes a while.
            let store = app.engine.store();
            tokio::spawn(async move {
                if let Err(e) = remove_prefix(&*store, &row.location).await {
                    tracing::warn!(location = %row.location, error = %e, "could not remove a dropped table's files");
                }
            });
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("valid response"))
        }
        (_, [] | [_, _]) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on {path}", parts.method),
        )),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such path: {path} (tables are /__picomq/tables/NAMESPACE/TABLE)"),
        )),
    }
}

async fn remove_prefix(
    store: &dyn object_store::ObjectStore,
    prefix: &str,
) -> object_store::Result<()> {
    use futures::TryStreamExt;
    let path = object_store::path::Path::from(prefix);
    let keys: Vec<_> = store
        .list(Some(&path))
        .map_ok(|o| o.location)
        .try_collect()
        .await?;
    for k in keys {
        match object_store::ObjectStoreExt::delete(store, &k).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A read below a stream's start (410) says which table holds what was trimmed,
/// when a table with `trimSource` tiers the stream.
pub fn name_holder(app: &AppState, stream: &str, e: ApiError) -> ApiError {
    // A Durable Streams read's, and a records read's by number.
    if e.code != "offset_trimmed" && e.code != "trimmed" {
        return e;
    }
    match app.tables.tiered_into(stream) {
        Some(id) => {
            let mut e = e.with_field("table", &id);
            e.message = format!(
                "{}; the records before it are in Iceberg table {id} (catalog at /__picomq/iceberg)",
                e.message
            );
            e
        }
        None => e,
    }
}

fn no_table(id: &TableId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "table_not_found",
        format!("no table {id}"),
    )
}

async fn find(app: &AppState, id: &TableId) -> Result<Entry, ApiError> {
    catalog::tables(&app.engine)
        .await
        .map_err(engine_error)?
        .remove(id)
        .ok_or_else(|| no_table(id))
}

fn exporter(app: &AppState) -> &Exporter {
    &app.tables
}

fn summary(app: &AppState, e: &Entry) -> Value {
    let x = exporter(app);
    json!({
        "namespace": e.id.namespace,
        "table": e.id.table,
        "definition": e.row.definition,
        "uuid": e.row.uuid,
        "location": x.uri(&e.row.location),
        "metadataLocation": e.commit.as_ref().map(|(_, c)| x.uri(&c.metadata)),
        "createdAt": e.row.created_ms,
    })
}

/// A table, its current snapshot and each stream's lag.
async fn detail(app: &AppState, e: &Entry) -> Result<Value, ApiError> {
    let x = exporter(app);
    let mut out = summary(app, e);
    let status = x.status(&e.id);
    out["export"] = json!(&status);
    let Some((_, c)) = &e.commit else {
        out["streams"] = json!([]);
        return Ok(out);
    };
    let loaded = x
        .load(&e.id, &x.uri(&c.metadata))
        .await
        .map_err(engine_error)?;
    let meta = &loaded.0;
    let offsets = meta.offsets().unwrap_or_default();
    if let Some(s) = meta.current_snapshot() {
        out["snapshot"] = json!({
            "id": s.snapshot_id,
            "sequenceNumber": s.sequence_number,
            "timestampMs": s.timestamp_ms,
            "totalRecords": s.summary.get("total-records").and_then(|v| v.parse::<u64>().ok()),
            "totalDataFiles": s.summary.get("total-data-files").and_then(|v| v.parse::<u64>().ok()),
            "totalBytes": s.summary.get("total-files-size").and_then(|v| v.parse::<u64>().ok()),
        });
    }
    let now = app.engine.clock().now_ms();
    let names = x
        .resolve(&e.row.definition.sources())
        .await
        .map_err(engine_error)?;
    let mut streams = Vec::new();
    let (mut lag_records, mut lag_ms) = (0u64, 0u64);
    // Past the first streams, the totals are the exporter's last round's. Each
    // position is read where the stream is served (another member's in a
    // cluster), several at once.
    use futures::StreamExt;
    let offsets = &offsets;
    let positions: Vec<_> = futures::stream::iter(names.iter().take(LAG_STREAMS_MAX).cloned())
        .map(|name: String| async move {
            let from = offsets.get(&name).copied().unwrap_or(0);
            let at = x.position(&name, from).await;
            (name, from, at)
        })
        .buffered(LAG_READS_AT_ONCE)
        .collect()
        .await;
    for (name, from, at) in positions {
        let Ok(at) = at else {
            continue;
        };
        let tail = at.tail_seq;
        let exported = from.max(at.first_seq).min(tail);
        let lag = tail - exported;
        let behind_ms = match at.records.first() {
            Some(r) if lag > 0 => now.saturating_sub(r.ts_ms),
            _ => 0,
        };
        lag_records += lag;
        lag_ms = lag_ms.max(behind_ms);
        streams.push(json!({
            "stream": name,
            "exportedSeq": exported,
            "tailSeq": tail,
            "lagRecords": lag,
            "lagSeconds": behind_ms as f64 / 1000.0,
        }));
    }
    if names.len() > LAG_STREAMS_MAX {
        lag_records = status.lag_records;
        lag_ms = match status.oldest_unexported_ms {
            Some(t) if status.lag_records > 0 => now.saturating_sub(t),
            _ => 0,
        };
    }
    out["streams"] = json!(streams);
    out["streamCount"] = json!(names.len());
    out["lagRecords"] = json!(lag_records);
    out["lagSeconds"] = json!(lag_ms as f64 / 1000.0);
    Ok(out)
}

/// The Iceberg REST catalog's error body.
fn iceberg_error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response<Body> {
    json_response(
        status,
        json!({"error": {"message": message.into(), "type": kind, "code": status.as_u16()}}),
    )
}

fn iceberg_from_api(e: ApiError) -> Response<Body> {
    let kind = match e.status {
        StatusCode::UNAUTHORIZED => "NotAuthorizedException",
        StatusCode::FORBIDDEN => "ForbiddenException",
        StatusCode::NOT_FOUND => "NoSuchTableException",
        s if s.is_server_error() => "ServiceUnavailableException",
        _ => "BadRequestException",
    };
    iceberg_error(e.status, kind, e.message)
}

/// A namespace's levels (the catalog joins them with 0x1F).
fn namespace(ns: &str) -> Vec<&str> {
    ns.split('\u{1f}').collect()
}

/// `/__picomq/iceberg/v1/...`: the REST catalog, read-only.
pub async fn iceberg(State(app): State<Arc<AppState>>, request: Request<Body>) -> Response<Body> {
    match iceberg_serve(&app, request).await {
        Ok(r) => r,
        Err(r) => r,
    }
}

async fn iceberg_serve(
    app: &Arc<AppState>,
    request: Request<Body>,
) -> Result<Response<Body>, Response<Body>> {
    let (mut parts, _body) = request.into_parts();
    let caller = Caller {
        app,
        principal: parts.extensions.remove::<Principal>(),
    };
    let path = parts.uri.path().to_string();
    let seg = segments(&path, ICEBERG_PREFIX).map_err(iceberg_from_api)?;
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    // The catalog's configuration says nothing of any table: anyone may read it.
    if seg.as_slice() != ["v1", "config"] {
        caller.token().map_err(iceberg_from_api)?;
    }
    let method = parts.method.clone();
    let head = method == Method::HEAD;
    if method != Method::GET && !head {
        return Err(iceberg_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedOperationException",
            "this catalog is read-only: PicoMQ writes its tables (define them under /__picomq/tables)",
        ));
    }
    let visible = || async {
        let tables = catalog::tables(&app.engine)
            .await
            .map_err(|e| iceberg_from_api(engine_error(e)))?;
        let mut out: BTreeMap<TableId, Entry> = BTreeMap::new();
        for (id, e) in tables {
            if caller
                .may_see(&e.row.definition)
                .map_err(iceberg_from_api)?
            {
                out.insert(id, e);
            }
        }
        Ok::<_, Response<Body>>(out)
    };
    let ok = |v: Value| {
        if head {
            Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("valid response")
        } else {
            json_response(StatusCode::OK, v)
        }
    };
    match seg.as_slice() {
        ["v1", "config"] => Ok(ok(json!({
            "defaults": {},
            "overrides": {},
            "endpoints": [
                "GET /v1/{prefix}/namespaces",
                "GET /v1/{prefix}/namespaces/{namespace}",
                "HEAD /v1/{prefix}/namespaces/{namespace}",
                "GET /v1/{prefix}/namespaces/{namespace}/tables",
                "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
                "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
            ],
        }))),
        ["v1", "namespaces"] => {
            if parts.uri.query().is_some_and(|q| q.contains("parent=")) {
                // Namespaces are one level deep: none has children.
                return Ok(ok(json!({ "namespaces": [] })));
            }
            let mut names: Vec<String> = visible()
                .await?
                .keys()
                .map(|id| id.namespace.clone())
                .collect();
            names.dedup();
            Ok(ok(
                json!({ "namespaces": names.iter().map(|n| vec![n]).collect::<Vec<_>>() }),
            ))
        }
        ["v1", "namespaces", ns] => {
            let ns = namespace(ns);
            if ns.len() == 1 && visible().await?.keys().any(|id| id.namespace == ns[0]) {
                Ok(ok(json!({ "namespace": ns, "properties": {} })))
            } else {
                Err(iceberg_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchNamespaceException",
                    format!("no namespace {}", ns.join(".")),
                ))
            }
        }
        ["v1", "namespaces", ns, "tables"] => {
            let ns = namespace(ns);
            let tables: Vec<Value> = visible()
                .await?
                .keys()
                .filter(|id| ns.len() == 1 && id.namespace == ns[0])
                .map(|id| json!({"namespace": [id.namespace], "name": id.table}))
                .collect();
            if tables.is_empty() {
                return Err(iceberg_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchNamespaceException",
                    format!("no namespace {}", ns.join(".")),
                ));
            }
            Ok(ok(json!({ "identifiers": tables })))
        }
        ["v1", "namespaces", ns, "tables", t] => {
            let ns = namespace(ns);
            let missing = || {
                iceberg_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchTableException",
                    format!("no table {}.{t}", ns.join(".")),
                )
            };
            if ns.len() != 1 {
                return Err(missing());
            }
            let Ok(id) = TableId::new(ns[0], t) else {
                return Err(missing());
            };
            let mut tables = visible().await?;
            let Some(entry) = tables.remove(&id) else {
                return Err(missing());
            };
            let Some((_, c)) = &entry.commit else {
                return Err(iceberg_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchTableException",
                    format!("table {id} has no metadata yet (its first export is pending)"),
                ));
            };
            if head {
                return Ok(ok(Value::Null));
            }
            let x = exporter(app);
            let uri = x.uri(&c.metadata);
            let loaded = x
                .load(&id, &uri)
                .await
                .map_err(|e| iceberg_from_api(engine_error(e)))?;
            Ok(ok(json!({
                "metadata-location": uri,
                "metadata": loaded.0,
                "config": app.iceberg_io,
            })))
        }
        _ => Err(iceberg_error(
            StatusCode::NOT_FOUND,
            "NotFoundException",
            format!("no such catalog endpoint: {path}"),
        )),
    }
}
