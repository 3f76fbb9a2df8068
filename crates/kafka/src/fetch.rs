//! Fetch: each partition read from its offset (a record's sequence number) as one
//! uncompressed record batch, within the request's byte limits; when nothing is
//! there the request waits up to `max_wait_ms` for an append to any of its
//! partitions, by any protocol. `min_bytes` is met by any record: an answer goes
//! out as soon as there is one.

use std::time::Duration;

use bytes::BytesMut;
use futures::future::{select_all, FutureExt};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use picomq_engine::{EngineError, RecordExt, Seek, StreamRef};
use picomq_http::auth::Op;

use crate::api::{decode, frame, Answer};
use crate::batch::{self, OutRecord};
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::{topics, Kafka};

/// One partition asked for.
struct Asked {
    topic: String,
    partition: i32,
    offset: i64,
    max_bytes: usize,
}

pub(crate) async fn fetch(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: FetchRequest = decode(request)?;
    let total_max = (req.max_bytes.max(1) as usize).min(kafka.engine.config().read_bytes_max);
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(kafka.long_poll_max);
    let mut asked = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            asked.push(Asked {
                topic: t.topic.0.to_string(),
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: (p.partition_max_bytes.max(1) as usize).min(total_max),
            });
        }
    }
    let mut streams: Vec<Result<StreamRef, topics::Refusal>> = Vec::with_capacity(asked.len());
    for a in &asked {
        streams.push(
            topics::partition(kafka, session, &a.topic, a.partition, Op::Read)
                .await
                .map(|(_, s)| s),
        );
    }
    let mut parts = read_all(kafka, &asked, &streams, total_max).await;
    let got_data = parts
        .iter()
        .any(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()));
    let all_failed = parts.iter().all(|p| p.error_code != code::NONE);
    if !got_data && !all_failed && !wait.is_zero() && req.min_bytes > 0 {
        wait_for_any(kafka, &asked, &streams, wait).await;
        parts = read_all(kafka, &asked, &streams, total_max).await;
    }
    let mut resp = FetchResponse::default();
    for (a, part) in asked.iter().zip(parts) {
        match resp
            .responses
            .iter_mut()
            .find(|t| t.topic.0.as_str() == a.topic)
        {
            Some(t) => t.partitions.push(part),
            None => resp.responses.push(
                FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_string(a.topic.clone())))
                    .with_partitions(vec![part]),
            ),
        }
    }
    Ok(frame(ApiKey::Fetch, &request.header, &resp))
}

async fn read_all(
    kafka: &Kafka,
    asked: &[Asked],
    streams: &[Result<StreamRef, topics::Refusal>],
    total_max: usize,
) -> Vec<PartitionData> {
    // Partitions share the request's byte budget in order, as Kafka's do.
    let mut left = total_max;
    let mut out = Vec::with_capacity(asked.len());
    for (a, s) in asked.iter().zip(streams) {
        let part = match s {
            Ok(stream) if left > 0 => read(kafka, a, stream, a.max_bytes.min(left)).await,
            Ok(stream) => empty(a, stream),
            Err((c, _)) => PartitionData::default()
                .with_partition_index(a.partition)
                .with_error_code(*c)
                .with_high_watermark(-1),
        };
        left = left.saturating_sub(part.records.as_ref().map_or(0, |r| r.len()));
        out.push(part);
    }
    out
}

fn empty(a: &Asked, stream: &StreamRef) -> PartitionData {
    let hw = stream.handle.view().tail_seq as i64;
    PartitionData::default()
        .with_partition_index(a.partition)
        .with_high_watermark(hw)
        .with_last_stable_offset(hw)
}

async fn read(kafka: &Kafka, a: &Asked, stream: &StreamRef, max_bytes: usize) -> PartitionData {
    let engine = &kafka.engine;
    let hw = stream.handle.view().tail_seq as i64;
    let mut part = empty(a, stream);
    if a.offset == hw {
        return part;
    }
    let out_of_range = |mut part: PartitionData, start: i64| {
        part.error_code = code::OFFSET_OUT_OF_RANGE;
        part.log_start_offset = start;
        part
    };
    if a.offset < 0 || a.offset > hw {
        let start = engine
            .first_record(stream)
            .await
            .map_or(-1, |l| l.seq as i64);
        return out_of_range(part, start);
    }
    let n = a.offset as u64;
    let from = match engine.bookmarked(stream, n).await {
        Ok(Some(offset)) => Ok(offset),
        Ok(None) => match engine.seek(stream, Seek::Seq(n)).await {
            Ok(at) if at.seq > n => return out_of_range(part, at.seq as i64),
            Ok(at) => Ok(at.offset),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let chunk = match from {
        Ok(from) => engine.read(stream, from, max_bytes).await,
        Err(e) => Err(e),
    };
    let chunk = match chunk {
        Ok(c) => c,
        Err(EngineError::Trimmed { .. }) => {
            let start = engine
                .first_record(stream)
                .await
                .map_or(-1, |l| l.seq as i64);
            return out_of_range(part, start);
        }
        Err(e) => {
            part.error_code = errors::of(&e).0;
            return part;
        }
    };
    let exts: Vec<RecordExt> = chunk
        .meta
        .iter()
        .map(|m| {
            m.ext
                .as_ref()
                .and_then(|e| RecordExt::decode(e).ok())
                .unwrap_or_default()
        })
        .collect();
    let mut records = Vec::with_capacity(chunk.meta.len());
    let mut bytes = 0;
    let mut whole = true;
    for ((data, meta), ext) in chunk.segments.iter().zip(&chunk.meta).zip(&exts) {
        if meta.seq < n {
            continue;
        }
        // The first record always goes (a consumer must be able to make progress).
        if !records.is_empty() && bytes + data.len() > max_bytes {
            whole = false;
            break;
        }
        bytes += data.len() + 32;
        records.push(OutRecord {
            offset: meta.seq as i64,
            timestamp: ext.client_ts_ms.unwrap_or(meta.ts_ms) as i64,
            key: ext.key.as_deref(),
            value: match (ext.null_value, ext.empty_value) {
                (true, _) => None,
                (_, true) => Some(&[][..]),
                _ => Some(&data[..]),
            },
            headers: &ext.headers,
        });
    }
    if let (true, Some(last)) = (whole, records.last()) {
        // The next fetch starts where this one ended, without a seek.
        engine.bookmark(stream, last.offset as u64 + 1, chunk.next);
    }
    let mut out = BytesMut::new();
    batch::encode(&mut out, &records);
    part.records = Some(out.freeze());
    part
}

/// Waits until an append lands on any of the partitions, or `wait` passes.
async fn wait_for_any(
    kafka: &Kafka,
    asked: &[Asked],
    streams: &[Result<StreamRef, topics::Refusal>],
    wait: Duration,
) {
    let waits: Vec<_> = asked
        .iter()
        .zip(streams)
        .filter_map(|(a, s)| {
            let s = s.as_ref().ok()?;
            let view = s.handle.view();
            // Only a partition read up to its tail has anything to wait for.
            (a.offset == view.tail_seq as i64).then(|| {
                let tail = view.tail;
                async move {
                    let _ = kafka
                        .engine
                        .read_or_wait(s, tail, 1, wait, kafka.shutdown.fired())
                        .await;
                }
                .boxed()
            })
        })
        .collect();
    if waits.is_empty() {
        return;
    }
    let _ = select_all(waits).await;
}
