//! One commit of a table: given where the table stands and the data files written
//! since, the manifest, manifest list and metadata file that make them a
//! snapshot. Pure: the caller writes the objects (in the order given, metadata
//! last) and then moves the catalog's pointer, which is what makes the commit.

use std::collections::BTreeMap;

use crate::manifest::{manifest, manifest_list, summarize, DataFile, ManifestFile};
use crate::metadata::{snapshot_id, Snapshot, TableMetadata, OFFSETS_KEY};
use crate::partition::PartField;
use crate::Error;

/// The objects of a commit and the metadata they end with.
pub struct Commit {
    /// (path, bytes), to be written in this order; the metadata file is last.
    pub objects: Vec<(String, Vec<u8>)>,
    pub metadata: TableMetadata,
    pub metadata_path: String,
    /// The live manifests after the commit (what the next one carries over).
    pub manifests: Vec<ManifestFile>,
    /// What expired: the manifest lists of dropped snapshots, and metadata files
    /// the metadata log no longer names.
    pub expired: (Vec<String>, Vec<String>),
}

/// Where a manifest list's JSON twin (the live manifests, for the next commit) is.
pub fn manifests_path(manifest_list: &str) -> String {
    format!(
        "{}.manifests.json",
        manifest_list.strip_suffix(".avro").unwrap_or(manifest_list)
    )
}

/// The first metadata file of a table (no snapshot).
pub fn create(meta: &TableMetadata) -> (String, Vec<u8>) {
    let path = format!(
        "{}/metadata/00000-{}.metadata.json",
        meta.location,
        uuid::Uuid::new_v4()
    );
    (path, serde_json::to_vec(meta).expect("metadata serializes"))
}

/// What a commit adds: data files, and the offsets the table reaches with them.
pub struct Append {
    pub files: Vec<DataFile>,
    /// Per stream, the sequence number the next export starts at (all streams
    /// the table has exported, not only those in this commit).
    pub offsets: BTreeMap<String, u64>,
    /// Files to drop in the same snapshot (merged into `files`), by path.
    pub replaces: Vec<String>,
    /// Per stream, the records `files` hold (see [`ManifestFile::ranges`]).
    pub ranges: BTreeMap<String, (u64, u64)>,
    /// Snapshots the table keeps (older ones expire with this commit).
    pub keep_snapshots: usize,
}

/// Builds the commit of `append` on a table whose current metadata is `meta`
/// (read from `meta_path`) with live manifests `live`.
pub fn commit(
    meta: &TableMetadata,
    meta_path: &str,
    live: &[ManifestFile],
    parts: &[PartField],
    append: Append,
    now_ms: i64,
) -> Result<Commit, Error> {
    let schema = meta
        .current_schema()
        .ok_or_else(|| Error::Invalid("the table has no current schema".into()))?
        .clone();
    let spec = meta
        .default_spec()
        .ok_or_else(|| Error::Invalid("the table has no partition spec".into()))?
        .clone();
    let id = snapshot_id();
    let sequence = meta.last_sequence_number + 1;
    let parent = meta.current_snapshot_id;
    let loc = &meta.location;
    let mut objects = Vec::new();
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let mut removed_files = 0u64;
    let mut removed_rows = 0u64;
    let mut removed_bytes = 0u64;
    let mut replaced_manifests = 0;
    // Where a merge's manifest goes: where the first it replaces was, so that
    // live manifests stay in export order.
    let mut insert_at = None;
    // A replacement drops whole manifests: a merge takes every file of the
    // manifests it names. Manifests untouched are carried over as they are.
    for m in live {
        if m.files.iter().any(|(p, _, _)| append.replaces.contains(p)) {
            insert_at.get_or_insert(manifests.len());
            replaced_manifests += 1;
            removed_files += m.files.len() as u64;
            removed_rows += m.files.iter().map(|f| f.1).sum::<u64>();
            removed_bytes += m.files.iter().map(|f| f.2).sum::<u64>();
        } else {
            manifests.push(m.clone());
        }
    }
    if replaced_manifests > 0 {
        let named: usize = live
            .iter()
            .filter(|m| m.files.iter().any(|(p, _, _)| append.replaces.contains(p)))
            .map(|m| m.files.len())
            .sum();
        if named != append.replaces.len() {
            return Err(Error::Invalid(
                "a merge must replace every file of the manifests it touches".into(),
            ));
        }
    }
    let added_rows: u64 = append.files.iter().map(|f| f.records).sum();
    let added_bytes: u64 = append.files.iter().map(|f| f.size).sum();
    if !append.files.is_empty() {
        let bytes = manifest(&schema, &spec, parts, id, &append.files);
        let path = format!("{loc}/metadata/{}-m0.avro", uuid::Uuid::new_v4());
        let made = ManifestFile {
            path: path.clone(),
            length: bytes.len() as u64,
            spec_id: spec.spec_id,
            sequence_number: sequence,
            added_snapshot_id: id,
            added_files: append.files.len() as u32,
            added_rows,
            existing_files: 0,
            existing_rows: 0,
            partitions: summarize(parts, &append.files),
            files: append
                .files
                .iter()
                .map(|f| (f.path.clone(), f.records, f.size))
                .collect(),
            ranges: Some(append.ranges.clone()),
        };
        match insert_at {
            Some(i) => manifests.insert(i, made),
            None => manifests.push(made),
        }
        objects.push((path, bytes));
    }
    let list_path = format!("{loc}/metadata/snap-{id}-1-{}.avro", uuid::Uuid::new_v4());
    objects.push((
        list_path.clone(),
        manifest_list(id, parent, sequence, &manifests),
    ));
    objects.push((
        manifests_path(&list_path),
        serde_json::to_vec(&manifests).expect("manifests serialize"),
    ));
    let total_files: u64 = manifests.iter().map(|m| m.files.len() as u64).sum();
    let total_rows: u64 = manifests.iter().flat_map(|m| &m.files).map(|f| f.1).sum();
    let total_bytes: u64 = manifests.iter().flat_map(|m| &m.files).map(|f| f.2).sum();
    let operation = if append.replaces.is_empty() {
        "append"
    } else {
        "replace"
    };
    let mut summary = BTreeMap::from([
        ("operation".to_string(), operation.to_string()),
        ("added-data-files".into(), append.files.len().to_string()),
        ("added-records".into(), added_rows.to_string()),
        ("added-files-size".into(), added_bytes.to_string()),
        ("total-data-files".into(), total_files.to_string()),
        ("total-records".into(), total_rows.to_string()),
        ("total-files-size".into(), total_bytes.to_string()),
        ("total-delete-files".into(), "0".into()),
        ("total-position-deletes".into(), "0".into()),
        ("total-equality-deletes".into(), "0".into()),
        (
            OFFSETS_KEY.into(),
            serde_json::to_string(&append.offsets).expect("offsets serialize"),
        ),
    ]);
    if removed_files > 0 {
        summary.insert("deleted-data-files".into(), removed_files.to_string());
        summary.insert("deleted-records".into(), removed_rows.to_string());
        summary.insert("removed-files-size".into(), removed_bytes.to_string());
    }
    let mut next = meta.clone();
    next.add_snapshot(
        Snapshot {
            snapshot_id: id,
            parent_snapshot_id: parent,
            sequence_number: sequence,
            timestamp_ms: now_ms.max(meta.last_updated_ms),
            manifest_list: list_path,
            summary,
            schema_id: Some(schema.schema_id),
        },
        Some(meta_path),
    );
    let expired = next.expire_snapshots(append.keep_snapshots);
    let metadata_path = format!(
        "{loc}/metadata/{:05}-{}.metadata.json",
        sequence,
        uuid::Uuid::new_v4()
    );
    objects.push((
        metadata_path.clone(),
        serde_json::to_vec(&next).expect("metadata serializes"),
    ));
    Ok(Commit {
        objects,
        metadata: next,
        metadata_path,
        manifests,
        expired,
    })
}
