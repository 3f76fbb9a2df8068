//! The metadata store: stream registry rows, the object index, producer state and the
//! WAL watermark, in SQLite (embedded default). Every row is derived from WAL objects,
//! written by one indexer in log order (`apply`), so the database can be rebuilt from
//! the bucket alone. Reads come from the stream service when it loads a dormant
//! stream or serves data that left the tail cache.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::wal::format::{AppendOp, ForkOrigin, Op, ProducerStamp, RelocateOp};
use crate::wal::FlushedObject;

mod tokens;
pub use tokens::TokenRow;

/// `SELECT` of every stream column (in `stream_row` order) followed by `$tail`.
macro_rules! stream_select {
    ($tail:literal) => {
        concat!(
            "SELECT id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, ",
            "fork_requested, fork_sub_offset, tail, closed, closed_by, stream_seq, soft_deleted, last_access_ms, ",
            "start_pos, retention_secs ",
            "FROM streams ",
            $tail
        )
    };
}

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_init.sql")),
    (
        2,
        include_str!("../../migrations/sqlite/0002_chunks_by_object.sql"),
    ),
    (3, include_str!("../../migrations/sqlite/0003_auth.sql")),
    (
        4,
        include_str!("../../migrations/sqlite/0004_retention.sql"),
    ),
    (
        5,
        include_str!("../../migrations/sqlite/0005_drop_chunks_by_age.sql"),
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
}

#[derive(Clone, Debug)]
pub struct ChunkRow {
    pub start: Offset,
    pub end: Offset,
    pub object_key: String,
    pub byte_range: std::ops::Range<u64>,
}

/// An index row with its stream (compaction reads rows of many streams at once).
#[derive(Clone, Debug)]
pub struct IndexRow {
    pub stream_id: u64,
    pub chunk: ChunkRow,
}

#[derive(Clone)]
pub struct Meta {
    pool: SqlitePool,
    /// Writes not derived from the WAL (tokens, server keys, access times): the
    /// checkpoint loop compares it to decide whether a checkpoint is due even when
    /// the watermark has not moved.
    local_writes: Arc<AtomicU64>,
}

/// The last WAL object whose effects are in the database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Watermark {
    pub epoch: u64,
    /// Next object sequence expected in `epoch`.
    pub next_seq: u64,
}

impl Meta {
    /// Opens (creating if needed) the database at `url` (`sqlite://path` or `sqlite::memory:`).
    pub async fn open(url: &str) -> Result<Meta> {
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
        let meta = Meta {
            pool,
            local_writes: Arc::default(),
        };
        meta.migrate().await?;
        Ok(meta)
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

    pub async fn watermark(&self) -> Result<Option<Watermark>> {
        let epoch = self.state_value("applied_epoch").await?;
        let next_seq = self.state_value("applied_next_seq").await?;
        Ok(epoch.map(|epoch| Watermark {
            epoch,
            next_seq: next_seq.unwrap_or(0),
        }))
    }

    pub async fn next_stream_id(&self) -> Result<u64> {
        Ok(self.state_value("next_stream_id").await?.unwrap_or(1))
    }

    pub async fn node_epoch(&self) -> Result<u64> {
        Ok(self.state_value("node_epoch").await?.unwrap_or(0))
    }

    /// Applies durable WAL objects, in log order, in one transaction; idempotent, so
    /// replaying an object twice changes nothing. New streams and chunk rows go in as
    /// multi-row inserts and each stream gets one update per batch, not a statement
    /// per op: every statement is a round trip to the SQLite worker thread.
    pub async fn apply(&self, objects: &[FlushedObject]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let mut next_id: Option<u64> = None;
        let mut pending = Pending::default();
        for object in objects {
            for chunk in &object.chunks {
                let id = chunk.stream_id as i64;
                let data = chunk.ops.iter().filter_map(|(_, op)| match op {
                    Op::Append(a) => a.records.last().map(|r| (a.start, a.end(), r.ts_ms)),
                    _ => None,
                });
                let span = data.fold(None, |acc: Option<(Offset, Offset, u64)>, (s, e, ts)| {
                    Some(acc.map_or((s, e, ts), |(s0, _, _)| (s0, e, ts)))
                });
                if let Some((start, end, last_ts_ms)) = span {
                    pending.chunks.push(NewChunk {
                        stream_id: id,
                        start: start.0 as i64,
                        end: end.0 as i64,
                        key: object.key.as_str(),
                        byte_start: chunk.range.start as i64,
                        byte_end: chunk.range.end as i64,
                        last_ts_ms: last_ts_ms as i64,
                    });
                }
                for (_, op) in &chunk.ops {
                    match op {
                        Op::Create(c) => {
                            next_id = Some(next_id.unwrap_or(0).max(chunk.stream_id + 1));
                            let fork = c.fork.as_ref();
                            pending.creates.push(CreateRow {
                                id,
                                name: &c.name,
                                content_type: &c.content_type,
                                created_ms: c.created_ms as i64,
                                ttl_secs: c.ttl_secs.map(|t| t as i64),
                                expires_at: c.expires_at.as_deref(),
                                fork_source: fork.map(|f| f.source_id as i64),
                                fork_point: fork.map(|f| f.point.0 as i64),
                                fork_requested: fork
                                    .and_then(|f| f.requested_offset)
                                    .map(|o| o.0 as i64),
                                fork_sub_offset: fork.map_or(0, |f| f.sub_offset as i64),
                                tail: fork.map_or(0, |f| f.point.0 as i64),
                            });
                        }
                        Op::Append(a) => pending.runs.entry(chunk.stream_id).or_default().add(a),
                        Op::Relocate(r) => {
                            pending.flush(&mut tx).await?;
                            relocate(&mut tx, r).await?;
                        }
                        Op::Delete { soft } => {
                            // Everything before the delete lands first (rare: no batching).
                            pending.flush(&mut tx).await?;
                            if *soft {
                                sqlx::query("UPDATE streams SET soft_deleted = 1 WHERE id = ?")
                                    .bind(id)
                                    .execute(&mut *tx)
                                    .await?;
                            } else {
                                for table in [
                                    "DELETE FROM streams WHERE id = ?",
                                    "DELETE FROM chunks WHERE stream_id = ?",
                                    "DELETE FROM producers WHERE stream_id = ?",
                                ] {
                                    sqlx::query(table).bind(id).execute(&mut *tx).await?;
                                }
                            }
                        }
                        Op::Trim { before } => {
                            // The tail it is clamped to must include this batch's appends.
                            pending.flush(&mut tx).await?;
                            sqlx::query("UPDATE streams SET start_pos = MAX(start_pos, MIN(?, tail)) WHERE id = ?")
                                .bind(before.0 as i64)
                                .bind(id)
                                .execute(&mut *tx)
                                .await?;
                            // A row straddling the start stays: reads skip its head.
                            sqlx::query("DELETE FROM chunks WHERE stream_id = ?1 AND end_pos <= (SELECT start_pos FROM streams WHERE id = ?1)")
                                .bind(id)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Op::SetRetention { secs } => {
                            pending.flush(&mut tx).await?;
                            sqlx::query("UPDATE streams SET retention_secs = ? WHERE id = ?")
                                .bind(secs.map(|s| s as i64))
                                .bind(id)
                                .execute(&mut *tx)
                                .await?;
                        }
                    }
                }
            }
        }
        pending.flush(&mut tx).await?;
        if let Some(last) = objects.last() {
            for (key, value) in [
                ("applied_epoch", last.epoch),
                ("applied_next_seq", last.seq + 1),
            ] {
                sqlx::query("INSERT INTO engine_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
                    .bind(key)
                    .bind(value as i64)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        if let Some(next_id) = next_id {
            sqlx::query("INSERT INTO engine_state (key, value) VALUES ('next_stream_id', ?) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)")
                .bind(next_id as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Writes a consistent copy of the whole database to `path` (which must not
    /// exist) and returns the watermark that copy reflects.
    pub async fn snapshot_into(&self, path: &std::path::Path) -> Result<Option<Watermark>> {
        let target = path
            .to_str()
            .ok_or_else(|| EngineError::Internal(format!("snapshot path {path:?} is not UTF-8")))?;
        // One read transaction: the copy is a single point in the index's history.
        sqlx::query("VACUUM INTO ?")
            .bind(target)
            .execute(&self.pool)
            .await?;
        let copy = Meta::open_file(path, true).await?;
        let watermark = copy.watermark().await;
        copy.pool.close().await;
        watermark
    }

    /// Whether no table holds a row (a new database, or a lost data directory).
    pub async fn is_empty(&self) -> Result<bool> {
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

    /// The tables holding state (everything but the schema version).
    async fn tables(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'schema_version'",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Replaces every row of this database with the rows of the database file at
    /// `path` (a snapshot from [`Meta::snapshot_into`], possibly of an older schema,
    /// which is migrated first). One transaction: on failure nothing changes.
    pub async fn restore_from(&self, path: &std::path::Path) -> Result<Option<Watermark>> {
        let source = Meta::open_file(path, false).await?;
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

    /// Opens a database file on its own (one connection), migrating it unless
    /// `read_only`.
    async fn open_file(path: &std::path::Path, read_only: bool) -> Result<Meta> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(read_only)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        let meta = Meta {
            pool,
            local_writes: Arc::default(),
        };
        if !read_only {
            meta.migrate().await?;
        }
        Ok(meta)
    }

    /// Names after `after` (in name order) of up to `limit` live streams whose TTL
    /// (counted from their last recorded access) or Expires-At has passed at `now_ms`.
    /// Access times of active streams are recorded when they go dormant, so the caller
    /// re-checks each one, and pages on with `after` so active streams cannot starve
    /// the rest.
    pub async fn expired_candidates(
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
    pub async fn rows_in_wal_below(&self, below: &str, limit: u32) -> Result<Vec<IndexRow>> {
        let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end FROM chunks WHERE object_key >= 'wal/' AND object_key < ? ORDER BY object_key, stream_id, start_pos LIMIT ?")
            .bind(below)
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
    pub async fn retention_candidates(
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
    pub async fn rows_in_objects(&self, keys: &[String]) -> Result<Vec<IndexRow>> {
        let mut out = Vec::new();
        for key in keys {
            let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end FROM chunks WHERE object_key = ? ORDER BY stream_id, start_pos")
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
    pub async fn live_bytes_under(&self, prefix: &str) -> Result<HashMap<String, u64>> {
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
    pub async fn object_referenced(&self, key: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub async fn stream_by_name(&self, name: &str) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE name = ?"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    /// Every stream name (deleted ones included, while their rows remain), read in
    /// pages of `page` rows by primary key; `each` is called once per name.
    pub async fn for_each_name(&self, page: u32, mut each: impl FnMut(&str)) -> Result<u64> {
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

    pub async fn stream_by_id(&self, id: u64) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE id = ?"))
            .bind(id as i64)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    pub async fn producers(&self, stream_id: u64) -> Result<HashMap<String, (u64, u64)>> {
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
    pub async fn fork_count(&self, stream_id: u64) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE fork_source = ?")
            .bind(stream_id as i64)
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// Index rows of `stream_id` holding data at or after `from`, in offset order.
    pub async fn chunks_from(
        &self,
        stream_id: u64,
        from: Offset,
        limit: u32,
    ) -> Result<Vec<ChunkRow>> {
        let rows = sqlx::query("SELECT start_pos, end_pos, object_key, byte_start, byte_end FROM chunks WHERE stream_id = ? AND end_pos > ? ORDER BY start_pos LIMIT ?")
            .bind(stream_id as i64)
            .bind(from.0 as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| chunk_row(r, 0)).collect())
    }

    /// Writes not derived from the WAL so far (see `local_writes`).
    pub fn local_writes(&self) -> u64 {
        self.local_writes.load(Ordering::Relaxed)
    }

    /// Records a write not derived from the WAL.
    fn wrote_locally(&self) {
        self.local_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub async fn touch(&self, updates: &[(u64, u64)]) -> Result<()> {
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
    pub async fn stream_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE soft_deleted = 0")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// Names of live streams after `after` that start with `prefix`, in name order.
    pub async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Vec<StreamRow>> {
        let rows = sqlx::query(stream_select!(
            "WHERE soft_deleted = 0 AND name > ? AND substr(name, 1, ?) = ? ORDER BY name LIMIT ?"
        ))
        .bind(after)
        .bind(prefix.len() as i64)
        .bind(prefix)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(stream_row).collect())
    }
}

/// The `ChunkRow` in columns `first..first + 5` (start, end, key, byte start, byte end).
fn chunk_row(r: &sqlx::sqlite::SqliteRow, first: usize) -> ChunkRow {
    ChunkRow {
        start: Offset(r.get::<i64, _>(first) as u64),
        end: Offset(r.get::<i64, _>(first + 1) as u64),
        object_key: r.get(first + 2),
        byte_range: r.get::<i64, _>(first + 3) as u64..r.get::<i64, _>(first + 4) as u64,
    }
}

/// Applies a compaction's move: the rows of the stream that start inside the span
/// give way to one row for the new chunk. A stream deleted since compaction read
/// its rows keeps nothing (ids are never reused, so the row would dangle), and a
/// span trimmed away since keeps nothing either (the trim already removed its rows;
/// a span straddling the start is kept like any straddling row).
async fn relocate(tx: &mut sqlx::SqliteConnection, r: &RelocateOp) -> Result<()> {
    let start_pos: Option<i64> = sqlx::query("SELECT start_pos FROM streams WHERE id = ?")
        .bind(r.stream_id as i64)
        .fetch_optional(&mut *tx)
        .await?
        .map(|row| row.get(0));
    match start_pos {
        Some(start) if (r.end.0 as i64) > start => {}
        _ => return Ok(()),
    }
    sqlx::query("DELETE FROM chunks WHERE stream_id = ? AND start_pos >= ? AND start_pos < ?")
        .bind(r.stream_id as i64)
        .bind(r.start.0 as i64)
        .bind(r.end.0 as i64)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT OR REPLACE INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms) VALUES (?, ?, ?, ?, ?, ?, ?)")
        .bind(r.stream_id as i64)
        .bind(r.start.0 as i64)
        .bind(r.end.0 as i64)
        .bind(&r.object_key)
        .bind(r.byte_range.start as i64)
        .bind(r.byte_range.end as i64)
        .bind(r.last_ts_ms as i64)
        .execute(&mut *tx)
        .await?;
    Ok(())
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
    }
}

/// One stream's appends in a batch, written as one row of one `UPDATE streams` and
/// one upsert per producer instead of a statement of each per append. It leaves the
/// rows exactly as applying the appends one by one would: tail and last access only grow, a close sticks, the
/// last closing producer and the last `Stream-Seq` win, each producer's last stamp wins.
#[derive(Default)]
struct AppendRun<'a> {
    end: u64,
    close: bool,
    closed_by: Option<&'a ProducerStamp>,
    stream_seq: Option<&'a str>,
    written_ms: u64,
    producers: Vec<&'a ProducerStamp>,
}

impl<'a> AppendRun<'a> {
    fn add(&mut self, a: &'a AppendOp) {
        self.end = self.end.max(a.end().0);
        if a.close {
            self.close = true;
            self.closed_by = a.producer.as_ref().or(self.closed_by);
        }
        if let Some(seq) = &a.stream_seq {
            self.stream_seq = Some(seq);
        }
        // A write is an access: after a rebuild from the bucket a sliding TTL counts
        // from the last write at the latest.
        self.written_ms = self.written_ms.max(a.records.last().map_or(0, |r| r.ts_ms));
        if let Some(p) = &a.producer {
            match self.producers.iter_mut().find(|q| q.id == p.id) {
                Some(q) => *q = p,
                None => self.producers.push(p),
            }
        }
    }
}

/// A stream created by the batch: its `streams` row.
struct CreateRow<'a> {
    id: i64,
    name: &'a str,
    content_type: &'a str,
    created_ms: i64,
    ttl_secs: Option<i64>,
    expires_at: Option<&'a str>,
    fork_source: Option<i64>,
    fork_point: Option<i64>,
    fork_requested: Option<i64>,
    fork_sub_offset: i64,
    tail: i64,
}

/// A `chunks` row of the batch.
struct NewChunk<'a> {
    stream_id: i64,
    start: i64,
    end: i64,
    key: &'a str,
    byte_start: i64,
    byte_end: i64,
    /// Timestamp of the row's last record.
    last_ts_ms: i64,
}

/// Rows of a batch not yet written. `flush` writes them in dependency order: new
/// streams, then chunks, then the stream updates (an update needs its row).
#[derive(Default)]
struct Pending<'a> {
    creates: Vec<CreateRow<'a>>,
    chunks: Vec<NewChunk<'a>>,
    runs: HashMap<u64, AppendRun<'a>>,
}

/// Access times one `touch` transaction updates.
const TOUCH_GROUP: usize = 256;

/// Rows per multi-row `INSERT`, largest first: a batch of n rows takes one
/// statement per set bit of n (at most 32 rows each), so only six statement
/// texts per table are ever prepared and cached.
const INSERT_GROUPS: [usize; 6] = [32, 16, 8, 4, 2, 1];

/// `head` followed by `rows` tuples of `columns` placeholders (no values in the
/// text: they are bound, so the statement is safe to build).
fn values_sql(head: &str, columns: usize, rows: usize) -> String {
    let tuple = format!("({})", vec!["?"; columns].join(", "));
    format!("{head} VALUES {}", vec![tuple; rows].join(", "))
}

/// An `UPDATE streams` of `rows` streams in one statement. The values are bound as
/// `rows` tuples of `(id, columns...)`; `set` gives each assignment as
/// `(column, expression)`, where `{column}` of `columns` stands for that row's value.
///
/// The rows are found by `id IN (...)`, a primary-key lookup per row whatever the
/// table's size. (`UPDATE ... FROM (VALUES ...)` was seen planned as a scan of the
/// whole table at a million streams: 1 s per statement.) Each row then reads its
/// values from `v`, which holds only this statement's tuples, with one row-value
/// subquery for all its columns: SQLite scans `v` once per subquery, so one per
/// column made a 32-row update 2.4x dearer (159 against 66 us in SQLite 3.40).
/// `v`'s columns are named `v_{column}` so that a bare column name in an expression
/// is the stream's own.
fn by_id_update_sql(columns: &[&str], set: &[(&str, &str)], rows: usize) -> String {
    let values = values_sql("", 1 + columns.len(), rows);
    let targets: Vec<&str> = set.iter().map(|(column, _)| *column).collect();
    let exprs: Vec<String> = set
        .iter()
        .map(|(_, expr)| {
            columns.iter().fold(expr.to_string(), |expr, c| {
                expr.replace(&format!("{{{c}}}"), &format!("v.v_{c}"))
            })
        })
        .collect();
    let v_columns: Vec<String> = columns.iter().map(|c| format!("v_{c}")).collect();
    format!(
        "WITH v(id, {}) AS ({}) UPDATE streams SET ({}) = (SELECT {} FROM v WHERE v.id = streams.id) WHERE id IN (SELECT id FROM v)",
        v_columns.join(", "),
        values.trim_start(),
        targets.join(", "),
        exprs.join(", ")
    )
}

/// Splits `n` rows into `INSERT_GROUPS`-sized runs.
fn groups(mut n: usize) -> impl Iterator<Item = usize> {
    INSERT_GROUPS.into_iter().flat_map(move |g| {
        let k = n / g;
        n -= k * g;
        std::iter::repeat_n(g, k)
    })
}

impl Pending<'_> {
    async fn flush(&mut self, tx: &mut sqlx::SqliteConnection) -> Result<()> {
        let mut rows = self.creates.drain(..);
        for n in groups(rows.len()) {
            let sql = values_sql("INSERT OR IGNORE INTO streams (id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, fork_requested, fork_sub_offset, tail, closed, last_access_ms)", 13, n);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for c in rows.by_ref().take(n) {
                q = q
                    .bind(c.id)
                    .bind(c.name)
                    .bind(c.content_type)
                    .bind(c.created_ms)
                    .bind(c.ttl_secs)
                    .bind(c.expires_at)
                    .bind(c.fork_source)
                    .bind(c.fork_point)
                    .bind(c.fork_requested)
                    .bind(c.fork_sub_offset)
                    .bind(c.tail)
                    .bind(false)
                    .bind(c.created_ms);
            }
            q.execute(&mut *tx).await?;
        }
        drop(rows);
        let chunks = std::mem::take(&mut self.chunks);
        let mut rest = chunks.as_slice();
        for n in groups(rest.len()) {
            let (group, tail) = rest.split_at(n);
            rest = tail;
            insert_chunks(tx, group).await?;
        }
        // One statement per group of streams, not one per stream: each statement is
        // a round trip to SQLite's worker thread (two thread wake-ups), and a flush
        // touches every stream it carries.
        let runs: Vec<(u64, AppendRun)> = self.runs.drain().collect();
        let mut rest = runs.as_slice();
        for n in groups(rest.len()) {
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let mut q = sqlx::query(sqlx::AssertSqlSafe(by_id_update_sql(
                &["tail", "close", "closed_by", "seq", "ms"],
                &[
                    ("tail", "MAX(tail, {tail})"),
                    ("closed", "closed OR {close}"),
                    ("closed_by", "COALESCE({closed_by}, closed_by)"),
                    ("stream_seq", "COALESCE({seq}, stream_seq)"),
                    ("last_access_ms", "MAX(last_access_ms, {ms})"),
                ],
                n,
            )));
            for (id, run) in group {
                q = q
                    .bind(*id as i64)
                    .bind(run.end as i64)
                    .bind(run.close)
                    .bind(run.closed_by.map(encode_stamp))
                    .bind(run.stream_seq)
                    .bind(run.written_ms as i64);
            }
            q.execute(&mut *tx).await?;
        }
        for (stream_id, run) in &runs {
            for p in &run.producers {
                sqlx::query("INSERT INTO producers (stream_id, producer_id, epoch, last_seq) VALUES (?, ?, ?, ?) ON CONFLICT(stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq")
                    .bind(*stream_id as i64)
                    .bind(&p.id)
                    .bind(p.epoch as i64)
                    .bind(p.seq as i64)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Writes one group of chunk rows.
///
/// A row that is already there (a WAL object indexed again after a restart) is
/// replaced, but `INSERT OR REPLACE` is not how the rows go in first: under REPLACE
/// a NOT NULL column without a default still aborts, so SQLite must be able to undo
/// the statement alone and keeps a statement journal, copying every page the
/// statement touches before changing it (about 4,400 instructions per row, 19% of an
/// inserted row's cost in SQLite 3.40; 6% of the server's instructions at the append
/// target under callgrind). Under `OR FAIL` a failing statement keeps the rows it
/// wrote and needs no journal. The group is therefore tried with `OR FAIL`, and only
/// if a row exists already written again with `OR REPLACE`, which replaces rows the
/// first attempt wrote with the same values: the result is what one `OR REPLACE`
/// would have left. Any other error fails the batch, whose transaction is rolled
/// back, as before.
async fn insert_chunks(tx: &mut sqlx::SqliteConnection, group: &[NewChunk<'_>]) -> Result<()> {
    let first = chunk_insert(group, "INSERT OR FAIL")
        .execute(&mut *tx)
        .await;
    match first {
        Err(sqlx::Error::Database(e)) if e.kind() == sqlx::error::ErrorKind::UniqueViolation => {
            chunk_insert(group, "INSERT OR REPLACE")
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        other => other.map(drop).map_err(Into::into),
    }
}

fn chunk_insert<'q>(
    group: &[NewChunk<'q>],
    verb: &str,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    let head = format!("{verb} INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms)");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(values_sql(&head, 7, group.len())));
    for c in group {
        q = q
            .bind(c.stream_id)
            .bind(c.start)
            .bind(c.end)
            .bind(c.key)
            .bind(c.byte_start)
            .bind(c.byte_end)
            .bind(c.last_ts_ms);
    }
    q
}

fn encode_stamp(p: &ProducerStamp) -> String {
    format!("{}:{}:{}", p.epoch, p.seq, p.id)
}

fn decode_stamp(s: &str) -> Option<ProducerStamp> {
    let mut parts = s.splitn(3, ':');
    let epoch = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    Some(ProducerStamp {
        id: parts.next()?.to_string(),
        epoch,
        seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::format::{CreateOp, Record};
    use crate::wal::FlushedChunk;

    fn create(name: &str) -> Op {
        Op::Create(CreateOp {
            name: name.into(),
            content_type: "text/plain".into(),
            created_ms: 1,
            ttl_secs: None,
            expires_at: None,
            fork: None,
        })
    }

    fn append(start: u64, bytes: usize, ts_ms: u64) -> AppendOp {
        AppendOp {
            start: Offset(start),
            records: vec![Record {
                ts_ms,
                flags: 0,
                data: vec![b'x'; bytes].into(),
            }],
            close: false,
            producer: None,
            stream_seq: None,
        }
    }

    fn stamp(seq: u64) -> ProducerStamp {
        ProducerStamp {
            id: "p".into(),
            epoch: 0,
            seq,
        }
    }

    fn object(seq: u64, chunks: Vec<(u64, Vec<Op>)>) -> FlushedObject {
        FlushedObject {
            key: format!("wal/{seq}"),
            epoch: 1,
            seq,
            chunks: chunks
                .into_iter()
                .map(|(stream_id, ops)| FlushedChunk {
                    stream_id,
                    range: 0..10,
                    ops: ops
                        .into_iter()
                        .enumerate()
                        .map(|(i, op)| (i as u64 + 1, op))
                        .collect(),
                    listener: None,
                })
                .collect(),
        }
    }

    /// Every pooled connection keeps statement journals in memory: the indexer's
    /// multi-row statements run inside a transaction, and with temporary files each
    /// spilled to a file in /var/tmp past 64 KiB (two `pwrite`s per page touched).
    #[tokio::test]
    async fn statement_journals_stay_in_memory_on_every_connection() {
        let dir = std::env::temp_dir().join(format!("picomq-meta-tmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let meta = Meta::open(&format!("sqlite://{}/m.sqlite", dir.display()))
            .await
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut conn = meta.pool.acquire().await.unwrap();
            let store: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(store, 2, "temp_store is MEMORY");
            held.push(conn);
        }
        drop(held);
        meta.pool.close().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Chunk rows go in with `OR FAIL` (no statement journal); a row that is already
    /// there, as when a WAL object is indexed again after a restart, is replaced, and
    /// the rows around it in the same statement are written too.
    #[tokio::test]
    async fn chunk_rows_indexed_again_are_replaced() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let first = object(
            0,
            vec![
                (1, vec![create("a"), Op::Append(append(0, 3, 10))]),
                (2, vec![create("b"), Op::Append(append(0, 3, 10))]),
            ],
        );
        meta.apply(std::slice::from_ref(&first)).await.unwrap();
        // Stream 1's row again, now in object 7, between two new rows of one group.
        let again = object(
            7,
            vec![
                (2, vec![Op::Append(append(3, 3, 20))]),
                (1, vec![Op::Append(append(0, 3, 10))]),
                (3, vec![create("c"), Op::Append(append(0, 3, 20))]),
            ],
        );
        meta.apply(&[first, again]).await.unwrap();
        let rows = |id| {
            let meta = meta.clone();
            async move {
                let rows = meta.chunks_from(id, Offset(0), 10).await.unwrap();
                rows.iter()
                    .map(|c| (c.start.0, c.end.0, c.object_key.clone()))
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(rows(1).await, [(0, 3, "wal/7".to_string())]);
        assert_eq!(
            rows(2).await,
            [(0, 3, "wal/0".to_string()), (3, 6, "wal/7".to_string())]
        );
        assert_eq!(rows(3).await, [(0, 3, "wal/7".to_string())]);
    }

    /// Trim moves the start (never back, never past the tail) and drops the rows
    /// that end at or below it, keeping one that straddles it; replaying the same
    /// objects changes nothing.
    #[tokio::test]
    async fn trims_drop_rows_below_the_start_idempotently() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let batch = [
            object(
                0,
                vec![(1, vec![create("s"), Op::Append(append(0, 3, 10))])],
            ),
            object(1, vec![(1, vec![Op::Append(append(3, 3, 20))])]),
            object(
                2,
                vec![(
                    1,
                    vec![
                        Op::Append(append(6, 3, 30)),
                        Op::SetRetention { secs: Some(1) },
                        Op::Trim { before: Offset(4) },
                    ],
                )],
            ),
            object(3, vec![(1, vec![Op::Trim { before: Offset(2) }])]),
        ];
        let spans = |meta: Meta| async move {
            let rows = meta.chunks_from(1, Offset(0), 10).await.unwrap();
            rows.iter()
                .map(|c| (c.start.0, c.end.0))
                .collect::<Vec<_>>()
        };
        for _ in 0..2 {
            meta.apply(&batch).await.unwrap();
            let row = meta.stream_by_name("s").await.unwrap().unwrap();
            assert_eq!((row.start, row.retention_secs), (Offset(4), Some(1)));
            // (0,3) is gone, (3,6) straddles the start and stays.
            assert_eq!(spans(meta.clone()).await, [(3, 6), (6, 9)]);
        }
        // The newest row whose last record is older than the retention ends at 6.
        let found = meta.retention_candidates(1_025, "", 10).await.unwrap();
        assert_eq!(found, [("s".to_string(), Offset(4), Some(Offset(6)))]);
        let found = meta.retention_candidates(1_000, "", 10).await.unwrap();
        assert_eq!(found, [("s".to_string(), Offset(4), None)]);
        // Past the tail: clamped to it, every row goes.
        meta.apply(&[object(4, vec![(1, vec![Op::Trim { before: Offset(99) }])])])
            .await
            .unwrap();
        let row = meta.stream_by_name("s").await.unwrap().unwrap();
        assert_eq!(row.start, Offset(9));
        assert!(spans(meta.clone()).await.is_empty());
        meta.apply(&[object(5, vec![(1, vec![Op::SetRetention { secs: None }])])])
            .await
            .unwrap();
        assert!(meta
            .retention_candidates(u64::MAX >> 2, "", 10)
            .await
            .unwrap()
            .is_empty());
    }

    /// The detail column of `EXPLAIN QUERY PLAN` rows.
    fn plan_details(rows: Vec<sqlx::sqlite::SqliteRow>) -> Vec<String> {
        rows.iter().map(|r| r.get::<String, _>(3)).collect()
    }

    /// Retention reads a stream's expired prefix through the primary key alone (no
    /// index on age), and a row out of timestamp order ends the prefix: kept longer,
    /// never trimmed early.
    #[tokio::test]
    async fn retention_finds_the_expired_prefix_by_primary_key() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let setup = vec![
            create("s"),
            Op::SetRetention { secs: Some(1) },
            Op::Append(append(0, 3, 10)),
        ];
        meta.apply(&[
            object(0, vec![(1, setup)]),
            object(1, vec![(1, vec![Op::Append(append(3, 3, 20))])]),
            // Out of order (a clock stepped back): this row is older than the one
            // before it.
            object(2, vec![(1, vec![Op::Append(append(6, 3, 5))])]),
            object(3, vec![(1, vec![Op::Append(append(9, 3, 2_000))])]),
        ])
        .await
        .unwrap();
        let found = |now| {
            let meta = meta.clone();
            async move { meta.retention_candidates(now, "", 10).await.unwrap() }
        };
        let s = |end: Option<u64>| vec![("s".to_string(), Offset(0), end.map(Offset))];
        assert_eq!(found(1_005).await, s(None), "nothing is a second old");
        assert_eq!(found(1_015).await, s(Some(3)), "the first row expired");
        // The second row expired too; the third is older still but comes after it.
        assert_eq!(found(1_025).await, s(Some(9)));
        // With the third kept by its neighbour until both are old enough.
        assert_eq!(found(1_018).await, s(Some(3)));
        assert_eq!(found(9_999).await, s(Some(12)), "every row expired");

        let plan = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {RETENTION_CANDIDATES_SQL}"
        )))
        .bind(1_025_i64)
        .bind("")
        .bind(10_i64)
        .fetch_all(&meta.pool)
        .await
        .map(plan_details)
        .unwrap();
        for lookup in [
            "SEARCH k USING PRIMARY KEY (stream_id=?)",
            "SEARCH c USING PRIMARY KEY (stream_id=? AND start_pos<?)",
        ] {
            assert!(plan.iter().any(|p| p == lookup), "{lookup}: {plan:?}");
        }
        let scans = |p: &String| {
            let words: Vec<&str> = p.split_whitespace().take(2).collect();
            words == ["SCAN", "c"] || words == ["SCAN", "k"]
        };
        assert!(!plan.iter().any(scans), "{plan:?}");
    }

    #[tokio::test]
    async fn grouped_stream_updates_look_rows_up_by_primary_key() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        for n in INSERT_GROUPS {
            let sql = by_id_update_sql(
                &["tail", "ms"],
                &[
                    ("tail", "MAX(tail, {tail})"),
                    ("last_access_ms", "MAX(last_access_ms, {ms})"),
                ],
                n,
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            for id in 0..n as i64 {
                q = q.bind(id).bind(1_i64).bind(2_i64);
            }
            let plan = q.fetch_all(&meta.pool).await.map(plan_details).unwrap();
            assert!(
                plan.iter()
                    .any(|p| p.contains("streams USING INTEGER PRIMARY KEY")),
                "{plan:?}"
            );
            assert!(!plan.iter().any(|p| p == "SCAN streams"), "{plan:?}");
        }
    }

    /// Touches go out in transactions of 256: every stream gets its own access
    /// time, and an older time never overwrites a newer one.
    #[tokio::test]
    async fn touch_updates_every_stream_in_groups() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let streams: Vec<(u64, Vec<Op>)> = (1..=301)
            .map(|id| (id, vec![create(&format!("s{id}"))]))
            .collect();
        meta.apply(&[object(1, streams)]).await.unwrap();
        let updates: Vec<(u64, u64)> = (1..=301).map(|id| (id, 1_000 + id)).collect();
        meta.touch(&updates).await.unwrap();
        meta.touch(&[(7, 5)]).await.unwrap(); // older: ignored
        for id in [1, 7, 256, 257, 300, 301] {
            let row = meta.stream_by_id(id).await.unwrap().unwrap();
            assert_eq!(row.last_access_ms, 1_000 + id, "stream {id}");
        }
    }

    /// Folding a batch's appends into one update per stream and multi-row inserts
    /// must leave the rows that applying every op one by one would.
    #[tokio::test]
    async fn batched_index_writes_match_op_by_op_effects() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        let mut first = append(0, 3, 10);
        first.stream_seq = Some("a".into());
        first.producer = Some(stamp(0));
        let mut second = append(3, 2, 12);
        second.producer = Some(stamp(1));
        let mut closing = append(5, 0, 0);
        closing.records.clear();
        closing.close = true;
        closing.producer = Some(stamp(2));
        // 37 streams created and written in one object: 32 + 4 + 1 row groups.
        let many: Vec<(u64, Vec<Op>)> = (10..47)
            .map(|id| {
                (
                    id,
                    vec![create(&format!("s{id}")), Op::Append(append(0, 4, 5))],
                )
            })
            .collect();
        let batch = [
            object(0, vec![(1, vec![create("one"), Op::Append(first)])]),
            object(1, vec![(1, vec![Op::Append(second)])]),
            object(2, vec![(1, vec![Op::Append(closing)])]),
            object(3, many),
            object(
                4,
                vec![(2, vec![create("gone"), Op::Append(append(0, 1, 1))])],
            ),
            object(5, vec![(2, vec![Op::Delete { soft: false }])]),
        ];
        meta.apply(&batch).await.unwrap();

        let one = meta.stream_by_name("one").await.unwrap().unwrap();
        assert_eq!(one.tail, Offset(5));
        assert!(one.closed);
        assert_eq!(one.closed_by, Some(stamp(2)));
        assert_eq!(one.stream_seq.as_deref(), Some("a"));
        assert_eq!(one.last_access_ms, 12);
        assert_eq!(meta.producers(1).await.unwrap()["p"], (0, 2));
        let chunks = meta.chunks_from(1, Offset(0), 10).await.unwrap();
        let spans: Vec<_> = chunks.iter().map(|c| (c.start.0, c.end.0)).collect();
        assert_eq!(spans, [(0, 3), (3, 5)]);
        for id in 10..47 {
            let row = meta
                .stream_by_name(&format!("s{id}"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!((row.id, row.tail), (id, Offset(4)));
            assert_eq!(meta.chunks_from(id, Offset(0), 10).await.unwrap().len(), 1);
        }
        assert!(meta.stream_by_name("gone").await.unwrap().is_none());
        assert!(meta.chunks_from(2, Offset(0), 10).await.unwrap().is_empty());
        assert_eq!(meta.next_stream_id().await.unwrap(), 47);
    }
}
