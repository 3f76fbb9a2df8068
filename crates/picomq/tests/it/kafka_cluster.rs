//! The Kafka listener on a cluster, checked frame by frame against two real
//! nodes: every node names both brokers and the same leaders, a partition's
//! leader is the node serving its stream, and a node that does not lead a
//! partition or coordinate a group answers with the protocol's errors
//! (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR) instead of acting; a member waiting
//! in JoinGroup when its coordinator's node is drained is answered at once. The
//! clients' side of the same (failover, groups, SASL) is tests-kafka/clients.py.
//! Needs `PICOMQ_TEST_PG_URL` (see `picomq_testkit::postgres`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, FetchRequest, FetchResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, JoinGroupRequest, JoinGroupResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetFetchRequest,
    OffsetFetchResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use picomq_kafka::batch::{encode, OutRecord};
use picomq_testkit as support;
use support::cluster::TestCluster;
use support::free_port;

use crate::kafka_conn::Conn;

const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const NOT_COORDINATOR: i16 = 16;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// partition -> leader broker id, and broker id -> port, as a node's Metadata says.
async fn leaders(c: &mut Conn, topic: &str) -> (BTreeMap<i32, i32>, BTreeMap<i32, i32>) {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic)))
        ]))
        .with_allow_auto_topic_creation(false);
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    let brokers = resp.brokers.iter().map(|b| (b.node_id.0, b.port)).collect();
    let t = &resp.topics[0];
    assert_eq!(t.error_code, 0, "{t:?}");
    let lead = t
        .partitions
        .iter()
        .map(|p| {
            assert_eq!(p.error_code, 0, "{p:?}");
            (p.partition_index, p.leader_id.0)
        })
        .collect();
    (lead, brokers)
}

async fn produce_one(c: &mut Conn, topic: &str, p: i32) -> i16 {
    let mut records = BytesMut::new();
    encode(
        &mut records,
        &[OutRecord {
            offset: 0,
            timestamp: 1,
            key: Some(b"k"),
            value: Some(b"v"),
            headers: &[],
        }],
    );
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(records.freeze()))])]);
    let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
    resp.responses[0].partition_responses[0].error_code
}

async fn fetch_one(c: &mut Conn, topic: &str, p: i32) -> i16 {
    let req = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = c.call(ApiKey::Fetch, 12, &req).await;
    resp.responses[0].partitions[0].error_code
}

async fn list_offsets_one(c: &mut Conn, topic: &str, p: i32) -> i16 {
    let req = ListOffsetsRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_timestamp(-1)])]);
    let resp: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 7, &req).await;
    resp.topics[0].partitions[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_is_a_broker_and_only_leaders_and_coordinators_act() {
    let kafka_ports = [free_port(), free_port()];
    let mut cluster = TestCluster::start("kafkacluster", 0, &["--lease", "2s"]).await;
    for port in kafka_ports {
        let listen = format!("127.0.0.1:{port}");
        cluster
            .add_node_with_env(&[("PICOMQ_KAFKA_LISTEN", &listen)])
            .await;
    }
    cluster.wait_balanced(0, 2, Duration::from_secs(30)).await;
    let mut conns = [
        Conn::connect(kafka_ports[0]).await,
        Conn::connect(kafka_ports[1]).await,
    ];

    // Any broker creates a topic: its partitions are made where they are served.
    let topic = "kc";
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(16)
            .with_replication_factor(1)]);
    let created: CreateTopicsResponse = conns[0].call(ApiKey::CreateTopics, 5, &create).await;
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0]);

    // Both nodes name both brokers, at their Kafka ports, and the same leaders;
    // each broker leads some partitions.
    let (lead, brokers) = leaders(&mut conns[0], topic).await;
    let (lead_1, brokers_1) = leaders(&mut conns[1], topic).await;
    assert_eq!(lead.len(), 16);
    assert_eq!(lead, lead_1, "the nodes disagree on the leaders");
    assert_eq!(brokers, brokers_1, "the nodes disagree on the brokers");
    let ports: BTreeSet<i32> = brokers.values().copied().collect();
    let want: BTreeSet<i32> = kafka_ports.iter().map(|p| i32::from(*p)).collect();
    assert_eq!(ports, want, "brokers {brokers:?}");
    let leading: BTreeSet<i32> = lead.values().copied().collect();
    assert_eq!(leading.len(), 2, "one broker leads everything: {lead:?}");
    let described: DescribeClusterResponse = conns[1]
        .call(
            ApiKey::DescribeCluster,
            0,
            &DescribeClusterRequest::default(),
        )
        .await;
    assert_eq!(described.brokers.len(), 2, "{described:?}");

    // Each partition: its leader appends, fetches and lists offsets; the other
    // broker refuses all three with NOT_LEADER_OR_FOLLOWER and appends nothing.
    let node_of = |broker: i32| {
        let port = brokers[&broker];
        kafka_ports
            .iter()
            .position(|p| i32::from(*p) == port)
            .unwrap()
    };
    for (p, broker) in &lead {
        let leader = node_of(*broker);
        let other = 1 - leader;
        assert_eq!(produce_one(&mut conns[leader], topic, *p).await, 0, "p{p}");
        let refused = produce_one(&mut conns[other], topic, *p).await;
        assert_eq!(
            refused, NOT_LEADER_OR_FOLLOWER,
            "p{p} produced at a non-leader"
        );
        assert_eq!(fetch_one(&mut conns[leader], topic, *p).await, 0, "p{p}");
        let refused = fetch_one(&mut conns[other], topic, *p).await;
        assert_eq!(
            refused, NOT_LEADER_OR_FOLLOWER,
            "p{p} fetched at a non-leader"
        );
        let refused = list_offsets_one(&mut conns[other], topic, *p).await;
        assert_eq!(
            refused, NOT_LEADER_OR_FOLLOWER,
            "p{p} offsets at a non-leader"
        );
        let stream = if *p == 0 {
            topic.to_string()
        } else {
            format!("{topic}~{p}")
        };
        let r = cluster
            .node(other)
            .client
            .get(&format!("/__picomq/streams/{stream}/info"))
            .await
            .unwrap();
        assert!(r.text().contains("\"next_seq\":1"), "p{p}: {}", r.text());
    }

    // A group: both nodes name the same coordinator; the other refuses the
    // group's requests with NOT_COORDINATOR.
    for group in ["g-1", "g-2", "g-3", "g-4"] {
        let find = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str(group))
            .with_key_type(0);
        let a: FindCoordinatorResponse = conns[0].call(ApiKey::FindCoordinator, 3, &find).await;
        let b: FindCoordinatorResponse = conns[1].call(ApiKey::FindCoordinator, 3, &find).await;
        assert_eq!(a.error_code, 0, "{a:?}");
        assert_eq!((a.node_id, a.port), (b.node_id, b.port), "{group}");
        let coordinator = kafka_ports
            .iter()
            .position(|p| i32::from(*p) == a.port)
            .unwrap();
        let other = 1 - coordinator;
        let join = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(b"\0"))]);
        let refused: JoinGroupResponse = conns[other].call(ApiKey::JoinGroup, 5, &join).await;
        assert_eq!(refused.error_code, NOT_COORDINATOR, "{group}: {refused:?}");
        let joined: JoinGroupResponse = conns[coordinator].call(ApiKey::JoinGroup, 5, &join).await;
        // The coordinator takes it (a first join asks for a member id).
        assert_ne!(joined.error_code, NOT_COORDINATOR, "{group}: {joined:?}");
        let offsets =
            OffsetFetchRequest::default().with_group_id(GroupId(StrBytes::from_static_str(group)));
        let refused: OffsetFetchResponse =
            conns[other].call(ApiKey::OffsetFetch, 5, &offsets).await;
        assert_eq!(refused.error_code, NOT_COORDINATOR, "{group}: {refused:?}");
        let fetched: OffsetFetchResponse = conns[coordinator]
            .call(ApiKey::OffsetFetch, 5, &offsets)
            .await;
        assert_eq!(fetched.error_code, 0, "{group}: {fetched:?}");
    }

    // A member waiting in JoinGroup while its coordinator's node is drained is
    // answered NOT_COORDINATOR at once, not at its rebalance timeout.
    let group = "g-drained";
    let find = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_static_str(group))
        .with_key_type(0);
    let found: FindCoordinatorResponse = conns[0].call(ApiKey::FindCoordinator, 3, &find).await;
    let coordinator = kafka_ports
        .iter()
        .position(|p| i32::from(*p) == found.port)
        .unwrap();
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(group)))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_member_id(StrBytes::from_string(member.to_string()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(b"\0"))])
    };
    // Member one joins and the group settles on it.
    let mut first = Conn::connect(kafka_ports[coordinator]).await;
    let asked: JoinGroupResponse = first.call(ApiKey::JoinGroup, 5, &join("")).await;
    let one = asked.member_id.to_string();
    let joined: JoinGroupResponse = first.call(ApiKey::JoinGroup, 5, &join(&one)).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    // Member two joins: a rebalance that waits for member one (up to 30 s).
    let mut second = Conn::connect(kafka_ports[coordinator]).await;
    let asked: JoinGroupResponse = second.call(ApiKey::JoinGroup, 5, &join("")).await;
    let two = asked.member_id.to_string();
    let drain = {
        let client = cluster.node(coordinator).client.clone();
        let path = format!(
            "/__picomq/nodes/{}/drain",
            TestCluster::node_id(coordinator)
        );
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.post(&path, &[], "").await.unwrap()
        })
    };
    let started = std::time::Instant::now();
    let waited: JoinGroupResponse = second.call(ApiKey::JoinGroup, 5, &join(&two)).await;
    assert_eq!(waited.error_code, NOT_COORDINATOR, "{waited:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered after {:?}",
        started.elapsed()
    );
    let drained = drain.await.unwrap();
    assert!(drained.status.is_success(), "{}", drained.text());
    cluster.shut_down().await;
}
