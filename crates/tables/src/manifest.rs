//! Iceberg manifests (the data files a snapshot adds) and manifest lists (the
//! manifests a snapshot is made of), as Avro files with Iceberg's field ids.

use serde::{Deserialize, Serialize};

use crate::avro::{container, Value};
use crate::metadata::{PartitionSpec, Schema};
use crate::parquet::ColumnMetrics;
use crate::partition::{PartField, PartValue};

/// A data file a manifest lists.
#[derive(Clone, Debug, PartialEq)]
pub struct DataFile {
    /// Its full URI.
    pub path: String,
    /// One value per partition field.
    pub partition: Vec<Option<PartValue>>,
    pub records: u64,
    pub size: u64,
    pub columns: Vec<ColumnMetrics>,
}

/// A manifest as a manifest list names it. Kept beside each manifest list as
/// JSON too, so that the next commit can carry the live manifests over without
/// reading Avro back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub path: String,
    pub length: u64,
    pub spec_id: i32,
    pub sequence_number: i64,
    pub added_snapshot_id: i64,
    pub added_files: u32,
    pub added_rows: u64,
    pub existing_files: u32,
    pub existing_rows: u64,
    /// Per partition field: (contains null, lower bound, upper bound) as Iceberg's
    /// single-value bytes.
    pub partitions: Vec<FieldSummary>,
    /// The data files it lists (path, records, bytes): what compaction and
    /// garbage collection need of it.
    #[serde(default)]
    pub files: Vec<(String, u64, u64)>,
    /// Per stream, the sequence numbers `[from, to)` its files hold the records
    /// of (all of them that the stream still held when exported): what a merge
    /// reads again. Live manifests are in export order, so the ranges of one
    /// stream follow each other from one manifest to the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<std::collections::BTreeMap<String, (u64, u64)>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldSummary {
    pub contains_null: bool,
    pub lower: Option<Vec<u8>>,
    pub upper: Option<Vec<u8>>,
}

fn metrics_map(key: i32, value: i32, ty: &str) -> String {
    format!(
        r#"["null",{{"type":"array","logicalType":"map","items":{{"type":"record","name":"k{key}_v{value}","fields":[{{"name":"key","type":"int","field-id":{key}}},{{"name":"value","type":{ty},"field-id":{value}}}]}}}}]"#
    )
}

/// The manifest entry schema for a partition spec.
fn entry_schema(parts: &[PartField]) -> String {
    let partition_fields: Vec<String> = parts
        .iter()
        .map(|p| {
            format!(
                r#"{{"name":{},"field-id":{},"type":["null",{}],"default":null}}"#,
                serde_json::to_string(&p.name).expect("a string"),
                p.field_id,
                p.kind.avro()
            )
        })
        .collect();
    format!(
        concat!(
            r#"{{"type":"record","name":"manifest_entry","fields":["#,
            r#"{{"name":"status","field-id":0,"type":"int"}},"#,
            r#"{{"name":"snapshot_id","field-id":1,"type":["null","long"],"default":null}},"#,
            r#"{{"name":"sequence_number","field-id":3,"type":["null","long"],"default":null}},"#,
            r#"{{"name":"file_sequence_number","field-id":4,"type":["null","long"],"default":null}},"#,
            r#"{{"name":"data_file","field-id":2,"type":{{"type":"record","name":"r2","fields":["#,
            r#"{{"name":"content","field-id":134,"type":"int"}},"#,
            r#"{{"name":"file_path","field-id":100,"type":"string"}},"#,
            r#"{{"name":"file_format","field-id":101,"type":"string"}},"#,
            r#"{{"name":"partition","field-id":102,"type":{{"type":"record","name":"r102","fields":[{partition}]}}}},"#,
            r#"{{"name":"record_count","field-id":103,"type":"long"}},"#,
            r#"{{"name":"file_size_in_bytes","field-id":104,"type":"long"}},"#,
            r#"{{"name":"column_sizes","field-id":108,"type":{sizes},"default":null}},"#,
            r#"{{"name":"value_counts","field-id":109,"type":{values},"default":null}},"#,
            r#"{{"name":"null_value_counts","field-id":110,"type":{nulls},"default":null}},"#,
            r#"{{"name":"lower_bounds","field-id":125,"type":{lower},"default":null}},"#,
            r#"{{"name":"upper_bounds","field-id":128,"type":{upper},"default":null}}"#,
            r#"]}}}}]}}"#
        ),
        partition = partition_fields.join(","),
        sizes = metrics_map(117, 118, r#""long""#),
        values = metrics_map(119, 120, r#""long""#),
        nulls = metrics_map(121, 122, r#""long""#),
        lower = metrics_map(126, 127, r#""bytes""#),
        upper = metrics_map(129, 130, r#""bytes""#),
    )
}

fn pairs(columns: &[ColumnMetrics], value: impl Fn(&ColumnMetrics) -> Option<Value>) -> Value {
    Value::some(Value::Array(
        columns
            .iter()
            .filter_map(|c| value(c).map(|v| Value::Record(vec![Value::Int(c.field_id), v])))
            .collect(),
    ))
}

fn part_value(v: &Option<PartValue>) -> Value {
    Value::opt(v.as_ref().map(|v| match v {
        PartValue::Int(i) => Value::Int(*i),
        PartValue::Long(i) => Value::Long(*i),
        PartValue::String(s) => Value::String(s.clone()),
    }))
}

/// A manifest adding `files` in snapshot `snapshot_id` (their sequence numbers
/// inherited from the manifest list).
pub fn manifest(
    schema: &Schema,
    spec: &PartitionSpec,
    parts: &[PartField],
    snapshot_id: i64,
    files: &[DataFile],
) -> Vec<u8> {
    let rows: Vec<Value> = files
        .iter()
        .map(|f| {
            Value::Record(vec![
                Value::Int(1), // ADDED
                Value::some(Value::Long(snapshot_id)),
                Value::none(),
                Value::none(),
                Value::Record(vec![
                    Value::Int(0), // data
                    Value::String(f.path.clone()),
                    Value::String("PARQUET".into()),
                    Value::Record(f.partition.iter().map(part_value).collect()),
                    Value::Long(f.records as i64),
                    Value::Long(f.size as i64),
                    pairs(&f.columns, |c| Some(Value::Long(c.size as i64))),
                    pairs(&f.columns, |c| Some(Value::Long(c.values as i64))),
                    pairs(&f.columns, |c| Some(Value::Long(c.nulls as i64))),
                    pairs(&f.columns, |c| c.lower.clone().map(Value::Bytes)),
                    pairs(&f.columns, |c| c.upper.clone().map(Value::Bytes)),
                ]),
            ])
        })
        .collect();
    let meta = [
        ("schema", serde_json::to_string(schema).expect("a schema")),
        ("schema-id", schema.schema_id.to_string()),
        (
            "partition-spec",
            serde_json::to_string(&spec.fields).expect("a spec"),
        ),
        ("partition-spec-id", spec.spec_id.to_string()),
        ("format-version", "2".to_string()),
        ("content", "data".to_string()),
    ];
    container(&entry_schema(parts), &meta, &rows)
}

/// The summary of each partition field over `files`.
pub fn summarize(parts: &[PartField], files: &[DataFile]) -> Vec<FieldSummary> {
    (0..parts.len())
        .map(|i| {
            let values = files.iter().map(|f| f.partition.get(i).cloned().flatten());
            let contains_null = values.clone().any(|v| v.is_none());
            let present = values.flatten();
            FieldSummary {
                contains_null,
                lower: present.clone().min().map(|v| v.bytes()),
                upper: present.max().map(|v| v.bytes()),
            }
        })
        .collect()
}

const MANIFEST_FILE_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"manifest_file","fields":["#,
    r#"{"name":"manifest_path","field-id":500,"type":"string"},"#,
    r#"{"name":"manifest_length","field-id":501,"type":"long"},"#,
    r#"{"name":"partition_spec_id","field-id":502,"type":"int"},"#,
    r#"{"name":"content","field-id":517,"type":"int"},"#,
    r#"{"name":"sequence_number","field-id":515,"type":"long"},"#,
    r#"{"name":"min_sequence_number","field-id":516,"type":"long"},"#,
    r#"{"name":"added_snapshot_id","field-id":503,"type":"long"},"#,
    r#"{"name":"added_files_count","field-id":504,"type":"int"},"#,
    r#"{"name":"existing_files_count","field-id":505,"type":"int"},"#,
    r#"{"name":"deleted_files_count","field-id":506,"type":"int"},"#,
    r#"{"name":"added_rows_count","field-id":512,"type":"long"},"#,
    r#"{"name":"existing_rows_count","field-id":513,"type":"long"},"#,
    r#"{"name":"deleted_rows_count","field-id":514,"type":"long"},"#,
    r#"{"name":"partitions","field-id":507,"type":["null",{"type":"array","element-id":508,"items":"#,
    r#"{"type":"record","name":"r508","fields":["#,
    r#"{"name":"contains_null","field-id":509,"type":"boolean"},"#,
    r#"{"name":"contains_nan","field-id":518,"type":["null","boolean"],"default":null},"#,
    r#"{"name":"lower_bound","field-id":510,"type":["null","bytes"],"default":null},"#,
    r#"{"name":"upper_bound","field-id":511,"type":["null","bytes"],"default":null}]}}],"default":null}]}"#
);

/// The manifest list of snapshot `snapshot_id`: every live manifest.
pub fn manifest_list(
    snapshot_id: i64,
    parent: Option<i64>,
    sequence_number: i64,
    manifests: &[ManifestFile],
) -> Vec<u8> {
    let rows: Vec<Value> = manifests
        .iter()
        .map(|m| {
            Value::Record(vec![
                Value::String(m.path.clone()),
                Value::Long(m.length as i64),
                Value::Int(m.spec_id),
                Value::Int(0), // data
                Value::Long(m.sequence_number),
                Value::Long(m.sequence_number),
                Value::Long(m.added_snapshot_id),
                Value::Int(m.added_files as i32),
                Value::Int(m.existing_files as i32),
                Value::Int(0),
                Value::Long(m.added_rows as i64),
                Value::Long(m.existing_rows as i64),
                Value::Long(0),
                Value::some(Value::Array(
                    m.partitions
                        .iter()
                        .map(|p| {
                            Value::Record(vec![
                                Value::Bool(p.contains_null),
                                Value::none(),
                                Value::opt(p.lower.clone().map(Value::Bytes)),
                                Value::opt(p.upper.clone().map(Value::Bytes)),
                            ])
                        })
                        .collect(),
                )),
            ])
        })
        .collect();
    let meta = [
        ("snapshot-id", snapshot_id.to_string()),
        (
            "parent-snapshot-id",
            parent.map_or_else(|| "null".to_string(), |p| p.to_string()),
        ),
        ("sequence-number", sequence_number.to_string()),
        ("format-version", "2".to_string()),
    ];
    container(MANIFEST_FILE_SCHEMA, &meta, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_json() {
        let parts = [PartField {
            source_id: 4,
            field_id: 1000,
            name: "timestamp_day".into(),
            transform: crate::partition::Transform::Day,
            kind: crate::partition::PartKind::Date,
        }];
        let v: serde_json::Value = serde_json::from_str(&entry_schema(&parts)).unwrap();
        assert_eq!(
            v["fields"][4]["type"]["fields"][3]["type"]["fields"][0]["field-id"],
            1000
        );
        let v: serde_json::Value = serde_json::from_str(&entry_schema(&[])).unwrap();
        assert_eq!(
            v["fields"][4]["type"]["fields"][3]["type"]["fields"],
            serde_json::json!([])
        );
        let v: serde_json::Value = serde_json::from_str(MANIFEST_FILE_SCHEMA).unwrap();
        assert_eq!(v["fields"].as_array().unwrap().len(), 14);
    }

    #[test]
    fn summaries_bound_partition_values() {
        let file = |p: Option<PartValue>| DataFile {
            path: String::new(),
            partition: vec![p],
            records: 1,
            size: 1,
            columns: vec![],
        };
        let parts = [PartField {
            source_id: 1,
            field_id: 1000,
            name: "stream".into(),
            transform: crate::partition::Transform::Identity,
            kind: crate::partition::PartKind::String,
        }];
        let s = summarize(
            &parts,
            &[
                file(Some(PartValue::String("b".into()))),
                file(None),
                file(Some(PartValue::String("a".into()))),
            ],
        );
        assert!(s[0].contains_null);
        assert_eq!(s[0].lower.as_deref(), Some(&b"a"[..]));
        assert_eq!(s[0].upper.as_deref(), Some(&b"b"[..]));
    }
}
