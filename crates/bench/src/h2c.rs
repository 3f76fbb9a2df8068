//! The writers' HTTP/2 lane (h2c, prior knowledge): the `h2` crate driven from the
//! writer's own task.
//!
//! Why not hyper's HTTP/2 client: it hands every request to the connection task
//! through a channel, spawns a task per request to send its body, and answers through
//! a oneshot. With 512 requests in flight over four connections that machinery cost
//! the client ~18 us of CPU per append (0.84 cores at 46,000 appends/s), CPU taken
//! from the server it shares two cores with. Here a writer opens its stream, sends the
//! body with END_STREAM on the same call, and awaits the response head itself; only
//! the connection's frame I/O runs in a task of its own (one per connection).

use std::net::SocketAddr;

use bytes::Bytes;
use h2::client::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use tokio::net::TcpStream;

use crate::BenchError;

/// Stream-level receive window offered to the server (responses are small; this is
/// what hyper's client was configured with before).
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// One handle on an HTTP/2 connection. Handles made with [`H2::share`] multiplex on
/// the same connection; a handle whose request fails opens a connection of its own
/// for its next one.
pub struct H2 {
    addr: SocketAddr,
    send: Option<SendRequest<Bytes>>,
}

impl H2 {
    /// Connects and starts the connection's frame I/O task.
    pub async fn connect(addr: SocketAddr) -> Result<H2, BenchError> {
        let mut h2 = H2 { addr, send: None };
        h2.establish().await?;
        Ok(h2)
    }

    /// Another handle on the same connection.
    pub fn share(&self) -> H2 {
        H2 {
            addr: self.addr,
            send: self.send.clone(),
        }
    }

    async fn establish(&mut self) -> Result<(), BenchError> {
        if self.send.is_some() {
            return Ok(());
        }
        let err = |e: &dyn std::fmt::Display| BenchError::Connect(format!("{}: {e}", self.addr));
        let tcp = TcpStream::connect(self.addr).await.map_err(|e| err(&e))?;
        let _ = tcp.set_nodelay(true);
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_concurrent_reset_streams(1024)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| err(&e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        self.send = Some(send);
        Ok(())
    }

    /// POSTs `body` to `uri` (absolute: scheme and authority become the request's
    /// pseudo-headers) and returns the response's status once its body was read.
    pub async fn post(
        &mut self,
        uri: &Uri,
        content_type: &HeaderValue,
        body: Bytes,
    ) -> Result<u16, BenchError> {
        self.establish().await?;
        let result = self.exchange(uri, content_type, body).await;
        if result.is_err() {
            self.send = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        uri: &Uri,
        content_type: &HeaderValue,
        body: Bytes,
    ) -> Result<u16, BenchError> {
        let send = self.send.as_mut().expect("established above");
        // Waits for the server's concurrent-stream limit to allow one more.
        std::future::poll_fn(|cx| send.poll_ready(cx))
            .await
            .map_err(request_error)?;
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri.clone();
        request
            .headers_mut()
            .insert(CONTENT_TYPE, content_type.clone());
        let end_with_headers = body.is_empty();
        let (response, mut stream) = send
            .send_request(request, end_with_headers)
            .map_err(request_error)?;
        if !end_with_headers {
            // Queued whole: h2 sends what the window allows and the rest as the
            // server grants more.
            stream.send_data(body, true).map_err(request_error)?;
        }
        let response = response.await.map_err(request_error)?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(request_error)?;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        Ok(status)
    }
}

fn request_error(e: h2::Error) -> BenchError {
    BenchError::Request(e.to_string())
}
