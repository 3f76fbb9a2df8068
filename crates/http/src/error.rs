//! The one place where errors become HTTP responses: a status code, the protocol
//! headers a client needs to react (Stream-Closed, Producer-Epoch, ...), and a JSON
//! body `{"error": {"code": ..., "message": ...}}` saying what was wrong.

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use picomq_engine::{EngineError, Invalid};

use crate::headers::*;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub headers: Vec<(HeaderName, String)>,
    /// Extra fields of the JSON `error` object (e.g. `startOffset` of a 410).
    pub fields: Vec<(&'static str, serde_json::Value)>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
            fields: Vec::new(),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// A `HeaderName` constant, or a `&str` name (parsed here: errors are rare).
    pub fn with_header<N: TryInto<HeaderName>>(mut self, name: N, value: impl ToString) -> Self {
        if let Ok(name) = name.try_into() {
            self.headers.push((name, value.to_string()));
        }
        self
    }
    /// Adds a field to the JSON `error` object.
    pub fn with_field(mut self, name: &'static str, value: impl ToString) -> Self {
        self.fields
            .push((name, serde_json::Value::String(value.to_string())));
        self
    }
    /// The same error under another code (the Durable Streams subscription APIs
    /// name theirs in capitals: `FENCED`, `ALREADY_CLAIMED`).
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }
    /// Adds a field of any JSON type to the `error` object.
    pub fn with_json_field(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.fields.push((name, value));
        self
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        use EngineError as E;
        match e {
            E::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            E::Gone => ApiError::new(StatusCode::GONE, "gone", message),
            // PROTOCOL.md: "410 Gone: Offset is before the earliest retained position".
            E::Trimmed { start } => ApiError::new(StatusCode::GONE, "offset_trimmed", message)
                .with_header(STREAM_START_OFFSET, start)
                .with_field("startOffset", start),
            E::BadRequest(_) => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message),
            E::Invalid(reason) => ApiError::from(reason),
            E::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            E::ContentTypeMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "content_type_mismatch", message)
            }
            E::StreamClosed { tail } => {
                ApiError::new(StatusCode::CONFLICT, "stream_closed", message)
                    .with_header(STREAM_CLOSED, "true")
                    .with_header(STREAM_NEXT_OFFSET, tail)
            }
            E::StreamSeqConflict { last, got } => ApiError::new(
                StatusCode::CONFLICT,
                "stream_seq_conflict",
                format!("Stream-Seq {got:?} is not greater than the last one, {last:?}"),
            ),
            E::SeqMismatch { next_seq } => ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "seq_mismatch",
                format!("match_seq differs from the stream's next sequence number, {next_seq}"),
            )
            .with_json_field("next_seq", serde_json::json!(next_seq)),
            E::ProducerStaleEpoch { current, .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "producer_stale_epoch", message)
                    .with_header(PRODUCER_EPOCH, current)
            }
            E::ProducerEpochMustStartAtZero => ApiError::new(
                StatusCode::BAD_REQUEST,
                "producer_epoch_seq",
                "a new producer epoch must start at Producer-Seq 0",
            ),
            E::ProducerSeqGap { expected, received } => {
                ApiError::new(StatusCode::CONFLICT, "producer_seq_gap", message)
                    .with_header(PRODUCER_EXPECTED_SEQ, expected)
                    .with_header(PRODUCER_RECEIVED_SEQ, received)
            }
            E::ForkSourceNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "fork_source_not_found", message)
            }
            E::PayloadTooLarge(_) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            }
            E::Overloaded(_) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "overloaded", message)
                .with_header(header::RETRY_AFTER, 1),
            E::Unavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
                    .with_header(header::RETRY_AFTER, 1)
            }
            E::NotOwner => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_owner", message)
                .with_header(header::RETRY_AFTER, 1)
                .with_header(crate::members::NOT_OWNER, 1),
            E::Fenced => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "fenced", message)
                .with_header(header::RETRY_AFTER, 1),
            E::SchemaViolation(v) => {
                ApiError::new(StatusCode::BAD_REQUEST, "schema_violation", message)
                    .with_json_field("subject", serde_json::json!(v.subject))
                    .with_json_field("version", serde_json::json!(v.version))
                    .with_json_field("index", serde_json::json!(v.index))
                    .with_json_field("path", serde_json::json!(v.path))
                    .with_json_field("rule", serde_json::json!(v.rule))
            }
            E::Internal(_) => {
                tracing::error!(error = %message, "internal error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

/// The engine's reasons, worded with the protocol's header names.
impl From<picomq_consumers::ConsumerError> for ApiError {
    fn from(e: picomq_consumers::ConsumerError) -> Self {
        use picomq_consumers::{ConsumerError as C, Refusal as R};
        match e {
            C::Engine(e) => ApiError::from(e),
            C::Refused {
                why,
                code,
                message,
                fields,
            } => {
                let status = match why {
                    R::Invalid => StatusCode::BAD_REQUEST,
                    R::NotFound => StatusCode::NOT_FOUND,
                    R::Conflict => StatusCode::CONFLICT,
                    R::Unauthorized => StatusCode::UNAUTHORIZED,
                    R::Busy => StatusCode::TOO_MANY_REQUESTS,
                };
                let mut error = ApiError::new(status, code, message);
                error.fields = fields;
                error
            }
        }
    }
}

impl From<crate::headers::BadHeader> for ApiError {
    fn from(e: crate::headers::BadHeader) -> Self {
        ApiError::bad_request(e.0)
    }
}

impl From<Invalid> for ApiError {
    fn from(reason: Invalid) -> Self {
        use Invalid as I;
        let message = match &reason {
            I::ContentTypeTooLong { max } => format!("Content-Type is longer than {max} bytes"),
            I::ProducerIdLength { max } => format!("Producer-Id must be 1 to {max} bytes"),
            I::StreamSeqTooLong { max } => format!("Stream-Seq is longer than {max} bytes"),
            I::EmptyAppend => {
                "append body is empty (only a close, Stream-Closed: true, may be empty)".into()
            }
            I::RecordNotJson { .. } => reason.to_string(),
            I::TtlWithExpiry => "Stream-TTL and Stream-Expires-At are mutually exclusive".into(),
            I::ExpiryNotRfc3339 => "Stream-Expires-At must be an RFC 3339 timestamp".into(),
            I::ForkOffsetPastTail => "Stream-Fork-Offset is beyond the source stream's tail".into(),
            I::ForkSubOffsetWithoutOffset => {
                "Stream-Fork-Sub-Offset needs an explicit Stream-Fork-Offset".into()
            }
            I::ForkSubOffsetPastAppend => {
                "Stream-Fork-Sub-Offset is past the end of the next append".into()
            }
            // The same words whether it came in a header or a JSON body.
            I::EmptyName | I::NameTooLong { .. } | I::Retention { .. } => reason.to_string(),
        };
        ApiError::bad_request(message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let mut body =
            serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        for (name, value) in self.fields {
            body["error"][name] = value;
        }
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        }
        resp
    }
}
