//! A small HTTP client for Durable Streams servers, shared by the CLI, the benchmark
//! and the integration tests. It speaks HTTP/1.1 (or h2c with `http2_only`) over one
//! connection pool and hands back status, headers and body; it knows header names,
//! not protocol rules.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

pub use hyper::Method as HttpMethod;
pub use hyper::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach {url}: {source}")]
    Connect {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("invalid request: {0}")]
    Request(String),
    #[error("reading the response failed: {0}")]
    Body(String),
    #[error("no response within {0:?}")]
    Timeout(Duration),
}

#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    base: String,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
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
    pub status: StatusCode,
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

    /// `http2_only`: speak HTTP/2 without TLS (h2c, prior knowledge).
    pub fn with_options(base: &str, http2_only: bool) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let mut builder = HyperClient::builder(TokioExecutor::new());
        builder
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(Duration::from_secs(30));
        if http2_only {
            builder.http2_only(true);
        }
        Client {
            http: builder.build(connector),
            base: base.trim_end_matches('/').to_string(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
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
            .map_err(|source| ClientError::Connect {
                url: self.base.clone(),
                source,
            })?;
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
            .map_err(|source| ClientError::Connect {
                url: self.base.clone(),
                source,
            })?;
        let (parts, body) = resp.into_parts();
        Ok(Streaming {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn put(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Response, ClientError> {
        self.send(Method::PUT, path, headers, body).await
    }
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Response, ClientError> {
        self.send(Method::POST, path, headers, body).await
    }
    pub async fn get(&self, path: &str) -> Result<Response, ClientError> {
        self.send(Method::GET, path, &[], Bytes::new()).await
    }
    pub async fn head(&self, path: &str) -> Result<Response, ClientError> {
        self.send(Method::HEAD, path, &[], Bytes::new()).await
    }
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

impl SseParser {
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
            events.push(event);
        }
        events
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
}
