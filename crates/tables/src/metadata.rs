//! Iceberg table metadata (format version 2): the JSON file a catalog points at,
//! with the schemas, the partition spec and the snapshots. Each commit writes a
//! new file; none is ever rewritten.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::parquet::{Field, Kind};
use crate::Error;

/// The snapshot summary key under which a snapshot records, per source stream,
/// the sequence number the next export starts at.
pub const OFFSETS_KEY: &str = "picomq.next-seq";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct TableMetadata {
    pub format_version: u8,
    pub table_uuid: String,
    pub location: String,
    pub last_sequence_number: i64,
    pub last_updated_ms: i64,
    pub last_column_id: i32,
    pub schemas: Vec<Schema>,
    pub current_schema_id: i32,
    pub partition_specs: Vec<PartitionSpec>,
    pub default_spec_id: i32,
    pub last_partition_id: i32,
    pub properties: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_snapshot_id: Option<i64>,
    pub snapshots: Vec<Snapshot>,
    pub snapshot_log: Vec<SnapshotLogEntry>,
    pub metadata_log: Vec<MetadataLogEntry>,
    pub sort_orders: Vec<serde_json::Value>,
    pub default_sort_order_id: i32,
    pub refs: BTreeMap<String, Ref>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct Schema {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema_id: i32,
    pub fields: Vec<SchemaField>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SchemaField {
    pub id: i32,
    pub name: String,
    pub required: bool,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
}

impl Schema {
    pub fn new(id: i32, fields: &[Field]) -> Schema {
        Schema {
            kind: "struct".into(),
            schema_id: id,
            fields: fields
                .iter()
                .map(|f| SchemaField {
                    id: f.id,
                    name: f.name.clone(),
                    required: f.required,
                    kind: f.kind.iceberg().into(),
                    doc: None,
                })
                .collect(),
        }
    }

    /// The schema's columns as the Parquet writer takes them.
    pub fn fields(&self) -> Result<Vec<Field>, Error> {
        self.fields
            .iter()
            .map(|f| {
                Ok(Field {
                    id: f.id,
                    name: f.name.clone(),
                    kind: Kind::from_iceberg(&f.kind).ok_or_else(|| {
                        Error::Invalid(format!("column {} has an unknown type {}", f.name, f.kind))
                    })?,
                    required: f.required,
                })
            })
            .collect()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct PartitionSpec {
    pub spec_id: i32,
    pub fields: Vec<PartitionField>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct PartitionField {
    pub source_id: i32,
    pub field_id: i32,
    pub name: String,
    pub transform: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct Snapshot {
    pub snapshot_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_snapshot_id: Option<i64>,
    pub sequence_number: i64,
    pub timestamp_ms: i64,
    pub manifest_list: String,
    pub summary: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_id: Option<i32>,
}

impl Snapshot {
    /// The per-stream next sequence numbers this snapshot's data reaches.
    pub fn offsets(&self) -> Result<BTreeMap<String, u64>, Error> {
        match self.summary.get(OFFSETS_KEY) {
            None => Ok(BTreeMap::new()),
            Some(s) => serde_json::from_str(s).map_err(|e| {
                Error::Invalid(format!(
                    "snapshot {}: bad {OFFSETS_KEY}: {e}",
                    self.snapshot_id
                ))
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotLogEntry {
    pub snapshot_id: i64,
    pub timestamp_ms: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct MetadataLogEntry {
    pub metadata_file: String,
    pub timestamp_ms: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct Ref {
    pub snapshot_id: i64,
    #[serde(rename = "type")]
    pub kind: String,
}

impl TableMetadata {
    /// A table with no snapshot yet.
    pub fn new(location: &str, schema: Schema, spec: PartitionSpec, now_ms: i64) -> TableMetadata {
        let last_column_id = schema.fields.iter().map(|f| f.id).max().unwrap_or(0);
        let last_partition_id = spec.fields.iter().map(|f| f.field_id).max().unwrap_or(999);
        TableMetadata {
            format_version: 2,
            table_uuid: uuid::Uuid::new_v4().to_string(),
            location: location.trim_end_matches('/').to_string(),
            last_sequence_number: 0,
            last_updated_ms: now_ms,
            last_column_id,
            current_schema_id: schema.schema_id,
            schemas: vec![schema],
            default_spec_id: spec.spec_id,
            partition_specs: vec![spec],
            last_partition_id,
            properties: BTreeMap::from([("write.format.default".into(), "parquet".into())]),
            current_snapshot_id: None,
            snapshots: Vec::new(),
            snapshot_log: Vec::new(),
            metadata_log: Vec::new(),
            sort_orders: vec![serde_json::json!({"order-id": 0, "fields": []})],
            default_sort_order_id: 0,
            refs: BTreeMap::new(),
        }
    }

    pub fn current_snapshot(&self) -> Option<&Snapshot> {
        let id = self.current_snapshot_id?;
        self.snapshots.iter().find(|s| s.snapshot_id == id)
    }

    pub fn current_schema(&self) -> Option<&Schema> {
        self.schemas
            .iter()
            .find(|s| s.schema_id == self.current_schema_id)
    }

    pub fn default_spec(&self) -> Option<&PartitionSpec> {
        self.partition_specs
            .iter()
            .find(|s| s.spec_id == self.default_spec_id)
    }

    /// Where the offsets of the current snapshot stand (empty before the first).
    pub fn offsets(&self) -> Result<BTreeMap<String, u64>, Error> {
        self.current_snapshot()
            .map_or_else(|| Ok(BTreeMap::new()), Snapshot::offsets)
    }

    /// Makes `schema` current: the same schema again is a no-op; a new one gets the
    /// next schema id. Column ids are the caller's (kept across versions).
    pub fn set_schema(&mut self, fields: &[Field]) -> i32 {
        if let Some(s) = self.schemas.iter().find(|s| {
            s.fields.len() == fields.len()
                && s.fields.iter().zip(fields).all(|(a, b)| {
                    a.id == b.id
                        && a.name == b.name
                        && a.required == b.required
                        && a.kind == b.kind.iceberg()
                })
        }) {
            self.current_schema_id = s.schema_id;
            return s.schema_id;
        }
        let id = self.schemas.iter().map(|s| s.schema_id).max().unwrap_or(-1) + 1;
        self.schemas.push(Schema::new(id, fields));
        self.current_schema_id = id;
        self.last_column_id = self
            .last_column_id
            .max(fields.iter().map(|f| f.id).max().unwrap_or(0));
        id
    }

    /// Adds a snapshot and makes it current; `previous` is the metadata file this
    /// one follows (for the metadata log).
    pub fn add_snapshot(&mut self, snapshot: Snapshot, previous: Option<&str>) {
        let ts = snapshot.timestamp_ms;
        if let Some(prev) = previous {
            self.metadata_log.push(MetadataLogEntry {
                metadata_file: prev.to_string(),
                timestamp_ms: self.last_updated_ms,
            });
        }
        self.last_sequence_number = snapshot.sequence_number;
        self.last_updated_ms = ts;
        self.current_snapshot_id = Some(snapshot.snapshot_id);
        self.refs.insert(
            "main".into(),
            Ref {
                snapshot_id: snapshot.snapshot_id,
                kind: "branch".into(),
            },
        );
        self.snapshot_log.push(SnapshotLogEntry {
            snapshot_id: snapshot.snapshot_id,
            timestamp_ms: ts,
        });
        self.snapshots.push(snapshot);
    }

    /// Drops all but the newest `keep` snapshots (and log entries naming them);
    /// returns the manifest lists of those dropped, and the metadata files the
    /// metadata log no longer names (it keeps as many entries).
    pub fn expire_snapshots(&mut self, keep: usize) -> (Vec<String>, Vec<String>) {
        let keep = keep.max(1);
        let excess = self.metadata_log.len().saturating_sub(keep);
        let old_metadata = self
            .metadata_log
            .drain(..excess)
            .map(|e| e.metadata_file)
            .collect();
        if self.snapshots.len() <= keep {
            return (Vec::new(), old_metadata);
        }
        let cut = self.snapshots.len() - keep;
        let dropped: Vec<Snapshot> = self.snapshots.drain(..cut).collect();
        let ids: std::collections::HashSet<i64> = dropped.iter().map(|s| s.snapshot_id).collect();
        self.snapshot_log.retain(|e| !ids.contains(&e.snapshot_id));
        (
            dropped.into_iter().map(|s| s.manifest_list).collect(),
            old_metadata,
        )
    }
}

/// A positive random snapshot id.
pub fn snapshot_id() -> i64 {
    let b = uuid::Uuid::new_v4().as_u64_pair();
    ((b.0 ^ b.1) & (i64::MAX as u64)) as i64
}
