//! The SQLite index: batched writes equal op-by-op effects, plans use the primary
//! keys, and replays change nothing.

use super::*;
use crate::meta::MetaStore;
use crate::wal::format::{AppendOp, CreateOp, Op, ProducerStamp, Record};
use crate::wal::{FlushedChunk, FlushedObject};

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
        start_seq: start,
        records: std::sync::Arc::new(vec![Record::plain(ts_ms, 0, vec![b'x'; bytes].into())]),
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
        bytes: None,
    }
}

/// Every pooled connection keeps statement journals in memory: the indexer's
/// multi-row statements run inside a transaction, and with temporary files each
/// spilled to a file in /var/tmp past 64 KiB (two `pwrite`s per page touched).
#[tokio::test]
async fn statement_journals_stay_in_memory_on_every_connection() {
    let dir = std::env::temp_dir().join(format!("picomq-meta-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let meta = SqliteMeta::open(&format!("sqlite://{}/m.sqlite", dir.display()))
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
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
    let spans = |meta: SqliteMeta| async move {
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
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
    let meta = SqliteMeta::open("sqlite::memory:").await.unwrap();
    let mut first = append(0, 3, 10);
    first.stream_seq = Some("a".into());
    first.producer = Some(stamp(0));
    let mut second = append(3, 2, 12);
    second.producer = Some(stamp(1));
    let mut closing = append(5, 0, 0);
    closing.records = Default::default();
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
