//! Applying durable WAL objects to the SQLite index, in log order, in one
//! transaction per batch: new streams and chunk rows as multi-row inserts, one
//! update per stream per batch. Idempotent, so replaying an object twice changes
//! nothing.

use std::collections::{BTreeMap, HashMap};

use sqlx::{Row, SqlitePool};

use super::tokens;
use crate::error::Result;
use crate::meta::rows::{encode_stamp, straddled, AppendRun, CreateRow, NewChunk};
use crate::wal::format::{Op, RelocateOp};
use crate::wal::FlushedObject;

/// Applies durable WAL objects, in log order, in one transaction; idempotent, so
/// replaying an object twice changes nothing. New streams and chunk rows go in as
/// multi-row inserts and each stream gets one update per batch, not a statement
/// per op: every statement is a round trip to the SQLite worker thread.
pub(super) async fn apply(pool: &SqlitePool, objects: &[FlushedObject]) -> Result<()> {
    let mut tx = pool.begin().await?;
    let mut next_id: Option<u64> = None;
    let mut pending = Pending::default();
    for object in objects {
        for chunk in &object.chunks {
            if let Some(row) = NewChunk::of(&object.key, chunk) {
                pending.chunks.push(row);
            }
            for (_, op) in &chunk.ops {
                if let Op::Create(_) = op {
                    next_id = Some(next_id.unwrap_or(0).max(chunk.stream_id + 1));
                }
                apply_op(&mut tx, &mut pending, chunk.stream_id, op).await?;
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

/// One op's effect: creates and appends are batched in `pending`; the rare ops land
/// everything batched before them first.
async fn apply_op<'a>(
    tx: &mut sqlx::SqliteConnection,
    pending: &mut Pending<'a>,
    stream_id: u64,
    op: &'a Op,
) -> Result<()> {
    let id = stream_id as i64;
    match op {
        Op::Create(c) => pending.creates.push(CreateRow::of(stream_id, c)),
        Op::Append(a) => pending.runs.entry(stream_id).or_default().add(a),
        Op::Relocate(r) => {
            pending.flush(tx).await?;
            relocate(tx, r).await?;
        }
        Op::Delete { soft } => {
            pending.flush(tx).await?;
            delete(tx, id, *soft).await?;
        }
        Op::Trim { before } => {
            // The tail it is clamped to must include this batch's appends.
            pending.flush(tx).await?;
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
            pending.flush(tx).await?;
            sqlx::query("UPDATE streams SET retention_secs = ? WHERE id = ?")
                .bind(secs.map(|s| s as i64))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        // Node-level rows: nothing batched depends on them.
        Op::PutToken(t) => tokens::put(tx, t).await?,
        Op::RevokeTokens { ids, at_ms } => tokens::revoke(tx, ids, *at_ms).await?,
        Op::PutServerKey { name, key } => tokens::put_server_key(tx, name, key).await?,
        Op::RegistryPut {
            table,
            key,
            value,
            replace,
        } => tokens::registry_put(tx, table, key, value, *replace).await?,
        Op::RegistryDelete { table, key } => tokens::registry_delete(tx, table, key).await?,
    }
    Ok(())
}

/// A delete: soft keeps the rows for the stream's forks; hard removes them.
async fn delete(tx: &mut sqlx::SqliteConnection, id: i64, soft: bool) -> Result<()> {
    if soft {
        sqlx::query("UPDATE streams SET soft_deleted = 1 WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        return Ok(());
    }
    for table in [
        "DELETE FROM streams WHERE id = ?",
        "DELETE FROM chunks WHERE stream_id = ?",
        "DELETE FROM producers WHERE stream_id = ?",
    ] {
        sqlx::query(table).bind(id).execute(&mut *tx).await?;
    }
    Ok(())
}

/// Applies a compaction's move: the rows of the stream that start inside the span
/// give way to one row for the new chunk. A stream deleted since compaction read
/// its rows keeps nothing (ids are never reused, so the row would dangle), and a
/// span trimmed away since keeps nothing either (the trim already removed its rows;
/// a span straddling the start is kept like any straddling row). A move that a
/// row reaches across is stale and lands nowhere (`straddled`).
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
    // The rows that may reach into the span: those starting inside it, and the one
    // before it.
    let near: BTreeMap<u64, (u64, ())> = sqlx::query(concat!(
        "SELECT start_pos, end_pos FROM chunks WHERE stream_id = ?1 AND start_pos >= ?2 AND start_pos < ?3 ",
        "UNION SELECT * FROM (SELECT start_pos, end_pos FROM chunks WHERE stream_id = ?1 AND start_pos < ?2 ",
        "ORDER BY start_pos DESC LIMIT 1)"
    ))
    .bind(r.stream_id as i64)
    .bind(r.start.0 as i64)
    .bind(r.end.0 as i64)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|row| (row.get::<i64, _>(0) as u64, (row.get::<i64, _>(1) as u64, ())))
    .collect();
    if straddled(&near, r) {
        return Ok(());
    }
    sqlx::query("DELETE FROM chunks WHERE stream_id = ? AND start_pos >= ? AND start_pos < ?")
        .bind(r.stream_id as i64)
        .bind(r.start.0 as i64)
        .bind(r.end.0 as i64)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT OR REPLACE INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        .bind(r.stream_id as i64)
        .bind(r.start.0 as i64)
        .bind(r.end.0 as i64)
        .bind(&r.object_key)
        .bind(r.byte_range.start as i64)
        .bind(r.byte_range.end as i64)
        .bind(r.last_ts_ms as i64)
        .bind(r.start_seq as i64)
        .execute(&mut *tx)
        .await?;
    Ok(())
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
pub(super) const TOUCH_GROUP: usize = 256;

/// Rows per multi-row `INSERT`, largest first: a batch of n rows takes one
/// statement per set bit of n (at most 32 rows each), so only six statement
/// texts per table are ever prepared and cached.
pub(super) const INSERT_GROUPS: [usize; 6] = [32, 16, 8, 4, 2, 1];

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
pub(super) fn by_id_update_sql(columns: &[&str], set: &[(&str, &str)], rows: usize) -> String {
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
pub(super) fn groups(mut n: usize) -> impl Iterator<Item = usize> {
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
            let sql = values_sql("INSERT OR IGNORE INTO streams (id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, fork_requested, fork_sub_offset, tail, closed, last_access_ms, next_seq, fork_point_seq)", 15, n);
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
                    .bind(c.created_ms)
                    .bind(c.next_seq)
                    .bind(c.fork_point_seq);
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
                &["tail", "close", "closed_by", "seq", "ms", "next_seq"],
                &[
                    ("tail", "MAX(tail, {tail})"),
                    ("next_seq", "MAX(next_seq, {next_seq})"),
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
                    .bind(run.written_ms as i64)
                    .bind(run.end_seq as i64);
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
    let head = format!("{verb} INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq)");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(values_sql(&head, 8, group.len())));
    for c in group {
        q = q
            .bind(c.stream_id)
            .bind(c.start)
            .bind(c.end)
            .bind(c.key)
            .bind(c.byte_start)
            .bind(c.byte_end)
            .bind(c.last_ts_ms)
            .bind(c.start_seq);
    }
    q
}
