//! `live=sse`: data events with the stream's bytes (base64 for binary content types,
//! a JSON array for JSON streams), each followed by a control event carrying the next
//! offset. The connection ends after `sse_max_duration` so caches can collapse
//! readers, at server shutdown, at once when the stream is closed and fully
//! delivered, and when the credential it was opened with is revoked or expires (the
//! client's reconnection then gets 401).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Response, StatusCode};
use base64::Engine as _;
use bytes::Bytes;
use picomq_engine::{EngineError, Offset, StreamRef, WaitOutcome};
use tokio::sync::watch;

use super::read::body_of;
use crate::app::AppState;
use crate::auth::{Auth, Principal};
use crate::cursor::next_cursor;
use crate::headers::STREAM_SSE_DATA_ENCODING;

/// Data one SSE event carries at most: an event is built whole (and base64-encoded for
/// binary streams) before it is sent, so it stays small whatever `--max-read-bytes` is.
const SSE_READ_BYTES: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Encoding {
    Text,
    Base64,
}

pub fn respond(
    app: Arc<AppState>,
    stream: StreamRef,
    from: Offset,
    cursor: Option<String>,
    slot: Option<crate::limits::LiveSlot>,
    principal: Option<Principal>,
) -> Response<Body> {
    let media = picomq_engine::domain::media_type(&stream.handle.config.content_type);
    let encoding = if media.starts_with("text/") || media == "application/json" {
        Encoding::Text
    } else {
        Encoding::Base64
    };
    app.live_readers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let credential = principal.and_then(|p| Credential::new(&app, p));
    // The connection's task runs the event loop itself as it polls the body: an
    // event costs no hand-over between tasks, and a client that goes away drops
    // the loop (and its slot) with the body.
    let pump = Pump {
        app,
        stream,
        offset: from,
        client_cursor: cursor,
        encoding,
        credential,
        started: Instant::now(),
        phase: Phase::Read,
        _slot: slot,
    };
    let body = futures::stream::unfold(pump, |mut pump| async move {
        match pump.next().await {
            Ok(Some(events)) => Some((Ok::<_, Infallible>(events), pump)),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(stream = %pump.stream.handle.config.name, error = %e, "SSE ended");
                None
            }
        }
    });
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no");
    if let Encoding::Base64 = encoding {
        r = r.header(STREAM_SSE_DATA_ENCODING, "base64");
    }
    r.body(Body::from_stream(body)).expect("valid response")
}

/// Why the event loop stopped early: the server is shutting down, the credential
/// ended, or the stream went away.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stop {
    #[error("server shutting down")]
    ShuttingDown,
    #[error("the credential was revoked or expired")]
    CredentialEnded,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The credential an SSE connection was opened with, watched for as long as it runs.
pub(crate) struct Credential {
    auth: Arc<Auth>,
    principal: Principal,
    revocations: watch::Receiver<u64>,
}

impl Credential {
    /// `None` with `--auth off`: nothing to watch.
    pub(crate) fn new(app: &AppState, principal: Principal) -> Option<Credential> {
        let auth = app.auth.clone()?;
        let revocations = auth.revocations();
        Some(Credential {
            auth,
            principal,
            revocations,
        })
    }

    pub(crate) fn check(&self) -> Result<(), Stop> {
        if self.auth.still_valid(&self.principal, self.auth.now_ms()) {
            Ok(())
        } else {
            Err(Stop::CredentialEnded)
        }
    }

    /// How long until it expires, if it does.
    fn remaining(&self) -> Option<Duration> {
        let expires = Auth::expires_ms(&self.principal)?;
        Some(Duration::from_millis(
            expires.saturating_sub(self.auth.now_ms()),
        ))
    }
}

/// Resolves after the next revocation anywhere on the node; never without a credential.
async fn revoked(credential: &mut Option<Credential>) {
    if let Some(c) = credential {
        if c.revocations.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Where an SSE connection's event loop is: the next body chunk is a read, or a wait
/// for more first (the last event said up to date), or there is none.
enum Phase {
    Read,
    Wait,
    Done,
}

/// One SSE connection's event loop, run by the connection as it polls the body.
struct Pump {
    app: Arc<AppState>,
    stream: StreamRef,
    offset: Offset,
    client_cursor: Option<String>,
    encoding: Encoding,
    credential: Option<Credential>,
    started: Instant,
    phase: Phase,
    /// Held for as long as the connection is served.
    _slot: Option<crate::limits::LiveSlot>,
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.app
            .live_readers
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Pump {
    /// The next body chunk (a data event and its control event), or `None` when the
    /// connection ends.
    async fn next(&mut self) -> Result<Option<Bytes>, Stop> {
        loop {
            match self.phase {
                Phase::Done => return Ok(None),
                Phase::Wait => {
                    if !self.wait().await? {
                        self.phase = Phase::Done;
                        return Ok(None);
                    }
                    self.phase = Phase::Read;
                }
                Phase::Read => {
                    // A reader catching up never waits, so look at shutdown here: at
                    // once, it resumes from the last control event it took.
                    if self.app.shutdown.is_fired() {
                        return Err(Stop::ShuttingDown);
                    }
                    return self.read().await.map(Some);
                }
            }
        }
    }

    async fn read(&mut self) -> Result<Bytes, Stop> {
        if let Some(c) = &self.credential {
            c.check()?;
        }
        let app = &self.app;
        let chunk = app
            .engine
            .read(
                &self.stream,
                self.offset,
                app.engine.config().read_bytes_max.min(SSE_READ_BYTES),
            )
            .await?;
        // The data event and its control event go out as one body chunk: one write,
        // not two.
        let mut events = String::new();
        if !chunk.segments.is_empty() {
            push_data_event(&mut events, &body_of(&chunk), self.encoding);
        }
        self.offset = chunk.next;
        // Offsets are digits and `_`, cursors digits: nothing to escape. Written
        // without `write!`, whose formatting machinery cost ~2,400 instructions per
        // event for these two numbers (callgrind).
        events.push_str("event: control\ndata:{\"streamNextOffset\":\"");
        events.push_str(std::str::from_utf8(&self.offset.encode()).expect("digits and _"));
        events.push('"');
        if chunk.closed {
            events.push_str(",\"streamClosed\":true,\"upToDate\":true");
        } else {
            let cursor = next_cursor(
                self.app.engine.clock().now_ms() / 1000,
                self.client_cursor.as_deref(),
            );
            events.push_str(",\"streamCursor\":\"");
            crate::digits::push_decimal(&mut events, cursor);
            events.push('"');
            if chunk.up_to_date {
                events.push_str(",\"upToDate\":true");
            }
        }
        events.push_str("}\n\n");
        self.phase = if chunk.closed {
            Phase::Done
        } else if chunk.up_to_date {
            Phase::Wait
        } else {
            Phase::Read
        };
        Ok(Bytes::from(events))
    }

    /// Waits for data past the offset; false when the connection should end instead
    /// (its maximum duration, or shutdown: the last control event already named the
    /// offset to resume from).
    async fn wait(&mut self) -> Result<bool, Stop> {
        let app = self.app.clone();
        let remaining = app.sse_max_duration.saturating_sub(self.started.elapsed());
        if remaining.is_zero() {
            return Ok(false);
        }
        let mut timeout = remaining.min(app.long_poll_timeout);
        if let Some(expiry) = self.credential.as_ref().and_then(Credential::remaining) {
            timeout = timeout.min(expiry);
        }
        // Wake on new data, on close, or when a token was revoked (the next read
        // looks at this connection's). A client that goes away drops this future.
        let deadline = Instant::now() + timeout;
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::select! {
                r = app.engine.wait(&self.stream, self.offset, left) => break r?,
                _ = app.shutdown.fired() => return Ok(false),
                _ = revoked(&mut self.credential) => {
                    if let Some(c) = &self.credential {
                        c.check()?;
                    }
                }
            }
        };
        app.engine.touch(&self.stream);
        // The stream moved to another node: end here; the client resumes from the
        // last control event, and the new request goes to the new owner.
        if let WaitOutcome::Moved = outcome {
            return Ok(false);
        }
        if let WaitOutcome::TimedOut = outcome {
            if self.started.elapsed() >= app.sse_max_duration {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// One `data` event; every line of the payload gets its own `data:` field.
fn push_data_event(out: &mut String, payload: &[u8], encoding: Encoding) {
    let text = match encoding {
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .encode(payload)
            .into(),
        // Valid UTF-8 (every JSON message is) is borrowed, not copied. `from_utf8`
        // first: it checks ASCII a word at a time, where `from_utf8_lossy` walks
        // byte by byte (7,200 instructions per 1 KiB record, callgrind).
        Encoding::Text => match std::str::from_utf8(payload) {
            Ok(text) => text.into(),
            Err(_) => String::from_utf8_lossy(payload),
        },
    };
    out.reserve(text.len() + 96);
    out.push_str("event: data\n");
    // Most payloads (a JSON message) are one line: one vectorised search for a line
    // break, then one copy, instead of two splitting passes over the payload.
    if memchr::memchr2(b'\n', b'\r', text.as_bytes()).is_none() {
        push_data_line(out, &text);
        out.push('\n');
        return;
    }
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        for piece in line.split('\r') {
            push_data_line(out, piece);
        }
    }
    out.push('\n');
}

/// One `data:` field holding `line` (which has no line break).
fn push_data_line(out: &mut String, line: &str) {
    // A parser drops one space after the colon: add one only when the line itself
    // starts with a space, so that space survives.
    out.push_str(if line.starts_with(' ') {
        "data: "
    } else {
        "data:"
    });
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_event(payload: &[u8], encoding: Encoding) -> String {
        let mut out = String::new();
        push_data_event(&mut out, payload, encoding);
        out
    }

    #[test]
    fn multiline_payloads_keep_their_lines() {
        assert_eq!(
            data_event(b"a\nb", Encoding::Text),
            "event: data\ndata:a\ndata:b\n\n"
        );
        assert_eq!(
            data_event(b" a\r\nb\rc", Encoding::Text),
            "event: data\ndata:  a\ndata:b\ndata:c\n\n"
        );
        assert_eq!(
            data_event(&[0, 1, 2], Encoding::Base64),
            "event: data\ndata:AAEC\n\n"
        );
        // One line (the common case).
        assert_eq!(
            data_event("{\"k\":\"\u{e9}\"}".as_bytes(), Encoding::Text),
            "event: data\ndata:{\"k\":\"\u{e9}\"}\n\n"
        );
        assert_eq!(data_event(b"", Encoding::Text), "event: data\ndata:\n\n");
        assert_eq!(
            data_event(b" x", Encoding::Text),
            "event: data\ndata:  x\n\n"
        );
        // Not UTF-8: replaced, never dropped.
        assert_eq!(
            data_event(b"a\xffb", Encoding::Text),
            "event: data\ndata:a\u{fffd}b\n\n"
        );
    }
}
