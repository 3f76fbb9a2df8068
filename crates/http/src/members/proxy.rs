//! Forwarding a request to another member and streaming its answer back (long-polls
//! and SSE included), and the redirect that sends the client there instead.

use std::time::Duration;

use axum::body::Body;
use axum::http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
};
use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::FORWARDED_BY;

/// A member that does not accept a connection in this long is taken for down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle connections kept to each member.
const IDLE_PER_MEMBER: usize = 64;

/// Headers that describe one hop, not the request (RFC 9110 section 7.6.1), and
/// `host`, which names the first hop.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The client members forward with: HTTP/1.1, kept-alive connections per member,
/// TLS with the system's trust store for `https://` members.
pub struct Proxy {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("invalid forwarded request: {0}")]
    Request(String),
    /// The request never reached the member (no connection): safe to send again.
    #[error("{0}")]
    Unreachable(String),
    /// The request was sent and no answer came (the member died or cut the
    /// connection): it may or may not have taken effect.
    #[error("{0}")]
    Lost(String),
}

impl Proxy {
    pub fn new() -> Result<Proxy, String> {
        let tls = picomq_client::tls_config(None).map_err(|e| e.to_string())?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_MEMBER)
            .build(https);
        Ok(Proxy { client })
    }

    /// Sends the request to the member at `base` and returns its answer, the body
    /// streamed as it comes.
    pub async fn forward(
        &self,
        base: &str,
        from_node: &str,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let target = target_uri(base, uri)?;
        let mut req = Request::builder()
            .method(method.clone())
            .uri(target)
            .body(Full::new(body))
            .map_err(|e| ForwardError::Request(e.to_string()))?;
        let out = req.headers_mut();
        for (name, value) in headers {
            if !HOP_BY_HOP.contains(name) && name != header::HOST && name != header::CONTENT_LENGTH
            {
                out.append(name.clone(), value.clone());
            }
        }
        // The owner hands out URLs (subscription callbacks) as the client saw them.
        if let (Some(host), false) = (
            headers.get(header::HOST),
            headers.contains_key("x-forwarded-host"),
        ) {
            out.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
        }
        out.insert(
            HeaderName::from_static(FORWARDED_BY),
            HeaderValue::from_str(from_node).map_err(|e| ForwardError::Request(e.to_string()))?,
        );
        let resp = self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::Unreachable(describe(&e))
            } else {
                ForwardError::Lost(describe(&e))
            }
        })?;
        let (mut parts, incoming) = resp.into_parts();
        for name in &HOP_BY_HOP {
            parts.headers.remove(name);
        }
        Ok(Response::from_parts(parts, Body::new(incoming)))
    }
}

/// `307 Temporary Redirect` to the same path and query at `base` (a 307 keeps the
/// method and the body).
pub fn redirect(base: &str, uri: &Uri) -> Response<Body> {
    let location = match target_uri(base, uri) {
        Ok(u) => u.to_string(),
        Err(_) => base.to_string(),
    };
    let body = serde_json::json!({
        "error": {"code": "moved", "message": "this stream is served by another node", "location": location}
    });
    Response::builder()
        .status(StatusCode::TEMPORARY_REDIRECT)
        .header(header::LOCATION, location)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("valid redirect")
}

fn target_uri(base: &str, uri: &Uri) -> Result<Uri, ForwardError> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    format!("{}{path}", base.trim_end_matches('/'))
        .parse()
        .map_err(|e| ForwardError::Request(format!("{base}: {e}")))
}

/// The innermost cause of a client error (hyper's outer message is generic).
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    let mut last = e.to_string();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    last
}
