//! Connections: the accept loop of the API port, optionally TLS (rustls, certificate
//! reloadable at run time), with the limits that keep slow or idle clients from
//! holding the server: a cap on open connections, a deadline for the TLS handshake
//! and for each request head (slow-loris), and a header size limit. Request bodies
//! get their own deadline where they are read (`request::read_body`). Plain-TCP
//! connections are served by the server's own HTTP/1.1 loop (`h1`) unless
//! `own_http1` is off; TLS and HTTP/2 (prior knowledge included) by hyper.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use futures::task::AtomicWaker;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

use picomq_engine::shutdown::ShutdownSignal;

#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// A request head (and, on a new connection, the TLS handshake) must arrive
    /// within this long; an idle keep-alive connection is closed after it too.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes.
    pub header_bytes_max: usize,
    /// Connections open at once; beyond it the server stops accepting until one ends.
    pub connections_max: usize,
    pub tls: Option<Arc<Tls>>,
    /// Give each request its client address (`ConnectInfo`), for per-IP limits; off,
    /// requests carry no extension (an allocation saved per request).
    pub peer_address: bool,
    /// Plain-TCP HTTP/1.1 connections are served by PicoMQ's own loop (`h1`); off,
    /// by hyper like TLS and HTTP/2 ones.
    pub own_http1: bool,
    /// On the own loop, mapped ranges of the local store's files are sent with
    /// `sendfile` instead of copied (`h1`); off, every response byte is copied.
    pub sendfile: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            header_read_timeout: Duration::from_secs(20),
            header_bytes_max: 64 * 1024,
            connections_max: 10_000,
            tls: None,
            peer_address: false,
            own_http1: true,
            sendfile: true,
        }
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish()
    }
}

/// The TLS configuration, swapped whole on `reload` (SIGHUP): new connections use the
/// new certificate, open ones keep theirs.
pub struct Tls {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

impl Tls {
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls, String> {
        let config = server_config(cert_path, key_path)?;
        Ok(Tls {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again; on any error the previous configuration stays.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.cert_path, &self.key_path)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}

fn server_config(cert_path: &Path, key_path: &Path) -> Result<rustls::ServerConfig, String> {
    let certs = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {}: no PEM certificate in the file",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("--tls-key {}: {e}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What the port serves: the API (`crate::Api`), or the recovering router. A
/// service from requests to responses that never fails, cloned per connection.
pub trait HttpService:
    Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serves `app` on `listener` until `shutdown` fires, then waits for open connections
/// to finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: impl HttpService,
    options: ServerOptions,
    shutdown: ShutdownSignal,
) {
    let options = Arc::new(options);
    let slots = Arc::new(Semaphore::new(options.connections_max.max(1)));
    // Every connection holds a receiver; the sender sees them all gone at the end.
    let (open_tx, open_rx) = watch::channel(());
    let drains = Arc::new(Drains::default());
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = shutdown.fired() => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.fired() => break,
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let options = options.clone();
        let drains = drains.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            connection(tcp, peer, app, &options, &drains).await;
            drop(permit);
            drop(open);
        });
    }
    drains.fire();
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: impl HttpService,
    options: &ServerOptions,
    drains: &Drains,
) {
    match &options.tls {
        None if options.own_http1 => {
            let limits = crate::h1::Limits {
                header_read_timeout: options.header_read_timeout,
                header_bytes_max: options.header_bytes_max,
                peer_address: options.peer_address,
                sendfile: options.sendfile,
            };
            let drain = drains.register();
            let ended =
                crate::h1::serve(tcp, peer, app.clone(), &limits, |cx| drain.fired(cx)).await;
            drop(drain);
            if let crate::h1::Ended::Http2(tcp, read) = ended {
                // HTTP/2 with prior knowledge: hyper reads the preface again.
                let io = Rewind { read, inner: tcp };
                serve_io(TokioIo::new(io), peer, app, options, drains).await;
            }
        }
        None => serve_io(TokioIo::new(tcp), peer, app, options, drains).await,
        Some(tls) => {
            let handshake = tls.acceptor().accept(tcp);
            match tokio::time::timeout(options.header_read_timeout, handshake).await {
                Ok(Ok(stream)) => serve_io(TokioIo::new(stream), peer, app, options, drains).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}

async fn serve_io<I>(
    io: TokioIo<I>,
    peer: SocketAddr,
    app: impl HttpService,
    options: &ServerOptions,
    drains: &Drains,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let first_request = Arc::new(AtomicBool::new(false));
    let seen = first_request.clone();
    let peer_address = options.peer_address;
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        seen.store(true, Ordering::Relaxed);
        if peer_address {
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        let mut app = app.clone();
        async move {
            let resp = app.call(req.map(Body::new)).await;
            Ok::<_, Infallible>(resp.unwrap_or_else(|never| match never {}))
        }
    });
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.header_bytes_max.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(options.header_bytes_max.min(u32::MAX as usize) as u32)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let mut conn = pin!(builder.serve_connection(io, service));
    // hyper's header timeout starts once it knows the protocol; this one covers the
    // time before the first request (a client that connects and sends nothing), and
    // is dropped once a request came.
    let mut first_deadline = Some(Box::pin(tokio::time::sleep(options.header_read_timeout)));
    let drain = drains.register();
    let mut draining = false;
    // Polled by hand rather than with `select!`: a connection wakes at least twice
    // per request, and `select!` polled every branch each time (the deadline's timer
    // for the connection's first 20 s, and the shutdown watch, whose lock every
    // connection shares: ~1,100 instructions per append between them, callgrind).
    std::future::poll_fn(|cx| loop {
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            return Poll::Ready(());
        }
        if let Some(deadline) = first_deadline.as_mut() {
            if first_request.load(Ordering::Relaxed) {
                first_deadline = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                tracing::debug!(%peer, "no request within the header read timeout; closing");
                return Poll::Ready(());
            }
        }
        if draining || !drain.fired(cx) {
            return Poll::Pending;
        }
        draining = true;
        conn.as_mut().graceful_shutdown();
        // Polled again at once: the shutdown may let it finish now.
    })
    .await;
}

/// A socket with the bytes already read from it put back in front.
struct Rewind {
    read: bytes::Bytes,
    inner: TcpStream,
}

impl tokio::io::AsyncRead for Rewind {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Rewind {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The open connections, told to finish their requests and close when the server
/// shuts down. Each connection checks a flag of its own when it wakes up.
#[derive(Default)]
struct Drains {
    open: Mutex<HashMap<u64, Arc<Drain>>>,
    next: AtomicU64,
    fired: AtomicBool,
}

#[derive(Default)]
struct Drain {
    fired: AtomicBool,
    waker: AtomicWaker,
}

/// A connection's place in [`Drains`], given up when the connection ends.
struct DrainGuard<'a> {
    drains: &'a Drains,
    id: u64,
    drain: Arc<Drain>,
}

impl Drains {
    fn register(&self) -> DrainGuard<'_> {
        let drain = Arc::new(Drain::default());
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock `fire` takes: a connection registered after it is told too.
        drain
            .fired
            .store(self.fired.load(Ordering::Acquire), Ordering::Release);
        open.insert(id, drain.clone());
        DrainGuard {
            drains: self,
            id,
            drain,
        }
    }

    fn fire(&self) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        self.fired.store(true, Ordering::Release);
        for drain in open.values() {
            drain.fired.store(true, Ordering::Release);
            drain.waker.wake();
        }
    }
}

impl DrainGuard<'_> {
    /// Whether the server is shutting down; if not, `cx` is woken when it does.
    fn fired(&self, cx: &mut Context<'_>) -> bool {
        if self.drain.fired.load(Ordering::Acquire) {
            return true;
        }
        self.drain.waker.register(cx.waker());
        self.drain.fired.load(Ordering::Acquire)
    }
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        let mut open = self.drains.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&self.id);
    }
}
