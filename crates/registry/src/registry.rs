//! The registry's operations, as the Confluent Schema Registry defines them
//! (docs/schemas.md): registering under a subject with the compatibility check,
//! lookups, soft and hard deletes, settings, and stream bindings.
//!
//! Writes run one at a time across every node sharing the metadata: the node's
//! own lock, then the store's (`Service::registry_lock`), then the state reloaded
//! under both, so every decision sees every earlier write. Reads answer from the
//! node's copy, reloaded first when the store counts changes it has not seen.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use picomq_engine::stream::{Service, WeakService};
use picomq_engine::wal::format::Op;
use picomq_schemas::compat::Level;
use picomq_schemas::parsed::{self, Compiled, Parsed, SchemaType};
use serde_json::Value;

use crate::error::*;
use crate::state::{self, Binding, ConfigRow, Reference, SchemaRow, State, VersionRow};

/// Subject names longer than this are refused.
pub const SUBJECT_BYTES_MAX: usize = 255;
/// One schema's text (42209 above it).
pub const SCHEMA_BYTES_MAX: usize = 256 * 1024;
/// All schema text the registry holds.
pub const REGISTRY_BYTES_MAX: usize = 64 * 1024 * 1024;
pub const SUBJECTS_MAX: usize = 10_000;
pub const VERSIONS_PER_SUBJECT_MAX: usize = 1_000;
pub const REFERENCES_MAX: usize = 64;
/// How deep references may nest (a schema referencing one that references ...).
const REFERENCE_DEPTH_MAX: usize = 16;
/// How long a registry write waits for its change to be durable (well inside
/// Postgres's idle-in-transaction limit, which would release the store's lock).
const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Compiled schemas a node keeps (ids are immutable; past this the cache starts
/// over).
const COMPILED_MAX: usize = 4_096;

/// A schema as a client sends it.
#[derive(Clone, Debug, Default)]
pub struct NewSchema {
    pub schema: String,
    pub schema_type: Option<String>,
    pub references: Vec<Reference>,
    pub metadata: Option<Value>,
    pub rule_set: Option<Value>,
}

/// A version of a subject, as answered.
#[derive(Clone, Debug)]
pub struct VersionView {
    pub subject: String,
    pub version: u32,
    pub id: u32,
    pub deleted: bool,
    pub schema: Arc<SchemaRow>,
}

/// Which version a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionRef {
    Latest,
    Number(u32),
}

impl VersionRef {
    /// `latest`, `-1` or 1..2^31-1 (42202 otherwise).
    pub fn parse(s: &str) -> Result<VersionRef> {
        if s == "latest" || s == "-1" {
            return Ok(VersionRef::Latest);
        }
        match s.parse::<u32>() {
            Ok(v) if (1..=i32::MAX as u32).contains(&v) => Ok(VersionRef::Number(v)),
            _ => Err(RegistryError::new(
                INVALID_VERSION,
                format!(
                    "The specified version '{s}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\""
                ),
            )),
        }
    }
}

pub struct Registry {
    /// Weak: the engine holds the registry (its append check), and a strong
    /// reference back would keep a stopped node's WAL and store open.
    engine: WeakService,
    state: RwLock<Arc<State>>,
    write: tokio::sync::Mutex<()>,
    compiled: Mutex<HashMap<u32, Arc<Compiled>>>,
    /// The metadata is shared with other nodes (a cluster): they write too.
    shared: bool,
    /// Whether the state was loaded once.
    loaded: tokio::sync::watch::Sender<bool>,
    /// Held by the reader reloading a stale copy.
    reloading: tokio::sync::Mutex<()>,
}

pub fn check_subject(subject: &str) -> Result<()> {
    if subject.is_empty() || subject.len() > SUBJECT_BYTES_MAX {
        return Err(RegistryError::new(
            BAD_REQUEST,
            format!("a subject name is 1 to {SUBJECT_BYTES_MAX} bytes"),
        ));
    }
    if subject.chars().any(char::is_control) {
        return Err(RegistryError::new(
            BAD_REQUEST,
            "a subject name may not hold control characters",
        ));
    }
    Ok(())
}

fn subject_not_found(subject: &str) -> RegistryError {
    RegistryError::new(SUBJECT_NOT_FOUND, format!("Subject '{subject}' not found."))
}

fn version_not_found(subject: &str, v: VersionRef) -> RegistryError {
    let v = match v {
        VersionRef::Latest => "latest".to_string(),
        VersionRef::Number(n) => n.to_string(),
    };
    RegistryError::new(
        VERSION_NOT_FOUND,
        format!("Version {v} not found for subject '{subject}'."),
    )
}

fn fingerprint(kind: SchemaType, canonical: &str, new: &NewSchema) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        kind.as_str().as_bytes(),
        canonical.as_bytes(),
        serde_json::to_string(&new.references)
            .unwrap_or_default()
            .as_bytes(),
        new.metadata
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
            .as_bytes(),
        new.rule_set
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
            .as_bytes(),
    ] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part);
    }
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Registry {
    /// The registry of `engine`'s metadata. It loads in the background (with
    /// retries): appends to any stream wait for it ([`Registry::ready`]; until
    /// then the check refuses them as unavailable), and in a cluster it follows
    /// the other nodes' writes every second. Call inside a Tokio runtime.
    pub fn new(engine: Service) -> Arc<Registry> {
        let shared = engine.meta().local_index().is_none();
        let registry = Arc::new(Registry {
            engine: engine.downgrade(),
            state: RwLock::new(Arc::new(State::default())),
            write: tokio::sync::Mutex::new(()),
            compiled: Mutex::new(HashMap::new()),
            shared,
            loaded: tokio::sync::watch::channel(false).0,
            reloading: tokio::sync::Mutex::new(()),
        });
        let weak = Arc::downgrade(&registry);
        tokio::spawn(async move {
            loop {
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                let result = if *registry.loaded.borrow() {
                    registry.fresh().await.map(|_| ())
                } else {
                    registry.reload().await.map(|_| ())
                };
                match result {
                    Ok(()) if !registry.shared => return,
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not load the schema registry; retrying")
                    }
                }
                drop(registry);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        registry
    }

    /// Waits until the registry is loaded.
    pub async fn ready(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|loaded| *loaded).await;
    }

    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// The engine, while the node runs.
    fn engine(&self) -> Result<Service> {
        self.engine
            .upgrade()
            .ok_or_else(|| RegistryError::new(UNAVAILABLE, "the node is stopping"))
    }

    /// The node's copy, as it is.
    pub fn snapshot(&self) -> Arc<State> {
        self.state.read().expect("registry state lock").clone()
    }

    /// The node's copy, reloaded first if another node changed the registry.
    pub async fn fresh(&self) -> Result<Arc<State>> {
        let current = self.snapshot();
        if !self.is_loaded() {
            return self.reload().await;
        }
        if !self.shared {
            return Ok(current);
        }
        if self.engine()?.registry_generation().await? == current.generation {
            return Ok(current);
        }
        // One reload at a time: readers that found the copy stale together wait
        // for one reload and look again, rather than each reading every row.
        let _one = self.reloading.lock().await;
        let current = self.snapshot();
        if self.engine()?.registry_generation().await? == current.generation {
            return Ok(current);
        }
        self.reload().await
    }

    async fn reload(&self) -> Result<Arc<State>> {
        let generation = self.engine()?.registry_generation().await?;
        let rows = self.engine()?.registry_rows().await?;
        let state = Arc::new(State::from_rows(generation, rows));
        {
            // Two loads racing: the older answer must not replace the newer.
            let mut current = self.state.write().expect("registry state lock");
            if !self.is_loaded() || state.generation >= current.generation {
                *current = state.clone();
            }
        }
        self.loaded.send_replace(true);
        Ok(state)
    }

    /// Logs registry changes and reloads the node's copy (whatever happened: a
    /// commit that failed may still be durable).
    async fn commit(&self, ops: Vec<Op>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        // Bounded: in a cluster the store's lock is a Postgres transaction, which
        // Postgres ends after a minute idle. An answer past this is unknown: the
        // change may still land, and is written so that landing late is harmless
        // (new rows never replace what is there).
        let committed = tokio::time::timeout(COMMIT_TIMEOUT, self.engine()?.registry_commit(ops))
            .await
            .unwrap_or_else(|_| {
                Err(picomq_engine::EngineError::Unavailable(format!(
                    "the change was not durable within {COMMIT_TIMEOUT:?}; it may still be applied: retry"
                )))
            });
        let reloaded = self.reload().await;
        committed?;
        reloaded?;
        Ok(())
    }

    /// The schemas `refs` name (and the ones they name), dependencies first, as
    /// (name, text) pairs for the parser.
    fn imports(&self, state: &State, refs: &[Reference]) -> Result<Vec<(String, String)>> {
        fn walk(
            state: &State,
            refs: &[Reference],
            depth: usize,
            seen: &mut HashSet<(String, u32)>,
            out: &mut Vec<(String, String)>,
        ) -> Result<()> {
            if depth > REFERENCE_DEPTH_MAX {
                return Err(RegistryError::new(
                    INVALID_SCHEMA,
                    format!("references nest deeper than {REFERENCE_DEPTH_MAX}"),
                ));
            }
            for r in refs {
                if !seen.insert((r.subject.clone(), r.version)) {
                    continue;
                }
                let row = state
                    .subjects
                    .get(&r.subject)
                    .and_then(|vs| vs.get(&r.version))
                    .and_then(|v| state.schemas.get(&v.id))
                    .ok_or_else(|| {
                        RegistryError::new(
                            INVALID_SCHEMA,
                            format!(
                                "Invalid schema: the reference {:?} names subject {:?} version {}, which does not exist",
                                r.name, r.subject, r.version
                            ),
                        )
                    })?;
                walk(state, &row.references, depth + 1, seen, out)?;
                out.push((r.name.clone(), row.schema.clone()));
            }
            Ok(())
        }
        let mut out = Vec::new();
        walk(state, refs, 0, &mut HashSet::new(), &mut out)?;
        Ok(out)
    }

    /// Parses a client's schema: its type, the parsed form and the row it would
    /// be stored as.
    fn prepare(&self, state: &State, new: &NewSchema) -> Result<(Parsed, SchemaRow)> {
        if new.schema.len() > SCHEMA_BYTES_MAX {
            return Err(RegistryError::new(
                SCHEMA_TOO_LARGE,
                format!(
                    "the schema is {} bytes; the limit is {SCHEMA_BYTES_MAX}",
                    new.schema.len()
                ),
            ));
        }
        if new.references.len() > REFERENCES_MAX {
            return Err(RegistryError::new(
                INVALID_SCHEMA,
                format!("a schema may hold at most {REFERENCES_MAX} references"),
            ));
        }
        for r in &new.references {
            check_subject(&r.subject)?;
            if r.name.is_empty() || r.version == 0 {
                return Err(RegistryError::new(
                    INVALID_SCHEMA,
                    "a reference needs a name, a subject and a version (1 or more)",
                ));
            }
        }
        let kind = SchemaType::parse(new.schema_type.as_deref())
            .map_err(|e| RegistryError::new(INVALID_SCHEMA, e))?;
        let imports = self.imports(state, &new.references)?;
        let (parsed, canonical) = parsed::parse(kind, &new.schema, &imports).map_err(|e| {
            RegistryError::new(
                INVALID_SCHEMA,
                format!("Invalid schema {}: {e}", kind.as_str()),
            )
        })?;
        let fingerprint = fingerprint(kind, &canonical, new);
        let row = SchemaRow {
            kind: kind.as_str().to_string(),
            schema: new.schema.clone(),
            canonical,
            references: new.references.clone(),
            metadata: new.metadata.clone(),
            rule_set: new.rule_set.clone(),
            fingerprint,
        };
        Ok((parsed, row))
    }

    /// The compiled form of schema `id`, from the node's cache.
    pub fn compiled(&self, state: &State, id: u32) -> std::result::Result<Arc<Compiled>, String> {
        if let Some(c) = self.compiled.lock().expect("compiled lock").get(&id) {
            return Ok(c.clone());
        }
        let row = state
            .schemas
            .get(&id)
            .ok_or_else(|| format!("no schema has id {id}"))?;
        let imports = self
            .imports(state, &row.references)
            .map_err(|e| e.message)?;
        let (parsed, _) = parsed::parse(row.schema_type(), &row.schema, &imports)?;
        let compiled = Arc::new(Compiled::new(parsed)?);
        let mut cache = self.compiled.lock().expect("compiled lock");
        if cache.len() >= COMPILED_MAX {
            cache.clear();
        }
        cache.insert(id, compiled.clone());
        Ok(compiled)
    }

    fn parsed_versions(&self, state: &State, subject: &str) -> Result<Vec<Parsed>> {
        state
            .versions(subject, false)
            .into_iter()
            .map(|(_, r)| {
                self.compiled(state, r.id)
                    .map(|c| c.parsed.clone())
                    .map_err(|e| RegistryError::new(STORE_ERROR, e))
            })
            .collect()
    }

    /// Takes the registry's write locks (the node's, then the store's) and
    /// answers the state as it stands under them.
    async fn lock(&self) -> Result<WriteGuard<'_>> {
        let busy = || {
            RegistryError::new(
                UNAVAILABLE,
                format!("another registry change held the registry for {COMMIT_TIMEOUT:?}; retry"),
            )
        };
        let local = tokio::time::timeout(COMMIT_TIMEOUT, self.write.lock())
            .await
            .map_err(|_| busy())?;
        let store = tokio::time::timeout(COMMIT_TIMEOUT, self.engine()?.registry_lock())
            .await
            .map_err(|_| busy())??;
        let state = self.reload().await?;
        Ok(WriteGuard {
            _local: local,
            _store: store,
            state,
        })
    }

    // ---- subjects and versions -----------------------------------------------

    /// Registers `new` under `subject`: the version that already holds it, or a
    /// new version once it passes the subject's compatibility check.
    pub async fn register(&self, subject: &str, new: &NewSchema) -> Result<VersionView> {
        check_subject(subject)?;
        let guard = self.lock().await?;
        let state = &guard.state;
        let (parsed, row) = self.prepare(state, new)?;
        for (v, r) in state.versions(subject, false) {
            if let Some(s) = state.schemas.get(&r.id) {
                if s.fingerprint == row.fingerprint {
                    return Ok(view(subject, v, r, s.clone()));
                }
            }
        }
        let level = state.level(subject);
        if level != Level::None {
            let previous = self.parsed_versions(state, subject)?;
            let problems = parsed::compatible(level, &parsed, &previous);
            if !problems.is_empty() {
                return Err(RegistryError::new(
                    INCOMPATIBLE,
                    format!(
                        "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: [{}]",
                        problems.join(", ")
                    ),
                ));
            }
        }
        let all = state.subjects.get(subject);
        if all.is_none() && state.subjects.len() >= SUBJECTS_MAX {
            return Err(RegistryError::new(
                FULL,
                format!("the registry holds its maximum of {SUBJECTS_MAX} subjects"),
            ));
        }
        if all.map_or(0, |vs| vs.len()) >= VERSIONS_PER_SUBJECT_MAX {
            return Err(RegistryError::new(
                FULL,
                format!("subject {subject:?} holds its maximum of {VERSIONS_PER_SUBJECT_MAX} versions; delete some first"),
            ));
        }
        let version = all
            .and_then(|vs| vs.keys().next_back().copied())
            .unwrap_or(0)
            + 1;
        let mut ops = Vec::new();
        let (id, row) = match state.by_fingerprint.get(&row.fingerprint) {
            Some(&id) => (id, state.schemas[&id].clone()),
            None => {
                if state.schema_bytes + row.schema.len() + row.canonical.len() > REGISTRY_BYTES_MAX
                {
                    return Err(RegistryError::new(
                        FULL,
                        format!(
                            "the registry holds its maximum of {REGISTRY_BYTES_MAX} bytes of schemas"
                        ),
                    ));
                }
                let next = state.schemas.keys().next_back().map_or(1, |id| id + 1);
                let id = self.engine()?.registry_draw_id(u64::from(next)).await?;
                let id = u32::try_from(id)
                    .ok()
                    .filter(|id| *id <= i32::MAX as u32)
                    .ok_or_else(|| RegistryError::new(STORE_ERROR, "schema ids are exhausted"))?;
                ops.push(put(state::SCHEMA, id.to_string(), &row, false));
                (id, Arc::new(row))
            }
        };
        let version_row = VersionRow { id, deleted: false };
        ops.push(put(
            state::VERSION,
            state::version_key(subject, version),
            &version_row,
            false,
        ));
        self.commit(ops).await?;
        // What is stored is the answer: a change logged by a write that gave up
        // waiting (or by a node that crashed) may have landed first, and new rows
        // never replace what is there.
        let stored = self.snapshot();
        let held = stored
            .subjects
            .get(subject)
            .and_then(|vs| vs.get(&version))
            .is_some_and(|r| r.id == id)
            && stored
                .schemas
                .get(&id)
                .is_some_and(|s| s.fingerprint == row.fingerprint);
        drop(guard);
        if !held {
            return Err(RegistryError::new(
                UNAVAILABLE,
                format!("version {version} of {subject:?} was taken by a change that landed late; retry"),
            ));
        }
        Ok(view(subject, version, version_row, row))
    }

    /// The version of `subject` holding `new` (soft-deleted ones with `deleted`).
    pub async fn lookup(
        &self,
        subject: &str,
        new: &NewSchema,
        deleted: bool,
    ) -> Result<VersionView> {
        let state = self.fresh().await?;
        let versions = state.versions(subject, deleted);
        if versions.is_empty() {
            return Err(subject_not_found(subject));
        }
        let (_, row) = self.prepare(&state, new)?;
        for (v, r) in versions.into_iter().rev() {
            if let Some(s) = state.schemas.get(&r.id) {
                if s.fingerprint == row.fingerprint {
                    return Ok(view(subject, v, r, s.clone()));
                }
            }
        }
        Err(RegistryError::new(SCHEMA_NOT_FOUND, "Schema not found"))
    }

    /// Subject names (with a version clients see, or any with `deleted`; only
    /// the soft-deleted ones with `deleted_only`), in name order.
    pub async fn subjects(
        &self,
        prefix: &str,
        deleted: bool,
        deleted_only: bool,
    ) -> Result<Vec<String>> {
        let state = self.fresh().await?;
        Ok(state
            .subjects
            .iter()
            .filter(|(s, _)| s.starts_with(prefix))
            .filter(|(_, vs)| {
                let live = vs.values().any(|r| !r.deleted);
                if deleted_only {
                    vs.values().any(|r| r.deleted)
                } else {
                    live || (deleted && !vs.is_empty())
                }
            })
            .map(|(s, _)| s.clone())
            .collect())
    }

    /// The subject's version numbers (40401 when it has none).
    pub async fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<u32>> {
        let state = self.fresh().await?;
        let vs: Vec<u32> = state
            .versions(subject, deleted)
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        if vs.is_empty() {
            return Err(subject_not_found(subject));
        }
        Ok(vs)
    }

    /// One version of a subject.
    pub async fn version(
        &self,
        subject: &str,
        v: VersionRef,
        deleted: bool,
    ) -> Result<VersionView> {
        let state = self.fresh().await?;
        find_version(&state, subject, v, deleted)
    }

    /// Ids of the schemas that reference a version.
    pub async fn referenced_by(&self, subject: &str, v: VersionRef) -> Result<Vec<u32>> {
        let state = self.fresh().await?;
        let found = find_version(&state, subject, v, true)?;
        Ok(state.referenced_by(subject, found.version))
    }

    /// Deletes a subject: soft (its versions stay, hidden), or permanent (after a
    /// soft one); answers the versions deleted.
    pub async fn delete_subject(&self, subject: &str, permanent: bool) -> Result<Vec<u32>> {
        let guard = self.lock().await?;
        let state = &guard.state;
        let all = state.versions(subject, true);
        if all.is_empty() {
            return Err(subject_not_found(subject));
        }
        let live: Vec<(u32, VersionRow)> =
            all.iter().filter(|(_, r)| !r.deleted).copied().collect();
        let mut ops = Vec::new();
        let targets = if permanent {
            if !live.is_empty() {
                return Err(RegistryError::new(
                    SUBJECT_NOT_SOFT_DELETED,
                    format!("Subject '{subject}' was not deleted first before being permanently deleted"),
                ));
            }
            all
        } else {
            if live.is_empty() {
                return Err(RegistryError::new(
                    SUBJECT_SOFT_DELETED,
                    format!("Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"),
                ));
            }
            live
        };
        for (v, _) in &targets {
            unreferenced(state, subject, *v)?;
        }
        for (v, r) in &targets {
            let key = state::version_key(subject, *v);
            if permanent {
                ops.push(Op::RegistryDelete {
                    table: state::VERSION.into(),
                    key,
                });
            } else {
                let row = VersionRow {
                    id: r.id,
                    deleted: true,
                };
                ops.push(put(state::VERSION, key, &row, true));
            }
        }
        if permanent && state.config.contains_key(subject) {
            ops.push(Op::RegistryDelete {
                table: state::CONFIG.into(),
                key: subject.to_string(),
            });
        }
        self.commit(ops).await?;
        drop(guard);
        Ok(targets.into_iter().map(|(v, _)| v).collect())
    }

    /// Deletes one version: soft, or permanent (after a soft one).
    pub async fn delete_version(
        &self,
        subject: &str,
        v: VersionRef,
        permanent: bool,
    ) -> Result<u32> {
        let guard = self.lock().await?;
        let state = &guard.state;
        if state.versions(subject, true).is_empty() {
            return Err(subject_not_found(subject));
        }
        // Soft-deleted versions too: deleting one again says so (40406), and a
        // permanent delete takes only those.
        let found = find_version(state, subject, v, true)?;
        unreferenced(state, subject, found.version)?;
        let key = state::version_key(subject, found.version);
        let op = if permanent {
            if !found.deleted {
                return Err(RegistryError::new(
                    VERSION_NOT_SOFT_DELETED,
                    format!(
                        "Subject '{subject}' Version {} was not deleted first before being permanently deleted",
                        found.version
                    ),
                ));
            }
            Op::RegistryDelete {
                table: state::VERSION.into(),
                key,
            }
        } else {
            if found.deleted {
                return Err(RegistryError::new(
                    VERSION_SOFT_DELETED,
                    format!(
                        "Subject '{subject}' Version {} was soft deleted.Set permanent=true to delete permanently",
                        found.version
                    ),
                ));
            }
            let row = VersionRow {
                id: found.id,
                deleted: true,
            };
            put(state::VERSION, key, &row, true)
        };
        self.commit(vec![op]).await?;
        drop(guard);
        Ok(found.version)
    }

    // ---- schemas by id ------------------------------------------------------

    /// The schema `id`, while a version (soft-deleted ones too) uses it: data
    /// written with it stays decodable until its versions are gone for good.
    pub async fn schema(&self, id: u32) -> Result<Arc<SchemaRow>> {
        let state = self.fresh().await?;
        match state.schemas.get(&id) {
            Some(row) if state.in_use(id) => Ok(row.clone()),
            _ => Err(RegistryError::new(
                SCHEMA_NOT_FOUND,
                format!("Schema {id} not found"),
            )),
        }
    }

    /// (subject, version) pairs using schema `id`.
    pub async fn uses_of(&self, id: u32, deleted: bool) -> Result<Vec<(String, u32)>> {
        let state = self.fresh().await?;
        if !state.schemas.contains_key(&id) || !state.in_use(id) {
            return Err(RegistryError::new(
                SCHEMA_NOT_FOUND,
                format!("Schema {id} not found"),
            ));
        }
        Ok(state.uses_of(id, deleted))
    }

    // ---- compatibility ------------------------------------------------------

    /// Whether `new` could be registered under `subject` (against `version` only,
    /// or against what the subject's level names); the problems found.
    pub async fn test_compatibility(
        &self,
        subject: &str,
        version: Option<VersionRef>,
        new: &NewSchema,
    ) -> Result<Vec<String>> {
        let state = self.fresh().await?;
        let (parsed, _) = self.prepare(&state, new)?;
        let level = state.level(subject);
        let previous = match version {
            Some(v) => {
                if state.versions(subject, false).is_empty() {
                    return Err(subject_not_found(subject));
                }
                let found = find_version(&state, subject, v, false)?;
                let compiled = self
                    .compiled(&state, found.id)
                    .map_err(|e| RegistryError::new(STORE_ERROR, e))?;
                vec![compiled.parsed.clone()]
            }
            None => self.parsed_versions(&state, subject)?,
        };
        Ok(parsed::compatible(level, &parsed, &previous))
    }

    // ---- settings -----------------------------------------------------------

    /// The level of `subject` (or the global one for `None`): the subject's own,
    /// or with `default_to_global` the global one when it has none (40408 else).
    pub async fn config(&self, subject: Option<&str>, default_to_global: bool) -> Result<Level> {
        let state = self.fresh().await?;
        match subject {
            None => Ok(state.config.get("").copied().unwrap_or(Level::Backward)),
            Some(s) => match state.config.get(s) {
                Some(l) => Ok(*l),
                None if default_to_global => {
                    Ok(state.config.get("").copied().unwrap_or(Level::Backward))
                }
                None => Err(RegistryError::new(
                    SUBJECT_LEVEL_CONFIG_NOT_FOUND,
                    format!("Subject '{s}' does not have subject-level compatibility configured"),
                )),
            },
        }
    }

    pub async fn set_config(&self, subject: Option<&str>, level: Level) -> Result<()> {
        if let Some(s) = subject {
            check_subject(s)?;
        }
        let guard = self.lock().await?;
        let key = subject.unwrap_or("").to_string();
        if subject.is_some()
            && !guard.state.config.contains_key(&key)
            && guard.state.config.len() > SUBJECTS_MAX
        {
            return Err(RegistryError::new(
                FULL,
                format!("the registry holds its maximum of {SUBJECTS_MAX} subject settings"),
            ));
        }
        let row = ConfigRow {
            compatibility: level.as_str().to_string(),
        };
        self.commit(vec![put(state::CONFIG, key, &row, true)])
            .await?;
        drop(guard);
        Ok(())
    }

    /// Removes a setting; answers the level it held. The global one falls back
    /// to `BACKWARD`.
    pub async fn delete_config(&self, subject: Option<&str>) -> Result<Level> {
        let guard = self.lock().await?;
        let key = subject.unwrap_or("").to_string();
        let old = match guard.state.config.get(&key) {
            Some(l) => *l,
            None if subject.is_none() => Level::Backward,
            None => {
                return Err(RegistryError::new(
                    SUBJECT_LEVEL_CONFIG_NOT_FOUND,
                    format!("Subject '{key}' does not have subject-level compatibility configured"),
                ))
            }
        };
        self.commit(vec![Op::RegistryDelete {
            table: state::CONFIG.into(),
            key,
        }])
        .await?;
        drop(guard);
        Ok(old)
    }

    // ---- bindings -------------------------------------------------------------

    /// Binds the stream `name` (id `stream_id`) to `subject` (pinned to
    /// `version`, if given), or with `None` unbinds it. The subject must hold a
    /// version; a JSON stream's must be a JSON Schema.
    pub async fn bind(
        &self,
        name: &str,
        stream_id: u64,
        json: bool,
        subject: Option<&str>,
        version: Option<u32>,
    ) -> Result<Option<Binding>> {
        self.bind_as(name, stream_id, json, subject, version, false)
            .await
    }

    /// [`Registry::bind`] for a create: the stream's binding, if it has one, must
    /// already be this one (decided under the lock, so two creates racing with
    /// different subjects cannot both succeed).
    pub async fn bind_on_create(
        &self,
        name: &str,
        stream_id: u64,
        json: bool,
        subject: &str,
        version: Option<u32>,
    ) -> Result<Option<Binding>> {
        self.bind_as(name, stream_id, json, Some(subject), version, true)
            .await
    }

    async fn bind_as(
        &self,
        name: &str,
        stream_id: u64,
        json: bool,
        subject: Option<&str>,
        version: Option<u32>,
        on_create: bool,
    ) -> Result<Option<Binding>> {
        let guard = self.lock().await?;
        let state = &guard.state;
        if on_create {
            if let Some(b) = state
                .bindings
                .get(name)
                .filter(|b| b.stream_id == stream_id)
            {
                if Some(b.subject.as_str()) == subject && b.version == version {
                    return Ok(Some(b.clone()));
                }
                return Err(RegistryError::new(
                    BINDING_CONFLICT,
                    format!(
                        "the stream exists, bound to subject {:?}; change its binding with POST /__picomq/streams/{{name}}/schema",
                        b.subject
                    ),
                ));
            }
        }
        let Some(subject) = subject else {
            if state.bindings.contains_key(name) {
                self.commit(vec![Op::RegistryDelete {
                    table: state::BINDING.into(),
                    key: name.to_string(),
                }])
                .await?;
            }
            return Ok(None);
        };
        check_subject(subject)?;
        let target = match version {
            Some(v) => find_version(state, subject, VersionRef::Number(v), false)?,
            None => find_version(state, subject, VersionRef::Latest, false)?,
        };
        if json && target.schema.schema_type() != SchemaType::Json {
            return Err(RegistryError::new(
                INVALID_SCHEMA,
                format!(
                    "the stream holds JSON messages, checked against a JSON Schema; subject {subject:?} holds {}",
                    target.schema.kind
                ),
            ));
        }
        if !state.bindings.contains_key(name) && state.bindings.len() >= SUBJECTS_MAX * 10 {
            return Err(RegistryError::new(
                FULL,
                "the registry holds its maximum of 100000 stream bindings",
            ));
        }
        let binding = Binding {
            stream_id,
            subject: subject.to_string(),
            version,
        };
        self.commit(vec![put(state::BINDING, name.to_string(), &binding, true)])
            .await?;
        drop(guard);
        Ok(Some(binding))
    }

    /// The binding of the stream `name` with id `stream_id`, if any.
    pub fn binding(&self, name: &str, stream_id: u64) -> Option<Binding> {
        self.snapshot()
            .bindings
            .get(name)
            .filter(|b| b.stream_id == stream_id)
            .cloned()
    }
}

struct WriteGuard<'a> {
    _local: tokio::sync::MutexGuard<'a, ()>,
    _store: Box<dyn std::any::Any + Send>,
    state: Arc<State>,
}

/// Refuses (42206) to delete a version other schemas reference.
fn unreferenced(state: &State, subject: &str, version: u32) -> Result<()> {
    let by = state.referenced_by(subject, version);
    if by.is_empty() {
        return Ok(());
    }
    Err(RegistryError::new(
        REFERENCE_EXISTS,
        format!("One or more references exist to the schema {{subject={subject},version={version}}}: ids {by:?}"),
    ))
}

fn view(subject: &str, version: u32, r: VersionRow, schema: Arc<SchemaRow>) -> VersionView {
    VersionView {
        subject: subject.to_string(),
        version,
        id: r.id,
        deleted: r.deleted,
        schema,
    }
}

fn put<T: serde::Serialize>(table: &str, key: String, value: &T, replace: bool) -> Op {
    Op::RegistryPut {
        table: table.to_string(),
        key,
        value: serde_json::to_string(value).expect("registry rows serialise"),
        replace,
    }
}

/// A version of a subject: `latest` is the newest one clients see (or the
/// newest of all with `deleted`).
pub(crate) fn find_version(
    state: &State,
    subject: &str,
    v: VersionRef,
    deleted: bool,
) -> Result<VersionView> {
    if state.versions(subject, deleted).is_empty() {
        return Err(subject_not_found(subject));
    }
    let found = match v {
        VersionRef::Latest => state.latest(subject, deleted),
        VersionRef::Number(n) => state
            .subjects
            .get(subject)
            .and_then(|vs| vs.get(&n))
            .filter(|r| deleted || !r.deleted)
            .map(|r| (n, *r)),
    };
    let (version, row) = found.ok_or_else(|| version_not_found(subject, v))?;
    let schema =
        state.schemas.get(&row.id).cloned().ok_or_else(|| {
            RegistryError::new(STORE_ERROR, format!("schema {} is missing", row.id))
        })?;
    Ok(view(subject, version, row, schema))
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.snapshot();
        f.debug_struct("Registry")
            .field("schemas", &state.schemas.len())
            .field("subjects", &state.subjects.len())
            .field("generation", &state.generation)
            .finish()
    }
}
