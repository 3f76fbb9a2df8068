//! Table definitions and commit pointers, kept as registry rows of the metadata
//! (logged through the WAL's system chunk, so they survive `kill -9` and every
//! node of a cluster sees the same).
//!
//! - `iceberg.tables`, key `NS\x1fTABLE`: the definition, where the table lives
//!   and its uuid.
//! - `iceberg.commits`, key `NS\x1fTABLE\x1fUUID\x1fN` (N zero-padded): the
//!   metadata file of the table's N-th commit. A commit inserts row N+1 only if
//!   it is absent, under the registry lock, and reads it back: two writers (or a
//!   dead node's log replayed late) can never both move the pointer from N.

use std::collections::BTreeMap;
use std::time::Duration;

use picomq_engine::wal::format::Op;
use picomq_engine::{Engine, EngineError};
use serde::{Deserialize, Serialize};

pub const TABLES: &str = "iceberg.tables";
pub const COMMITS: &str = "iceberg.commits";
const SEP: char = '\u{1f}';
/// Commit rows kept per table (older ones are pruned; the metadata files keep
/// their own history).
const COMMITS_KEPT: u64 = 16;

/// Limits on what a definition may hold.
pub const NAME_BYTES_MAX: usize = 128;
pub const SOURCES_MAX: usize = 64;
pub const PARTITION_FIELDS_MAX: usize = 4;
pub const INTERVAL_MIN: Duration = Duration::from_secs(1);
pub const INTERVAL_MAX: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// A table's name: a namespace and a table, each `[A-Za-z0-9_-]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableId {
    pub namespace: String,
    pub table: String,
}

impl TableId {
    pub fn new(namespace: &str, table: &str) -> Result<TableId, String> {
        for (what, s) in [("namespace", namespace), ("table", table)] {
            if s.is_empty() || s.len() > NAME_BYTES_MAX {
                return Err(format!(
                    "a {what} name has 1 to {NAME_BYTES_MAX} characters"
                ));
            }
            if !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(format!(
                    "{what} name {s:?}: only letters, digits, '_' and '-' are allowed"
                ));
            }
        }
        Ok(TableId {
            namespace: namespace.into(),
            table: table.into(),
        })
    }

    fn key(&self) -> String {
        format!("{}{SEP}{}", self.namespace, self.table)
    }

    /// The job lease name of the table's exporter in a cluster.
    pub fn job(&self) -> String {
        format!("iceberg:{}.{}", self.namespace, self.table)
    }
}

impl std::fmt::Display for TableId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.namespace, self.table)
    }
}

/// The streams a table is fed by: one pattern or several.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Sources {
    One(String),
    Many(Vec<String>),
}

impl Sources {
    pub fn patterns(&self) -> Vec<&str> {
        match self {
            Sources::One(s) => vec![s.as_str()],
            Sources::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// One source pattern: a stream name, or a prefix (`orders/**`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Exact(String),
    Prefix(String),
}

impl Source {
    pub fn parse(raw: &str) -> Result<Source, String> {
        let raw = raw.strip_prefix('/').unwrap_or(raw);
        if raw.is_empty() || raw.len() > 1024 {
            return Err("a source pattern has 1 to 1024 bytes".into());
        }
        if raw.chars().any(char::is_control) {
            return Err(format!(
                "source {raw:?}: control characters are not allowed"
            ));
        }
        match raw.strip_suffix("**") {
            Some(prefix) if !prefix.contains('*') && !prefix.contains('?') => {
                Ok(Source::Prefix(prefix.to_string()))
            }
            _ if raw.contains('*') || raw.contains('?') => Err(format!(
                "source {raw:?}: a source is a stream name or a prefix ending in ** (orders/**)"
            )),
            _ => Ok(Source::Exact(raw.to_string())),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Source::Exact(s) => s == name,
            Source::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// What `PUT /__picomq/tables/{ns}/{table}` takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Definition {
    pub source: Sources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_subject: Option<String>,
    #[serde(default = "default_interval")]
    pub commit_interval: String,
    #[serde(default)]
    pub partition_by: Vec<String>,
    #[serde(default)]
    pub trim_source: bool,
    /// Snapshots kept for time travel; older ones expire and the files only
    /// they name are deleted.
    #[serde(default = "default_keep", skip_serializing_if = "is_default_keep")]
    pub keep_snapshots: u32,
}

/// Snapshots a table keeps unless told otherwise, and at most.
pub const KEEP_SNAPSHOTS_DEFAULT: u32 = 100;
pub const KEEP_SNAPSHOTS_MAX: u32 = 10_000;

fn default_keep() -> u32 {
    KEEP_SNAPSHOTS_DEFAULT
}

fn is_default_keep(k: &u32) -> bool {
    *k == KEEP_SNAPSHOTS_DEFAULT
}

fn default_interval() -> String {
    humantime::format_duration(DEFAULT_INTERVAL).to_string()
}

impl Definition {
    /// Checks everything that does not need the table's columns.
    pub fn validate(&self) -> Result<(), String> {
        let patterns = self.source.patterns();
        if patterns.is_empty() || patterns.len() > SOURCES_MAX {
            return Err(format!("source: 1 to {SOURCES_MAX} patterns"));
        }
        for p in patterns {
            Source::parse(p)?;
        }
        self.interval()?;
        if self.partition_by.len() > PARTITION_FIELDS_MAX {
            return Err(format!(
                "partitionBy: at most {PARTITION_FIELDS_MAX} fields"
            ));
        }
        if let Some(subject) = &self.schema_subject {
            picomq_registry::registry::check_subject(subject)
                .map_err(|e| format!("schemaSubject: {}", e.message))?;
        }
        if !(1..=KEEP_SNAPSHOTS_MAX).contains(&self.keep_snapshots) {
            return Err(format!("keepSnapshots: 1 to {KEEP_SNAPSHOTS_MAX}"));
        }
        Ok(())
    }

    pub fn keep_snapshots(&self) -> usize {
        self.keep_snapshots as usize
    }

    pub fn sources(&self) -> Vec<Source> {
        self.source
            .patterns()
            .into_iter()
            .filter_map(|p| Source::parse(p).ok())
            .collect()
    }

    pub fn interval(&self) -> Result<Duration, String> {
        let d = humantime::parse_duration(self.commit_interval.trim())
            .map_err(|e| format!("commitInterval {:?}: {e}", self.commit_interval))?;
        if !(INTERVAL_MIN..=INTERVAL_MAX).contains(&d) {
            return Err(format!(
                "commitInterval {:?}: between {} and {}",
                self.commit_interval,
                humantime::format_duration(INTERVAL_MIN),
                humantime::format_duration(INTERVAL_MAX)
            ));
        }
        Ok(d)
    }
}

/// A table as its row holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRow {
    pub definition: Definition,
    pub uuid: String,
    /// Where its files are, relative to the store's root.
    pub location: String,
    pub created_ms: u64,
}

/// One commit: the metadata file it made current.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRow {
    /// Relative to the store's root.
    pub metadata: String,
    pub at_ms: u64,
}

/// A table and its latest commit.
#[derive(Clone, Debug)]
pub struct Entry {
    pub id: TableId,
    pub row: TableRow,
    pub commit: Option<(u64, CommitRow)>,
}

/// Every table, read from the metadata.
pub async fn tables(engine: &Engine) -> Result<BTreeMap<TableId, Entry>, EngineError> {
    Ok(tables_of(&engine.registry_rows().await?))
}

/// The tables that registry rows describe.
fn tables_of(rows: &[(String, String, String)]) -> BTreeMap<TableId, Entry> {
    let mut out: BTreeMap<TableId, Entry> = BTreeMap::new();
    let mut commits: Vec<(TableId, String, u64, CommitRow)> = Vec::new();
    for (tbl, key, value) in rows {
        let mut parts = key.split(SEP);
        let (Some(ns), Some(t)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(id) = TableId::new(ns, t) else {
            continue;
        };
        if tbl == TABLES {
            match serde_json::from_str::<TableRow>(value) {
                Ok(row) => {
                    out.insert(
                        id.clone(),
                        Entry {
                            id,
                            row,
                            commit: None,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(table = %id, error = %e, "skipping a table row that does not parse")
                }
            }
        } else if tbl == COMMITS {
            let (Some(uuid), Some(n)) = (parts.next(), parts.next().and_then(|n| n.parse().ok()))
            else {
                continue;
            };
            if let Ok(c) = serde_json::from_str::<CommitRow>(value) {
                commits.push((id, uuid.to_string(), n, c));
            }
        }
    }
    for (id, uuid, n, c) in commits {
        if let Some(e) = out.get_mut(&id) {
            if e.row.uuid == uuid && e.commit.as_ref().is_none_or(|(m, _)| n > *m) {
                e.commit = Some((n, c));
            }
        }
    }
    out
}

fn commit_key(id: &TableId, uuid: &str, n: u64) -> String {
    format!("{}{SEP}{uuid}{SEP}{n:012}", id.key())
}

/// Creates the table (or changes the definition of one that exists, keeping its
/// uuid and files). Returns the row as stored.
pub async fn put(
    engine: &Engine,
    id: &TableId,
    definition: Definition,
    location_of: impl FnOnce(&str) -> String,
) -> Result<(TableRow, bool), EngineError> {
    let _lock = engine.registry_lock().await?;
    let existing = tables(engine).await?.remove(id);
    let (row, created) = match existing {
        Some(e) => (
            TableRow {
                definition,
                ..e.row
            },
            false,
        ),
        None => {
            let uuid = uuid::Uuid::new_v4().to_string();
            (
                TableRow {
                    definition,
                    location: location_of(&uuid),
                    uuid,
                    created_ms: engine.clock().now_ms(),
                },
                true,
            )
        }
    };
    engine
        .registry_commit(vec![Op::RegistryPut {
            table: TABLES.into(),
            key: id.key(),
            value: serde_json::to_string(&row).expect("a row serializes"),
            replace: true,
        }])
        .await?;
    Ok((row, created))
}

/// Deletes the table's rows (its definition and commits); the caller removes
/// its files. `None` if there was no such table.
pub async fn delete(engine: &Engine, id: &TableId) -> Result<Option<TableRow>, EngineError> {
    let _lock = engine.registry_lock().await?;
    let rows = engine.registry_rows().await?;
    let Some(e) = tables_of(&rows).remove(id) else {
        return Ok(None);
    };
    let prefix = format!("{}{SEP}", id.key());
    let mut ops = vec![Op::RegistryDelete {
        table: TABLES.into(),
        key: id.key(),
    }];
    for (tbl, key, _) in rows {
        if tbl == COMMITS && key.starts_with(&prefix) {
            ops.push(Op::RegistryDelete {
                table: COMMITS.into(),
                key,
            });
        }
    }
    engine.registry_commit(ops).await?;
    Ok(Some(e.row))
}

/// Moves the table's pointer from commit `from` (`None`: no commit yet) to a new
/// one. `Ok(false)`: someone else moved it first, or the table is gone or was
/// recreated; nothing of this commit is visible.
pub async fn advance(
    engine: &Engine,
    id: &TableId,
    uuid: &str,
    from: Option<u64>,
    row: CommitRow,
) -> Result<bool, EngineError> {
    let _lock = engine.registry_lock().await?;
    let current = tables(engine).await?.remove(id);
    let Some(current) = current else {
        return Ok(false);
    };
    if current.row.uuid != uuid || current.commit.as_ref().map(|c| c.0) != from {
        return Ok(false);
    }
    let n = from.map_or(0, |n| n + 1);
    let value = serde_json::to_string(&row).expect("a row serializes");
    let mut ops = vec![Op::RegistryPut {
        table: COMMITS.into(),
        key: commit_key(id, uuid, n),
        value: value.clone(),
        replace: false,
    }];
    if n >= COMMITS_KEPT {
        ops.push(Op::RegistryDelete {
            table: COMMITS.into(),
            key: commit_key(id, uuid, n - COMMITS_KEPT),
        });
    }
    engine.registry_commit(ops).await?;
    // Inserted only if absent: read back whose it is.
    let now = tables(engine).await?.remove(id);
    Ok(now
        .and_then(|e| e.commit)
        .is_some_and(|(m, c)| m == n && c == row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sources() {
        assert!(TableId::new("ns", "t-1_x").is_ok());
        for (ns, t) in [("", "t"), ("n.s", "t"), ("ns", "a/b"), ("ns", "é")] {
            assert!(TableId::new(ns, t).is_err(), "{ns}.{t}");
        }
        assert_eq!(
            Source::parse("orders/**").unwrap(),
            Source::Prefix("orders/".into())
        );
        assert_eq!(Source::parse("**").unwrap(), Source::Prefix(String::new()));
        assert_eq!(Source::parse("/a/b").unwrap(), Source::Exact("a/b".into()));
        for bad in ["", "a/*/b", "a?", "a/**/b/**"] {
            assert!(Source::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_table_points_at_its_latest_commit_of_its_own_uuid() {
        let id = TableId::new("ns", "t").unwrap();
        let row = TableRow {
            definition: serde_json::from_str(r#"{"source":"a"}"#).unwrap(),
            uuid: "u2".into(),
            location: "tables/ns/t/u2".into(),
            created_ms: 1,
        };
        let commit = |uuid: &str, n: u64| {
            let c = CommitRow {
                metadata: format!("m-{uuid}-{n}"),
                at_ms: n,
            };
            (
                COMMITS.to_string(),
                commit_key(&id, uuid, n),
                serde_json::to_string(&c).unwrap(),
            )
        };
        let rows = vec![
            (
                TABLES.to_string(),
                id.key(),
                serde_json::to_string(&row).unwrap(),
            ),
            commit("u2", 0),
            commit("u2", 2),
            commit("u2", 1),
            // A table of the same name dropped before: its commits are not these.
            commit("u1", 9),
            ("iceberg.tables".into(), "bad".into(), "{}".into()),
            ("schema".into(), "1".into(), "{}".into()),
        ];
        let tables = tables_of(&rows);
        assert_eq!(tables.len(), 1);
        let (n, c) = tables[&id].commit.clone().unwrap();
        assert_eq!((n, c.metadata.as_str()), (2, "m-u2-2"));
    }

    #[test]
    fn definitions_are_checked() {
        let d: Definition = serde_json::from_str(r#"{"source":"orders/**"}"#).unwrap();
        assert!(d.validate().is_ok());
        assert_eq!(d.interval().unwrap(), DEFAULT_INTERVAL);
        let d: Definition = serde_json::from_str(
            r#"{"source":["a","b/**"],"commitInterval":"5s","partitionBy":["day(timestamp)"]}"#,
        )
        .unwrap();
        assert!(d.validate().is_ok());
        let d: Definition =
            serde_json::from_str(r#"{"source":"a","schemaSubject":"a-value"}"#).unwrap();
        assert!(d.validate().is_ok());
        for bad in [
            r#"{"source":[]}"#,
            r#"{"source":"a","commitInterval":"0s"}"#,
            r#"{"source":"a","commitInterval":"2days"}"#,
            r#"{"source":"a","commitInterval":"soon"}"#,
            r#"{"source":"a/*"}"#,
            r#"{"source":"a","schemaSubject":""}"#,
        ] {
            let d: Definition = serde_json::from_str(bad).unwrap();
            assert!(d.validate().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Definition>(r#"{"source":"a","bogus":1}"#).is_err());
    }
}
