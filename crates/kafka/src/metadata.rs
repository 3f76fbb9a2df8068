//! Metadata, ListOffsets and DescribeCluster.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use picomq_engine::Seek;
use picomq_http::auth::Op;

use crate::api::{decode, frame, Answer};
use crate::conn::{Request, Session};
use crate::consumer_protocol::topic_id;
use crate::errors::{self, code};
use crate::{names, topics, Kafka};

const UNKNOWN_TOPIC_ID: i16 = 100;

/// Topics a Metadata request for "all topics" lists at most.
const LISTED_MAX: usize = 10_000;

const LEADER_NOT_AVAILABLE: i16 = 5;

fn brokers(kafka: &Kafka) -> Vec<MetadataResponseBroker> {
    kafka
        .brokers()
        .into_iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.id))
                .with_host(StrBytes::from_string(b.host))
                .with_port(b.port)
        })
        .collect()
}

/// Topic `name` (as the client names it) whose partition 0 is the absolute stream
/// `base`: each partition led by the member serving its stream.
fn topic_entry(
    kafka: &Kafka,
    name: &str,
    base: &str,
    id: uuid::Uuid,
    partitions: i32,
) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
        .with_topic_id(id)
        .with_partitions(
            (0..partitions)
                .map(|p| {
                    let part = MetadataResponsePartition::default().with_partition_index(p);
                    match kafka.leader(&names::partition_stream(base, p)) {
                        Some(l) => part
                            .with_leader_id(BrokerId(l.broker))
                            .with_leader_epoch(l.epoch)
                            .with_replica_nodes(vec![BrokerId(l.broker)])
                            .with_isr_nodes(vec![BrokerId(l.broker)]),
                        // Moving between members: the client asks again.
                        None => part
                            .with_error_code(LEADER_NOT_AVAILABLE)
                            .with_leader_id(BrokerId(-1))
                            .with_leader_epoch(-1),
                    }
                })
                .collect(),
        )
}

fn topic_error(name: &str, c: i16) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
        .with_error_code(c)
}

pub(crate) async fn metadata(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: MetadataRequest = decode(request)?;
    let mut resp = MetadataResponse::default()
        .with_brokers(brokers(kafka))
        .with_cluster_id(Some(StrBytes::from_string(kafka.cluster_id.clone())))
        // Any broker takes administrative requests (it makes them at the
        // partitions' owners): clients send them to the one they asked.
        .with_controller_id(BrokerId(kafka.broker_id()));
    match &req.topics {
        None => resp.topics = all_topics(kafka, session).await,
        Some(asked) => {
            for t in asked {
                let auto = req.allow_auto_topic_creation && kafka.config.auto_create_topics;
                let name = match &t.name {
                    Some(name) => name.0.to_string(),
                    // By id (a KIP-848 member resolving its assignment).
                    None => {
                        let access = topics::access(kafka, session);
                        let shown = kafka
                            .topic_of_id(&t.topic_id)
                            .and_then(|abs| access.shown(&abs).and_then(names::topic_of));
                        match shown {
                            Some(name) => name,
                            None => {
                                resp.topics.push(
                                    MetadataResponseTopic::default()
                                        .with_topic_id(t.topic_id)
                                        .with_error_code(UNKNOWN_TOPIC_ID),
                                );
                                continue;
                            }
                        }
                    }
                };
                resp.topics
                    .push(one_topic(kafka, session, &name, auto).await);
            }
        }
    }
    Ok(frame(ApiKey::Metadata, &request.header, &resp))
}

async fn one_topic(
    kafka: &Kafka,
    session: &Session,
    name: &str,
    auto: bool,
) -> MetadataResponseTopic {
    let access = topics::access(kafka, session);
    let base = match topics::stream_name(kafka, session, name, 0, Op::Read) {
        Ok(base) => base,
        // A producer with `append` only still needs its topic's partitions.
        Err(_) => match topics::stream_name(kafka, session, name, 0, Op::Append) {
            Ok(base) => base,
            Err((c, _)) => return topic_error(name, c),
        },
    };
    match topics::partition_count_and_id(kafka, &base).await {
        Ok(Some((n, id))) => {
            return topic_entry(
                kafka,
                name,
                &base,
                topic_id(&kafka.cluster_id, id, &base),
                n,
            );
        }
        Ok(None) => {}
        Err(e) => return topic_error(name, errors::of(&e).0),
    }
    if !auto || !access.allows(Op::Create, &base) {
        return topic_error(name, code::UNKNOWN_TOPIC_OR_PARTITION);
    }
    let partitions = kafka.config.default_partitions;
    if let Err(e) = topics::create_partitions(kafka, &base, 0, partitions, None).await {
        return topic_error(name, errors::of(&e).0);
    }
    match topics::partition_count_and_id(kafka, &base).await {
        Ok(Some((n, id))) => topic_entry(
            kafka,
            name,
            &base,
            topic_id(&kafka.cluster_id, id, &base),
            n,
        ),
        Ok(None) => topic_error(name, code::UNKNOWN_TOPIC_OR_PARTITION),
        Err(e) => topic_error(name, errors::of(&e).0),
    }
}

/// Every stream the caller can see, as topics: `~N` partition streams fold into
/// their topic when its partition 0 exists.
async fn all_topics(kafka: &Kafka, session: &Session) -> Vec<MetadataResponseTopic> {
    let access = topics::access(kafka, session);
    let namespace = access.namespace().to_string();
    let mut names = Vec::new();
    let mut ids = std::collections::HashMap::new();
    let mut after = String::new();
    while names.len() < LISTED_MAX {
        let page = match kafka.engine.list(&namespace, &after, 1_000).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "kafka metadata: listing streams failed");
                break;
            }
        };
        for s in &page.streams {
            if topics::visible(&access, &s.name) {
                ids.insert(s.name.clone(), s.id);
                names.push(s.name.clone());
            }
        }
        match page.next {
            Some(n) => after = n,
            None => break,
        }
    }
    let present: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut counts: std::collections::BTreeMap<&str, i32> = Default::default();
    for name in &names {
        match names::split_partition(name) {
            Some((base, _)) if present.contains(base) => {}
            _ => {
                counts.insert(name.as_str(), 1);
            }
        }
    }
    // Contiguous partitions from 1 up.
    for (base, n) in counts.iter_mut() {
        while *n < kafka.config.partitions_max
            && present.contains(names::partition_stream(base, *n).as_str())
        {
            *n += 1;
        }
    }
    counts
        .into_iter()
        .filter_map(|(abs, n)| {
            let shown = access.shown(abs)?;
            let topic = names::topic_of(shown)?;
            let id = topic_id(&kafka.cluster_id, ids[abs], abs);
            kafka.remember_topic(id, abs);
            Some(topic_entry(kafka, &topic, abs, id, n))
        })
        .collect()
}

pub(crate) async fn list_offsets(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: ListOffsetsRequest = decode(request)?;
    let mut resp = ListOffsetsResponse::default();
    for t in &req.topics {
        let mut out = ListOffsetsTopicResponse::default().with_name(t.name.clone());
        for p in &t.partitions {
            let mut part = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_timestamp(-1)
                .with_offset(-1);
            match offset_at(
                kafka,
                session,
                t.name.0.as_str(),
                p.partition_index,
                p.timestamp,
            )
            .await
            {
                Ok((offset, ts)) => {
                    part.offset = offset;
                    part.timestamp = ts;
                }
                Err((c, _)) => part.error_code = c,
            }
            out.partitions.push(part);
        }
        resp.topics.push(out);
    }
    Ok(frame(ApiKey::ListOffsets, &request.header, &resp))
}

/// Kafka's special timestamps: -1 the next offset, -2 the first retained,
/// -3 the record with the highest timestamp (the last: server times never
/// decrease along a stream). Others: the first record appended at or after it.
async fn offset_at(
    kafka: &Kafka,
    session: &Session,
    topic: &str,
    p: i32,
    timestamp: i64,
) -> Result<(i64, i64), topics::Refusal> {
    let (_, stream) = topics::partition(kafka, session, topic, p, Op::Read).await?;
    let engine = &kafka.engine;
    let fail = |e: picomq_engine::EngineError| errors::of(&e);
    match timestamp {
        -1 => Ok((stream.handle.view().tail_seq as i64, -1)),
        -2 => Ok((
            engine.first_record(&stream).await.map_err(fail)?.seq as i64,
            -1,
        )),
        -3 => {
            let tail = stream.handle.view().tail_seq;
            if tail == 0 {
                return Ok((-1, -1));
            }
            let at = engine
                .seek(&stream, Seek::Seq(tail - 1))
                .await
                .map_err(fail)?;
            Ok((at.seq as i64, at.ts_ms.map_or(-1, |t| t as i64)))
        }
        t if t >= 0 => {
            let at = engine
                .seek(&stream, Seek::Time(t as u64))
                .await
                .map_err(fail)?;
            Ok(match at.ts_ms {
                Some(ts) => (at.seq as i64, ts as i64),
                None => (-1, -1),
            })
        }
        t => Err((
            code::INVALID_REQUEST,
            format!("timestamp {t} is not one Kafka defines"),
        )),
    }
}

pub(crate) fn describe_cluster(kafka: &Kafka, request: &Request) -> Result<Answer, Answer> {
    let _: kafka_protocol::messages::DescribeClusterRequest = decode(request)?;
    let resp = DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(kafka.cluster_id.clone()))
        .with_controller_id(BrokerId(kafka.broker_id()))
        .with_brokers(
            kafka
                .brokers()
                .into_iter()
                .map(|b| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(b.id))
                        .with_host(StrBytes::from_string(b.host))
                        .with_port(b.port)
                })
                .collect(),
        );
    Ok(frame(ApiKey::DescribeCluster, &request.header, &resp))
}
