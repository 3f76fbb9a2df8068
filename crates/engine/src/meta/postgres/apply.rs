//! Applying durable WAL objects to Postgres, in log order, in one transaction per
//! batch: the rows of `meta::rows`, each table's written by one statement over
//! arrays (`UNNEST`), whatever the batch's size, so a batch costs a handful of
//! round trips. Idempotent, so replaying an object twice changes nothing. Also the
//! access-time updates, which are not WAL effects but touch the same rows.

use std::collections::{BTreeMap, HashMap};

use sqlx::{PgConnection, PgPool, Row};

use super::tokens;
use crate::error::{EngineError, Result};
use crate::meta::rows::{encode_stamp, straddled, AppendRun, CreateRow, NewChunk};
use crate::units::parse_rfc3339_ms;
use crate::wal::format::{Op, RelocateOp};
use crate::wal::FlushedObject;

/// Access times per `touch` statement: each is its own short transaction, so a
/// sweep of 100,000 dormant streams never holds many row locks at once.
const TOUCH_GROUP: usize = 1_000;

/// The stream updates of a flush: `$1` ids, then tail, close, closing stamp,
/// Stream-Seq, write time and next sequence number per stream. Tail, last access
/// and the sequence number only grow, a close
/// sticks, a stamp or Stream-Seq given replaces the stored one. Rows are found
/// through the primary key (a test pins the plan).
pub(super) const UPDATE_STREAMS_SQL: &str = concat!(
    "UPDATE streams AS s SET tail = GREATEST(s.tail, v.tail), closed = s.closed OR v.close, ",
    "closed_by = COALESCE(v.closed_by, s.closed_by), stream_seq = COALESCE(v.seq, s.stream_seq), ",
    "last_access_ms = GREATEST(s.last_access_ms, v.ms), next_seq = GREATEST(s.next_seq, v.next_seq) ",
    "FROM UNNEST($1::bigint[], $2::bigint[], $3::boolean[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) ",
    "AS v(id, tail, close, closed_by, seq, ms, next_seq) WHERE s.id = v.id"
);

/// Access times: `$1` ids, `$2` times; a time never moves back.
pub(super) const TOUCH_SQL: &str = concat!(
    "UPDATE streams AS s SET last_access_ms = GREATEST(s.last_access_ms, v.ms) ",
    "FROM UNNEST($1::bigint[], $2::bigint[]) AS v(id, ms) WHERE s.id = v.id"
);

/// Applies durable WAL objects, in log order, in one transaction; idempotent, so
/// replaying an object twice changes nothing. New streams, chunk rows, stream
/// updates and producer stamps go in as one statement each per flush; the rare ops
/// (deletes, trims, relocations, tokens) land what is batched before them first.
///
/// For a cluster member (`member`), the batch also moves each log's
/// `members.applied_seq` (last, just before the commit), and only while the member
/// may index that log: its own while it runs, another's while it is the one
/// sealing it. Otherwise the whole batch is rolled back ([`EngineError::Fenced`]): a member whose log was taken over never writes
/// an older object's effects over what its successor indexed since. Members get
/// stream ids from the coordinator, so the single watermark and id are left alone.
pub(super) async fn apply(
    pool: &PgPool,
    objects: &[FlushedObject],
    member: Option<u64>,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    let mut next_id: Option<u64> = None;
    let mut pending = Pending::default();
    for object in objects {
        for chunk in &object.chunks {
            if let Some(row) = NewChunk::of(&object.key, chunk) {
                pending.flush_relocations(&mut tx).await?;
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
    match member {
        // Last, so the member row is locked only from here to the commit: the
        // lease renewal updates the same row and must not wait behind a batch.
        Some(me) => fence(&mut tx, me, objects).await?,
        None => set_state(&mut tx, objects.last(), next_id).await?,
    }
    tx.commit().await?;
    Ok(())
}

/// Moves `applied_seq` of each log in the batch, if `me` may index it; locks the
/// member rows until the batch commits, so a takeover that begins meanwhile waits
/// and reads where this batch ends, and one that began before fences the batch.
async fn fence(tx: &mut PgConnection, me: u64, objects: &[FlushedObject]) -> Result<()> {
    let mut next: Vec<(u64, u64)> = Vec::new();
    for o in objects {
        match next.last_mut() {
            Some((epoch, seq)) if *epoch == o.epoch => *seq = (*seq).max(o.seq + 1),
            _ => next.push((o.epoch, o.seq + 1)),
        }
    }
    for (epoch, seq) in next {
        let done = sqlx::query(
            "UPDATE members SET applied_seq = GREATEST(applied_seq, $3) \
             WHERE epoch = $2 AND ((epoch = $1 AND state IN ('live', 'draining')) \
             OR (state = 'sealing' AND sealer = $1))",
        )
        .bind(me as i64)
        .bind(epoch as i64)
        .bind(seq as i64)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(EngineError::Fenced);
        }
    }
    Ok(())
}

/// The watermark (past the last object) and the next stream id (which only grows),
/// in one statement.
async fn set_state(
    tx: &mut PgConnection,
    last: Option<&FlushedObject>,
    next_id: Option<u64>,
) -> Result<()> {
    let mut keys = Vec::new();
    let mut values = Vec::new();
    if let Some(last) = last {
        keys.extend(["applied_epoch", "applied_next_seq"]);
        values.extend([last.epoch as i64, (last.seq + 1) as i64]);
    }
    if let Some(next_id) = next_id {
        keys.push("next_stream_id");
        values.push(next_id as i64);
    }
    if keys.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO engine_state (key, value) SELECT * FROM UNNEST($1::text[], $2::bigint[])
         ON CONFLICT (key) DO UPDATE SET value = CASE WHEN engine_state.key = 'next_stream_id'
             THEN GREATEST(engine_state.value, excluded.value) ELSE excluded.value END",
    )
    .bind(keys)
    .bind(values)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// One op's effect: creates and appends are batched in `pending`; the rare ops land
/// everything batched before them first.
async fn apply_op<'a>(
    tx: &mut PgConnection,
    pending: &mut Pending<'a>,
    stream_id: u64,
    op: &'a Op,
) -> Result<()> {
    let id = stream_id as i64;
    match op {
        Op::Create(c) => {
            pending.flush_relocations(tx).await?;
            pending.creates.push(CreateRow::of(stream_id, c));
        }
        Op::Append(a) => {
            pending.flush_relocations(tx).await?;
            pending.runs.entry(stream_id).or_default().add(a);
        }
        // A pack or compaction round moves many streams' rows at once: consecutive
        // moves go together.
        Op::Relocate(r) => {
            pending.flush_rows(tx).await?;
            pending.relocations.push(r);
        }
        Op::Delete { soft } => {
            pending.flush(tx).await?;
            delete(tx, id, *soft).await?;
        }
        Op::Trim { before } => {
            // The tail it is clamped to must include this batch's appends.
            pending.flush(tx).await?;
            trim(tx, id, before.0 as i64).await?;
        }
        Op::SetRetention { secs } => {
            pending.flush(tx).await?;
            sqlx::query("UPDATE streams SET retention_secs = $1 WHERE id = $2")
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

/// Moves the start (never back, never past the tail) and drops the rows that end
/// at or below it; a row straddling the start stays (reads skip its head).
async fn trim(tx: &mut PgConnection, id: i64, before: i64) -> Result<()> {
    sqlx::query(
        "UPDATE streams SET start_pos = GREATEST(start_pos, LEAST($1, tail)) WHERE id = $2",
    )
    .bind(before)
    .bind(id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM chunks WHERE stream_id = $1 AND end_pos <= (SELECT start_pos FROM streams WHERE id = $1)")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A delete: soft keeps the rows for the stream's forks; hard removes them.
async fn delete(tx: &mut PgConnection, id: i64, soft: bool) -> Result<()> {
    if soft {
        sqlx::query("UPDATE streams SET soft_deleted = TRUE WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        return Ok(());
    }
    for table in [
        "DELETE FROM streams WHERE id = $1",
        "DELETE FROM chunks WHERE stream_id = $1",
        "DELETE FROM producers WHERE stream_id = $1",
    ] {
        sqlx::query(table).bind(id).execute(&mut *tx).await?;
    }
    Ok(())
}

/// Applies consecutive compaction moves, as if one after another: each replaces the
/// rows of its stream that start inside its span (an earlier move's row included)
/// with one row for its new chunk. A stream deleted since compaction read its rows
/// keeps nothing (ids are never reused, so the row would dangle), and a span
/// trimmed away since keeps nothing either. A move that a row reaches across
/// (`straddled`) is stale and lands nowhere. Four statements, whatever the number
/// of moves: one per move was most of the indexer's time while a pack moved
/// thousands of small streams at once.
async fn relocate(tx: &mut PgConnection, moves: &[&RelocateOp]) -> Result<()> {
    let mut ids: Vec<i64> = moves.iter().map(|r| r.stream_id as i64).collect();
    ids.sort_unstable();
    ids.dedup();
    let starts: HashMap<u64, u64> =
        sqlx::query("SELECT id, start_pos FROM streams WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| (row.get::<i64, _>(0) as u64, row.get::<i64, _>(1) as u64))
            .collect();
    // The rows that may reach into a span (those starting inside it, and the one
    // before it), each with the move that made it if one in this batch did. Kept
    // up to date move by move, so a move is judged against what the moves before
    // it in the batch left, and what is left of the moves is what gets inserted.
    let mut near: HashMap<u64, BTreeMap<u64, (u64, Option<&RelocateOp>)>> = HashMap::new();
    let [ids, from, to] = span_columns(moves);
    let found = sqlx::query(concat!(
        "SELECT c.stream_id, c.start_pos, c.end_pos ",
        "FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS v(id, s, e) ",
        "JOIN chunks c ON c.stream_id = v.id AND c.start_pos >= v.s AND c.start_pos < v.e ",
        "UNION SELECT v.id, p.start_pos, p.end_pos FROM UNNEST($1::bigint[], $2::bigint[]) AS v(id, s) ",
        "CROSS JOIN LATERAL (SELECT start_pos, end_pos FROM chunks ",
        "WHERE stream_id = v.id AND start_pos < v.s ORDER BY start_pos DESC LIMIT 1) p"
    ))
    .bind(ids)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *tx)
    .await?;
    for row in found {
        near.entry(row.get::<i64, _>(0) as u64).or_default().insert(
            row.get::<i64, _>(1) as u64,
            (row.get::<i64, _>(2) as u64, None),
        );
    }
    // The moves that apply, in order.
    let mut spans: Vec<&RelocateOp> = Vec::new();
    for &r in moves {
        match starts.get(&r.stream_id) {
            Some(&start) if r.end.0 > start => {}
            _ => continue,
        }
        let stream = near.entry(r.stream_id).or_default();
        if straddled(stream, r) {
            continue;
        }
        let inside: Vec<u64> = stream.range(r.start.0..r.end.0).map(|(s, _)| *s).collect();
        for s in inside {
            stream.remove(&s);
        }
        stream.insert(r.start.0, (r.end.0, Some(r)));
        spans.push(r);
    }
    if spans.is_empty() {
        return Ok(());
    }
    let [ids, from, to] = span_columns(&spans);
    sqlx::query(concat!(
        "DELETE FROM chunks c USING UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS v(id, s, e) ",
        "WHERE c.stream_id = v.id AND c.start_pos >= v.s AND c.start_pos < v.e"
    ))
    .bind(ids)
    .bind(from)
    .bind(to)
    .execute(&mut *tx)
    .await?;
    // The rows the moves leave, per stream in offset order.
    let mut rows: Vec<&RelocateOp> = near
        .into_values()
        .flat_map(|rows| rows.into_values().filter_map(|(_, r)| r))
        .collect();
    rows.sort_unstable_by_key(|r| (r.stream_id, r.start));
    let column = |f: fn(&RelocateOp) -> i64| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    sqlx::query(concat!(
        "INSERT INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq) ",
        "SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]) ",
        "ON CONFLICT (stream_id, start_pos) DO UPDATE SET end_pos = excluded.end_pos, object_key = excluded.object_key, ",
        "byte_start = excluded.byte_start, byte_end = excluded.byte_end, last_ts_ms = excluded.last_ts_ms, start_seq = excluded.start_seq"
    ))
    .bind(column(|r| r.stream_id as i64))
    .bind(column(|r| r.start.0 as i64))
    .bind(column(|r| r.end.0 as i64))
    .bind(rows.iter().map(|r| r.object_key.as_str()).collect::<Vec<_>>())
    .bind(column(|r| r.byte_range.start as i64))
    .bind(column(|r| r.byte_range.end as i64))
    .bind(column(|r| r.last_ts_ms as i64))
    .bind(column(|r| r.start_seq as i64))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Stream ids, span starts and span ends of `moves`, as three arrays to bind.
fn span_columns(moves: &[&RelocateOp]) -> [Vec<i64>; 3] {
    [
        moves.iter().map(|r| r.stream_id as i64).collect(),
        moves.iter().map(|r| r.start.0 as i64).collect(),
        moves.iter().map(|r| r.end.0 as i64).collect(),
    ]
}

/// Rows of a batch not yet written. `flush` writes them in dependency order: new
/// streams, then chunks, then the stream updates (an update needs its row), then
/// producer stamps.
#[derive(Default)]
struct Pending<'a> {
    creates: Vec<CreateRow<'a>>,
    chunks: Vec<NewChunk<'a>>,
    runs: HashMap<u64, AppendRun<'a>>,
    /// Consecutive compaction moves; never held together with rows of the other
    /// kinds, so everything lands in log order.
    relocations: Vec<&'a RelocateOp>,
}

impl Pending<'_> {
    async fn flush(&mut self, tx: &mut PgConnection) -> Result<()> {
        self.flush_relocations(tx).await?;
        self.flush_rows(tx).await
    }

    async fn flush_relocations(&mut self, tx: &mut PgConnection) -> Result<()> {
        if !self.relocations.is_empty() {
            relocate(tx, &std::mem::take(&mut self.relocations)).await?;
        }
        Ok(())
    }

    async fn flush_rows(&mut self, tx: &mut PgConnection) -> Result<()> {
        if !self.creates.is_empty() {
            insert_streams(tx, &std::mem::take(&mut self.creates)).await?;
        }
        if !self.chunks.is_empty() {
            upsert_chunks(tx, &std::mem::take(&mut self.chunks)).await?;
        }
        if !self.runs.is_empty() {
            // In id order, as `touch` locks them: two statements never wait on each
            // other's rows in opposite orders.
            let mut runs: Vec<(u64, AppendRun)> = self.runs.drain().collect();
            runs.sort_unstable_by_key(|(id, _)| *id);
            update_streams(tx, &runs).await?;
            upsert_producers(tx, &runs).await?;
        }
        Ok(())
    }
}

/// New `streams` rows; one already there (a replay) is left as it is.
async fn insert_streams(tx: &mut PgConnection, rows: &[CreateRow<'_>]) -> Result<()> {
    let column = |f: fn(&CreateRow) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
    sqlx::query(concat!(
        "INSERT INTO streams (id, name, content_type, created_ms, ttl_secs, expires_at, expires_at_ms, ",
        "fork_source, fork_point, fork_requested, fork_sub_offset, tail, last_access_ms, next_seq, fork_point_seq) ",
        "SELECT id, name, content_type, created_ms, ttl_secs, expires_at, expires_at_ms, ",
        "fork_source, fork_point, fork_requested, fork_sub_offset, tail, created_ms, next_seq, fork_point_seq ",
        "FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[], ",
        "$8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[]) ",
        "AS v(id, name, content_type, created_ms, ttl_secs, expires_at, expires_at_ms, ",
        "fork_source, fork_point, fork_requested, fork_sub_offset, tail, next_seq, fork_point_seq) ",
        "ON CONFLICT DO NOTHING"
    ))
    .bind(rows.iter().map(|c| c.id).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.name).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.content_type).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.created_ms).collect::<Vec<_>>())
    .bind(column(|c| c.ttl_secs))
    .bind(rows.iter().map(|c| c.expires_at).collect::<Vec<_>>())
    .bind(column(|c| {
        c.expires_at
            .and_then(parse_rfc3339_ms)
            .map(|ms| ms.min(i64::MAX as u64) as i64)
    }))
    .bind(column(|c| c.fork_source))
    .bind(column(|c| c.fork_point))
    .bind(column(|c| c.fork_requested))
    .bind(rows.iter().map(|c| c.fork_sub_offset).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.tail).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.next_seq).collect::<Vec<_>>())
    .bind(rows.iter().map(|c| c.fork_point_seq).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// `chunks` rows; one already there (a WAL object indexed again after a restart)
/// is replaced. A batch may carry the same row twice (an object replayed within
/// it): the later one wins, as it would applied one by one, and an upsert may
/// touch a row only once per statement.
async fn upsert_chunks(tx: &mut PgConnection, rows: &[NewChunk<'_>]) -> Result<()> {
    let mut last: HashMap<(i64, i64), usize> = HashMap::with_capacity(rows.len());
    for (i, c) in rows.iter().enumerate() {
        last.insert((c.stream_id, c.start), i);
    }
    let mut kept: Vec<&NewChunk> = last.into_values().map(|i| &rows[i]).collect();
    kept.sort_unstable_by_key(|c| (c.stream_id, c.start));
    let column = |f: fn(&NewChunk) -> i64| kept.iter().map(|c| f(c)).collect::<Vec<_>>();
    sqlx::query(concat!(
        "INSERT INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq) ",
        "SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]) ",
        "ON CONFLICT (stream_id, start_pos) DO UPDATE SET end_pos = excluded.end_pos, object_key = excluded.object_key, ",
        "byte_start = excluded.byte_start, byte_end = excluded.byte_end, last_ts_ms = excluded.last_ts_ms, start_seq = excluded.start_seq"
    ))
    .bind(column(|c| c.stream_id))
    .bind(column(|c| c.start))
    .bind(column(|c| c.end))
    .bind(kept.iter().map(|c| c.key).collect::<Vec<_>>())
    .bind(column(|c| c.byte_start))
    .bind(column(|c| c.byte_end))
    .bind(column(|c| c.last_ts_ms))
    .bind(column(|c| c.start_seq))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// One update of every stream the batch appended to (ids unique, in order).
async fn update_streams(tx: &mut PgConnection, runs: &[(u64, AppendRun<'_>)]) -> Result<()> {
    sqlx::query(UPDATE_STREAMS_SQL)
        .bind(runs.iter().map(|(id, _)| *id as i64).collect::<Vec<_>>())
        .bind(runs.iter().map(|(_, r)| r.end as i64).collect::<Vec<_>>())
        .bind(runs.iter().map(|(_, r)| r.close).collect::<Vec<_>>())
        .bind(
            runs.iter()
                .map(|(_, r)| r.closed_by.map(encode_stamp))
                .collect::<Vec<_>>(),
        )
        .bind(runs.iter().map(|(_, r)| r.stream_seq).collect::<Vec<_>>())
        .bind(
            runs.iter()
                .map(|(_, r)| r.written_ms as i64)
                .collect::<Vec<_>>(),
        )
        .bind(
            runs.iter()
                .map(|(_, r)| r.end_seq as i64)
                .collect::<Vec<_>>(),
        )
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Each producer's last stamp on each stream of the batch.
async fn upsert_producers(tx: &mut PgConnection, runs: &[(u64, AppendRun<'_>)]) -> Result<()> {
    let stamps: Vec<(i64, &crate::wal::format::ProducerStamp)> = runs
        .iter()
        .flat_map(|(id, r)| r.producers.iter().map(move |p| (*id as i64, *p)))
        .collect();
    if stamps.is_empty() {
        return Ok(());
    }
    sqlx::query(concat!(
        "INSERT INTO producers (stream_id, producer_id, epoch, last_seq) ",
        "SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::bigint[]) ",
        "ON CONFLICT (stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq"
    ))
    .bind(stamps.iter().map(|(id, _)| *id).collect::<Vec<_>>())
    .bind(stamps.iter().map(|(_, p)| p.id.as_str()).collect::<Vec<_>>())
    .bind(stamps.iter().map(|(_, p)| p.epoch as i64).collect::<Vec<_>>())
    .bind(stamps.iter().map(|(_, p)| p.seq as i64).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Records `(stream id, last access ms)` of streams leaving memory: the latest time
/// per stream, never moving one back, `TOUCH_GROUP` streams per statement in id
/// order.
pub(super) async fn touch(pool: &PgPool, updates: &[(u64, u64)]) -> Result<()> {
    let mut latest: HashMap<u64, u64> = HashMap::with_capacity(updates.len());
    for &(id, ms) in updates {
        let e = latest.entry(id).or_insert(ms);
        *e = (*e).max(ms);
    }
    let mut latest: Vec<(u64, u64)> = latest.into_iter().collect();
    latest.sort_unstable();
    for group in latest.chunks(TOUCH_GROUP) {
        sqlx::query(TOUCH_SQL)
            .bind(group.iter().map(|(id, _)| *id as i64).collect::<Vec<_>>())
            .bind(group.iter().map(|(_, ms)| *ms as i64).collect::<Vec<_>>())
            .execute(pool)
            .await?;
    }
    Ok(())
}
