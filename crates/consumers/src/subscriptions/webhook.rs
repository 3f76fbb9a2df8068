//! The client webhooks are delivered with, and where it may connect. The URL was
//! checked when the subscription was created (`config::check_webhook_url`); a
//! name can resolve elsewhere later, so the decision is made again here, at
//! connect time, on what is actually reached: every address a name resolves to
//! must be allowed (one private answer refuses the name: DNS rebinding mixes
//! answers), and the peer of the connection made must be too (literal
//! addresses skip the resolver). Redirects are never followed: a 3xx is a
//! failed delivery, as any answer that is not 2xx.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::config::WebhookRule;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection to a webhook receiver is given this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections kept per receiver.
const IDLE_PER_HOST: usize = 16;

/// The webhook clients of a node: one for every URL, one for the development
/// exception's URLs (which may reach loopback on a development server).
pub struct Webhooks {
    public: Client<HttpsConnector<Guarded>, Full<Bytes>>,
    dev: Client<HttpsConnector<Guarded>, Full<Bytes>>,
}

/// A delivery's answer: its status and up to `answer_bytes_max` of its body
/// (`None` past that).
pub struct Answer {
    pub status: hyper::StatusCode,
    pub body: Option<Bytes>,
}

impl Webhooks {
    pub fn new(rule: WebhookRule) -> Webhooks {
        // No trust store: no https:// receiver is trusted (and deliveries fail,
        // with the reason in the log), rather than a server that cannot start.
        let tls = picomq_client::tls_config(None).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no trust store: https:// webhooks will fail");
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
        });
        let client = |dev_url: bool| {
            let mut http = HttpConnector::new_with_resolver(Resolver { rule, dev_url });
            http.set_nodelay(true);
            http.enforce_http(false);
            http.set_connect_timeout(Some(CONNECT_TIMEOUT));
            let https = HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
                .wrap_connector(Guarded {
                    http,
                    rule,
                    dev_url,
                });
            Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(IDLE_PER_HOST)
                .pool_idle_timeout(Duration::from_secs(30))
                .build(https)
        };
        Webhooks {
            public: client(false),
            dev: client(true),
        }
    }

    /// POSTs `body` to `url` with `headers`.
    pub async fn post(
        &self,
        url: &url::Url,
        headers: &[(&str, &str)],
        body: Vec<u8>,
        answer_bytes_max: usize,
    ) -> Result<Answer, String> {
        let mut req = hyper::Request::post(url.as_str());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let client = if super::config::is_dev_url(url) {
            &self.dev
        } else {
            &self.public
        };
        let resp = client.request(req).await.map_err(|e| causes(&e))?;
        let status = resp.status();
        let body = match Limited::new(resp.into_body(), answer_bytes_max)
            .collect()
            .await
        {
            Ok(b) => Some(b.to_bytes()),
            Err(_) => None,
        };
        Ok(Answer { status, body })
    }
}

/// An error and its causes in one line (the client's own says only "client
/// error (Connect)").
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

fn refused(what: &str, addr: SocketAddr) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{what} {}: not a public address (webhooks go to public addresses only; --webhook-allow-private allows private receivers)",
            addr.ip()
        ),
    )
}

/// Resolves a name and refuses it if any of its addresses is not allowed.
#[derive(Clone)]
struct Resolver {
    rule: WebhookRule,
    dev_url: bool,
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (rule, dev_url) = (self.rule, self.dev_url);
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs.iter().find(|a| !rule.allows(a.ip(), dev_url)) {
                return Err(refused(&format!("{host} resolves to"), *bad));
            }
            Ok(addrs.into_iter())
        })
    }
}

/// The HTTP connector, and a check of the peer it connected to.
#[derive(Clone)]
struct Guarded {
    http: HttpConnector<Resolver>,
    rule: WebhookRule,
    dev_url: bool,
}

impl tower_service::Service<hyper::Uri> for Guarded {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        let (rule, dev_url) = (self.rule, self.dev_url);
        Box::pin(async move {
            let io = connecting.await?;
            let peer = io.inner().peer_addr()?;
            if !rule.allows(peer.ip(), dev_url) {
                return Err(refused("connected to", peer).into());
            }
            Ok(io)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A receiver on loopback answering `{"done":true}`; counts the requests it got.
    async fn receiver() -> (u16, Arc<AtomicUsize>) {
        receiver_at("127.0.0.1").await
    }

    async fn receiver_at(ip: &str) -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(AtomicUsize::new(0));
        let counted = got.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                if conn.read(&mut buf).await.unwrap_or(0) > 0 {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\nconnection: close\r\n\r\n{\"done\":true}")
                    .await;
            }
        });
        (port, got)
    }

    fn rule(allow_private: bool, development: bool) -> WebhookRule {
        WebhookRule {
            allow_private,
            development,
        }
    }

    async fn post(rule: WebhookRule, url: &str) -> Result<Answer, String> {
        let url = url::Url::parse(url).unwrap();
        Webhooks::new(rule)
            .post(&url, &[], b"{}".to_vec(), 1024)
            .await
    }

    #[tokio::test]
    async fn production_never_connects_to_loopback_whatever_the_url_says() {
        let (port, got) = receiver().await;
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://localhost:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("https://127.0.0.1:{port}/"),
        ] {
            let e = post(rule(false, false), &url).await.err().expect(&url);
            assert!(e.contains("not a public address"), "{url}: {e}");
        }
        assert_eq!(
            got.load(Ordering::SeqCst),
            0,
            "nothing reached the receiver"
        );
    }

    #[tokio::test]
    async fn loopback_is_reached_only_by_the_development_exception_or_on_purpose() {
        let (port, got) = receiver().await;
        let dev = format!("http://127.0.0.1:{port}/hook");
        let a = post(rule(false, true), &dev).await.unwrap();
        assert_eq!(a.status, 200);
        assert_eq!(a.body.as_deref(), Some(&b"{\"done\":true}"[..]));
        let a = post(rule(false, true), &format!("http://localhost:{port}/")).await;
        assert_eq!(a.unwrap().status, 200);
        // Not the development exception's form: refused even on a development server.
        let (other, other_got) = receiver_at("127.0.1.1").await;
        let e = post(rule(false, true), &format!("http://127.0.1.1:{other}/"))
            .await
            .err()
            .unwrap();
        assert!(e.contains("not a public address"), "{e}");
        assert_eq!(other_got.load(Ordering::SeqCst), 0);
        let a = post(rule(true, false), &format!("http://127.0.0.1:{port}/")).await;
        assert_eq!(a.unwrap().status, 200);
        assert_eq!(got.load(Ordering::SeqCst), 3);
    }
}
