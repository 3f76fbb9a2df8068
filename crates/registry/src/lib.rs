//! PicoMQ's schema registry (docs/schemas.md): subjects, versions and schema ids
//! kept in the engine's metadata (so every node of a cluster answers the same and
//! the registry survives as streams do), and the check every append passes when
//! its stream is bound to a subject. The HTTP surface is the edge's
//! (`picomq-http`, `/__picomq/schemas/`); the formats are `picomq-schemas`.

pub mod check;
pub mod error;
pub mod registry;
pub mod state;

pub use error::{RegistryError, Result};
pub use registry::{NewSchema, Registry, VersionRef, VersionView};
pub use state::{Binding, Reference, SchemaRow};
