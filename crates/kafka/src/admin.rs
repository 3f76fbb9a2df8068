//! Topic administration: CreateTopics, DeleteTopics, CreatePartitions, topic
//! configs (`retention.ms` is the streams' age retention; `cleanup.policy` can
//! only be `delete`) and DeleteRecords (a trim).

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, ApiKey, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use picomq_engine::{EngineError, Seek, StreamName};
use picomq_http::auth::Op;

use crate::api::{decode, frame, Answer};
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::topics::{self, Refusal};
use crate::{names, Kafka};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A topic config a client sets: `Some(retention)` for `retention.ms`
/// (`None` inside: keep everything), `None` for `cleanup.policy=delete`.
fn topic_config(name: &str, value: Option<&str>) -> Result<Option<Option<u64>>, String> {
    match (name, value) {
        ("retention.ms", Some(v)) => {
            let ms: i64 = v
                .parse()
                .map_err(|_| format!("retention.ms={v:?} is not a number of milliseconds"))?;
            match ms {
                -1 => Ok(Some(None)),
                ms if ms >= 1000 => Ok(Some(Some(ms as u64 / 1000))),
                _ => Err(format!(
                    "retention.ms={ms}: use -1 (keep everything) or at least 1000 (retention is kept in seconds)"
                )),
            }
        }
        ("retention.ms", None) => Ok(Some(None)),
        ("cleanup.policy", Some("delete")) => Ok(None),
        ("cleanup.policy", Some(v)) => Err(format!(
            "cleanup.policy={v}: only delete is supported (a stream keeps every record until retention or a trim)"
        )),
        (other, _) => Err(format!(
            "{other} is not a config this server supports (retention.ms, cleanup.policy)"
        )),
    }
}

/// The absolute partition-0 stream of `topic`, if the caller may do `op` on it.
fn base(kafka: &Kafka, session: &Session, topic: &str, op: Op) -> Result<StreamName, Refusal> {
    topics::stream_name(kafka, session, topic, 0, op)
}

pub(crate) async fn create_topics(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: CreateTopicsRequest = decode(request)?;
    let mut resp = CreateTopicsResponse::default();
    for t in &req.topics {
        let name = t.name.0.as_str();
        let mut result = CreatableTopicResult::default().with_name(t.name.clone());
        let partitions = if t.num_partitions == -1 {
            kafka.config.default_partitions
        } else {
            t.num_partitions
        };
        let outcome = async {
            if partitions < 1 || partitions > kafka.config.partitions_max {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!(
                        "{partitions} partitions: a topic has 1 to {}",
                        kafka.config.partitions_max
                    ),
                ));
            }
            if !t.assignments.is_empty() {
                return Err((
                    code::INVALID_REQUEST,
                    "replica assignments do not apply: every partition is in object storage"
                        .to_string(),
                ));
            }
            let mut retention = None;
            for c in &t.configs {
                if let Some(r) = topic_config(&c.name, c.value.as_deref())
                    .map_err(|m| (code::INVALID_CONFIG, m))?
                {
                    retention = r;
                }
            }
            let base = base(kafka, session, name, Op::Create)?;
            if topics::partition_count(kafka, &base)
                .await
                .map_err(|e| errors::of(&e))?
                > 0
            {
                return Err((
                    code::TOPIC_ALREADY_EXISTS,
                    format!("topic {name:?} already exists"),
                ));
            }
            if !req.validate_only {
                topics::create_partitions(kafka, &base, 0, partitions, retention)
                    .await
                    .map_err(|e| errors::of(&e))?;
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => {
                result.num_partitions = partitions;
                result.replication_factor = 1;
            }
            Err((c, m)) => {
                result.error_code = c;
                result.error_message = Some(text(&m));
                result.num_partitions = -1;
                result.replication_factor = -1;
            }
        }
        resp.topics.push(result);
    }
    Ok(frame(ApiKey::CreateTopics, &request.header, &resp))
}

pub(crate) async fn delete_topics(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: DeleteTopicsRequest = decode(request)?;
    let mut asked: Vec<TopicName> = req.topic_names.clone();
    asked.extend(req.topics.iter().filter_map(|t| t.name.clone()));
    let mut resp = DeleteTopicsResponse::default();
    for name in asked {
        let mut result = DeletableTopicResult::default().with_name(Some(name.clone()));
        let outcome = async {
            let base = base(kafka, session, name.0.as_str(), Op::Delete)?;
            let n = topics::partition_count(kafka, &base)
                .await
                .map_err(|e| errors::of(&e))?;
            if n == 0 {
                return Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    "no such topic".to_string(),
                ));
            }
            // The last partitions first: an interrupted delete leaves a topic
            // with fewer partitions, never one with a gap.
            for p in (0..n).rev() {
                match topics::delete(kafka, &names::partition_stream(&base, p)).await {
                    Ok(()) | Err(EngineError::NotFound) => {}
                    Err(e) => return Err(errors::of(&e)),
                }
            }
            Ok(())
        }
        .await;
        if let Err((c, m)) = outcome {
            result.error_code = c;
            result.error_message = Some(text(&m));
        }
        resp.responses.push(result);
    }
    Ok(frame(ApiKey::DeleteTopics, &request.header, &resp))
}

pub(crate) async fn create_partitions(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: CreatePartitionsRequest = decode(request)?;
    let mut resp = CreatePartitionsResponse::default();
    for t in &req.topics {
        let mut result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let outcome = async {
            let base = base(kafka, session, t.name.0.as_str(), Op::Create)?;
            let n = topics::partition_count(kafka, &base)
                .await
                .map_err(|e| errors::of(&e))?;
            if n == 0 {
                return Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    "no such topic".to_string(),
                ));
            }
            if t.count <= n || t.count > kafka.config.partitions_max {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!(
                        "the topic has {n} partitions: ask for more, at most {}",
                        kafka.config.partitions_max
                    ),
                ));
            }
            if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
                return Err((
                    code::INVALID_REQUEST,
                    "replica assignments do not apply: every partition is in object storage"
                        .to_string(),
                ));
            }
            if !req.validate_only {
                let info = topics::info(kafka, &base)
                    .await
                    .map_err(|e| errors::of(&e))?;
                topics::create_partitions(kafka, &base, n, t.count, info.retention_secs)
                    .await
                    .map_err(|e| errors::of(&e))?;
            }
            Ok(())
        }
        .await;
        if let Err((c, m)) = outcome {
            result.error_code = c;
            result.error_message = Some(text(&m));
        }
        resp.results.push(result);
    }
    Ok(frame(ApiKey::CreatePartitions, &request.header, &resp))
}

pub(crate) async fn describe_configs(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: DescribeConfigsRequest = decode(request)?;
    let mut resp = DescribeConfigsResponse::default();
    for r in &req.resources {
        let mut result = DescribeConfigsResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let entry = |name: &str, value: String, read_only: bool| {
            DescribeConfigsResourceResult::default()
                .with_name(text(name))
                .with_value(Some(text(&value)))
                .with_read_only(read_only)
                .with_config_source(if read_only { 5 } else { 1 })
        };
        match r.resource_type {
            RESOURCE_TOPIC => {
                let outcome = async {
                    let base = base(kafka, session, r.resource_name.as_str(), Op::Read)?;
                    topics::info(kafka, &base).await.map_err(|e| errors::of(&e))
                }
                .await;
                match outcome {
                    Ok(info) => {
                        let ms = info.retention_secs.map_or(-1, |s| s as i64 * 1000);
                        result.configs = vec![
                            entry("retention.ms", ms.to_string(), false),
                            entry("cleanup.policy", "delete".into(), false),
                            entry("message.timestamp.type", "CreateTime".into(), true),
                            entry(
                                "max.message.bytes",
                                kafka.engine.config().append_bytes_max.to_string(),
                                true,
                            ),
                        ];
                    }
                    Err((c, m)) => {
                        result.error_code = c;
                        result.error_message = Some(text(&m));
                    }
                }
            }
            RESOURCE_BROKER => {
                result.configs = vec![
                    entry(
                        "auto.create.topics.enable",
                        kafka.config.auto_create_topics.to_string(),
                        true,
                    ),
                    entry(
                        "num.partitions",
                        kafka.config.default_partitions.to_string(),
                        true,
                    ),
                    entry(
                        "socket.request.max.bytes",
                        kafka.config.max_request_bytes.to_string(),
                        true,
                    ),
                ];
            }
            other => {
                result.error_code = code::INVALID_REQUEST;
                result.error_message = Some(text(&format!(
                    "resource type {other}: only topics (2) and brokers (4) have configs here"
                )));
            }
        }
        resp.results.push(result);
    }
    Ok(frame(ApiKey::DescribeConfigs, &request.header, &resp))
}

/// Applies `retention` (if given) to every partition of `topic`.
async fn set_topic_retention(
    kafka: &Kafka,
    session: &Session,
    topic: &str,
    retention: Option<Option<u64>>,
    validate_only: bool,
) -> Result<(), Refusal> {
    // Changing retention deletes data: it takes the `delete` scope.
    let base = base(kafka, session, topic, Op::Delete)?;
    let n = topics::partition_count(kafka, &base)
        .await
        .map_err(|e| errors::of(&e))?;
    if n == 0 {
        return Err((
            code::UNKNOWN_TOPIC_OR_PARTITION,
            "no such topic".to_string(),
        ));
    }
    let Some(retention) = retention else {
        return Ok(());
    };
    if validate_only {
        return Ok(());
    }
    for p in 0..n {
        topics::set_retention(kafka, &names::partition_stream(&base, p), retention)
            .await
            .map_err(|e| errors::of(&e))?;
    }
    Ok(())
}

pub(crate) async fn alter_configs(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: AlterConfigsRequest = decode(request)?;
    let mut resp = AlterConfigsResponse::default();
    for r in &req.resources {
        let outcome = async {
            if r.resource_type != RESOURCE_TOPIC {
                return Err((
                    code::INVALID_REQUEST,
                    "only topic configs can be changed".to_string(),
                ));
            }
            // AlterConfigs replaces the whole set: what is not named returns to
            // its default (keep everything).
            let mut retention = Some(None);
            for c in &r.configs {
                if let Some(v) = topic_config(&c.name, c.value.as_deref())
                    .map_err(|m| (code::INVALID_CONFIG, m))?
                {
                    retention = Some(v);
                }
            }
            set_topic_retention(
                kafka,
                session,
                r.resource_name.as_str(),
                retention,
                req.validate_only,
            )
            .await
        }
        .await;
        let mut out = alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        if let Err((c, m)) = outcome {
            out.error_code = c;
            out.error_message = Some(text(&m));
        }
        resp.responses.push(out);
    }
    Ok(frame(ApiKey::AlterConfigs, &request.header, &resp))
}

pub(crate) async fn incremental_alter_configs(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: IncrementalAlterConfigsRequest = decode(request)?;
    let mut resp = IncrementalAlterConfigsResponse::default();
    for r in &req.resources {
        let outcome = async {
            if r.resource_type != RESOURCE_TOPIC {
                return Err((
                    code::INVALID_REQUEST,
                    "only topic configs can be changed".to_string(),
                ));
            }
            let mut retention = None;
            for c in &r.configs {
                // 0 SET, 1 DELETE (back to the default), 2 APPEND, 3 SUBTRACT.
                let value = match c.config_operation {
                    0 => c.value.as_deref(),
                    1 => None,
                    op => {
                        return Err((
                            code::INVALID_CONFIG,
                            format!("config operation {op}: only SET and DELETE apply here"),
                        ))
                    }
                };
                if let Some(v) =
                    topic_config(&c.name, value).map_err(|m| (code::INVALID_CONFIG, m))?
                {
                    retention = Some(v);
                }
            }
            set_topic_retention(
                kafka,
                session,
                r.resource_name.as_str(),
                retention,
                req.validate_only,
            )
            .await
        }
        .await;
        let mut out = incremental_alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        if let Err((c, m)) = outcome {
            out.error_code = c;
            out.error_message = Some(text(&m));
        }
        resp.responses.push(out);
    }
    Ok(frame(
        ApiKey::IncrementalAlterConfigs,
        &request.header,
        &resp,
    ))
}

/// DeleteRecords: records below the offset are trimmed (-1: the high watermark).
pub(crate) async fn delete_records(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: DeleteRecordsRequest = decode(request)?;
    let mut resp = DeleteRecordsResponse::default();
    for t in &req.topics {
        let mut out = DeleteRecordsTopicResult::default().with_name(t.name.clone());
        for p in &t.partitions {
            let mut result = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let outcome = async {
                let (name, stream) = topics::partition(
                    kafka,
                    session,
                    t.name.0.as_str(),
                    p.partition_index,
                    Op::Delete,
                )
                .await?;
                let tail = stream.handle.view().tail_seq;
                let before = match p.offset {
                    -1 => tail,
                    o if o >= 0 && o as u64 <= tail => o as u64,
                    o => {
                        return Err((
                            code::OFFSET_OUT_OF_RANGE,
                            format!("offset {o} is past the high watermark {tail}"),
                        ))
                    }
                };
                let at = kafka
                    .engine
                    .seek(&stream, Seek::Seq(before))
                    .await
                    .map_err(|e| errors::of(&e))?;
                kafka
                    .engine
                    .trim(&name, at.offset)
                    .await
                    .map_err(|e| errors::of(&e))?;
                let first = kafka
                    .engine
                    .first_record(&stream)
                    .await
                    .map_err(|e| errors::of(&e))?;
                Ok(first.seq as i64)
            }
            .await;
            match outcome {
                Ok(low) => result.low_watermark = low,
                Err((c, _)) => result.error_code = c,
            }
            out.partitions.push(result);
        }
        resp.topics.push(out);
    }
    Ok(frame(ApiKey::DeleteRecords, &request.header, &resp))
}
