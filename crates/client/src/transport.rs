//! The low-level HTTP client for Durable Streams servers, shared by the CLI, the
//! benchmark, the integration tests and the typed SDK above it. It speaks HTTP/1.1 (or HTTP/2 only, with `http2_only`:
//! h2c on `http://`, h2 by ALPN on `https://`) over one connection pool and hands back
//! status, headers and body; it knows header names, not protocol rules. `https://`
//! URLs are verified against the system's trust store, or only against the
//! certificates of one PEM file ([`Client::with_tls`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Method, Request};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

/// An HTTP method (`GET`, `POST`, ...).
pub use hyper::Method as HttpMethod;
/// An HTTP status code.
pub use hyper::StatusCode;

/// Why a request of the low-level [`Client`] got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection to the server, or it broke before the answer's head.
    #[error("cannot reach {url}: {source}")]
    Connect {
        /// The server's base URL.
        url: String,
        /// What the connection pool reported.
        source: hyper_util::client::legacy::Error,
    },
    /// The request could not be built (a bad header value or path).
    #[error("invalid request: {0}")]
    Request(String),
    /// The answer's body broke off.
    #[error("reading the response failed: {0}")]
    Body(String),
    /// No answer within the time allowed.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The server's certificate was refused, or the trust store could not be read.
    #[error("TLS: {0}")]
    Tls(String),
}

/// One connection pool to one server: cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: String,
}

/// A whole answer: status, headers and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Response {
    /// A header's value, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `message` of a PicoMQ JSON error body, or the raw body.
    pub fn error_message(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| self.text())
    }
}

/// A response whose body is read incrementally (SSE, large reads).
pub struct Streaming {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    body: Incoming,
}

impl Streaming {
    /// The next chunk of the body; `None` at its end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, ClientError>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
                Err(e) => return Some(Err(ClientError::Body(e.to_string()))),
            }
        }
    }
}

impl Client {
    /// A client for the server at `base` (e.g. `http://127.0.0.1:4437`).
    pub fn new(base: &str) -> Client {
        Client::with_options(base, false)
    }

    /// `http2_only`: speak HTTP/2 (h2c with prior knowledge on `http://`). `https://`
    /// servers are checked against the system's trust store; if it cannot be loaded,
    /// no `https://` server is trusted.
    pub fn with_options(base: &str, http2_only: bool) -> Client {
        Client::with_tls(base, http2_only, None)
            .unwrap_or_else(|_| Client::build_with(base, http2_only, trust_nothing()))
    }

    /// Like [`Client::with_options`], but with `ca_cert` (a PEM file) `https://`
    /// servers are trusted only if their chain leads to one of its certificates
    /// (a private CA or a self-signed server), not the system's roots. The system's
    /// trust store is read only for an `https://` base: plain HTTP works without one.
    pub fn with_tls(
        base: &str,
        http2_only: bool,
        ca_cert: Option<&Path>,
    ) -> Result<Client, ClientError> {
        let tls = if ca_cert.is_none() && !base.starts_with("https://") {
            trust_nothing()
        } else {
            tls_config(ca_cert)?
        };
        Ok(Client::build_with(base, http2_only, tls))
    }

    fn build_with(base: &str, http2_only: bool, tls: rustls::ClientConfig) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let https = if http2_only {
            https.enable_http2().wrap_connector(connector)
        } else {
            https.enable_http1().wrap_connector(connector)
        };
        let mut builder = HyperClient::builder(TokioExecutor::new());
        builder
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(Duration::from_secs(30));
        if http2_only {
            builder.http2_only(true);
        }
        Client {
            http: builder.build(https),
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A refused certificate is a TLS error (retrying will not help), anything else
    /// a connection error.
    fn request_failed(&self, source: hyper_util::client::legacy::Error) -> ClientError {
        match tls_cause(&source) {
            Some(tls) => ClientError::Tls(format!("{}: {tls}", self.base)),
            None => ClientError::Connect {
                url: self.base.clone(),
                source,
            },
        }
    }

    fn build(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(Full::new(body))
            .map_err(|e| ClientError::Request(e.to_string()))
    }

    /// Sends a request and reads the whole response body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Response, ClientError> {
        let req = self.build(method, path, headers, body.into())?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|source| self.request_failed(source))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| ClientError::Body(e.to_string()))?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a request and returns as soon as the response head arrives.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Streaming, ClientError> {
        let req = self.build(method, path, headers, body.into())?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|source| self.request_failed(source))?;
        let (parts, body) = resp.into_parts();
        Ok(Streaming {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// `PUT path` with `headers` and `body`.
    pub async fn put(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Response, ClientError> {
        self.send(Method::PUT, path, headers, body).await
    }
    /// `POST path` with `headers` and `body`.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Response, ClientError> {
        self.send(Method::POST, path, headers, body).await
    }
    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Response, ClientError> {
        self.send(Method::GET, path, &[], Bytes::new()).await
    }
    /// `HEAD path`.
    pub async fn head(&self, path: &str) -> Result<Response, ClientError> {
        self.send(Method::HEAD, path, &[], Bytes::new()).await
    }
    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<Response, ClientError> {
        self.send(Method::DELETE, path, &[], Bytes::new()).await
    }
}

/// Incremental parser for `text/event-stream`: feed bytes, take complete events.
/// Bytes are kept until an event is complete, so a chunk boundary inside a
/// multi-byte character does not mangle it.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Where the search for the end of the next event resumes: a large event that
    /// arrives in many chunks is scanned once, not once per chunk.
    scanned: usize,
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event:` name (`message` when absent).
    pub event: String,
    /// Its `data:` lines, joined by `\n`.
    pub data: String,
}

impl SseParser {
    /// Adds `chunk` and returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        loop {
            let from = self.scanned.saturating_sub(1);
            let Some(end) = self.buf[from..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| from + i)
            else {
                self.scanned = self.buf.len();
                break;
            };
            self.scanned = 0;
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
            let mut event = SseEvent {
                event: "message".into(),
                data: String::new(),
            };
            let mut first = true;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event.event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !first {
                        event.data.push('\n');
                    }
                    event.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    first = false;
                }
            }
            // A block without data (a `: comment`, such as a keep-alive) is no event.
            if !first {
                events.push(event);
            }
        }
        events
    }
}

/// The rustls error somewhere in `e`'s causes. The TLS stream reports it inside
/// `io::Error`s (two, nested), whose `source()` skips the error they wrap: look
/// inside those instead.
fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

/// A TLS configuration no server passes (no roots): for clients of `http://` bases.
fn trust_nothing() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

/// Client TLS with the ring provider (the one the server uses): trust the
/// certificates in `ca_cert`, or else the system's trust store.
pub fn tls_config(ca_cert: Option<&Path>) -> Result<rustls::ClientConfig, ClientError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use rustls_platform_verifier::BuilderVerifierExt;

    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ClientError::Tls(e.to_string()))?;
    let Some(path) = ca_cert else {
        return Ok(builder
            .with_platform_verifier()
            .map_err(|e| ClientError::Tls(format!("the system's trust store: {e}")))?
            .with_no_client_auth());
    };
    let bad = |e: &dyn std::fmt::Display| ClientError::Tls(format!("{}: {e}", path.display()));
    let mut roots = rustls::RootCertStore::empty();
    let mut pinned = Vec::new();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
        let cert = cert.map_err(|e| bad(&e))?;
        roots.add(cert.clone()).map_err(|e| bad(&e))?;
        pinned.push(cert);
    }
    if roots.is_empty() {
        return Err(bad(&"no PEM certificate in the file"));
    }
    let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        builder.crypto_provider().clone(),
    )
    .build()
    .map_err(|e| bad(&e))?;
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedOrChain { chain, pinned }))
        .with_no_client_auth())
}

/// Trusts a server whose chain leads to one of the `--ca-cert` certificates, or that
/// presents one of them itself, valid for the name it was asked for. The second case
/// is a self-signed certificate made with `openssl req -x509`, which marks it as a
/// CA: WebPKI refuses a CA certificate as a server's own (`CaUsedAsEndEntity`; curl
/// accepts it). Only that refusal is overridden: an expired or misnamed certificate
/// is refused either way, and handshake signatures are always checked.
#[derive(Debug)]
struct PinnedOrChain {
    chain: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedOrChain {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let err = match self.chain.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(e) => e,
        };
        let ca_as_end_entity = matches!(
            &err,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
        );
        if !ca_as_end_entity
            || !self
                .pinned
                .iter()
                .any(|c| c.as_ref() == end_entity.as_ref())
        {
            return Err(err);
        }
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&cert, server_name)?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_survive_any_chunking() {
        let stream = "event: data\ndata:caf\u{e9} \u{1f600}\ndata:b\n\nevent: control\ndata:{}\n\n";
        for split in 0..stream.len() {
            let (a, b) = stream.as_bytes().split_at(split);
            let mut p = SseParser::default();
            let mut events = p.feed(a);
            events.extend(p.feed(b));
            assert_eq!(events.len(), 2, "split at {split}");
            assert_eq!(events[0].data, "caf\u{e9} \u{1f600}\nb", "split at {split}");
            assert_eq!(events[1].event, "control");
        }
    }

    #[test]
    fn comments_and_blocks_without_data_are_no_events() {
        let mut p = SseParser::default();
        let events = p.feed(b": keep-alive\n\nevent: records\n\nevent: records\ndata:{}\n\n");
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (events[0].event.as_str(), events[0].data.as_str()),
            ("records", "{}")
        );
    }
}
