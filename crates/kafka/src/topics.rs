//! From a topic and partition in a request to a stream, through the one
//! authorization decision the HTTP edge uses (a token's scopes and namespace).

use std::collections::BTreeSet;

use std::time::Duration;

use picomq_engine::cluster::{StreamAdmin, StreamAdminAnswer};
use picomq_engine::{EngineError, StreamName, StreamRef};
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
    // The stream itself where this node serves it; else the metadata listing,
    // which every member reads without calling the owner (a Metadata request
    // must not wait on a member that died: its partitions are about to move).
    let id = if kafka.engine.serves(base) {
        match kafka.engine.stream(base).await {
            Ok(s) => s.handle.config.id,
            Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
            Err(e) => return Err(e),
        }
    } else {
        let page = kafka.engine.list(base, "", 1).await?;
        match page.streams.first() {
            Some(s) if s.name == base.as_str() => s.id,
            _ => return Ok(None),
        }
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

/// The stream `name` (absolute) as the member serving it knows it.
pub(crate) async fn info(kafka: &Kafka, name: &str) -> Result<StreamAdminAnswer, EngineError> {
    kafka
        .engine
        .admin(&StreamAdmin::Info {
            stream: name.to_string(),
        })
        .await
}

/// How long a topic created on a cluster may take to be listed whole: each
/// member indexes what it created within about 200 ms.
const LISTED_WAIT: Duration = Duration::from_secs(5);

/// Creates partitions `from..to` of the topic whose partition 0 is `base`, each
/// at the member serving its stream. On a cluster it returns once the listing
/// every broker's Metadata reads shows them all.
pub(crate) async fn create_partitions(
    kafka: &Kafka,
    base: &StreamName,
    from: i32,
    to: i32,
    retention_secs: Option<u64>,
) -> Result<(), EngineError> {
    for p in from..to {
        kafka
            .engine
            .admin(&StreamAdmin::Create {
                stream: names::partition_stream(base, p),
                content_type: None,
                retention_secs,
            })
            .await?;
    }
    if kafka.engine.cluster().is_some() {
        let deadline = tokio::time::Instant::now() + LISTED_WAIT;
        while partition_count(kafka, base).await? < to && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Deletes the stream `name` (absolute) at the member serving it.
pub(crate) async fn delete(kafka: &Kafka, name: &str) -> Result<(), EngineError> {
    kafka
        .engine
        .admin(&StreamAdmin::Delete {
            stream: name.to_string(),
        })
        .await
        .map(|_| ())
}

/// Sets the retention of the stream `name` (absolute) at the member serving it.
pub(crate) async fn set_retention(
    kafka: &Kafka,
    name: &str,
    retention_secs: Option<u64>,
) -> Result<(), EngineError> {
    kafka
        .engine
        .admin(&StreamAdmin::SetRetention {
            stream: name.to_string(),
            retention_secs,
        })
        .await
        .map(|_| ())
}

/// Whether the caller may see a stream at all (any of its operations on it).
pub(crate) fn visible(access: &Access<'_>, name: &str) -> bool {
    [Op::Read, Op::Append, Op::Create, Op::Delete]
        .into_iter()
        .any(|op| access.allows(op, name))
}
