//! Bench connections for everything but the writers (stream creation, live readers,
//! catch-up, /metrics): one hyper connection per [`Conn`], no pool, so the number of
//! TCP connections is exactly what the workload asks for and a request costs no pool
//! bookkeeping. HTTP/1.1 sends one request at a time per connection (no pipelining);
//! HTTP/2 (h2c, prior knowledge) multiplexes. The writers have lanes of their own
//! (h1.rs, h2c.rs).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::BenchError;

/// Where requests go: resolved once.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub authority: String,
    pub http2: bool,
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One connection, re-established on the next request after it breaks.
pub struct Conn {
    target: Target,
    host: HeaderValue,
    sender: Option<Sender>,
}

/// A complete response.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Target {
    pub fn conn(&self) -> Conn {
        Conn {
            host: HeaderValue::from_str(&self.authority).expect("authority is a valid Host"),
            target: self.clone(),
            sender: None,
        }
    }
}

impl Conn {
    /// Connects now rather than on the first request.
    pub async fn establish(&mut self) -> Result<(), BenchError> {
        if self.sender.is_none() {
            self.sender = Some(self.connect().await?);
        }
        Ok(())
    }

    async fn connect(&self) -> Result<Sender, BenchError> {
        let err =
            |e: &dyn std::fmt::Display| BenchError::Connect(format!("{}: {e}", self.target.addr));
        let tcp = TcpStream::connect(self.target.addr)
            .await
            .map_err(|e| err(&e))?;
        let _ = tcp.set_nodelay(true);
        let io = TokioIo::new(tcp);
        if self.target.http2 {
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .max_concurrent_reset_streams(1024)
                .handshake(io)
                .await
                .map_err(|e| err(&e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H2(send))
        } else {
            let (send, conn) = http1::handshake(io).await.map_err(|e| err(&e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H1(send))
        }
    }

    /// Sends a request and returns once the response head arrived.
    pub async fn open(
        &mut self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&HeaderValue>,
        extra: &[(&'static str, &str)],
        body: Bytes,
    ) -> Result<Response<Incoming>, BenchError> {
        let uri = if self.target.http2 {
            format!("http://{}{path_and_query}", self.target.authority)
        } else {
            path_and_query.to_string()
        };
        let mut req = Request::builder().method(method).uri(uri);
        if !self.target.http2 {
            req = req.header(HOST, self.host.clone());
        }
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct.clone());
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| BenchError::Request(e.to_string()))?;
        if self.sender.as_ref().is_none_or(|s| match s {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }) {
            self.sender = Some(self.connect().await?);
        }
        let sent = match self.sender.as_mut().expect("connected above") {
            Sender::H1(s) => match s.ready().await {
                Ok(()) => s.send_request(req).await,
                Err(e) => Err(e),
            },
            Sender::H2(s) => match s.ready().await {
                Ok(()) => s.send_request(req).await,
                Err(e) => Err(e),
            },
        };
        sent.map_err(|e| {
            self.sender = None;
            BenchError::Request(e.to_string())
        })
    }

    /// Sends a request and reads the whole response.
    pub async fn send(
        &mut self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&HeaderValue>,
        extra: &[(&'static str, &str)],
        body: Bytes,
    ) -> Result<Answer, BenchError> {
        let resp = self
            .open(method, path_and_query, content_type, extra, body)
            .await?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| {
                self.sender = None;
                BenchError::Request(format!("reading the response: {e}"))
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn get(&mut self, path_and_query: &str) -> Result<Answer, BenchError> {
        self.send(Method::GET, path_and_query, None, &[], Bytes::new())
            .await
    }
}
