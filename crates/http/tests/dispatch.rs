//! The API service sends stream paths straight to the Durable Streams handler and the
//! server's own paths through axum's router. Both kinds of answer must carry the same
//! common headers, pass the same guard, and look as axum's router made them look
//! (Content-Length, HEAD without a body, 405 for a wrong method on a route).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, Response, StatusCode};
use picomq_engine::meta::Meta;
use picomq_engine::{Engine, EngineConfig};
use picomq_http::auth::{Auth, AuthConfig};
use picomq_http::{Api, HttpConfig};

const ADMIN: &str = "dispatch-admin-secret-0123456789abcdef0123456789abcdef";

async fn api(auth: bool) -> Api {
    let store = picomq_engine::store::open("memory://").expect("memory store");
    let meta = Meta::open("sqlite::memory:").await.expect("meta");
    let engine = Engine::open(EngineConfig::default(), store, meta)
        .await
        .expect("engine");
    let auth = if auth {
        let auth = Auth::open(engine.clone(), AuthConfig::default())
            .await
            .expect("auth");
        auth.bootstrap(ADMIN).await.expect("bootstrap");
        Some(Arc::new(auth))
    } else {
        None
    };
    // As a node does: the registry loaded before anything is served.
    let registry = picomq_http::open_registry(&engine);
    registry.ready().await;
    picomq_http::router(
        engine,
        HttpConfig {
            auth,
            registry: Some(registry),
            ..HttpConfig::default()
        },
    )
}

async fn send(
    api: &Api,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (Response<Body>, String) {
    let mut req = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Body::from(body.to_string())).expect("request");
    let resp = tower_service::Service::call(&mut api.clone(), req)
        .await
        .expect("infallible");
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (Response::from_parts(parts, Body::empty()), text)
}

/// What every answer carries.
fn assert_common_headers(resp: &Response<Body>, what: &str) {
    let h = resp.headers();
    for name in ["x-request-id", "x-content-type-options"] {
        assert!(h.contains_key(name), "{what}: no {name} in {h:?}");
    }
}

const BROWSER_HEADERS: [&str; 3] = [
    "access-control-allow-origin",
    "access-control-expose-headers",
    "cross-origin-resource-policy",
];

/// What a browser needs to read the answer.
fn assert_browser_headers(resp: &Response<Body>, what: &str) {
    assert_common_headers(resp, what);
    let h = resp.headers();
    for name in BROWSER_HEADERS {
        assert!(h.contains_key(name), "{what}: no {name} in {h:?}");
    }
}

#[tokio::test]
async fn stream_paths_and_server_paths_answer_alike() {
    let api = api(false).await;
    let text = [("content-type", "text/plain")];

    // A stream path, served without the router.
    let (resp, _) = send(&api, Method::PUT, "/v1/s", &text, "").await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_common_headers(&resp, "PUT");
    let (resp, _) = send(&api, Method::POST, "/v1/s", &text, "hello").await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT, "append");
    let (resp, body) = send(&api, Method::GET, "/v1/s?offset=-1", &[], "").await;
    assert_eq!((resp.status(), body.as_str()), (StatusCode::OK, "hello"));
    assert_eq!(resp.headers()[header::CONTENT_LENGTH], "5");
    assert_browser_headers(&resp, "GET");
    // HEAD: the headers of a read, no body.
    let (resp, body) = send(&api, Method::HEAD, "/v1/s", &[], "").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body, "", "HEAD has no body");
    assert_browser_headers(&resp, "HEAD");
    // An error from the handler is JSON and carries the headers too.
    let (resp, body) = send(&api, Method::GET, "/v1/missing?offset=-1", &[], "").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(body.contains("\"error\""), "{body}");
    assert_browser_headers(&resp, "404");

    // The server's own paths, through the router.
    let (resp, body) = send(&api, Method::GET, "/healthz", &[], "").await;
    assert_eq!((resp.status(), body.as_str()), (StatusCode::OK, "ok\n"));
    assert_eq!(resp.headers()[header::CONTENT_LENGTH], "3");
    assert_browser_headers(&resp, "healthz");
    let (resp, _) = send(&api, Method::POST, "/healthz", &[], "").await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_common_headers(&resp, "405");
    // A reserved path no route matches reaches the stream handler, which refuses it.
    let (resp, body) = send(&api, Method::GET, "/__nothing", &[], "").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(body.contains("reserved_path"), "{body}");
    // A CORS preflight is answered before anything else.
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "POST"),
    ];
    let (resp, _) = send(&api, Method::OPTIONS, "/v1/s", &preflight, "").await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(resp
        .headers()
        .contains_key(header::ACCESS_CONTROL_ALLOW_METHODS));
}

#[tokio::test]
async fn the_guard_covers_stream_paths_and_server_paths() {
    let api = api(true).await;
    let bad = [("authorization", "Bearer not-a-token")];
    for path in ["/v1/s", "/__picomq/streams"] {
        let (resp, body) = send(&api, Method::GET, path, &bad, "").await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        // The guard's answer (a bad credential), not a handler's "send one".
        assert!(body.contains("invalid_token"), "{path}: {body}");
        assert_browser_headers(&resp, path);
    }
    // No credential: the stream handler itself asks for one.
    let (resp, body) = send(&api, Method::PUT, "/v1/s", &[], "").await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(body.contains("\"unauthorized\""), "{body}");
    // The admin token passes the guard on both kinds of path.
    let admin = format!("Bearer {ADMIN}");
    let good = [
        ("authorization", admin.as_str()),
        ("content-type", "text/plain"),
    ];
    let (resp, _) = send(&api, Method::PUT, "/v1/s", &good, "").await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let (resp, body) = send(&api, Method::GET, "/__picomq/streams", &good, "").await;
    assert_eq!(resp.status(), StatusCode::OK, "{body}");
    assert!(body.contains("v1/s"), "{body}");
}

/// Values new in every response (the next offset, a generated request id) are marked
/// never to be indexed by HTTP/2's header compression, so they do not churn a
/// connection's header table; values that repeat are left indexable.
#[tokio::test]
async fn per_response_values_are_never_indexed() {
    let api = api(false).await;
    let text = [("content-type", "text/plain")];
    let (resp, _) = send(&api, Method::PUT, "/v1/stream/hpack", &text, "").await;
    assert!(resp.status().is_success());
    for _ in 0..2 {
        let (resp, _) = send(&api, Method::POST, "/v1/stream/hpack", &text, "x").await;
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        let h = resp.headers();
        for name in ["stream-next-offset", "x-request-id"] {
            assert!(h[name].is_sensitive(), "{name} is indexable: {h:?}");
        }
        assert!(!h["x-content-type-options"].is_sensitive(), "{h:?}");
    }
    let (resp, _) = send(&api, Method::GET, "/v1/stream/hpack?offset=-1", &[], "").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let h = resp.headers();
    assert!(h["stream-next-offset"].is_sensitive());
    assert!(!h["access-control-expose-headers"].is_sensitive(), "{h:?}");
    // A client's own request id is echoed as it came.
    let mine = [("content-type", "text/plain"), ("x-request-id", "mine-1")];
    let (resp, _) = send(&api, Method::POST, "/v1/stream/hpack", &mine, "y").await;
    assert_eq!(resp.headers()["x-request-id"], "mine-1");
}

/// Browser-only headers go where a browser can read the answer: any request with an
/// Origin (browsers send one with every write), and every read (a cache may hand it to
/// a browser later). A write without an Origin is not a browser's and gets neither.
#[tokio::test]
async fn browser_headers_go_where_a_browser_reads() {
    let api = api(false).await;
    let text = [("content-type", "text/plain")];
    let browser = [
        ("content-type", "text/plain"),
        ("origin", "https://app.example"),
    ];
    let (resp, _) = send(&api, Method::PUT, "/v1/cors", &text, "").await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    for (method, path, with_origin) in [
        (Method::POST, "/v1/cors", false),
        (Method::POST, "/v1/cors", true),
        (Method::PUT, "/v1/cors2", false),
        (Method::PUT, "/v1/cors3", true),
        (Method::DELETE, "/v1/cors2", false),
        (Method::DELETE, "/v1/cors3", true),
        (Method::GET, "/v1/cors?offset=-1", false),
        (Method::HEAD, "/v1/cors", false),
    ] {
        let hs: &[(&str, &str)] = if with_origin { &browser } else { &text };
        let (resp, body) = send(&api, method.clone(), path, hs, "x").await;
        let what = format!("{method} {path} origin={with_origin}");
        assert!(
            resp.status().is_success(),
            "{what}: {} {body}",
            resp.status()
        );
        if with_origin || method == Method::GET || method == Method::HEAD {
            assert_browser_headers(&resp, &what);
        } else {
            assert_common_headers(&resp, &what);
            for name in BROWSER_HEADERS {
                assert!(!resp.headers().contains_key(name), "{what}: {name}");
            }
        }
    }
}
