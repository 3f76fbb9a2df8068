//! The registry's errors, with the Confluent Schema Registry's codes: clients
//! parse `{"error_code": N, "message": "..."}`, and the HTTP status is the code's
//! first three digits.

use picomq_engine::EngineError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryError {
    pub code: u32,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, RegistryError>;

pub const SUBJECT_NOT_FOUND: u32 = 40401;
pub const VERSION_NOT_FOUND: u32 = 40402;
pub const SCHEMA_NOT_FOUND: u32 = 40403;
pub const SUBJECT_SOFT_DELETED: u32 = 40404;
pub const SUBJECT_NOT_SOFT_DELETED: u32 = 40405;
pub const VERSION_SOFT_DELETED: u32 = 40406;
pub const VERSION_NOT_SOFT_DELETED: u32 = 40407;
pub const SUBJECT_LEVEL_CONFIG_NOT_FOUND: u32 = 40408;
pub const INCOMPATIBLE: u32 = 40901;
pub const INVALID_SCHEMA: u32 = 42201;
pub const INVALID_VERSION: u32 = 42202;
pub const INVALID_COMPATIBILITY: u32 = 42203;
pub const INVALID_MODE: u32 = 42204;
pub const REFERENCE_EXISTS: u32 = 42206;
pub const SCHEMA_TOO_LARGE: u32 = 42209;
pub const STORE_ERROR: u32 = 50001;
/// Not one of the registry's: a request it cannot parse (bad JSON, a bad name).
pub const BAD_REQUEST: u32 = 40001;
/// The registry holds all it may: the registry's "operation not permitted" (a
/// 422, which clients do not retry).
pub const FULL: u32 = 42205;
/// Not one of the registry's: a create names a subject other than the one its
/// stream is bound to.
pub const BINDING_CONFLICT: u32 = 40910;
/// Not one of the registry's: the store refused writes for now (a retry may pass).
pub const UNAVAILABLE: u32 = 50301;

impl RegistryError {
    pub fn new(code: u32, message: impl Into<String>) -> RegistryError {
        RegistryError {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status: the code's first three digits.
    pub fn status(&self) -> u16 {
        (self.code / 100) as u16
    }
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for RegistryError {}

impl From<EngineError> for RegistryError {
    fn from(e: EngineError) -> Self {
        let code = match e {
            EngineError::Unavailable(_)
            | EngineError::Overloaded(_)
            | EngineError::Fenced
            | EngineError::NotOwner => UNAVAILABLE,
            _ => STORE_ERROR,
        };
        RegistryError::new(code, format!("the registry's store: {e}"))
    }
}
