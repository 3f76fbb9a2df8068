//! A bounded randomized harness (no nightly, no cargo-fuzz): seeded xorshift inputs
//! built from a dictionary of troublesome pieces, mutated, thrown at every parser of
//! untrusted input (headers, offsets, stream names, query strings, tokens, scopes,
//! CORS lists) and at the whole router in process, with auth on. Nothing may panic;
//! the router never answers 5xx; scope containment is sound (a pattern that covers
//! another matches every name the other matches). Runs ~2 s per target by default;
//! `PICOMQ_FUZZ_SECS` and `PICOMQ_FUZZ_SEED` change the budget and replay a seed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request};
use picomq_engine::meta::Meta;
use picomq_engine::{Engine, EngineConfig, Offset, OffsetQuery};
use picomq_http::auth::credential::{self, ReadTokenKey};
use picomq_http::auth::scope::{parse_namespace, Pattern, Scope};
use picomq_http::auth::{Auth, AuthConfig};
use picomq_http::{headers, Cors, HttpConfig};

const ADMIN: &str = "fuzz-admin-secret-0123456789abcdef0123456789abcdef";

struct Rng(u64);

impl Rng {
    fn new(label: &str) -> Rng {
        let seed = std::env::var("PICOMQ_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| fastrand::u64(..))
            | 1;
        // Printed so a failure can be replayed with PICOMQ_FUZZ_SEED.
        eprintln!("fuzz {label}: PICOMQ_FUZZ_SEED={seed}");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const PIECES: &[&str] = &[
    "",
    "a",
    "b/",
    "/",
    "//",
    ".",
    "..",
    "%",
    "%2",
    "%2F",
    "%2e",
    "%2E%2e",
    "%00",
    "%ff",
    "%C3%A9",
    "é",
    "\u{0}",
    "\n",
    "\r\n",
    " ",
    "\t",
    "*",
    "**",
    "?",
    "\\",
    "\\*",
    "-1",
    "now",
    "0",
    "00",
    "18446744073709551615",
    "18446744073709551616",
    "9007199254740992",
    "+1",
    "1e3",
    "0000000000000000_0000000000000000",
    "_",
    "ffffffffffffffff_ffffffffffffffff",
    "Bearer ",
    "bearer",
    "Basic ",
    "pmq_",
    "pmqr1.",
    "pmqr1.99999999999.",
    "tok_",
    "=",
    "&",
    "token=",
    "offset=",
    "live=sse",
    "live=long-poll",
    "cursor=",
    "read",
    "append,read",
    "all",
    ":",
    ",",
    "tenant/",
    "__picomq",
    "https://",
    "http://a.b",
    "💥",
];

fn input(rng: &mut Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(10) {
        if rng.below(4) == 0 {
            // A random byte run, as lossy text.
            let bytes: Vec<u8> = (0..rng.below(8)).map(|_| rng.next() as u8).collect();
            s.push_str(&String::from_utf8_lossy(&bytes));
        } else {
            s.push_str(rng.pick(PIECES));
        }
    }
    if rng.below(50) == 0 {
        s = s.repeat(1 + rng.below(400));
    }
    s
}

fn budget() -> Duration {
    let secs = std::env::var("PICOMQ_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

#[test]
fn parsers_never_panic() {
    let mut rng = Rng::new("parsers");
    let key = ReadTokenKey::new(b"fuzz");
    let deadline = Instant::now() + budget();
    let mut rounds = 0u64;
    while Instant::now() < deadline || rounds < 1000 {
        rounds += 1;
        let s = input(&mut rng);
        let _ = headers::strict_uint(&s, "h", u64::MAX);
        let _ = headers::producer_uint(&s, "h");
        let _ = Offset::parse(&s);
        let _ = OffsetQuery::parse(&s);
        let _ = picomq_http::ds::stream_name(&s, 1024);
        let _ = picomq_http::ds::stream_name(&format!("/{s}"), 64);
        let _ = picomq_http::ds::read_params(Some(&s));
        let _ = picomq_http::ds::percent_decode(&s);
        let _ = credential::parse_bearer(s.as_bytes());
        let _ = credential::check_secret(&s);
        let _ = credential::query_token(&s);
        // A random string is never a valid signature of itself.
        if let Ok((exp, mac)) = ReadTokenKey::parse(&s, 0) {
            assert!(!key.verify(&s, exp, &mac), "{s:?}");
        }
        let _ = Scope::parse(&s);
        let _ = parse_namespace(&s);
        let _ = Cors::parse(&s);
        if let Ok(v) = HeaderValue::from_str(&s) {
            let mut h = HeaderMap::new();
            h.insert("stream-closed", v.clone());
            h.insert("authorization", v);
            let _ = headers::text(&h, &axum::http::header::AUTHORIZATION);
            let _ = headers::flag_true(&h, &headers::STREAM_CLOSED);
        }
        // Valid offsets round-trip.
        if let Ok(o) = Offset::parse(&s) {
            assert_eq!(Offset::parse(&o.to_string()).unwrap(), o);
        }
    }
    eprintln!("parsers: {rounds} rounds");
}

#[test]
fn scope_containment_is_sound() {
    let mut rng = Rng::new("scopes");
    const NAME_PIECES: &[&str] = &[
        "a", "b", "/", "ab", "a/", "x/y", "*", "?", "**", "\\*", "t/",
    ];
    let gen = |rng: &mut Rng| -> String {
        (0..1 + rng.below(6))
            .map(|_| rng.pick(NAME_PIECES))
            .collect()
    };
    let deadline = Instant::now() + budget();
    let mut checked = 0u64;
    while Instant::now() < deadline || checked < 1000 {
        let (Ok(a), Ok(b)) = (
            Pattern::parse(&gen(&mut rng)),
            Pattern::parse(&gen(&mut rng)),
        ) else {
            continue;
        };
        checked += 1;
        if !a.covers(&b) {
            continue;
        }
        for _ in 0..20 {
            let name: String = (0..rng.below(6))
                .map(|_| rng.pick(&["a", "b", "/", "*", "?", "t"]))
                .collect();
            assert!(
                !b.matches(&name) || a.matches(&name),
                "{a:?} claims to cover {b:?} but misses {name:?}"
            );
        }
        // Namespacing keeps containment.
        assert!(a.under("t/").covers(&b.under("t/")), "{a:?} {b:?}");
    }
    eprintln!("scopes: {checked} pattern pairs checked");
}

#[tokio::test]
async fn router_never_panics_or_fails_on_garbage() {
    let mut rng = Rng::new("router");
    let store = picomq_engine::store::open("memory://").expect("memory store");
    let meta = Meta::open("sqlite::memory:").await.expect("meta");
    let engine = Engine::open(EngineConfig::default(), store, meta)
        .await
        .expect("engine");
    let auth = Auth::open(engine.clone(), AuthConfig::default())
        .await
        .expect("auth");
    auth.bootstrap(ADMIN).await.expect("bootstrap");
    let config = HttpConfig {
        long_poll_timeout: Duration::from_millis(10),
        sse_max_duration: Duration::from_millis(10),
        auth: Some(Arc::new(auth)),
        rate_limit_ip: Some((1e9, 1e9)),
        registry: Some(picomq_http::open_registry(&engine)),
        ..HttpConfig::default()
    };
    if let Some(r) = &config.registry {
        r.ready().await;
    }
    let app = picomq_http::router(engine, config);
    let methods = [
        Method::GET,
        Method::PUT,
        Method::POST,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
    ];
    let header_names = [
        "content-type",
        "stream-seq",
        "stream-ttl",
        "stream-expires-at",
        "stream-closed",
        "producer-id",
        "producer-epoch",
        "producer-seq",
        "stream-forked-from",
        "stream-fork-offset",
        "stream-fork-sub-offset",
        "origin",
        "access-control-request-method",
        "x-request-id",
        "authorization",
    ];
    let deadline = Instant::now() + budget();
    let mut sent = 0u64;
    let mut by_status = std::collections::BTreeMap::<u16, u64>::new();
    while Instant::now() < deadline || sent < 300 {
        let method = methods[rng.below(methods.len())].clone();
        let path = match rng.below(6) {
            0 => format!("/__picomq/{}", input(&mut rng)),
            // Tables and the Iceberg catalog, whose names and bodies are parsed.
            4 => format!(
                "/__picomq/tables/{}/{}",
                rng.pick(&["ns", "a-b_c", ""]),
                input(&mut rng)
            ),
            5 => {
                format!(
                    "/__picomq/iceberg/v1/{}",
                    rng.pick(&[
                        "config",
                        "namespaces",
                        "namespaces/ns",
                        "namespaces/ns/tables",
                        "namespaces/ns/tables/",
                    ])
                ) + &input(&mut rng)
            }
            1 => format!("/f/{}", rng.below(5)),
            _ => format!("/{}", input(&mut rng)),
        };
        let query = if rng.below(2) == 0 {
            format!("?{}", input(&mut rng))
        } else {
            String::new()
        };
        let target =
            format!("{path}{query}").replace(|c: char| c.is_whitespace() || c.is_control(), "");
        let Ok(uri) = target.parse::<axum::http::Uri>() else {
            continue;
        };
        sent += 1;
        let mut req = Request::builder().method(method).uri(uri);
        for _ in 0..rng.below(5) {
            let name = header_names[rng.below(header_names.len())];
            let value = match (name, rng.below(3)) {
                ("authorization", 0) => format!("Bearer {ADMIN}"),
                _ => input(&mut rng),
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                req = req.header(name, v);
            }
        }
        let body = if rng.below(5) == 0 {
            "[1,2]".to_string()
        } else if rng.below(3) == 0 {
            // A table definition with fuzzed fields.
            format!(
                r#"{{"source":"{}","commitInterval":"{}","partitionBy":["{}"]}}"#,
                input(&mut rng),
                rng.pick(&["1s", "0s", "", "1h", "x"]),
                input(&mut rng)
            )
        } else {
            input(&mut rng)
        };
        let req = req.body(Body::from(body)).expect("request");
        let resp = tower_service::Service::call(&mut app.clone(), req)
            .await
            .expect("infallible");
        *by_status.entry(resp.status().as_u16()).or_default() += 1;
        assert!(
            resp.status().as_u16() < 500,
            "{} for a fuzzed request",
            resp.status()
        );
        // Drain bodies so SSE tasks end.
        let _ = tokio::time::timeout(
            Duration::from_millis(50),
            axum::body::to_bytes(resp.into_body(), 1 << 20),
        )
        .await;
    }
    eprintln!("router: {sent} requests, by status {by_status:?}");
    // The harness reaches past the parsers: some requests are served.
    assert!(by_status.keys().any(|s| *s < 300), "{by_status:?}");
}
