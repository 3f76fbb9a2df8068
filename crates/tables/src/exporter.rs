//! The exporter: for each table, every `commitInterval`, reads what its source
//! streams gained since the table's current snapshot, writes it as Parquet data
//! files and commits a snapshot that records where each stream now stands.
//!
//! Exactly once: a snapshot's summary holds, per stream, the sequence number the
//! next export starts at, and a commit becomes visible only when the table's
//! pointer moves from the snapshot it was built on ([`catalog::advance`]). A crash
//! at any point leaves either the old pointer (the round is redone from the old
//! offsets; its files are orphans) or the new one (the next round starts where it
//! ends). In a cluster each table's rounds run on the member holding its job lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use picomq_engine::cluster::StreamAdmin;
use picomq_engine::stream::seek::SeqBatch;
use picomq_engine::{Engine, EngineError, RecordExt};
use serde::Serialize;

use crate::catalog::{self, CommitRow, Entry, Source, TableId};
use crate::commit::{commit, create, manifests_path, Append};
use crate::manifest::{DataFile, ManifestFile};
use crate::metadata::{PartitionField, PartitionSpec, Schema, TableMetadata};
use crate::parquet::{write, Column, Datum, Field, Kind};
use crate::partition::{of_timestamp, parse, PartField, PartValue, Transform};
use crate::typed::{self, Typing};
use picomq_registry::Registry;
use picomq_schemas::columns::Cell;

/// Summary key: per stream, the id of the stream the offsets belong to (a stream
/// deleted and created again under the same name starts over).
pub const STREAM_IDS_KEY: &str = "picomq.stream-ids";
/// Bytes of column data after which a data file is written out.
const FILE_BYTES: usize = 64 << 20;
/// Source bytes one round reads at most (the rest waits for the next round).
const ROUND_BYTES: u64 = 1 << 30;
/// Bytes one read asks for.
const READ_BYTES: usize = 4 << 20;
/// Streams one table may be fed by.
pub const STREAMS_MAX: usize = 10_000;
/// A manifest whose files hold fewer bytes than this is small: merged once
/// [`MERGE_MIN`] of them follow each other.
const MERGE_SMALL: u64 = 16 << 20;
const MERGE_MIN: usize = 8;
/// Bytes of files one merge reads again at most.
const MERGE_BYTES_MAX: u64 = 256 << 20;
/// Manifests one merge takes at most.
const MERGE_MANIFESTS_MAX: usize = 500;
/// How often a table's location is swept for files nothing names, and how old
/// such a file must be to go.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
const ORPHAN_AGE: Duration = Duration::from_secs(3600);
/// How often a `trimSource` table asks the members serving its streams to trim
/// them: each ask is a request per stream, and retention counts in seconds.
const TIER_EVERY: Duration = Duration::from_secs(5);
/// How often the exporter looks for tables that are due.
const TICK: Duration = Duration::from_millis(500);

/// Columns every table has before its typed body columns.
pub const BASE_COLUMNS: usize = 9;

/// The columns every table has, in this order (ids 1-9).
pub fn base_fields() -> Vec<Field> {
    let f = |id, name: &str, kind, required| Field {
        id,
        name: name.into(),
        kind,
        required,
    };
    vec![
        f(1, "stream", Kind::String, true),
        f(2, "seq", Kind::Long, true),
        f(3, "offset", Kind::String, true),
        f(4, "timestamp", Kind::TimestampTz, true),
        f(5, "client_timestamp", Kind::TimestampTz, false),
        f(6, "key", Kind::Binary, false),
        f(7, "headers", Kind::String, false),
        f(8, "body", Kind::String, false),
        f(9, "body_binary", Kind::Binary, false),
    ]
}

/// What the exporter last did for a table (for `GET`, `/metrics` and the console).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub last_round_ms: Option<u64>,
    pub last_commit_ms: Option<u64>,
    pub last_error: Option<String>,
    pub records_exported: u64,
    pub bytes_exported: u64,
    pub files_written: u64,
    pub commits: u64,
    /// Object-store requests the exporter made (PUTs, GETs).
    pub puts: u64,
    pub gets: u64,
    /// Records below a stream's retained start when the table reached them.
    pub records_skipped: u64,
    /// Records of a table with a `schemaSubject` whose body did not decode with
    /// the subject's schemas (their typed columns are null; the raw body is kept).
    pub records_untyped: u64,
    /// Records appended to the sources and not in the table, at the end of the
    /// last round.
    pub lag_records: u64,
    /// The server timestamp of the oldest of them (what the lag in seconds is
    /// measured from, so it grows while rounds fail).
    pub oldest_unexported_ms: Option<u64>,
    /// Bytes of records read from the sources.
    pub source_bytes_read: u64,
    /// Source streams whose member could not be reached in the last round (their
    /// records wait for the next).
    pub streams_unreachable: u64,
    /// Merges of small files committed, and the manifests they replaced.
    pub merges: u64,
    pub files_merged: u64,
    /// Objects deleted: files of expired snapshots and orphans of crashed rounds.
    pub deletes: u64,
    pub files_collected: u64,
    /// `trimSource`: streams with an age retention the last round trimmed to it.
    pub streams_tiered: u64,
}

/// The streams tables with `trimSource` hold back from the engine's age
/// retention: trimmed by the exporter of their table once committed. Until the
/// tables were first read every stream is held (a trim cannot be undone).
#[derive(Default)]
pub struct TierHold {
    loaded: std::sync::atomic::AtomicBool,
    sources: std::sync::RwLock<Vec<(TableId, Source)>>,
}

impl TierHold {
    fn set(&self, tables: &BTreeMap<TableId, Entry>) {
        let sources = tables
            .values()
            .filter(|e| e.row.definition.trim_source)
            .flat_map(|e| {
                e.row
                    .definition
                    .sources()
                    .into_iter()
                    .map(|s| (e.id.clone(), s))
            })
            .collect();
        *self.sources.write().expect("hold lock") = sources;
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn table_of(&self, stream: &str) -> Option<TableId> {
        self.sources
            .read()
            .expect("hold lock")
            .iter()
            .find(|(_, s)| s.matches(stream))
            .map(|(id, _)| id.clone())
    }
}

impl picomq_engine::stream::retention::RetentionHold for TierHold {
    fn holds(&self, stream: &str) -> bool {
        !self.loaded.load(std::sync::atomic::Ordering::Acquire) || self.table_of(stream).is_some()
    }
}

/// Streams whose oldest unexported record a round looks up (the rest count in
/// the records, not the seconds).
const LAG_SEEKS_MAX: usize = 100;

/// What a round leaves unexported.
#[derive(Default)]
struct Lag {
    records: u64,
    oldest_ms: Option<u64>,
    seeks: usize,
}

impl Lag {
    async fn observe(&mut self, x: &Exporter, name: &str, next: u64, tail: u64) {
        if tail <= next {
            return;
        }
        self.records += tail - next;
        if self.seeks < LAG_SEEKS_MAX {
            self.seeks += 1;
            if let Ok(b) = x.read_seq(name, next, 1).await {
                if let Some(r) = b.records.first() {
                    self.oldest_ms = Some(self.oldest_ms.map_or(r.ts_ms, |o| o.min(r.ts_ms)));
                }
            }
        }
    }
}

/// A table's metadata and its live manifests, as one commit left them.
pub type Loaded = Arc<(TableMetadata, Vec<ManifestFile>)>;

pub struct Exporter {
    engine: Engine,
    /// The streams tables with `trimSource` hold back from age retention.
    hold: Arc<TierHold>,
    /// Where a table's `schemaSubject` is looked up (typed body columns).
    registry: Option<Arc<Registry>>,
    status: Mutex<BTreeMap<TableId, Status>>,
    /// Metadata and live manifests by metadata path: each is read once.
    loaded: Mutex<HashMap<String, Loaded>>,
    /// When each table's location was last swept.
    swept: Mutex<HashMap<TableId, Instant>>,
    /// When each `trimSource` table's streams were last tiered.
    tiered: Mutex<HashMap<TableId, Instant>>,
    /// Snapshots' live manifests by twin path (immutable once written).
    twins: Mutex<HashMap<String, Arc<Vec<ManifestFile>>>>,
    /// Rounds started, by table: when each is due again.
    due: Mutex<HashMap<TableId, Instant>>,
    /// The tables as last read, and the registry generation they were read at.
    tables: tokio::sync::Mutex<Option<(u64, BTreeMap<TableId, Entry>)>>,
}

impl Exporter {
    pub fn new(engine: Engine, registry: Option<Arc<Registry>>) -> Arc<Exporter> {
        let hold = Arc::new(TierHold::default());
        engine.set_retention_hold(hold.clone());
        Arc::new(Exporter {
            engine,
            hold,
            registry,
            status: Mutex::new(BTreeMap::new()),
            loaded: Mutex::new(HashMap::new()),
            swept: Mutex::new(HashMap::new()),
            tiered: Mutex::new(HashMap::new()),
            twins: Mutex::new(HashMap::new()),
            due: Mutex::new(HashMap::new()),
            tables: tokio::sync::Mutex::new(None),
        })
    }

    pub fn status(&self, id: &TableId) -> Status {
        self.status
            .lock()
            .expect("status lock")
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    pub fn all_status(&self) -> BTreeMap<TableId, Status> {
        self.status.lock().expect("status lock").clone()
    }

    /// The table's location as a URI (what Iceberg metadata names).
    pub fn uri(&self, relative: &str) -> String {
        format!(
            "{}/{}",
            self.engine.config().store_name.trim_end_matches('/'),
            relative
        )
    }

    fn relative<'a>(&self, uri: &'a str) -> Result<&'a str, EngineError> {
        let base = self.engine.config().store_name.trim_end_matches('/');
        uri.strip_prefix(base)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| EngineError::Internal(format!("{uri} is not in this store ({base})")))
    }

    /// Runs rounds for every due table until `stop` resolves.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            let tables = match self.tables().await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "the exporter could not list the tables");
                    continue;
                }
            };
            self.hold.set(&tables);
            {
                let mut status = self.status.lock().expect("status lock");
                status.retain(|id, _| tables.contains_key(id));
                self.due
                    .lock()
                    .expect("due lock")
                    .retain(|id, _| tables.contains_key(id));
            }
            for (id, entry) in tables {
                let interval = entry
                    .row
                    .definition
                    .interval()
                    .unwrap_or(catalog::DEFAULT_INTERVAL);
                let due = self.due.lock().expect("due lock").get(&id).copied();
                if due.is_some_and(|d| d > Instant::now()) {
                    continue;
                }
                if !picomq_engine::cluster::holds_job(
                    self.engine.cluster().map(|c| &**c),
                    &id.job(),
                    interval,
                )
                .await
                {
                    continue;
                }
                self.due
                    .lock()
                    .expect("due lock")
                    .insert(id.clone(), Instant::now() + interval);
                let outcome = self.round(&entry).await;
                let now = self.engine.clock().now_ms();
                let mut status = self.status.lock().expect("status lock");
                let s = status.entry(id.clone()).or_default();
                s.last_round_ms = Some(now);
                match outcome {
                    Ok(()) => s.last_error = None,
                    Err(e) => {
                        tracing::warn!(table = %id, error = %e, "table export round failed");
                        s.last_error = Some(e.to_string());
                    }
                }
            }
        }
    }

    /// Every table, read again only when the registry rows changed.
    pub async fn tables(&self) -> Result<BTreeMap<TableId, Entry>, EngineError> {
        let mut cached = self.tables.lock().await;
        let generation = self.engine.registry_generation().await?;
        if let Some((g, t)) = &*cached {
            if *g == generation {
                return Ok(t.clone());
            }
        }
        let t = catalog::tables(&self.engine).await?;
        *cached = Some((generation, t.clone()));
        Ok(t)
    }

    fn count(&self, id: &TableId, f: impl FnOnce(&mut Status)) {
        let mut status = self.status.lock().expect("status lock");
        f(status.entry(id.clone()).or_default());
    }

    async fn put(
        &self,
        id: &TableId,
        store: &dyn ObjectStore,
        uri: &str,
        bytes: Vec<u8>,
    ) -> Result<(), EngineError> {
        let path = ObjectPath::from(self.relative(uri)?);
        store
            .put(&path, PutPayload::from(Bytes::from(bytes)))
            .await
            .map_err(|e| EngineError::Unavailable(format!("writing {uri}: {e}")))?;
        self.count(id, |s| s.puts += 1);
        Ok(())
    }

    async fn get(
        &self,
        id: &TableId,
        store: &dyn ObjectStore,
        uri: &str,
    ) -> Result<Bytes, EngineError> {
        let path = ObjectPath::from(self.relative(uri)?);
        let got = store
            .get(&path)
            .await
            .map_err(|e| EngineError::Unavailable(format!("reading {uri}: {e}")))?;
        self.count(id, |s| s.gets += 1);
        got.bytes()
            .await
            .map_err(|e| EngineError::Unavailable(format!("reading {uri}: {e}")))
    }

    /// The table's metadata and live manifests at its current commit.
    pub async fn load(
        &self,
        id: &TableId,
        metadata_uri: &str,
    ) -> Result<Arc<(TableMetadata, Vec<ManifestFile>)>, EngineError> {
        if let Some(hit) = self.loaded.lock().expect("cache lock").get(metadata_uri) {
            return Ok(hit.clone());
        }
        let store = self.engine.store();
        let bytes = self.get(id, &*store, metadata_uri).await?;
        let meta: TableMetadata = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::Internal(format!("{metadata_uri}: {e}")))?;
        let manifests = match meta.current_snapshot() {
            None => Vec::new(),
            Some(s) => {
                let path = manifests_path(&s.manifest_list);
                let bytes = self.get(id, &*store, &path).await?;
                serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::Internal(format!("{path}: {e}")))?
            }
        };
        let loaded = Arc::new((meta, manifests));
        let mut cache = self.loaded.lock().expect("cache lock");
        if cache.len() > 256 {
            cache.clear();
        }
        cache.insert(metadata_uri.to_string(), loaded.clone());
        Ok(loaded)
    }

    /// The partition fields of the table's definition over `fields`.
    fn partition(entry: &Entry, fields: &[Field]) -> Result<Vec<PartField>, EngineError> {
        entry
            .row
            .definition
            .partition_by
            .iter()
            .enumerate()
            .map(|(i, p)| {
                parse(p, fields, 1000 + i as i32)
                    .map_err(|e| EngineError::bad_request(e.to_string()))
            })
            .collect()
    }

    /// Creates the table's first metadata (no snapshot) and points at it.
    async fn create(&self, entry: &Entry) -> Result<(), EngineError> {
        let fields = base_fields();
        let parts = Self::partition(entry, &fields)?;
        let spec = PartitionSpec {
            spec_id: 0,
            fields: parts
                .iter()
                .map(|p| PartitionField {
                    source_id: p.source_id,
                    field_id: p.field_id,
                    name: p.name.clone(),
                    transform: p.transform.name().into(),
                })
                .collect(),
        };
        let mut meta = TableMetadata::new(
            &self.uri(&entry.row.location),
            Schema::new(0, &fields),
            spec,
            self.engine.clock().now_ms() as i64,
        );
        meta.table_uuid = entry.row.uuid.clone();
        let (path, bytes) = create(&meta);
        self.put(&entry.id, &*self.engine.store(), &path, bytes)
            .await?;
        let row = CommitRow {
            metadata: self.relative(&path)?.to_string(),
            at_ms: self.engine.clock().now_ms(),
        };
        catalog::advance(&self.engine, &entry.id, &entry.row.uuid, None, row).await?;
        Ok(())
    }

    /// One round for one table: export what the sources gained, then merge
    /// small files when enough have piled up, expire old snapshots and collect
    /// the files no snapshot needs any more.
    pub async fn round(&self, entry: &Entry) -> Result<(), EngineError> {
        let Some((n, current)) = &entry.commit else {
            return self.create(entry).await;
        };
        let meta_uri = self.uri(&current.metadata);
        let loaded = self.load(&entry.id, &meta_uri).await?;
        let (meta, live) = (&loaded.0, &loaded.1);
        let schema = meta
            .current_schema()
            .ok_or_else(|| EngineError::Internal(format!("{meta_uri}: no current schema")))?;
        let mut fields = schema
            .fields()
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let typing = match (&entry.row.definition.schema_subject, &self.registry) {
            (Some(subject), Some(registry)) => Typing::open(registry, subject).await?,
            _ => None,
        };
        // The subject's latest schema decides the body columns; a change is a new
        // Iceberg schema, committed with this round.
        let mut evolved_meta = None;
        if let Some(t) = &typing {
            let evolved = typed::evolve(&base_fields(), &fields, &t.wanted(), meta.last_column_id);
            if evolved != fields {
                let mut m = meta.clone();
                m.set_schema(&evolved);
                evolved_meta = Some(m);
                fields = evolved;
            }
        }
        let schema_changed = evolved_meta.is_some();
        let meta = evolved_meta.as_ref().unwrap_or(meta);
        let parts = Self::partition(entry, &fields)?;
        let mut out = Files::new(entry, fields, parts, typing);
        let mut offsets = meta
            .offsets()
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let mut ids = stream_ids(meta);
        let mut ranges = BTreeMap::new();
        let streams = self.resolve(&entry.row.definition.sources()).await?;
        let mut budget = ROUND_BYTES;
        let mut skipped = 0u64;
        let mut lag = Lag::default();
        let mut unreachable = 0u64;
        'streams: for name in streams {
            if budget == 0 {
                break;
            }
            let mut next = offsets.get(&name).copied().unwrap_or(0);
            let mut batch = match self.read_seq(&name, next, READ_BYTES).await {
                Ok(b) => b,
                Err(EngineError::NotFound | EngineError::Gone | EngineError::BadRequest(_)) => {
                    continue
                }
                // A member that serves the stream cannot be reached now: its offset
                // stays where the table has it, and the next round tries again.
                Err(EngineError::NotOwner | EngineError::Unavailable(_)) => {
                    unreachable += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if ids.get(&name) != Some(&batch.stream_id) && next != 0 {
                // The stream was deleted and made again: it starts over.
                next = 0;
                batch = self.read_seq(&name, next, READ_BYTES).await?;
            }
            let stream_id = batch.stream_id;
            let end = batch.tail_seq;
            let mut tail = end;
            let mut first = None;
            loop {
                tail = tail.max(batch.tail_seq);
                if batch.first_seq > next {
                    skipped += batch.first_seq - next;
                    next = batch.first_seq;
                }
                if batch.records.is_empty() {
                    break;
                }
                for r in &batch.records {
                    if r.seq >= end || budget == 0 {
                        break;
                    }
                    if r.seq < next {
                        continue;
                    }
                    first.get_or_insert(r.seq);
                    out.add(self, &name, r).await?;
                    budget = budget.saturating_sub(r.data.len() as u64);
                    next = r.seq + 1;
                }
                if next >= end || budget == 0 {
                    break;
                }
                batch = match self.read_seq(&name, next, READ_BYTES).await {
                    Ok(b) => b,
                    Err(e) => {
                        // What was read of it so far is kept; it goes on next round.
                        tracing::debug!(stream = %name, error = %e, "table export read stopped");
                        break;
                    }
                };
            }
            if let Some(first) = first {
                ranges.insert(name.clone(), (first, next));
            }
            ids.insert(name.clone(), stream_id);
            offsets.insert(name.clone(), next);
            if budget > 0 {
                lag.observe(self, &name, next, tail).await;
            } else {
                lag.records += tail.saturating_sub(next);
                continue 'streams;
            }
        }
        let (files, records, untyped) = out.finish(self).await?;
        self.count(&entry.id, |s| {
            s.records_skipped += skipped;
            s.lag_records = lag.records;
            s.oldest_unexported_ms = lag.oldest_ms;
            s.source_bytes_read += ROUND_BYTES - budget;
            s.streams_unreachable = unreachable;
            s.records_untyped += untyped;
        });
        if files.is_empty() && !schema_changed {
            return self.tidy(entry, *n, &meta_uri, &loaded).await;
        }
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        let n_files = files.len() as u64;
        let append = Append {
            files,
            offsets,
            replaces: Vec::new(),
            ranges,
            keep_snapshots: entry.row.definition.keep_snapshots(),
        };
        let (next_n, next) = self
            .publish(entry, *n, meta, &meta_uri, live, append, &ids)
            .await?;
        self.count(&entry.id, |s| {
            s.records_exported += records;
            s.bytes_exported += bytes;
            s.files_written += n_files;
            s.commits += 1;
            s.last_commit_ms = Some(self.engine.clock().now_ms());
        });
        self.tidy(entry, next_n, &next.0, &next.1).await
    }

    /// Builds the commit of `append` on `meta`, writes its objects, moves the
    /// table's pointer from commit `n` to it and collects what the snapshots it
    /// expired leave behind. Answers the new commit's number, metadata location
    /// and state.
    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        entry: &Entry,
        n: u64,
        meta: &TableMetadata,
        meta_uri: &str,
        live: &[ManifestFile],
        append: Append,
        ids: &BTreeMap<String, u64>,
    ) -> Result<(u64, (String, Loaded)), EngineError> {
        let store = self.engine.store();
        let parts = Self::partition(
            entry,
            &meta.current_schema().map_or_else(
                || Ok(Vec::new()),
                |s| s.fields().map_err(|e| EngineError::Internal(e.to_string())),
            )?,
        )?;
        let mut c = commit(
            meta,
            meta_uri,
            live,
            &parts,
            append,
            self.engine.clock().now_ms() as i64,
        )
        .map_err(|e| EngineError::Internal(e.to_string()))?;
        let snapshot = c
            .metadata
            .current_snapshot_id
            .expect("a snapshot was added");
        // The stream ids ride in the same summary, written before the metadata.
        if let Some(s) = c
            .metadata
            .snapshots
            .iter_mut()
            .find(|s| s.snapshot_id == snapshot)
        {
            s.summary.insert(
                STREAM_IDS_KEY.into(),
                serde_json::to_string(ids).expect("ids serialize"),
            );
        }
        let last = c.objects.len() - 1;
        c.objects[last].1 = serde_json::to_vec(&c.metadata).expect("metadata serializes");
        for (uri, bytes) in std::mem::take(&mut c.objects) {
            self.put(&entry.id, &*store, &uri, bytes).await?;
        }
        picomq_engine::failpoint::hit("tables::before_advance");
        let row = CommitRow {
            metadata: self.relative(&c.metadata_path)?.to_string(),
            at_ms: self.engine.clock().now_ms(),
        };
        if !catalog::advance(&self.engine, &entry.id, &entry.row.uuid, Some(n), row).await? {
            return Err(EngineError::Conflict(
                "the table moved while this round ran; it starts again from there".into(),
            ));
        }
        let loaded: Loaded = Arc::new((c.metadata, c.manifests));
        self.loaded
            .lock()
            .expect("cache lock")
            .insert(c.metadata_path.clone(), loaded.clone());
        if !c.expired.0.is_empty() || !c.expired.1.is_empty() {
            if let Err(e) = self.collect_expired(entry, &loaded, &c.expired).await {
                // What is left is found by the next sweep of unreferenced files.
                tracing::warn!(table = %entry.id, error = %e, "collecting expired table files failed");
            }
        }
        Ok((n + 1, (c.metadata_path, loaded)))
    }

    /// After a round: a merge of small files when enough have piled up, and now
    /// and then a sweep of the files no snapshot names.
    async fn tidy(
        &self,
        entry: &Entry,
        n: u64,
        meta_uri: &str,
        loaded: &Loaded,
    ) -> Result<(), EngineError> {
        if entry.row.definition.trim_source && due(&self.tiered, &entry.id, TIER_EVERY) {
            self.tier(entry, &loaded.0).await;
        }
        let merged = self.merge(entry, n, meta_uri, loaded).await?;
        let (meta_uri, loaded) = match &merged {
            Some((_, (uri, l))) => (uri.as_str(), l),
            None => (meta_uri, loaded),
        };
        if due(&self.swept, &entry.id, SWEEP_EVERY) {
            if let Err(e) = self.sweep(entry, meta_uri, loaded).await {
                tracing::warn!(table = %entry.id, error = %e, "sweeping unreferenced table files failed");
            }
        }
        Ok(())
    }

    /// `trimSource`: each stream the table holds records of is trimmed, at the
    /// member serving it, of what the table committed and the stream's age
    /// retention has passed.
    async fn tier(&self, entry: &Entry, meta: &TableMetadata) {
        let Ok(offsets) = meta.offsets() else { return };
        let mut trimmed = 0;
        for (name, exported) in offsets {
            match self
                .engine
                .admin(&StreamAdmin::Tier {
                    stream: name.clone(),
                    exported,
                })
                .await
            {
                Ok(a) => trimmed += u64::from(a.retention_secs.is_some()),
                Err(EngineError::NotFound | EngineError::Gone) => {}
                Err(e) => {
                    tracing::debug!(table = %entry.id, stream = %name, error = %e, "tiering a stream failed; the next round tries again")
                }
            }
        }
        self.count(&entry.id, |s| s.streams_tiered = trimmed);
    }

    /// The table that holds the records trimmed from `stream`, if one does.
    pub fn tiered_into(&self, stream: &str) -> Option<TableId> {
        self.hold.table_of(stream)
    }

    /// Merges the first run of at least [`MERGE_MIN`] small manifests in a row
    /// into files of a useful size, read again from the streams (the records the
    /// manifests' ranges name, checked against their counts), committed as a
    /// `replace` snapshot. Nothing when no run qualifies, or when the streams no
    /// longer hold every record of it (trimmed, or made again).
    async fn merge(
        &self,
        entry: &Entry,
        n: u64,
        meta_uri: &str,
        loaded: &Loaded,
    ) -> Result<Option<(u64, (String, Loaded))>, EngineError> {
        let (meta, live) = (&loaded.0, &loaded.1);
        let Some((run, ranges)) = merge_run(live) else {
            return Ok(None);
        };
        let expected: u64 = live[run.clone()]
            .iter()
            .flat_map(|m| &m.files)
            .map(|f| f.1)
            .sum();
        let fields = meta
            .current_schema()
            .ok_or_else(|| EngineError::Internal(format!("{meta_uri}: no current schema")))?
            .fields()
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let parts = Self::partition(entry, &fields)?;
        let typing = match (&entry.row.definition.schema_subject, &self.registry) {
            (Some(subject), Some(registry)) => Typing::open(registry, subject).await?,
            _ => None,
        };
        let ids = stream_ids(meta);
        let mut out = Files::new(entry, fields, parts, typing);
        for (name, (from, to)) in &ranges {
            let mut next = *from;
            while next < *to {
                let batch = self.read_seq(name, next, READ_BYTES).await?;
                if ids.get(name) != Some(&batch.stream_id)
                    || batch.first_seq != next
                    || batch.records.is_empty()
                {
                    tracing::debug!(table = %entry.id, stream = %name, "a merge found records gone; files stay as they are");
                    return Ok(None);
                }
                for r in &batch.records {
                    if r.seq >= *to {
                        break;
                    }
                    out.add(self, name, r).await?;
                    next = r.seq + 1;
                }
            }
        }
        if out.records != expected {
            tracing::warn!(table = %entry.id, read = out.records, expected, "a merge read another count of records than its files hold; files stay as they are");
            return Ok(None);
        }
        let (files, _, _) = out.finish(self).await?;
        let replaces = live[run.clone()]
            .iter()
            .flat_map(|m| m.files.iter().map(|f| f.0.clone()))
            .collect();
        let append = Append {
            files,
            offsets: meta
                .offsets()
                .map_err(|e| EngineError::Internal(e.to_string()))?,
            replaces,
            ranges,
            keep_snapshots: entry.row.definition.keep_snapshots(),
        };
        let done = self
            .publish(entry, n, meta, meta_uri, live, append, &ids)
            .await?;
        self.count(&entry.id, |s| {
            s.merges += 1;
            s.files_merged += run.len() as u64;
        });
        Ok(Some(done))
    }

    /// Deletes what expired snapshots and dropped metadata files leave that no
    /// retained snapshot names.
    async fn collect_expired(
        &self,
        entry: &Entry,
        now: &Loaded,
        expired: &(Vec<String>, Vec<String>),
    ) -> Result<(), EngineError> {
        let keep = self.referenced(entry, now).await?;
        let mut dead = std::collections::BTreeSet::new();
        for list in &expired.0 {
            dead.insert(list.clone());
            let twin = manifests_path(list);
            if let Ok(manifests) = self.manifests(entry, &twin).await {
                for m in manifests.iter() {
                    dead.insert(m.path.clone());
                    dead.extend(m.files.iter().map(|f| f.0.clone()));
                }
            }
            dead.insert(twin);
        }
        dead.extend(expired.1.iter().cloned());
        let store = self.engine.store();
        for uri in dead.difference(&keep) {
            self.delete(entry, &*store, uri).await?;
        }
        Ok(())
    }

    /// Every object the table's retained snapshots and metadata log name.
    async fn referenced(
        &self,
        entry: &Entry,
        now: &Loaded,
    ) -> Result<std::collections::BTreeSet<String>, EngineError> {
        let meta = &now.0;
        let mut keep = std::collections::BTreeSet::new();
        keep.extend(meta.metadata_log.iter().map(|e| e.metadata_file.clone()));
        for s in &meta.snapshots {
            let twin = manifests_path(&s.manifest_list);
            let manifests = if Some(s.snapshot_id) == meta.current_snapshot_id {
                Arc::new(now.1.clone())
            } else {
                self.manifests(entry, &twin).await?
            };
            keep.insert(s.manifest_list.clone());
            keep.insert(twin);
            for m in manifests.iter() {
                keep.insert(m.path.clone());
                keep.extend(m.files.iter().map(|f| f.0.clone()));
            }
        }
        Ok(keep)
    }

    /// The live manifests a snapshot's twin file lists (immutable: read once).
    async fn manifests(
        &self,
        entry: &Entry,
        twin: &str,
    ) -> Result<Arc<Vec<ManifestFile>>, EngineError> {
        if let Some(hit) = self.twins.lock().expect("twins lock").get(twin) {
            return Ok(hit.clone());
        }
        let bytes = self.get(&entry.id, &*self.engine.store(), twin).await?;
        let m: Arc<Vec<ManifestFile>> = Arc::new(
            serde_json::from_slice(&bytes)
                .map_err(|e| EngineError::Internal(format!("{twin}: {e}")))?,
        );
        let mut twins = self.twins.lock().expect("twins lock");
        if twins.len() > 4096 {
            twins.clear();
        }
        twins.insert(twin.to_string(), m.clone());
        Ok(m)
    }

    /// Deletes the objects under the table's location that nothing names and
    /// that are older than [`ORPHAN_AGE`]: files of rounds that crashed or lost
    /// the table before their commit (a round younger than that may still be
    /// writing them).
    async fn sweep(&self, entry: &Entry, meta_uri: &str, now: &Loaded) -> Result<(), EngineError> {
        use futures::TryStreamExt;
        let mut keep = self.referenced(entry, now).await?;
        keep.insert(meta_uri.to_string());
        let store = self.engine.store();
        let prefix = ObjectPath::from(self.relative(&self.uri(&entry.row.location))?);
        let objects: Vec<object_store::ObjectMeta> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| EngineError::Unavailable(format!("listing {prefix}: {e}")))?;
        let cutoff = self.engine.clock().now_ms() as i64 - ORPHAN_AGE.as_millis() as i64;
        for o in objects {
            let uri = self.uri(o.location.as_ref());
            if !keep.contains(&uri) && o.last_modified.timestamp_millis() < cutoff {
                self.delete(entry, &*store, &uri).await?;
            }
        }
        Ok(())
    }

    async fn delete(
        &self,
        id: &Entry,
        store: &dyn ObjectStore,
        uri: &str,
    ) -> Result<(), EngineError> {
        let path = ObjectPath::from(self.relative(uri)?);
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(EngineError::Unavailable(format!("deleting {uri}: {e}"))),
        }
        self.count(&id.id, |s| {
            s.deletes += 1;
            s.files_collected += 1;
        });
        Ok(())
    }

    async fn flush(
        &self,
        entry: &Entry,
        fields: &[Field],
        partition: Vec<Option<PartValue>>,
        b: Builder,
        store: &dyn ObjectStore,
    ) -> Result<DataFile, EngineError> {
        let records = b.rows as u64;
        let (bytes, columns) =
            write(fields, &b.columns).map_err(|e| EngineError::Internal(e.to_string()))?;
        let dir: Vec<String> = partition
            .iter()
            .map(|p| p.as_ref().map_or("null".into(), PartValue::segment))
            .collect();
        let uri = format!(
            "{}/data/{}{}{}.parquet",
            self.uri(&entry.row.location),
            dir.join("/"),
            if dir.is_empty() { "" } else { "/" },
            uuid::Uuid::new_v4()
        );
        let size = bytes.len() as u64;
        self.put(&entry.id, store, &uri, bytes).await?;
        Ok(DataFile {
            path: uri,
            partition,
            records,
            size,
            columns,
        })
    }

    /// Records of stream `name` from number `seq` on, read at the member that
    /// serves it (this one, or another in a cluster).
    async fn read_seq(&self, name: &str, seq: u64, bytes: usize) -> Result<SeqBatch, EngineError> {
        let answer = self
            .engine
            .admin(&StreamAdmin::Read {
                stream: name.to_string(),
                seq,
                bytes,
            })
            .await?;
        answer
            .read
            .ok_or_else(|| EngineError::Internal(format!("a read of {name} answered no records")))
    }

    /// Where stream `name` stands for a table that exported it up to `seq`: its
    /// tail, and the first record from there on (at most one).
    pub async fn position(&self, name: &str, seq: u64) -> Result<SeqBatch, EngineError> {
        self.read_seq(name, seq, 1).await
    }

    /// The live streams the sources name, in name order, at most [`STREAMS_MAX`].
    pub async fn resolve(&self, sources: &[Source]) -> Result<Vec<String>, EngineError> {
        let mut names = std::collections::BTreeSet::new();
        for s in sources {
            match s {
                Source::Exact(n) => {
                    names.insert(n.clone());
                }
                Source::Prefix(p) => {
                    let mut after = String::new();
                    loop {
                        let page = self.engine.list(p, &after, 1000).await?;
                        for info in page.streams {
                            if s.matches(&info.name) {
                                names.insert(info.name);
                            }
                        }
                        match page.next {
                            Some(n) if names.len() < STREAMS_MAX => after = n,
                            _ => break,
                        }
                    }
                }
            }
            if names.len() >= STREAMS_MAX {
                break;
            }
        }
        Ok(names.into_iter().take(STREAMS_MAX).collect())
    }
}

/// Per stream, a range of sequence numbers `[from, to)`.
pub type Ranges = BTreeMap<String, (u64, u64)>;

/// The stream ids a table's current snapshot records.
fn stream_ids(meta: &TableMetadata) -> BTreeMap<String, u64> {
    meta.current_snapshot()
        .and_then(|s| s.summary.get(STREAM_IDS_KEY))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The first run of small manifests worth a merge (at least [`MERGE_MIN`] in a
/// row whose ranges follow each other, stream by stream), and the ranges it
/// covers together.
pub fn merge_run(live: &[ManifestFile]) -> Option<(std::ops::Range<usize>, Ranges)> {
    let size = |m: &ManifestFile| m.files.iter().map(|f| f.2).sum::<u64>();
    let mut i = 0;
    while i < live.len() {
        let mut ranges: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut bytes = 0;
        let mut j = i;
        while j < live.len() && j - i < MERGE_MANIFESTS_MAX {
            let m = &live[j];
            let Some(r) = &m.ranges else { break };
            let follows = r
                .iter()
                .all(|(s, (from, _))| ranges.get(s).is_none_or(|(_, to)| to == from));
            if size(m) >= MERGE_SMALL || bytes + size(m) > MERGE_BYTES_MAX || !follows {
                break;
            }
            for (s, (from, to)) in r {
                ranges
                    .entry(s.clone())
                    .and_modify(|e| e.1 = *to)
                    .or_insert((*from, *to));
            }
            bytes += size(m);
            j += 1;
        }
        if j - i >= MERGE_MIN {
            return Some((i..j, ranges));
        }
        i = j.max(i + 1);
    }
    None
}

/// The data files a round or a merge writes: rows grouped by partition, a file
/// written out whenever one reaches [`FILE_BYTES`].
struct Files<'e> {
    entry: &'e Entry,
    fields: Vec<Field>,
    parts: Vec<PartField>,
    body_columns: Vec<(usize, String)>,
    typing: Option<Typing>,
    builders: BTreeMap<Vec<Option<PartValue>>, Builder>,
    files: Vec<DataFile>,
    records: u64,
    untyped: u64,
}

impl<'e> Files<'e> {
    fn new(
        entry: &'e Entry,
        fields: Vec<Field>,
        parts: Vec<PartField>,
        typing: Option<Typing>,
    ) -> Files<'e> {
        let body_columns = fields
            .iter()
            .enumerate()
            .skip(BASE_COLUMNS)
            .map(|(i, f)| (i, typed::source_of(&f.name).to_string()))
            .collect();
        Files {
            entry,
            fields,
            parts,
            body_columns,
            typing,
            builders: BTreeMap::new(),
            files: Vec::new(),
            records: 0,
            untyped: 0,
        }
    }

    async fn add(
        &mut self,
        x: &Exporter,
        stream: &str,
        r: &picomq_engine::stream::seek::SeqRecord,
    ) -> Result<(), EngineError> {
        let row = Row::of(stream, r.seq, &r.offset, r.ts_ms, r.ext.as_ref(), &r.data);
        let cells = match self.typing.as_mut() {
            Some(t) => {
                let cells = t.decode(row.body);
                self.untyped += u64::from(cells.is_none());
                cells
            }
            None => None,
        };
        let key: Vec<Option<PartValue>> = self.parts.iter().map(|p| row.partition(p)).collect();
        let fields = &self.fields;
        let b = self
            .builders
            .entry(key.clone())
            .or_insert_with(|| Builder::new(fields));
        b.push(&row, cells.as_ref(), &self.body_columns)?;
        self.records += 1;
        if b.bytes() >= FILE_BYTES {
            let b = self.builders.remove(&key).expect("just used");
            let store = x.engine.store();
            let f = x.flush(self.entry, &self.fields, key, b, &*store).await?;
            self.files.push(f);
        }
        Ok(())
    }

    /// The files, the records in them and how many did not decode.
    async fn finish(mut self, x: &Exporter) -> Result<(Vec<DataFile>, u64, u64), EngineError> {
        let store = x.engine.store();
        for (key, b) in std::mem::take(&mut self.builders) {
            let f = x.flush(self.entry, &self.fields, key, b, &*store).await?;
            self.files.push(f);
        }
        Ok((self.files, self.records, self.untyped))
    }
}

/// One record as a table row.
struct Row<'a> {
    stream: &'a str,
    seq: u64,
    offset: String,
    ts_micros: i64,
    client_micros: Option<i64>,
    key: Option<Bytes>,
    headers: Option<String>,
    body: &'a [u8],
    text: bool,
}

impl<'a> Row<'a> {
    fn of(
        stream: &'a str,
        seq: u64,
        offset: &str,
        ts_ms: u64,
        ext: Option<&Bytes>,
        data: &'a Bytes,
    ) -> Row<'a> {
        let ext = ext
            .and_then(|e| RecordExt::decode(e).ok())
            .unwrap_or_default();
        let body: &[u8] = if ext.null_value || ext.empty_value {
            &[]
        } else {
            data
        };
        let headers = (!ext.headers.is_empty()).then(|| {
            let pairs: Vec<serde_json::Value> = ext
                .headers
                .iter()
                .map(|(n, v)| match std::str::from_utf8(v) {
                    Ok(s) => serde_json::json!([n, s]),
                    Err(_) => {
                        use base64::Engine as _;
                        serde_json::json!([n, {"base64": base64::engine::general_purpose::STANDARD.encode(v)}])
                    }
                })
                .collect();
            serde_json::Value::Array(pairs).to_string()
        });
        Row {
            stream,
            seq,
            offset: offset.to_string(),
            ts_micros: ts_ms as i64 * 1000,
            client_micros: ext.client_ts_ms.map(|t| t as i64 * 1000),
            key: ext.key,
            headers,
            text: !ext.null_value && std::str::from_utf8(body).is_ok(),
            body,
        }
    }

    fn partition(&self, p: &PartField) -> Option<PartValue> {
        match (p.source_id, p.transform) {
            (1, Transform::Identity) => Some(PartValue::String(self.stream.to_string())),
            (2, Transform::Identity) => Some(PartValue::Long(self.seq as i64)),
            (4, t) => Some(of_timestamp(t, self.ts_micros)),
            (5, t) => self.client_micros.map(|m| of_timestamp(t, m)),
            _ => None,
        }
    }
}

/// The columns of one data file being built.
struct Builder {
    columns: Vec<Column>,
    rows: usize,
}

impl Builder {
    fn new(fields: &[Field]) -> Builder {
        Builder {
            columns: fields.iter().map(|f| Column::new(f.kind)).collect(),
            rows: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.columns.iter().map(Column::bytes).sum()
    }

    fn push(
        &mut self,
        r: &Row<'_>,
        cells: Option<&BTreeMap<String, Cell>>,
        body_columns: &[(usize, String)],
    ) -> Result<(), EngineError> {
        let c = &mut self.columns;
        let e = |e: crate::Error| EngineError::Internal(e.to_string());
        c[0].push(Datum::Bytes(r.stream.as_bytes())).map_err(e)?;
        c[1].push(Datum::Long(r.seq as i64)).map_err(e)?;
        c[2].push(Datum::Bytes(r.offset.as_bytes())).map_err(e)?;
        c[3].push(Datum::Long(r.ts_micros)).map_err(e)?;
        c[4].push(r.client_micros.map_or(Datum::Null, Datum::Long))
            .map_err(e)?;
        c[5].push(r.key.as_deref().map_or(Datum::Null, Datum::Bytes))
            .map_err(e)?;
        c[6].push(
            r.headers
                .as_deref()
                .map_or(Datum::Null, |h| Datum::Bytes(h.as_bytes())),
        )
        .map_err(e)?;
        if r.text {
            c[7].push(Datum::Bytes(r.body)).map_err(e)?;
            c[8].push(Datum::Null).map_err(e)?;
        } else {
            c[7].push(Datum::Null).map_err(e)?;
            c[8].push(Datum::Bytes(r.body)).map_err(e)?;
        }
        let mut scratch = String::new();
        for (i, source) in body_columns {
            let cell = cells.and_then(|c| c.get(source));
            let kind = c[*i].kind();
            c[*i]
                .push(typed::datum(kind, cell, &mut scratch))
                .map_err(e)?;
        }
        self.rows += 1;
        Ok(())
    }
}

use picomq_engine::metrics::{Desc, Exposition};

static LAG_RECORDS: Desc = Desc::gauge(
    "picomq_table_lag_records",
    "Records in a table's source streams not yet in the table (at its last round).",
);
static LAG_SECONDS: Desc = Desc::gauge(
    "picomq_table_lag_seconds",
    "Age of the oldest record not yet in the table (0 when none is behind).",
);
static EXPORTED_RECORDS: Desc = Desc::counter(
    "picomq_table_records_exported_total",
    "Records committed to a table since this node started exporting it.",
);
static EXPORTED_BYTES: Desc = Desc::counter(
    "picomq_table_source_bytes_read_total",
    "Bytes of source records the exporter read for a table.",
);
static FILE_BYTES_WRITTEN: Desc = Desc::counter(
    "picomq_table_file_bytes_written_total",
    "Bytes of Parquet data files written for a table.",
);
static COMMITS: Desc = Desc::counter(
    "picomq_table_commits_total",
    "Snapshots committed to a table.",
);
static REQUESTS: Desc = Desc::counter(
    "picomq_table_store_requests_total",
    "Object-store requests of a table's exporter, by kind (put, get).",
);
static REQUESTS_PER_MIB: Desc = Desc::gauge(
    "picomq_table_store_requests_per_mib",
    "Object-store requests (PUTs and GETs) per MiB of source records exported: the export's cost line.",
);
static ROUND_FAILING: Desc = Desc::gauge(
    "picomq_table_round_failing",
    "1 while a table's last export round failed.",
);

impl Exporter {
    /// The tables this node exports, for `/metrics`.
    pub fn export(&self, out: &mut Exposition) {
        let now = self.engine.clock().now_ms();
        for (id, s) in self.all_status() {
            let name = id.to_string();
            let labels = [("table", name.as_str())];
            out.value(&LAG_RECORDS, &labels, s.lag_records as f64);
            let lag_ms = match s.oldest_unexported_ms {
                Some(t) if s.lag_records > 0 => now.saturating_sub(t),
                _ => 0,
            };
            out.value(&LAG_SECONDS, &labels, lag_ms as f64 / 1000.0);
            out.value(&EXPORTED_RECORDS, &labels, s.records_exported as f64);
            out.value(&EXPORTED_BYTES, &labels, s.source_bytes_read as f64);
            out.value(&FILE_BYTES_WRITTEN, &labels, s.bytes_exported as f64);
            out.value(&COMMITS, &labels, s.commits as f64);
            out.value(
                &REQUESTS,
                &[("table", name.as_str()), ("kind", "put")],
                s.puts as f64,
            );
            out.value(
                &REQUESTS,
                &[("table", name.as_str()), ("kind", "get")],
                s.gets as f64,
            );
            let mib = s.source_bytes_read as f64 / (1024.0 * 1024.0);
            if mib > 0.0 {
                out.value(&REQUESTS_PER_MIB, &labels, (s.puts + s.gets) as f64 / mib);
            }
            out.value(
                &ROUND_FAILING,
                &labels,
                if s.last_error.is_some() { 1.0 } else { 0.0 },
            );
        }
    }
}

/// Whether `every` has passed since `id` was last due in `last` (then it is due
/// now, and that is noted).
fn due(last: &Mutex<HashMap<TableId, Instant>>, id: &TableId, every: Duration) -> bool {
    let mut last = last.lock().expect("due lock");
    let now = Instant::now();
    match last.get(id) {
        Some(t) if now.duration_since(*t) < every => false,
        _ => {
            last.insert(id.clone(), now);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(size: u64, ranges: &[(&str, u64, u64)]) -> ManifestFile {
        ManifestFile {
            path: format!("m{size}"),
            length: 1,
            spec_id: 0,
            sequence_number: 1,
            added_snapshot_id: 1,
            added_files: 1,
            added_rows: 1,
            existing_files: 0,
            existing_rows: 0,
            partitions: Vec::new(),
            files: vec![("f".into(), 1, size)],
            ranges: Some(
                ranges
                    .iter()
                    .map(|(s, a, b)| (s.to_string(), (*a, *b)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn tiered_streams_are_held_and_all_are_until_the_tables_are_known() {
        use picomq_engine::stream::retention::RetentionHold;
        let hold = TierHold::default();
        assert!(hold.holds("orders/eu"), "held before the tables were read");
        let entry = |table: &str, source: &str, trim: bool| {
            let definition: catalog::Definition =
                serde_json::from_value(serde_json::json!({"source": source, "trimSource": trim}))
                    .unwrap();
            let id = TableId::new("ns", table).unwrap();
            let row = catalog::TableRow {
                definition,
                uuid: "u".into(),
                location: "tables/ns".into(),
                created_ms: 0,
            };
            (
                id.clone(),
                Entry {
                    id,
                    row,
                    commit: None,
                },
            )
        };
        let tables = BTreeMap::from([
            entry("tiered", "orders/**", true),
            entry("plain", "logs/**", false),
        ]);
        hold.set(&tables);
        assert!(hold.holds("orders/eu"));
        assert!(
            !hold.holds("logs/app"),
            "a table without trimSource holds nothing"
        );
        assert!(!hold.holds("other"));
        assert_eq!(hold.table_of("orders/eu").unwrap().to_string(), "ns.tiered");
    }

    #[test]
    fn merges_take_runs_of_small_manifests_whose_ranges_follow() {
        let small: Vec<ManifestFile> = (0..MERGE_MIN as u64)
            .map(|i| m(10, &[("a", i * 5, i * 5 + 5)]))
            .collect();
        let (run, ranges) = merge_run(&small).expect("a run");
        assert_eq!(run, 0..MERGE_MIN);
        assert_eq!(ranges["a"], (0, 5 * MERGE_MIN as u64));
        // One short of the minimum: nothing.
        assert!(merge_run(&small[1..]).is_none());
        // A big manifest first, then the run.
        let mut live = vec![m(MERGE_SMALL, &[("a", 0, 1)])];
        live.extend(small.iter().cloned());
        assert_eq!(merge_run(&live).unwrap().0, 1..MERGE_MIN + 1);
        // A gap in a stream's numbers (a trim between rounds) breaks the run.
        let mut gap = small.clone();
        gap[4] = m(10, &[("a", 21, 25)]);
        assert!(merge_run(&gap).is_none());
        // Manifests without ranges (written before they were kept) stay.
        let mut old = small.clone();
        old[3].ranges = None;
        assert!(merge_run(&old).is_none());
        // Other streams join a run freely.
        let mut mixed = small.clone();
        mixed[2] = m(10, &[("a", 10, 15), ("b", 0, 3)]);
        assert_eq!(merge_run(&mixed).unwrap().1["b"], (0, 3));
    }
}
