//! The writers' HTTP/1.1 connection: requests written as one buffer, responses parsed
//! with `httparse` in the writer's own task.
//!
//! Why not hyper here: on the 2-core benchmark machine the client shares the cores
//! with the server under test, so every microsecond the client spends per request is
//! taken from the server. hyper's client splits a request over two tasks (the
//! `SendRequest` handle and the connection future, joined by a channel and a oneshot)
//! and builds a `Request` and a `HeaderMap` per send; a profile of `picomq bench`
//! at 15,000 appends/s showed that machinery at about half of the client's user CPU.
//! A writer sends one request at a time and needs only the status, so this does just
//! that: no pipelining, keep-alive, bodies framed by `Content-Length` or `chunked`
//! (or the end of the connection), `Connection: close` honoured.

use std::io::Write as _;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BenchError;

/// Longest response head accepted.
const HEAD_MAX: usize = 64 << 10;
/// Headers parsed per response, at most.
const HEADERS_MAX: usize = 64;
/// A connection idle this long is checked for a close by the server (Node closes
/// idle keep-alive connections after 5 s) before it carries the next request.
const IDLE_CHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

pub struct H1 {
    addr: SocketAddr,
    authority: String,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    /// Bytes read and not yet consumed: `buf[pos..filled]`.
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
    /// When the last response ended.
    last_used: std::time::Instant,
}

/// How a response's body ends.
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

impl H1 {
    pub fn new(addr: SocketAddr, authority: &str) -> H1 {
        H1 {
            addr,
            authority: authority.to_string(),
            stream: None,
            out: Vec::with_capacity(4096),
            buf: vec![0; 16 << 10],
            pos: 0,
            filled: 0,
            last_used: std::time::Instant::now(),
        }
    }

    /// Connects now rather than on the first request.
    pub async fn establish(&mut self) -> Result<(), BenchError> {
        if self.stream.is_some() && self.last_used.elapsed() >= IDLE_CHECK_AFTER {
            // Closed by the server while idle (or sending what nobody asked for):
            // start afresh rather than lose the next request to it.
            let mut probe = [0u8; 1];
            let stream = self.stream.as_ref().expect("checked");
            if !matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            {
                self.stream = None;
            }
        }
        if self.stream.is_none() {
            let tcp = TcpStream::connect(self.addr)
                .await
                .map_err(|e| BenchError::Connect(format!("{}: {e}", self.addr)))?;
            let _ = tcp.set_nodelay(true);
            self.stream = Some(tcp);
            self.pos = 0;
            self.filled = 0;
        }
        Ok(())
    }

    /// POSTs `body` and returns the response's status once its body was read.
    pub async fn post(
        &mut self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<u16, BenchError> {
        self.establish().await?;
        let result = self.exchange(path, content_type, body).await;
        self.last_used = std::time::Instant::now();
        if !matches!(result, Ok((_, true))) {
            // An error, or the server asked to close: the next request reconnects.
            self.stream = None;
        }
        result.map(|(status, _)| status)
    }

    /// One request and its response; `true` when the connection can be reused.
    async fn exchange(
        &mut self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(u16, bool), BenchError> {
        self.out.clear();
        let _ = write!(
            self.out,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.authority,
            body.len()
        );
        self.out.extend_from_slice(body);
        let stream = self.stream.as_mut().expect("established above");
        stream.write_all(&self.out).await.map_err(request_error)?;
        loop {
            let (status, framing, keep_alive, head_len) = self.read_head().await?;
            self.pos += head_len;
            if (100..200).contains(&status) {
                continue; // 100 Continue and other interim answers precede the real one
            }
            let reusable = match framing {
                Framing::Length(n) => {
                    self.skip(n).await?;
                    keep_alive
                }
                Framing::Chunked => {
                    self.skip_chunked().await?;
                    keep_alive
                }
                Framing::Close => {
                    // Discarded as it comes: a long body must not grow the buffer.
                    loop {
                        self.pos = self.filled;
                        if !self.fill().await? {
                            break;
                        }
                    }
                    false
                }
            };
            return Ok((status, reusable));
        }
    }

    /// Reads until a whole response head is buffered; returns the status, the body's
    /// framing, whether the connection stays open, and the head's length.
    async fn read_head(&mut self) -> Result<(u16, Framing, bool, usize), BenchError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf[self.pos..self.filled]) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let status = resp.code.unwrap_or(0);
                    let mut framing = None;
                    let mut keep_alive = resp.version == Some(1);
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let n = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .ok_or_else(|| {
                                    BenchError::Request("invalid Content-Length".into())
                                })?;
                            framing.get_or_insert(Framing::Length(n));
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            if contains_token(h.value, "chunked") {
                                framing = Some(Framing::Chunked);
                            }
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            if contains_token(h.value, "close") {
                                keep_alive = false;
                            } else if contains_token(h.value, "keep-alive") {
                                keep_alive = true;
                            }
                        }
                    }
                    let framing = match status {
                        100..=199 | 204 | 304 => Framing::Length(0),
                        _ => framing.unwrap_or(Framing::Close),
                    };
                    return Ok((status, framing, keep_alive, head_len));
                }
                Ok(httparse::Status::Partial) => {
                    if self.filled - self.pos >= HEAD_MAX {
                        return Err(BenchError::Request("response head too large".into()));
                    }
                    if !self.fill().await? {
                        return Err(BenchError::Request(
                            "connection closed before a response".into(),
                        ));
                    }
                }
                Err(e) => return Err(BenchError::Request(format!("invalid response: {e}"))),
            }
        }
    }

    /// Discards `n` bytes of body.
    async fn skip(&mut self, mut n: usize) -> Result<(), BenchError> {
        loop {
            let take = n.min(self.filled - self.pos);
            self.pos += take;
            n -= take;
            if n == 0 {
                return Ok(());
            }
            if !self.fill().await? {
                return Err(BenchError::Request("connection closed in a body".into()));
            }
        }
    }

    /// Discards a chunked body, trailers included.
    async fn skip_chunked(&mut self) -> Result<(), BenchError> {
        loop {
            let line = self.line().await?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .ok_or_else(|| BenchError::Request("invalid chunk size".into()))?;
            if size == 0 {
                // Trailers, if any, end with an empty line.
                while !self.line().await?.is_empty() {}
                return Ok(());
            }
            self.skip(size).await?;
            if !self.line().await?.is_empty() {
                return Err(BenchError::Request("chunk not followed by CRLF".into()));
            }
        }
    }

    /// The next line (without CRLF), consumed from the buffer.
    async fn line(&mut self) -> Result<Vec<u8>, BenchError> {
        loop {
            let pending = &self.buf[self.pos..self.filled];
            if let Some(i) = pending.windows(2).position(|w| w == b"\r\n") {
                let line = pending[..i].to_vec();
                self.pos += i + 2;
                return Ok(line);
            }
            if pending.len() >= HEAD_MAX {
                return Err(BenchError::Request("chunk line too long".into()));
            }
            if !self.fill().await? {
                return Err(BenchError::Request("connection closed in a body".into()));
            }
        }
    }

    /// Reads more from the socket; `false` at the end of the connection.
    async fn fill(&mut self) -> Result<bool, BenchError> {
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
        } else if self.filled == self.buf.len() {
            self.buf.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
            if self.filled == self.buf.len() {
                let len = self.buf.len();
                self.buf.resize(len * 2, 0);
            }
        }
        let stream = self.stream.as_mut().expect("connected");
        let n = stream
            .read(&mut self.buf[self.filled..])
            .await
            .map_err(request_error)?;
        self.filled += n;
        Ok(n > 0)
    }
}

fn contains_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

fn request_error(e: std::io::Error) -> BenchError {
    BenchError::Request(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each request it reads with the next canned response.
    async fn serve(responses: Vec<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut responses = responses.into_iter();
            while let Ok((mut s, _)) = listener.accept().await {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    // Read one request: head, then Content-Length bytes.
                    let head_end = loop {
                        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                            break Some(i + 4);
                        }
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break None,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    };
                    let Some(head_end) = head_end else { break };
                    let head = String::from_utf8_lossy(&req[..head_end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    while req.len() < head_end + len {
                        let n = s.read(&mut buf).await.unwrap();
                        req.extend_from_slice(&buf[..n]);
                    }
                    req.drain(..head_end + len);
                    let Some(r) = responses.next() else { return };
                    // Written in two parts, to exercise a head split across reads.
                    let (a, b) = r.split_at(r.len() / 2);
                    s.write_all(a).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                    s.write_all(b).await.unwrap();
                    if r.ends_with(b"<close>") {
                        break;
                    }
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn reads_each_framing_and_reuses_or_reopens_the_connection() {
        let addr = serve(vec![
            b"HTTP/1.1 204 No Content\r\nStream-Next-Offset: 1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: t\r\n\r\n",
            b"HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\n\r\nuntil the end<close>",
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let mut c = H1::new(addr, "bench.test");
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(c.post("/s/a", "text/plain", b"body").await.unwrap());
        }
        assert_eq!(statuses, [204, 200, 201, 409, 200, 503]);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Each connection: answer one request, then close it while idle.
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let mut req = Vec::new();
                while !req.ends_with(b"x") {
                    let n = s.read(&mut buf).await.unwrap();
                    req.extend_from_slice(&buf[..n]);
                }
                s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                    .await
                    .unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        let mut c = H1::new(addr, "bench.test");
        assert_eq!(c.post("/s/a", "text/plain", b"x").await.unwrap(), 204);
        tokio::time::sleep(IDLE_CHECK_AFTER + std::time::Duration::from_millis(200)).await;
        assert_eq!(c.post("/s/a", "text/plain", b"x").await.unwrap(), 204);
    }

    #[tokio::test]
    async fn a_broken_answer_is_an_error_and_the_next_request_reconnects() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n",
            b"NOT HTTP AT ALL\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
        ])
        .await;
        let mut c = H1::new(addr, "bench.test");
        let e = c.post("/s/a", "text/plain", b"x").await.unwrap_err();
        assert!(e.to_string().contains("Content-Length"), "{e}");
        let e = c.post("/s/a", "text/plain", b"x").await.unwrap_err();
        assert!(e.to_string().contains("invalid response"), "{e}");
        assert_eq!(c.post("/s/a", "text/plain", b"x").await.unwrap(), 204);
    }
}
