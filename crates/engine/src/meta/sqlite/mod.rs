//! The metadata store in SQLite: the embedded default of one node. Every row is
//! derived from WAL objects, written by one indexer in log order (`apply`), so the
//! database is a local index that can be rebuilt from the bucket alone; it is
//! checkpointed into the bucket (`background::checkpoint`) so a rebuild replays only
//! the WAL written since. Tokens and server keys are rows like any other.

mod apply;
mod tokens;

#[cfg(test)]
use apply::INSERT_GROUPS;
use apply::{by_id_update_sql, groups, TOUCH_GROUP};

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use super::rows::decode_stamp;
use super::{
    ChunkRow, IndexRow, LocalIndex, MetaIdentity, MetaStore, StreamRow, TokenRecord, Watermark,
};
use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::wal::format::ForkOrigin;
use crate::wal::FlushedObject;

/// `SELECT` of every stream column (in `stream_row` order) followed by `$tail`.
macro_rules! stream_select {
    ($tail:literal) => {
        concat!(
            "SELECT id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, ",
            "fork_requested, fork_sub_offset, tail, closed, closed_by, stream_seq, soft_deleted, last_access_ms, ",
            "start_pos, retention_secs, next_seq, fork_point_seq ",
            "FROM streams ",
            $tail
        )
    };
}

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../../migrations/sqlite/0001_init.sql")),
    (
        2,
        include_str!("../../../migrations/sqlite/0002_chunks_by_object.sql"),
    ),
    (3, include_str!("../../../migrations/sqlite/0003_auth.sql")),
    (
        4,
        include_str!("../../../migrations/sqlite/0004_retention.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/sqlite/0005_drop_chunks_by_age.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/sqlite/0006_sequence_numbers.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/sqlite/0007_identity.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/sqlite/0008_registry.sql"),
    ),
];
/// [`Meta::retention_candidates`]: `?1` now (ms), `?2` the name to start after, `?3`
/// how many. MATERIALIZED: `kept` is computed once per stream, not per row it bounds.
const RETENTION_CANDIDATES_SQL: &str = "WITH candidates AS MATERIALIZED (
     SELECT s.id, s.name, s.start_pos,
         (SELECT k.start_pos FROM chunks k
             WHERE k.stream_id = s.id AND k.last_ts_ms >= ?1 - s.retention_secs * 1000
             ORDER BY k.start_pos LIMIT 1) AS kept
     FROM streams s
     WHERE s.retention_secs IS NOT NULL AND s.soft_deleted = 0 AND s.name > ?2
     ORDER BY s.name LIMIT ?3)
 SELECT name, start_pos, (SELECT c.end_pos FROM chunks c
     WHERE c.stream_id = id AND c.start_pos < COALESCE(kept, 9223372036854775807)
     ORDER BY c.start_pos DESC LIMIT 1)
 FROM candidates ORDER BY name";

/// The schema version this binary writes: the last migration.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

#[derive(Clone)]
pub struct SqliteMeta {
    pool: SqlitePool,
    /// Writes not derived from the WAL (access times): the checkpoint pass compares
    /// it to decide whether a checkpoint is due even when the watermark has not moved.
    local_writes: Arc<AtomicU64>,
}

impl SqliteMeta {
    /// Opens (creating if needed) the database at `url` (`sqlite://path` or `sqlite::memory:`).
    pub async fn open(url: &str) -> Result<SqliteMeta> {
        if !url.starts_with("sqlite:") {
            return Err(EngineError::bad_request(format!(
                "metadata URL {url:?}: unsupported (supported: sqlite://path)"
            )));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| EngineError::bad_request(format!("metadata URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // The database is rebuilt from the bucket after a crash, so it needs no fsync.
            .synchronous(SqliteSynchronous::Normal)
            // Statement journals (a multi-row statement inside a transaction, as
            // the indexer's are) in memory, not spilled to a file past 64 KiB.
            .pragma("temp_store", "memory")
            .busy_timeout(Duration::from_secs(10));
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .connect_with(options)
            .await?;
        let meta = SqliteMeta {
            pool,
            local_writes: Arc::default(),
        };
        meta.migrate().await?;
        Ok(meta)
    }

    /// The pool, for a move of its rows into a cluster's database (`into_cluster`).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn migrate(&self) -> Result<()> {
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            .execute(&self.pool)
            .await?;
        let current: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        if current > SCHEMA_VERSION {
            return Err(EngineError::Internal(format!(
                "metadata schema version {current} is newer than this binary's ({SCHEMA_VERSION}): upgrade PicoMQ"
            )));
        }
        for (version, sql) in MIGRATIONS {
            if *version > current {
                let mut tx = self.pool.begin().await?;
                sqlx::raw_sql(*sql).execute(&mut *tx).await?;
                sqlx::query("INSERT INTO schema_version (version) VALUES (?)")
                    .bind(version)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    async fn state_value(&self, key: &str) -> Result<Option<u64>> {
        let row = sqlx::query("SELECT value FROM engine_state WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<i64, _>(0) as u64))
    }

    pub async fn set_state_value(&self, key: &str, value: u64) -> Result<()> {
        sqlx::query("INSERT INTO engine_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value as i64)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The tables holding state derived from the bucket (everything but the schema
    /// version and the database's identity, which a restore keeps: it was checked
    /// against the bucket before the restore began).
    async fn tables(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT IN ('schema_version', 'identity')",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Opens a database file on its own (one connection), migrating it unless
    /// `read_only`.
    async fn open_file(path: &std::path::Path, read_only: bool) -> Result<SqliteMeta> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(read_only)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        let meta = SqliteMeta {
            pool,
            local_writes: Arc::default(),
        };
        if !read_only {
            meta.migrate().await?;
        }
        Ok(meta)
    }

    /// Records a write not derived from the WAL.
    fn wrote_locally(&self) {
        self.local_writes.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl MetaStore for SqliteMeta {
    async fn watermark(&self) -> Result<Option<Watermark>> {
        let epoch = self.state_value("applied_epoch").await?;
        let next_seq = self.state_value("applied_next_seq").await?;
        Ok(epoch.map(|epoch| Watermark {
            epoch,
            next_seq: next_seq.unwrap_or(0),
        }))
    }

    async fn next_stream_id(&self) -> Result<u64> {
        Ok(self.state_value("next_stream_id").await?.unwrap_or(1))
    }

    async fn node_epoch(&self) -> Result<u64> {
        Ok(self.state_value("node_epoch").await?.unwrap_or(0))
    }

    async fn apply(&self, objects: &[FlushedObject]) -> Result<()> {
        apply::apply(&self.pool, objects).await
    }

    /// Names after `after` (in name order) of up to `limit` live streams whose TTL
    /// (counted from their last recorded access) or Expires-At has passed at `now_ms`.
    /// Access times of active streams are recorded when they go dormant, so the caller
    /// re-checks each one, and pages on with `after` so active streams cannot starve
    /// the rest.
    async fn expired_candidates(
        &self,
        now_ms: u64,
        after: &str,
        limit: u32,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT name FROM streams WHERE soft_deleted = 0 AND name > ?2 AND (
                (ttl_secs IS NOT NULL AND last_access_ms + ttl_secs * 1000 < ?1)
                OR (expires_at IS NOT NULL AND (julianday(expires_at) - 2440587.5) * 86400000.0 < ?1)
             ) ORDER BY name LIMIT ?3",
        )
        .bind(now_ms as i64)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Index rows in WAL objects whose keys sort below `below` (older objects),
    /// oldest object first: what compaction rewrites next.
    async fn rows_in_wal_below(
        &self,
        below: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>> {
        let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE object_key >= 'wal/' AND object_key < ? AND byte_end - byte_start < ? ORDER BY object_key, stream_id, start_pos LIMIT ?")
            .bind(below)
            .bind(smaller_than.min(i64::MAX as u64) as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| IndexRow {
                stream_id: r.get::<i64, _>(0) as u64,
                chunk: chunk_row(r, 1),
            })
            .collect())
    }

    async fn wal_rows_newest_first(
        &self,
        log: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>> {
        let end = format!("{log}\u{10ffff}");
        let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE object_key >= ? AND object_key < ? AND byte_end - byte_start < ? ORDER BY object_key DESC, stream_id, start_pos LIMIT ?")
            .bind(log)
            .bind(end)
            .bind(smaller_than.min(i64::MAX as u64) as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| IndexRow {
                stream_id: r.get::<i64, _>(0) as u64,
                chunk: chunk_row(r, 1),
            })
            .collect())
    }

    /// Streams with an age retention after `after` (name order), at most `limit`:
    /// each one's name, current start, and where its expired prefix ends at `now_ms`
    /// (`None`: nothing expired). The prefix is the rows before the first one whose
    /// last record is within the retention: timestamps grow along a stream, so both
    /// lookups walk the primary key from the stream's first row and stop, reading the
    /// expired rows and one more. Were a clock to step back, a newer row out of order
    /// would end the prefix early: data is kept longer, never trimmed early.
    async fn retention_candidates(
        &self,
        now_ms: u64,
        after: &str,
        limit: u32,
    ) -> Result<Vec<(String, Offset, Option<Offset>)>> {
        let rows = sqlx::query(RETENTION_CANDIDATES_SQL)
            .bind(now_ms as i64)
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Offset(r.get::<i64, _>(1) as u64),
                    r.get::<Option<i64>, _>(2).map(|v| Offset(v as u64)),
                )
            })
            .collect())
    }

    /// Index rows in the objects `keys` (at most a few hundred), grouped by
    /// object.
    async fn rows_in_objects(&self, keys: &[String]) -> Result<Vec<IndexRow>> {
        let mut out = Vec::new();
        for key in keys {
            let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE object_key = ? ORDER BY stream_id, start_pos")
                .bind(key)
                .fetch_all(&self.pool)
                .await?;
            out.extend(rows.iter().map(|r| IndexRow {
                stream_id: r.get::<i64, _>(0) as u64,
                chunk: chunk_row(r, 1),
            }));
        }
        Ok(out)
    }

    /// Bytes the index points at, per object whose key starts with `prefix`.
    async fn live_bytes_under(&self, prefix: &str) -> Result<HashMap<String, u64>> {
        let end = format!("{prefix}\u{10ffff}");
        let rows = sqlx::query("SELECT object_key, SUM(byte_end - byte_start) FROM chunks WHERE object_key >= ? AND object_key < ? GROUP BY object_key")
            .bind(prefix)
            .bind(end)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
            .collect())
    }

    /// Whether any index row points into the object at `key`.
    async fn object_referenced(&self, key: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    async fn stream_by_name(&self, name: &str) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE name = ?"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    /// Every stream name (deleted ones included, while their rows remain), read in
    /// pages of `page` rows by primary key; `each` is called once per name.
    async fn for_each_name(
        &self,
        page: u32,
        each: &mut (dyn for<'n> FnMut(&'n str) + Send),
    ) -> Result<u64> {
        let (mut after, mut n) = (0_i64, 0_u64);
        loop {
            let rows = sqlx::query("SELECT id, name FROM streams WHERE id > ? ORDER BY id LIMIT ?")
                .bind(after)
                .bind(page as i64)
                .fetch_all(&self.pool)
                .await?;
            for r in &rows {
                each(r.get::<&str, _>(1));
            }
            n += rows.len() as u64;
            match rows.last() {
                Some(last) if rows.len() == page as usize => after = last.get(0),
                _ => return Ok(n),
            }
        }
    }

    async fn stream_by_id(&self, id: u64) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE id = ?"))
            .bind(id as i64)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    async fn producers(&self, stream_id: u64) -> Result<HashMap<String, (u64, u64)>> {
        let rows =
            sqlx::query("SELECT producer_id, epoch, last_seq FROM producers WHERE stream_id = ?")
                .bind(stream_id as i64)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<String, _>(0),
                    (r.get::<i64, _>(1) as u64, r.get::<i64, _>(2) as u64),
                )
            })
            .collect())
    }

    /// Streams (in any state) that fork from `stream_id`.
    async fn fork_count(&self, stream_id: u64) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE fork_source = ?")
            .bind(stream_id as i64)
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// Index rows of `stream_id` holding data at or after `from`, in offset order.
    async fn chunks_from(&self, stream_id: u64, from: Offset, limit: u32) -> Result<Vec<ChunkRow>> {
        let rows = sqlx::query("SELECT start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE stream_id = ? AND end_pos > ? ORDER BY start_pos LIMIT ?")
            .bind(stream_id as i64)
            .bind(from.0 as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| chunk_row(r, 0)).collect())
    }

    async fn touch(&self, updates: &[(u64, u64)]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.wrote_locally();
        // Short transactions of `TOUCH_GROUP` updates, not one for the whole batch: a
        // sweep can touch 100,000 streams at once, and holding the write lock that
        // long stalls the indexer, then the WAL behind it, then appends (seen as 10 s
        // append timeouts while a million streams went dormant).
        let mut latest: HashMap<u64, u64> = HashMap::with_capacity(updates.len());
        for &(id, ms) in updates {
            let e = latest.entry(id).or_insert(ms);
            *e = (*e).max(ms);
        }
        let latest: Vec<(u64, u64)> = latest.into_iter().collect();
        for group in latest.chunks(TOUCH_GROUP) {
            let mut tx = self.pool.begin().await?;
            let mut rest = group;
            for n in groups(rest.len()) {
                let (these, tail) = rest.split_at(n);
                rest = tail;
                let mut q = sqlx::query(sqlx::AssertSqlSafe(by_id_update_sql(
                    &["ms"],
                    &[("last_access_ms", "MAX(last_access_ms, {ms})")],
                    n,
                )));
                for (id, ms) in these {
                    q = q.bind(*id as i64).bind(*ms as i64);
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    /// Streams that exist for clients (not deleted, not soft-deleted).
    async fn stream_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE soft_deleted = 0")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// Names of live streams after `after` that start with `prefix`, in name order.
    async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Vec<StreamRow>> {
        let rows = sqlx::query(stream_select!(
            "WHERE soft_deleted = 0 AND name > ? AND substr(name, 1, ?) = ? ORDER BY name LIMIT ?"
        ))
        .bind(after)
        // substr counts characters of TEXT, not bytes.
        .bind(prefix.chars().count() as i64)
        .bind(prefix)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(stream_row).collect())
    }

    async fn set_node_epoch(&self, epoch: u64) -> Result<()> {
        self.set_state_value("node_epoch", epoch).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        tokens::all(&self.pool).await
    }

    async fn server_key(&self, name: &str) -> Result<Option<Vec<u8>>> {
        tokens::server_key(&self.pool, name).await
    }

    async fn registry_rows(&self) -> Result<Vec<(String, String, String)>> {
        tokens::registry_rows(&self.pool).await
    }

    async fn registry_generation(&self) -> Result<u64> {
        tokens::registry_generation(&self.pool).await
    }

    async fn registry_lock(&self) -> Result<Box<dyn std::any::Any + Send>> {
        Ok(Box::new(()))
    }

    /// One node writes this store, and it replays its log before it serves: the
    /// largest id applied plus one was never drawn.
    async fn registry_draw_id(&self, at_least: u64) -> Result<u64> {
        Ok(at_least)
    }

    async fn count_streams_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64> {
        tokens::count_streams_with_prefix(&self.pool, prefix, limit).await
    }

    async fn identity(&self) -> Result<MetaIdentity> {
        let r = sqlx::query("SELECT meta_id, cluster_id, store FROM identity WHERE one = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok(MetaIdentity {
            kind: "sqlite",
            meta_id: r.get(0),
            cluster_id: r.get(1),
            store: r.get(2),
        })
    }

    async fn bind(&self, cluster_id: &str, store: &str) -> Result<MetaIdentity> {
        sqlx::query("UPDATE identity SET cluster_id = ?, store = ?, bound_unix_ms = ? WHERE one = 1 AND cluster_id IS NULL")
            .bind(cluster_id)
            .bind(store)
            .bind(crate::clock::Clock::system().now_ms() as i64)
            .execute(&self.pool)
            .await?;
        self.identity().await
    }

    async fn rebind(&self, cluster_id: &str, store: &str) -> Result<()> {
        sqlx::query(
            "UPDATE identity SET cluster_id = ?, store = ?, bound_unix_ms = ? WHERE one = 1",
        )
        .bind(cluster_id)
        .bind(store)
        .bind(crate::clock::Clock::system().now_ms() as i64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    fn local_index(&self) -> Option<&dyn LocalIndex> {
        Some(self)
    }
}

#[async_trait]
impl LocalIndex for SqliteMeta {
    /// Writes a consistent copy of the whole database to `path` (which must not
    /// exist) and returns the watermark that copy reflects.
    async fn snapshot_into(&self, path: &std::path::Path) -> Result<Option<Watermark>> {
        let target = path
            .to_str()
            .ok_or_else(|| EngineError::Internal(format!("snapshot path {path:?} is not UTF-8")))?;
        // One read transaction: the copy is a single point in the index's history.
        sqlx::query("VACUUM INTO ?")
            .bind(target)
            .execute(&self.pool)
            .await?;
        let copy = SqliteMeta::open_file(path, true).await?;
        let watermark = copy.watermark().await;
        copy.pool.close().await;
        watermark
    }

    /// Whether no table holds a row (a new database, or a lost data directory).
    async fn is_empty(&self) -> Result<bool> {
        for table in self.tables().await? {
            // Names come from sqlite_master of our own schema, not from input.
            let sql = format!("SELECT EXISTS (SELECT 1 FROM main.\"{table}\")");
            let any: i64 = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_one(&self.pool)
                .await?
                .get(0);
            if any != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Replaces every row of this database with the rows of the database file at
    /// `path` (a snapshot from [`Meta::snapshot_into`], possibly of an older schema,
    /// which is migrated first). One transaction: on failure nothing changes.
    async fn restore_from(&self, path: &std::path::Path) -> Result<Option<Watermark>> {
        let source = SqliteMeta::open_file(path, false).await?;
        source.pool.close().await;
        let path = path
            .to_str()
            .ok_or_else(|| EngineError::Internal(format!("snapshot path {path:?} is not UTF-8")))?;
        // Before taking a connection: an in-memory database has only one.
        let tables = self.tables().await?;
        let mut conn = self.pool.acquire().await?;
        sqlx::query("ATTACH DATABASE ? AS snapshot")
            .bind(path)
            .execute(&mut *conn)
            .await?;
        let copied = async {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            for table in &tables {
                // Names come from sqlite_master of our own schema, not from input.
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM main.\"{table}\"")))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO main.\"{table}\" SELECT * FROM snapshot.\"{table}\""
                )))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok::<_, EngineError>(())
        }
        .await;
        let detached = sqlx::query("DETACH DATABASE snapshot")
            .execute(&mut *conn)
            .await;
        copied?;
        detached?;
        drop(conn);
        self.watermark().await
    }

    /// Writes not derived from the WAL so far (see `local_writes`).
    fn local_writes(&self) -> u64 {
        self.local_writes.load(Ordering::Relaxed)
    }
}

/// The `ChunkRow` in columns `first..first + 7` (start, end, key, byte start, byte
/// end, first sequence number, last timestamp).
fn chunk_row(r: &sqlx::sqlite::SqliteRow, first: usize) -> ChunkRow {
    ChunkRow {
        start: Offset(r.get::<i64, _>(first) as u64),
        end: Offset(r.get::<i64, _>(first + 1) as u64),
        object_key: r.get(first + 2),
        byte_range: r.get::<i64, _>(first + 3) as u64..r.get::<i64, _>(first + 4) as u64,
        start_seq: r.get::<i64, _>(first + 5) as u64,
        last_ts_ms: r.get::<i64, _>(first + 6) as u64,
    }
}

fn stream_row(r: &sqlx::sqlite::SqliteRow) -> StreamRow {
    let fork_source: Option<i64> = r.get(6);
    StreamRow {
        id: r.get::<i64, _>(0) as u64,
        name: r.get(1),
        content_type: r.get(2),
        created_ms: r.get::<i64, _>(3) as u64,
        ttl_secs: r.get::<Option<i64>, _>(4).map(|v| v as u64),
        expires_at: r.get(5),
        fork: fork_source.map(|source| ForkOrigin {
            source_id: source as u64,
            point: Offset(r.get::<Option<i64>, _>(7).unwrap_or(0) as u64),
            requested_offset: r.get::<Option<i64>, _>(8).map(|v| Offset(v as u64)),
            sub_offset: r.get::<i64, _>(9) as u64,
            point_seq: r.get::<i64, _>(19) as u64,
        }),
        tail: Offset(r.get::<i64, _>(10) as u64),
        closed: r.get::<i64, _>(11) != 0,
        closed_by: r
            .get::<Option<String>, _>(12)
            .and_then(|s| decode_stamp(&s)),
        stream_seq: r.get(13),
        soft_deleted: r.get::<i64, _>(14) != 0,
        last_access_ms: r.get::<i64, _>(15) as u64,
        start: Offset(r.get::<i64, _>(16) as u64),
        retention_secs: r.get::<Option<i64>, _>(17).map(|v| v as u64),
        next_seq: r.get::<i64, _>(18) as u64,
    }
}
