//! The registry as rows (what the metadata stores: table, key, JSON value) and as
//! the state a node answers from, loaded from those rows whole. Registries are
//! small (a few thousand schemas at most, `limits`), so a node keeps all of it and
//! reloads it when the metadata's change count moves.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use picomq_schemas::compat::Level;
use picomq_schemas::parsed::SchemaType;
use serde::{Deserialize, Serialize};

pub(crate) const SCHEMA: &str = "schema";
pub(crate) const VERSION: &str = "version";
pub(crate) const CONFIG: &str = "config";
pub(crate) const BINDING: &str = "binding";

/// A schema that references another registered one (an Avro named type, a
/// Protobuf import, a JSON Schema `$ref`), by subject and version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    pub name: String,
    pub subject: String,
    pub version: u32,
}

/// A registered schema: immutable once its id is drawn.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SchemaRow {
    #[serde(rename = "type")]
    pub kind: String,
    /// The text as first registered (what the registry answers with).
    pub schema: String,
    /// The canonical text its identity is computed from.
    pub canonical: String,
    #[serde(default)]
    pub references: Vec<Reference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "ruleSet")]
    pub rule_set: Option<serde_json::Value>,
    /// Hex SHA-256 of the type, canonical text, references, metadata and rules.
    pub fingerprint: String,
}

impl SchemaRow {
    pub fn schema_type(&self) -> SchemaType {
        SchemaType::parse(Some(&self.kind)).unwrap_or(SchemaType::Avro)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRow {
    pub id: u32,
    #[serde(default)]
    pub deleted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigRow {
    pub compatibility: String,
}

/// A stream bound to a subject (and maybe one version of it). The binding holds
/// for the stream with this id only: a stream deleted and created again under the
/// name starts unbound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub stream_id: u64,
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
}

/// The whole registry as one node sees it.
#[derive(Default)]
pub struct State {
    pub generation: u64,
    pub schemas: BTreeMap<u32, Arc<SchemaRow>>,
    pub by_fingerprint: HashMap<String, u32>,
    /// Subject → version → row (soft-deleted versions included).
    pub subjects: BTreeMap<String, BTreeMap<u32, VersionRow>>,
    /// `""` is the global setting.
    pub config: HashMap<String, Level>,
    pub bindings: HashMap<String, Binding>,
    /// Bytes of schema text held (a limit applies).
    pub schema_bytes: usize,
}

/// Between a subject and a version number in a version row's key: a control
/// character, which subject names may not hold (and not NUL, which Postgres text
/// cannot store).
const KEY_SEPARATOR: char = '\u{1f}';

pub(crate) fn version_key(subject: &str, version: u32) -> String {
    format!("{subject}{KEY_SEPARATOR}{version:010}")
}

impl State {
    /// The state the rows describe; a row that does not parse is skipped (and
    /// logged): one bad row must not take the registry down.
    pub fn from_rows(generation: u64, rows: Vec<(String, String, String)>) -> State {
        let mut s = State {
            generation,
            ..State::default()
        };
        for (table, key, value) in rows {
            let ok = match table.as_str() {
                SCHEMA => match (
                    key.parse::<u32>(),
                    serde_json::from_str::<SchemaRow>(&value),
                ) {
                    (Ok(id), Ok(row)) => {
                        s.schema_bytes += row.schema.len() + row.canonical.len();
                        s.by_fingerprint.insert(row.fingerprint.clone(), id);
                        s.schemas.insert(id, Arc::new(row));
                        true
                    }
                    _ => false,
                },
                VERSION => {
                    let parsed = key.split_once(KEY_SEPARATOR).and_then(|(subject, v)| {
                        let v = v.parse::<u32>().ok()?;
                        let row = serde_json::from_str::<VersionRow>(&value).ok()?;
                        Some((subject.to_string(), v, row))
                    });
                    match parsed {
                        Some((subject, v, row)) => {
                            s.subjects.entry(subject).or_default().insert(v, row);
                            true
                        }
                        None => false,
                    }
                }
                CONFIG => match serde_json::from_str::<ConfigRow>(&value)
                    .ok()
                    .and_then(|c| c.compatibility.parse::<Level>().ok())
                {
                    Some(level) => {
                        s.config.insert(key.clone(), level);
                        true
                    }
                    None => false,
                },
                BINDING => match serde_json::from_str::<Binding>(&value) {
                    Ok(b) => {
                        s.bindings.insert(key.clone(), b);
                        true
                    }
                    Err(_) => false,
                },
                // Rows other features keep beside the registry's (Iceberg tables'
                // definitions and commits) are theirs to read.
                _ => continue,
            };
            if !ok {
                tracing::warn!(table = %table, key = %key, "skipping a registry row that does not parse");
            }
        }
        s
    }

    /// The subject's versions, oldest first; soft-deleted ones only with `deleted`.
    pub fn versions(&self, subject: &str, deleted: bool) -> Vec<(u32, VersionRow)> {
        self.subjects
            .get(subject)
            .map(|vs| {
                vs.iter()
                    .filter(|(_, r)| deleted || !r.deleted)
                    .map(|(v, r)| (*v, *r))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The newest version (soft-deleted ones only with `deleted`).
    pub fn latest(&self, subject: &str, deleted: bool) -> Option<(u32, VersionRow)> {
        self.versions(subject, deleted).last().copied()
    }

    /// Whether the subject has a version clients can see.
    pub fn has_subject(&self, subject: &str) -> bool {
        self.latest(subject, false).is_some()
    }

    /// The level a subject's new versions are checked at.
    pub fn level(&self, subject: &str) -> Level {
        self.config
            .get(subject)
            .or_else(|| self.config.get(""))
            .copied()
            .unwrap_or(Level::Backward)
    }

    /// The subject/version pairs that reference `id`'s versions.
    pub fn referenced_by(&self, subject: &str, version: u32) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .schemas
            .iter()
            .filter(|(id, s)| {
                s.references
                    .iter()
                    .any(|r| r.subject == subject && r.version == version)
                    && self.in_use(**id)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Whether any version (soft-deleted ones too) still uses the schema `id`.
    pub fn in_use(&self, id: u32) -> bool {
        self.subjects
            .values()
            .any(|vs| vs.values().any(|r| r.id == id))
    }

    /// (subject, version) pairs using `id` (soft-deleted ones only with `deleted`).
    pub fn uses_of(&self, id: u32, deleted: bool) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (subject, vs) in &self.subjects {
            for (v, r) in vs {
                if r.id == id && (deleted || !r.deleted) {
                    out.push((subject.clone(), *v));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(table: &str, key: String, value: serde_json::Value) -> (String, String, String) {
        (table.to_string(), key, value.to_string())
    }

    #[test]
    fn rows_load_into_a_state_and_bad_rows_are_skipped() {
        let schema = serde_json::json!({
            "type": "AVRO", "schema": "\"int\"", "canonical": "\"int\"", "fingerprint": "f1"
        });
        let rows = vec![
            row(SCHEMA, "1".into(), schema.clone()),
            row(SCHEMA, "x".into(), schema),
            row(
                VERSION,
                version_key("a-value", 1),
                serde_json::json!({"id": 1}),
            ),
            row(
                VERSION,
                version_key("a-value", 2),
                serde_json::json!({"id": 1, "deleted": true}),
            ),
            row(VERSION, "no separator".into(), serde_json::json!({"id": 1})),
            row(
                CONFIG,
                "".into(),
                serde_json::json!({"compatibility": "FULL"}),
            ),
            row(
                CONFIG,
                "b".into(),
                serde_json::json!({"compatibility": "SOMETIMES"}),
            ),
            row(
                BINDING,
                "s".into(),
                serde_json::json!({"stream_id": 3, "subject": "a-value"}),
            ),
            ("other".into(), "k".into(), "{}".into()),
        ];
        let s = State::from_rows(7, rows);
        assert_eq!(s.generation, 7);
        assert_eq!(s.schemas.len(), 1);
        assert_eq!(s.by_fingerprint.get("f1"), Some(&1));
        assert_eq!(s.versions("a-value", false).len(), 1);
        assert_eq!(s.versions("a-value", true).len(), 2);
        assert_eq!(s.latest("a-value", true).map(|(v, _)| v), Some(2));
        assert_eq!(s.level("a-value"), Level::Full);
        assert_eq!(s.config.len(), 1, "the unknown level is skipped");
        assert_eq!(s.bindings["s"].stream_id, 3);
        assert!(s.in_use(1) && !s.in_use(2));
        assert_eq!(
            s.uses_of(1, true),
            vec![("a-value".to_string(), 1), ("a-value".to_string(), 2)]
        );
    }

    #[test]
    fn version_keys_sort_by_subject_then_number_and_hold_no_nul() {
        let a = version_key("s", 2);
        let b = version_key("s", 10);
        assert!(a < b, "zero-padded numbers sort as numbers");
        assert!(!a.contains('\0'));
        assert_eq!(a.split_once(KEY_SEPARATOR), Some(("s", "0000000002")));
    }
}
