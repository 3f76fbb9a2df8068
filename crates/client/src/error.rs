//! The SDK's one error type: what the server answered when it refused a request
//! (status, its JSON `error.code` and `message`, and the protocol headers a client
//! reacts to, decoded once into a [`Reason`]), or why no answer came. Every error
//! names the request that failed.

use std::sync::Arc;
use std::time::Duration;

use crate::offset::Offset;
use crate::transport::{ClientError, Response, StatusCode};

/// Why an SDK call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No answer: the server was unreachable, the connection broke, or TLS failed.
    #[error("{request}: {source}")]
    Transport {
        /// The request, e.g. `POST /orders`.
        request: String,
        /// What the HTTP client reported.
        source: ClientError,
    },
    /// No answer within the time allowed.
    #[error("{request}: no answer within {after:?}")]
    Timeout {
        /// The request, e.g. `POST /orders`.
        request: String,
        /// How long it waited.
        after: Duration,
    },
    /// The server answered with an error status.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The server answered with a success status, but not in the expected form.
    #[error("{request}: unexpected answer: {message}")]
    Decode {
        /// The request, e.g. `GET /orders?offset=-1`.
        request: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// An argument the SDK refuses before sending anything.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A [`Producer`](crate::Producer) stopped on this error; nothing more is sent.
    #[error("the producer stopped: {0}")]
    ProducerStopped(Arc<Error>),
}

/// An error answer of the server.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The request, e.g. `POST /orders`.
    pub request: String,
    /// The status code.
    pub status: StatusCode,
    /// The JSON body's `error.code` (`not_found`, `FENCED`, ...), if it had one.
    pub code: Option<String>,
    /// The JSON body's `error.message`, or the body as text.
    pub message: String,
    /// What a client reacts to, decoded from the headers and body.
    pub reason: Reason,
    /// The whole JSON `error` object (`Null` if the body was not JSON).
    pub details: serde_json::Value,
}

/// The refusals a client handles differently from a plain failure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// `404`: no such stream, group or subscription.
    NotFound,
    /// `409` with `Stream-Closed: true`: the stream is closed; appends are refused.
    StreamClosed {
        /// The closed stream's final offset.
        next_offset: Option<Offset>,
    },
    /// `403` with `Producer-Epoch`: a producer with a later epoch took over this
    /// producer id (this one is a zombie).
    StaleEpoch {
        /// The server's epoch for the producer id.
        server_epoch: u64,
    },
    /// `409` with `Producer-Expected-Seq`: batches before this one have not arrived.
    SequenceGap {
        /// The `Producer-Seq` the server expects next.
        expected: u64,
        /// The `Producer-Seq` it received.
        received: u64,
    },
    /// `412` `seq_mismatch` (native API `match_seq`): the stream's next sequence
    /// number is not the one the append was conditional on.
    SeqMismatch {
        /// The stream's next sequence number.
        next_seq: u64,
    },
    /// `410`: the position asked for was trimmed away (or the stream is
    /// soft-deleted: then both fields are `None`).
    Gone {
        /// Where the retained data starts (Durable Streams reads).
        start_offset: Option<Offset>,
        /// The first retained sequence number (native record reads).
        first_seq: Option<u64>,
    },
    /// Any other refusal: see the status, code and message.
    Other,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: HTTP {}", self.request, self.status.as_u16())?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl ApiError {
    /// Reads an error answer: the JSON body and the protocol headers.
    pub(crate) fn from_response(request: String, r: &Response) -> ApiError {
        let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let details = json.get("error").cloned().unwrap_or_default();
        let code = details["code"].as_str().map(str::to_string);
        let message = details["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| r.text().trim().to_string());
        let reason = reason_of(r, code.as_deref(), &details);
        ApiError {
            request,
            status: r.status,
            code,
            message,
            reason,
            details,
        }
    }
}

fn header_u64(r: &Response, name: &str) -> Option<u64> {
    r.header(name)?.trim().parse().ok()
}

fn reason_of(r: &Response, code: Option<&str>, details: &serde_json::Value) -> Reason {
    let u64_field = |k: &str| {
        details[k]
            .as_u64()
            .or_else(|| details[k].as_str()?.parse().ok())
    };
    match r.status.as_u16() {
        404 => Reason::NotFound,
        409 if r.header("stream-closed") == Some("true") => Reason::StreamClosed {
            next_offset: r.header("stream-next-offset").map(Offset::from),
        },
        409 if r.header("producer-expected-seq").is_some() => Reason::SequenceGap {
            expected: header_u64(r, "producer-expected-seq").unwrap_or(0),
            received: header_u64(r, "producer-received-seq").unwrap_or(0),
        },
        403 if r.header("producer-epoch").is_some() => Reason::StaleEpoch {
            server_epoch: header_u64(r, "producer-epoch").unwrap_or(0),
        },
        412 if code == Some("seq_mismatch") || details.get("next_seq").is_some() => {
            Reason::SeqMismatch {
                next_seq: u64_field("next_seq").unwrap_or(0),
            }
        }
        410 => Reason::Gone {
            start_offset: r
                .header("stream-start-offset")
                .or_else(|| details["startOffset"].as_str())
                .map(Offset::from),
            first_seq: u64_field("first_seq"),
        },
        _ => Reason::Other,
    }
}

impl Error {
    /// The error answer of a request that got a non-success status.
    pub(crate) fn from_response(request: String, r: &Response) -> Error {
        Error::Api(Box::new(ApiError::from_response(request, r)))
    }

    pub(crate) fn decode(request: &str, message: impl Into<String>) -> Error {
        Error::Decode {
            request: request.to_string(),
            message: message.into(),
        }
    }

    /// The server's answer, if it refused the request.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(e) => Some(e),
            Error::ProducerStopped(e) => e.api(),
            _ => None,
        }
    }

    /// The status code, if the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.api().map(|e| e.status)
    }

    /// The server's `error.code`, if it answered with one.
    pub fn code(&self) -> Option<&str> {
        self.api()?.code.as_deref()
    }

    /// The typed reason of a refusal ([`Reason::Other`] for untyped ones).
    pub fn reason(&self) -> Option<&Reason> {
        self.api().map(|e| &e.reason)
    }

    /// Whether trying the same request again may succeed: no answer (except a
    /// refused certificate), a timeout, `408`, `429` or a `5xx` (a server starting
    /// up, restarting or overloaded).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport { source, .. } => {
                !matches!(source, ClientError::Tls(_) | ClientError::Request(_))
            }
            Error::Timeout { .. } => true,
            Error::Api(e) => {
                let s = e.status.as_u16();
                s == 408 || s == 429 || (500..600).contains(&s)
            }
            _ => false,
        }
    }
}

/// `Result` with the SDK's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hyper::header::{HeaderMap, HeaderName, HeaderValue};

    fn answer(status: u16, headers: &[(&'static str, &str)], body: &str) -> Response {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                HeaderName::from_static(k),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: Bytes::from(body.to_string()),
        }
    }

    fn reason(r: Response) -> Reason {
        ApiError::from_response("POST /s".into(), &r).reason
    }

    #[test]
    fn refusals_a_client_reacts_to_are_typed() {
        let gap = answer(
            409,
            &[
                ("producer-expected-seq", "3"),
                ("producer-received-seq", "5"),
            ],
            "",
        );
        assert_eq!(
            reason(gap),
            Reason::SequenceGap {
                expected: 3,
                received: 5
            }
        );
        let stale = answer(403, &[("producer-epoch", "7")], "");
        assert_eq!(reason(stale), Reason::StaleEpoch { server_epoch: 7 });
        let closed = answer(
            409,
            &[("stream-closed", "true"), ("stream-next-offset", "0_9")],
            "",
        );
        assert_eq!(
            reason(closed),
            Reason::StreamClosed {
                next_offset: Some(Offset::from("0_9"))
            }
        );
        let mismatch = answer(
            412,
            &[],
            r#"{"error": {"code": "seq_mismatch", "message": "no", "next_seq": 42}}"#,
        );
        let e = ApiError::from_response("POST /s".into(), &mismatch);
        assert_eq!(e.reason, Reason::SeqMismatch { next_seq: 42 });
        assert_eq!(
            (e.code.as_deref(), e.message.as_str()),
            (Some("seq_mismatch"), "no")
        );
        let trimmed = answer(
            410,
            &[],
            r#"{"error": {"code": "offset_trimmed", "startOffset": "0_5", "first_seq": 5}}"#,
        );
        assert_eq!(
            reason(trimmed),
            Reason::Gone {
                start_offset: Some(Offset::from("0_5")),
                first_seq: Some(5)
            }
        );
        let plain = answer(500, &[], "boom");
        let e = Error::from_response("GET /s".into(), &plain);
        assert!(e.is_retryable());
        assert_eq!(e.to_string(), "GET /s: HTTP 500: boom");
    }
}
