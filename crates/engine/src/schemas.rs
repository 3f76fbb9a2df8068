//! The schema registry as the engine stores it (docs/schemas.md): rows of the
//! metadata, every change an op in the WAL's system chunk (answered once durable
//! and indexed, so the registry survives exactly as streams and tokens do), and a
//! hook every append passes before it is sequenced. What the rows mean (schemas,
//! versions, compatibility) is the `picomq-registry` crate's business.

use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::stream::{NewRecord, Service};
use crate::wal::format::Op;

/// Checks an append's records against the schema their stream is bound to.
pub trait AppendCheck: Send + Sync {
    /// `Ok` to store them; [`EngineError::SchemaViolation`] names the first record
    /// refused. `topic` is the Kafka topic the append is written as (its subjects
    /// `TOPIC-value` and `TOPIC-key` apply when the registry holds them).
    fn check(
        &self,
        stream: &StreamRef<'_>,
        topic: Option<&str>,
        records: &[NewRecord],
    ) -> Result<()>;
}

/// The stream an append goes to.
pub struct StreamRef<'a> {
    pub id: u64,
    pub name: &'a str,
    /// `application/json`: each record is one JSON value.
    pub json: bool,
}

/// Why an append was refused: which record, where in it and which rule.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SchemaViolation {
    pub subject: String,
    /// The version checked against (the one a framed payload named, or the
    /// subject's latest).
    pub version: Option<u32>,
    /// The record's position in the request, from 0.
    pub index: usize,
    /// Where in the record (a JSON pointer, or an Avro or Protobuf field path).
    pub path: String,
    /// The rule that failed (`required`, `type`, `framing`, `decode`, ...).
    pub rule: String,
    pub message: String,
}

impl std::fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "message {} does not match subject {:?}",
            self.index, self.subject
        )?;
        if let Some(v) = self.version {
            write!(f, " version {v}")?;
        }
        let at = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, " at {at} ({}): {}", self.rule, self.message)
    }
}

impl Service {
    /// Every registry row, as (table, key, value).
    pub async fn registry_rows(&self) -> Result<Vec<(String, String, String)>> {
        self.inner.meta.registry_rows().await
    }

    /// How many registry changes the metadata holds.
    pub async fn registry_generation(&self) -> Result<u64> {
        self.inner.meta.registry_generation().await
    }

    /// The lock registry writes hold (across the cluster in one).
    pub async fn registry_lock(&self) -> Result<Box<dyn std::any::Any + Send>> {
        self.inner.meta.registry_lock().await
    }

    /// A schema id never drawn before, at least `at_least`.
    pub async fn registry_draw_id(&self, at_least: u64) -> Result<u64> {
        self.inner.meta.registry_draw_id(at_least).await
    }

    /// Logs registry changes (only `RegistryPut` and `RegistryDelete`); answers
    /// once they are durable and indexed.
    pub async fn registry_commit(&self, ops: Vec<Op>) -> Result<()> {
        if ops
            .iter()
            .any(|op| !matches!(op, Op::RegistryPut { .. } | Op::RegistryDelete { .. }))
        {
            return Err(EngineError::Internal(
                "only registry ops may be committed as registry changes".into(),
            ));
        }
        if ops.is_empty() {
            return Ok(());
        }
        // Logged ops are applied to the metadata for ever after: one that a store
        // cannot hold (Postgres text refuses NUL) would stop indexing. Refused here.
        let holds_nul = |s: &str| s.contains('\0');
        for op in &ops {
            let bad = match op {
                Op::RegistryPut {
                    table, key, value, ..
                } => holds_nul(table) || holds_nul(key) || holds_nul(value),
                Op::RegistryDelete { table, key } => holds_nul(table) || holds_nul(key),
                _ => false,
            };
            if bad {
                return Err(EngineError::bad_request(
                    "a registry row may not hold a NUL character",
                ));
            }
        }
        self.inner.wal.check_health()?;
        self.inner.system.commit(ops).await
    }

    /// Installs the check every append passes (once; later calls are ignored).
    pub fn set_append_check(&self, check: Arc<dyn AppendCheck>) {
        let _ = self.inner.append_check.set(check);
    }

    /// Checks records as an append to `stream` is checked before it is sequenced
    /// (also a Kafka transaction's, before they wait for the commit).
    pub fn check_records(
        &self,
        stream: &StreamRef<'_>,
        topic: Option<&str>,
        records: &[NewRecord],
    ) -> Result<()> {
        match self.inner.append_check.get() {
            Some(check) if !records.is_empty() => check.check(stream, topic, records),
            _ => Ok(()),
        }
    }
}
