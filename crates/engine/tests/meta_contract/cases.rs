//! The cases of the metadata contract, each a function of a `Meta`: what `apply`
//! leaves for every kind of op, and what every read returns.

use std::collections::BTreeMap;

use picomq_engine::layout::{segment_key, wal_epoch_prefix, wal_key};
use picomq_engine::meta::{Meta, TokenRecord, Watermark};
use picomq_engine::wal::format::{
    AppendOp, CreateOp, ForkOrigin, Op, ProducerStamp, Record, RelocateOp, SYSTEM_STREAM,
};
use picomq_engine::wal::{FlushedChunk, FlushedObject};
use picomq_engine::Offset;

// ---- building WAL objects --------------------------------------------------------

fn create(name: &str) -> Op {
    create_with(name, |_| {})
}

fn create_with(name: &str, shape: impl FnOnce(&mut CreateOp)) -> Op {
    let mut op = CreateOp {
        name: name.into(),
        content_type: "text/plain".into(),
        created_ms: 1,
        ttl_secs: None,
        expires_at: None,
        fork: None,
    };
    shape(&mut op);
    Op::Create(op)
}

/// One record of `bytes` at `start`, numbered `start` (numbers only grow, as
/// offsets do).
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

fn stamp(id: &str, epoch: u64, seq: u64) -> ProducerStamp {
    ProducerStamp {
        id: id.into(),
        epoch,
        seq,
    }
}

/// Object `seq` of epoch 1; stream `i` of it occupies bytes `100 i .. 100 i + 10`.
fn object(seq: u64, chunks: Vec<(u64, Vec<Op>)>) -> FlushedObject {
    object_at(1, seq, chunks)
}

fn object_at(epoch: u64, seq: u64, chunks: Vec<(u64, Vec<Op>)>) -> FlushedObject {
    FlushedObject {
        key: wal_key(epoch, seq),
        epoch,
        seq,
        chunks: chunks
            .into_iter()
            .enumerate()
            .map(|(i, (stream_id, ops))| FlushedChunk {
                stream_id,
                range: i as u64 * 100..i as u64 * 100 + 10,
                ops: ops
                    .into_iter()
                    .enumerate()
                    .map(|(n, op)| (n as u64 + 1, op))
                    .collect(),
                listener: None,
            })
            .collect(),
        bytes: None,
    }
}

/// An object whose only chunk is the system chunk, carrying `ops`.
fn system(seq: u64, ops: Vec<Op>) -> FlushedObject {
    object(seq, vec![(SYSTEM_STREAM, ops)])
}

fn relocate(stream_id: u64, span: (u64, u64), key: &str, bytes: (u64, u64), ts: u64) -> Op {
    Op::Relocate(RelocateOp {
        stream_id,
        start: Offset(span.0),
        end: Offset(span.1),
        object_key: key.into(),
        byte_range: bytes.0..bytes.1,
        last_ts_ms: ts,
        start_seq: span.0,
    })
}

fn token(id: &str, hash: u8, created_ms: u64) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        secret_hash: vec![hash; 32],
        parent_id: None,
        description: format!("token {id}"),
        scopes: "read:**".into(),
        namespace: String::new(),
        created_ms,
        expires_ms: None,
        revoked_ms: None,
    }
}

// ---- reading back ------------------------------------------------------------------

async fn apply(meta: &Meta, objects: &[FlushedObject]) {
    meta.apply(objects).await.expect("apply");
}

/// `(start, end, key)` of every index row of `stream_id`.
async fn spans(meta: &Meta, stream_id: u64) -> Vec<(u64, u64, String)> {
    let rows = meta.chunks_from(stream_id, Offset(0), 1_000).await.unwrap();
    rows.iter()
        .map(|c| (c.start.0, c.end.0, c.object_key.clone()))
        .collect()
}

async fn names(meta: &Meta, page: u32) -> (Vec<String>, u64) {
    let mut names = Vec::new();
    let n = meta
        .for_each_name(page, &mut |n| names.push(n.to_string()))
        .await
        .unwrap();
    (names, n)
}

async fn listed(meta: &Meta, prefix: &str, after: &str, limit: u32) -> Vec<String> {
    let rows = meta.list(prefix, after, limit).await.unwrap();
    rows.into_iter().map(|r| r.name).collect()
}

/// Everything the store answers about streams `1..=max_id`, as text.
async fn snapshot(meta: &Meta, max_id: u64) -> String {
    let mut out = String::new();
    for id in 1..=max_id {
        let row = meta.stream_by_id(id).await.unwrap();
        let producers: BTreeMap<_, _> = meta.producers(id).await.unwrap().into_iter().collect();
        let chunks = meta.chunks_from(id, Offset(0), 1_000).await.unwrap();
        out += &format!("{id}: {row:?}\n  producers {producers:?}\n  chunks {chunks:?}\n");
        out += &format!("  forks {}\n", meta.fork_count(id).await.unwrap());
    }
    let live: BTreeMap<_, _> = meta
        .live_bytes_under("")
        .await
        .unwrap()
        .into_iter()
        .collect();
    out += &format!("live bytes {live:?}\n");
    out += &format!("names {:?}\n", names(meta, 3).await);
    out += &format!("listed {:?}\n", listed(meta, "", "", 100).await);
    out += &format!("tokens {:?}\n", meta.tokens().await.unwrap());
    out += &format!("key {:?}\n", meta.server_key("k").await.unwrap());
    out += &format!("watermark {:?}\n", meta.watermark().await.unwrap());
    out += &format!("next id {}\n", meta.next_stream_id().await.unwrap());
    out += &format!("count {}\n", meta.stream_count().await.unwrap());
    out += &format!(
        "wal rows {:?}\n",
        meta.wal_rows_newest_first("wal/", u64::MAX, 1_000)
            .await
            .unwrap()
    );
    out
}

// ---- streams ---------------------------------------------------------------------

pub async fn creates_read_back_by_name_and_id(meta: Meta) {
    let fork = ForkOrigin {
        source_id: 1,
        point: Offset(3),
        requested_offset: Some(Offset(2)),
        sub_offset: 1,
        point_seq: 2,
    };
    apply(
        &meta,
        &[
            object(
                0,
                vec![
                    (1, vec![create("a"), Op::Append(append(0, 3, 1_500))]),
                    (2, vec![create_with("b", |c| c.ttl_secs = Some(60))]),
                ],
            ),
            object(
                1,
                vec![
                    (
                        3,
                        vec![create_with("c", |c| {
                            c.content_type = "application/json".into();
                            c.created_ms = 7;
                            c.expires_at = Some("2030-01-01T00:00:00Z".into());
                        })],
                    ),
                    (4, vec![create_with("f", |c| c.fork = Some(fork.clone()))]),
                ],
            ),
        ],
    )
    .await;
    let a = meta.stream_by_name("a").await.unwrap().expect("a exists");
    assert_eq!((a.id, a.name.as_str()), (1, "a"));
    assert_eq!((a.content_type.as_str(), a.created_ms), ("text/plain", 1));
    assert_eq!(
        (a.tail, a.start, a.last_access_ms),
        (Offset(3), Offset(0), 1_500)
    );
    assert!(!a.closed && !a.soft_deleted && a.closed_by.is_none());
    assert!(a.fork.is_none() && a.stream_seq.is_none() && a.retention_secs.is_none());
    assert_eq!((a.ttl_secs, a.expires_at), (None, None));
    let b = meta.stream_by_name("b").await.unwrap().unwrap();
    assert_eq!(
        (b.ttl_secs, b.tail, b.last_access_ms),
        (Some(60), Offset(0), 1)
    );
    let c = meta.stream_by_id(3).await.unwrap().unwrap();
    assert_eq!(c.name, "c");
    assert_eq!(
        (c.content_type.as_str(), c.created_ms),
        ("application/json", 7)
    );
    assert_eq!(c.expires_at.as_deref(), Some("2030-01-01T00:00:00Z"));
    let f = meta.stream_by_id(4).await.unwrap().unwrap();
    assert_eq!(f.fork, Some(fork));
    assert_eq!(f.tail, Offset(3), "a fork starts at its divergence point");
    assert!(meta.stream_by_name("missing").await.unwrap().is_none());
    assert!(meta.stream_by_id(99).await.unwrap().is_none());
    assert_eq!(meta.fork_count(1).await.unwrap(), 1);
    assert_eq!(meta.fork_count(2).await.unwrap(), 0);
    assert_eq!(meta.stream_count().await.unwrap(), 4);
}

pub async fn names_are_paged_by_id_and_deleted_ones_stay_listed(meta: Meta) {
    let streams = (1..=5).map(|id| (id, vec![create(&format!("n{id}"))]));
    apply(&meta, &[object(0, streams.collect())]).await;
    apply(
        &meta,
        &[object(
            1,
            vec![
                (2, vec![Op::Delete { soft: true }]),
                (4, vec![Op::Delete { soft: false }]),
            ],
        )],
    )
    .await;
    let expected: Vec<String> = ["n1", "n2", "n3", "n5"].map(String::from).into();
    for page in [1, 2, 3, 4, 100] {
        assert_eq!(
            names(&meta, page).await,
            (expected.clone(), 4),
            "page {page}"
        );
    }
    assert_eq!(meta.stream_count().await.unwrap(), 3);
}

pub async fn next_stream_id_only_grows(meta: Meta) {
    assert_eq!(meta.next_stream_id().await.unwrap(), 1);
    apply(&meta, &[object(0, vec![(5, vec![create("five")])])]).await;
    assert_eq!(meta.next_stream_id().await.unwrap(), 6);
    // An older create (a replay) does not move it back, nor does an object of appends.
    apply(&meta, &[object(1, vec![(3, vec![create("three")])])]).await;
    apply(
        &meta,
        &[object(2, vec![(5, vec![Op::Append(append(0, 1, 1))])])],
    )
    .await;
    assert_eq!(meta.next_stream_id().await.unwrap(), 6);
    apply(
        &meta,
        &[
            object(3, vec![(9, vec![create("nine")])]),
            object(4, vec![(7, vec![create("seven")])]),
        ],
    )
    .await;
    assert_eq!(meta.next_stream_id().await.unwrap(), 10);
}

pub async fn watermark_and_node_epoch(meta: Meta) {
    assert_eq!(meta.watermark().await.unwrap(), None);
    assert_eq!(meta.node_epoch().await.unwrap(), 0);
    apply(&meta, &[object_at(2, 7, vec![(1, vec![create("s")])])]).await;
    let at = |epoch, next_seq| Some(Watermark { epoch, next_seq });
    assert_eq!(meta.watermark().await.unwrap(), at(2, 8));
    // An object with no chunks moves it too; an empty batch does not.
    apply(&meta, &[object_at(3, 0, vec![])]).await;
    assert_eq!(meta.watermark().await.unwrap(), at(3, 1));
    apply(&meta, &[]).await;
    assert_eq!(meta.watermark().await.unwrap(), at(3, 1));
    meta.set_node_epoch(9).await.unwrap();
    assert_eq!(meta.node_epoch().await.unwrap(), 9);
    meta.set_node_epoch(4).await.unwrap();
    assert_eq!(meta.node_epoch().await.unwrap(), 4);
    assert_eq!(meta.watermark().await.unwrap(), at(3, 1));
}

// ---- appends and producers -------------------------------------------------------

pub async fn appends_fold_into_one_row_per_stream_per_object(meta: Meta) {
    let mut seq = append(3, 2, 20);
    seq.stream_seq = Some("b".into());
    let mut close = append(5, 0, 0);
    close.records = Default::default();
    close.close = true;
    apply(
        &meta,
        &[
            object(
                0,
                vec![
                    (7, vec![create("other")]),
                    (
                        1,
                        vec![create("s"), Op::Append(append(0, 3, 10)), Op::Append(seq)],
                    ),
                ],
            ),
            // Only a close: no index row.
            object(1, vec![(1, vec![Op::Append(close)])]),
        ],
    )
    .await;
    let rows = meta.chunks_from(1, Offset(0), 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].start, rows[0].end), (Offset(0), Offset(5)));
    assert_eq!(rows[0].object_key, wal_key(1, 0));
    assert_eq!(
        rows[0].byte_range,
        100..110,
        "the stream's chunk of the object"
    );
    let s = meta.stream_by_name("s").await.unwrap().unwrap();
    assert_eq!((s.tail, s.last_access_ms), (Offset(5), 20));
    assert_eq!(s.stream_seq.as_deref(), Some("b"));
    assert!(s.closed && s.closed_by.is_none());
    // From an offset: rows ending after it; with a limit.
    assert_eq!(meta.chunks_from(1, Offset(4), 10).await.unwrap().len(), 1);
    assert!(meta.chunks_from(1, Offset(5), 10).await.unwrap().is_empty());
    assert!(meta.chunks_from(7, Offset(0), 10).await.unwrap().is_empty());
}

/// Folding a batch's appends into one update per stream and multi-row inserts
/// must leave the rows that applying every op one by one would.
pub async fn batched_index_writes_match_op_by_op_effects(meta: Meta) {
    let mut first = append(0, 3, 10);
    first.stream_seq = Some("a".into());
    first.producer = Some(stamp("p", 0, 0));
    let mut second = append(3, 2, 12);
    second.producer = Some(stamp("p", 0, 1));
    let mut closing = append(5, 0, 0);
    closing.records = Default::default();
    closing.close = true;
    closing.producer = Some(stamp("p", 0, 2));
    // 37 streams created and written in one object: 32 + 4 + 1 row groups.
    let many: Vec<(u64, Vec<Op>)> = (10..47)
        .map(|id| {
            let ops = vec![create(&format!("s{id}")), Op::Append(append(0, 4, 5))];
            (id, ops)
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
    apply(&meta, &batch).await;

    let one = meta.stream_by_name("one").await.unwrap().unwrap();
    assert_eq!(one.tail, Offset(5));
    assert!(one.closed);
    assert_eq!(one.closed_by, Some(stamp("p", 0, 2)));
    assert_eq!(one.stream_seq.as_deref(), Some("a"));
    assert_eq!(one.last_access_ms, 12);
    assert_eq!(meta.producers(1).await.unwrap()["p"], (0, 2));
    let spans: Vec<_> = spans(&meta, 1)
        .await
        .into_iter()
        .map(|(s, e, _)| (s, e))
        .collect();
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

/// A row that is already there, as when a WAL object is indexed again after a
/// restart, is replaced, and the rows around it in the same batch are written too.
pub async fn chunk_rows_indexed_again_are_replaced(meta: Meta) {
    let first = object(
        0,
        vec![
            (1, vec![create("a"), Op::Append(append(0, 3, 10))]),
            (2, vec![create("b"), Op::Append(append(0, 3, 10))]),
        ],
    );
    apply(&meta, std::slice::from_ref(&first)).await;
    // Stream 1's row again, now in object 7, between two new rows of one group.
    let again = object(
        7,
        vec![
            (2, vec![Op::Append(append(3, 3, 20))]),
            (1, vec![Op::Append(append(0, 3, 10))]),
            (3, vec![create("c"), Op::Append(append(0, 3, 20))]),
        ],
    );
    apply(&meta, &[first, again]).await;
    assert_eq!(spans(&meta, 1).await, [(0, 3, wal_key(1, 7))]);
    assert_eq!(
        spans(&meta, 2).await,
        [(0, 3, wal_key(1, 0)), (3, 6, wal_key(1, 7))]
    );
    assert_eq!(spans(&meta, 3).await, [(0, 3, wal_key(1, 7))]);
    let rows = meta.chunks_from(1, Offset(0), 10).await.unwrap();
    assert_eq!(rows[0].byte_range, 100..110, "the replacing row's bytes");
}

pub async fn producer_stamps_keep_the_last_per_producer(meta: Meta) {
    let stamped = |start, p: ProducerStamp| {
        let mut a = append(start, 1, 10 + start);
        a.producer = Some(p);
        Op::Append(a)
    };
    apply(
        &meta,
        &[
            object(
                0,
                vec![(
                    1,
                    vec![
                        create("s"),
                        stamped(0, stamp("p", 0, 0)),
                        stamped(1, stamp("q", 3, 0)),
                        stamped(2, stamp("p", 0, 1)),
                    ],
                )],
            ),
            object(1, vec![(1, vec![stamped(3, stamp("p", 1, 0))])]),
            object(2, vec![(2, vec![create("t")])]),
        ],
    )
    .await;
    apply(
        &meta,
        &[object(3, vec![(1, vec![stamped(4, stamp("q", 3, 1))])])],
    )
    .await;
    let producers: BTreeMap<_, _> = meta.producers(1).await.unwrap().into_iter().collect();
    let expected = BTreeMap::from([("p".to_string(), (1, 0)), ("q".to_string(), (3, 1))]);
    assert_eq!(producers, expected);
    assert!(meta.producers(2).await.unwrap().is_empty());
    assert!(meta.producers(99).await.unwrap().is_empty());
}

// ---- trims and retention ---------------------------------------------------------

/// Trim moves the start (never back, never past the tail) and drops the rows
/// that end at or below it, keeping one that straddles it; replaying the same
/// objects changes nothing.
pub async fn trims_drop_rows_below_the_start_idempotently(meta: Meta) {
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
        apply(&meta, &batch).await;
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
    apply(
        &meta,
        &[object(4, vec![(1, vec![Op::Trim { before: Offset(99) }])])],
    )
    .await;
    let row = meta.stream_by_name("s").await.unwrap().unwrap();
    assert_eq!(row.start, Offset(9));
    assert!(spans(meta.clone()).await.is_empty());
    apply(
        &meta,
        &[object(5, vec![(1, vec![Op::SetRetention { secs: None }])])],
    )
    .await;
    let none = meta
        .retention_candidates(u64::MAX >> 2, "", 10)
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// A stream's expired prefix ends at the first row within the retention; a row
/// out of timestamp order ends the prefix: kept longer, never trimmed early.
/// Streams come in name order after `after`, with and without expired rows.
pub async fn retention_finds_the_expired_prefix(meta: Meta) {
    let setup = vec![
        create("s"),
        Op::SetRetention { secs: Some(1) },
        Op::Append(append(0, 3, 10)),
    ];
    apply(
        &meta,
        &[
            object(0, vec![(1, setup)]),
            object(1, vec![(1, vec![Op::Append(append(3, 3, 20))])]),
            // Out of order (a clock stepped back): older than the row before it.
            object(2, vec![(1, vec![Op::Append(append(6, 3, 5))])]),
            object(3, vec![(1, vec![Op::Append(append(9, 3, 2_000))])]),
        ],
    )
    .await;
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

    // More streams: one without rows, one without retention, one soft-deleted.
    apply(
        &meta,
        &[object(
            4,
            vec![
                (2, vec![create("r"), Op::SetRetention { secs: Some(5) }]),
                (3, vec![create("q"), Op::Append(append(0, 1, 10))]),
                (4, vec![create("t"), Op::SetRetention { secs: Some(1) }]),
                (4, vec![Op::Append(append(0, 1, 10))]),
                (4, vec![Op::Delete { soft: true }]),
            ],
        )],
    )
    .await;
    let all = meta.retention_candidates(9_999, "", 10).await.unwrap();
    let r = ("r".to_string(), Offset(0), None);
    assert_eq!(
        all,
        [r.clone(), ("s".to_string(), Offset(0), Some(Offset(12)))]
    );
    assert_eq!(meta.retention_candidates(9_999, "", 1).await.unwrap(), [r]);
    let after_r = meta.retention_candidates(9_999, "r", 10).await.unwrap();
    assert_eq!(after_r, s(Some(12)));
}

// ---- deletes -------------------------------------------------------------------

pub async fn soft_deletes_keep_rows_for_forks(meta: Meta) {
    let fork = ForkOrigin {
        source_id: 1,
        point: Offset(3),
        requested_offset: None,
        sub_offset: 0,
        point_seq: 0,
    };
    apply(
        &meta,
        &[
            object(
                0,
                vec![(
                    1,
                    vec![
                        create_with("src", |c| c.ttl_secs = Some(1)),
                        Op::SetRetention { secs: Some(1) },
                        Op::Append(append(0, 3, 10)),
                    ],
                )],
            ),
            object(
                1,
                vec![(2, vec![create_with("fork", |c| c.fork = Some(fork))])],
            ),
            object(2, vec![(1, vec![Op::Delete { soft: true }])]),
        ],
    )
    .await;
    let src = meta
        .stream_by_name("src")
        .await
        .unwrap()
        .expect("the row stays");
    assert!(src.soft_deleted);
    assert_eq!(spans(&meta, 1).await, [(0, 3, wal_key(1, 0))]);
    assert_eq!(meta.fork_count(1).await.unwrap(), 1);
    assert_eq!(meta.stream_count().await.unwrap(), 1);
    assert_eq!(listed(&meta, "", "", 10).await, ["fork"]);
    assert_eq!(meta.count_streams_with_prefix("src", 10).await.unwrap(), 0);
    assert!(meta
        .expired_candidates(u64::MAX >> 2, "", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(meta
        .retention_candidates(u64::MAX >> 2, "", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(meta.object_referenced(&wal_key(1, 0)).await.unwrap());
    assert_eq!(names(&meta, 10).await.1, 2);
}

pub async fn hard_deletes_remove_every_row(meta: Meta) {
    let mut stamped = append(0, 3, 10);
    stamped.producer = Some(stamp("p", 0, 0));
    apply(
        &meta,
        &[
            object(0, vec![(1, vec![create("s"), Op::Append(stamped)])]),
            object(
                1,
                vec![(2, vec![create("kept"), Op::Append(append(0, 1, 1))])],
            ),
            object(2, vec![(1, vec![Op::Delete { soft: false }])]),
        ],
    )
    .await;
    assert!(meta.stream_by_name("s").await.unwrap().is_none());
    assert!(meta.stream_by_id(1).await.unwrap().is_none());
    assert!(spans(&meta, 1).await.is_empty());
    assert!(meta.producers(1).await.unwrap().is_empty());
    assert!(!meta.object_referenced(&wal_key(1, 0)).await.unwrap());
    assert!(meta.object_referenced(&wal_key(1, 1)).await.unwrap());
    assert_eq!(meta.stream_count().await.unwrap(), 1);
    // The name again, under a new id, deleted and created in one batch.
    apply(
        &meta,
        &[
            object(3, vec![(3, vec![create("s"), Op::Append(append(0, 2, 5))])]),
            object(4, vec![(3, vec![Op::Delete { soft: false }])]),
            object(5, vec![(4, vec![create("s")])]),
        ],
    )
    .await;
    let s = meta.stream_by_name("s").await.unwrap().unwrap();
    assert_eq!((s.id, s.tail), (4, Offset(0)));
    assert!(spans(&meta, 3).await.is_empty());
    assert_eq!(meta.next_stream_id().await.unwrap(), 5);
}

// ---- relocations ---------------------------------------------------------------

/// Three rows of stream 1, in objects 0, 1 and 2: `(0,3) (3,6) (6,9)`.
async fn three_rows(meta: &Meta, id: u64, name: &str) {
    apply(
        meta,
        &[
            object(
                0,
                vec![(id, vec![create(name), Op::Append(append(0, 3, 10))])],
            ),
            object(1, vec![(id, vec![Op::Append(append(3, 3, 20))])]),
            object(2, vec![(id, vec![Op::Append(append(6, 3, 30))])]),
        ],
    )
    .await;
}

pub async fn relocations_replace_the_rows_of_their_span(meta: Meta) {
    three_rows(&meta, 1, "s").await;
    let seg = segment_key(1, 3, 0);
    let batch = [system(3, vec![relocate(1, (0, 6), &seg, (40, 46), 20)])];
    for _ in 0..2 {
        apply(&meta, &batch).await;
        assert_eq!(
            spans(&meta, 1).await,
            [(0, 6, seg.clone()), (6, 9, wal_key(1, 2))]
        );
    }
    let rows = meta.chunks_from(1, Offset(0), 1).await.unwrap();
    assert_eq!(rows[0].byte_range, 40..46);
    for (key, referenced) in [
        (wal_key(1, 0), false),
        (wal_key(1, 1), false),
        (wal_key(1, 2), true),
        (seg.clone(), true),
    ] {
        assert_eq!(
            meta.object_referenced(&key).await.unwrap(),
            referenced,
            "{key}"
        );
    }
    // The relocated row's timestamp is what retention sees.
    let s = meta.stream_by_name("s").await.unwrap().unwrap();
    assert_eq!(s.tail, Offset(9), "a relocation moves no tail");
    apply(
        &meta,
        &[object(
            4,
            vec![(1, vec![Op::SetRetention { secs: Some(1) }])],
        )],
    )
    .await;
    let found = meta.retention_candidates(1_025, "", 10).await.unwrap();
    assert_eq!(found, [("s".to_string(), Offset(0), Some(Offset(6)))]);
}

/// Sequence numbers: each row keeps its first record's, the stream row the next
/// one, a relocation keeps the span's first, and a fork starts from its point's.
pub async fn sequence_numbers_land_in_rows(meta: Meta) {
    let three = AppendOp {
        records: std::sync::Arc::new(vec![
            Record::plain(10, 1, "a".into()),
            Record::plain(10, 0, "b".into()),
            Record::plain(10, 0, "c".into()),
        ]),
        start_seq: 0,
        ..append(0, 1, 10)
    };
    let two = AppendOp {
        records: std::sync::Arc::new(vec![
            Record::plain(20, 1, "d".into()),
            Record::plain(20, 0, "e".into()),
        ]),
        start_seq: 3,
        ..append(3, 1, 20)
    };
    apply(
        &meta,
        &[
            object(0, vec![(1, vec![create("s"), Op::Append(three)])]),
            object(1, vec![(1, vec![Op::Append(two)])]),
        ],
    )
    .await;
    let row = meta.stream_by_name("s").await.unwrap().unwrap();
    assert_eq!((row.tail, row.next_seq), (Offset(5), 5));
    let rows = meta.chunks_from(1, Offset(0), 10).await.unwrap();
    let seen: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| (r.start.0, r.start_seq, r.last_ts_ms))
        .collect();
    assert_eq!(seen, [(0, 0, 10), (3, 3, 20)]);
    let seg = segment_key(1, 2, 0);
    apply(
        &meta,
        &[system(2, vec![relocate(1, (0, 5), &seg, (0, 9), 20)])],
    )
    .await;
    let rows = meta.chunks_from(1, Offset(0), 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].start_seq, rows[0].last_ts_ms), (0, 20));
    let fork = ForkOrigin {
        source_id: 1,
        point: Offset(4),
        requested_offset: Some(Offset(4)),
        sub_offset: 0,
        point_seq: 4,
    };
    apply(
        &meta,
        &[object(
            3,
            vec![(2, vec![create_with("f", |c| c.fork = Some(fork.clone()))])],
        )],
    )
    .await;
    let f = meta.stream_by_name("f").await.unwrap().unwrap();
    assert_eq!(f.next_seq, 4);
    assert_eq!(f.fork, Some(fork));
}

/// Moves in one batch land as if one after another: an L0 piece, then an L1 piece
/// over it and the next row, then a move of another stream, then new data.
pub async fn consecutive_relocations_land_in_order(meta: Meta) {
    three_rows(&meta, 1, "a").await;
    apply(
        &meta,
        &[object(
            3,
            vec![(2, vec![create("b"), Op::Append(append(0, 3, 10))])],
        )],
    )
    .await;
    let (l0, l1, other) = (
        segment_key(1, 4, 0),
        segment_key(1, 5, 0),
        segment_key(1, 5, 1),
    );
    let batch = [
        system(4, vec![relocate(1, (0, 3), &l0, (0, 3), 10)]),
        system(
            5,
            vec![
                relocate(1, (0, 6), &l1, (10, 16), 20),
                relocate(2, (0, 3), &other, (0, 3), 10),
            ],
        ),
        object(6, vec![(1, vec![Op::Append(append(9, 3, 40))])]),
    ];
    for _ in 0..2 {
        apply(&meta, &batch).await;
        assert_eq!(
            spans(&meta, 1).await,
            [
                (0, 6, l1.clone()),
                (6, 9, wal_key(1, 2)),
                (9, 12, wal_key(1, 6))
            ]
        );
        assert_eq!(spans(&meta, 2).await, [(0, 3, other.clone())]);
        assert!(
            !meta.object_referenced(&l0).await.unwrap(),
            "replaced within the batch"
        );
    }
}

/// A move that a row reaches across is stale and lands nowhere, in its own batch or
/// after a wider move in the same one: the packer on a stream's owner and
/// compaction on another member move the same rows through their own logs, so the
/// narrower move may come second. Applied, it would replace the wider row and lose
/// what that row held past its own end.
pub async fn stale_relocations_lose_no_rows(meta: Meta) {
    three_rows(&meta, 1, "a").await;
    let (wide, narrow, across) = (
        segment_key(2, 3, 0),
        segment_key(3, 3, 0),
        segment_key(3, 3, 1),
    );
    apply(
        &meta,
        &[system(3, vec![relocate(1, (0, 9), &wide, (0, 9), 30)])],
    )
    .await;
    for (seq, stale) in [
        (4, relocate(1, (0, 3), &narrow, (0, 3), 10)),
        (5, relocate(1, (3, 6), &across, (0, 3), 20)),
    ] {
        apply(&meta, &[system(seq, vec![stale])]).await;
        assert_eq!(spans(&meta, 1).await, [(0, 9, wide.clone())]);
    }
    for key in [&narrow, &across] {
        assert!(!meta.object_referenced(key).await.unwrap(), "{key}");
    }
    // In one batch: the wide move first, then the narrow one (and one reaching past
    // the wide row's start), as one indexer meets them.
    three_rows(&meta, 2, "b").await;
    let (wide2, narrow2, late) = (
        segment_key(2, 6, 0),
        segment_key(3, 6, 0),
        segment_key(3, 6, 1),
    );
    let batch = [system(
        6,
        vec![
            relocate(2, (0, 6), &wide2, (0, 6), 20),
            relocate(2, (3, 6), &narrow2, (0, 3), 20),
            relocate(2, (3, 9), &late, (0, 6), 30),
        ],
    )];
    for _ in 0..2 {
        apply(&meta, &batch).await;
        assert_eq!(
            spans(&meta, 2).await,
            [(0, 6, wide2.clone()), (6, 9, wal_key(1, 2))]
        );
    }
    // A move over whole rows still lands, whichever writer made them.
    let whole = segment_key(3, 7, 0);
    apply(
        &meta,
        &[system(7, vec![relocate(2, (0, 9), &whole, (0, 9), 30)])],
    )
    .await;
    assert_eq!(spans(&meta, 2).await, [(0, 9, whole)]);
}

pub async fn relocations_of_deleted_or_trimmed_streams_keep_nothing(meta: Meta) {
    three_rows(&meta, 1, "gone").await;
    apply(
        &meta,
        &[
            object(
                3,
                vec![(2, vec![create("soft"), Op::Append(append(0, 3, 10))])],
            ),
            object(
                4,
                vec![(3, vec![create("trimmed"), Op::Append(append(0, 3, 10))])],
            ),
            object(5, vec![(3, vec![Op::Append(append(3, 3, 20))])]),
            object(6, vec![(3, vec![Op::Append(append(6, 3, 30))])]),
            object(7, vec![(1, vec![Op::Delete { soft: false }])]),
            object(8, vec![(2, vec![Op::Delete { soft: true }])]),
            object(9, vec![(3, vec![Op::Trim { before: Offset(6) }])]),
        ],
    )
    .await;
    let (gone, soft) = (segment_key(1, 10, 0), segment_key(1, 10, 1));
    let (below, straddling) = (segment_key(1, 10, 2), segment_key(1, 10, 3));
    apply(
        &meta,
        &[system(
            10,
            vec![
                relocate(1, (0, 6), &gone, (0, 6), 20),
                relocate(2, (0, 3), &soft, (0, 3), 10),
                relocate(3, (0, 6), &below, (0, 6), 20),
            ],
        )],
    )
    .await;
    assert!(
        spans(&meta, 1).await.is_empty(),
        "a deleted stream keeps nothing"
    );
    assert!(!meta.object_referenced(&gone).await.unwrap());
    // A soft-deleted stream's rows serve its forks: they move like any other.
    assert_eq!(spans(&meta, 2).await, [(0, 3, soft.clone())]);
    // A span trimmed away keeps nothing; the row past the start stays.
    assert!(!meta.object_referenced(&below).await.unwrap());
    assert_eq!(spans(&meta, 3).await, [(6, 9, wal_key(1, 6))]);
    // A span straddling the start is kept like any straddling row.
    apply(
        &meta,
        &[system(
            11,
            vec![relocate(3, (3, 9), &straddling, (0, 6), 30)],
        )],
    )
    .await;
    assert_eq!(spans(&meta, 3).await, [(3, 9, straddling)]);
}

// ---- the object index by key ---------------------------------------------------

/// Two streams in objects 0..3 of epoch 1, and one compacted row.
async fn rows_in_four_objects(meta: &Meta) {
    apply(
        meta,
        &[
            object(
                0,
                vec![
                    (2, vec![create("b"), Op::Append(append(0, 1, 1))]),
                    (1, vec![create("a"), Op::Append(append(0, 1, 1))]),
                ],
            ),
            object(1, vec![(1, vec![Op::Append(append(1, 1, 2))])]),
            object(
                2,
                vec![
                    (2, vec![Op::Append(append(1, 1, 3))]),
                    (1, vec![Op::Append(append(2, 1, 3))]),
                ],
            ),
            object(3, vec![(3, vec![create("c"), Op::Append(append(0, 5, 4))])]),
        ],
    )
    .await;
    let seg = segment_key(1, 4, 0);
    apply(
        meta,
        &[system(4, vec![relocate(3, (0, 5), &seg, (0, 5), 4)])],
    )
    .await;
}

fn keyed(rows: &[picomq_engine::meta::IndexRow]) -> Vec<(String, u64, u64)> {
    rows.iter()
        .map(|r| (r.chunk.object_key.clone(), r.stream_id, r.chunk.start.0))
        .collect()
}

pub async fn wal_rows_by_key_range(meta: Meta) {
    rows_in_four_objects(&meta).await;
    let (w0, w1, w2) = (wal_key(1, 0), wal_key(1, 1), wal_key(1, 2));
    let below = meta.rows_in_wal_below(&w2, u64::MAX, 100).await.unwrap();
    let expected = [(w0.clone(), 1, 0), (w0.clone(), 2, 0), (w1.clone(), 1, 1)];
    assert_eq!(keyed(&below), expected);
    // Every row is 10 bytes: those of 10 or more are left out (they stay in the WAL).
    let small = meta.rows_in_wal_below(&w2, 11, 100).await.unwrap();
    assert_eq!(keyed(&small), expected);
    assert!(meta
        .rows_in_wal_below(&w2, 10, 100)
        .await
        .unwrap()
        .is_empty());
    let limited = meta.rows_in_wal_below(&w2, u64::MAX, 2).await.unwrap();
    assert_eq!(keyed(&limited), expected[..2]);
    // One log's rows, the newest object first, each object's rows in stream order;
    // the relocated row is no longer in the WAL.
    let log = format!("{}/", wal_epoch_prefix(1));
    let newest = meta
        .wal_rows_newest_first(&log, u64::MAX, 100)
        .await
        .unwrap();
    let expected = [
        (w2.clone(), 1, 2),
        (w2.clone(), 2, 1),
        (w1.clone(), 1, 1),
        (w0.clone(), 1, 0),
        (w0.clone(), 2, 0),
    ];
    assert_eq!(keyed(&newest), expected);
    let limited = meta.wal_rows_newest_first(&log, u64::MAX, 3).await.unwrap();
    assert_eq!(keyed(&limited), expected[..3]);
    assert!(meta
        .wal_rows_newest_first(&log, 10, 100)
        .await
        .unwrap()
        .is_empty());
    // The logs before and after hold none of them; `wal/` holds every log's rows
    // and no segment's.
    for other in [
        wal_epoch_prefix(0),
        wal_epoch_prefix(10),
        wal_epoch_prefix(2),
    ] {
        let rows = meta
            .wal_rows_newest_first(&format!("{other}/"), u64::MAX, 100)
            .await
            .unwrap();
        assert!(rows.is_empty(), "{other}: {rows:?}");
    }
    let all = meta
        .wal_rows_newest_first("wal/", u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(keyed(&all), expected);
    let mut all_below = meta.rows_in_wal_below("wal0", u64::MAX, 100).await.unwrap();
    all_below.sort_by(|a, b| b.chunk.object_key.cmp(&a.chunk.object_key));
    assert_eq!(keyed(&all_below), keyed(&all));
    let full = &all[3].chunk;
    assert_eq!((full.end, full.byte_range.clone()), (Offset(1), 100..110));
}

pub async fn rows_in_objects_come_grouped_in_key_order(meta: Meta) {
    rows_in_four_objects(&meta).await;
    let (w0, w2) = (wal_key(1, 0), wal_key(1, 2));
    let seg = segment_key(1, 4, 0);
    let keys = [
        w2.clone(),
        "wal/missing".to_string(),
        w0.clone(),
        seg.clone(),
    ];
    let rows = meta.rows_in_objects(&keys).await.unwrap();
    assert_eq!(
        keyed(&rows),
        [
            (w2.clone(), 1, 2),
            (w2, 2, 1),
            (w0.clone(), 1, 0),
            (w0, 2, 0),
            (seg, 3, 0)
        ]
    );
    assert!(meta.rows_in_objects(&[]).await.unwrap().is_empty());
}

pub async fn live_bytes_and_references_per_object(meta: Meta) {
    rows_in_four_objects(&meta).await;
    let live = |prefix: &'static str| {
        let meta = meta.clone();
        async move {
            let bytes = meta.live_bytes_under(prefix).await.unwrap();
            bytes.into_iter().collect::<BTreeMap<_, _>>()
        }
    };
    let seg = segment_key(1, 4, 0);
    assert_eq!(live("seg/").await, BTreeMap::from([(seg.clone(), 5)]));
    let wal = live("wal/").await;
    let expected = BTreeMap::from([
        (wal_key(1, 0), 20),
        (wal_key(1, 1), 10),
        (wal_key(1, 2), 20),
    ]);
    assert_eq!(wal, expected);
    assert_eq!(live("").await.len(), 4);
    assert!(live("nothing/").await.is_empty());
    assert!(meta.object_referenced(&seg).await.unwrap());
    assert!(!meta.object_referenced(&wal_key(1, 3)).await.unwrap());
    assert!(!meta.object_referenced("seg/missing").await.unwrap());
}

// ---- listing and counting ------------------------------------------------------

pub async fn list_pages_live_streams_by_prefix(meta: Meta) {
    let names = ["a/1", "a/2", "a/3", "ab", "b/1"];
    let streams = names.iter().enumerate();
    let chunks = streams.map(|(i, n)| (i as u64 + 1, vec![create(n), Op::Append(append(0, 2, 9))]));
    apply(&meta, &[object(0, chunks.collect())]).await;
    assert_eq!(listed(&meta, "a/", "", 10).await, ["a/1", "a/2", "a/3"]);
    assert_eq!(listed(&meta, "a/", "a/1", 10).await, ["a/2", "a/3"]);
    assert_eq!(listed(&meta, "a/", "", 2).await, ["a/1", "a/2"]);
    assert_eq!(
        listed(&meta, "a", "", 10).await,
        ["a/1", "a/2", "a/3", "ab"]
    );
    assert_eq!(listed(&meta, "", "", 10).await, names);
    assert_eq!(listed(&meta, "", "a/3", 10).await, ["ab", "b/1"]);
    assert!(listed(&meta, "c", "", 10).await.is_empty());
    let rows = meta.list("b/", "", 10).await.unwrap();
    assert_eq!((rows[0].id, rows[0].tail), (5, Offset(2)));
}

/// Names sort and match as bytes, whatever the database's collation, and a
/// prefix is a prefix, not a pattern.
pub async fn prefixes_match_bytes_not_patterns(meta: Meta) {
    let all = [
        "B",
        "a",
        "C",
        "é/1",
        "é/2",
        "e/1",
        "%/1",
        "_x",
        "ax",
        "\u{10FFFF}a",
    ];
    let chunks = all
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u64 + 1, vec![create(n)]));
    apply(&meta, &[object(0, chunks.collect())]).await;
    let mut sorted = all.map(String::from).to_vec();
    sorted.sort();
    assert_eq!(listed(&meta, "", "", 100).await, sorted);
    assert_eq!(listed(&meta, "é/", "", 10).await, ["é/1", "é/2"]);
    assert_eq!(listed(&meta, "é", "é/1", 10).await, ["é/2"]);
    assert_eq!(listed(&meta, "%", "", 10).await, ["%/1"]);
    assert_eq!(listed(&meta, "_", "", 10).await, ["_x"]);
    assert_eq!(listed(&meta, "\u{10FFFF}", "", 10).await, ["\u{10FFFF}a"]);
    assert_eq!(meta.count_streams_with_prefix("é", 10).await.unwrap(), 2);
    assert_eq!(meta.count_streams_with_prefix("_", 10).await.unwrap(), 1);
    assert_eq!(
        meta.count_streams_with_prefix("\u{10FFFF}", 10)
            .await
            .unwrap(),
        1
    );
    let (by_id, _) = names(&meta, 4).await;
    assert_eq!(by_id, all.map(String::from));
}

pub async fn count_streams_with_prefix_stops_at_the_limit(meta: Meta) {
    let chunks = (1..=6).map(|id| {
        let name = if id == 6 {
            "other".to_string()
        } else {
            format!("n/{id}")
        };
        (id, vec![create(&name)])
    });
    apply(&meta, &[object(0, chunks.collect())]).await;
    apply(
        &meta,
        &[object(1, vec![(5, vec![Op::Delete { soft: true }])])],
    )
    .await;
    assert_eq!(meta.count_streams_with_prefix("n/", 3).await.unwrap(), 3);
    assert_eq!(meta.count_streams_with_prefix("n/", 10).await.unwrap(), 4);
    assert_eq!(meta.count_streams_with_prefix("", 100).await.unwrap(), 5);
    assert_eq!(meta.count_streams_with_prefix("n/9", 100).await.unwrap(), 0);
    assert_eq!(meta.count_streams_with_prefix("n/", 0).await.unwrap(), 0);
}

// ---- expiry and access times ---------------------------------------------------

pub async fn expired_candidates_by_ttl_and_expiry(meta: Meta) {
    let ttl = |name: &str| create_with(name, |c| (c.created_ms, c.ttl_secs) = (1_000, Some(10)));
    let expiring = |name: &str, at: &str| create_with(name, |c| c.expires_at = Some(at.into()));
    apply(
        &meta,
        &[object(
            0,
            vec![
                (1, vec![ttl("t1")]),
                (2, vec![ttl("t2"), Op::Append(append(0, 1, 5_000))]),
                (3, vec![expiring("e1", "1970-01-01T00:00:20Z")]),
                (4, vec![expiring("e2", "1970-01-01T01:00:30+01:00")]),
                (5, vec![create("keep")]),
                (6, vec![ttl("soft")]),
                (6, vec![Op::Delete { soft: true }]),
            ],
        )],
    )
    .await;
    let expired = |now, after: &'static str, limit| {
        let meta = meta.clone();
        async move { meta.expired_candidates(now, after, limit).await.unwrap() }
    };
    assert!(
        expired(11_000, "", 10).await.is_empty(),
        "a TTL ends strictly after"
    );
    assert_eq!(expired(11_001, "", 10).await, ["t1"]);
    assert_eq!(expired(16_000, "", 10).await, ["t1", "t2"]);
    assert_eq!(expired(25_000, "", 10).await, ["e1", "t1", "t2"]);
    assert_eq!(expired(31_000, "", 10).await, ["e1", "e2", "t1", "t2"]);
    assert_eq!(expired(31_000, "e2", 10).await, ["t1", "t2"]);
    assert_eq!(expired(31_000, "", 1).await, ["e1"]);
    // An access pushes a sliding TTL on.
    meta.touch(&[(1, 20_000)]).await.unwrap();
    assert_eq!(expired(25_000, "", 10).await, ["e1", "t2"]);
}

/// Touches go out in groups: every stream gets its own access time, and an older
/// time never overwrites a newer one.
pub async fn touch_updates_every_stream_in_groups(meta: Meta) {
    let n = 1_201_u64;
    let streams: Vec<(u64, Vec<Op>)> = (1..=n)
        .map(|id| (id, vec![create(&format!("s{id}"))]))
        .collect();
    apply(&meta, &[object(1, streams)]).await;
    let mut updates: Vec<(u64, u64)> = (1..=n).map(|id| (id, 1_000 + id)).collect();
    // The same stream twice in one call: the later time wins.
    updates.push((9, 5));
    meta.touch(&updates).await.unwrap();
    meta.touch(&[(7, 5)]).await.unwrap(); // older: ignored
    meta.touch(&[]).await.unwrap();
    meta.touch(&[(n + 50, 9)]).await.unwrap(); // no such stream: nothing
    for id in [1, 7, 9, 256, 257, 1_000, 1_001, n] {
        let row = meta.stream_by_id(id).await.unwrap().unwrap();
        assert_eq!(row.last_access_ms, 1_000 + id, "stream {id}");
    }
}

// ---- tokens and keys -----------------------------------------------------------

pub async fn tokens_put_replace_and_revoke(meta: Meta) {
    let mut child = token("a", 2, 5);
    child.parent_id = Some("B".into());
    child.namespace = "tenant/".into();
    child.expires_ms = Some(99);
    apply(
        &meta,
        &[system(
            0,
            vec![
                Op::PutToken(token("B", 1, 5)),
                Op::PutToken(child.clone()),
                Op::PutToken(token("c", 3, 1)),
            ],
        )],
    )
    .await;
    let ids = |tokens: Vec<TokenRecord>| tokens.into_iter().map(|t| t.id).collect::<Vec<_>>();
    // By creation time, then id as bytes.
    assert_eq!(ids(meta.tokens().await.unwrap()), ["c", "B", "a"]);
    let stored = meta.tokens().await.unwrap();
    assert_eq!(stored[2], child);
    apply(
        &meta,
        &[
            system(
                1,
                vec![Op::RevokeTokens {
                    ids: vec!["a".into()],
                    at_ms: 10,
                }],
            ),
            system(
                2,
                vec![Op::RevokeTokens {
                    ids: vec!["a".into(), "c".into(), "missing".into()],
                    at_ms: 20,
                }],
            ),
        ],
    )
    .await;
    let revoked: BTreeMap<String, Option<u64>> = meta
        .tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.id, t.revoked_ms))
        .collect();
    let expected = [("B", None), ("a", Some(10)), ("c", Some(20))];
    assert_eq!(
        revoked,
        expected.map(|(id, at)| (id.to_string(), at)).into()
    );
    // Replaced by id (a rotation); another token's secret hash is left alone.
    let mut rotated = token("B", 7, 8);
    rotated.description = "rotated".into();
    apply(
        &meta,
        &[system(
            3,
            vec![
                Op::PutToken(rotated.clone()),
                Op::PutToken(token("d", 2, 9)),
            ],
        )],
    )
    .await;
    let stored = meta.tokens().await.unwrap();
    assert_eq!(ids(stored.clone()), ["c", "a", "B"]);
    assert_eq!(stored[2], rotated);
}

pub async fn server_keys_keep_the_first(meta: Meta) {
    assert_eq!(meta.server_key("k").await.unwrap(), None);
    let put = |key: &[u8]| Op::PutServerKey {
        name: "k".into(),
        key: key.to_vec().into(),
    };
    apply(
        &meta,
        &[system(0, vec![put(&[1, 2, 3])]), system(1, vec![put(&[9])])],
    )
    .await;
    apply(&meta, &[system(2, vec![put(&[0; 32])])]).await;
    assert_eq!(meta.server_key("k").await.unwrap(), Some(vec![1, 2, 3]));
    assert_eq!(meta.server_key("other").await.unwrap(), None);
}

// ---- idempotence ---------------------------------------------------------------

/// One batch with an op of every kind.
fn every_kind_of_op() -> Vec<FlushedObject> {
    let mut stamped = append(3, 3, 20);
    stamped.producer = Some(stamp("p", 1, 4));
    stamped.stream_seq = Some("s-1".into());
    let mut closing = append(6, 1, 30);
    closing.close = true;
    closing.producer = Some(stamp("p", 1, 5));
    let fork = ForkOrigin {
        source_id: 1,
        point: Offset(3),
        requested_offset: None,
        sub_offset: 0,
        point_seq: 0,
    };
    let seg = segment_key(1, 6, 0);
    vec![
        object(
            0,
            vec![
                (1, vec![create("one"), Op::Append(append(0, 3, 10))]),
                (2, vec![create_with("two", |c| c.ttl_secs = Some(5))]),
                (3, vec![create("three"), Op::Append(append(0, 4, 11))]),
            ],
        ),
        object(
            1,
            vec![
                (1, vec![Op::Append(stamped)]),
                (4, vec![create_with("fork", |c| c.fork = Some(fork))]),
            ],
        ),
        object(2, vec![(1, vec![Op::Append(closing)])]),
        object(
            3,
            vec![
                (
                    2,
                    vec![Op::Append(append(0, 9, 12)), Op::Delete { soft: false }],
                ),
                (
                    3,
                    vec![
                        Op::SetRetention { secs: Some(60) },
                        Op::Trim { before: Offset(2) },
                    ],
                ),
            ],
        ),
        object(4, vec![(1, vec![Op::Delete { soft: true }])]),
        system(
            5,
            vec![
                Op::PutToken(token("t", 1, 1)),
                Op::RevokeTokens {
                    ids: vec!["t".into()],
                    at_ms: 3,
                },
                Op::PutServerKey {
                    name: "k".into(),
                    key: vec![4; 8].into(),
                },
            ],
        ),
        system(6, vec![relocate(1, (0, 6), &seg, (0, 6), 20)]),
    ]
}

/// Applying a batch again, whole or object by object, leaves every row as it was.
pub async fn replaying_a_batch_changes_nothing(meta: Meta) {
    let batch = every_kind_of_op();
    apply(&meta, &batch).await;
    let once = snapshot(&meta, 5).await;
    assert!(once.contains("soft_deleted: true"), "{once}");
    apply(&meta, &batch).await;
    assert_eq!(snapshot(&meta, 5).await, once, "the batch again");
    for object in &batch {
        apply(&meta, std::slice::from_ref(object)).await;
    }
    assert_eq!(snapshot(&meta, 5).await, once, "object by object");
    // The same objects in batches of two.
    for pair in batch.chunks(2) {
        apply(&meta, pair).await;
    }
    assert_eq!(snapshot(&meta, 5).await, once, "in pairs");
}

// ---- identity ---------------------------------------------------------------------

/// A database has an id from its first open, is bound once, and only a rebind
/// changes what it is bound to; a restore of the local index keeps the binding.
pub async fn identity_binds_once_and_rebinds_on_purpose(meta: Meta) {
    let fresh = meta.identity().await.unwrap();
    assert!(!fresh.meta_id.is_empty());
    assert_eq!(fresh.cluster_id, None);
    assert_eq!(fresh.store, None);
    let bound = meta.bind("c1", "s3://b/one").await.unwrap();
    assert_eq!(bound.cluster_id.as_deref(), Some("c1"));
    assert_eq!(bound.store.as_deref(), Some("s3://b/one"));
    assert_eq!(bound.meta_id, fresh.meta_id);
    // A second bind (a racing first start elsewhere) does not move it.
    let again = meta.bind("c2", "s3://b/two").await.unwrap();
    assert_eq!(again.cluster_id.as_deref(), Some("c1"));
    assert_eq!(again.store.as_deref(), Some("s3://b/one"));
    meta.rebind("c2", "s3://b/two").await.unwrap();
    let moved = meta.identity().await.unwrap();
    assert_eq!(moved.cluster_id.as_deref(), Some("c2"));
    assert_eq!(moved.store.as_deref(), Some("s3://b/two"));
    assert_eq!(moved.meta_id, fresh.meta_id);
    // The identity is no state of the index: an emptied index still reads as empty.
    if let Some(index) = meta.local_index() {
        assert!(index.is_empty().await.unwrap());
    }
}
