//! The metadata store in Postgres: the metadata of record, the foundation of nodes
//! sharing a bucket. The rows and their meaning are SQLite's (every row derived from
//! WAL objects, written by one indexer in log order, idempotently), but nothing
//! rebuilds this database from the bucket and nothing checkpoints it: `local_index`
//! is `None`. A node on Postgres is a cluster member (a cluster of one at least):
//! it recovers nothing itself, the logs of members that died are taken over by the
//! membership loop, and each member indexes through [`MetaStore::as_member`], which
//! fences its batches. Queries are here, `apply` writes WAL effects, `tokens` the
//! token and key rows, `coordinator` the cluster's leases, slots and ids; the schema
//! is in `migrations/postgres/` (`0002_cluster.sql`: the cluster's tables).

mod apply;
mod coordinator;
mod tokens;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, PgPool, Row};

use super::rows::decode_stamp;
use super::{
    redacted_url, ChunkRow, IndexRow, LocalIndex, MetaIdentity, MetaStore, StreamRow, TokenRecord,
    Watermark,
};
use crate::cluster::Coordinator;
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
    (
        1,
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_cluster.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_sequence_numbers.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_identity.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_kafka_brokers.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/postgres/0006_registry.sql"),
    ),
];

/// The schema version this binary writes: the last migration.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Key of the advisory lock migrations hold: nodes starting at once against one
/// database migrate one after the other ("picomq" and a 1).
const MIGRATION_LOCK: i64 = 0x7069_636f_6d71_0001;

/// Connections per node: the indexer, cold reads of dormant streams, background
/// passes and access-time updates each hold one at a time.
const POOL_CONNECTIONS: u32 = 8;
/// How long a caller waits for a free connection (or a new one) before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// No metadata statement should run for long: past this Postgres cancels it, and
/// the caller (the indexer retries) sees an error instead of a hang. A
/// `statement_timeout` in the URL's `options` parameter wins.
const STATEMENT_TIMEOUT: &str = "30s";
/// A transaction left open (a bug, or a client gone) must not hold row locks for
/// ever: Postgres ends the session after this long idle inside one.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

/// [`MetaStore::retention_candidates`]: `$1` now (ms), `$2` the name to start
/// after, `$3` how many. See the SQLite flavour for why both lookups walk the
/// primary key from the stream's first row.
const RETENTION_CANDIDATES_SQL: &str = "WITH candidates AS MATERIALIZED (
     SELECT s.id, s.name, s.start_pos,
         (SELECT k.start_pos FROM chunks k
             WHERE k.stream_id = s.id AND k.last_ts_ms >= $1 - s.retention_secs * 1000
             ORDER BY k.start_pos LIMIT 1) AS kept
     FROM streams s
     WHERE s.retention_secs IS NOT NULL AND NOT s.soft_deleted AND s.name > $2
     ORDER BY s.name LIMIT $3)
 SELECT c.name, c.start_pos, (SELECT k.end_pos FROM chunks k
     WHERE k.stream_id = c.id AND k.start_pos < COALESCE(c.kept, 9223372036854775807)
     ORDER BY k.start_pos DESC LIMIT 1)
 FROM candidates c ORDER BY c.name";

/// [`MetaStore::list`]: live streams after `$1` in `[$2, $4)`, at most `$3`.
const LIST_RANGE_SQL: &str = stream_select!(
    "WHERE NOT soft_deleted AND name > $1 AND name >= $2 AND name < $4 ORDER BY name LIMIT $3"
);
/// [`MetaStore::list`] for a prefix with no upper bound (see [`prefix_end`]).
const LIST_STARTING_WITH_SQL: &str = stream_select!(
    "WHERE NOT soft_deleted AND name > $1 AND starts_with(name, $2) ORDER BY name LIMIT $3"
);

/// Columns of an [`IndexRow`] (stream id, then [`chunk_row`]'s five).
const INDEX_COLUMNS: &str =
    "stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms";

/// Whether `url` names a Postgres database.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[derive(Clone)]
pub struct PostgresMeta {
    pool: PgPool,
    /// The cluster member (epoch) this view indexes for: each batch it applies is
    /// fenced by that member's row (see `apply`). `None`: no fencing, and the
    /// batch moves the single watermark instead.
    member: Option<u64>,
}

impl PostgresMeta {
    /// Connects to the database at `url` (`postgres://` or `postgresql://`, with
    /// libpq's parameters, e.g. `sslmode=require`) and migrates it.
    pub async fn open(url: &str) -> Result<PostgresMeta> {
        let shown = redacted_url(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| EngineError::bad_request(format!("metadata URL {shown:?}: {e}")))?;
        let given = options.get_options().unwrap_or_default();
        let mut settings = Vec::new();
        if !given.contains("statement_timeout") {
            settings.push(("statement_timeout", STATEMENT_TIMEOUT));
        }
        if !given.contains("idle_in_transaction_session_timeout") {
            settings.push((
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            ));
        }
        let options = options.application_name("picomq").options(settings);
        let cannot = |e: String| {
            EngineError::Unavailable(format!("metadata store {shown}: cannot connect: {e}"))
        };
        // One connection first: the pool retries until its timeout and then says only
        // that it timed out, not why (refused, unknown host, bad password).
        let first = tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| cannot(format!("no answer within {ACQUIRE_TIMEOUT:?}")))?
            .map_err(|e| cannot(e.to_string()))?;
        first.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(POOL_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| cannot(e.to_string()))?;
        let meta = PostgresMeta { pool, member: None };
        meta.migrate().await.map_err(|e| {
            EngineError::Internal(format!("metadata store {shown}: migrating: {e}"))
        })?;
        Ok(meta)
    }

    /// The pool, for tests that look at plans or rows directly.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the migrations this database lacks, all in one transaction under an
    /// advisory lock: a node that starts while another migrates waits, then finds
    /// the work done.
    async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
            .execute(&mut *tx)
            .await?;
        let current: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            .fetch_one(&mut *tx)
            .await?
            .get(0);
        if current > SCHEMA_VERSION {
            return Err(EngineError::Internal(format!(
                "metadata schema version {current} is newer than this binary's ({SCHEMA_VERSION}): upgrade PicoMQ"
            )));
        }
        for (version, sql) in MIGRATIONS {
            if *version > current {
                sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("INSERT INTO schema_version (version) VALUES ($1)")
                    .bind(version)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn state_value(&self, key: &str) -> Result<Option<u64>> {
        let row = sqlx::query("SELECT value FROM engine_state WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<i64, _>(0) as u64))
    }

    async fn set_state_value(&self, key: &str, value: u64) -> Result<()> {
        sqlx::query("INSERT INTO engine_state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value as i64)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl MetaStore for PostgresMeta {
    async fn apply(&self, objects: &[FlushedObject]) -> Result<()> {
        apply::apply(&self.pool, objects, self.member).await
    }

    async fn watermark(&self) -> Result<Option<Watermark>> {
        let rows = sqlx::query("SELECT key, value FROM engine_state WHERE key IN ('applied_epoch', 'applied_next_seq')")
            .fetch_all(&self.pool)
            .await?;
        let value = |name: &str| {
            rows.iter()
                .find(|r| r.get::<&str, _>(0) == name)
                .map(|r| r.get::<i64, _>(1) as u64)
        };
        Ok(value("applied_epoch").map(|epoch| Watermark {
            epoch,
            next_seq: value("applied_next_seq").unwrap_or(0),
        }))
    }

    async fn node_epoch(&self) -> Result<u64> {
        Ok(self.state_value("node_epoch").await?.unwrap_or(0))
    }

    async fn set_node_epoch(&self, epoch: u64) -> Result<()> {
        self.set_state_value("node_epoch", epoch).await
    }

    async fn next_stream_id(&self) -> Result<u64> {
        Ok(self.state_value("next_stream_id").await?.unwrap_or(1))
    }

    async fn stream_by_name(&self, name: &str) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    async fn stream_by_id(&self, id: u64) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE id = $1"))
            .bind(id as i64)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
    }

    /// Every stream name, read in pages of `page` rows by primary key.
    async fn for_each_name(
        &self,
        page: u32,
        each: &mut (dyn for<'n> FnMut(&'n str) + Send),
    ) -> Result<u64> {
        let (mut after, mut n) = (i64::MIN, 0_u64);
        loop {
            let rows =
                sqlx::query("SELECT id, name FROM streams WHERE id > $1 ORDER BY id LIMIT $2")
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

    async fn producers(&self, stream_id: u64) -> Result<HashMap<String, (u64, u64)>> {
        let rows =
            sqlx::query("SELECT producer_id, epoch, last_seq FROM producers WHERE stream_id = $1")
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

    async fn fork_count(&self, stream_id: u64) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE fork_source = $1")
            .bind(stream_id as i64)
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    async fn touch(&self, updates: &[(u64, u64)]) -> Result<()> {
        apply::touch(&self.pool, updates).await
    }

    async fn stream_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM streams WHERE NOT soft_deleted")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// Live streams after `after` whose names start with `prefix`, in name order:
    /// a range of the name index (see [`prefix_end`]).
    async fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Vec<StreamRow>> {
        let query = match prefix_end(prefix) {
            Some(end) => sqlx::query(LIST_RANGE_SQL)
                .bind(after)
                .bind(prefix)
                .bind(limit as i64)
                .bind(end),
            None => sqlx::query(LIST_STARTING_WITH_SQL)
                .bind(after)
                .bind(prefix)
                .bind(limit as i64),
        };
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(stream_row).collect())
    }

    async fn count_streams_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64> {
        tokens::count_streams_with_prefix(&self.pool, prefix, limit).await
    }

    /// Names after `after` of up to `limit` live streams whose TTL (from their last
    /// recorded access) or Expires-At (parsed when the create was applied) has
    /// passed at `now_ms`; the caller re-checks each one.
    async fn expired_candidates(
        &self,
        now_ms: u64,
        after: &str,
        limit: u32,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT name FROM streams WHERE NOT soft_deleted AND name > $2 AND (
                (ttl_secs IS NOT NULL AND last_access_ms + ttl_secs * 1000 < $1)
                OR expires_at_ms < $1
             ) ORDER BY name LIMIT $3",
        )
        .bind(now_ms as i64)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

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

    async fn chunks_from(&self, stream_id: u64, from: Offset, limit: u32) -> Result<Vec<ChunkRow>> {
        let rows = sqlx::query("SELECT start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE stream_id = $1 AND end_pos > $2 ORDER BY start_pos LIMIT $3")
            .bind(stream_id as i64)
            .bind(from.0 as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| chunk_row(r, 0)).collect())
    }

    async fn rows_in_wal_below(
        &self,
        below: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>> {
        let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE object_key >= 'wal/' AND object_key < $1 AND byte_end - byte_start < $2 ORDER BY object_key, stream_id, start_pos LIMIT $3")
            .bind(below)
            .bind(smaller_than.min(i64::MAX as u64) as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(index_row).collect())
    }

    async fn wal_rows_newest_first(
        &self,
        log: &str,
        smaller_than: u64,
        limit: u32,
    ) -> Result<Vec<IndexRow>> {
        let end = prefix_end(log).unwrap_or_else(|| "wal0".into());
        let rows = sqlx::query("SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, start_seq, last_ts_ms FROM chunks WHERE object_key >= $1 AND object_key < $2 AND byte_end - byte_start < $3 ORDER BY object_key DESC, stream_id, start_pos LIMIT $4")
            .bind(log)
            .bind(end)
            .bind(smaller_than.min(i64::MAX as u64) as i64)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(index_row).collect())
    }

    /// Index rows in the objects `keys`, grouped by object in the order of `keys`:
    /// one statement, not one per key.
    async fn rows_in_objects(&self, keys: &[String]) -> Result<Vec<IndexRow>> {
        let sql = format!(
            "SELECT {INDEX_COLUMNS} FROM chunks c JOIN UNNEST($1::text[]) WITH ORDINALITY AS k(key, n) ON c.object_key = k.key ORDER BY k.n, c.stream_id, c.start_pos"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(keys)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(index_row).collect())
    }

    async fn live_bytes_under(&self, prefix: &str) -> Result<HashMap<String, u64>> {
        let query = match prefix_end(prefix) {
            Some(end) => sqlx::query("SELECT object_key, SUM(byte_end - byte_start)::BIGINT FROM chunks WHERE object_key >= $1 AND object_key < $2 GROUP BY object_key")
                .bind(prefix)
                .bind(end),
            None => sqlx::query("SELECT object_key, SUM(byte_end - byte_start)::BIGINT FROM chunks WHERE starts_with(object_key, $1) GROUP BY object_key")
                .bind(prefix),
        };
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
            .collect())
    }

    async fn object_referenced(&self, key: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM chunks WHERE object_key = $1 LIMIT 1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
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
        Ok(Box::new(tokens::registry_lock(&self.pool).await?))
    }

    async fn registry_draw_id(&self, at_least: u64) -> Result<u64> {
        tokens::registry_draw_id(&self.pool, at_least).await
    }

    async fn identity(&self) -> Result<MetaIdentity> {
        // The row's id with the database's OID: a copy of the rows on another
        // database (a restore, a template) is another metadata, until rebound.
        let r = sqlx::query(
            "SELECT i.meta_id || '.' || d.oid::text, i.cluster_id, i.store FROM identity i \
             JOIN pg_database d ON d.datname = current_database() WHERE i.one = 1",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(MetaIdentity {
            kind: "postgres",
            meta_id: r.get(0),
            cluster_id: r.get(1),
            store: r.get(2),
        })
    }

    async fn bind(&self, cluster_id: &str, store: &str) -> Result<MetaIdentity> {
        sqlx::query("UPDATE identity SET cluster_id = $1, store = $2, bound_at = now() WHERE one = 1 AND cluster_id IS NULL")
            .bind(cluster_id)
            .bind(store)
            .execute(&self.pool)
            .await?;
        self.identity().await
    }

    async fn rebind(&self, cluster_id: &str, store: &str) -> Result<()> {
        sqlx::query(
            "UPDATE identity SET cluster_id = $1, store = $2, bound_at = now() WHERE one = 1",
        )
        .bind(cluster_id)
        .bind(store)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The metadata of record: nothing to checkpoint or rebuild.
    fn local_index(&self) -> Option<&dyn LocalIndex> {
        None
    }

    fn coordinator(&self) -> Option<Arc<dyn Coordinator>> {
        Some(Arc::new(coordinator::PostgresCoordinator::new(
            self.pool.clone(),
        )))
    }

    fn as_member(&self, epoch: u64) -> Option<Arc<dyn MetaStore>> {
        Some(Arc::new(PostgresMeta {
            pool: self.pool.clone(),
            member: Some(epoch),
        }))
    }
}

/// The least string above every string that starts with `prefix`, in byte order
/// (which for UTF-8 is code point order, and `COLLATE "C"`'s): the prefix with its
/// last character replaced by the next one. `None` when there is none (an empty
/// prefix, or one of U+10FFFF only); callers then test `starts_with`.
pub(super) fn prefix_end(prefix: &str) -> Option<String> {
    let mut end: Vec<char> = prefix.chars().collect();
    while let Some(last) = end.pop() {
        let next = match last as u32 + 1 {
            0xD800 => Some('\u{E000}'),
            n => char::from_u32(n),
        };
        if let Some(next) = next {
            end.push(next);
            return Some(end.into_iter().collect());
        }
    }
    None
}

/// The `ChunkRow` in columns `first..first + 7` (start, end, key, byte start, byte
/// end, first sequence number, last timestamp).
fn chunk_row(r: &PgRow, first: usize) -> ChunkRow {
    ChunkRow {
        start: Offset(r.get::<i64, _>(first) as u64),
        end: Offset(r.get::<i64, _>(first + 1) as u64),
        object_key: r.get(first + 2),
        byte_range: r.get::<i64, _>(first + 3) as u64..r.get::<i64, _>(first + 4) as u64,
        start_seq: r.get::<i64, _>(first + 5) as u64,
        last_ts_ms: r.get::<i64, _>(first + 6) as u64,
    }
}

fn index_row(r: &PgRow) -> IndexRow {
    IndexRow {
        stream_id: r.get::<i64, _>(0) as u64,
        chunk: chunk_row(r, 1),
    }
}

fn stream_row(r: &PgRow) -> StreamRow {
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
        closed: r.get(11),
        closed_by: r
            .get::<Option<String>, _>(12)
            .and_then(|s| decode_stamp(&s)),
        stream_seq: r.get(13),
        soft_deleted: r.get(14),
        last_access_ms: r.get::<i64, _>(15) as u64,
        start: Offset(r.get::<i64, _>(16) as u64),
        retention_secs: r.get::<Option<i64>, _>(17).map(|v| v as u64),
        next_seq: r.get::<i64, _>(18) as u64,
    }
}
