//! [`PicoMq`], the SDK's entry point: one server (base URL, optional bearer token,
//! TLS and HTTP/2 settings), one connection pool, and the one place requests are
//! sent, bounded in time and turned into [`Error`]s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::groups::ConsumerGroup;
use crate::stream::DurableStream;
use crate::subscriptions::Subscription;
use crate::transport::{Client, HttpMethod, Response};

/// How long a request may take beyond the time it asks the server to wait.
const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// A connection to one PicoMQ (or Durable Streams) server. Cheap to clone: clones
/// share the connection pool.
#[derive(Clone)]
pub struct PicoMq {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// `Bearer <token>`, sent with every request.
    authorization: Option<String>,
    request_timeout: Duration,
}

/// Settings of a [`PicoMq`] beyond its base URL.
#[derive(Clone, Debug)]
pub struct PicoMqBuilder {
    base_url: String,
    token: Option<String>,
    ca_file: Option<PathBuf>,
    http2: bool,
    request_timeout: Duration,
}

impl PicoMqBuilder {
    /// Sends `Authorization: Bearer <token>` with every request.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trusts `https://` servers only through the certificates of this PEM file (a
    /// private CA or a self-signed server) instead of the system's trust store.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Speaks HTTP/2 only (h2c with prior knowledge on `http://`, ALPN on
    /// `https://`): one connection carries every request.
    pub fn http2(mut self, on: bool) -> Self {
        self.http2 = on;
        self
    }

    /// How long a request may take (default 30 s); long-polls and claims get the
    /// time they ask the server to wait on top.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The connection. Fails only on TLS settings (an unreadable CA file, or no
    /// system trust store for an `https://` URL).
    pub fn build(self) -> Result<PicoMq> {
        let client = Client::with_tls(&self.base_url, self.http2, self.ca_file.as_deref())
            .map_err(|source| Error::Transport {
                request: format!("connect to {}", self.base_url),
                source,
            })?;
        Ok(PicoMq::from_client(
            client,
            self.token,
            self.request_timeout,
        ))
    }
}

impl PicoMq {
    /// A connection to the server at `base_url` (e.g. `http://127.0.0.1:4437`),
    /// without a token, over HTTP/1.1.
    pub fn new(base_url: &str) -> PicoMq {
        PicoMq::from_client(Client::new(base_url), None, REQUEST_TIMEOUT_DEFAULT)
    }

    /// Settings beyond the base URL: a token, TLS, HTTP/2, timeouts.
    pub fn builder(base_url: &str) -> PicoMqBuilder {
        PicoMqBuilder {
            base_url: base_url.to_string(),
            token: None,
            ca_file: None,
            http2: false,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
        }
    }

    /// The SDK over an existing low-level [`Client`] (sharing its pool).
    pub fn from_client(client: Client, token: Option<String>, request_timeout: Duration) -> PicoMq {
        PicoMq {
            inner: Arc::new(Inner {
                client,
                authorization: token.map(|t| format!("Bearer {t}")),
                request_timeout,
            }),
        }
    }

    /// The stream `name` (its URL path on the server, e.g. `logs/app`). Nothing is
    /// sent until one of its methods is called.
    pub fn stream(&self, name: &str) -> DurableStream {
        DurableStream::new(self.clone(), name)
    }

    /// The PicoMQ consumer group `name`.
    pub fn group(&self, name: &str) -> ConsumerGroup {
        ConsumerGroup::new(self.clone(), name)
    }

    /// The Durable Streams subscription `id` at the server's stream root.
    pub fn subscription(&self, id: &str) -> Subscription {
        Subscription::new(self.clone(), "", id)
    }

    /// The Durable Streams subscription `id` under the stream root `root` (e.g.
    /// `v1/stream`, for servers whose streams live below a prefix).
    pub fn subscription_under(&self, root: &str, id: &str) -> Subscription {
        Subscription::new(self.clone(), root, id)
    }

    /// The low-level HTTP client underneath (its pool is shared).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        self.inner.client.base()
    }

    /// Sends a request with the connection's token and waits for the whole answer,
    /// at most the request timeout plus `wait` (what the request asks the server to
    /// wait). Any status is returned: callers decide what success is.
    pub(crate) async fn send(
        &self,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
    ) -> Result<Response> {
        self.send_with(method, path, headers, body, wait, None)
            .await
    }

    /// [`PicoMq::send`] with another bearer token than the connection's (the wake
    /// tokens of subscriptions).
    pub(crate) async fn send_with(
        &self,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
        bearer: Option<&str>,
    ) -> Result<Response> {
        let own;
        let authorization = match bearer {
            Some(token) => {
                own = format!("Bearer {token}");
                Some(own.as_str())
            }
            None => self.inner.authorization.as_deref(),
        };
        let mut all: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 1);
        if let Some(a) = authorization {
            all.push(("authorization", a));
        }
        all.extend_from_slice(headers);
        let limit = self.inner.request_timeout + wait;
        let sent = self.inner.client.send(method.clone(), path, &all, body);
        match tokio::time::timeout(limit, sent).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(source)) => Err(Error::Transport {
                request: describe(&method, path),
                source,
            }),
            Err(_) => Err(Error::Timeout {
                request: describe(&method, path),
                after: limit,
            }),
        }
    }

    /// [`PicoMq::send`], with any non-2xx answer as an [`Error`].
    pub(crate) async fn call(
        &self,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
    ) -> Result<Response> {
        let r = self.send(method.clone(), path, headers, body, wait).await?;
        ok(&method, path, r)
    }

    /// A JSON request whose answer is JSON: `T` from a 2xx answer.
    pub(crate) async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        method: HttpMethod,
        path: &str,
        body: &serde_json::Value,
        wait: Duration,
    ) -> Result<T> {
        let body = Bytes::from(body.to_string());
        let headers = [("content-type", "application/json")];
        let r = self
            .call(method.clone(), path, &headers, body, wait)
            .await?;
        parse_json(&describe(&method, path), &r.body)
    }
}

/// `METHOD path`, for errors.
pub(crate) fn describe(method: &HttpMethod, path: &str) -> String {
    format!("{method} {path}")
}

/// `r` if its status is a success, else the server's error.
pub(crate) fn ok(method: &HttpMethod, path: &str, r: Response) -> Result<Response> {
    if r.status.is_success() {
        Ok(r)
    } else {
        Err(Error::from_response(describe(method, path), &r))
    }
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(request: &str, body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::decode(request, e.to_string()))
}
