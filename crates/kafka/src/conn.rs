//! One Kafka connection: size-prefixed frames in, answers out in request order.
//!
//! Requests run concurrently (a fetch waiting for data must not hold up a produce
//! behind it on the same connection), up to `in_flight_per_connection`; past that
//! the connection is not read until the oldest answer is written, so a client that
//! does not read its answers stops being read. Produce requests run one after the
//! other in the order they came, so a producer's batches reach each stream in its
//! order (idempotent producers depend on it): the next starts once the last one's
//! appends have their place in their streams, before they are durable, so a
//! producer's requests in flight share flushes. SASL requests run in line: the next
//! request is read only once the connection's identity is settled.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Decodable;
use picomq_http::auth::Principal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::api::{self, Answer};
use crate::Kafka;

/// Who is on the other end of a connection.
#[derive(Clone, Default)]
pub(crate) struct Session {
    /// Set by SASL; `None` on a server without auth, or before authenticating.
    pub principal: Option<Principal>,
    /// The mechanism the client chose in SaslHandshake.
    pub mechanism: Option<String>,
    /// The client's address (shown by DescribeGroups).
    pub peer: String,
}

impl Session {
    pub fn authenticated(&self, kafka: &Kafka) -> bool {
        kafka.auth.is_none() || self.principal.is_some()
    }
}

/// A request as read off the wire.
pub(crate) struct Request {
    pub key: ApiKey,
    pub header: RequestHeader,
    pub body: Bytes,
}

pub(crate) async fn run<S>(socket: S, peer: String, kafka: Arc<Kafka>) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(socket);
    let (order_tx, mut order_rx) =
        mpsc::channel::<oneshot::Receiver<Answer>>(kafka.config.in_flight_per_connection);
    let writer = tokio::spawn(async move {
        while let Some(answer) = order_rx.recv().await {
            match answer.await {
                Ok(Answer::Frame(frame)) => {
                    let len = (frame.len() as u32).to_be_bytes();
                    wr.write_all(&len).await.map_err(|e| e.to_string())?;
                    wr.write_all(&frame).await.map_err(|e| e.to_string())?;
                }
                Ok(Answer::None) => {}
                Ok(Answer::Close(why)) => return Err(why),
                Err(_) => return Err("a request's task ended without an answer".into()),
            }
        }
        wr.flush().await.map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    });
    let mut session = Session {
        peer,
        ..Session::default()
    };
    // The previous produce's end: the next one starts after it.
    let mut produce_chain: Option<oneshot::Receiver<()>> = None;
    let result = loop {
        let frame = tokio::select! {
            f = read_frame(&mut rd, &kafka.config) => f,
            () = kafka.shutdown.fired() => break Ok(()),
            // The writer stopped (an answer closed the connection): stop reading.
            () = order_tx.closed() => break Ok(()),
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let request = match parse(frame) {
            Ok(r) => r,
            Err(e) => break Err(e),
        };
        let (tx, rx) = oneshot::channel();
        if order_tx.send(rx).await.is_err() {
            break Err("the connection's writer stopped".into());
        }
        if !session.authenticated(&kafka)
            && !matches!(
                request.key,
                ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
            )
        {
            let _ = tx.send(Answer::Close(format!(
                "{:?} before authenticating: only ApiVersions, SaslHandshake and SaslAuthenticate are served",
                request.key
            )));
            break Ok(());
        }
        match request.key {
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate => {
                let answer = api::session_request(&kafka, &mut session, request).await;
                let close = matches!(answer, Answer::Close(_));
                let _ = tx.send(answer);
                if close {
                    break Ok(());
                }
            }
            ApiKey::Produce => {
                let previous = produce_chain.take();
                let (done_tx, done_rx) = oneshot::channel();
                produce_chain = Some(done_rx);
                let kafka = kafka.clone();
                let session = session.clone();
                tokio::spawn(async move {
                    if let Some(previous) = previous {
                        let _ = previous.await;
                    }
                    let answer =
                        api::handle_produce(&kafka, &session, request, Some(done_tx)).await;
                    let _ = tx.send(answer);
                });
            }
            _ => {
                let kafka = kafka.clone();
                let session = session.clone();
                tokio::spawn(async move {
                    let _ = tx.send(api::handle(&kafka, &session, request).await);
                });
            }
        }
    };
    drop(order_tx);
    let written = writer.await.map_err(|e| e.to_string())?;
    result.and(written)
}

/// The next frame; `None` when the client closed the connection between frames.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    config: &crate::KafkaConfig,
) -> Result<Option<Bytes>, String> {
    let (max, idle) = (config.max_request_bytes, config.idle_timeout);
    let mut len = [0u8; 4];
    match tokio::time::timeout(idle, rd.read_exact(&mut len)).await {
        Err(_) => return Err(format!("idle for {idle:?}")),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(_)) => {}
    }
    let len = i32::from_be_bytes(len);
    if len < 8 {
        return Err(format!("a request frame of {len} bytes is too short"));
    }
    if len as usize > max {
        return Err(format!(
            "a request frame of {len} bytes is over --kafka-max-request-bytes ({max})"
        ));
    }
    // Memory follows what arrives, not what the length promises: a client that
    // announces a large frame and sends nothing holds no buffer for it.
    let mut body = Vec::with_capacity((len as usize).min(64 << 10));
    let mut limited = (&mut *rd).take(len as u64);
    let read = limited.read_to_end(&mut body);
    // A frame that starts must finish: a client stalling half way is cut off.
    match tokio::time::timeout(config.request_read_timeout, read).await {
        Err(_) => Err("a request frame stalled half way".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(n)) if n < len as usize => {
            Err("the connection closed half way through a frame".into())
        }
        Ok(Ok(_)) => Ok(Some(Bytes::from(body))),
    }
}

/// The request header, checked; the body is decoded by the API's handler.
fn parse(mut frame: Bytes) -> Result<Request, String> {
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(key).map_err(|_| format!("unknown API key {key}"))?;
    let header_version = key.request_header_version(version.clamp(0, i16::MAX));
    let header = RequestHeader::decode(&mut frame, header_version)
        .map_err(|e| format!("malformed {key:?} request header: {e}"))?;
    Ok(Request {
        key,
        header,
        body: frame,
    })
}
