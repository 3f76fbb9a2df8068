//! Kafka transactions frame by frame against the real binary: the coordinator
//! checks producer ids and epochs and fences old producers; transactional and
//! plain batches are kept apart; a transaction's records stay invisible until
//! EndTxn commits them; and a node that dies (a crash point: `abort()`, what
//! kill -9 leaves) after recording a commit, or half way through carrying it
//! out, finishes it after its restart, each record once, without the producer
//! coming back. The clients' side (librdkafka's transactional producer,
//! read_committed, consume-transform-produce through kill -9) is
//! tests-kafka/clients.py.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, CreateTopicsRequest,
    CreateTopicsResponse, EndTxnRequest, EndTxnResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest,
    ProduceResponse, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use picomq_testkit as support;
use support::{eventually, free_port, Client, Server, TempDir};

use crate::kafka_conn::Conn;

const INVALID_RECORD: i16 = 87;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
const PRODUCER_FENCED: i16 = 90;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const INVALID_REQUEST: i16 = 42;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

async fn create_topic(c: &mut Conn, topic: &str, partitions: i32) {
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(text(topic)))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
    let created: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 5, &create).await;
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0]);
}

async fn init(
    c: &mut Conn,
    tid: &str,
    timeout_ms: i32,
    current: Option<(i64, i16)>,
) -> (i16, i64, i16) {
    let (pid, epoch) = current.unwrap_or((-1, -1));
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(text(tid))))
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch);
    let r: InitProducerIdResponse = c.call(ApiKey::InitProducerId, 3, &req).await;
    (r.error_code, r.producer_id.0, r.producer_epoch)
}

/// AddPartitionsToTxn v3: each partition's code, in the order asked.
async fn add(c: &mut Conn, tid: &str, pid: i64, epoch: i16, parts: &[(&str, i32)]) -> Vec<i16> {
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (t, p) in parts {
        match topics.iter_mut().find(|x| x.name.0.as_str() == *t) {
            Some(x) => x.partitions.push(*p),
            None => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(text(t)))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(text(tid)))
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(topics);
    let r: AddPartitionsToTxnResponse = c.call(ApiKey::AddPartitionsToTxn, 3, &req).await;
    let mut out = Vec::new();
    for (t, p) in parts {
        let topic = r
            .results_by_topic_v3_and_below
            .iter()
            .find(|x| x.name.0.as_str() == *t)
            .expect("the topic answered");
        let part = topic
            .results_by_partition
            .iter()
            .find(|x| x.partition_index == *p)
            .expect("the partition answered");
        out.push(part.partition_error_code);
    }
    out
}

/// One batch of `values` from producer `pid`/`epoch` starting at `seq`, marked
/// transactional or not, with or without a transactional id on the request.
#[allow(clippy::too_many_arguments)]
async fn produce(
    c: &mut Conn,
    tid: Option<&str>,
    transactional: bool,
    topic: &str,
    p: i32,
    (pid, epoch): (i64, i16),
    seq: i32,
    values: &[&str],
) -> (i16, i64) {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq + i as i32,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from(v.to_string())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    let req = ProduceRequest::default()
        .with_transactional_id(tid.map(|t| TransactionalId(text(t))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(text(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(buf.freeze()))])]);
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
    let part = &r.responses[0].partition_responses[0];
    (part.error_code, part.base_offset)
}

fn end_request(tid: &str, pid: i64, epoch: i16, commit: bool) -> EndTxnRequest {
    EndTxnRequest::default()
        .with_transactional_id(TransactionalId(text(tid)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit)
}

async fn end(c: &mut Conn, tid: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let r: EndTxnResponse = c
        .call(ApiKey::EndTxn, 3, &end_request(tid, pid, epoch, commit))
        .await;
    r.error_code
}

/// Records in a stream, as HTTP readers see them.
async fn records_in(client: &Client, stream: &str) -> u64 {
    let r = client
        .get(&format!("/__picomq/streams/{stream}/info"))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{stream}: {}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["next_seq"].as_u64().unwrap()
}

async fn node(dir: &std::path::Path, kafka_port: u16, env: &[(&str, &str)]) -> Server {
    let listen = format!("127.0.0.1:{kafka_port}");
    // Small appends: a commit is published in several pieces (and a repeat
    // after a crash must cut the same ones).
    let flags = ["--kafka-listen", &listen, "--max-append-bytes", "1024"];
    Server::start_process_env(dir, &flags, env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_checks_producers_and_holds_records_until_the_commit() {
    let dir = TempDir::new("kafka-txn");
    let kport = free_port();
    let server = node(dir.path(), kport, &[]).await;
    let mut c = Conn::connect(kport).await;
    create_topic(&mut c, "tx", 2).await;

    // A transaction's timeout must be given and at most 15 minutes.
    for bad in [0, -5, 900_001] {
        let (code, pid, _) = init(&mut c, "t1", bad, None).await;
        assert_eq!(
            (code, pid),
            (INVALID_TRANSACTION_TIMEOUT, -1),
            "timeout {bad}"
        );
    }
    // The first InitProducerId gives epoch 0; the next fences it with epoch 1,
    // same producer id.
    let (code, pid, epoch) = init(&mut c, "t1", 60_000, None).await;
    assert_eq!((code, epoch), (0, 0));
    let (code, pid2, epoch2) = init(&mut c, "t1", 60_000, None).await;
    assert_eq!((code, pid2, epoch2), (0, pid, 1));
    // A producer bumping its own epoch (KIP-360) must name the current one.
    let (code, ..) = init(&mut c, "t1", 60_000, Some((pid, 0))).await;
    assert_eq!(code, PRODUCER_FENCED);
    let (code, ..) = init(&mut c, "t1", 60_000, Some((pid + 1, 1))).await;
    assert_eq!(code, INVALID_PRODUCER_ID_MAPPING);
    let epoch = epoch2;

    // The fenced epoch and an unknown producer id are refused; a bad topic name
    // fails its partition and the rest are not attempted.
    assert_eq!(
        add(&mut c, "t1", pid, 0, &[("tx", 0)]).await,
        [PRODUCER_FENCED]
    );
    assert_eq!(
        add(&mut c, "t1", pid + 1, epoch, &[("tx", 0)]).await,
        [INVALID_PRODUCER_ID_MAPPING]
    );
    assert_eq!(
        add(&mut c, "t1", pid, epoch, &[("tx", 0), ("bad/name", 0)]).await,
        [OPERATION_NOT_ATTEMPTED, INVALID_TOPIC_EXCEPTION]
    );
    assert_eq!(
        add(&mut c, "t1", pid, epoch, &[("tx", 0), ("tx", 1)]).await,
        [0, 0]
    );

    // Transactional batches come with a transactional id, and only they do.
    let ids = (pid, epoch);
    let (code, _) = produce(&mut c, None, true, "tx", 0, ids, 0, &["a"]).await;
    assert_eq!(code, INVALID_RECORD, "a transactional batch without an id");
    let (code, _) = produce(&mut c, Some("t1"), false, "tx", 0, ids, 0, &["a"]).await;
    assert_eq!(code, INVALID_RECORD, "a plain batch with an id");

    // Held back until the commit: no offset yet, nothing for readers.
    let (code, base) = produce(&mut c, Some("t1"), true, "tx", 0, ids, 0, &["a", "b"]).await;
    assert_eq!((code, base), (0, -1));
    let (code, _) = produce(&mut c, Some("t1"), true, "tx", 1, ids, 0, &["c"]).await;
    assert_eq!(code, 0);
    // A retried batch is a duplicate, not a second copy.
    let (code, _) = produce(&mut c, Some("t1"), true, "tx", 0, ids, 0, &["a", "b"]).await;
    assert_eq!(code, 0);
    assert_eq!(records_in(&server.client, "tx").await, 0);
    assert_eq!(records_in(&server.client, "tx~1").await, 0);

    // The fenced epoch cannot end it; a commit can, once; the other outcome is
    // then no longer possible for it.
    assert_eq!(end(&mut c, "t1", pid, 0, true).await, PRODUCER_FENCED);
    assert_eq!(end(&mut c, "t1", pid, epoch, true).await, 0);
    assert_eq!(records_in(&server.client, "tx").await, 2);
    assert_eq!(records_in(&server.client, "tx~1").await, 1);
    assert_eq!(
        end(&mut c, "t1", pid, epoch, true).await,
        0,
        "a retried commit"
    );
    assert_eq!(
        end(&mut c, "t1", pid, epoch, false).await,
        INVALID_TXN_STATE
    );
    assert_eq!(records_in(&server.client, "tx").await, 2);

    // An aborted transaction leaves nothing.
    assert_eq!(add(&mut c, "t1", pid, epoch, &[("tx", 0)]).await, [0]);
    let (code, _) = produce(&mut c, Some("t1"), true, "tx", 0, ids, 2, &["x"]).await;
    assert_eq!(code, 0);
    assert_eq!(end(&mut c, "t1", pid, epoch, false).await, 0);
    assert_eq!(records_in(&server.client, "tx").await, 2);

    // FindCoordinator knows groups (0) and transactions (1), nothing else.
    let find = |t: i8| {
        FindCoordinatorRequest::default()
            .with_key(text("t1"))
            .with_key_type(t)
    };
    let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 2, &find(1)).await;
    assert_eq!((r.error_code, r.port), (0, i32::from(kport)));
    let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 2, &find(7)).await;
    assert_eq!(r.error_code, INVALID_REQUEST);
    drop(server);
}

/// The node dies at `point` during a commit; after a restart the commit is
/// finished by the coordinator alone (its sweep of the logs), each record once.
async fn commit_cut_at(point: &str) {
    let dir = TempDir::new("kafka-txn-crash");
    let kport = free_port();
    let mut crashing = node(dir.path(), kport, &[("PICOMQ_FAILPOINTS", point)]).await;
    let mut c = Conn::connect(kport).await;
    create_topic(&mut c, "tc", 2).await;
    let (code, pid, epoch) = init(&mut c, "tc-id", 60_000, None).await;
    assert_eq!(code, 0);
    // One committed transaction first, so the cut one is not the first.
    assert_eq!(add(&mut c, "tc-id", pid, epoch, &[("tc", 0)]).await, [0]);
    let (code, _) = produce(
        &mut c,
        Some("tc-id"),
        true,
        "tc",
        0,
        (pid, epoch),
        0,
        &["p"],
    )
    .await;
    assert_eq!(code, 0);
    // The first EndTxn crashes the node at `point`.
    let answer: Option<EndTxnResponse> = c
        .call_or_closed(ApiKey::EndTxn, 3, &end_request("tc-id", pid, epoch, true))
        .await;
    assert!(answer.is_none(), "{point}: the node answered {answer:?}");
    crashing.wait_exit(Duration::from_secs(20));

    let server = node(dir.path(), kport, &[]).await;
    let client = server.client.clone();
    // No producer comes back: the coordinator finishes what it recorded.
    eventually(Duration::from_secs(20), || {
        let client = client.clone();
        async move { (records_in(&client, "tc").await == 1).then_some(()) }
    })
    .await;
    // The coordinator closed it (an InitProducerId waits for that), so the next
    // start has nothing left to finish.
    let mut c = Conn::connect(kport).await;
    assert_eq!(init(&mut c, "tc-id", 60_000, None).await.0, 0);
    // Then a second transaction over both partitions, cut the same way.
    let mut running = server;
    running.kill9();
    let mut crashing = node(dir.path(), kport, &[("PICOMQ_FAILPOINTS", point)]).await;
    let mut c = Conn::connect(kport).await;
    let (code, pid, epoch) = init(&mut c, "tc-id", 60_000, None).await;
    assert_eq!(code, 0);
    assert_eq!(
        add(&mut c, "tc-id", pid, epoch, &[("tc", 0), ("tc", 1)]).await,
        [0, 0]
    );
    for p in 0..2 {
        let values: Vec<String> = (0..50).map(|i| format!("v{p}-{i}:{:0>90}", i)).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        for (n, five) in values.chunks(5).enumerate() {
            let seq = 5 * n as i32;
            let ids = (pid, epoch);
            let (code, _) = produce(&mut c, Some("tc-id"), true, "tc", p, ids, seq, five).await;
            assert_eq!(code, 0);
        }
    }
    let answer: Option<EndTxnResponse> = c
        .call_or_closed(ApiKey::EndTxn, 3, &end_request("tc-id", pid, epoch, true))
        .await;
    assert!(answer.is_none(), "{point}: the node answered {answer:?}");
    crashing.wait_exit(Duration::from_secs(20));
    let server = node(dir.path(), kport, &[]).await;
    let client = server.client.clone();
    eventually(Duration::from_secs(20), || {
        let client = client.clone();
        async move {
            (records_in(&client, "tc").await == 51 && records_in(&client, "tc~1").await == 50)
                .then_some(())
        }
    })
    .await;
    // The producer comes back later: nothing is published twice, and the old
    // epoch can no longer end anything.
    let mut c = Conn::connect(kport).await;
    assert_eq!(end(&mut c, "tc-id", pid, epoch, true).await, 0);
    let (code, _, epoch2) = init(&mut c, "tc-id", 60_000, None).await;
    assert_eq!((code, epoch2), (0, epoch + 1));
    assert_eq!(
        end(&mut c, "tc-id", pid, epoch, false).await,
        PRODUCER_FENCED
    );
    // Past the next sweep of the logs (every 5 s): what it reads again must not
    // be published again. An absence has nothing to wait for but time.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(records_in(&client, "tc").await, 51, "{point}");
    assert_eq!(records_in(&client, "tc~1").await, 50, "{point}");
    let r = client.get("/tc~1?offset=-1").await.unwrap();
    let body = r.text();
    assert!(
        body.starts_with("v1-0:") && body.ends_with("049"),
        "{point}"
    );
    assert_eq!(body.matches("v1-").count(), 50, "{point}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_after_its_outcome_is_recorded_is_finished_after_a_restart() {
    commit_cut_at("kafka-txn-after-decide").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_after_its_records_are_published_is_closed_after_a_restart() {
    commit_cut_at("kafka-txn-after-publish").await;
}
