//! The server's own HTTP/1.1 loop (`picomq_http::h1`) against raw sockets: framing
//! of request and response bodies, pipelining, the limits on heads, bodies left
//! unread, clients that leave, HTTP/1.0, the HTTP/2 preface handed to hyper, and
//! random heads, which must never crash it or leave it unable to answer.
//! The behaviour shared with hyper is checked on both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use picomq_engine::shutdown::{ShutdownSignal, ShutdownTrigger};
use picomq_http::server::{serve, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Server {
    addr: String,
    stop: ShutdownTrigger,
    left: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(own: bool) -> Server {
    start_with(ServerOptions {
        own_http1: own,
        header_read_timeout: Duration::from_secs(2),
        header_bytes_max: 8192,
        ..ServerOptions::default()
    })
    .await
}

/// The bytes of the file `/file` and `/mixed` answer from, and the store they are
/// read through (the local directory store, whose long range reads are mappings).
fn file_body() -> Vec<u8> {
    (0..3_000_000u32).map(|i| (i * 13 % 241) as u8).collect()
}

fn files_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("picomq-h1-files-{}", std::process::id()))
}

/// Made on the first request that needs it.
async fn file_store() -> Arc<dyn object_store::ObjectStore> {
    use object_store::ObjectStoreExt;
    static FILES: tokio::sync::OnceCell<Arc<dyn object_store::ObjectStore>> =
        tokio::sync::OnceCell::const_new();
    FILES
        .get_or_init(|| async {
            let store = picomq_engine::store::open_dir(&files_dir()).unwrap();
            store
                .put(
                    &object_store::path::Path::from("packs/f"),
                    file_body().into(),
                )
                .await
                .unwrap();
            store
        })
        .await
        .clone()
}

async fn start_with(options: ServerOptions) -> Server {
    use object_store::ObjectStoreExt;
    let left = Arc::new(AtomicUsize::new(0));
    let waits = left.clone();
    let key = || object_store::path::Path::from("packs/f");
    let app = Router::new()
        .route(
            "/file",
            get(move || async move {
                let store = file_store().await;
                Body::from(store.get_range(&key(), 1000..2_900_000).await.unwrap())
            }),
        )
        .route(
            "/mixed",
            get(move || async move {
                let store = file_store().await;
                let a = store.get_range(&key(), 5..200_005).await.unwrap();
                let b = store.get_range(&key(), 7..70_007).await.unwrap();
                let parts = [
                    bytes::Bytes::from_static(b"head;"),
                    a,
                    bytes::Bytes::from_static(b";mid;"),
                    b.slice(..20_000),
                    b.slice(20_000..),
                    bytes::Bytes::from(vec![b'x'; 20_000]),
                ];
                Body::from_stream(futures::stream::iter(parts.map(Ok::<_, std::io::Error>)))
            }),
        )
        .route(
            "/echo",
            post(|body: Body| async move {
                match picomq_http::request::read_body(body, 1 << 20, Duration::from_secs(2)).await {
                    Ok(bytes) => Response::new(Body::from(bytes)),
                    Err(e) => axum::response::IntoResponse::into_response(e),
                }
            }),
        )
        .route(
            "/ignore",
            post(|| async { (StatusCode::UNAUTHORIZED, "no") }),
        )
        .route("/len", get(|| async { "hello" }))
        .route("/none", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/stream",
            get(|| async {
                let parts = futures::stream::unfold(0, |i| async move {
                    if i == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(format!("part{i};"))),
                        i + 1,
                    ))
                });
                Body::from_stream(parts)
            }),
        )
        .route(
            "/wait",
            get(move || {
                let guard = Dropped(waits.clone());
                async move {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    drop(guard);
                    "late"
                }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal): (ShutdownTrigger, ShutdownSignal) = ShutdownSignal::new();
    let task = tokio::spawn(serve(listener, app, options, signal));
    Server {
        addr,
        stop,
        left,
        task,
    }
}

/// One response read off `tcp`: status, lowercased head, body (by content-length,
/// chunked, or to the end of the connection).
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

struct Conn {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: &str) -> Conn {
        Conn {
            tcp: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.unwrap();
    }

    /// More bytes; `false` at the end of the connection.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk)).await {
            Err(_) => panic!(
                "no answer within 10s; have {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Whether the server closed the connection (reads until it does, for 10 s).
    async fn closed(&mut self) -> bool {
        while self.fill().await {}
        true
    }

    async fn answer(&mut self, head_request: bool) -> Option<Answer> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill().await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end);
        let status: u16 = head[9..12].parse().unwrap();
        let mut answer = Answer {
            status,
            head,
            body: Vec::new(),
        };
        if status == 100 {
            return Some(answer);
        }
        if head_request || status == 204 || status == 304 {
            return Some(answer);
        }
        if let Some(n) = answer.header("content-length") {
            let n: usize = n.parse().unwrap();
            while self.buf.len() < n {
                assert!(self.fill().await, "connection ended inside a body");
            }
            answer.body = self.buf.drain(..n).collect();
        } else if answer
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let eol = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill().await);
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.buf[..eol]).unwrap().trim(),
                    16,
                )
                .unwrap();
                while self.buf.len() < eol + 2 + size + 2 {
                    assert!(self.fill().await);
                }
                answer
                    .body
                    .extend_from_slice(&self.buf[eol + 2..eol + 2 + size]);
                assert_eq!(&self.buf[eol + 2 + size..eol + 4 + size], b"\r\n");
                self.buf.drain(..eol + 4 + size);
                if size == 0 {
                    break;
                }
            }
        } else {
            while self.fill().await {}
            answer.body = std::mem::take(&mut self.buf);
        }
        Some(answer)
    }
}

const GET_LEN: &[u8] = b"GET /len HTTP/1.1\r\nHost: x\r\n\r\n";

#[tokio::test]
async fn mapped_file_ranges_arrive_whole_sent_from_the_file_or_copied() {
    let body = file_body();
    let mut mixed = b"head;".to_vec();
    mixed.extend_from_slice(&body[5..200_005]);
    mixed.extend_from_slice(b";mid;");
    mixed.extend_from_slice(&body[7..70_007]);
    mixed.extend_from_slice(&[b'x'; 20_000]);
    for (own, sendfile) in [(true, true), (true, false), (false, true)] {
        let s = start_with(ServerOptions {
            own_http1: own,
            sendfile,
            ..ServerOptions::default()
        })
        .await;
        let before = picomq_http::h1::sendfile_bytes();
        let mut c = Conn::open(&s.addr).await;
        // Two pipelined: a length-framed answer and a chunked one, each mixing
        // copied slices with mapped ones.
        c.send(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\nGET /mixed HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        // Not read for a moment: the socket's buffer fills and the writer waits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.status, 200, "own={own} sendfile={sendfile}");
        assert!(
            a.body == body[1000..2_900_000],
            "own={own} sendfile={sendfile}: /file differs"
        );
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.header("transfer-encoding").as_deref(), Some("chunked"));
        assert!(
            a.body == mixed,
            "own={own} sendfile={sendfile}: /mixed differs"
        );
        // Still usable afterwards.
        c.send(GET_LEN).await;
        assert_eq!(c.answer(false).await.unwrap().body, b"hello");
        if own && sendfile {
            // The mapped ranges went out from the file: at least the two long ones
            // (other tests may add to the count, never take from it).
            let sent = picomq_http::h1::sendfile_bytes() - before;
            assert!(
                sent >= 2_899_000 + 200_000,
                "{sent} bytes sent with sendfile"
            );
        }
        s.stop.fire();
        s.task.await.unwrap();
    }
    let _ = std::fs::remove_dir_all(files_dir());
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_both_loops() {
    for own in [true, false] {
        let s = start(own).await;
        let mut c = Conn::open(&s.addr).await;
        let mut batch = GET_LEN.to_vec();
        batch
            .extend_from_slice(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde");
        batch.extend_from_slice(b"GET /none HTTP/1.1\r\nHost: x\r\n\r\n");
        batch.extend_from_slice(GET_LEN);
        c.send(&batch).await;
        let a = c.answer(false).await.unwrap();
        assert_eq!(
            (a.status, a.body.as_slice()),
            (200, &b"hello"[..]),
            "own={own}"
        );
        assert!(a.header("date").is_some(), "own={own}");
        let a = c.answer(false).await.unwrap();
        assert_eq!(
            (a.status, a.body.as_slice()),
            (200, &b"abcde"[..]),
            "own={own}"
        );
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.status, 204);
        assert_eq!(a.header("content-length"), None, "own={own}");
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.body, b"hello");
        // Still open: one more.
        c.send(GET_LEN).await;
        assert_eq!(c.answer(false).await.unwrap().status, 200);
        s.stop.fire();
        s.task.await.unwrap();
    }
}

#[tokio::test]
async fn chunked_and_trickled_bodies_are_read_whole() {
    for own in [true, false] {
        let s = start(own).await;
        let mut c = Conn::open(&s.addr).await;
        c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n").await;
        let a = c.answer(false).await.unwrap();
        assert_eq!(
            (a.status, a.body.as_slice()),
            (200, &b"abcde"[..]),
            "own={own}"
        );
        // In pieces across writes, both framings.
        c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwx")
            .await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        c.send(b"yz\r").await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        c.send(b"\n1\r\n!\r\n0\r\n\r\n").await;
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.body, b"wxyz!", "own={own}");
        let body = vec![b'q'; 200_000];
        c.send(
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        for piece in body.chunks(50_000) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.send(piece).await;
        }
        let a = c.answer(false).await.unwrap();
        assert_eq!(a.body, body, "own={own}");
        c.send(GET_LEN).await;
        assert_eq!(c.answer(false).await.unwrap().body, b"hello");
        s.stop.fire();
    }
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body() {
    let s = start(true).await;
    let mut c = Conn::open(&s.addr).await;
    c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        .await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.status, 100);
    c.send(b"ping").await;
    let a = c.answer(false).await.unwrap();
    assert_eq!((a.status, a.body.as_slice()), (200, &b"ping"[..]));
    c.send(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.status, 417);
    assert!(c.closed().await);
}

/// Each bad head gets its status and a JSON error, and the connection closes; the
/// server answers the next connection.
#[tokio::test]
async fn malformed_framing_and_oversized_heads_are_refused() {
    let s = start(true).await;
    let many_headers: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (
            b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.1\r\nContent-Length: 3x\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            501,
        ),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            400,
        ),
        (b"GET /len HTTP/2.0\r\n\r\n".to_vec(), 400),
        (b"G@T /len HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"GET /len HTTP/1.1\r\nBad Name: y\r\n\r\n".to_vec(), 400),
        (
            format!("GET /len HTTP/1.1\r\n{many_headers}\r\n").into_bytes(),
            431,
        ),
        (
            format!("GET /len HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(9000)).into_bytes(),
            431,
        ),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            400,
        ),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n".to_vec(),
            400,
        ),
    ];
    for (request, status) in cases {
        let mut c = Conn::open(&s.addr).await;
        c.send(&request).await;
        let shown = String::from_utf8_lossy(&request[..request.len().min(60)]).into_owned();
        let a = c
            .answer(false)
            .await
            .unwrap_or_else(|| panic!("no answer to {shown:?}"));
        assert_eq!(a.status, status, "{shown:?}: {}", a.head);
        let error: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert!(error["error"]["message"].is_string(), "{shown:?}");
        assert!(c.closed().await);
    }
    let mut c = Conn::open(&s.addr).await;
    c.send(GET_LEN).await;
    assert_eq!(c.answer(false).await.unwrap().body, b"hello");
}

/// A handler that answers without reading the body: a small remainder is read past
/// and the connection goes on; a large one closes it.
#[tokio::test]
async fn bodies_left_unread_are_drained_or_end_the_connection() {
    let s = start(true).await;
    let mut c = Conn::open(&s.addr).await;
    let body = vec![b'z'; 100_000];
    c.send(
        format!(
            "POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    c.send(&body[..10]).await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.status, 401);
    c.send(&body[10..]).await;
    c.send(GET_LEN).await;
    assert_eq!(c.answer(false).await.unwrap().body, b"hello");

    let mut c = Conn::open(&s.addr).await;
    c.send(b"POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\nabc")
        .await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.status, 401);
    assert_eq!(a.header("connection").as_deref(), None);
    assert!(c.closed().await);
}

#[tokio::test]
async fn head_and_http_1_0_answers_are_framed_for_their_clients() {
    let s = start(true).await;
    let mut c = Conn::open(&s.addr).await;
    c.send(b"HEAD /len HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let a = c.answer(true).await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-length").as_deref(), Some("5"));
    // No body bytes were sent: the next answer parses.
    c.send(GET_LEN).await;
    assert_eq!(c.answer(false).await.unwrap().body, b"hello");

    // A streamed body: chunked for HTTP/1.1 ...
    c.send(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.header("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(a.body, b"part0;part1;part2;");

    // ... delimited by the end of the connection for HTTP/1.0, which is closed by
    // default and kept open when asked.
    let mut c = Conn::open(&s.addr).await;
    c.send(b"GET /stream HTTP/1.0\r\n\r\n").await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.header("transfer-encoding"), None);
    assert_eq!(a.body, b"part0;part1;part2;");
    let mut c = Conn::open(&s.addr).await;
    c.send(b"GET /len HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.header("connection").as_deref(), Some("keep-alive"));
    c.send(b"GET /len HTTP/1.0\r\n\r\n").await;
    let a = c.answer(false).await.unwrap();
    assert_eq!(a.body, b"hello");
    assert!(c.closed().await);
}

#[tokio::test]
async fn a_client_that_leaves_a_waiting_read_ends_it() {
    let s = start(true).await;
    let mut c = Conn::open(&s.addr).await;
    c.send(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.left.load(Ordering::SeqCst), 0);
    drop(c);
    let started = std::time::Instant::now();
    while s.left.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the read outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn idle_and_slow_heads_are_cut_off_and_shutdown_closes_idle_connections() {
    let s = start(true).await;
    // Says nothing: closed after the header read timeout (2 s here).
    let started = std::time::Instant::now();
    let mut idle = Conn::open(&s.addr).await;
    assert!(idle.closed().await);
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    // Busy for longer than the timeout, then idle: still closed in time.
    let mut busy = Conn::open(&s.addr).await;
    let started = std::time::Instant::now();
    let mut quiet = started;
    while started.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        busy.send(GET_LEN).await;
        assert_eq!(busy.answer(false).await.unwrap().status, 200);
        // The server's wait for the next head began before this.
        quiet = std::time::Instant::now();
    }
    assert!(busy.closed().await);
    let took = quiet.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );

    let mut kept = Conn::open(&s.addr).await;
    kept.send(GET_LEN).await;
    assert_eq!(kept.answer(false).await.unwrap().status, 200);
    let started = std::time::Instant::now();
    s.stop.fire();
    assert!(kept.closed().await);
    assert!(started.elapsed() < Duration::from_secs(1));
    s.task.await.unwrap();
}

#[tokio::test]
async fn the_http2_preface_is_served_by_hyper() {
    let s = start(true).await;
    let mut c = Conn::open(&s.addr).await;
    // The preface in two writes, then an empty SETTINGS frame.
    c.send(b"PRI * HTTP/2.0\r\n").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.send(b"\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await;
    while c.buf.len() < 9 {
        assert!(c.fill().await, "closed before a frame");
    }
    assert_eq!(c.buf[3], 4, "the server's first frame is SETTINGS");
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random heads built from troublesome pieces: every one is answered with a status
/// below 500 or closed, and the server keeps answering.
#[tokio::test]
async fn random_heads_never_break_the_loop() {
    let s = start(true).await;
    let seed = fastrand::u64(1..);
    let mut rng = Rng(seed);
    let pieces: &[&[u8]] = &[
        b"GET ",
        b"POST ",
        b"HEAD ",
        b"/echo",
        b"/len",
        b" HTTP/1.1",
        b" HTTP/1.0",
        b"\r\n",
        b"\n",
        b"\r",
        b":",
        b"Content-Length: ",
        b"Transfer-Encoding: ",
        b"chunked",
        b"0",
        b"5",
        b"ffffffffffffffffff",
        b"-1",
        b",",
        b" ",
        b"\t",
        b"\0",
        b"\xff",
        b"Expect: ",
        b"100-continue",
        b"Connection: ",
        b"close",
        b"keep-alive",
        b"X: y",
        b"%00",
        b"?a=b",
    ];
    for _ in 0..300 {
        let mut request = Vec::new();
        for _ in 0..rng.below(24) + 1 {
            request.extend_from_slice(pieces[rng.below(pieces.len())]);
        }
        request.extend_from_slice(b"\r\n\r\n");
        let mut c = Conn::open(&s.addr).await;
        let _ = c.tcp.write_all(&request).await;
        let _ = c.tcp.shutdown().await;
        if let Some(a) = c.answer(false).await {
            assert!(
                a.status < 500 || a.status == 501 || a.status == 505,
                "seed {seed}: {:?} -> {}",
                String::from_utf8_lossy(&request),
                a.head
            );
        }
    }
    let mut c = Conn::open(&s.addr).await;
    c.send(GET_LEN).await;
    assert_eq!(c.answer(false).await.unwrap().body, b"hello", "seed {seed}");
}
