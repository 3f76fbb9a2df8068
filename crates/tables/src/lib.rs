//! Streams as Apache Iceberg tables: the file formats, written with no library
//! heavier than this crate. Parquet data files ([`parquet`]), Avro manifests and
//! manifest lists ([`avro`], [`manifest`]), the table metadata JSON
//! ([`metadata`]) and partition transforms ([`partition`]). What goes in the rows
//! and when a table commits is the exporter's business, not this crate's.
//!
//! docs/tables.md describes the layout and the guarantees.

pub mod avro;
pub mod catalog;
pub mod commit;
pub mod exporter;
pub mod manifest;
pub mod metadata;
pub mod parquet;
pub mod partition;
mod thrift;
pub mod typed;

/// Something a table cannot be made of.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
}
