//! The metadata store: the stream registry, the object index, producer state,
//! tokens and server keys, and the WAL watermark, behind one trait.
//!
//! Every row is derived from the WAL: one indexer applies durable objects in log
//! order (`apply`), idempotently. With SQLite (`sqlite`, the embedded default) the
//! database is a local index, rebuilt from the bucket when lost and checkpointed
//! into it ([`LocalIndex`]). With Postgres (`postgres`, the foundation of clusters)
//! it is the metadata of record, without a local index. `rows` holds what both
//! write for a batch, so they cannot drift apart. Reads come from the stream
//! service when it loads a dormant stream or serves data that left the tail cache,
//! and from the background passes.
//!
//! The rows here are the engine's: the HTTP edge sees stream infos and token
//! records, never these.

pub mod postgres;
mod rows;
pub mod sqlite;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::wal::format::{ForkOrigin, ProducerStamp};
use crate::wal::FlushedObject;

pub use crate::identity::MetaIdentity;
pub use crate::wal::format::TokenRecord;
pub use postgres::PostgresMeta;
pub use sqlite::{SqliteMeta, SCHEMA_VERSION};

/// A stream's row: its configuration and its state as of the last indexed op.
#[derive(Clone, Debug)]
pub struct StreamRow {
    pub id: u64,
    pub name: String,
    pub content_type: String,
    pub created_ms: u64,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub fork: Option<ForkOrigin>,
    pub tail: Offset,
    pub closed: bool,
    pub closed_by: Option<ProducerStamp>,
    pub stream_seq: Option<String>,
    pub soft_deleted: bool,
    pub last_access_ms: u64,
    /// First retained offset: data below it was trimmed (reads there answer 410).
    pub start: Offset,
    /// Age retention in seconds; `None`: keep everything.
    pub retention_secs: Option<u64>,
    /// The sequence number the next record gets.
    pub next_seq: u64,
}

/// One index row: where a stream's records `[start, end)` are stored.
#[derive(Clone, Debug)]
pub struct ChunkRow {
    pub start: Offset,
    pub end: Offset,
    pub object_key: String,
    pub byte_range: std::ops::Range<u64>,
    /// Sequence number of the row's first record.
    pub start_seq: u64,
    /// Server timestamp of the row's last record.
    pub last_ts_ms: u64,
}

/// An index row with its stream (compaction reads rows of many streams at once).
#[derive(Clone, Debug)]
pub struct IndexRow {
    pub stream_id: u64,
    pub chunk: ChunkRow,
}

/// The last WAL object whose effects are in the database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Watermark {
    pub epoch: u64,
    /// Next object sequence expected in `epoch`.
    pub next_seq: u64,
}

/// What the engine asks of a metadata store.
#[async_trait]
pub trait MetaStore: Send + Sync + 'static {
    // ---- the log ----------------------------------------------------------------

    /// Applies durable WAL objects, in log order, in one transaction; idempotent.
    async fn apply(&self, objects: &[FlushedObject]) -> Result<()>;
    /// The last object applied.
    async fn watermark(&self) -> Result<Option<Watermark>>;
    /// The highest epoch this node's data directory wrote under (0: none).
    async fn node_epoch(&self) -> Result<u64>;
    async fn set_node_epoch(&self, epoch: u64) -> Result<()>;
    /// The id the next new stream gets.
    async fn next_stream_id(&self) -> Result<u64>;

    // ---- streams ----------------------------------------------------------------

    async fn stream_by_name(&self, name: &str) -> Result<Option<StreamRow>>;
    async fn stream_by_id(&self, id: u64) -> Result<Option<StreamRow>>;
    /// Every stream name (deleted ones included, while their rows remain), read in
    /// pages of `page` rows; `each` is called once per name. Returns the count.
    async fn for_each_name(
        &self,
        page: u32,
        each: &mut (dyn for<'n> FnMut(&'n str) + Send),
    ) -> Result<u64>;
    /// Each producer's `(epoch, last seq)` on `stream_id`.
    async fn producers(&self, stream_id: u64) -> Result<HashMap<String, (u64, u64)>>;
    /// Streams (in any state) that fork from `stream_id`.
    async fn fork_count(&self, stream_id: u64) -> Result<u64>;
    /// Records `(stream id, last access ms)` of streams leaving memory.
    async fn touch(&self, updates: &[(u64, u64)]) -> Result<()>;
    /// Streams that exist for clients (not deleted, not soft-deleted).
    async fn stream_count(&self) -> Result<u64>;
    /// Live streams after `after` whose names start with `prefix`, in name order.
    async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Vec<StreamRow>>;
    /// Live streams whose names start with `prefix`, counting no further than `limit`.
    async fn count_streams_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64>;
    /// Names after `after` of up to `limit` live streams whose TTL (from their last
    /// recorded access) or Expires-At has passed at `now_ms`; the caller re-checks.
    async fn expired_candidates(&self, now_ms: u64, after: &str, limit: u32)
        -> Result<Vec<String>>;
    /// Streams with an age retention after `after`: name, start, and where the
    /// prefix older than the retention at `now_ms` ends (`None`: nothing expired).
    async fn retention_candidates(
        &self,
        now_ms: u64,
        after: &str,
        limit: u32,
    ) -> Result<Vec<(String, Offset, Option<Offset>)>>;

    // ---- the object index -------------------------------------------------------

    /// Index rows of `stream_id` holding data at or after `from`, in offset order.
    async fn chunks_from(&self, stream_id: u64, from: Offset, limit: u32) -> Result<Vec<ChunkRow>>;
    /// Index rows in WAL objects whose keys sort below `below`, oldest object first,
    /// each smaller than `smaller_than` bytes.
    async fn rows_in_wal_below(
        &self,
        below: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>>;
    /// Index rows of fewer than `smaller_than` bytes in the WAL objects whose keys
    /// start with `log` (one log's: `layout::wal_epoch_prefix` and a slash; every
    /// log's: `wal/`), the newest object first, each object's rows together in
    /// stream order; at most `limit`: the newest data still only in the WAL.
    async fn wal_rows_newest_first(
        &self,
        log: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>>;
    /// Index rows in the objects `keys`, grouped by object.
    async fn rows_in_objects(&self, keys: &[String]) -> Result<Vec<IndexRow>>;
    /// Bytes the index points at, per object whose key starts with `prefix`.
    async fn live_bytes_under(&self, prefix: &str) -> Result<HashMap<String, u64>>;
    /// Whether any index row points into the object at `key`.
    async fn object_referenced(&self, key: &str) -> Result<bool>;

    // ---- tokens and keys ----------------------------------------------------------

    /// Every token, revoked ones included.
    async fn tokens(&self) -> Result<Vec<TokenRecord>>;
    async fn server_key(&self, name: &str) -> Result<Option<Vec<u8>>>;

    // ---- schema registry ----------------------------------------------------------

    /// Every registry row, as (table, key, value), ordered by table and key.
    async fn registry_rows(&self) -> Result<Vec<(String, String, String)>>;
    /// How many registry changes were applied: a copy loaded at another count is
    /// stale.
    async fn registry_generation(&self) -> Result<u64>;
    /// Takes the lock registry writes hold, across every node sharing this store;
    /// held until the guard is dropped. An embedded store has one writer, its
    /// node, which holds its own lock: the guard is empty.
    async fn registry_lock(&self) -> Result<Box<dyn std::any::Any + Send>>;
    /// A schema id nobody drew before, at least `at_least` (the largest known id
    /// plus one). Under the registry lock.
    async fn registry_draw_id(&self, at_least: u64) -> Result<u64>;

    // ---- identity ---------------------------------------------------------------

    /// This database's id and the cluster and store it is bound to (see `identity`).
    async fn identity(&self) -> Result<MetaIdentity>;
    /// Binds a database not yet bound to `cluster_id` at `store`; returns the
    /// identity after (bound to whichever binding came first).
    async fn bind(&self, cluster_id: &str, store: &str) -> Result<MetaIdentity>;
    /// Binds the database to `cluster_id` at `store` whatever it was bound to (a
    /// deliberate move: `identity::rebind`).
    async fn rebind(&self, cluster_id: &str, store: &str) -> Result<()>;

    /// The local index of an embedded store, which can be checkpointed and rebuilt;
    /// `None` for a store that is the metadata of record.
    fn local_index(&self) -> Option<&dyn LocalIndex>;

    /// The coordination of a cluster, for a store that is shared by its nodes.
    fn coordinator(&self) -> Option<Arc<dyn crate::cluster::Coordinator>> {
        None
    }

    /// The same store as seen by the cluster member `epoch`: every batch it
    /// applies is refused ([`EngineError::Fenced`]) unless the member still runs
    /// or is the one sealing the log the batch belongs to. `None` outside clusters.
    fn as_member(&self, _epoch: u64) -> Option<Arc<dyn MetaStore>> {
        None
    }
}

/// A metadata database that is a local, rebuildable index of the bucket.
#[async_trait]
pub trait LocalIndex: Send + Sync {
    /// Whether no table holds a row (a new database, or a lost data directory).
    async fn is_empty(&self) -> Result<bool>;
    /// Writes a consistent copy of the database to `path` (which must not exist);
    /// returns the watermark that copy reflects.
    async fn snapshot_into(&self, path: &std::path::Path) -> Result<Option<Watermark>>;
    /// Replaces every row with those of the snapshot at `path` (migrated first).
    async fn restore_from(&self, path: &std::path::Path) -> Result<Option<Watermark>>;
    /// Writes not derived from the WAL so far (access times).
    fn local_writes(&self) -> u64;
}

/// Whether `url` names a metadata store shared by the nodes of a cluster
/// (Postgres), rather than one node's own (SQLite).
pub fn is_shared_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The node's metadata store.
#[derive(Clone)]
pub struct Meta(Arc<dyn MetaStore>);

impl Meta {
    /// Opens the store a URL names: `sqlite://path`, `sqlite::memory:`, or
    /// `postgres://user:password@host:port/database` (also `postgresql://`).
    pub async fn open(url: &str) -> Result<Meta> {
        if url.starts_with("sqlite:") {
            return Ok(Meta(Arc::new(SqliteMeta::open(url).await?)));
        }
        if postgres::is_postgres_url(url) {
            return Ok(Meta(Arc::new(PostgresMeta::open(url).await?)));
        }
        Err(EngineError::bad_request(format!(
            "metadata URL {:?}: unsupported (supported: sqlite://path, sqlite::memory:, postgres://...)",
            redacted_url(url)
        )))
    }

    pub fn from_store(store: Arc<dyn MetaStore>) -> Meta {
        Meta(store)
    }

    /// See [`MetaStore::as_member`]; `self` where the store has no members.
    pub fn for_member(&self, epoch: u64) -> Meta {
        self.0.as_member(epoch).map_or_else(|| self.clone(), Meta)
    }
}

/// `url` fit for logs and errors: without the password of its user part or of a
/// `password=` parameter. A URL that does not parse keeps only its scheme.
pub fn redacted_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        return format!("{scheme}:<unparsable URL>");
    };
    let in_query = parsed.query_pairs().any(|(k, _)| k == "password");
    if parsed.password().is_none() && !in_query {
        return url.to_string();
    }
    // Fails only for URLs that cannot have a user part, which have no password.
    let _ = parsed.set_password(None);
    let kept: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| k != "password")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    parsed.to_string()
}

impl std::ops::Deref for Meta {
    type Target = dyn MetaStore;
    fn deref(&self) -> &(dyn MetaStore + 'static) {
        &*self.0
    }
}
