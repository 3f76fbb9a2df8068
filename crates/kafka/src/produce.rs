//! Produce and InitProducerId.
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
use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
    ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use picomq_engine::{AppendOutcome, AppendRequest, NewRecord, Producer, RecordExt};
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
            } else if transactional {
                Err((
                    code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "transactions are not supported yet (docs/kafka.md)".to_string(),
                ))
            } else {
                partition(kafka, session, topic, *p, records.clone(), signal).await
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
    if batch.transactional || batch.control {
        return Err((
            code::INVALID_RECORD,
            "transactional and control batches are not supported yet".to_string(),
        ));
    }
    if batch.records.is_empty() {
        return Err((code::INVALID_RECORD, "an empty batch".to_string()));
    }
    let count = batch.records.len() as u64;
    // A record's bytes are never empty (RecordExt): a null or empty value is
    // stored as a placeholder that the stream's readers can parse.
    let json = kafka
        .engine
        .stream(&name)
        .await
        .map_err(|e| errors::of(&e))?
        .handle
        .config
        .json;
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
    let mut append = AppendRequest::new(name, None, bytes::Bytes::new());
    append.records = Some(out);
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
    match kafka.engine.append_signalled(append, Some(sequenced)).await {
        Ok(AppendOutcome::Appended { seqs, .. }) => Ok(seqs.start as i64),
        Ok(AppendOutcome::Duplicate { .. }) => Ok(-1),
        Err(e) => Err(errors::of(&e)),
    }
}

/// An idempotent producer's id: random, so no state is needed to hand them out
/// (two producers drawing the same of 2^62 ids is not a practical concern), and
/// an epoch bump when the client asks with its current id and epoch.
pub(crate) fn init_producer_id(
    _kafka: &Kafka,
    _session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: InitProducerIdRequest = decode(request)?;
    let mut resp = InitProducerIdResponse::default();
    if req.transactional_id.is_some() {
        resp.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        resp.producer_id = ProducerId(-1);
        resp.producer_epoch = -1;
        return Ok(frame(ApiKey::InitProducerId, &request.header, &resp));
    }
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        resp.producer_id = req.producer_id;
        resp.producer_epoch = req.producer_epoch + 1;
    } else {
        resp.producer_id = ProducerId(fastrand::i64(1..1 << 62));
        resp.producer_epoch = 0;
    }
    Ok(frame(ApiKey::InitProducerId, &request.header, &resp))
}
