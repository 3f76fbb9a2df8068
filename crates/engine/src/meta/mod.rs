//! The metadata store: stream registry rows, the object index, producer state and the
//! WAL watermark, in SQLite (embedded default). Every row is derived from WAL objects,
//! written by one indexer in log order (`apply`), so the database can be rebuilt from
//! the bucket alone. Reads come from the stream service when it loads a dormant
//! stream or serves data that left the tail cache.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::error::{EngineError, Result};
use crate::offset::Offset;
use crate::wal::format::{ForkOrigin, Op, ProducerStamp};
use crate::wal::FlushedObject;

mod tokens;
pub use tokens::TokenRow;

/// `SELECT` of every stream column (in `stream_row` order) followed by `$tail`.
macro_rules! stream_select {
    ($tail:literal) => {
        concat!(
            "SELECT id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, ",
            "fork_requested, fork_sub_offset, tail, closed, closed_by, stream_seq, soft_deleted, last_access_ms ",
            "FROM streams ",
            $tail
        )
    };
}

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_init.sql")),
    (2, include_str!("../../migrations/sqlite/0002_auth.sql")),
];

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
}

#[derive(Clone, Debug)]
pub struct ChunkRow {
    pub start: Offset,
    pub end: Offset,
    pub object_key: String,
    pub byte_range: std::ops::Range<u64>,
}

#[derive(Clone)]
pub struct Meta {
    pool: SqlitePool,
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
            .busy_timeout(Duration::from_secs(10));
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .connect_with(options)
            .await?;
        let meta = Meta { pool };
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
    /// replaying an object twice changes nothing.
    pub async fn apply(&self, objects: &[FlushedObject]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let mut next_id: Option<u64> = None;
        for object in objects {
            for chunk in &object.chunks {
                let id = chunk.stream_id as i64;
                let data = chunk.ops.iter().filter_map(|(_, op)| match op {
                    Op::Append(a) if !a.records.is_empty() => Some((a.start, a.end())),
                    _ => None,
                });
                let span = data.fold(None, |acc: Option<(Offset, Offset)>, (s, e)| {
                    Some(acc.map_or((s, e), |(s0, _)| (s0, e)))
                });
                if let Some((start, end)) = span {
                    sqlx::query("INSERT OR REPLACE INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end) VALUES (?, ?, ?, ?, ?, ?)")
                        .bind(id)
                        .bind(start.0 as i64)
                        .bind(end.0 as i64)
                        .bind(&object.key)
                        .bind(chunk.range.start as i64)
                        .bind(chunk.range.end as i64)
                        .execute(&mut *tx)
                        .await?;
                }
                for (_, op) in &chunk.ops {
                    match op {
                        Op::Create(c) => {
                            next_id = Some(next_id.unwrap_or(0).max(chunk.stream_id + 1));
                            let fork = c.fork.as_ref();
                            sqlx::query("INSERT OR IGNORE INTO streams (id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, fork_requested, fork_sub_offset, tail, closed, last_access_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)")
                                .bind(id)
                                .bind(&c.name)
                                .bind(&c.content_type)
                                .bind(c.created_ms as i64)
                                .bind(c.ttl_secs.map(|t| t as i64))
                                .bind(&c.expires_at)
                                .bind(fork.map(|f| f.source_id as i64))
                                .bind(fork.map(|f| f.point.0 as i64))
                                .bind(fork.and_then(|f| f.requested_offset).map(|o| o.0 as i64))
                                .bind(fork.map_or(0, |f| f.sub_offset as i64))
                                .bind(fork.map_or(0, |f| f.point.0 as i64))
                                .bind(c.created_ms as i64)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Op::Append(a) => {
                            let closed_by = if a.close {
                                a.producer.as_ref().map(encode_stamp)
                            } else {
                                None
                            };
                            // A write is an access: after a rebuild from the bucket a
                            // sliding TTL counts from the last write at the latest.
                            let written_ms = a.records.last().map_or(0, |r| r.ts_ms);
                            sqlx::query("UPDATE streams SET tail = MAX(tail, ?), closed = closed OR ?, closed_by = COALESCE(?, closed_by), stream_seq = COALESCE(?, stream_seq), last_access_ms = MAX(last_access_ms, ?) WHERE id = ?")
                                .bind(a.end().0 as i64)
                                .bind(a.close)
                                .bind(closed_by)
                                .bind(&a.stream_seq)
                                .bind(written_ms as i64)
                                .bind(id)
                                .execute(&mut *tx)
                                .await?;
                            if let Some(p) = &a.producer {
                                sqlx::query("INSERT INTO producers (stream_id, producer_id, epoch, last_seq) VALUES (?, ?, ?, ?) ON CONFLICT(stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq")
                                    .bind(id)
                                    .bind(&p.id)
                                    .bind(p.epoch as i64)
                                    .bind(p.seq as i64)
                                    .execute(&mut *tx)
                                    .await?;
                            }
                        }
                        Op::Delete { soft: true } => {
                            sqlx::query("UPDATE streams SET soft_deleted = 1 WHERE id = ?")
                                .bind(id)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Op::Delete { soft: false } => {
                            for table in [
                                "DELETE FROM streams WHERE id = ?",
                                "DELETE FROM chunks WHERE stream_id = ?",
                                "DELETE FROM producers WHERE stream_id = ?",
                            ] {
                                sqlx::query(table).bind(id).execute(&mut *tx).await?;
                            }
                        }
                    }
                }
            }
        }
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

    pub async fn stream_by_name(&self, name: &str) -> Result<Option<StreamRow>> {
        let row = sqlx::query(stream_select!("WHERE name = ?"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| stream_row(&r)))
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
        Ok(rows
            .iter()
            .map(|r| ChunkRow {
                start: Offset(r.get::<i64, _>(0) as u64),
                end: Offset(r.get::<i64, _>(1) as u64),
                object_key: r.get(2),
                byte_range: r.get::<i64, _>(3) as u64..r.get::<i64, _>(4) as u64,
            })
            .collect())
    }

    pub async fn touch(&self, updates: &[(u64, u64)]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (id, ms) in updates {
            sqlx::query("UPDATE streams SET last_access_ms = MAX(last_access_ms, ?) WHERE id = ?")
                .bind(*ms as i64)
                .bind(*id as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
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
    }
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
