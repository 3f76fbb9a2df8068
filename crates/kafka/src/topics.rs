//! From a topic and partition in a request to a stream, through the one
//! authorization decision the HTTP edge uses (a token's scopes and namespace).

use std::collections::BTreeSet;

use picomq_engine::{CreateRequest, EngineError, StreamName, StreamRef};
use picomq_http::auth::{Access, Op};

use crate::conn::Session;
use crate::errors::{self, code};
use crate::{names, Kafka};

/// Why a partition cannot be used: a Kafka error code and a message.
pub(crate) type Refusal = (i16, String);

pub(crate) fn access<'a>(kafka: &'a Kafka, session: &'a Session) -> Access<'a> {
    Access::new(kafka.auth.as_ref(), session.principal.as_ref())
}

/// The absolute stream name behind partition `p` of `topic`, if the caller may do
/// `op` on it.
pub(crate) fn stream_name(
    kafka: &Kafka,
    session: &Session,
    topic: &str,
    p: i32,
    op: Op,
) -> Result<StreamName, Refusal> {
    let base = names::stream_of(topic).ok_or_else(|| {
        (
            code::INVALID_TOPIC_EXCEPTION,
            format!("{topic:?} is not a topic name this server gives out (docs/kafka.md)"),
        )
    })?;
    if p < 0 || p >= kafka.config.partitions_max {
        return Err((
            code::UNKNOWN_TOPIC_OR_PARTITION,
            format!("partition {p} does not exist"),
        ));
    }
    let name = access(kafka, session)
        .stream(op, names::partition_stream(&base, p))
        .map_err(|e| (code::TOPIC_AUTHORIZATION_FAILED, e.message))?;
    StreamName::new(name, kafka.engine.config().stream_name_bytes_max)
        .map_err(|e| (code::INVALID_TOPIC_EXCEPTION, e.to_string()))
}

/// The stream behind a partition, resolved.
pub(crate) async fn partition(
    kafka: &Kafka,
    session: &Session,
    topic: &str,
    p: i32,
    op: Op,
) -> Result<(StreamName, StreamRef), Refusal> {
    let name = stream_name(kafka, session, topic, p, op)?;
    match kafka.engine.stream(&name).await {
        Ok(s) => Ok((name, s)),
        Err(e) => Err(errors::of(&e)),
    }
}

/// How many partitions the topic whose partition 0 is the absolute stream `base`
/// has: 0 when `base` does not exist, else 1 and its `~N` streams from 1 up.
pub(crate) async fn partition_count(kafka: &Kafka, base: &StreamName) -> Result<i32, EngineError> {
    Ok(partition_count_and_id(kafka, base)
        .await?
        .map_or(0, |(n, _)| n))
}

/// [`partition_count`] and the id of the partition-0 stream; `None` when there is
/// no such topic.
pub(crate) async fn partition_count_and_id(
    kafka: &Kafka,
    base: &StreamName,
) -> Result<Option<(i32, u64)>, EngineError> {
    let id = match kafka.engine.stream(base).await {
        Ok(s) => s.handle.config.id,
        Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
        Err(e) => return Err(e),
    };
    let prefix = format!("{base}~");
    let max = kafka.config.partitions_max;
    let page = kafka.engine.list(&prefix, "", max as u32 + 16).await?;
    let found: BTreeSet<i32> = page
        .streams
        .iter()
        .filter_map(|s| names::split_partition(&s.name))
        .filter(|(b, _)| *b == base.as_str())
        .map(|(_, p)| p)
        .collect();
    let mut n = 1;
    while n < max && found.contains(&n) {
        n += 1;
    }
    kafka.remember_topic(
        crate::consumer_protocol::topic_id(&kafka.cluster_id, id, base),
        base,
    );
    Ok(Some((n, id)))
}

/// Creates partitions `from..to` of the topic whose partition 0 is `base`.
pub(crate) async fn create_partitions(
    kafka: &Kafka,
    base: &str,
    from: i32,
    to: i32,
    retention_secs: Option<u64>,
) -> Result<(), EngineError> {
    for p in from..to {
        let name = StreamName::new(
            names::partition_stream(base, p),
            kafka.engine.config().stream_name_bytes_max,
        )?;
        let mut create = CreateRequest::new(name);
        create.retention_secs = retention_secs;
        kafka.engine.create(create).await?;
    }
    Ok(())
}

/// Whether the caller may see a stream at all (any of its operations on it).
pub(crate) fn visible(access: &Access<'_>, name: &str) -> bool {
    [Op::Read, Op::Append, Op::Create, Op::Delete]
        .into_iter()
        .any(|op| access.allows(op, name))
}
