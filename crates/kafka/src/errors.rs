//! Kafka's error codes, and what each engine error is to a Kafka client.

use picomq_engine::EngineError;

/// The protocol's error codes used here.
pub(crate) mod code {
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_CONFIG: i16 = 40;
    pub const INVALID_REQUEST: i16 = 42;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
    pub const INVALID_RECORD: i16 = 87;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
}

/// The code and message a Kafka client gets for an engine error.
pub(crate) fn of(e: &EngineError) -> (i16, String) {
    let c = match e {
        EngineError::NotFound | EngineError::Gone => code::UNKNOWN_TOPIC_OR_PARTITION,
        EngineError::Trimmed { .. } => code::OFFSET_OUT_OF_RANGE,
        EngineError::ProducerStaleEpoch { .. } => code::INVALID_PRODUCER_EPOCH,
        EngineError::ProducerEpochMustStartAtZero | EngineError::ProducerSeqGap { .. } => {
            code::OUT_OF_ORDER_SEQUENCE_NUMBER
        }
        EngineError::PayloadTooLarge(_) => code::MESSAGE_TOO_LARGE,
        // Retriable: the client backs off and tries again (after a metadata
        // refresh for a moved stream).
        EngineError::NotOwner | EngineError::Fenced => code::NOT_LEADER_OR_FOLLOWER,
        EngineError::Overloaded(_) | EngineError::Unavailable(_) => code::REQUEST_TIMED_OUT,
        EngineError::Internal(_) => code::UNKNOWN_SERVER_ERROR,
        EngineError::BadRequest(_)
        | EngineError::Invalid(_)
        | EngineError::Conflict(_)
        | EngineError::ContentTypeMismatch { .. }
        | EngineError::StreamClosed { .. }
        | EngineError::StreamSeqConflict { .. }
        | EngineError::SeqMismatch { .. }
        | EngineError::ForkSourceNotFound
        | EngineError::SchemaViolation(_) => code::INVALID_RECORD,
    };
    (c, e.to_string())
}

/// The code a group request gets for an engine error: a group whose offsets
/// stream moved to another node has another coordinator.
pub(crate) fn of_group(e: &EngineError) -> i16 {
    match e {
        EngineError::NotOwner | EngineError::Fenced => crate::groups::NOT_COORDINATOR,
        e => of(e).0,
    }
}
