//! Abuse limits against the real binary: slow-loris senders (headers or body
//! trickled), idle connections and oversized heads are cut off in bounded time; rate
//! limits per client IP and per token answer 429 with Retry-After; live readers are
//! capped per stream and per token.

use picomq_testkit as support;

use std::time::{Duration, Instant};

use picomq_client::HttpMethod;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection (or `limit` passes); returns what was
/// read and how long it took.
async fn read_until_closed(tcp: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), tcp.read(&mut buf)).await {
            Err(_) => panic!(
                "connection still open after {limit:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    started.elapsed(),
                )
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn slow_and_idle_clients_are_cut_off() {
    let dir = TempDir::new("slowloris");
    let s = Server::start(
        dir.path(),
        &[
            "--header-read-timeout",
            "1s",
            "--body-read-timeout",
            "1s",
            "--max-header-bytes",
            "16384",
        ],
    )
    .await;
    s.client
        .put("/s", &[("content-type", "text/plain")], "")
        .await
        .unwrap();
    let addr = format!("127.0.0.1:{}", s.port);

    // Connects and says nothing.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let (_, took) = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );

    // One request, then an idle keep-alive connection: answered, then closed.
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (got, took) = read_until_closed(&mut kept, Duration::from_secs(5)).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );

    // Trickles a request head, one header line every 200ms, forever.
    let mut trickle = TcpStream::connect(&addr).await.unwrap();
    trickle
        .write_all(b"GET /s?offset=-1 HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (mut rd, mut wr) = trickle.into_split();
    let writer = tokio::spawn(async move {
        for i in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr
                .write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
                .await
                .is_err()
            {
                return i;
            }
        }
        100
    });
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a trickled head was not cut off within 5s");
    assert!(started.elapsed() < Duration::from_secs(4));
    writer.abort();

    // A complete head, then a body trickled a byte at a time: 408, connection closed.
    let mut body = TcpStream::connect(&addr).await.unwrap();
    body.write_all(
        b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n",
    )
    .await
    .unwrap();
    let (mut rd, mut wr) = body.into_split();
    let writer = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr.write_all(b"x").await.is_err() {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let started = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("body_timeout"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    writer.abort();
    // Nothing of the partial body was appended.
    let r = s.client.get("/s?offset=-1").await.unwrap();
    assert_eq!(r.body.len(), 0);

    // An oversized head: refused, never served.
    let mut big = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "GET /s HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let _ = big.write_all(head.as_bytes()).await;
    let (got, _) = read_until_closed(&mut big, Duration::from_secs(5)).await;
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 431"), "{got}");

    // The server is still fine.
    assert_eq!(s.client.get("/healthz").await.unwrap().status.as_u16(), 200);
}

#[tokio::test]
async fn rate_limits_per_ip_answer_429_with_retry_after() {
    let dir = TempDir::new("ratelimit-ip");
    let s = Server::start(
        dir.path(),
        &["--rate-limit-ip", "5", "--rate-limit-burst", "5"],
    )
    .await;
    // The readiness probe spent some of the bucket; let it refill.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut statuses = Vec::new();
    let mut refused = None;
    for _ in 0..20 {
        let r = s.client.get("/healthz").await.unwrap();
        statuses.push(r.status.as_u16());
        if r.status.as_u16() == 429 {
            refused = Some(r);
        }
    }
    assert!(statuses[..5].iter().all(|s| *s == 200), "{statuses:?}");
    let r = refused.unwrap_or_else(|| panic!("never limited: {statuses:?}"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "rate_limited");
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(s.client.get("/healthz").await.unwrap().status.as_u16(), 200);
}

/// Statuses of `n` quick `GET /healthz`, each with this `X-Forwarded-For` (if any).
async fn healthz_as(s: &Server, forwarded: Option<&str>, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let headers: Vec<(&str, &str)> = forwarded
            .map(|f| vec![("x-forwarded-for", f)])
            .unwrap_or_default();
        let r = s
            .client
            .send(HttpMethod::GET, "/healthz", &headers, "")
            .await
            .unwrap();
        statuses.push(r.status.as_u16());
    }
    statuses
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket() {
    let dir = TempDir::new("ratelimit-proxy");
    let s = Server::start(
        dir.path(),
        &[
            "--rate-limit-ip",
            "5",
            "--rate-limit-burst",
            "5",
            "--trusted-proxies",
            "192.0.2.0/24,127.0.0.1",
        ],
    )
    .await;
    let a = healthz_as(&s, Some("203.0.113.1"), 10).await;
    assert!(
        a[..5].iter().all(|s| *s == 200) && a.contains(&429),
        "{a:?}"
    );
    // Another client behind the same proxy, and one whose proxy chain passes
    // through another trusted proxy: their own buckets.
    assert_eq!(healthz_as(&s, Some("203.0.113.2"), 1).await, [200]);
    assert_eq!(
        healthz_as(&s, Some("203.0.113.3, 192.0.2.7"), 1).await,
        [200]
    );
    // What a client writes to the left of the real address changes nothing.
    assert_eq!(
        healthz_as(&s, Some("198.51.100.1, 203.0.113.1"), 1).await,
        [429]
    );
    drop(s);

    // Without --trusted-proxies the header is ignored: one bucket, the TCP peer's.
    let dir = TempDir::new("ratelimit-no-proxy");
    let s = Server::start(
        dir.path(),
        &["--rate-limit-ip", "5", "--rate-limit-burst", "5"],
    )
    .await;
    let a = healthz_as(&s, Some("203.0.113.1"), 10).await;
    assert!(a.contains(&429), "{a:?}");
    assert_eq!(healthz_as(&s, Some("203.0.113.2"), 1).await, [429]);
}

#[tokio::test]
async fn rate_limits_per_token_are_separate_buckets() {
    let dir = TempDir::new("ratelimit-token");
    let s = start_with_auth(
        dir.path(),
        &["--rate-limit-token", "3", "--rate-limit-burst", "3"],
    )
    .await;
    let (_, a) = issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read"] })).await;
    let (_, b) = issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read"] })).await;
    let get = |secret: String| {
        let s = &s;
        async move {
            s.client
                .send(
                    HttpMethod::GET,
                    "/__picomq/streams",
                    &[("authorization", &bearer(&secret))],
                    "",
                )
                .await
                .unwrap()
                .status
                .as_u16()
        }
    };
    let mut a_statuses = Vec::new();
    for _ in 0..10 {
        a_statuses.push(get(a.clone()).await);
    }
    assert!(a_statuses.contains(&429), "{a_statuses:?}");
    assert_eq!(
        get(b.clone()).await,
        200,
        "another token has its own bucket"
    );
}

/// Waits until `n` live readers are parked (the engine's gauge in /metrics).
async fn wait_parked(s: &Server, n: u64) {
    eventually(Duration::from_secs(5), || async {
        let parked = metric_as(&s.client, Some(ADMIN_SECRET), "picomq_waiting_reads").await;
        (parked as u64 == n).then_some(())
    })
    .await
}

#[tokio::test]
async fn live_readers_are_capped_per_stream_and_per_token() {
    let dir = TempDir::new("live-caps");
    let s = start_with_auth(
        dir.path(),
        &[
            "--max-live-readers-per-stream",
            "2",
            "--max-live-readers-per-token",
            "3",
            "--long-poll-timeout",
            "3s",
        ],
    )
    .await;
    let admin = bearer(ADMIN_SECRET);
    for name in ["/a", "/b", "/c"] {
        s.client
            .put(
                name,
                &[("authorization", &admin), ("content-type", "text/plain")],
                "",
            )
            .await
            .unwrap();
    }
    let (_, t) = issue_token(&s.client, ADMIN_SECRET, json!({ "scopes": ["read"] })).await;
    let t = bearer(&t);
    let poll = |path: &'static str, auth: String| {
        let client = s.client.clone();
        tokio::spawn(async move {
            client
                .send(
                    HttpMethod::GET,
                    &format!("{path}?offset=now&live=long-poll"),
                    &[("authorization", &auth)],
                    "",
                )
                .await
                .unwrap()
        })
    };
    // Two waiting on /a: the third is refused.
    let a1 = poll("/a", admin.clone());
    let a2 = poll("/a", t.clone());
    wait_parked(&s, 2).await;
    let r = s
        .client
        .send(
            HttpMethod::GET,
            "/a?offset=now&live=long-poll",
            &[("authorization", &admin)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 429, "{}", r.text());
    assert!(r.text().contains("too_many_live_readers"));
    assert!(r.header("retry-after").is_some());
    // Catch-up reads are not live readers: still served.
    let r = s
        .client
        .send(
            HttpMethod::GET,
            "/a?offset=-1",
            &[("authorization", &admin)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    // Token t holds one slot (on /a); two more on /b and /c fill its three.
    let b1 = poll("/b", t.clone());
    let c1 = poll("/c", t.clone());
    wait_parked(&s, 4).await;
    let r = s
        .client
        .send(
            HttpMethod::GET,
            "/c?offset=now&live=long-poll",
            &[("authorization", &t)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 429, "{}", r.text());
    // Data wakes the readers on /a; their slots are released.
    let r = s
        .client
        .post(
            "/a",
            &[("authorization", &admin), ("content-type", "text/plain")],
            "wake",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    for h in [a1, a2] {
        assert_eq!(h.await.unwrap().status.as_u16(), 200);
    }
    let r = s
        .client
        .send(
            HttpMethod::GET,
            "/a?offset=-1&live=long-poll",
            &[("authorization", &admin)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    for h in [b1, c1] {
        assert_eq!(h.await.unwrap().status.as_u16(), 204);
    }
}

/// An SSE reader whose client goes away gives its slot back (and leaves the live
/// readers gauge) while its stream is quiet: nothing is written to notice it by.
#[tokio::test]
async fn an_sse_reader_that_goes_away_frees_its_slot() {
    let dir = TempDir::new("sse-leaves");
    let s = start_with_auth(dir.path(), &["--max-live-readers-per-stream", "1"]).await;
    let admin = bearer(ADMIN_SECRET);
    let auth = [("authorization", admin.as_str())];
    s.client
        .put(
            "/q",
            &[("authorization", &admin), ("content-type", "text/plain")],
            "",
        )
        .await
        .unwrap();
    let open = || {
        s.client
            .open(HttpMethod::GET, "/q?offset=now&live=sse", &auth, "")
    };
    let mut first = open().await.unwrap();
    assert_eq!(first.status.as_u16(), 200);
    // Its first control event: the reader is running and holds the slot.
    let chunk = tokio::time::timeout(Duration::from_secs(5), first.next_chunk())
        .await
        .expect("first event")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&chunk).contains("event: control"));
    assert_eq!(
        metric_as(&s.client, Some(ADMIN_SECRET), "picomq_live_readers").await,
        1.0
    );
    let r = open().await.unwrap();
    assert_eq!(r.status.as_u16(), 429);
    drop(r);

    drop(first);
    eventually(Duration::from_secs(5), || async {
        let n = metric_as(&s.client, Some(ADMIN_SECRET), "picomq_live_readers").await;
        (n == 0.0).then_some(())
    })
    .await;
    let second = open().await.unwrap();
    assert_eq!(second.status.as_u16(), 200);
}
