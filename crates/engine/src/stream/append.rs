//! Appending: the sequencer. Under the stream's lock it checks the request against
//! the stream's state (closed, content type, producer stamp, Stream-Seq), assigns
//! offsets and submits the op to the WAL; the wait for durability happens after the
//! lock is released, so pipelined appends on one stream share a flush.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::handle::{self, Lifecycle, StreamHandle};
use super::json::json_records;
use super::producer::{self, ProducerState, Verdict};
use super::{changing_too_fast, AppendOutcome, AppendRequest, STATE_RETRIES};
use crate::domain::{self, Invalid};
use crate::error::{EngineError, Result};
use crate::stream::Service;
use crate::wal::format::{AppendOp, Op, ProducerStamp, Record, RECORD_BATCH_START};

pub(crate) enum Sequenced {
    /// Answer once sequencer op `.0` is durable.
    Wait(u64, AppendOutcome),
}

impl Service {
    pub(crate) fn build_append(
        &self,
        st: &mut handle::State,
        data: Vec<Bytes>,
        close: bool,
        producer: Option<ProducerStamp>,
        stream_seq: Option<String>,
    ) -> AppendOp {
        let ts_ms = self.inner.clock.now_ms().max(st.last_ts_ms);
        st.last_ts_ms = ts_ms;
        let records = data
            .into_iter()
            .enumerate()
            .map(|(i, data)| Record {
                ts_ms,
                flags: if i == 0 { RECORD_BATCH_START } else { 0 },
                data,
            })
            .collect();
        AppendOp {
            start: st.tail,
            records,
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
        st.next_op = op_no + 1;
        st.tail = op.end();
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
        if req.body.len() > self.inner.config.append_bytes_max {
            return Err(EngineError::PayloadTooLarge(format!(
                "append of {} bytes exceeds the limit of {} bytes",
                req.body.len(),
                self.inner.config.append_bytes_max
            )));
        }
        if req.body.is_empty() && !req.close {
            return Err(Invalid::EmptyAppend.into());
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
            let parsed = if req.body.is_empty() {
                Ok(Vec::new())
            } else if handle.config.json {
                json_records(&req.body, false)
            } else {
                Ok(vec![req.body.clone()])
            };
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
            self.wait_durable(&handle, wait_op).await?;
            let c = &self.inner.counters;
            c.append_seconds.observe(started.elapsed().as_secs_f64());
            if let AppendOutcome::Appended { .. } = outcome {
                c.appends.inc();
                c.append_records.add(records);
                c.append_bytes.add(req.body.len() as u64);
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
        parsed: Result<Vec<Bytes>>,
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
        if !req.body.is_empty() {
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
        let records = parsed?;
        let op = self.build_append(st, records, req.close, stamp, req.stream_seq.clone());
        let op_no = st.next_op;
        self.submit(handle, op_no, Op::Append(op.clone()))?;
        self.commit_append(st, op_no, &op);
        let outcome = AppendOutcome::Appended {
            tail: st.tail,
            closed: st.closed,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
        };
        Ok(Sequenced::Wait(op_no, outcome))
    }
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
    match producer::validate(st.producers.get(p.id.as_str()), p.epoch, p.seq) {
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
