//! Moving a single node's streams into a cluster (`picomq store move-to-postgres`):
//! its metadata, a SQLite index of its bucket prefix, copied into a Postgres
//! database, and the prefix bound to that database, so that cluster members started
//! on the two serve every stream the single node served, as it left them.
//!
//! The steps, in order:
//! 1. [`plan`] checks, writing nothing: the SQLite and the prefix belong to each
//!    other (as a start of the single node would judge them), no member of the
//!    database is alive, and the database holds nothing (or only an unfinished move
//!    of this very prefix, see below). The caller holds the data directory's lock,
//!    so the single node is not running.
//! 2. The single node's own recovery, against its SQLite: it claims an epoch above
//!    every one in the bucket, replays every WAL object past the index's watermark
//!    (what a `kill -9` left acknowledged but not yet indexed), and seals every
//!    log. No earlier incarnation can make another write durable after that, and
//!    every write one acknowledged is in the SQLite.
//! 3. One Postgres transaction: every row (streams with all their state, index
//!    rows, producers, tokens, server keys), a finished member (`left`, fully
//!    indexed) for every epoch up to the one recovery claimed, so that no member
//!    replays, takes over or refuses those logs and every epoch claimed later is
//!    above them, the stream id allocator past every id, and the database's binding
//!    to the prefix.
//! 4. The prefix's `identity.json` rewritten to name the database.
//!
//! Until step 4 the prefix still says it is a single node's, so cluster members are
//! refused and the single node could start again. A move that failed between 3 and
//! 4 leaves the database bound to this prefix: run again, it empties and copies it
//! anew (the single node may have written since), in one transaction again. After 4
//! the move reports itself done. Rows are copied as they are (nothing is re-derived
//! from the WAL); what the single node's SQLite held beyond WAL effects (access
//! times) comes along too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use sqlx::{PgConnection, Row, SqlitePool};

use crate::background::gc::{is_seal, SEAL_BYTES_MAX};
use crate::error::{EngineError, Result};
use crate::identity::{self, Binding, MetaIdentity};
use crate::layout;
use crate::meta::{Meta, PostgresMeta, SqliteMeta, Watermark};
use crate::units::parse_rfc3339_ms;

/// The node id of the members a move records for the single node's logs.
pub const MOVED_NODE_ID: &str = "single-node (moved)";

/// Rows copied per statement.
const PAGE: i64 = 2_000;

/// Key of the advisory lock a move holds for its transaction ("picomq" and a 2):
/// two moves onto one database run one after the other, and the second finds the
/// database taken.
const MOVE_LOCK: i64 = 0x7069_636f_6d71_0002;

/// The tables of a single node's SQLite (migrations 1 to 7). A table not listed
/// here is refused, not silently left behind: a migration that adds one must teach
/// the move to copy it.
const SQLITE_TABLES: &[&str] = &[
    "streams",
    "chunks",
    "producers",
    "engine_state",
    "tokens",
    "server_keys",
    "registry",
    "registry_state",
    "identity",
    "schema_version",
];

/// Tables of the cluster's database that a move fills, and that must be empty
/// before it (the rest are the cluster's own: slots, jobs, ids, its key).
const TARGET_TABLES: &[&str] = &[
    "streams",
    "chunks",
    "producers",
    "tokens",
    "server_keys",
    "registry",
    "members",
    "engine_state",
];

/// The single node: its store (as `picomq serve` opens it, `--wal-store` routed),
/// the store's name (`store::name`) and its SQLite.
pub struct Source {
    pub store: Arc<dyn ObjectStore>,
    pub store_name: String,
    pub sqlite: SqliteMeta,
}

/// Where the move stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The database is empty and unbound: everything is to do.
    Fresh,
    /// The database is bound to this prefix by a move whose last step (the prefix's
    /// identity) did not happen: its rows are copied anew.
    Unfinished,
    /// The prefix already names the database: nothing to do.
    Done,
}

/// What the single node's metadata holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Streams that exist for clients.
    pub streams: u64,
    /// Soft-deleted streams kept for their forks.
    pub soft_deleted: u64,
    pub closed: u64,
    pub forks: u64,
    /// Streams with a TTL or an Expires-At.
    pub expiring: u64,
    pub index_rows: u64,
    pub producers: u64,
    pub tokens: u64,
    pub server_keys: u64,
    /// Schema registry rows (schemas, versions, settings, bindings).
    pub registry_rows: u64,
}

/// `n` and `word`, with an `s` unless `n` is 1.
fn count_of(n: u64, word: &str) -> String {
    match n {
        1 => format!("1 {word}"),
        n => format!("{n} {word}s"),
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} closed, {}, {} with a TTL or Expires-At, {} soft-deleted kept for their forks), {}, {}, {}, {}, {}",
            count_of(self.streams, "stream"),
            self.closed,
            count_of(self.forks, "fork"),
            self.expiring,
            self.soft_deleted,
            count_of(self.index_rows, "index row"),
            count_of(self.producers, "producer"),
            count_of(self.tokens, "token"),
            count_of(self.server_keys, "server key"),
            count_of(self.registry_rows, "registry row")
        )
    }
}

/// What a move would do, judged without writing anything.
#[derive(Clone, Debug)]
pub struct Plan {
    pub stage: Stage,
    pub single: MetaIdentity,
    pub target: MetaIdentity,
    /// The prefix's cluster id (new if neither side has one yet).
    pub cluster_id: Option<String>,
    pub counts: Counts,
    /// Epochs claimed in the bucket so far.
    pub epochs: Vec<u64>,
    /// The SQLite's watermark, and the WAL objects past it (not indexed yet:
    /// recovery indexes them before anything is copied).
    pub watermark: Option<Watermark>,
    pub unindexed: u64,
}

/// What a move did.
#[derive(Clone, Debug)]
pub struct Moved {
    /// The epoch recovery claimed (every log at or below it is finished).
    pub epoch: u64,
    pub replayed: u64,
    pub restored_checkpoint: bool,
    pub counts: Counts,
    /// The finished members recorded: `(epoch, next sequence of its log)`.
    pub members: Vec<(u64, u64)>,
    pub binding: Binding,
}

fn refusal(msg: String) -> EngineError {
    EngineError::conflict(format!(
        "refusing to move: {msg} (see \"Deliberate moves\" in docs/cluster.md)"
    ))
}

/// Checks everything a move needs, writing nothing, and says what it would do.
pub async fn plan(src: &Source, dst: &PostgresMeta) -> Result<Plan> {
    let pg = Meta::from_store(Arc::new(dst.clone()));
    let target = pg.identity().await?;
    let target_words = format!("postgres metadata {}", target.meta_id);
    let mut conn = dst.pool().acquire().await?;
    refuse_alive(&mut conn, &target_words).await?;
    let sqlite = Meta::from_store(Arc::new(src.sqlite.clone()));
    let single = sqlite.identity().await?;
    check_sqlite_tables(src.sqlite.pool()).await?;
    let found = identity::read(&*src.store).await?;
    let store_name = &src.store_name;
    let done = match &found {
        Some(f) if f.meta_kind == "postgres" => {
            if f.meta_id != target.meta_id || target.cluster_id.as_ref() != Some(&f.cluster_id) {
                return Err(refusal(format!(
                    "--store {store_name} belongs to cluster {} (postgres metadata {}) already: it is a cluster's prefix, not a single node's",
                    f.cluster_id, f.meta_id
                )));
            }
            true
        }
        _ => false,
    };
    let cluster_id = found
        .as_ref()
        .map(|f| f.cluster_id.clone())
        .or_else(|| single.cluster_id.clone());
    let stage = if done {
        Stage::Done
    } else {
        let (_, why) = identity::check(&*src.store, &sqlite, store_name).await?;
        if let Some(why) = why {
            return Err(refusal(format!(
                "the single node's metadata and --store do not belong to each other: {why}"
            )));
        }
        stage_of(
            &mut conn,
            cluster_id.as_deref(),
            store_name,
            &target_words,
            false,
        )
        .await?
    };
    drop(conn);
    let watermark = sqlite.watermark().await?;
    let unindexed = match stage {
        Stage::Done => 0,
        _ => past_watermark(&*src.store, watermark).await?,
    };
    Ok(Plan {
        stage,
        single,
        target,
        cluster_id,
        counts: counts(src.sqlite.pool()).await?,
        epochs: crate::fencing::list_claims(&*src.store).await?,
        watermark,
        unindexed,
    })
}

/// Moves the single node into the database: [`plan`], then recovery, the copy and
/// the binding (see the module's documentation). `None` when it was done already.
pub async fn run(src: &Source, dst: &PostgresMeta) -> Result<Option<Moved>> {
    let planned = plan(src, dst).await?;
    if planned.stage == Stage::Done {
        return Ok(None);
    }
    let sqlite = Meta::from_store(Arc::new(src.sqlite.clone()));
    // What every start of the single node does first: bind, then recover.
    identity::bind(&*src.store, &sqlite, &src.store_name).await?;
    let recovered = crate::recovery::recover(&*src.store, &sqlite).await?;
    tracing::info!(
        epoch = recovered.epoch,
        replayed = recovered.objects_replayed,
        "the single node's metadata is up to date with its store"
    );
    let members = finished_logs(&*src.store, recovered.epoch).await?;
    let cluster_id = sqlite.identity().await?.cluster_id.ok_or_else(|| {
        EngineError::Internal("the single node's metadata was not bound after its start".into())
    })?;
    let counts = copy(
        src.sqlite.pool(),
        dst,
        &cluster_id,
        &src.store_name,
        &members,
    )
    .await?;
    let pg = Meta::from_store(Arc::new(dst.clone()));
    let binding = identity::rebind(&*src.store, &pg, &src.store_name).await?;
    Ok(Some(Moved {
        epoch: recovered.epoch,
        replayed: recovered.objects_replayed,
        restored_checkpoint: recovered.restored_from.is_some(),
        counts,
        members,
        binding,
    }))
}

/// Refuses while a member of the database holds its lease.
async fn refuse_alive(conn: &mut PgConnection, target: &str) -> Result<()> {
    let rows = sqlx::query(
        "SELECT node_id, epoch FROM members WHERE state IN ('live', 'draining') \
         AND lease_expires > now() ORDER BY epoch",
    )
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let alive: Vec<String> = rows
        .iter()
        .map(|r| format!("{} (epoch {})", r.get::<String, _>(0), r.get::<i64, _>(1)))
        .collect();
    Err(refusal(format!(
        "nodes still run on {target} ({}): a move needs a database no node serves; stop them, or use a new database",
        alive.join(", ")
    )))
}

/// Where the database stands for a move of the prefix `store_name` (of cluster
/// `cluster_id`, if it has one yet). `lock`: inside the move's transaction, which
/// holds the identity row until it commits.
async fn stage_of(
    conn: &mut PgConnection,
    cluster_id: Option<&str>,
    store_name: &str,
    target: &str,
    lock: bool,
) -> Result<Stage> {
    let sql = match lock {
        true => "SELECT cluster_id, store FROM identity WHERE one = 1 FOR UPDATE",
        false => "SELECT cluster_id, store FROM identity WHERE one = 1",
    };
    let row = sqlx::query(sql).fetch_one(&mut *conn).await?;
    let (bound, bound_at): (Option<String>, Option<String>) = (row.get(0), row.get(1));
    match bound {
        None => {
            let held = held(&mut *conn).await?;
            if !held.is_empty() {
                return Err(refusal(format!(
                    "{target} is not empty ({}): a move needs a new database, or one no node ever served",
                    held.join(", ")
                )));
            }
            Ok(Stage::Fresh)
        }
        Some(bound)
            if Some(bound.as_str()) == cluster_id && bound_at.as_deref() == Some(store_name) =>
        {
            // Bound by an earlier move of this prefix that did not finish: nothing
            // but that move's members may be there (the prefix refused every node).
            let others: i64 = sqlx::query("SELECT COUNT(*) FROM members WHERE node_id <> $1")
                .bind(MOVED_NODE_ID)
                .fetch_one(&mut *conn)
                .await?
                .get(0);
            if others > 0 {
                return Err(refusal(format!(
                    "{target} is bound to this prefix and cluster nodes have joined it: it is not an unfinished move"
                )));
            }
            Ok(Stage::Unfinished)
        }
        Some(bound) => Err(refusal(format!(
            "{target} is bound to cluster {bound} at store {}: a move needs a new database",
            bound_at.as_deref().unwrap_or("?")
        ))),
    }
}

/// The target tables holding rows, with how many.
async fn held(conn: &mut PgConnection) -> Result<Vec<String>> {
    let mut held = Vec::new();
    for table in TARGET_TABLES {
        // Names from the list above, not from input.
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let n: i64 = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut *conn)
            .await?
            .get(0);
        if n > 0 {
            held.push(format!("{n} rows in {table}"));
        }
    }
    Ok(held)
}

/// Refuses a SQLite with a table this version does not know how to move.
async fn check_sqlite_tables(pool: &SqlitePool) -> Result<()> {
    let rows = sqlx::query(
        "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    let unknown: Vec<String> = rows
        .iter()
        .map(|r| r.get::<String, _>(0))
        .filter(|t| !SQLITE_TABLES.contains(&t.as_str()))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(refusal(format!(
        "the single node's metadata has tables this version cannot move ({}): use the picomq version that wrote it",
        unknown.join(", ")
    )))
}

async fn count(pool: &SqlitePool, sql: &'static str) -> Result<u64> {
    let n: i64 = sqlx::query(sql).fetch_one(pool).await?.get(0);
    Ok(n as u64)
}

async fn counts(pool: &SqlitePool) -> Result<Counts> {
    Ok(Counts {
        streams: count(pool, "SELECT COUNT(*) FROM streams WHERE soft_deleted = 0").await?,
        soft_deleted: count(pool, "SELECT COUNT(*) FROM streams WHERE soft_deleted <> 0").await?,
        closed: count(
            pool,
            "SELECT COUNT(*) FROM streams WHERE closed <> 0 AND soft_deleted = 0",
        )
        .await?,
        forks: count(
            pool,
            "SELECT COUNT(*) FROM streams WHERE fork_source IS NOT NULL AND soft_deleted = 0",
        )
        .await?,
        expiring: count(
            pool,
            "SELECT COUNT(*) FROM streams WHERE (ttl_secs IS NOT NULL OR expires_at IS NOT NULL) AND soft_deleted = 0",
        )
        .await?,
        index_rows: count(pool, "SELECT COUNT(*) FROM chunks").await?,
        producers: count(pool, "SELECT COUNT(*) FROM producers").await?,
        tokens: count(pool, "SELECT COUNT(*) FROM tokens").await?,
        server_keys: count(pool, "SELECT COUNT(*) FROM server_keys").await?,
        registry_rows: count(pool, "SELECT COUNT(*) FROM registry").await?,
    })
}

/// WAL objects at or past `watermark` that are not seals: acknowledged (or at
/// least durable) writes the SQLite does not hold yet.
async fn past_watermark(store: &dyn ObjectStore, watermark: Option<Watermark>) -> Result<u64> {
    let from = watermark.map_or((0, 0), |w| (w.epoch, w.next_seq));
    let mut n = 0;
    let mut listing = store.list(Some(&Path::from(layout::WAL)));
    while let Some(object) = listing.try_next().await? {
        let Some(at) = layout::parse_wal_key(object.location.as_ref()) else {
            continue;
        };
        if at < from {
            continue;
        }
        if object.size <= SEAL_BYTES_MAX && is_seal(store, &object.location).await? {
            continue;
        }
        n += 1;
    }
    Ok(n)
}

/// Every epoch of the prefix up to `claimed` (its claims, and the epochs of its
/// logs and compacted objects), each with the next sequence of its log: the number
/// of its seal (recovery sealed every log below `claimed`), 0 for an epoch that
/// never wrote.
async fn finished_logs(store: &dyn ObjectStore, claimed: u64) -> Result<Vec<(u64, u64)>> {
    let mut epochs: BTreeMap<u64, u64> = BTreeMap::new();
    for e in crate::fencing::list_claims(store).await? {
        epochs.insert(e, 0);
    }
    let mut seals: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut listing = store.list(Some(&Path::from(layout::WAL)));
    while let Some(object) = listing.try_next().await? {
        let Some((e, seq)) = layout::parse_wal_key(object.location.as_ref()) else {
            continue;
        };
        let next = epochs.entry(e).or_insert(0);
        *next = (*next).max(seq + 1);
        if object.size <= SEAL_BYTES_MAX && is_seal(store, &object.location).await? {
            seals.entry(e).or_default().insert(seq);
        }
    }
    let mut listing = store.list(Some(&Path::from(layout::SEGMENTS)));
    while let Some(object) = listing.try_next().await? {
        if let Some((e, _)) = layout::parse_segment_key(object.location.as_ref()) {
            epochs.entry(e).or_insert(0);
        }
    }
    if let Some((&e, _)) = epochs.range(claimed + 1..).next() {
        return Err(EngineError::Unavailable(format!(
            "epoch {e} appeared in the store above the one this move claimed ({claimed}): a node started on it meanwhile; stop it and run the move again"
        )));
    }
    Ok(epochs
        .into_iter()
        .map(|(e, next)| {
            (
                e,
                seals
                    .get(&e)
                    .and_then(|s| s.first().copied())
                    .unwrap_or(next),
            )
        })
        .collect())
}

/// Copies every row of the SQLite at `sqlite` into the database in one transaction,
/// with the finished `members` and the database bound to `cluster_id` at
/// `store_name`. Re-judges the database first, under the move's lock.
async fn copy(
    sqlite: &SqlitePool,
    dst: &PostgresMeta,
    cluster_id: &str,
    store_name: &str,
    members: &[(u64, u64)],
) -> Result<Counts> {
    let pg = Meta::from_store(Arc::new(dst.clone()));
    let target_words = format!("postgres metadata {}", pg.identity().await?.meta_id);
    let mut tx = dst.pool().begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MOVE_LOCK)
        .execute(&mut *tx)
        .await?;
    let stage = stage_of(&mut tx, Some(cluster_id), store_name, &target_words, true).await?;
    refuse_alive(&mut tx, &target_words).await?;
    if stage == Stage::Unfinished {
        for table in TARGET_TABLES {
            // Names from the list above, not from input.
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                .execute(&mut *tx)
                .await?;
        }
    }
    let max_id = copy_streams(sqlite, &mut tx).await?;
    copy_chunks(sqlite, &mut tx).await?;
    copy_producers(sqlite, &mut tx).await?;
    copy_tokens(sqlite, &mut tx).await?;
    sqlx::query(
        "INSERT INTO members (epoch, node_id, advertise, state, lease_expires, applied_seq) \
         SELECT e, $3, '', 'left', now(), s FROM UNNEST($1::bigint[], $2::bigint[]) AS v(e, s)",
    )
    .bind(members.iter().map(|(e, _)| *e as i64).collect::<Vec<_>>())
    .bind(members.iter().map(|(_, s)| *s as i64).collect::<Vec<_>>())
    .bind(MOVED_NODE_ID)
    .execute(&mut *tx)
    .await?;
    let next_id: Option<i64> =
        sqlx::query("SELECT value FROM engine_state WHERE key = 'next_stream_id'")
            .fetch_optional(sqlite)
            .await?
            .map(|r| r.get(0));
    let next_id = next_id.unwrap_or(1).max(max_id + 1);
    sqlx::query("UPDATE stream_ids SET next = GREATEST(next, $1)")
        .bind(next_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE identity SET cluster_id = $1, store = $2, bound_at = now() WHERE one = 1")
        .bind(cluster_id)
        .bind(store_name)
        .execute(&mut *tx)
        .await?;
    // Counted inside the transaction: exactly what it commits.
    let copied = Counts {
        streams: pg_count(&mut tx, "SELECT COUNT(*) FROM streams WHERE NOT soft_deleted").await?,
        soft_deleted: pg_count(&mut tx, "SELECT COUNT(*) FROM streams WHERE soft_deleted").await?,
        closed: pg_count(
            &mut tx,
            "SELECT COUNT(*) FROM streams WHERE closed AND NOT soft_deleted",
        )
        .await?,
        forks: pg_count(
            &mut tx,
            "SELECT COUNT(*) FROM streams WHERE fork_source IS NOT NULL AND NOT soft_deleted",
        )
        .await?,
        expiring: pg_count(
            &mut tx,
            "SELECT COUNT(*) FROM streams WHERE (ttl_secs IS NOT NULL OR expires_at IS NOT NULL) AND NOT soft_deleted",
        )
        .await?,
        index_rows: pg_count(&mut tx, "SELECT COUNT(*) FROM chunks").await?,
        producers: pg_count(&mut tx, "SELECT COUNT(*) FROM producers").await?,
        tokens: pg_count(&mut tx, "SELECT COUNT(*) FROM tokens").await?,
        server_keys: pg_count(&mut tx, "SELECT COUNT(*) FROM server_keys").await?,
        registry_rows: pg_count(&mut tx, "SELECT COUNT(*) FROM registry").await?,
    };
    let expected = counts(sqlite).await?;
    if copied != expected {
        return Err(EngineError::Internal(format!(
            "the copy does not match the single node's metadata (copied {copied}; it holds {expected}): nothing was committed"
        )));
    }
    tx.commit().await?;
    Ok(copied)
}

async fn pg_count(conn: &mut PgConnection, sql: &'static str) -> Result<u64> {
    let n: i64 = sqlx::query(sql).fetch_one(&mut *conn).await?.get(0);
    Ok(n as u64)
}

/// Every `streams` row, in pages by id; returns the highest id (0: none).
async fn copy_streams(sqlite: &SqlitePool, tx: &mut PgConnection) -> Result<i64> {
    let mut after = i64::MIN;
    loop {
        let rows = sqlx::query(
            "SELECT id, name, content_type, created_ms, ttl_secs, expires_at, fork_source, fork_point, \
             fork_requested, fork_sub_offset, tail, closed, closed_by, stream_seq, soft_deleted, \
             last_access_ms, start_pos, retention_secs, next_seq, fork_point_seq \
             FROM streams WHERE id > ? ORDER BY id LIMIT ?",
        )
        .bind(after)
        .bind(PAGE)
        .fetch_all(sqlite)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(after.max(0));
        };
        after = last.get(0);
        let int = |i: usize| rows.iter().map(|r| r.get::<i64, _>(i)).collect::<Vec<_>>();
        let opt = |i: usize| {
            rows.iter()
                .map(|r| r.get::<Option<i64>, _>(i))
                .collect::<Vec<_>>()
        };
        let text = |i: usize| {
            rows.iter()
                .map(|r| r.get::<String, _>(i))
                .collect::<Vec<_>>()
        };
        let opt_text = |i: usize| {
            rows.iter()
                .map(|r| r.get::<Option<String>, _>(i))
                .collect::<Vec<_>>()
        };
        let flag = |i: usize| {
            rows.iter()
                .map(|r| r.get::<i64, _>(i) != 0)
                .collect::<Vec<_>>()
        };
        // As `apply` does for a create: the Expires-At instant, parsed once.
        let expires_at = opt_text(5);
        let expires_at_ms: Vec<Option<i64>> = expires_at
            .iter()
            .map(|e| {
                e.as_deref()
                    .and_then(parse_rfc3339_ms)
                    .map(|ms| ms.min(i64::MAX as u64) as i64)
            })
            .collect();
        sqlx::query(concat!(
            "INSERT INTO streams (id, name, content_type, created_ms, ttl_secs, expires_at, expires_at_ms, ",
            "fork_source, fork_point, fork_requested, fork_sub_offset, tail, closed, closed_by, stream_seq, ",
            "soft_deleted, last_access_ms, start_pos, retention_secs, next_seq, fork_point_seq) ",
            "SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], ",
            "$6::text[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], ",
            "$12::bigint[], $13::boolean[], $14::text[], $15::text[], $16::boolean[], $17::bigint[], ",
            "$18::bigint[], $19::bigint[], $20::bigint[], $21::bigint[])"
        ))
        .bind(int(0))
        .bind(text(1))
        .bind(text(2))
        .bind(int(3))
        .bind(opt(4))
        .bind(expires_at)
        .bind(expires_at_ms)
        .bind(opt(6))
        .bind(opt(7))
        .bind(opt(8))
        .bind(int(9))
        .bind(int(10))
        .bind(flag(11))
        .bind(opt_text(12))
        .bind(opt_text(13))
        .bind(flag(14))
        .bind(int(15))
        .bind(int(16))
        .bind(opt(17))
        .bind(int(18))
        .bind(int(19))
        .execute(&mut *tx)
        .await?;
    }
}

/// Every `chunks` row, in pages by primary key.
async fn copy_chunks(sqlite: &SqlitePool, tx: &mut PgConnection) -> Result<()> {
    let (mut after_id, mut after_start) = (i64::MIN, i64::MIN);
    loop {
        let rows = sqlx::query(
            "SELECT stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq \
             FROM chunks WHERE (stream_id, start_pos) > (?, ?) ORDER BY stream_id, start_pos LIMIT ?",
        )
        .bind(after_id)
        .bind(after_start)
        .bind(PAGE)
        .fetch_all(sqlite)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        (after_id, after_start) = (last.get(0), last.get(1));
        let int = |i: usize| rows.iter().map(|r| r.get::<i64, _>(i)).collect::<Vec<_>>();
        sqlx::query(concat!(
            "INSERT INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms, start_seq) ",
            "SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], ",
            "$6::bigint[], $7::bigint[], $8::bigint[])"
        ))
        .bind(int(0))
        .bind(int(1))
        .bind(int(2))
        .bind(rows.iter().map(|r| r.get::<String, _>(3)).collect::<Vec<_>>())
        .bind(int(4))
        .bind(int(5))
        .bind(int(6))
        .bind(int(7))
        .execute(&mut *tx)
        .await?;
    }
}

/// Every `producers` row (each producer's last stamp per stream), in pages.
async fn copy_producers(sqlite: &SqlitePool, tx: &mut PgConnection) -> Result<()> {
    let (mut after_id, mut after_producer) = (i64::MIN, String::new());
    loop {
        let rows = sqlx::query(
            "SELECT stream_id, producer_id, epoch, last_seq FROM producers \
             WHERE (stream_id, producer_id) > (?, ?) ORDER BY stream_id, producer_id LIMIT ?",
        )
        .bind(after_id)
        .bind(&after_producer)
        .bind(PAGE)
        .fetch_all(sqlite)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        (after_id, after_producer) = (last.get(0), last.get(1));
        let int = |i: usize| rows.iter().map(|r| r.get::<i64, _>(i)).collect::<Vec<_>>();
        sqlx::query(
            "INSERT INTO producers (stream_id, producer_id, epoch, last_seq) \
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::bigint[])",
        )
        .bind(int(0))
        .bind(
            rows.iter()
                .map(|r| r.get::<String, _>(1))
                .collect::<Vec<_>>(),
        )
        .bind(int(2))
        .bind(int(3))
        .execute(&mut *tx)
        .await?;
    }
}

/// Every token (revoked ones too: they stay a record) and server key.
async fn copy_tokens(sqlite: &SqlitePool, tx: &mut PgConnection) -> Result<()> {
    let tokens = sqlx::query(
        "SELECT id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms FROM tokens ORDER BY id",
    )
    .fetch_all(sqlite)
    .await?;
    for t in &tokens {
        sqlx::query(
            "INSERT INTO tokens (id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(t.get::<String, _>(0))
        .bind(t.get::<Vec<u8>, _>(1))
        .bind(t.get::<Option<String>, _>(2))
        .bind(t.get::<String, _>(3))
        .bind(t.get::<String, _>(4))
        .bind(t.get::<String, _>(5))
        .bind(t.get::<i64, _>(6))
        .bind(t.get::<Option<i64>, _>(7))
        .bind(t.get::<Option<i64>, _>(8))
        .execute(&mut *tx)
        .await?;
    }
    let keys = sqlx::query("SELECT name, key FROM server_keys ORDER BY name")
        .fetch_all(sqlite)
        .await?;
    for k in &keys {
        sqlx::query("INSERT INTO server_keys (name, key) VALUES ($1, $2)")
            .bind(k.get::<String, _>(0))
            .bind(k.get::<Vec<u8>, _>(1))
            .execute(&mut *tx)
            .await?;
    }
    copy_registry(sqlite, tx).await
}

/// Every schema registry row; the cluster's id sequence continues past the
/// largest schema id, so no id is drawn twice.
async fn copy_registry(sqlite: &SqlitePool, tx: &mut PgConnection) -> Result<()> {
    let rows = sqlx::query("SELECT tbl, key, value FROM registry ORDER BY tbl, key")
        .fetch_all(sqlite)
        .await?;
    let mut max_id = 0i64;
    for r in &rows {
        let (table, key): (String, String) = (r.get(0), r.get(1));
        if table == "schema" {
            max_id = max_id.max(key.parse().unwrap_or(0));
        }
        sqlx::query("INSERT INTO registry (tbl, key, value) VALUES ($1, $2, $3)")
            .bind(table)
            .bind(key)
            .bind(r.get::<String, _>(2))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("INSERT INTO registry_state (one, generation) VALUES (1, $1) ON CONFLICT (one) DO UPDATE SET generation = registry_state.generation + $1")
        .bind(rows.len() as i64 + 1)
        .execute(&mut *tx)
        .await?;
    if max_id > 0 {
        sqlx::query(
            "SELECT setval('registry_ids', GREATEST($1, (SELECT last_value FROM registry_ids)))",
        )
        .bind(max_id)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migration that adds a table to the single node's metadata must teach the
    /// move to copy it (and list it in `SQLITE_TABLES`): until then moves refuse.
    #[tokio::test]
    async fn the_move_knows_every_table_of_a_single_nodes_metadata() {
        let sqlite = SqliteMeta::open("sqlite::memory:").await.unwrap();
        let rows = sqlx::query(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )
        .fetch_all(sqlite.pool())
        .await
        .unwrap();
        let mut tables: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let mut known: Vec<String> = SQLITE_TABLES.iter().map(|t| t.to_string()).collect();
        tables.sort();
        known.sort();
        assert_eq!(tables, known);
        check_sqlite_tables(sqlite.pool()).await.unwrap();
        sqlx::query("CREATE TABLE groups_of_the_future (x INTEGER)")
            .execute(sqlite.pool())
            .await
            .unwrap();
        let refused = check_sqlite_tables(sqlite.pool()).await.unwrap_err();
        assert!(
            refused.to_string().contains("groups_of_the_future"),
            "{refused}"
        );
    }
}
