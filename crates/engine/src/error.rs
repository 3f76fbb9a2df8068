//! Errors of the storage engine and stream service. The HTTP edge maps each variant
//! to a status code in exactly one place (`picomq-http`'s `error` module).

use crate::domain::Invalid;
use crate::offset::Offset;

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("stream not found")]
    NotFound,
    #[error("stream was deleted but still has forks reading its data")]
    Gone,
    /// The offset is below the stream's first retained offset (trimmed by an admin
    /// or by age retention); `start` is where reading can resume.
    #[error("offset is before the earliest retained offset {start}: that data was trimmed (retention); resume from {start} or from -1")]
    Trimmed { start: Offset },
    #[error("{0}")]
    BadRequest(String),
    /// A request the engine refuses for a reason each edge words for its clients.
    #[error("{0}")]
    Invalid(Invalid),
    #[error("{0}")]
    Conflict(String),
    #[error("content type {got:?} does not match the stream's {expected:?}")]
    ContentTypeMismatch { expected: String, got: String },
    #[error("stream is closed")]
    StreamClosed { tail: Offset },
    #[error("writer sequence {got:?} is not greater than the last one, {last:?}")]
    StreamSeqConflict { last: String, got: String },
    /// A conditional append found another next sequence number.
    #[error("the stream's next sequence number is {next_seq}")]
    SeqMismatch { next_seq: u64 },
    #[error("producer epoch {got} is older than the current epoch {current}")]
    ProducerStaleEpoch { current: u64, got: u64 },
    #[error("a new producer epoch must start at sequence 0")]
    ProducerEpochMustStartAtZero,
    #[error("producer sequence gap: expected {expected}, received {received}")]
    ProducerSeqGap { expected: u64, received: u64 },
    #[error("fork source stream not found")]
    ForkSourceNotFound,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    Unavailable(String),
    /// In a cluster: another node serves this stream (or it is moving between
    /// nodes); the edge forwards the request or asks the client to retry.
    #[error(
        "this stream is served by another node of the cluster, or is moving between nodes; retry"
    )]
    NotOwner,
    /// In a cluster: another member took this node's log over (its lease lapsed);
    /// it may no longer write or index anything.
    #[error("this node's log was taken over by another member of the cluster; retry")]
    Fenced,
    /// An append refused by the schema its stream is bound to: nothing stored.
    #[error("{0}")]
    SchemaViolation(Box<crate::schemas::SchemaViolation>),
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn bad_request(msg: impl Into<String>) -> Self {
        EngineError::BadRequest(msg.into())
    }
    pub fn conflict(msg: impl Into<String>) -> Self {
        EngineError::Conflict(msg.into())
    }
}

impl From<Invalid> for EngineError {
    fn from(e: Invalid) -> Self {
        EngineError::Invalid(e)
    }
}

impl From<sqlx::Error> for EngineError {
    /// A metadata store that cannot be reached, or that asks to be retried, is a
    /// 503 like an unreachable object store; anything else is a bug (500).
    fn from(e: sqlx::Error) -> Self {
        if metadata_store_unavailable(&e) {
            EngineError::Unavailable(format!("metadata store unavailable: {e}; retry"))
        } else {
            EngineError::Internal(format!("metadata store: {e}"))
        }
    }
}

/// Connection failures, an exhausted or closed pool, and the SQLSTATE classes that
/// say "not now" (08 connection exception, 53 insufficient resources, 57 operator
/// intervention such as a shutdown, 40001/40P01 serialization failure and deadlock).
/// A protocol error is one too: sqlx reports a connection closed during its start-up
/// handshake as one ("unexpected response from SSLRequest: 0x00"), and the
/// connection is discarded, so a retry starts on a fresh one.
fn metadata_store_unavailable(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed => true,
        E::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57")
                || code == "40001"
                || code == "40P01"
        }),
        _ => false,
    }
}

impl From<object_store::Error> for EngineError {
    fn from(e: object_store::Error) -> Self {
        EngineError::Unavailable(format!("object store: {e}"))
    }
}

#[cfg(test)]
mod sqlx_error_tests {
    use super::EngineError;

    #[test]
    fn an_unreachable_metadata_store_is_retryable_and_a_bug_is_not() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let closed_in_handshake =
            sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        for e in [
            sqlx::Error::Io(reset),
            sqlx::Error::PoolTimedOut,
            closed_in_handshake,
        ] {
            assert!(
                matches!(EngineError::from(e), EngineError::Unavailable(_)),
                "transient"
            );
        }
        assert!(matches!(
            EngineError::from(sqlx::Error::RowNotFound),
            EngineError::Internal(_)
        ));
    }
}
