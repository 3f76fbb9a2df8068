//! Appending: the sequencer. Under the stream's lock it checks the request against
//! the stream's state (closed, content type, producer stamp, Stream-Seq), assigns
//! offsets and submits the op to the WAL; the wait for durability happens after the
//! lock is released, so pipelined appends on one stream share a flush.

use std::sync::Arc;
use std::time::Instant;

use super::handle::{self, Lifecycle, StreamHandle};
use super::json::json_records;
use super::producer::{self, ProducerState, Verdict};
use super::{changing_too_fast, AppendOutcome, AppendRequest, NewRecord, STATE_RETRIES};
use crate::domain::{self, Invalid};
use crate::error::{EngineError, Result};
use crate::stream::Service;
use crate::wal::format::{AppendOp, Op, ProducerStamp, Record, RECORD_BATCH_START, RECORD_EXT};

pub(crate) enum Sequenced {
    /// Answer once sequencer op `.0` is durable.
    Wait(u64, AppendOutcome),
}

impl Service {
    pub(crate) fn build_append(
        &self,
        st: &mut handle::State,
        data: Vec<NewRecord>,
        close: bool,
        producer: Option<ProducerStamp>,
        stream_seq: Option<String>,
    ) -> AppendOp {
        let ts_ms = self.inner.clock.now_ms().max(st.last_ts_ms);
        st.last_ts_ms = ts_ms;
        let records = data
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let start = if i == 0 { RECORD_BATCH_START } else { 0 };
                let ext = if r.ext.is_some() { RECORD_EXT } else { 0 };
                Record {
                    ts_ms,
                    flags: start | ext,
                    data: r.data,
                    ext: r.ext,
                }
            })
            .collect();
        AppendOp {
            start: st.tail,
            start_seq: st.next_seq,
            records: std::sync::Arc::new(records),
            close,
            producer,
            stream_seq,
        }
    }

    pub(crate) fn commit_append(&self, st: &mut handle::State, op_no: u64, op: &AppendOp) {
        // Offsets only grow, without gaps: each append starts at the tail the last
        // one left, and ends at or after its start.
        assert_eq!(
            op.start, st.tail,
            "an append must start at the stream's tail"
        );
        assert!(
            op.end() >= op.start,
            "an append must not end before it starts"
        );
        assert!(op_no >= st.next_op, "sequencer op numbers must grow");
        assert_eq!(
            op.start_seq, st.next_seq,
            "an append must start at the stream's next sequence number"
        );
        st.next_op = op_no + 1;
        st.tail = op.end();
        st.next_seq = op.end_seq();
        if let Some(s) = &op.stream_seq {
            st.stream_seq = Some(s.clone());
        }
        if let Some(p) = &op.producer {
            st.producers.insert(
                p.id.clone(),
                ProducerState {
                    epoch: p.epoch,
                    last_seq: p.seq,
                    last_op: op_no,
                },
            );
        }
        if op.close {
            st.closed = true;
            st.closed_by = op.producer.clone();
            st.close_op = op_no;
        }
    }

    pub async fn append(&self, req: AppendRequest) -> Result<AppendOutcome> {
        self.append_signalled(req, None).await
    }

    /// [`Service::append`], telling `sequenced` once the append has its place in the
    /// stream (or was refused) and before it waits to be durable: a caller that
    /// must keep several appends in order (a Kafka connection's produce requests)
    /// starts the next one then, and they share flushes.
    pub async fn append_signalled(
        &self,
        req: AppendRequest,
        mut sequenced: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<AppendOutcome> {
        if req.body.len() > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "append of {} bytes exceeds the limit of {} bytes",
                req.body.len(),
                self.inner.config.append_bytes_max
            )));
        }
        let native = req.records.as_ref().map_or(0, |r| r.len());
        if req.body.is_empty() && native == 0 && !req.close {
            return Err(Invalid::EmptyAppend.into());
        }
        let native_bytes: usize = req.records.iter().flatten().map(|r| r.data.len()).sum();
        if native_bytes > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "append of {native_bytes} bytes exceeds the limit of {} bytes",
                self.inner.config.append_bytes_max
            )));
        }
        let max = self.inner.config.stream_seq_bytes_max;
        if req.stream_seq.as_ref().is_some_and(|s| s.len() > max) {
            return Err(Invalid::StreamSeqTooLong { max }.into());
        }
        let started = Instant::now();
        for _ in 0..STATE_RETRIES {
            let stream = self.stream(&req.name).await?;
            let handle = stream.handle;
            handle.touch(self.inner.clock.now_ms());
            let parsed = if let Some(records) = &req.records {
                native_records(records, handle.config.json)
            } else if req.body.is_empty() {
                Ok(Vec::new())
            } else if handle.config.json {
                json_records(&req.body, false)
                    .map(|r| r.into_iter().map(NewRecord::plain).collect())
            } else {
                Ok(vec![NewRecord::plain(req.body.clone())])
            };
            let parsed = parsed.and_then(|records| {
                if req.schema_checked {
                    return Ok(records);
                }
                let stream = crate::schemas::StreamRef {
                    id: handle.config.id,
                    name: &handle.config.name,
                    json: handle.config.json,
                };
                self.check_records(&stream, req.schema_topic.as_deref(), &records)?;
                Ok(records)
            });
            let records = parsed.as_ref().map_or(0, Vec::len) as u64;
            let (wait_op, outcome) = {
                let mut st = handle.lock();
                if st.evicted {
                    continue;
                }
                match self.sequence(&handle, &mut st, &req, parsed)? {
                    Sequenced::Wait(op, outcome) => (op, outcome),
                }
            };
            if let Some(tx) = sequenced.take() {
                let _ = tx.send(());
            }
            self.wait_durable(&handle, wait_op).await?;
            let c = &self.inner.counters;
            c.append_seconds.observe(started.elapsed().as_secs_f64());
            if let AppendOutcome::Appended { .. } = outcome {
                c.appends.inc();
                c.append_records.add(records);
                c.append_bytes.add((req.body.len() + native_bytes) as u64);
            }
            return Ok(outcome);
        }
        Err(changing_too_fast())
    }

    /// The sequencer: decides an append against the stream state, under its lock.
    pub(crate) fn sequence(
        &self,
        handle: &Arc<StreamHandle>,
        st: &mut handle::State,
        req: &AppendRequest,
        parsed: Result<Vec<NewRecord>>,
    ) -> Result<Sequenced> {
        match st.lifecycle {
            Lifecycle::Live => {}
            Lifecycle::SoftDeleted => return Err(EngineError::Gone),
            Lifecycle::Deleted => return Err(EngineError::NotFound),
        }
        let stamp = req.producer.as_ref().map(|p| ProducerStamp {
            id: p.id.as_str().to_string(),
            epoch: p.epoch,
            seq: p.seq,
        });
        if st.closed {
            return on_closed(st, req, stamp.as_ref());
        }
        if !req.body.is_empty() && req.records.is_none() {
            let got = req.content_type.as_ref().map_or("", |c| c.as_str());
            if !domain::same_media_type(got, &handle.config.content_type) {
                return Err(EngineError::ContentTypeMismatch {
                    expected: handle.config.content_type.clone(),
                    got: got.to_string(),
                });
            }
        }
        if let Some(p) = &req.producer {
            let limit = self.inner.config.producers_per_stream_max;
            if let Some(duplicate) = check_producer(st, p, limit)? {
                return Ok(duplicate);
            }
        }
        if let (Some(got), Some(last)) = (&req.stream_seq, &st.stream_seq) {
            if got.as_bytes() <= last.as_bytes() {
                return Err(EngineError::StreamSeqConflict {
                    last: last.clone(),
                    got: got.clone(),
                });
            }
        }
        if let Some(expected) = req.match_seq {
            if expected != st.next_seq {
                return Err(EngineError::SeqMismatch {
                    next_seq: st.next_seq,
                });
            }
        }
        let records = parsed?;
        let op = self.build_append(st, records, req.close, stamp, req.stream_seq.clone());
        let op_no = st.next_op;
        self.submit(handle, op_no, Op::Append(op.clone()))?;
        self.commit_append(st, op_no, &op);
        let outcome = AppendOutcome::Appended {
            tail: st.tail,
            closed: st.closed,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
            seqs: op.start_seq..op.end_seq(),
            ts_ms: op.records.first().map_or(st.last_ts_ms, |r| r.ts_ms),
        };
        Ok(Sequenced::Wait(op_no, outcome))
    }
}

/// The native API's records, checked: on a JSON stream each must be one JSON value
/// (a Durable Streams reader gets it as one message).
fn native_records(records: &[NewRecord], json: bool) -> Result<Vec<NewRecord>> {
    if json {
        for (i, r) in records.iter().enumerate() {
            if serde_json::from_slice::<serde::de::IgnoredAny>(&r.data).is_err() {
                return Err(Invalid::RecordNotJson { index: i }.into());
            }
        }
    }
    Ok(records.to_vec())
}

/// An append to a closed stream: the retry of the append that closed it (by its
/// producer stamp) or a bare close again is answered as it was; anything else 409.
fn on_closed(
    st: &handle::State,
    req: &AppendRequest,
    stamp: Option<&ProducerStamp>,
) -> Result<Sequenced> {
    if stamp.is_some() && st.closed_by.as_ref() == stamp {
        let p = req.producer.as_ref().expect("stamp implies producer");
        let outcome = AppendOutcome::Duplicate {
            tail: st.tail,
            closed: true,
            epoch: p.epoch,
            last_seq: p.seq,
        };
        return Ok(Sequenced::Wait(st.close_op, outcome));
    }
    if req.body.is_empty() && req.producer.is_none() {
        let outcome = AppendOutcome::Appended {
            tail: st.tail,
            closed: true,
            producer: None,
            seqs: st.next_seq..st.next_seq,
            ts_ms: st.last_ts_ms,
        };
        return Ok(Sequenced::Wait(st.close_op, outcome));
    }
    Err(EngineError::StreamClosed { tail: st.tail })
}

/// The producer stamp against the producer's state: `Some` for a duplicate (answer
/// once the original is durable), `None` to go on, or why it is refused.
fn check_producer(
    st: &handle::State,
    p: &super::Producer,
    producers_max: usize,
) -> Result<Option<Sequenced>> {
    let first = p.first_seq.unwrap_or(p.seq);
    match producer::validate_span(st.producers.get(p.id.as_str()), p.epoch, first, p.seq) {
        Verdict::Accept => {
            if !st.producers.contains_key(p.id.as_str()) && st.producers.len() >= producers_max {
                return Err(EngineError::Overloaded(format!(
                    "stream has {} producers, the limit",
                    st.producers.len()
                )));
            }
            Ok(None)
        }
        Verdict::Duplicate { last_seq, last_op } => {
            let outcome = AppendOutcome::Duplicate {
                tail: st.tail,
                closed: st.closed,
                epoch: p.epoch,
                last_seq,
            };
            Ok(Some(Sequenced::Wait(last_op, outcome)))
        }
        Verdict::StaleEpoch { current } => Err(EngineError::ProducerStaleEpoch {
            current,
            got: p.epoch,
        }),
        Verdict::EpochMustStartAtZero => Err(EngineError::ProducerEpochMustStartAtZero),
        Verdict::Gap { expected, received } => {
            Err(EngineError::ProducerSeqGap { expected, received })
        }
    }
}
