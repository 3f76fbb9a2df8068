//! The consumers' errors, in their own terms: a refusal of the request (with the
//! machine-readable code clients see), or an error of the stream service below. The
//! HTTP edge maps them to statuses in `http/src/error.rs`, the one place that does.

use picomq_engine::EngineError;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is wrong (a bad name, body or value).
    Invalid,
    /// What it names does not exist (or may not be seen).
    NotFound,
    /// It conflicts with the current state (a fenced generation, a taken name).
    Conflict,
    /// Its wake token is missing or not the current one.
    Unauthorized,
    /// A limit of the node is reached; retry later.
    Busy,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{message}")]
    Refused {
        why: Refusal,
        /// The error code of the answer (`INVALID_REQUEST`, `FENCED`, ...).
        code: &'static str,
        message: String,
        /// More members of the error's JSON body (`current_holder`, ...).
        fields: Vec<(&'static str, serde_json::Value)>,
    },
}

pub type Result<T, E = ConsumerError> = std::result::Result<T, E>;

impl ConsumerError {
    pub fn refused(why: Refusal, code: &'static str, message: impl Into<String>) -> Self {
        ConsumerError::Refused {
            why,
            code,
            message: message.into(),
            fields: Vec::new(),
        }
    }

    /// A bad request (code `bad_request`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::refused(Refusal::Invalid, "bad_request", message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::refused(Refusal::NotFound, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::refused(Refusal::Conflict, code, message)
    }

    /// The same refusal with another code.
    pub fn with_code(self, code: &'static str) -> Self {
        match self {
            ConsumerError::Refused {
                why,
                message,
                fields,
                ..
            } => ConsumerError::Refused {
                why,
                code,
                message,
                fields,
            },
            other => other,
        }
    }

    /// The same refusal with one more member in its JSON body.
    pub fn with_field(mut self, name: &'static str, value: serde_json::Value) -> Self {
        if let ConsumerError::Refused { fields, .. } = &mut self {
            fields.push((name, value));
        }
        self
    }

    /// An error of the server itself.
    pub fn internal(message: impl Into<String>) -> Self {
        ConsumerError::Engine(EngineError::Internal(message.into()))
    }

    /// The code of a refusal (`FENCED`, `group_not_found`, ...); `engine` for an
    /// error of the stream service.
    pub fn code(&self) -> &'static str {
        match self {
            ConsumerError::Refused { code, .. } => code,
            ConsumerError::Engine(_) => "engine",
        }
    }

    /// The message of the error, whatever its kind.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl From<picomq_engine::Invalid> for ConsumerError {
    fn from(reason: picomq_engine::Invalid) -> Self {
        ConsumerError::Engine(EngineError::Invalid(reason))
    }
}
