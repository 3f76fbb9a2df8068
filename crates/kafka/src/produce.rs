//! Produce (InitProducerId is in `txn`).
//!
//! Each partition's batch becomes one append to its stream: the records keep
//! their key, value, headers and timestamp (`RecordExt`), and the answer waits
//! for the append to be durable whatever `acks` says (`acks=0` only drops the
//! answer). An idempotent producer's batch carries the stamp the HTTP producers
//! use: id `kafka-{producer_id}`, the producer epoch, and the batch's sequence
//! numbers `base..=base+count-1`, so a retried batch is answered as a duplicate
//! and a gap is refused, across restarts (the stamp is in the WAL).

use futures::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use picomq_engine::{
    AppendOutcome, AppendRequest, ContentType, CreateRequest, EngineError, NewRecord, Producer,
    RecordExt, StreamName,
};
use picomq_http::auth::Op;
use tokio::sync::oneshot;

use crate::api::{decode, frame, Answer};
use crate::batch::{self, BatchError, Limits};
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::{topics, Kafka};

/// `sequenced` hears once every partition's append has its place (or failed): the
/// connection's next produce request may start then.
pub(crate) async fn produce(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
    sequenced: oneshot::Sender<()>,
) -> Result<Answer, Answer> {
    let req: ProduceRequest = decode(request)?;
    let acks = req.acks;
    let mut work = Vec::new();
    for topic in &req.topic_data {
        for part in &topic.partition_data {
            work.push((topic.name.0.as_str(), part.index, part.records.clone()));
        }
    }
    let transactional = req.transactional_id.is_some();
    let txn_allowed = req
        .transactional_id
        .as_ref()
        .map(|id| crate::txn::txn_key(kafka, session, id));
    let txn_allowed = &txn_allowed;
    let (signals, waits): (Vec<_>, Vec<_>) = work.iter().map(|_| oneshot::channel()).unzip();
    let all_sequenced = async move {
        for w in waits {
            let _ = w.await;
        }
        let _ = sequenced.send(());
    };
    let appends = join_all(work.iter().zip(signals).map(
        |((topic, p, records), signal)| async move {
            let r = if !matches!(acks, -1..=1) {
                Err((
                    code::INVALID_REQUIRED_ACKS,
                    format!("acks={acks}: use 0, 1 or all (-1)"),
                ))
            } else if let Some(Err(c)) = &txn_allowed {
                Err((
                    *c,
                    "this token may not use that transactional id".to_string(),
                ))
            } else {
                partition(
                    kafka,
                    session,
                    topic,
                    *p,
                    records.clone(),
                    transactional,
                    signal,
                )
                .await
            };
            (*topic, *p, r)
        },
    ));
    let ((), results) = futures::join!(all_sequenced, appends);
    if acks == 0 {
        return Ok(Answer::None);
    }
    let mut resp = ProduceResponse::default();
    for (topic, p, r) in results {
        let mut part = PartitionProduceResponse::default().with_index(p);
        part.log_append_time_ms = -1;
        part.log_start_offset = -1;
        match r {
            Ok(base) => part.base_offset = base,
            Err((c, message)) => {
                part.error_code = c;
                part.base_offset = -1;
                part.error_message = Some(StrBytes::from_string(message));
            }
        }
        match resp
            .responses
            .iter_mut()
            .find(|t| t.name.0.as_str() == topic)
        {
            Some(t) => t.partition_responses.push(part),
            None => resp.responses.push(
                TopicProduceResponse::default()
                    .with_name(kafka_protocol::messages::TopicName(StrBytes::from_string(
                        topic.to_string(),
                    )))
                    .with_partition_responses(vec![part]),
            ),
        }
    }
    Ok(frame(ApiKey::Produce, &request.header, &resp))
}

/// One partition's batch: its base offset (the first record's sequence number,
/// or -1 for a duplicate whose first offset is not known here).
async fn partition(
    kafka: &Kafka,
    session: &Session,
    topic: &str,
    p: i32,
    records: Option<bytes::Bytes>,
    transactional: bool,
    sequenced: oneshot::Sender<()>,
) -> Result<i64, topics::Refusal> {
    let name = topics::stream_name(kafka, session, topic, p, Op::Append)?;
    let records = records.ok_or((code::CORRUPT_MESSAGE, "no records".to_string()))?;
    let limits = Limits {
        records: kafka.config.batch_records_max,
        decompressed_bytes: kafka.engine.config().append_bytes_max,
    };
    let batch = batch::decode_one(records, limits).map_err(|e| match e {
        BatchError::Corrupt(m) => (code::CORRUPT_MESSAGE, m),
        BatchError::Invalid(m) => (code::INVALID_RECORD, m),
        BatchError::TooLarge(m) => (code::MESSAGE_TOO_LARGE, m),
    })?;
    if batch.control {
        return Err((
            code::INVALID_RECORD,
            "control batches are written by the broker, not produced".to_string(),
        ));
    }
    if batch.transactional != transactional {
        return Err((
            code::INVALID_RECORD,
            "a transactional batch comes with a transactional id, and only then".to_string(),
        ));
    }
    if transactional && (batch.producer_id < 0 || batch.producer_epoch < 0) {
        return Err((
            code::INVALID_RECORD,
            "a transactional batch needs its producer id and epoch".to_string(),
        ));
    }
    if batch.records.is_empty() {
        return Err((code::INVALID_RECORD, "an empty batch".to_string()));
    }
    let count = batch.records.len() as u64;
    // A record's bytes are never empty (RecordExt): a null or empty value is
    // stored as a placeholder that the stream's readers can parse.
    let stream = kafka
        .engine
        .stream(&name)
        .await
        .map_err(|e| errors::of(&e))?;
    let json = stream.handle.config.json;
    let placeholder = bytes::Bytes::from_static(if json { b"null" } else { b"\0" });
    let mut out = Vec::with_capacity(batch.records.len());
    for r in batch.records {
        let null_value = r.value.is_none();
        let empty_value = r.value.as_ref().is_some_and(|v| v.is_empty());
        let ext = RecordExt {
            client_ts_ms: u64::try_from(r.timestamp).ok(),
            headers: r
                .headers
                .into_iter()
                .map(|(n, v)| (n, v.unwrap_or_default()))
                .collect(),
            key: r.key,
            null_value,
            empty_value,
        };
        let data = match r.value {
            Some(v) if !v.is_empty() => v,
            _ => placeholder.clone(),
        };
        out.push(NewRecord {
            data,
            ext: Some(ext.encode()),
        });
    }
    // A transaction's batch waits beside its stream for the outcome (txn.rs).
    let target = if transactional {
        let stage = crate::txn::stage_name(batch.producer_id, batch.producer_epoch, name.as_str());
        StreamName::new(stage, kafka.engine.config().stream_name_bytes_max)
            .map_err(|e| (code::INVALID_TOPIC_EXCEPTION, e.to_string()))?
    } else {
        name
    };
    if transactional {
        // Checked now against the topic's stream and subjects: its records reach
        // the stream only at the commit, which must not fail on them.
        let checked = picomq_engine::schemas::StreamRef {
            id: stream.handle.config.id,
            name: &stream.handle.config.name,
            json,
        };
        kafka
            .engine
            .check_records(&checked, Some(topic), &out)
            .map_err(|e| errors::of(&e))?;
    }
    let mut append = AppendRequest::new(target.clone(), None, bytes::Bytes::new());
    append.records = Some(out);
    if !transactional {
        append.schema_topic = Some(topic.to_string());
    }
    if batch.producer_id >= 0 {
        if batch.base_sequence < 0 || batch.producer_epoch < 0 {
            return Err((
                code::INVALID_RECORD,
                "an idempotent batch needs a base sequence and an epoch".to_string(),
            ));
        }
        let id = picomq_engine::ProducerId::new(
            format!("kafka-{}", batch.producer_id),
            kafka.engine.config().producer_id_bytes_max,
        )
        .map_err(|e| (code::INVALID_RECORD, e.to_string()))?;
        let first = batch.base_sequence as u64;
        append.producer = Some(Producer {
            id,
            epoch: batch.producer_epoch as u64,
            seq: first + count - 1,
            first_seq: Some(first),
        });
    }
    if transactional {
        let outcome = match kafka.engine.append(append.clone()).await {
            Err(EngineError::NotFound) => {
                let mut create = CreateRequest::new(target);
                create.content_type = ContentType::new(&stream.handle.config.content_type, 256)
                    .map_err(|e| (code::INVALID_RECORD, e.to_string()))?;
                match kafka.engine.create(create).await {
                    Ok(_) | Err(EngineError::Conflict(_)) => {}
                    Err(e) => return Err(errors::of(&e)),
                }
                kafka.engine.append(append).await
            }
            other => other,
        };
        drop(sequenced);
        // Its offsets are given at the commit: none yet.
        return outcome.map(|_| -1).map_err(|e| errors::of(&e));
    }
    match kafka.engine.append_signalled(append, Some(sequenced)).await {
        Ok(AppendOutcome::Appended { seqs, .. }) => Ok(seqs.start as i64),
        Ok(AppendOutcome::Duplicate { .. }) => Ok(-1),
        Err(e) => Err(errors::of(&e)),
    }
}
