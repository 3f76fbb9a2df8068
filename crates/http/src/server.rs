//! Connections: the accept loop of the API port, optionally TLS (rustls, certificate
//! reloadable at run time), with the limits that keep slow or idle clients from
//! holding the server: a cap on open connections, a deadline for the TLS handshake
//! and for each request head (slow-loris), and a header size limit. Request bodies
//! get their own deadline where they are read (`ds::read_body`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

use crate::ShutdownSignal;

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
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            header_read_timeout: Duration::from_secs(20),
            header_bytes_max: 64 * 1024,
            connections_max: 10_000,
            tls: None,
            peer_address: false,
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

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
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
        let shutdown = shutdown.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            connection(tcp, peer, app, &options, shutdown).await;
            drop(permit);
            drop(open);
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: impl HttpService,
    options: &ServerOptions,
    shutdown: ShutdownSignal,
) {
    match &options.tls {
        None => serve_io(TokioIo::new(tcp), peer, app, options, shutdown).await,
        Some(tls) => {
            let handshake = tls.acceptor().accept(tcp);
            match tokio::time::timeout(options.header_read_timeout, handshake).await {
                Ok(Ok(stream)) => {
                    serve_io(TokioIo::new(stream), peer, app, options, shutdown).await
                }
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
    shutdown: ShutdownSignal,
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
    // time before the first request (a client that connects and sends nothing).
    let mut first_deadline = pin!(tokio::time::sleep(options.header_read_timeout));
    let mut waiting_first = true;
    let mut draining = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = &mut first_deadline, if waiting_first => {
                if !first_request.load(Ordering::Relaxed) {
                    tracing::debug!(%peer, "no request within the header read timeout; closing");
                    return;
                }
                waiting_first = false;
            }
            _ = shutdown.fired(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
