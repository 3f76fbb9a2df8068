//! The authorization matrix, generated from one table: every endpoint the API port
//! serves (`picomq_http::API_ROUTES`, the Durable Streams paths and the `__ds`
//! subscription APIs) with the rights each request needs, run with no token, with
//! tokens each missing one of those rights, with the rights exactly, and with every
//! right in another namespace; on a stream that exists and one that does not.
//!
//! It asserts, for every row:
//! - no credential: 401, the same answer for both streams;
//! - a token short of any one right, or of another namespace: no success, the same
//!   status and body for the existing and the missing stream (a refusal never says
//!   whether a stream exists), and nothing changed on the server;
//! - the exact rights: the request succeeds;
//! - a listing shows the row's stream only to a token that may see it.
//!
//! A path in `API_ROUTES` without a row fails the test.

use picomq_testkit as support;

use std::collections::BTreeSet;

use picomq_client::{HttpMethod, Response};
use serde_json::{json, Value};
use support::*;

/// What a row's request needs.
#[derive(Clone, Copy)]
enum Needs {
    /// These `(operations, pattern)` grants together; `{S}` in a pattern is the
    /// row's stream. Each one left out must make the request fail.
    Grants(&'static [(&'static str, &'static str)]),
    /// Anyone (health, the console's files, the signing keys).
    Nothing,
    /// Only another cluster member (the cluster key), never a token.
    ClusterKey,
    /// Any one of these grants alone (the registry's writes: `schemas` on the
    /// subject, or `admin` on every name); a token with every other operation but
    /// these is refused.
    Either(&'static [(&'static str, &'static str)]),
}

/// What state the row's request needs before it runs on the existing stream.
#[derive(Clone, Copy, PartialEq)]
enum Setup {
    Stream,
    /// A position `c`, a group `g{N}` and a pull-wake subscription `sub{N}` on the
    /// stream.
    Consumers,
    /// The stream, and the subject `{N}-value` registered (an Avro `"string"`).
    Schema,
    /// The stream, and the Iceberg table `ns.{N}` fed by it, with its first
    /// metadata written.
    Table,
}

/// How a successful answer looks.
#[derive(Clone, Copy)]
enum Ok {
    Status(u16),
    /// Not refused (any status but 401 and 403): the outcome depends on state this
    /// matrix does not set up (a single node has no members to drain).
    NotRefused,
    /// A listing: 200, naming the row's stream only for those who may see it.
    Lists,
}

struct Row {
    /// The route it exercises: an `API_ROUTES` entry, `"{stream}"` or `"__ds"`.
    route: &'static str,
    method: HttpMethod,
    /// `{S}` the stream (relative), `{N}` a tag of the row's own (a group's or a
    /// subscription's name: one that exists on the existing stream, another one
    /// beside the missing stream), `{ID}` a token id.
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    needs: Needs,
    setup: Setup,
    ok: Ok,
}

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
const READ: Needs = Needs::Grants(&[("read", "m/**")]);
const SUBSCRIBE_PATH: (&str, &str) = ("subscribe", "__ds/subscriptions/**");
const ADMIN: Needs = Needs::Grants(&[("admin", "**")]);
const SCHEMAS: Needs = Needs::Either(&[("schemas", "**"), ("admin", "**")]);
const TABLES: Needs = Needs::Grants(&[("tables", "m/**"), ("read", "m/**")]);
/// A table that tiers its streams trims them: what a trim needs too.
const TIERING: Needs = Needs::Grants(&[("tables", "m/**"), ("read", "m/**"), ("delete", "m/**")]);

fn rows() -> Vec<Row> {
    let row = |route, method, path, headers, body, needs, setup, ok| Row {
        route,
        method,
        path,
        headers,
        body,
        needs,
        setup,
        ok,
    };
    let s = Setup::Stream;
    let c = Setup::Consumers;
    let sr = Setup::Schema;
    let t = Setup::Table;
    let registry = picomq_http::schemas::ITEM_PATH;
    const STRING: &str = r#"{"schema":"\"string\""}"#;
    vec![
        // Iceberg tables: defining and dropping one needs tables and read on its
        // sources (and delete, to tier them); seeing one (and its data through
        // the catalog) needs read.
        row(
            picomq_http::tables::PATH,
            HttpMethod::GET,
            "/__picomq/tables",
            &[],
            "",
            READ,
            t,
            Ok::Lists,
        ),
        row(
            picomq_http::tables::ITEM_PATH,
            HttpMethod::PUT,
            "/__picomq/tables/ns/{N}",
            JSON,
            r#"{"source":"{S}","commitInterval":"1s"}"#,
            TABLES,
            s,
            Ok::Status(201),
        ),
        row(
            picomq_http::tables::ITEM_PATH,
            HttpMethod::PUT,
            "/__picomq/tables/ns/{N}",
            JSON,
            r#"{"source":"{S}","commitInterval":"1s","trimSource":true}"#,
            TIERING,
            s,
            Ok::Status(201),
        ),
        row(
            picomq_http::tables::ITEM_PATH,
            HttpMethod::GET,
            "/__picomq/tables/ns/{N}",
            &[],
            "",
            READ,
            t,
            Ok::Status(200),
        ),
        row(
            picomq_http::tables::ITEM_PATH,
            HttpMethod::DELETE,
            "/__picomq/tables/ns/{N}",
            &[],
            "",
            TABLES,
            t,
            Ok::Status(204),
        ),
        row(
            picomq_http::tables::ICEBERG_PATH,
            HttpMethod::GET,
            "/__picomq/iceberg/v1/config",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::tables::ICEBERG_PATH,
            HttpMethod::GET,
            "/__picomq/iceberg/v1/namespaces/ns/tables/{N}",
            &[],
            "",
            READ,
            t,
            Ok::Status(200),
        ),
        // The schema registry: reads need read (on anything), writes the schemas
        // scope or admin; a stream's binding is read with read and set with create.
        row(
            picomq_http::schemas::PATH,
            HttpMethod::GET,
            "/__picomq/schemas",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::GET,
            "/__picomq/schemas/subjects",
            &[],
            "",
            READ,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::GET,
            "/__picomq/schemas/subjects/{N}-value/versions/latest",
            &[],
            "",
            READ,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::GET,
            "/__picomq/schemas/schemas/ids/1",
            &[],
            "",
            READ,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::POST,
            "/__picomq/schemas/subjects/{N}-value",
            JSON,
            STRING,
            READ,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::POST,
            "/__picomq/schemas/compatibility/subjects/{N}-value/versions/latest",
            JSON,
            STRING,
            READ,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::POST,
            "/__picomq/schemas/subjects/{N}-value/versions",
            JSON,
            STRING,
            SCHEMAS,
            sr,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::PUT,
            "/__picomq/schemas/config/{N}-value",
            JSON,
            r#"{"compatibility":"FULL"}"#,
            SCHEMAS,
            s,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::PUT,
            "/__picomq/schemas/config",
            JSON,
            r#"{"compatibility":"BACKWARD"}"#,
            SCHEMAS,
            s,
            Ok::Status(200),
        ),
        row(
            registry,
            HttpMethod::DELETE,
            "/__picomq/schemas/subjects/{N}-value",
            &[],
            "",
            SCHEMAS,
            sr,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::GET,
            "/__picomq/streams/{S}/schema",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::POST,
            "/__picomq/streams/{S}/schema",
            JSON,
            r#"{"subject":null}"#,
            Needs::Grants(&[("create", "m/**")]),
            s,
            Ok::Status(200),
        ),
        // Durable Streams on the stream's own path.
        row(
            "{stream}",
            HttpMethod::PUT,
            "/{S}",
            JSON,
            "",
            Needs::Grants(&[("create", "m/**")]),
            s,
            Ok::Status(200),
        ),
        row(
            "{stream}",
            HttpMethod::POST,
            "/{S}",
            JSON,
            r#"{"v":1}"#,
            Needs::Grants(&[("append", "m/**")]),
            s,
            Ok::Status(204),
        ),
        row(
            "{stream}",
            HttpMethod::GET,
            "/{S}?offset=-1",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            "{stream}",
            HttpMethod::HEAD,
            "/{S}",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            "{stream}",
            HttpMethod::DELETE,
            "/{S}",
            &[],
            "",
            Needs::Grants(&[("delete", "m/**")]),
            s,
            Ok::Status(204),
        ),
        row(
            "{stream}",
            HttpMethod::PUT,
            "/fork/{N}",
            &[
                ("content-type", "application/json"),
                ("stream-forked-from", "/{S}"),
            ],
            "",
            Needs::Grants(&[("create", "fork/**"), ("read", "m/**")]),
            s,
            Ok::Status(201),
        ),
        // The native record API, trim and retention.
        row(
            picomq_http::retention::PATH,
            HttpMethod::POST,
            "/__picomq/streams/{S}/records",
            JSON,
            r#"{"records":[{"json":{"v":2}}]}"#,
            Needs::Grants(&[("append", "m/**")]),
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::GET,
            "/__picomq/streams/{S}/records?seq=0",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::GET,
            "/__picomq/streams/{S}/info",
            &[],
            "",
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::POST,
            "/__picomq/streams/{S}/trim?before_seq=0",
            &[],
            "",
            Needs::Grants(&[("delete", "m/**")]),
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::retention::PATH,
            HttpMethod::POST,
            "/__picomq/streams/{S}/retention?seconds=3600",
            &[],
            "",
            Needs::Grants(&[("delete", "m/**")]),
            s,
            Ok::Status(200),
        ),
        // Positions and read tokens: read on the stream.
        row(
            picomq_http::positions::PATH,
            HttpMethod::PUT,
            "/__picomq/positions/c/{S}",
            JSON,
            r#"{"offset":"0000000000000000_0000000000000000"}"#,
            READ,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::positions::PATH,
            HttpMethod::GET,
            "/__picomq/positions/c/{S}",
            &[],
            "",
            READ,
            c,
            Ok::Status(200),
        ),
        row(
            picomq_http::positions::PATH,
            HttpMethod::DELETE,
            "/__picomq/positions/c/{S}",
            &[],
            "",
            READ,
            c,
            Ok::Status(204),
        ),
        row(
            picomq_http::tokens::READ_TOKENS_PATH,
            HttpMethod::POST,
            "/__picomq/read-tokens",
            JSON,
            r#"{"stream":"{S}"}"#,
            READ,
            s,
            Ok::Status(201),
        ),
        // Consumer groups: subscribe to manage, claim and read to take messages,
        // append on a dead-letter stream.
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::PUT,
            "/__picomq/groups/n{N}",
            JSON,
            r#"{"stream":"{S}","deadLetter":"{S}-dlq"}"#,
            Needs::Grants(&[("subscribe", "m/**"), ("append", "m/**")]),
            s,
            Ok::Status(201),
        ),
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::GET,
            "/__picomq/groups/g{N}",
            &[],
            "",
            Needs::Grants(&[("subscribe", "m/**")]),
            c,
            Ok::Status(200),
        ),
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::POST,
            "/__picomq/groups/g{N}/claim",
            JSON,
            r#"{"consumer":"c","max":5}"#,
            Needs::Grants(&[("claim", "m/**"), ("read", "m/**")]),
            c,
            Ok::Status(200),
        ),
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::POST,
            "/__picomq/groups/g{N}/ack",
            JSON,
            r#"{"ids":[]}"#,
            Needs::Grants(&[("claim", "m/**")]),
            c,
            Ok::Status(200),
        ),
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::POST,
            "/__picomq/groups/g{N}/nack",
            JSON,
            r#"{"ids":[]}"#,
            Needs::Grants(&[("claim", "m/**")]),
            c,
            Ok::Status(200),
        ),
        row(
            picomq_http::groups::ITEM_PATH,
            HttpMethod::DELETE,
            "/__picomq/groups/g{N}",
            &[],
            "",
            Needs::Grants(&[("subscribe", "m/**")]),
            c,
            Ok::Status(204),
        ),
        row(
            picomq_http::groups::PATH,
            HttpMethod::GET,
            "/__picomq/groups",
            &[],
            "",
            Needs::Grants(&[("subscribe", "m/**")]),
            c,
            Ok::Lists,
        ),
        // Durable Streams subscriptions (`__ds`): subscribe on the subscription's
        // path, read on every linked stream, append on the wake stream.
        row(
            "__ds",
            HttpMethod::PUT,
            "/__ds/subscriptions/new{N}",
            JSON,
            r#"{"type":"pull-wake","streams":["{S}"],"wake_stream":"{S}-wake","lease_ttl_ms":30000}"#,
            Needs::Grants(&[SUBSCRIBE_PATH, ("read", "m/**"), ("append", "m/**")]),
            c,
            Ok::Status(201),
        ),
        row(
            "__ds",
            HttpMethod::PUT,
            "/__ds/subscriptions/glob{N}",
            JSON,
            r#"{"type":"pull-wake","pattern":"{S}/*","wake_stream":"{S}-wake"}"#,
            Needs::Grants(&[SUBSCRIBE_PATH, ("read", "m/**"), ("append", "m/**")]),
            s,
            Ok::Status(201),
        ),
        row(
            "__ds",
            HttpMethod::GET,
            "/__ds/subscriptions/sub{N}",
            &[],
            "",
            Needs::Grants(&[SUBSCRIBE_PATH]),
            c,
            Ok::Status(200),
        ),
        row(
            "__ds",
            HttpMethod::POST,
            "/__ds/subscriptions/sub{N}/streams",
            JSON,
            r#"{"streams":["{S}"]}"#,
            Needs::Grants(&[SUBSCRIBE_PATH, ("read", "m/**")]),
            c,
            Ok::Status(204),
        ),
        row(
            "__ds",
            HttpMethod::POST,
            "/__ds/subscriptions/sub{N}/claim",
            JSON,
            r#"{"worker":"w"}"#,
            Needs::Grants(&[("claim", "__ds/subscriptions/**")]),
            c,
            Ok::NotRefused,
        ),
        row(
            "__ds",
            HttpMethod::DELETE,
            "/__ds/subscriptions/sub{N}",
            &[],
            "",
            Needs::Grants(&[SUBSCRIBE_PATH]),
            c,
            Ok::Status(204),
        ),
        row(
            "__ds",
            HttpMethod::GET,
            "/__ds/jwks.json",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::subscriptions::LIST_PATH,
            HttpMethod::GET,
            "/__picomq/subscriptions",
            &[],
            "",
            Needs::Grants(&[SUBSCRIBE_PATH]),
            c,
            Ok::Status(200),
        ),
        // Listing: what a token may read.
        row(
            picomq_http::listing::PATH,
            HttpMethod::GET,
            "/__picomq/streams?prefix=m/&limit=1000",
            &[],
            "",
            READ,
            s,
            Ok::Lists,
        ),
        // Node-wide: admin and tokens.
        row(
            "/metrics",
            HttpMethod::GET,
            "/metrics",
            &[],
            "",
            ADMIN,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::maintenance::COMPACT_PATH,
            HttpMethod::POST,
            "/__picomq/compact",
            &[],
            "",
            ADMIN,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::nodes::NODES_PATH,
            HttpMethod::GET,
            "/__picomq/nodes",
            &[],
            "",
            ADMIN,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::nodes::DRAIN_PATH,
            HttpMethod::POST,
            "/__picomq/nodes/none/drain",
            &[],
            "",
            ADMIN,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::nodes::RESUME_PATH,
            HttpMethod::POST,
            "/__picomq/nodes/none/resume",
            &[],
            "",
            ADMIN,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::subscriptions::ROTATE_PATH,
            HttpMethod::POST,
            "/__picomq/webhook-keys/rotate",
            &[],
            "",
            ADMIN,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::tokens::TOKENS_PATH,
            HttpMethod::GET,
            "/__picomq/tokens",
            &[],
            "",
            Needs::Grants(&[("tokens", "**")]),
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::tokens::TOKENS_PATH,
            HttpMethod::POST,
            "/__picomq/tokens",
            JSON,
            r#"{"scopes":["read:m/**"]}"#,
            Needs::Grants(&[("tokens", "**"), ("read", "m/**")]),
            s,
            Ok::Status(201),
        ),
        row(
            picomq_http::tokens::TOKEN_PATH,
            HttpMethod::DELETE,
            "/__picomq/tokens/{ID}",
            &[],
            "",
            Needs::Grants(&[("tokens", "**")]),
            s,
            Ok::NotRefused,
        ),
        // Anyone.
        row(
            "/healthz",
            HttpMethod::GET,
            "/healthz",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            "/readyz",
            HttpMethod::GET,
            "/readyz",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::console::PATH,
            HttpMethod::GET,
            "/__picomq/console",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::console::INDEX_PATH,
            HttpMethod::GET,
            "/__picomq/console/",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        row(
            picomq_http::console::FILE_PATH,
            HttpMethod::GET,
            "/__picomq/console/app.js",
            &[],
            "",
            Needs::Nothing,
            s,
            Ok::Status(200),
        ),
        // Members only: no token opens them.
        row(
            picomq_http::cluster::peers::PIN_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/fork-pin",
            JSON,
            "{}",
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::UNPIN_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/fork-unpin",
            JSON,
            "{}",
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::CASCADE_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/cascade",
            JSON,
            "{}",
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::NUDGE_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/nudge",
            JSON,
            "{}",
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::APPEND_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/append",
            JSON,
            r#"{"stream":"{S}","body":"{}"}"#,
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::TAILS_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/tails",
            JSON,
            r#"{"streams":["{S}"]}"#,
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
        row(
            picomq_http::cluster::peers::ADMIN_PATH,
            HttpMethod::POST,
            "/__picomq/cluster/admin",
            JSON,
            r#"{"op":"info","stream":"{S}"}"#,
            Needs::ClusterKey,
            s,
            Ok::NotRefused,
        ),
    ]
}

struct Ctx {
    s: Server,
    token_id: String,
}

async fn send(
    s: &Server,
    method: &HttpMethod,
    path: &str,
    secret: Option<&str>,
    headers: &[(&str, String)],
    body: &str,
) -> Response {
    let auth = secret.map(bearer);
    let mut h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if let Some(a) = &auth {
        h.push(("authorization", a));
    }
    s.client
        .send(method.clone(), path, &h, body.to_string())
        .await
        .expect("request")
}

async fn admin(s: &Server, method: HttpMethod, path: &str, body: Value) -> Response {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let ct = [("content-type", "application/json".to_string())];
    send(s, &method, path, Some(ADMIN_SECRET), &ct, &body).await
}

/// Everything a refused request could have changed, as the admin sees it.
async fn fingerprint(s: &Server, stream: &str, n: &str) -> String {
    let mut out = String::new();
    for path in [
        "/__picomq/streams?limit=1000".to_string(),
        "/__picomq/groups".to_string(),
        format!("/__picomq/groups/g{n}"),
        format!("/__picomq/positions/c/{stream}"),
        format!("/__ds/subscriptions/sub{n}"),
        format!("/__picomq/streams/{stream}/info"),
        format!("/__picomq/streams/{stream}/schema"),
        "/__picomq/subscriptions".to_string(),
        "/__picomq/schemas/subjects?deleted=true".to_string(),
        format!("/__picomq/schemas/subjects/{n}-value/versions?deleted=true"),
        "/__picomq/schemas/config".to_string(),
        format!("/__picomq/schemas/config/{n}-value"),
    ] {
        let r = admin(s, HttpMethod::GET, &path, Value::Null).await;
        out.push_str(&format!("{path} {} {}\n", r.status.as_u16(), r.text()));
    }
    // The tables as defined (what the exporter writes moves on by itself).
    let r = admin(s, HttpMethod::GET, "/__picomq/tables", Value::Null).await;
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    let defined: Vec<Value> = v["tables"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| json!([t["namespace"], t["table"], t["definition"], t["uuid"]]))
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&format!("tables {}\n", Value::Array(defined)));
    let r = admin(s, HttpMethod::GET, "/__picomq/tokens", Value::Null).await;
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    out.push_str(&format!(
        "tokens {}\n",
        v["tokens"].as_array().map_or(0, |t| t.len())
    ));
    out
}

/// The row's stream (JSON, with a record), its `-dlq` and `-wake` streams, and what
/// `setup` adds.
async fn set_up(c: &Ctx, setup: Setup, stream: &str, n: &str) {
    let s = &c.s;
    for name in [
        stream.to_string(),
        format!("{stream}-dlq"),
        format!("{stream}-wake"),
    ] {
        let r = admin(s, HttpMethod::PUT, &format!("/{name}"), Value::Null).await;
        assert!(r.status.is_success(), "{name}: {}", r.text());
    }
    let r = admin(
        s,
        HttpMethod::POST,
        &format!("/{stream}"),
        json!({"first": n}),
    )
    .await;
    assert!(r.status.is_success(), "{}", r.text());
    if setup == Setup::Schema {
        let r = admin(
            s,
            HttpMethod::POST,
            &format!("/__picomq/schemas/subjects/{n}-value/versions"),
            json!({"schema": "\"string\""}),
        )
        .await;
        assert!(r.status.is_success(), "{}", r.text());
    }
    if setup == Setup::Table {
        let r = admin(
            s,
            HttpMethod::PUT,
            &format!("/__picomq/tables/ns/{n}"),
            json!({"source": stream, "commitInterval": "1s"}),
        )
        .await;
        assert!(r.status.is_success(), "{}", r.text());
        // The catalog serves a table once its first metadata is written.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let r = admin(
                s,
                HttpMethod::GET,
                &format!("/__picomq/tables/ns/{n}"),
                Value::Null,
            )
            .await;
            let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            if !v["metadataLocation"].is_null() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "table ns.{n} got no metadata: {}",
                r.text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    if setup == Setup::Consumers {
        let calls = [
            (
                HttpMethod::PUT,
                format!("/__picomq/positions/c/{stream}"),
                json!({"offset": "0000000000000000_0000000000000000"}),
            ),
            (
                HttpMethod::PUT,
                format!("/__picomq/groups/g{n}"),
                json!({"stream": stream}),
            ),
            (
                HttpMethod::PUT,
                format!("/__ds/subscriptions/sub{n}"),
                json!({"type": "pull-wake", "streams": [stream], "wake_stream": format!("{stream}-wake"), "lease_ttl_ms": 30000}),
            ),
        ];
        for (method, path, body) in calls {
            let r = admin(s, method, &path, body).await;
            assert!(r.status.is_success(), "{path}: {}", r.text());
        }
    }
}

fn fill(text: &str, stream: &str, tag: &str, id: &str) -> String {
    text.replace("{S}", stream)
        .replace("{N}", tag)
        .replace("{ID}", id)
}

/// An answer with the names that differ between the two runs taken out.
fn normalized(r: &Response, stream: &str, tag: &str) -> String {
    let mut text = r.text().replace(stream, "STREAM").replace(tag, "TAG");
    // Request ids differ on every answer.
    if let Ok(mut v) = serde_json::from_str::<Value>(&text) {
        if let Some(e) = v.get_mut("error").and_then(Value::as_object_mut) {
            e.remove("request_id");
        }
        text = v.to_string();
    }
    format!("{} {text}", r.status.as_u16())
}

async fn issue(c: &Ctx, scopes: Vec<String>, namespace: &str) -> String {
    issue_token(
        &c.s.client,
        ADMIN_SECRET,
        json!({ "scopes": scopes, "namespace": namespace }),
    )
    .await
    .1
}

#[tokio::test]
async fn every_route_has_a_row_and_no_request_does_more_than_its_scopes_allow() {
    let rows = rows();
    let covered: BTreeSet<&str> = rows.iter().map(|r| r.route).collect();
    for route in picomq_http::API_ROUTES {
        assert!(
            covered.contains(route),
            "{route} has no row in the authorization matrix (auth_routes.rs)"
        );
    }
    let dir = TempDir::new("auth-routes");
    let s = start_with_auth(dir.path(), &[]).await;
    let (token_id, _) = issue_token(&s.client, ADMIN_SECRET, json!({"scopes": ["read:x"]})).await;
    let c = Ctx { s, token_id };
    for (n, row) in rows.iter().enumerate() {
        check_row(&c, n, row).await;
    }
}

async fn check_row(c: &Ctx, n: usize, row: &Row) {
    let s = &c.s;
    let existing = format!("m/e{n}");
    let missing = format!("m/missing{n}");
    let (tag, missing_tag) = (format!("e{n}t"), format!("m{n}t"));
    set_up(c, row.setup, &existing, &tag).await;
    let label = format!("row {n}: {:?} {}", row.method, row.path);
    let request = |stream: String, secret: Option<String>| {
        let tag = if stream == existing {
            &tag
        } else {
            &missing_tag
        };
        let path = fill(row.path, &stream, tag, &c.token_id);
        let body = fill(row.body, &stream, tag, &c.token_id);
        let headers: Vec<(&str, String)> = row
            .headers
            .iter()
            .map(|(k, v)| (*k, fill(v, &stream, tag, &c.token_id)))
            .collect();
        let method = row.method.clone();
        async move { send(s, &method, &path, secret.as_deref(), &headers, &body).await }
    };
    // Every refusal: the same for both streams, and nothing changed.
    let refused_alike = |secret: Option<String>, who: &'static str| {
        let label = label.clone();
        let (existing, missing) = (existing.clone(), missing.clone());
        let (tag, missing_tag) = (tag.clone(), missing_tag.clone());
        async move {
            let before = fingerprint(s, &existing, &tag).await;
            let a = request(existing.clone(), secret.clone()).await;
            let b = request(missing.clone(), secret).await;
            assert!(
                !a.status.is_success(),
                "{label} {who}: allowed: {}",
                a.text()
            );
            assert_eq!(
                normalized(&a, &existing, &tag),
                normalized(&b, &missing, &missing_tag),
                "{label} {who}: the answer depends on whether the stream exists"
            );
            assert_eq!(
                before,
                fingerprint(s, &existing, &tag).await,
                "{label} {who}: a refused request changed the server"
            );
            a
        }
    };
    match row.needs {
        Needs::Nothing => {
            let r = request(existing.clone(), None).await;
            assert_ok(row, &r, &label, &existing, true);
        }
        Needs::ClusterKey => {
            for secret in [None, Some(ADMIN_SECRET.to_string())] {
                let r = refused_alike(secret, "no cluster key").await;
                assert!(r.status.is_client_error(), "{label}: {}", r.text());
            }
        }
        Needs::Either(alternatives) => {
            let r = refused_alike(None, "no token").await;
            assert_eq!(r.status.as_u16(), 401, "{label}: {}", r.text());
            let others: Vec<&str> = [
                "create",
                "append",
                "read",
                "delete",
                "admin",
                "tokens",
                "subscribe",
                "claim",
                "schemas",
                "tables",
            ]
            .into_iter()
            .filter(|o| !alternatives.iter().any(|(ops, _)| ops == o))
            .collect();
            let short = issue(c, vec![format!("{}:**", others.join(","))], "").await;
            let r = refused_alike(Some(short), "short of every alternative").await;
            assert_eq!(r.status.as_u16(), 403, "{label}: {}", r.text());
            // Every right, in another namespace: the registry is the node's, not
            // a namespace's.
            let elsewhere = issue(c, vec!["all:**".into()], "ten2/").await;
            let r = refused_alike(Some(elsewhere), "another namespace").await;
            assert_eq!(r.status.as_u16(), 403, "{label}: {}", r.text());
            for (i, (ops, pattern)) in alternatives.iter().enumerate() {
                let right = issue(c, vec![format!("{ops}:{pattern}")], "").await;
                let r = request(existing.clone(), Some(right)).await;
                if i == 0 {
                    assert_ok(row, &r, &label, &existing, true);
                } else {
                    // The state moved on (a delete is done): not refused is all.
                    assert!(
                        !matches!(r.status.as_u16(), 401 | 403),
                        "{label} with {ops}:{pattern}: {}",
                        r.text()
                    );
                }
            }
        }
        Needs::Grants(grants) => {
            let r = refused_alike(None, "no token").await;
            assert_eq!(r.status.as_u16(), 401, "{label}: {}", r.text());
            let scope = |(ops, pattern): &(&str, &str)| format!("{ops}:{pattern}");
            for left_out in 0..grants.len() {
                let mut scopes: Vec<String> = grants
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != left_out)
                    .map(|(_, g)| scope(g))
                    .collect();
                // Every other operation on the stream, so only the one left out is
                // missing.
                let (ops, pattern) = grants[left_out];
                let others: Vec<&str> = [
                    "create",
                    "append",
                    "read",
                    "delete",
                    "admin",
                    "tokens",
                    "subscribe",
                    "claim",
                    "tables",
                ]
                .into_iter()
                .filter(|o| !ops.split(',').any(|x| x == *o))
                .collect();
                scopes.push(format!("{}:{pattern}", others.join(",")));
                let secret = issue(c, scopes, "").await;
                if matches!(row.ok, Ok::Lists) {
                    let r = request(existing.clone(), Some(secret)).await;
                    assert!(
                        !r.text().contains(&existing),
                        "{label}: listed to a token short of {ops}: {}",
                        r.text()
                    );
                    continue;
                }
                let r = refused_alike(Some(secret), "short of a right").await;
                assert!(
                    matches!(r.status.as_u16(), 401 | 403 | 404),
                    "{label} (without {ops}:{pattern}): {}",
                    r.text()
                );
            }
            let elsewhere = issue(c, vec!["all:**".into()], "ten2/").await;
            if matches!(row.ok, Ok::Lists) {
                let r = request(existing.clone(), Some(elsewhere)).await;
                assert!(!r.text().contains(&existing), "{label}: {}", r.text());
            } else if grants
                .iter()
                .all(|(ops, _)| !ops.contains("admin") && !ops.contains("tokens"))
            {
                // In its own namespace it may do anything: the row's names there
                // are other streams, and the existing one is untouched.
                let before = fingerprint(s, &existing, &tag).await;
                request(existing.clone(), Some(elsewhere.clone())).await;
                request(missing.clone(), Some(elsewhere)).await;
                let after = fingerprint(s, &existing, &tag).await;
                let strip = |f: &str| {
                    f.lines()
                        .filter(|l| {
                            !l.starts_with("/__picomq/streams?")
                                && !l.starts_with("/__picomq/subscriptions ")
                                && !l.starts_with("/__picomq/groups ")
                                && !l.starts_with("tokens")
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                assert_eq!(
                    strip(&before),
                    strip(&after),
                    "{label}: changed from another namespace"
                );
            }
            let scopes: Vec<String> = grants.iter().map(scope).collect();
            let right = issue(c, scopes, "").await;
            let r = request(existing.clone(), Some(right)).await;
            assert_ok(row, &r, &label, &existing, true);
        }
    }
}

fn assert_ok(row: &Row, r: &Response, label: &str, stream: &str, listed: bool) {
    match row.ok {
        Ok::Status(code) => assert_eq!(r.status.as_u16(), code, "{label}: {}", r.text()),
        Ok::NotRefused => assert!(
            !matches!(r.status.as_u16(), 401 | 403),
            "{label}: {}",
            r.text()
        ),
        Ok::Lists => {
            assert_eq!(r.status.as_u16(), 200, "{label}: {}", r.text());
            assert_eq!(r.text().contains(stream), listed, "{label}: {}", r.text());
        }
    }
}
