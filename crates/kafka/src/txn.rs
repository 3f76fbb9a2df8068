//! Transactions: InitProducerId with a transactional id, AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn (here) and TxnOffsetCommit (at the group's
//! coordinator), docs/kafka.md "Transactions".
//!
//! A transaction's records are held back, never written where readers look
//! until it commits: a transactional batch is appended (durably, with its
//! producer's stamp) to a staging stream beside its partition's stream,
//! `__kafka/stage/{producer id}.{epoch}/{stream}`, a companion that the same
//! member serves. A transactional offset commit waits the same way beside the
//! group's offsets stream. At EndTxn the coordinator first records the outcome
//! in the transactional id's log, then has every staging stream published into
//! its stream (commit) or trimmed (abort) by the member serving it, then records
//! the transaction done. A publish is stamped with the transaction's number as
//! the epoch of a producer of its own, so repeating it after a crash at any
//! point appends nothing twice. So `read_committed` and `read_uncommitted` read
//! the same thing, and HTTP readers never see a record that may be aborted.
//!
//! The coordinator of a transactional id is the member serving its log,
//! `__kafka/txn/{key}`: JSON records `state` (producer id, epoch, timeout, the
//! next transaction's number, the staging streams of this epoch), `add`
//! (partitions and groups joining the open transaction) and `end` (its
//! outcome). A `state` record closes a transaction; the log is trimmed before it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, ApiKey, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProducerId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use picomq_engine::cluster::StreamAdmin;
use picomq_engine::{EngineError, StreamName};
use picomq_http::auth::Op;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::api::{decode, frame, Answer};
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::groups::{self, Committed};
use crate::{group_api, json_log, topics, Kafka};

pub(crate) const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
pub(crate) const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
pub(crate) const CONCURRENT_TRANSACTIONS: i16 = 51;
pub(crate) const INVALID_TXN_STATE: i16 = 48;
pub(crate) const OPERATION_NOT_ATTEMPTED: i16 = 55;
pub(crate) const PRODUCER_FENCED: i16 = 90;
const GROUP_AUTHORIZATION_FAILED: i16 = 30;

/// Longest transaction a producer may ask for (Kafka's transaction.max.timeout.ms).
pub(crate) const TIMEOUT_MAX: Duration = Duration::from_secs(15 * 60);
/// Longest transactional id.
const ID_MAX: usize = 249;
/// Transactional ids held in memory at once.
const HELD_MAX: usize = 10_000;
/// Partitions and groups one transaction may touch.
const PARTS_MAX: usize = 10_000;

/// The log of a transactional id (`key`: the id in the token's namespace).
pub(crate) fn log_name(key: &str) -> String {
    format!("__kafka/txn/{key}")
}

/// The staging stream of `stream` for producer `pid` at `epoch`.
pub(crate) fn stage_name(pid: i64, epoch: i16, stream: &str) -> String {
    format!("__kafka/stage/{pid}.{epoch}/{stream}")
}

/// A transactional id's key, if the caller may use it: the `append` scope on
/// the id (as a stream name in the token's namespace).
pub(crate) fn txn_key(kafka: &Kafka, session: &Session, id: &str) -> Result<String, i16> {
    if id.is_empty() || id.len() > ID_MAX {
        return Err(code::INVALID_REQUEST);
    }
    topics::access(kafka, session)
        .stream(Op::Append, id.to_string())
        .map_err(|_| code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
}

/// The open transaction.
#[derive(Debug, Default, Clone, PartialEq)]
struct Ongoing {
    no: u64,
    /// Partition streams (absolute names).
    streams: BTreeSet<String>,
    /// Groups' offsets streams.
    groups: BTreeSet<String>,
    /// Its outcome, once recorded (then it is being completed).
    decided: Option<bool>,
}

/// A transactional id's state.
#[derive(Debug)]
pub(crate) struct Txn {
    key: String,
    loaded: bool,
    pid: i64,
    epoch: i16,
    timeout: Duration,
    /// The next transaction's number (each has its own, from 1).
    next: u64,
    /// Staging streams written at this epoch, deleted when it ends.
    touched: BTreeSet<String>,
    ongoing: Option<Ongoing>,
    /// The outcome of this epoch's last transaction (a retried EndTxn gets its answer again).
    last: Option<bool>,
    /// When the open transaction began (in this process).
    began: Instant,
}

type Held = (u64, Arc<Mutex<Txn>>);

/// The transactional ids this node coordinates.
#[derive(Default)]
pub(crate) struct Coordinator {
    held: StdMutex<HashMap<String, Held>>,
}

fn coordinating(kafka: &Kafka, key: &str) -> Result<u64, i16> {
    let name = log_name(key);
    if !kafka.engine.serves(&name) {
        return Err(groups::NOT_COORDINATOR);
    }
    Ok(kafka.engine.term_of(&name))
}

impl Coordinator {
    /// Drops `key` from memory if nothing is open there (its log has it all).
    fn forget_idle(&self, key: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let idle = held
            .get(key)
            .is_some_and(|(_, t)| t.try_lock().is_ok_and(|t| t.ongoing.is_none()));
        if idle {
            held.remove(key);
        }
    }

    fn txn(&self, kafka: &Kafka, key: &str) -> Result<Arc<Mutex<Txn>>, i16> {
        let term = coordinating(kafka, key)?;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((t, txn)) = held.get(key) {
            if *t == term {
                return Ok(txn.clone());
            }
        }
        if held.len() >= HELD_MAX {
            let idle = held
                .iter()
                .find(|(_, (_, t))| t.try_lock().is_ok_and(|t| t.ongoing.is_none()))
                .map(|(k, _)| k.clone())
                .ok_or(groups::COORDINATOR_NOT_AVAILABLE)?;
            held.remove(&idle);
        }
        let txn = Arc::new(Mutex::new(Txn {
            key: key.to_string(),
            loaded: false,
            pid: -1,
            epoch: -1,
            timeout: Duration::from_secs(60),
            next: 1,
            touched: BTreeSet::new(),
            ongoing: None,
            last: None,
            began: Instant::now(),
        }));
        held.insert(key.to_string(), (term, txn.clone()));
        Ok(txn)
    }
}

/// Aborts transactions past their timeout (fencing their producer, as Kafka
/// does), finishes those whose outcome was recorded, and forgets ids whose log
/// moved to another member. Every [`SWEEP_EVERY`] it also reads each log this
/// node serves and has not read at its current term, so a transaction left open
/// or half complete by a node that died (or stopped) is finished here even if
/// its producer never comes back. Runs until `shutdown`.
pub(crate) async fn tick(kafka: Arc<Kafka>, shutdown: picomq_engine::shutdown::ShutdownSignal) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    let mut swept: HashMap<String, u64> = HashMap::new();
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = shutdown.fired() => return,
        }
        if ticks.is_multiple_of(SWEEP_EVERY) {
            if let Err(e) = sweep(&kafka, &mut swept).await {
                tracing::debug!(error = %e, "reading the Kafka transaction logs");
            }
        }
        ticks += 1;
        let txns: Vec<Arc<Mutex<Txn>>> = {
            let mut held = kafka.txns.held.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|key, (term, _)| coordinating(&kafka, key) == Ok(*term));
            held.values().map(|(_, t)| t.clone()).collect()
        };
        for t in txns {
            let Ok(mut t) = t.try_lock() else { continue };
            let Some(decided) = t.ongoing.as_ref().map(|o| o.decided) else {
                continue;
            };
            if decided.is_some() {
                // An outcome recorded but not yet carried out everywhere.
                if let Err(e) = t.complete(&kafka).await {
                    tracing::warn!(txn = %t.key, error = %e, "completing a Kafka transaction failed; retrying");
                }
            } else if t.began.elapsed() > t.timeout {
                tracing::info!(txn = %t.key, "aborting a Kafka transaction past its timeout");
                if let Err(e) = t.abort_and_fence(&kafka).await {
                    tracing::warn!(txn = %t.key, error = %e, "aborting a timed-out transaction failed; retrying");
                }
            }
        }
    }
}

/// Ticks between two sweeps of the transaction logs.
const SWEEP_EVERY: u64 = 5;
/// Logs remembered as read (a sweep reads each once per term).
const SWEPT_MAX: usize = 100_000;

/// Loads every transaction log served here that was not read at its current
/// term: a decided transaction is completed by the load, an open one starts
/// timing out. Idle ones are not kept in memory.
async fn sweep(kafka: &Kafka, swept: &mut HashMap<String, u64>) -> Result<(), EngineError> {
    let prefix = log_name("");
    let mut after = String::new();
    loop {
        let page = kafka.engine.list(&prefix, &after, 1_000).await?;
        for info in &page.streams {
            let Some(key) = info.name.strip_prefix(&prefix) else {
                continue;
            };
            let Ok(term) = coordinating(kafka, key) else {
                continue;
            };
            if swept.get(key) == Some(&term) {
                continue;
            }
            let Ok(txn) = kafka.txns.txn(kafka, key) else {
                continue;
            };
            let mut t = txn.lock().await;
            if let Err(e) = t.load(kafka).await {
                tracing::warn!(txn = %key, error = %e, "loading a Kafka transaction log");
                continue;
            }
            if t.ongoing.is_none() {
                drop(t);
                kafka.txns.forget_idle(key);
            }
            if swept.len() >= SWEPT_MAX {
                swept.clear();
            }
            swept.insert(key.to_string(), term);
        }
        match page.next {
            Some(next) => after = next,
            None => return Ok(()),
        }
    }
}

impl Txn {
    fn log(&self, kafka: &Kafka) -> Result<StreamName, EngineError> {
        Ok(StreamName::new(
            log_name(&self.key),
            kafka.engine.config().stream_name_bytes_max,
        )?)
    }

    /// Reads the log once, then completes a transaction whose outcome was
    /// recorded but not carried out (the last coordinator stopped half way).
    async fn load(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        if self.loaded {
            return Ok(());
        }
        let name = self.log(kafka)?;
        match kafka.engine.stream(&name).await {
            Ok(stream) => {
                let at = kafka.engine.first_record(&stream).await?.offset;
                json_log::read(kafka, &stream, at, |v| self.apply(v)).await?;
            }
            Err(EngineError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.loaded = true;
        self.began = Instant::now();
        if self.ongoing.as_ref().is_some_and(|o| o.decided.is_some()) {
            self.complete(kafka).await?;
        }
        Ok(())
    }

    fn apply(&mut self, v: &Value) {
        if let Some(s) = v.get("state") {
            self.pid = s.get("pid").and_then(Value::as_i64).unwrap_or(-1);
            self.epoch = s.get("epoch").and_then(Value::as_i64).unwrap_or(-1) as i16;
            self.timeout = Duration::from_millis(
                s.get("timeout_ms")
                    .and_then(Value::as_u64)
                    .unwrap_or(60_000),
            );
            self.next = s.get("next").and_then(Value::as_u64).unwrap_or(1);
            self.touched = strings(s.get("touched"));
            self.last = s.get("last").and_then(Value::as_bool);
            self.ongoing = None;
        } else if let Some(a) = v.get("add") {
            let no = a.get("no").and_then(Value::as_u64).unwrap_or(0);
            let o = self.ongoing.get_or_insert_with(|| Ongoing {
                no,
                ..Ongoing::default()
            });
            o.streams.extend(strings(a.get("streams")));
            o.groups.extend(strings(a.get("groups")));
            for s in o.streams.iter().chain(&o.groups) {
                self.touched.insert(stage_name(self.pid, self.epoch, s));
            }
        } else if let Some(e) = v.get("end") {
            if let Some(o) = &mut self.ongoing {
                o.decided = e.get("commit").and_then(Value::as_bool);
            }
        }
    }

    fn state_record(&self) -> Value {
        json!({ "state": {
            "pid": self.pid,
            "epoch": self.epoch,
            "timeout_ms": self.timeout.as_millis() as u64,
            "next": self.next,
            "touched": self.touched,
            "last": self.last,
        }})
    }

    /// Appends the state and trims the log before it.
    async fn write_state(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        let name = self.log(kafka)?;
        let tail = match kafka.engine.stream(&name).await {
            Ok(s) => Some(s.handle.view().tail),
            Err(EngineError::NotFound) => None,
            Err(e) => return Err(e),
        };
        json_log::append(kafka, &name, self.state_record()).await?;
        if let Some(tail) = tail {
            kafka.engine.trim(&name, tail).await?;
        }
        Ok(())
    }

    /// Records the open transaction's outcome and carries it out.
    async fn end(&mut self, kafka: &Kafka, commit: bool) -> Result<(), EngineError> {
        let Some(o) = &mut self.ongoing else {
            return Ok(());
        };
        if o.decided.is_none() {
            let no = o.no;
            json_log::append(
                kafka,
                &self.log(kafka)?,
                json!({ "end": { "no": no, "commit": commit } }),
            )
            .await?;
            if let Some(o) = &mut self.ongoing {
                o.decided = Some(commit);
            }
            picomq_engine::failpoint::hit("kafka-txn-after-decide");
        }
        self.complete(kafka).await
    }

    /// Publishes (commit) or trims (abort) every staging stream of the decided
    /// transaction, at the members serving them, then closes it. Safe to repeat.
    async fn complete(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        let Some(o) = self.ongoing.clone() else {
            return Ok(());
        };
        let commit = o.decided == Some(true);
        let producer = format!("kafka-txn-{}", self.pid);
        let ops = o
            .streams
            .iter()
            .map(|s| (s, false))
            .chain(o.groups.iter().map(|g| (g, true)));
        let mut work = Vec::new();
        for (stream, create) in ops {
            let stage = stage_name(self.pid, self.epoch, stream);
            work.push(if commit {
                StreamAdmin::Publish {
                    stream: stream.clone(),
                    from: stage,
                    producer: producer.clone(),
                    epoch: o.no,
                    create,
                }
            } else {
                StreamAdmin::Discard { stream: stage }
            });
        }
        let results = futures::future::join_all(work.iter().map(|op| kafka.engine.admin(op))).await;
        for (op, r) in work.iter().zip(results) {
            match r {
                // A partition deleted meanwhile has nowhere to publish to.
                Ok(_) | Err(EngineError::NotFound | EngineError::Gone) => {}
                Err(e) => {
                    tracing::warn!(txn = %self.key, stream = %op.stream(), error = %e, "completing a Kafka transaction");
                    return Err(e);
                }
            }
        }
        picomq_engine::failpoint::hit("kafka-txn-after-publish");
        self.ongoing = None;
        self.last = Some(commit);
        self.next = self.next.max(o.no + 1);
        self.write_state(kafka).await
    }

    /// Aborts the open transaction (if any) and moves to the next epoch, so the
    /// producer that had it is fenced.
    async fn abort_and_fence(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        self.end(kafka, false).await?;
        self.next_epoch(kafka).await
    }

    /// The next epoch (a new producer id when epochs run out); the staging
    /// streams of the last are deleted first.
    async fn next_epoch(&mut self, kafka: &Kafka) -> Result<(), EngineError> {
        for stage in std::mem::take(&mut self.touched) {
            let op = StreamAdmin::Delete {
                stream: stage.clone(),
            };
            match kafka.engine.admin(&op).await {
                Ok(_) | Err(EngineError::NotFound | EngineError::Gone) => {}
                Err(e) => {
                    self.touched.insert(stage);
                    return Err(e);
                }
            }
        }
        self.last = None;
        if self.pid < 0 || self.epoch >= i16::MAX - 1 {
            self.pid = fastrand::i64(1..1 << 62);
            self.epoch = 0;
        } else {
            self.epoch += 1;
        }
        self.write_state(kafka).await
    }

    /// The producer's id and epoch against the current ones.
    fn check(&self, pid: i64, epoch: i16) -> i16 {
        if pid != self.pid {
            INVALID_PRODUCER_ID_MAPPING
        } else if epoch != self.epoch {
            PRODUCER_FENCED
        } else {
            code::NONE
        }
    }

    /// Adds partition and group streams to the open transaction (opening one).
    async fn add(
        &mut self,
        kafka: &Kafka,
        streams: Vec<String>,
        groups: Vec<String>,
    ) -> Result<(), EngineError> {
        let o = self.ongoing.get_or_insert_with(|| Ongoing {
            no: self.next,
            ..Ongoing::default()
        });
        let fresh_streams: Vec<String> = streams
            .into_iter()
            .filter(|s| !o.streams.contains(s))
            .collect();
        let fresh_groups: Vec<String> = groups
            .into_iter()
            .filter(|g| !o.groups.contains(g))
            .collect();
        let opened = o.streams.is_empty() && o.groups.is_empty();
        if fresh_streams.is_empty() && fresh_groups.is_empty() {
            return Ok(());
        }
        if o.streams.len() + o.groups.len() + fresh_streams.len() + fresh_groups.len() > PARTS_MAX {
            return Err(EngineError::bad_request(format!(
                "a transaction may touch at most {PARTS_MAX} partitions and groups"
            )));
        }
        let no = o.no;
        json_log::append(
            kafka,
            &self.log(kafka)?,
            json!({ "add": { "no": no, "streams": fresh_streams, "groups": fresh_groups } }),
        )
        .await?;
        if opened {
            self.began = Instant::now();
        }
        let (pid, epoch) = (self.pid, self.epoch);
        let o = self.ongoing.as_mut().expect("opened above");
        for s in fresh_streams.iter().chain(&fresh_groups) {
            self.touched.insert(stage_name(pid, epoch, s));
        }
        o.streams.extend(fresh_streams);
        o.groups.extend(fresh_groups);
        Ok(())
    }
}

fn strings(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The code a coordinator's failure gives: the log moved away, or retry.
fn of_engine(e: &EngineError) -> i16 {
    match e {
        EngineError::NotOwner | EngineError::Fenced => groups::NOT_COORDINATOR,
        EngineError::Unavailable(_) | EngineError::Overloaded(_) => CONCURRENT_TRANSACTIONS,
        e => errors::of(e).0,
    }
}

/// The transactional id's state, loaded; an error code when it cannot be used here.
async fn held(kafka: &Kafka, session: &Session, id: &str) -> Result<Arc<Mutex<Txn>>, i16> {
    let key = txn_key(kafka, session, id)?;
    let txn = kafka.txns.txn(kafka, &key)?;
    {
        let mut t = txn.lock().await;
        t.load(kafka).await.map_err(|e| of_engine(&e))?;
    }
    Ok(txn)
}

/// InitProducerId: without a transactional id, an idempotent producer's id;
/// with one, the id's producer at its next epoch (any open transaction aborted).
pub(crate) async fn init_producer_id(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: InitProducerIdRequest = decode(request)?;
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    let Some(id) = req.transactional_id.as_ref().map(|t| t.0.to_string()) else {
        if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
            resp.producer_id = req.producer_id;
            resp.producer_epoch = req.producer_epoch + 1;
        } else {
            // Random: no state is needed to hand them out (two producers drawing
            // the same of 2^62 ids is not a practical concern).
            resp.producer_id = ProducerId(fastrand::i64(1..1 << 62));
            resp.producer_epoch = 0;
        }
        return Ok(frame(ApiKey::InitProducerId, &request.header, &resp));
    };
    let timeout = Duration::from_millis(req.transaction_timeout_ms.max(0) as u64);
    if req.transaction_timeout_ms <= 0 || timeout > TIMEOUT_MAX {
        resp.error_code = INVALID_TRANSACTION_TIMEOUT;
        return Ok(frame(ApiKey::InitProducerId, &request.header, &resp));
    }
    resp.error_code = async {
        let txn = held(kafka, session, &id).await?;
        let mut t = txn.lock().await;
        // A producer asking to bump its own epoch (KIP-360) must be the current one.
        if req.producer_id.0 >= 0 {
            let c = t.check(req.producer_id.0, req.producer_epoch);
            if c != code::NONE {
                return Err(c);
            }
        }
        t.timeout = timeout;
        t.end(kafka, false).await.map_err(|e| of_engine(&e))?;
        t.next_epoch(kafka).await.map_err(|e| of_engine(&e))?;
        resp.producer_id = ProducerId(t.pid);
        resp.producer_epoch = t.epoch;
        Ok(())
    }
    .await
    .err()
    .unwrap_or(code::NONE);
    if resp.error_code != code::NONE {
        resp.producer_id = ProducerId(-1);
        resp.producer_epoch = -1;
    }
    Ok(frame(ApiKey::InitProducerId, &request.header, &resp))
}

pub(crate) async fn add_partitions(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: AddPartitionsToTxnRequest = decode(request)?;
    // Per partition: its stream, or why it cannot join.
    let mut resolved = Vec::new();
    for t in &req.v3_and_below_topics {
        for &p in &t.partitions {
            let r = topics::stream_name(kafka, session, &t.name, p, Op::Append)
                .map(|n| n.as_str().to_string())
                .map_err(|(c, _)| c);
            resolved.push((t.name.clone(), p, r));
        }
    }
    let outcome: Result<(), i16> = async {
        if resolved.iter().any(|(_, _, r)| r.is_err()) {
            return Err(OPERATION_NOT_ATTEMPTED);
        }
        let txn = held(kafka, session, &req.v3_and_below_transactional_id).await?;
        let mut t = txn.lock().await;
        let c = t.check(
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
        );
        if c != code::NONE {
            return Err(c);
        }
        if t.ongoing.as_ref().is_some_and(|o| o.decided.is_some()) {
            return Err(CONCURRENT_TRANSACTIONS);
        }
        let streams = resolved
            .iter()
            .filter_map(|(_, _, r)| r.as_ref().ok().cloned())
            .collect();
        t.add(kafka, streams, Vec::new())
            .await
            .map_err(|e| of_engine(&e))
    }
    .await;
    let mut resp = AddPartitionsToTxnResponse::default();
    for (topic, p, r) in resolved {
        let c = match (&r, outcome) {
            (Err(c), _) => *c,
            (Ok(_), Err(c)) => c,
            (Ok(_), Ok(())) => code::NONE,
        };
        let part = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(p)
            .with_partition_error_code(c);
        match resp
            .results_by_topic_v3_and_below
            .iter_mut()
            .find(|t| t.name == topic)
        {
            Some(t) => t.results_by_partition.push(part),
            None => resp.results_by_topic_v3_and_below.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(topic)
                    .with_results_by_partition(vec![part]),
            ),
        }
    }
    Ok(frame(ApiKey::AddPartitionsToTxn, &request.header, &resp))
}

pub(crate) async fn add_offsets(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: AddOffsetsToTxnRequest = decode(request)?;
    let outcome: Result<(), i16> = async {
        let group = group_api::group_key(kafka, session, &req.group_id)
            .map_err(|_| GROUP_AUTHORIZATION_FAILED)?;
        let txn = held(kafka, session, &req.transactional_id).await?;
        let mut t = txn.lock().await;
        let c = t.check(req.producer_id.0, req.producer_epoch);
        if c != code::NONE {
            return Err(c);
        }
        if t.ongoing.as_ref().is_some_and(|o| o.decided.is_some()) {
            return Err(CONCURRENT_TRANSACTIONS);
        }
        t.add(kafka, Vec::new(), vec![groups::offsets_stream_name(&group)])
            .await
            .map_err(|e| of_engine(&e))
    }
    .await;
    let resp = AddOffsetsToTxnResponse::default().with_error_code(outcome.err().unwrap_or(0));
    Ok(frame(ApiKey::AddOffsetsToTxn, &request.header, &resp))
}

pub(crate) async fn end_txn(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: EndTxnRequest = decode(request)?;
    let outcome: Result<(), i16> = async {
        let txn = held(kafka, session, &req.transactional_id).await?;
        let mut t = txn.lock().await;
        let c = t.check(req.producer_id.0, req.producer_epoch);
        if c != code::NONE {
            return Err(c);
        }
        match t.ongoing.as_ref().map(|o| o.decided) {
            // Nothing open: a retry of an EndTxn that completed (the other
            // outcome is no longer possible), or a transaction that touched nothing.
            None if t.last == Some(!req.committed) => return Err(INVALID_TXN_STATE),
            None => return Ok(()),
            Some(Some(d)) if d != req.committed => return Err(INVALID_TXN_STATE),
            _ => {}
        }
        t.end(kafka, req.committed).await.map_err(|e| of_engine(&e))
    }
    .await;
    let mut resp = EndTxnResponse::default().with_error_code(outcome.err().unwrap_or(0));
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    Ok(frame(ApiKey::EndTxn, &request.header, &resp))
}

/// TxnOffsetCommit, at the group's coordinator: the offsets wait in the group's
/// staging stream for the transaction's outcome.
pub(crate) async fn txn_offset_commit(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: TxnOffsetCommitRequest = decode(request)?;
    let mut codes = Vec::new();
    let mut rows = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            let c = match topics::stream_name(kafka, session, &t.name, p.partition_index, Op::Read)
            {
                Ok(_) => code::NONE,
                Err((c, _)) => c,
            };
            if c == code::NONE {
                let committed = Committed {
                    offset: p.committed_offset,
                    epoch: p.committed_leader_epoch,
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                };
                rows.push(json!([
                    t.name.to_string(),
                    p.partition_index,
                    committed.offset,
                    committed.epoch,
                    committed.metadata
                ]));
            }
            codes.push(c);
        }
    }
    let outcome: Result<(), i16> = async {
        txn_key(kafka, session, &req.transactional_id)?;
        let key = group_api::group_key(kafka, session, &req.group_id)?;
        let group = kafka.groups.group(kafka, &key)?;
        let g = group.lock().await;
        let c = g.may_commit(
            &req.member_id,
            req.generation_id,
            req.topics.iter().flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.name.as_str(), p.partition_index))
            }),
        );
        if c != code::NONE {
            return Err(c);
        }
        drop(g);
        if rows.is_empty() {
            return Ok(());
        }
        let stage = stage_name(
            req.producer_id.0,
            req.producer_epoch,
            &groups::offsets_stream_name(&key),
        );
        let stage = StreamName::new(stage, kafka.engine.config().stream_name_bytes_max)
            .map_err(|_| code::INVALID_REQUEST)?;
        json_log::append(kafka, &stage, json!({ "commit": rows }))
            .await
            .map_err(|e| errors::of_group(&e))
    }
    .await;
    let mut codes = codes.into_iter();
    let mut resp = TxnOffsetCommitResponse::default();
    for t in &req.topics {
        let mut out = TxnOffsetCommitResponseTopic::default().with_name(t.name.clone());
        for p in &t.partitions {
            let c = codes.next().unwrap_or(code::NONE);
            let c = match outcome {
                Err(e) if c == code::NONE => e,
                _ => c,
            };
            out.partitions.push(
                TxnOffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(c),
            );
        }
        resp.topics.push(out);
    }
    Ok(frame(ApiKey::TxnOffsetCommit, &request.header, &resp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Txn {
        Txn {
            key: "t".into(),
            loaded: false,
            pid: -1,
            epoch: -1,
            timeout: Duration::from_secs(60),
            next: 1,
            touched: BTreeSet::new(),
            ongoing: None,
            last: None,
            began: Instant::now(),
        }
    }

    #[test]
    fn the_log_replays_to_the_state_it_recorded() {
        let mut t = fresh();
        t.apply(
            &json!({"state": {"pid": 7, "epoch": 2, "timeout_ms": 5000, "next": 4, "touched": []}}),
        );
        t.apply(&json!({"add": {"no": 4, "streams": ["a", "b~1"], "groups": []}}));
        t.apply(&json!({"add": {"no": 4, "streams": ["c"], "groups": ["__kafka/groups/g"]}}));
        assert_eq!((t.pid, t.epoch, t.next), (7, 2, 4));
        assert_eq!(t.timeout, Duration::from_secs(5));
        let o = t.ongoing.clone().expect("open");
        assert_eq!(o.no, 4);
        assert_eq!(o.streams.len(), 3);
        assert_eq!(o.decided, None);
        assert!(t.touched.contains("__kafka/stage/7.2/__kafka/groups/g"));
        t.apply(&json!({"end": {"no": 4, "commit": true}}));
        assert_eq!(t.ongoing.as_ref().and_then(|o| o.decided), Some(true));
        // A state record closes it.
        t.apply(&t.state_record_after(5));
        assert_eq!(t.ongoing, None);
        assert_eq!(t.next, 5);
        // Garbage is skipped.
        t.apply(&json!({"what": 1}));
        assert_eq!(t.next, 5);
    }

    #[test]
    fn a_producer_is_checked_against_the_current_id_and_epoch() {
        let mut t = fresh();
        t.pid = 9;
        t.epoch = 3;
        assert_eq!(t.check(9, 3), code::NONE);
        assert_eq!(t.check(9, 2), PRODUCER_FENCED);
        assert_eq!(t.check(8, 3), INVALID_PRODUCER_ID_MAPPING);
    }

    #[test]
    fn a_stage_is_a_companion_of_its_stream() {
        let s = stage_name(12, 0, "orders/eu~3");
        assert_eq!(
            picomq_engine::cluster::slots::placed_by(&s),
            "orders/eu~3",
            "{s} must live in its stream's slot"
        );
    }

    impl Txn {
        fn state_record_after(&self, next: u64) -> Value {
            let mut v = self.state_record();
            v["state"]["next"] = json!(next);
            v
        }
    }
}
