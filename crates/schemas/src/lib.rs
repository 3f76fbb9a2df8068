//! Schema formats for the registry (docs/schemas.md): parsing, the compatibility
//! rules the Confluent registry applies, and checks of payloads written with a
//! schema. Pure functions, no I/O: the registry's storage and HTTP surface use
//! them, and so do the append paths that validate what they store.

pub mod avro;
pub mod columns;
pub mod compat;
pub mod json;
pub mod parsed;
pub mod protobuf;
pub mod validate;
pub mod wire;
