//! PicoMQ's own HTTP/1.1 connection loop, for plain-TCP connections (TLS and HTTP/2
//! stay on hyper: `server`). It parses request heads with `httparse`, hands each
//! request to the same service as hyper would (one router, one authorization path),
//! and writes the response itself.
//!
//! Why: the per-request cost of the HTTP stack in user space was PicoMQ's whole gap
//! to a server with a loop of its own (docs/performance.md, "The HTTP floor"). What
//! this loop saves against hyper's: a timer armed and cancelled for every request
//! head (here one lazily re-armed deadline per connection), a dispatcher with its
//! own task-switching state machine, a watch for EOF during every append, and the
//! allocation of a fresh read buffer per request.
//!
//! What it does, and the limits it keeps:
//! - Request heads of at most `header_bytes_max` bytes and [`HEADERS_MAX`] headers
//!   (431 past either), arriving within `header_read_timeout` of the previous
//!   response (or the connection); an idle keep-alive connection is closed after it.
//! - Bodies framed by `Content-Length` or `Transfer-Encoding: chunked` (any other
//!   coding: 501; both, or conflicting lengths: 400). `Expect: 100-continue` is
//!   answered before a body that has not arrived yet is read.
//! - A body already in the read buffer is handed over as one slice; a larger one is
//!   streamed from the socket as the handler reads it (its deadline is the
//!   handler's, `request::read_body`). A body left partly unread is drained, up to
//!   [`DRAIN_AFTER_MAX`] bytes, so the connection stays usable and the client sees
//!   its answer rather than a reset; past that the connection closes.
//! - Responses with a known length get `content-length`, others are chunked (or, for
//!   an HTTP/1.0 client, end with the connection). HEAD, 1xx, 204 and 304 carry no body.
//! - Response slices are written with `writev`, except those of [`SENDFILE_FROM`]
//!   bytes or more that are mapped ranges of the local store's files: those go with
//!   `sendfile` of the file's range, the socket corked meanwhile (`--http1-sendfile`).
//! - Pipelined requests are answered in order. A client that closes its side while
//!   a GET is answered (a live read waiting for data) ends that request.
//! - On shutdown an idle connection closes at once; a busy one after its response,
//!   which then says `connection: close`.
//! - A connection that opens with the HTTP/2 preface is handed to hyper (prior
//!   knowledge, as before).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::{Body, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, Request, Response, StatusCode, Uri, Version};
use axum::response::IntoResponse;
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::error::ApiError;

/// Headers a request head may carry (hyper's default too).
pub const HEADERS_MAX: usize = 100;
/// Unread request body the loop reads and drops after a response to keep the
/// connection; a larger remainder closes it.
pub const DRAIN_AFTER_MAX: u64 = 1 << 20;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 8 * 1024;
/// Bytes of a streamed body read from the socket at a time.
const BODY_READ_CHUNK: usize = 64 * 1024;
/// Longest chunk-size line of a chunked body (size and extensions), and all of its
/// trailers together.
const CHUNK_LINE_MAX: usize = 4096;
const TRAILERS_MAX: usize = 16 * 1024;
/// Response bytes gathered from a body before they are written.
const WRITE_GATHER_MAX: usize = 1024 * 1024;
/// Slices in one `writev`.
const IOV_MAX: usize = 64;
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// After closing with an answer: how long, and how many bytes, the client's unread
/// request is read and dropped.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES_MAX: usize = 1 << 20;

/// Response slices at least this long are sent with `sendfile` when they are a
/// mapped range of a file; shorter ones cost less to copy than a system call each.
pub const SENDFILE_FROM: usize = 16 * 1024;

/// Response bytes sent with `sendfile` since the process started
/// (`picomq_http_sendfile_bytes_total`).
pub fn sendfile_bytes() -> u64 {
    SENDFILE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}
static SENDFILE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A response slice queued for the socket, and where in a file it lies when the
/// kernel can send it from there.
struct Piece {
    data: Bytes,
    file: Option<(std::os::fd::RawFd, u64)>,
}

impl Piece {
    fn new(data: Bytes) -> Piece {
        Piece { data, file: None }
    }

    fn advance(&mut self, n: usize) {
        self.data.advance(n);
        if let Some((_, offset)) = &mut self.file {
            *offset += n as u64;
        }
    }
}

/// Sets `TCP_CORK` (best effort: a socket that refuses it is only less efficient).
fn set_cork(wr: &OwnedWriteHalf, on: bool) {
    use std::os::fd::AsRawFd;
    let sock: &TcpStream = wr.as_ref();
    let v: libc::c_int = on.into();
    // SAFETY: a valid socket and a pointer to an int of the size given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// `sendfile` of up to `len` bytes of `fd` from `offset` to the socket, when it
/// can take them. The descriptor is the caller's to keep open (it holds the
/// mapping that names it).
fn poll_sendfile(
    wr: &OwnedWriteHalf,
    cx: &mut Context<'_>,
    fd: std::os::fd::RawFd,
    offset: u64,
    len: usize,
) -> Poll<io::Result<usize>> {
    use std::os::fd::AsRawFd;
    let sock: &TcpStream = wr.as_ref();
    loop {
        ready!(sock.poll_write_ready(cx))?;
        let sent = sock.try_io(tokio::io::Interest::WRITABLE, || {
            let mut off = libc::off_t::try_from(offset).map_err(io::Error::other)?;
            // SAFETY: both descriptors are open (the socket is ours, the file is
            // held by the mapping the queued slice keeps alive); `off` is a valid
            // pointer for the call.
            let n = unsafe { libc::sendfile(sock.as_raw_fd(), fd, &mut off, len) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                SENDFILE_BYTES.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                return Poll::Ready(Ok(n));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// What the loop needs from the server around it.
pub struct Limits {
    pub header_read_timeout: Duration,
    pub header_bytes_max: usize,
    pub peer_address: bool,
    /// Response slices that are mapped ranges of the local store's files go to the
    /// socket with `sendfile` (`picomq_engine::store::mapped::source`).
    pub sendfile: bool,
}

/// How a connection ended.
pub enum Ended {
    Done,
    /// It opened with the HTTP/2 preface: the socket and what was read of it, for
    /// hyper to serve.
    Http2(TcpStream, Bytes),
}

/// Serves HTTP/1.1 requests on `tcp` until the client closes it, a limit closes it,
/// or `draining` (which registers the task to be woken) says the server is stopping.
pub async fn serve<S>(
    tcp: TcpStream,
    peer: SocketAddr,
    app: S,
    limits: &Limits,
    draining: impl FnMut(&mut Context<'_>) -> bool,
) -> Ended
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    let (rd, wr) = tcp.into_split();
    let mut conn = Conn {
        reader: Some(Reader::new(rd)),
        wr,
        head: Vec::new(),
        scanned: 0,
        waiting_since: Instant::now(),
        deadline: Box::pin(tokio::time::sleep(limits.header_read_timeout)),
        first: true,
        closing: false,
        sendfile: limits.sendfile,
    };
    if let Next::Http2 = requests(&mut conn, peer, app, limits, draining).await {
        return match conn.reader.take().map(|r| (r.rd.reunite(conn.wr), r.buf)) {
            Some((Ok(tcp), read)) => Ended::Http2(tcp, read.freeze()),
            _ => Ended::Done,
        };
    }
    if conn.closing {
        // Closed by this side after an answer: what the client still sends is read
        // and dropped for a moment, so that the close does not reset the connection
        // under an answer the client has not read yet.
        if let Some(mut reader) = conn.reader.take() {
            let _ = tokio::time::timeout(LINGER, async {
                let mut seen = 0usize;
                while seen < LINGER_BYTES_MAX {
                    reader.buf.clear();
                    match std::future::poll_fn(|cx| reader.poll_fill(cx, READ_CHUNK)).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen += n,
                    }
                }
            })
            .await;
        }
    }
    Ended::Done
}

enum Next {
    Done,
    Http2,
}

async fn requests<S>(
    conn: &mut Conn,
    peer: SocketAddr,
    app: S,
    limits: &Limits,
    mut draining: impl FnMut(&mut Context<'_>) -> bool,
) -> Next
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    loop {
        let parsed =
            match std::future::poll_fn(|cx| conn.poll_head(cx, limits, &mut draining)).await {
                Ok(HeadRead::Head(parsed)) => parsed,
                Ok(HeadRead::Http2) => return Next::Http2,
                Ok(HeadRead::Closed) => return Next::Done,
                Err(refusal) => {
                    let _ = conn
                        .respond(
                            refusal.into_response(),
                            &Method::GET,
                            false,
                            Version::HTTP_11,
                            false,
                        )
                        .await;
                    return Next::Done;
                }
            };
        conn.first = false;
        let Parsed {
            mut request,
            framing,
            keep_alive,
            continue_expected,
        } = parsed;
        if limits.peer_address {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let method = request.method().clone();
        let version = request.version();
        // A live read can wait for minutes: a client that leaves ends it. An append
        // runs to its end whether or not its client stays.
        let watch_eof = method == Method::GET || method == Method::HEAD;

        // The body: already read, streamed from the socket, or none.
        let Some(mut reader) = conn.reader.take() else {
            return Next::Done;
        };
        let mut home = None;
        match framing {
            Framing::Length(n) if (reader.buf.len() as u64) >= n => {
                if n > 0 {
                    *request.body_mut() = Body::from(reader.buf.split_to(n as usize).freeze());
                }
                conn.reader = Some(reader);
            }
            framing => {
                if continue_expected
                    && conn
                        .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                        .await
                        .is_err()
                {
                    return Next::Done;
                }
                reader.framing = framing;
                reader.chunk = Chunk::Size;
                reader.trailer_bytes = 0;
                let slot = Arc::new(Mutex::new(None));
                *request.body_mut() = Body::new(StreamedBody {
                    reader: Some(reader),
                    home: slot.clone(),
                });
                home = Some(slot);
            }
        }

        let mut app = app.clone();
        let call = tower_service::Service::call(&mut app, request);
        let response = match conn.until_done(call, watch_eof).await {
            Some(Ok(response)) => response,
            Some(Err(never)) => match never {},
            None => return Next::Done,
        };

        let mut keep = keep_alive && !draining_now(&mut draining);
        if let Some(v) = response.headers().get(header::CONNECTION) {
            if has_token(v.as_bytes(), b"close") {
                keep = false;
            }
        }
        // The reader, back from a streamed body. Still held (the body outlived the
        // request in some task): the connection cannot go on.
        if let Some(slot) = home {
            conn.reader = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if conn.reader.is_none() {
                keep = false;
            }
        }
        if !matches!(
            conn.respond(response, &method, keep, version, watch_eof)
                .await,
            Ok(true)
        ) || !keep
        {
            return Next::Done;
        }
        if !conn.finish_body(limits).await {
            return Next::Done;
        }
        conn.waiting_since = Instant::now();
    }
}

/// Whether the server is stopping, without registering to be told.
fn draining_now(draining: &mut impl FnMut(&mut Context<'_>) -> bool) -> bool {
    draining(&mut Context::from_waker(std::task::Waker::noop()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// Bytes of the body still to come.
    Length(u64),
    Chunked,
    /// Read to its end (or no body).
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

/// The socket's read side, what was read ahead of the parser, and where the body of
/// the current request stands.
struct Reader {
    rd: OwnedReadHalf,
    buf: BytesMut,
    framing: Framing,
    chunk: Chunk,
    trailer_bytes: usize,
    /// A body that could not be read to its end (malformed, or the client left):
    /// the connection's framing is lost.
    broken: bool,
}

enum Step {
    Data(Bytes),
    Again,
    End,
}

impl Reader {
    fn new(rd: OwnedReadHalf) -> Reader {
        Reader {
            rd,
            buf: BytesMut::new(),
            framing: Framing::Done,
            chunk: Chunk::Size,
            trailer_bytes: 0,
            broken: false,
        }
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>, chunk: usize) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(chunk);
        }
        let spare = self.buf.spare_capacity_mut();
        let mut rb = ReadBuf::uninit(spare);
        ready!(Pin::new(&mut self.rd).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        Poll::Ready(Ok(n))
    }

    /// The next piece of the body: `Some(bytes)`, or `None` at its end.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let r = self.poll_body_inner(cx);
        if let Poll::Ready(Err(_)) = r {
            self.broken = true;
            self.framing = Framing::Done;
        }
        r
    }

    fn poll_body_inner(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        loop {
            match self.framing {
                Framing::Done => return Poll::Ready(Ok(None)),
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    return Poll::Ready(Ok(None));
                }
                Framing::Length(rem) => {
                    if !self.buf.is_empty() {
                        let n = rem.min(self.buf.len() as u64);
                        self.framing = match rem - n {
                            0 => Framing::Done,
                            left => Framing::Length(left),
                        };
                        return Poll::Ready(Ok(Some(self.buf.split_to(n as usize).freeze())));
                    }
                    if ready!(self.poll_fill(cx, BODY_READ_CHUNK))? == 0 {
                        return Poll::Ready(Err(early_end()));
                    }
                }
                Framing::Chunked => match self.decode_chunk()? {
                    Some(Step::Data(data)) => return Poll::Ready(Ok(Some(data))),
                    Some(Step::Again) => {}
                    Some(Step::End) => {
                        self.framing = Framing::Done;
                        return Poll::Ready(Ok(None));
                    }
                    None => {
                        if ready!(self.poll_fill(cx, BODY_READ_CHUNK))? == 0 {
                            return Poll::Ready(Err(early_end()));
                        }
                    }
                },
            }
        }
    }

    /// One step of a chunked body from the buffer; `None` if it needs more bytes.
    fn decode_chunk(&mut self) -> io::Result<Option<Step>> {
        match self.chunk {
            Chunk::Size => {
                let Some(eol) = memchr::memchr(b'\n', &self.buf) else {
                    if self.buf.len() > CHUNK_LINE_MAX {
                        return Err(bad_body("chunk size line too long"));
                    }
                    return Ok(None);
                };
                if eol > CHUNK_LINE_MAX {
                    return Err(bad_body("chunk size line too long"));
                }
                let line = self.buf[..eol]
                    .strip_suffix(b"\r")
                    .ok_or_else(|| bad_body("chunk size line not ended by CRLF"))?;
                let digits = match memchr::memchr(b';', line) {
                    Some(i) => trim(&line[..i]),
                    None => line,
                };
                if digits.is_empty() || digits.len() > 15 {
                    return Err(bad_body("bad chunk size"));
                }
                let mut size = 0u64;
                for &d in digits {
                    let v = (d as char)
                        .to_digit(16)
                        .ok_or_else(|| bad_body("bad chunk size"))?;
                    size = size * 16 + v as u64;
                }
                self.buf.advance(eol + 1);
                self.chunk = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
                Ok(Some(Step::Again))
            }
            Chunk::Data(rem) => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let n = rem.min(self.buf.len() as u64);
                self.chunk = match rem - n {
                    0 => Chunk::DataEnd,
                    left => Chunk::Data(left),
                };
                Ok(Some(Step::Data(self.buf.split_to(n as usize).freeze())))
            }
            Chunk::DataEnd => {
                if self.buf.len() < 2 {
                    return Ok(None);
                }
                if &self.buf[..2] != b"\r\n" {
                    return Err(bad_body("chunk data not followed by CRLF"));
                }
                self.buf.advance(2);
                self.chunk = Chunk::Size;
                Ok(Some(Step::Again))
            }
            Chunk::Trailers => {
                let Some(eol) = memchr::memchr(b'\n', &self.buf) else {
                    if self.trailer_bytes + self.buf.len() > TRAILERS_MAX {
                        return Err(bad_body("trailers too large"));
                    }
                    return Ok(None);
                };
                self.trailer_bytes += eol + 1;
                if self.trailer_bytes > TRAILERS_MAX {
                    return Err(bad_body("trailers too large"));
                }
                let line = self.buf[..eol]
                    .strip_suffix(b"\r")
                    .ok_or_else(|| bad_body("trailer line not ended by CRLF"))?;
                let last = line.is_empty();
                self.buf.advance(eol + 1);
                // Trailers are read past, not passed on.
                Ok(Some(if last { Step::End } else { Step::Again }))
            }
        }
    }
}

fn early_end() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the connection closed before the request body ended",
    )
}

fn bad_body(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed chunked body: {what}"),
    )
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

/// A request body read from the socket as the handler asks for it. Dropped, it
/// hands the reader back to the connection.
struct StreamedBody {
    reader: Option<Reader>,
    home: Arc<Mutex<Option<Reader>>>,
}

impl HttpBody for StreamedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, io::Error>>> {
        let Some(reader) = self.reader.as_mut() else {
            return Poll::Ready(None);
        };
        match ready!(reader.poll_body(cx)) {
            Ok(Some(data)) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader
            .as_ref()
            .is_none_or(|r| r.framing == Framing::Done)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.reader.as_ref().map(|r| r.framing) {
            Some(Framing::Length(n)) => http_body::SizeHint::with_exact(n),
            Some(Framing::Chunked) => http_body::SizeHint::default(),
            _ => http_body::SizeHint::with_exact(0),
        }
    }
}

impl Drop for StreamedBody {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            *self.home.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader);
        }
    }
}

struct Parsed {
    request: Request<Body>,
    framing: Framing,
    keep_alive: bool,
    continue_expected: bool,
}

// Returned once per request and taken apart at once; boxing the head would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
enum HeadRead {
    Head(Parsed),
    Http2,
    Closed,
}

struct Conn {
    /// `None` while a streamed body holds it.
    reader: Option<Reader>,
    wr: OwnedWriteHalf,
    /// A response head being written; its allocation is reused.
    head: Vec<u8>,
    /// How far the read buffer was searched for the end of a head.
    scanned: usize,
    /// When the connection began to wait for its next request head.
    waiting_since: Instant,
    /// The head deadline, re-armed only when it fires early: one timer per
    /// `header_read_timeout` of a busy connection, not one per request.
    deadline: Pin<Box<tokio::time::Sleep>>,
    first: bool,
    /// An answer went out that closes the connection.
    closing: bool,
    /// Mapped file ranges may be sent with `sendfile`; off after it failed once.
    sendfile: bool,
}

impl Conn {
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        limits: &Limits,
        draining: &mut impl FnMut(&mut Context<'_>) -> bool,
    ) -> Poll<Result<HeadRead, Refusal>> {
        let Some(reader) = self.reader.as_mut() else {
            return Poll::Ready(Ok(HeadRead::Closed));
        };
        loop {
            if self.first && reader.buf.first() == Some(&b'P') {
                let n = reader.buf.len().min(H2_PREFACE.len());
                if reader.buf[..n] == H2_PREFACE[..n] {
                    if n == H2_PREFACE.len() {
                        return Poll::Ready(Ok(HeadRead::Http2));
                    }
                    self.scanned = reader.buf.len();
                }
            }
            while let Some(end) = head_end(&reader.buf, self.scanned) {
                match parse_head(&reader.buf[..end], limits.header_bytes_max) {
                    Ok(Some(parsed)) => {
                        reader.buf.advance(end);
                        self.scanned = 0;
                        return Poll::Ready(Ok(HeadRead::Head(parsed)));
                    }
                    // Blank lines before a request line are skipped (RFC 9112 2.2).
                    Ok(None) => self.scanned = end,
                    Err(refusal) => return Poll::Ready(Err(refusal)),
                }
            }
            self.scanned = reader.buf.len().saturating_sub(3);
            if reader.buf.len() >= limits.header_bytes_max {
                return Poll::Ready(Err(refuse(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "header_too_large",
                    format!("the request head exceeds {} bytes", limits.header_bytes_max),
                )));
            }
            if draining(cx) {
                return Poll::Ready(Ok(HeadRead::Closed));
            }
            match reader.poll_fill(cx, READ_CHUNK) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return Poll::Ready(Ok(HeadRead::Closed))
                }
                Poll::Ready(Ok(_)) => continue,
                Poll::Pending => {}
            }
            let due = self.waiting_since + limits.header_read_timeout;
            while self.deadline.as_mut().poll(cx).is_ready() {
                if Instant::now() >= due {
                    tracing::debug!(
                        "no complete request head within the header read timeout; closing"
                    );
                    return Poll::Ready(Ok(HeadRead::Closed));
                }
                self.deadline.as_mut().reset(due);
            }
            return Poll::Pending;
        }
    }

    /// Runs the request's future; `None` if the client left while it waited (only
    /// watched when `watch_eof`).
    async fn until_done<F: Future>(&mut self, fut: F, watch_eof: bool) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            if watch_eof && self.client_left(cx) {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// Whether the client closed its side; reads ahead (a pipelined request) up to
    /// one read chunk past what is buffered.
    fn client_left(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        while reader.buf.len() < READ_CHUNK * 8 {
            match reader.poll_fill(cx, READ_CHUNK) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        false
    }

    /// A body slice to queue, with its file when it can be sent from there.
    fn piece(&self, data: Bytes) -> Piece {
        let file = if self.sendfile && data.len() >= SENDFILE_FROM {
            picomq_engine::store::mapped::source(&data)
        } else {
            None
        };
        Piece { data, file }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        tokio::io::AsyncWriteExt::write_all(&mut self.wr, bytes).await
    }

    /// Reads what the handler left of the request body, up to [`DRAIN_AFTER_MAX`]
    /// bytes within the header read timeout; `false` if the connection cannot go on.
    async fn finish_body(&mut self, limits: &Limits) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        if reader.broken {
            return false;
        }
        if reader.framing == Framing::Done {
            return true;
        }
        if let Framing::Length(n) = reader.framing {
            if n > DRAIN_AFTER_MAX {
                return false;
            }
        }
        let mut seen = 0u64;
        let drain = std::future::poll_fn(|cx| loop {
            match ready!(reader.poll_body(cx)) {
                Ok(Some(data)) => {
                    seen += data.len() as u64;
                    if seen > DRAIN_AFTER_MAX {
                        return Poll::Ready(false);
                    }
                }
                Ok(None) => return Poll::Ready(true),
                Err(_) => return Poll::Ready(false),
            }
        });
        tokio::time::timeout(limits.header_read_timeout, drain)
            .await
            .unwrap_or(false)
    }

    /// Writes `response`; `Ok(true)` once all of it went out and the connection may
    /// carry another request.
    async fn respond(
        &mut self,
        response: Response<Body>,
        method: &Method,
        mut keep: bool,
        version: Version,
        watch_eof: bool,
    ) -> io::Result<bool> {
        let (parts, mut body) = response.into_parts();
        let status = parts.status;
        let bodiless = *method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let head = &mut self.head;
        head.clear();
        head.extend_from_slice(b"HTTP/1.1 ");
        head.extend_from_slice(status.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        head.extend_from_slice(b"\r\n");
        let mut declared = None;
        let mut dated = false;
        for (name, value) in parts.headers.iter() {
            if name == header::CONTENT_LENGTH {
                declared = std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                continue;
            }
            if name == header::TRANSFER_ENCODING || name == header::CONNECTION {
                continue;
            }
            dated |= name == header::DATE;
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        let exact = body.size_hint().exact();
        let out = if bodiless {
            // A HEAD answer says the length its GET would have, when the handler
            // said it (axum does for GET routes); its empty body is not that length.
            if *method == Method::HEAD && !status.is_informational() {
                if let Some(n) = declared {
                    push_length(head, n);
                }
            }
            Out::Nothing
        } else if let Some(n) = exact.or(declared) {
            push_length(head, n);
            Out::Length(n)
        } else if version == Version::HTTP_11 {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Out::Chunked
        } else {
            keep = false;
            Out::UntilClose
        };
        if !dated {
            head.extend_from_slice(b"date: ");
            DATE.with(|d| head.extend_from_slice(&d.borrow_mut().now()));
            head.extend_from_slice(b"\r\n");
        }
        if !keep && version == Version::HTTP_11 {
            head.extend_from_slice(b"connection: close\r\n");
        } else if keep && version == Version::HTTP_10 {
            head.extend_from_slice(b"connection: keep-alive\r\n");
        }
        head.extend_from_slice(b"\r\n");
        if bodiless {
            body = Body::empty();
        }

        let mut head_at = 0usize;
        let mut pieces: std::collections::VecDeque<Piece> = std::collections::VecDeque::new();
        let mut queued = 0usize;
        let mut body_done = bodiless;
        let mut sent = 0u64;
        // While pieces go out with sendfile the socket is corked, so that the
        // kernel fills whole segments across the calls (one per record, each
        // ending on an odd byte of a page); uncorked when the answer is out or
        // waits for its body.
        let mut corked = false;
        let written = std::future::poll_fn(|cx| loop {
            while !body_done && queued < WRITE_GATHER_MAX {
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        let Ok(data) = frame.into_data() else {
                            continue; // trailers are not sent
                        };
                        if data.is_empty() {
                            continue;
                        }
                        sent += data.len() as u64;
                        queued += data.len();
                        match out {
                            Out::Length(n) if sent > n => {
                                return Poll::Ready(Err(io::Error::other(
                                    "response body longer than its length",
                                )))
                            }
                            Out::Chunked => {
                                let mut line = Vec::with_capacity(18);
                                crate::digits::push_hex(&mut line, data.len() as u64);
                                line.extend_from_slice(b"\r\n");
                                pieces.push_back(Piece::new(Bytes::from(line)));
                                pieces.push_back(self.piece(data));
                                pieces.push_back(Piece::new(Bytes::from_static(b"\r\n")));
                            }
                            _ => pieces.push_back(self.piece(data)),
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(io::Error::other(e.to_string())))
                    }
                    Poll::Ready(None) => {
                        body_done = true;
                        match out {
                            Out::Chunked => {
                                pieces.push_back(Piece::new(Bytes::from_static(b"0\r\n\r\n")))
                            }
                            Out::Length(n) if sent != n => {
                                return Poll::Ready(Err(io::Error::other(
                                    "response body shorter than its length",
                                )))
                            }
                            _ => {}
                        }
                    }
                    Poll::Pending => break,
                }
            }
            let head_left = &self.head[head_at..];
            if head_left.is_empty() && pieces.is_empty() {
                if body_done {
                    return Poll::Ready(Ok(()));
                }
                if corked {
                    corked = false;
                    set_cork(&self.wr, false);
                }
                if watch_eof && self.client_left(cx) {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the client left",
                    )));
                }
                return Poll::Pending;
            }
            if head_left.is_empty() && self.sendfile {
                if let Some(Piece {
                    data,
                    file: Some((fd, offset)),
                }) = pieces.front()
                {
                    if !corked {
                        corked = true;
                        set_cork(&self.wr, true);
                    }
                    match ready!(poll_sendfile(&self.wr, cx, *fd, *offset, data.len())) {
                        Ok(n) => {
                            let front = pieces.front_mut().expect("a piece was sent");
                            queued = queued.saturating_sub(n);
                            if n >= front.data.len() {
                                pieces.pop_front();
                            } else {
                                front.advance(n);
                            }
                        }
                        // Nothing was sent: the bytes are still mapped, so the
                        // rest of this connection's answers copy them instead
                        // (a closed socket fails the same way there).
                        Err(e) => {
                            tracing::debug!(error = %e, "sendfile failed; copying instead");
                            self.sendfile = false;
                        }
                    }
                    continue;
                }
            }
            let mut iov = [io::IoSlice::new(&[]); IOV_MAX];
            let mut k = 0;
            if !head_left.is_empty() {
                iov[0] = io::IoSlice::new(head_left);
                k = 1;
            }
            for piece in pieces.iter().take(IOV_MAX - k) {
                // A slice the kernel can send from its file waits for its turn at
                // the front.
                if self.sendfile && piece.file.is_some() {
                    break;
                }
                iov[k] = io::IoSlice::new(&piece.data);
                k += 1;
            }
            let mut n = ready!(Pin::new(&mut self.wr).poll_write_vectored(cx, &iov[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let from_head = n.min(head_left.len());
            head_at += from_head;
            n -= from_head;
            while n > 0 {
                let front = pieces.front_mut().expect("written bytes were queued");
                if n >= front.data.len() {
                    n -= front.data.len();
                    queued = queued.saturating_sub(front.data.len());
                    pieces.pop_front();
                } else {
                    front.advance(n);
                    queued = queued.saturating_sub(n);
                    n = 0;
                }
            }
        })
        .await;
        if corked {
            set_cork(&self.wr, false);
        }
        written?;
        if !keep || matches!(out, Out::UntilClose) {
            self.closing = true;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.wr).await;
            return Ok(false);
        }
        Ok(true)
    }
}

#[derive(Clone, Copy)]
enum Out {
    Nothing,
    Length(u64),
    Chunked,
    UntilClose,
}

fn push_length(head: &mut Vec<u8>, n: u64) {
    head.extend_from_slice(b"content-length: ");
    crate::digits::push_decimal_bytes(head, n);
    head.extend_from_slice(b"\r\n");
}

/// Where the head in `buf` ends (just past its blank line), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = memchr::memchr(b'\n', buf.get(at..)?) {
        let nl = at + i;
        match buf.get(nl + 1..) {
            Some([b'\n', ..]) => return Some(nl + 2),
            Some([b'\r', b'\n', ..]) => return Some(nl + 3),
            _ => at = nl + 1,
        }
    }
    None
}

/// A 4xx/5xx answer to a head the loop refuses; the connection closes after it.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Refusal {
    fn into_response(self) -> Response<Body> {
        ApiError::new(self.status, self.code, self.message).into_response()
    }
}

fn refuse(status: StatusCode, code: &'static str, message: String) -> Refusal {
    Refusal {
        status,
        code,
        message,
    }
}

fn bad_request(message: impl Into<String>) -> Refusal {
    refuse(StatusCode::BAD_REQUEST, "bad_request", message.into())
}

/// Whether a comma-separated header value holds `token` (ASCII case-insensitive).
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token))
}

/// Parses a complete head; `Ok(None)` if it was only blank lines.
fn parse_head(bytes: &[u8], max: usize) -> Result<Option<Parsed>, Refusal> {
    if bytes.len() > max {
        return Err(refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "header_too_large",
            format!("the request head exceeds {max} bytes"),
        ));
    }
    let mut headers = [std::mem::MaybeUninit::<httparse::Header<'_>>::uninit(); HEADERS_MAX];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(bytes, &mut headers) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "header_too_large",
                format!("the request has more than {HEADERS_MAX} header fields"),
            ))
        }
        Err(e) => return Err(bad_request(format!("malformed request head: {e}"))),
    }
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
        .map_err(|_| bad_request("invalid request method"))?;
    let uri: Uri = req
        .path
        .unwrap_or("")
        .parse()
        .map_err(|_| bad_request("invalid request target"))?;
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => {
            return Err(refuse(
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "http_version_not_supported",
                "only HTTP/1.0 and HTTP/1.1 are served on this path".into(),
            ))
        }
    };
    let mut map = HeaderMap::with_capacity(req.headers.len());
    let mut length: Option<u64> = None;
    let mut coded = false;
    let mut chunked = false;
    let mut close = false;
    let mut keep_alive = false;
    let mut continue_expected = false;
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| bad_request(format!("invalid header name {:?}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| bad_request(format!("invalid value for header {:?}", h.name)))?;
        if name == header::CONTENT_LENGTH {
            for part in h.value.split(|&b| b == b',') {
                let part = trim(part);
                if part.is_empty() || part.len() > 18 || !part.iter().all(u8::is_ascii_digit) {
                    return Err(bad_request("invalid content-length"));
                }
                let n = std::str::from_utf8(part)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| bad_request("invalid content-length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(bad_request("conflicting content-length values"));
                }
                length = Some(n);
            }
        } else if name == header::TRANSFER_ENCODING {
            coded = true;
            for coding in h.value.split(|&b| b == b',') {
                if chunked {
                    // Anything after chunked: the body's end cannot be known.
                    return Err(bad_request(
                        "transfer-encoding: chunked must be the last coding",
                    ));
                }
                let coding = trim(coding);
                if coding.eq_ignore_ascii_case(b"chunked") {
                    chunked = true;
                } else if !coding.is_empty() {
                    return Err(refuse(
                        StatusCode::NOT_IMPLEMENTED,
                        "unsupported_transfer_coding",
                        "only transfer-encoding: chunked is accepted".into(),
                    ));
                }
            }
        } else if name == header::CONNECTION {
            close |= has_token(h.value, b"close");
            keep_alive |= has_token(h.value, b"keep-alive");
        } else if name == header::EXPECT {
            if trim(h.value).eq_ignore_ascii_case(b"100-continue") {
                continue_expected = true;
            } else {
                return Err(refuse(
                    StatusCode::EXPECTATION_FAILED,
                    "expectation_failed",
                    "only expect: 100-continue is understood".into(),
                ));
            }
        }
        map.append(name, value);
    }
    let framing = if coded {
        if version == Version::HTTP_10 {
            return Err(bad_request("transfer-encoding in an HTTP/1.0 request"));
        }
        if length.is_some() {
            return Err(bad_request(
                "a request may not carry both content-length and transfer-encoding",
            ));
        }
        if !chunked {
            return Err(bad_request("transfer-encoding without a coding"));
        }
        Framing::Chunked
    } else {
        Framing::Length(length.unwrap_or(0))
    };
    let keep_alive = match version {
        Version::HTTP_11 => !close,
        _ => keep_alive && !close,
    };
    let mut request = Request::new(Body::empty());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = map;
    Ok(Some(Parsed {
        request,
        framing,
        keep_alive,
        continue_expected: continue_expected && version == Version::HTTP_11,
    }))
}

/// The `date` header's value, formatted once a second per thread.
struct DateCache {
    second: u64,
    text: [u8; 29],
}

impl DateCache {
    // The `date` header is the real time, whatever clock the engine runs on (as
    // hyper's was).
    #[allow(clippy::disallowed_methods)]
    fn now(&mut self) -> [u8; 29] {
        let now = SystemTime::now();
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                self.text.copy_from_slice(text.as_bytes());
                self.second = second;
            }
        }
        self.text
    }
}

thread_local! {
    static DATE: std::cell::RefCell<DateCache> = const {
        std::cell::RefCell::new(DateCache { second: u64::MAX, text: *b"Thu, 01 Jan 1970 00:00:00 GMT" })
    };
}
