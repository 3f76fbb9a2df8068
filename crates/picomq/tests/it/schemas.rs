//! The schema registry (docs/schemas.md): the Confluent REST API's behaviour and
//! errors, validation on the Durable Streams and native append paths, bindings,
//! and the registry surviving `kill -9` and a rebuild of the metadata from the
//! bucket (ids never reused), on SQLite and on Postgres.

use picomq_testkit as support;

use picomq_client::{HttpMethod, Response};
use serde_json::{json, Value};
use support::{read_all, Server, TempDir};

const SR: &str = "/__picomq/schemas";

async fn call(s: &Server, method: HttpMethod, path: &str, body: Value) -> Response {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    s.client
        .send(
            method,
            path,
            &[("content-type", "application/vnd.schemaregistry.v1+json")],
            body,
        )
        .await
        .expect("request")
}

fn json_of(r: &Response) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()))
}

/// Registers `schema` (a JSON value, sent as its text) under `subject`; the id.
async fn register(s: &Server, subject: &str, kind: &str, schema: Value) -> u64 {
    let r = call(
        s,
        HttpMethod::POST,
        &format!("{SR}/subjects/{subject}/versions"),
        json!({"schemaType": kind, "schema": schema.to_string()}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "register {subject}: {}", r.text());
    json_of(&r)["id"].as_u64().expect("an id")
}

/// A refusal: the status, the registry's error code, and a message.
async fn refused(s: &Server, method: HttpMethod, path: &str, body: Value, status: u16, code: u64) {
    let r = call(s, method.clone(), path, body).await;
    assert_eq!(r.status.as_u16(), status, "{method:?} {path}: {}", r.text());
    let v = json_of(&r);
    assert_eq!(v["error_code"], json!(code), "{method:?} {path}: {v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.schemaregistry.v1+json")
    );
}

fn record(name: &str, fields: Value) -> Value {
    json!({"type": "record", "name": name, "fields": fields})
}

fn order_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 5}},
        "required": ["id", "name"],
        "additionalProperties": false
    })
}

/// What the registry and a bound stream hold, as a client sees it.
async fn snapshot(s: &Server) -> Value {
    let mut out = json!({});
    for path in [
        "/subjects?deleted=true",
        "/subjects/orders-value/versions?deleted=true",
        "/subjects/orders-value/versions/1",
        "/subjects/orders-value/versions/2",
        "/subjects/doc/versions/latest",
        "/config",
        "/config/orders-value",
    ] {
        let r = call(s, HttpMethod::GET, &format!("{SR}{path}"), Value::Null).await;
        out[path] = json!([r.status.as_u16(), json_of(&r)]);
    }
    let r = call(
        s,
        HttpMethod::GET,
        "/__picomq/streams/docs/schema",
        Value::Null,
    )
    .await;
    out["binding"] = json_of(&r);
    out
}

/// Fills a registry: two Avro versions, a JSON subject bound to a stream, a
/// subject setting, and a subject hard-deleted (holding the largest id then).
async fn fill(s: &Server) -> u64 {
    register(
        s,
        "orders-value",
        "AVRO",
        record("Order", json!([{"name": "id", "type": "long"}])),
    )
    .await;
    register(
        s,
        "orders-value",
        "AVRO",
        record(
            "Order",
            json!([{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}]),
        ),
    )
    .await;
    register(s, "doc", "JSON", order_schema()).await;
    let r = call(
        s,
        HttpMethod::PUT,
        &format!("{SR}/config/orders-value"),
        json!({"compatibility": "FULL"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let gone = register(s, "gone", "AVRO", json!("bytes")).await;
    for permanent in ["false", "true"] {
        let r = call(
            s,
            HttpMethod::DELETE,
            &format!("{SR}/subjects/gone?permanent={permanent}"),
            Value::Null,
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let r = s
        .client
        .put(
            "/docs",
            &[
                ("content-type", "application/json"),
                ("stream-schema-subject", "doc"),
            ],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    gone
}

async fn bound_stream_checks(s: &Server) {
    let ct = [("content-type", "application/json")];
    let ok = s
        .client
        .post("/docs", &ct, r#"{"id": 1, "name": "a"}"#)
        .await
        .unwrap();
    assert_eq!(ok.status.as_u16(), 204, "{}", ok.text());
    let bad = s.client.post("/docs", &ct, r#"{"id": 1}"#).await.unwrap();
    assert_eq!(bad.status.as_u16(), 400, "{}", bad.text());
}

async fn survives(flags: &[&str], rebuild: bool) {
    let dir = TempDir::new("schemas-kill");
    let mut server = Server::start_process(dir.path(), flags).await;
    let gone = fill(&server).await;
    bound_stream_checks(&server).await;
    let before = snapshot(&server).await;
    server.restart().await; // kill -9, then start on the same data directory
    assert_eq!(snapshot(&server).await, before, "after kill -9");
    bound_stream_checks(&server).await;
    if rebuild {
        server.kill9();
        for f in ["meta.sqlite", "meta.sqlite-wal", "meta.sqlite-shm"] {
            let _ = std::fs::remove_file(dir.path().join(f));
        }
        server.restart().await;
        assert_eq!(
            snapshot(&server).await,
            before,
            "after a rebuild from the bucket"
        );
    }
    // Ids are never reused, not even the hard-deleted subject's (the largest).
    let next = register(&server, "later", "AVRO", json!("int")).await;
    assert!(next > gone, "id {next} after {gone}: an id was reused");
    assert_eq!(
        read_all(&server.client, "/docs").await,
        br#"[{"id": 1, "name": "a"},{"id": 1, "name": "a"}]"#
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_survives_sigkill_and_a_rebuild_from_the_bucket() {
    survives(&[], true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_survives_sigkill_on_postgres_metadata() {
    support::postgres::with_database("schemas", |url| async move {
        survives(&["--meta", url.as_str()], false).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_answers_as_the_confluent_registry_does() {
    let dir = TempDir::new("schemas-api");
    let s = Server::start(dir.path(), &[]).await;
    let v1 = record("R", json!([{"name": "f", "type": "int"}]));
    let v2 = record(
        "R",
        json!([{"name": "f", "type": "int"}, {"name": "g", "type": "string", "default": "x"}]),
    );
    let v3 = record(
        "R",
        json!([{"name": "f", "type": "int"}, {"name": "g", "type": "string"}]),
    );
    let id1 = register(&s, "t", "AVRO", v1.clone()).await;
    // Whitespace and key order do not make another schema.
    let spaced = r#"  { "name": "R", "fields": [{"type": "int", "name": "f"}], "type": "record" }"#;
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/t/versions"),
        json!({"schema": spaced}),
    )
    .await;
    assert_eq!(json_of(&r)["id"], json!(id1), "{}", r.text());
    // The same schema under another subject: the same id.
    assert_eq!(register(&s, "t2", "AVRO", v1.clone()).await, id1);
    let id2 = register(&s, "t", "AVRO", v2.clone()).await;
    // v3 drops g's default: BACKWARD (against v2 only) passes ...
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/compatibility/subjects/t/versions/latest?verbose=true"),
        json!({"schema": v3.to_string()}),
    )
    .await;
    assert_eq!(json_of(&r)["is_compatible"], json!(true), "{}", r.text());
    // ... BACKWARD_TRANSITIVE (v1 has no g) does not.
    let r = call(
        &s,
        HttpMethod::PUT,
        &format!("{SR}/config/t"),
        json!({"compatibility": "BACKWARD_TRANSITIVE"}),
    )
    .await;
    assert_eq!(json_of(&r), json!({"compatibility": "BACKWARD_TRANSITIVE"}));
    refused(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/t/versions"),
        json!({"schema": v3.to_string()}),
        409,
        40901,
    )
    .await;
    let r = call(&s, HttpMethod::GET, &format!("{SR}/config/t"), Value::Null).await;
    assert_eq!(
        json_of(&r),
        json!({"compatibilityLevel": "BACKWARD_TRANSITIVE"})
    );
    refused(
        &s,
        HttpMethod::GET,
        &format!("{SR}/config/t2"),
        Value::Null,
        404,
        40408,
    )
    .await;
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/config/t2?defaultToGlobal=true"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!({"compatibilityLevel": "BACKWARD"}));
    // Lookups, by subject and by id.
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/t"),
        json!({"schema": v2.to_string()}),
    )
    .await;
    let found = json_of(&r);
    assert_eq!(
        (found["version"].clone(), found["id"].clone()),
        (json!(2), json!(id2)),
        "{found}"
    );
    refused(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/t"),
        json!({"schema": v3.to_string()}),
        404,
        40403,
    )
    .await;
    refused(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/none"),
        json!({"schema": v3.to_string()}),
        404,
        40401,
    )
    .await;
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/schemas/ids/{id1}/versions"),
        Value::Null,
    )
    .await;
    assert_eq!(
        json_of(&r),
        json!([{"subject": "t", "version": 1}, {"subject": "t2", "version": 1}])
    );
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/schemas/types"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!(["JSON", "PROTOBUF", "AVRO"]));
    // References: a schema naming another subject's type; the referenced version
    // cannot be deleted while it is used.
    register(
        &s,
        "money",
        "AVRO",
        record("Money", json!([{"name": "cents", "type": "long"}])),
    )
    .await;
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/priced/versions"),
        json!({
            "schema": record("Priced", json!([{"name": "price", "type": "Money"}])).to_string(),
            "references": [{"name": "Money", "subject": "money", "version": 1}]
        }),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let priced = json_of(&r)["id"].clone();
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects/money/versions/1/referencedby"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!([priced]));
    refused(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/money/versions/1"),
        Value::Null,
        422,
        42206,
    )
    .await;
    // Soft and hard deletes.
    refused(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t2?permanent=true"),
        Value::Null,
        404,
        40405,
    )
    .await;
    let r = call(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t2"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!([1]));
    refused(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t2"),
        Value::Null,
        404,
        40404,
    )
    .await;
    refused(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects/t2/versions"),
        Value::Null,
        404,
        40401,
    )
    .await;
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects/t2/versions?deleted=true"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!([1]));
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects?deletedOnly=true"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!(["t2"]));
    // A soft-deleted version still answers by id: data written with it decodes.
    let r = call(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t/versions/2"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r), json!(2));
    refused(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t/versions/2"),
        Value::Null,
        404,
        40406,
    )
    .await;
    refused(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects/t/versions/2"),
        Value::Null,
        404,
        40402,
    )
    .await;
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/schemas/ids/{id2}"),
        Value::Null,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // Re-registering v2 makes version 3 (numbers are never reused either).
    let again = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/t/versions"),
        json!({"schema": v2.to_string()}),
    )
    .await;
    assert_eq!(
        (
            json_of(&again)["id"].clone(),
            json_of(&again)["version"].clone()
        ),
        (json!(id2), json!(3))
    );
    refused(
        &s,
        HttpMethod::DELETE,
        &format!("{SR}/subjects/t/versions/1?permanent=true"),
        Value::Null,
        404,
        40407,
    )
    .await;
    // JSON Schema and Protobuf answer their type; Protobuf also serialized.
    register(&s, "j", "JSON", order_schema()).await;
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/subjects/j/versions/latest"),
        Value::Null,
    )
    .await;
    assert_eq!(json_of(&r)["schemaType"], json!("JSON"));
    let proto = "syntax = \"proto3\";\npackage p;\nmessage M { int64 id = 1; string name = 2; }\n";
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/p/versions"),
        json!({"schemaType": "PROTOBUF", "schema": proto}),
    )
    .await;
    let pid = json_of(&r)["id"].clone();
    let r = call(
        &s,
        HttpMethod::GET,
        &format!("{SR}/schemas/ids/{pid}?format=serialized"),
        Value::Null,
    )
    .await;
    let serialized = json_of(&r)["schema"].as_str().unwrap().to_string();
    assert!(
        !serialized.contains("message"),
        "base64, not text: {serialized}"
    );
    // The same file as a base64 descriptor is the same schema.
    let r = call(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/p"),
        json!({"schemaType": "PROTOBUF", "schema": serialized}),
    )
    .await;
    assert_eq!(json_of(&r)["id"], pid, "{}", r.text());
    let proto2 = "syntax = \"proto3\";\npackage p;\nmessage M { string id = 1; }\n";
    refused(
        &s,
        HttpMethod::POST,
        &format!("{SR}/subjects/p/versions"),
        json!({"schemaType": "PROTOBUF", "schema": proto2}),
        409,
        40901,
    )
    .await;
    let r = call(&s, HttpMethod::GET, &format!("{SR}/mode"), Value::Null).await;
    assert_eq!(json_of(&r), json!({"mode": "READWRITE"}));
}

/// Every parser of the surface, fed bad input: a clear 4xx in the registry's
/// error form, never a 5xx or a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_registry_error() {
    let dir = TempDir::new("schemas-bad");
    let s = Server::start(dir.path(), &[]).await;
    register(&s, "ok", "AVRO", json!("string")).await;
    let long = "x".repeat(300);
    let huge = "y".repeat(300 * 1024);
    let cases: Vec<(HttpMethod, String, String, u16, u64)> = vec![
        (HttpMethod::POST, "/subjects/a/versions".into(), "not json".into(), 400, 40001),
        (HttpMethod::POST, "/subjects/a/versions".into(), "[]".into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), "{}".into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": 5}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "   "}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "{\"type\": \"nope\"}"}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "\"int\"", "schemaType": "XML"}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "{\"type\": 5}", "schemaType": "JSON"}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "message {", "schemaType": "PROTOBUF"}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "\"int\"", "references": [{"name": "X"}]}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "\"int\"", "references": [{"name": "X", "subject": "none", "version": 1}]}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), r#"{"schema": "\"int\"", "references": 7}"#.into(), 422, 42201),
        (HttpMethod::POST, "/subjects/a/versions".into(), format!(r#"{{"schema": "\"{huge}\""}}"#), 422, 42209),
        (HttpMethod::POST, format!("/subjects/{long}/versions"), r#"{"schema": "\"int\""}"#.into(), 400, 40001),
        (HttpMethod::POST, "/subjects/a%01b/versions".into(), r#"{"schema": "\"int\""}"#.into(), 400, 40001),
        (HttpMethod::POST, "/subjects/%ZZ/versions".into(), r#"{"schema": "\"int\""}"#.into(), 400, 40001),
        (HttpMethod::GET, "/subjects/ok/versions/0".into(), String::new(), 422, 42202),
        (HttpMethod::GET, "/subjects/ok/versions/-2".into(), String::new(), 422, 42202),
        (HttpMethod::GET, "/subjects/ok/versions/abc".into(), String::new(), 422, 42202),
        (HttpMethod::GET, "/subjects/ok/versions/99999999999".into(), String::new(), 422, 42202),
        (HttpMethod::GET, "/subjects/ok/versions/7".into(), String::new(), 404, 40402),
        (HttpMethod::GET, "/subjects/nope/versions/1".into(), String::new(), 404, 40401),
        (HttpMethod::GET, "/schemas/ids/0".into(), String::new(), 404, 40403),
        (HttpMethod::GET, "/schemas/ids/abc".into(), String::new(), 404, 40403),
        (HttpMethod::GET, "/schemas/ids/999".into(), String::new(), 404, 40403),
        (HttpMethod::PUT, "/config".into(), r#"{"compatibility": "SOMETIMES"}"#.into(), 422, 42203),
        (HttpMethod::PUT, "/config/ok".into(), "{}".into(), 422, 42203),
        (HttpMethod::PUT, "/mode".into(), r#"{"mode": "IMPORT"}"#.into(), 422, 42204),
        (HttpMethod::GET, "/subjects?offset=x".into(), String::new(), 400, 40001),
        (HttpMethod::GET, "/no/such/thing".into(), String::new(), 404, 40400),
        (HttpMethod::GET, "/a/b/c/d/e/f/g/h/i/j".into(), String::new(), 404, 40400),
        (HttpMethod::PATCH, "/subjects".into(), String::new(), 405, 40501),
    ];
    for (method, path, body, status, code) in cases {
        let path = format!("{SR}{path}");
        let r = s
            .client
            .send(
                method.clone(),
                &path,
                &[("content-type", "application/json")],
                body,
            )
            .await
            .expect("request");
        let shown = &path[..path.len().min(80)];
        assert_eq!(
            r.status.as_u16(),
            status,
            "{method:?} {shown}: {}",
            r.text()
        );
        let v = json_of(&r);
        assert_eq!(v["error_code"], json!(code), "{method:?} {shown}: {v}");
    }
    // Bindings: bad headers and bodies get the edge's JSON errors.
    let ct = ("content-type", "application/json");
    for (headers, status) in [
        (vec![ct, ("stream-schema-subject", "missing")], 404),
        (vec![ct, ("stream-schema-version", "1")], 400),
        (
            vec![
                ct,
                ("stream-schema-subject", "ok"),
                ("stream-schema-version", "x"),
            ],
            400,
        ),
        (
            vec![
                ct,
                ("stream-schema-subject", "ok"),
                ("stream-schema-version", "9"),
            ],
            404,
        ),
        // A JSON stream is checked against a JSON Schema: "ok" is Avro.
        (vec![ct, ("stream-schema-subject", "ok")], 422),
    ] {
        let r = s.client.put("/b1", &headers, "").await.unwrap();
        assert_eq!(r.status.as_u16(), status, "{headers:?}: {}", r.text());
        assert!(json_of(&r)["error"]["message"].is_string(), "{}", r.text());
    }
    assert_eq!(
        s.client.get("/b1").await.unwrap().status.as_u16(),
        404,
        "a refused create made the stream"
    );
    let r = s.client.put("/b2", &[ct], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 201);
    for body in [
        "x",
        "[]",
        r#"{"subject": 5}"#,
        r#"{"subject": "ok", "version": 0}"#,
        r#"{"subject": null, "version": 1}"#,
        r#"{"subject": "ok", "other": 1}"#,
    ] {
        let r = s
            .client
            .post("/__picomq/streams/b2/schema", &[ct], body)
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 400, "{body}: {}", r.text());
    }
}

/// Framed payloads on a binary stream, and the native record API on a JSON
/// stream: a batch with one bad record stores nothing and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_checked_on_every_path() {
    let dir = TempDir::new("schemas-append");
    let s = Server::start(dir.path(), &[]).await;
    let id = register(
        &s,
        "events",
        "AVRO",
        record("E", json!([{"name": "n", "type": "int"}])),
    )
    .await;
    let other = register(&s, "other", "AVRO", json!("string")).await;
    let bin = [("content-type", "application/octet-stream")];
    let r = s
        .client
        .put("/ev", &[bin[0], ("stream-schema-subject", "events")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let framed = |id: u64, datum: &[u8]| {
        let mut v = vec![0u8];
        v.extend_from_slice(&(id as u32).to_be_bytes());
        v.extend_from_slice(datum);
        v
    };
    // n = 21: zig-zag 42.
    let ok = s.client.post("/ev", &bin, framed(id, &[42])).await.unwrap();
    assert_eq!(ok.status.as_u16(), 204, "{}", ok.text());
    for (payload, rule) in [
        (framed(id, &[]), "decode"),
        (framed(id, &[42, 1]), "decode"),
        (framed(other, &[2, b'a']), "schemaId"),
        (framed(777, &[42]), "schemaId"),
        (b"\x00\x00".to_vec(), "framing"),
        (b"{\"n\": 1}".to_vec(), "framing"),
    ] {
        let r = s.client.post("/ev", &bin, payload.clone()).await.unwrap();
        assert_eq!(r.status.as_u16(), 400, "{payload:?}: {}", r.text());
        let e = &json_of(&r)["error"];
        assert_eq!(e["rule"], json!(rule), "{payload:?}: {e}");
        assert_eq!(e["code"], json!("schema_violation"));
    }
    assert_eq!(read_all(&s.client, "/ev").await, framed(id, &[42]));
    let r = s.client.head("/ev").await.unwrap();
    assert_eq!(r.header("stream-schema-subject"), Some("events"));
    // The native record API on a bound JSON stream.
    register(&s, "doc", "JSON", order_schema()).await;
    let ct = [("content-type", "application/json")];
    let r = s
        .client
        .put(
            "/nd",
            &[ct[0], ("stream-schema-subject", "doc")],
            r#"[{"id": 1, "name": "a"}]"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let batch = json!({"records": [
        {"json": {"id": 2, "name": "b"}},
        {"json": {"id": 3, "name": "c"}},
        {"json": {"id": "4", "name": "d"}}
    ]});
    let r = s
        .client
        .post("/__picomq/streams/nd/records", &ct, batch.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    let e = &json_of(&r)["error"];
    assert_eq!(
        (e["index"].clone(), e["path"].clone(), e["rule"].clone()),
        (json!(2), json!("/id"), json!("type")),
        "{e}"
    );
    let r = s.client.get("/__picomq/streams/nd/info").await.unwrap();
    let info = json_of(&r);
    assert_eq!(info["records"], json!(1), "{info}");
    assert_eq!(info["schema"], json!({"subject": "doc", "version": 1}));
    let r = s
        .client
        .get("/__picomq/streams/nd/records?seq=0")
        .await
        .unwrap();
    assert_eq!(
        r.header("stream-schema-subject"),
        Some("doc"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("stream-schema-version"), Some("1"));
    // A create's first message is checked too, before the stream exists.
    let r = s
        .client
        .put(
            "/nd2",
            &[ct[0], ("stream-schema-subject", "doc")],
            r#"{"id": 1}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert_eq!(s.client.get("/nd2").await.unwrap().status.as_u16(), 404);
    // A fork is held to its source's contract.
    let r = s
        .client
        .put("/nd-fork", &[ct[0], ("stream-forked-from", "/nd")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = s
        .client
        .post("/nd-fork", &ct, r#"{"id": "x"}"#)
        .await
        .unwrap();
    assert_eq!(
        r.status.as_u16(),
        400,
        "the fork took an invalid message: {}",
        r.text()
    );
    // A create naming another subject than the stream's is a conflict; the same
    // one is fine.
    register(&s, "doc2", "JSON", json!({"type": "object"})).await;
    let r = s
        .client
        .put("/nd", &[ct[0], ("stream-schema-subject", "doc2")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 409, "{}", r.text());
    assert_eq!(
        json_of(&r)["error"]["code"],
        json!("schema_binding_conflict")
    );
    let r = s
        .client
        .put("/nd", &[ct[0], ("stream-schema-subject", "doc")], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // A stream deleted and made again under its name starts unbound.
    assert_eq!(
        s.client.delete("/nd-fork").await.unwrap().status.as_u16(),
        204
    );
    assert_eq!(s.client.delete("/nd").await.unwrap().status.as_u16(), 204);
    assert_eq!(
        s.client.put("/nd", &ct, "").await.unwrap().status.as_u16(),
        201
    );
    let r = s
        .client
        .post("/nd", &ct, r#"{"free": true}"#)
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    assert_eq!(
        s.client
            .get("/nd?offset=-1")
            .await
            .unwrap()
            .header("stream-schema-subject"),
        None
    );
}

/// Registry writes need `schemas` on the subject or `admin` on every name: `*`
/// patterns (one segment) and namespaced tokens do not reach global settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_scopes_are_not_stretched() {
    let dir = TempDir::new("schemas-scopes");
    let s = support::start_with_auth(dir.path(), &[]).await;
    let token = |scopes: Value, namespace: &'static str| {
        let client = &s.client;
        async move {
            support::issue_token(
                client,
                support::ADMIN_SECRET,
                json!({"scopes": scopes, "namespace": namespace}),
            )
            .await
            .1
        }
    };
    let put = |secret: String, path: &'static str, body: &'static str| {
        let client = &s.client;
        async move {
            let auth = support::bearer(&secret);
            client
                .send(
                    HttpMethod::PUT,
                    path,
                    &[
                        ("content-type", "application/json"),
                        ("authorization", &auth),
                    ],
                    body,
                )
                .await
                .unwrap()
                .status
                .as_u16()
        }
    };
    let global = "/__picomq/schemas/config";
    let level = r#"{"compatibility": "FULL"}"#;
    for (scopes, ns) in [
        (json!(["admin:*"]), ""),
        (json!(["schemas:*"]), ""),
        (json!(["schemas:orders-*"]), ""),
        (json!(["all:**"]), "t/"),
    ] {
        let secret = token(scopes.clone(), ns).await;
        assert_eq!(put(secret, global, level).await, 403, "{scopes} in {ns:?}");
    }
    let secret = token(json!(["schemas:orders-*"]), "").await;
    assert_eq!(
        put(
            secret.clone(),
            "/__picomq/schemas/config/orders-value",
            level
        )
        .await,
        200
    );
    assert_eq!(
        put(secret, "/__picomq/schemas/config/other-value", level).await,
        403
    );
    for scopes in [json!(["schemas:**"]), json!(["admin:**"])] {
        let secret = token(scopes.clone(), "").await;
        assert_eq!(put(secret, global, level).await, 200, "{scopes}");
    }
}
