//! The idempotent producer: records in, batches out, each written exactly once.
//!
//! [`Producer::send`] queues a record (a bounded queue: a full one makes `send`
//! wait, which is the backpressure). A driver task groups records into batches
//! (until `linger` passes, or a batch holds `batch_records_max` records or
//! `batch_bytes_max` bytes; JSON streams get a JSON array per batch, byte streams
//! the bytes concatenated) and posts them through the Durable Streams append with
//! an idempotent-producer stamp: `Producer-Id`, `Producer-Epoch` and one
//! `Producer-Seq` per batch, 0, 1, 2, ... Up to `in_flight_max` batches are in
//! flight at once.
//!
//! Why every record lands exactly once, in order:
//!
//! - A batch keeps its body and its seq until it is acknowledged: a retry is the
//!   same stamp, which the server answers as a duplicate (`204`) if it has it.
//! - The server accepts seq `n` only right after `n - 1`, so what it holds of one
//!   producer is always a prefix of the batches, in order; a batch that arrives
//!   early (`409`, `Producer-Expected-Seq`) or whose answer was lost (connection
//!   reset, `5xx`, a restart) is sent again.
//! - After any such failure the producer stops sending, waits for every request in
//!   flight to be answered, then sends again from the first unacknowledged batch,
//!   in order (after a backoff if the failure was the server's or the network's).
//!   The first unacknowledged batch follows acknowledged ones, so it can only be
//!   accepted or answered as a duplicate: every round makes progress.
//!
//! The epoch defaults to the wall clock in milliseconds, so a producer restarted
//! with the same id starts a newer epoch (the server requires seq 0 to begin one,
//! and fences the older one with `403`); pass one with [`ProducerConfig::epoch`]
//! to manage it yourself.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::backoff::Backoff;
use crate::error::{Error, Reason, Result};
use crate::stream::{is_json, DurableStream};
use crate::transport::HttpMethod;

/// Commands the driver reads from [`Producer`]'s bounded queue, in order.
enum Command {
    Record(Bytes),
    Flush(oneshot::Sender<Result<()>>),
}

/// How a [`Producer`] batches, pipelines and retries.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    producer_id: String,
    epoch: Option<u64>,
    linger: Duration,
    batch_records_max: usize,
    batch_bytes_max: usize,
    in_flight_max: usize,
    queue_records_max: usize,
    retry_for: Duration,
    backoff: Backoff,
}

impl ProducerConfig {
    /// A producer with the stable id `producer_id` and the defaults: linger 5 ms,
    /// batches of at most 1,000 records and 1 MiB, 4 batches in flight, a queue of
    /// 10,000 records, retries for 5 minutes.
    pub fn new(producer_id: impl Into<String>) -> ProducerConfig {
        ProducerConfig {
            producer_id: producer_id.into(),
            epoch: None,
            linger: Duration::from_millis(5),
            batch_records_max: 1_000,
            batch_bytes_max: 1 << 20,
            in_flight_max: 4,
            queue_records_max: 10_000,
            retry_for: Duration::from_secs(300),
            backoff: Backoff::default(),
        }
    }

    /// The epoch to write under (default: the wall clock in ms). A producer
    /// restarted with the same id must use a greater one.
    pub fn epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// How long a batch waits for more records while there is room to send it.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// The most records in one batch.
    pub fn batch_records_max(mut self, n: usize) -> Self {
        self.batch_records_max = n.max(1);
        self
    }

    /// The most bytes in one batch (a larger record goes alone; the server refuses
    /// requests over its `--max-append-bytes`, 8 MiB by default).
    pub fn batch_bytes_max(mut self, n: usize) -> Self {
        self.batch_bytes_max = n.max(1);
        self
    }

    /// The most batches sent and not yet answered.
    pub fn in_flight_max(mut self, n: usize) -> Self {
        self.in_flight_max = n.max(1);
        self
    }

    /// The most records queued by `send` ahead of the batches.
    pub fn queue_records_max(mut self, n: usize) -> Self {
        self.queue_records_max = n.max(1);
        self
    }

    /// Give up (the producer stops with the last error) after failing this long
    /// without an acknowledgement.
    pub fn retry_for(mut self, limit: Duration) -> Self {
        self.retry_for = limit;
        self
    }

    /// The waits between retries.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

/// What a producer did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Records acknowledged.
    pub records_acked: u64,
    /// Batches acknowledged.
    pub batches_acked: u64,
    /// Batches the server already had when they were sent again (`204`).
    pub duplicates: u64,
    /// Batches refused because they arrived before earlier ones (`409`).
    pub gaps: u64,
    /// Batches that failed on the network or the server (`5xx`) and were retried.
    pub failures: u64,
    /// Requests sent, retries included.
    pub requests: u64,
}

#[derive(Default)]
struct Counters {
    records_acked: AtomicU64,
    batches_acked: AtomicU64,
    duplicates: AtomicU64,
    gaps: AtomicU64,
    failures: AtomicU64,
    requests: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ProducerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProducerStats {
            records_acked: get(&self.records_acked),
            batches_acked: get(&self.batches_acked),
            duplicates: get(&self.duplicates),
            gaps: get(&self.gaps),
            failures: get(&self.failures),
            requests: get(&self.requests),
        }
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// An idempotent producer to one stream (see the module documentation).
pub struct Producer {
    tx: mpsc::Sender<Command>,
    driver: tokio::task::JoinHandle<()>,
    counters: Arc<Counters>,
    stopped: Arc<Mutex<Option<Arc<Error>>>>,
    id: String,
    epoch: u64,
}

impl DurableStream {
    /// An idempotent producer to this stream. Learns the stream's content type
    /// first (a `HEAD`, unless known), so the stream must exist.
    pub async fn producer(&self, config: ProducerConfig) -> Result<Producer> {
        if config.producer_id.is_empty() {
            return Err(Error::InvalidArgument("a producer id is not empty".into()));
        }
        let content_type = self.content_type().await?;
        Ok(Producer::start(self.clone(), content_type, config))
    }
}

impl Producer {
    // A client has no engine clock to inject; the default epoch only has to grow
    // from one run of a producer to the next.
    #[allow(clippy::disallowed_methods)]
    fn start(stream: DurableStream, content_type: String, config: ProducerConfig) -> Producer {
        let epoch = config.epoch.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        });
        let (tx, rx) = mpsc::channel(config.queue_records_max);
        let counters = Arc::new(Counters::default());
        let stopped = Arc::new(Mutex::new(None));
        let id = config.producer_id.clone();
        let driver = Driver {
            request: Arc::new(BatchRequest {
                stream,
                json: is_json(&content_type),
                content_type,
                producer_id: config.producer_id.clone(),
                epoch: epoch.to_string(),
            }),
            rx,
            open: BytesMut::new(),
            open_records: 0,
            open_since: None,
            batches: VecDeque::new(),
            next_seq: 0,
            in_flight: JoinSet::new(),
            draining: false,
            need_backoff: false,
            acked_since_recovery: false,
            retry_at: None,
            backoff: config.backoff.clone(),
            failing_since: None,
            flushes: Vec::new(),
            input_closed: false,
            counters: counters.clone(),
            config,
        };
        let shared = stopped.clone();
        let driver = tokio::spawn(async move {
            if let Err(e) = driver.run().await {
                *shared.lock().expect("producer state lock") = Some(e);
            }
        });
        Producer {
            tx,
            driver,
            counters,
            stopped,
            id,
            epoch,
        }
    }

    /// The producer id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The epoch it writes under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What it did so far.
    pub fn stats(&self) -> ProducerStats {
        self.counters.snapshot()
    }

    fn stopped_error(&self) -> Error {
        match &*self.stopped.lock().expect("producer state lock") {
            Some(e) => Error::ProducerStopped(e.clone()),
            None => Error::ProducerStopped(Arc::new(Error::InvalidArgument(
                "the producer is closed".into(),
            ))),
        }
    }

    /// Queues one record: bytes on a byte stream; one JSON value on a JSON stream.
    /// Returns once it is queued (waits while the queue is full); errors only if
    /// the producer stopped.
    pub async fn send(&self, record: impl Into<Bytes>) -> Result<()> {
        self.tx
            .send(Command::Record(record.into()))
            .await
            .map_err(|_| self.stopped_error())
    }

    /// Queues one JSON message (on a JSON stream).
    pub async fn send_json<T: Serialize + ?Sized>(&self, message: &T) -> Result<()> {
        let body = serde_json::to_vec(message)
            .map_err(|e| Error::InvalidArgument(format!("a message does not serialize: {e}")))?;
        self.send(body).await
    }

    /// Waits until every record queued before it is acknowledged.
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Flush(tx))
            .await
            .map_err(|_| self.stopped_error())?;
        rx.await.map_err(|_| self.stopped_error())?
    }

    /// Flushes, stops the driver and answers what the producer did.
    pub async fn close(self) -> Result<ProducerStats> {
        let flushed = self.flush().await;
        let Producer {
            tx,
            driver,
            counters,
            stopped,
            ..
        } = self;
        drop(tx);
        let _ = driver.await;
        flushed?;
        if let Some(e) = stopped.lock().expect("producer state lock").clone() {
            return Err(Error::ProducerStopped(e));
        }
        Ok(counters.snapshot())
    }
}

/// What every batch request of one producer shares.
struct BatchRequest {
    stream: DurableStream,
    content_type: String,
    json: bool,
    producer_id: String,
    epoch: String,
}

impl BatchRequest {
    /// Posts one batch: `Ok(false)` accepted, `Ok(true)` a duplicate.
    async fn post(&self, seq: u64, body: Bytes) -> Result<bool> {
        let seq = seq.to_string();
        let headers = [
            ("content-type", self.content_type.as_str()),
            ("producer-id", self.producer_id.as_str()),
            ("producer-epoch", self.epoch.as_str()),
            ("producer-seq", seq.as_str()),
        ];
        let path = self.stream.path();
        let r = self
            .stream
            .mq
            .send(HttpMethod::POST, path, &headers, body, Duration::ZERO)
            .await?;
        match r.status.as_u16() {
            204 => Ok(true),
            s if (200..300).contains(&s) => Ok(false),
            _ => Err(Error::from_response(
                format!("POST {path} (Producer-Seq {seq})"),
                &r,
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchState {
    /// Not sent, or to be sent again.
    Pending,
    InFlight,
    Acked,
}

struct Batch {
    seq: u64,
    body: Bytes,
    records: u64,
    state: BatchState,
    /// Every earlier batch was acknowledged when this one was last sent: the
    /// server had them all, so a gap answer means it lost acknowledged batches.
    sent_first: bool,
}

/// Commands taken from the queue in one go before answers are looked at again.
const COMMANDS_PER_TURN_MAX: usize = 4_096;

/// The producer's task: batches, sends, answers, retries.
struct Driver {
    config: ProducerConfig,
    request: Arc<BatchRequest>,
    rx: mpsc::Receiver<Command>,
    /// The batch being filled.
    open: BytesMut,
    open_records: u64,
    open_since: Option<Instant>,
    /// Sealed batches not yet popped, in seq order; acked ones leave from the front.
    batches: VecDeque<Batch>,
    /// The seq of the next batch sealed.
    next_seq: u64,
    in_flight: JoinSet<(u64, Result<bool>)>,
    /// A batch failed: send nothing until every request in flight is answered.
    draining: bool,
    /// The failure was the network's or the server's: back off before resending.
    need_backoff: bool,
    acked_since_recovery: bool,
    retry_at: Option<tokio::time::Instant>,
    backoff: Backoff,
    failing_since: Option<Instant>,
    /// Flushes waiting for every seq below theirs to be acked.
    flushes: Vec<(u64, oneshot::Sender<Result<()>>)>,
    input_closed: bool,
    counters: Arc<Counters>,
}

impl Driver {
    async fn run(mut self) -> std::result::Result<(), Arc<Error>> {
        let result = self.drive().await;
        if let Err(e) = &result {
            for (_, tx) in self.flushes.drain(..) {
                let _ = tx.send(Err(Error::ProducerStopped(e.clone())));
            }
        }
        result
    }

    async fn drive(&mut self) -> std::result::Result<(), Arc<Error>> {
        loop {
            self.pop_acked();
            self.answer_flushes();
            if self.draining && self.in_flight.is_empty() {
                self.recover();
            }
            self.maybe_seal();
            if self.input_closed && self.batches.is_empty() && self.open_records == 0 {
                return Ok(());
            }
            self.send_ready();
            let waiting = self.waiting_to_send();
            let linger_at = match self.open_since {
                Some(since) if !waiting => Some(since + self.config.linger),
                _ => None,
            };
            let accepting =
                !self.input_closed && self.batches.len() < self.config.in_flight_max + 2;
            tokio::select! {
                Some(joined) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    let (seq, result) = joined.map_err(|e| {
                        Arc::new(Error::InvalidArgument(format!("a batch request panicked: {e}")))
                    })?;
                    self.answered(seq, result).map_err(Arc::new)?;
                }
                _ = sleep_until(self.retry_at), if self.retry_at.is_some() => {
                    self.retry_at = None;
                }
                _ = sleep_until(linger_at.map(tokio::time::Instant::from_std)), if linger_at.is_some() => {}
                cmd = self.rx.recv(), if accepting => {
                    self.command(cmd);
                    for _ in 0..COMMANDS_PER_TURN_MAX {
                        if self.input_closed || self.batches.len() >= self.config.in_flight_max + 2 {
                            break;
                        }
                        match self.rx.try_recv() {
                            Ok(cmd) => self.command(Some(cmd)),
                            Err(_) => break,
                        }
                    }
                }
            }
        }
    }

    fn command(&mut self, cmd: Option<Command>) {
        match cmd {
            None => {
                self.input_closed = true;
                self.seal();
            }
            Some(Command::Record(record)) => self.add(record),
            Some(Command::Flush(tx)) => {
                self.seal();
                self.flushes.push((self.next_seq, tx));
            }
        }
    }

    fn add(&mut self, record: Bytes) {
        let json = self.request.json;
        let grows_by = record.len() + usize::from(json) + 1;
        if self.open_records > 0
            && (self.open.len() + grows_by > self.config.batch_bytes_max
                || self.open_records >= self.config.batch_records_max as u64)
        {
            self.seal();
        }
        if self.open_records == 0 {
            self.open_since = Some(Instant::now());
            if json {
                self.open.put_u8(b'[');
            }
        } else if json {
            self.open.put_u8(b',');
        }
        self.open.extend_from_slice(&record);
        self.open_records += 1;
        if self.open_records >= self.config.batch_records_max as u64
            || self.open.len() >= self.config.batch_bytes_max
        {
            self.seal();
        }
    }

    /// Seals the open batch once it has lingered and nothing else waits to go.
    fn maybe_seal(&mut self) {
        let lingered = self
            .open_since
            .is_some_and(|since| since.elapsed() >= self.config.linger);
        if lingered && !self.waiting_to_send() {
            self.seal();
        }
    }

    fn seal(&mut self) {
        if self.open_records == 0 {
            return;
        }
        if self.request.json {
            self.open.put_u8(b']');
        }
        self.batches.push_back(Batch {
            seq: self.next_seq,
            body: self.open.split().freeze(),
            records: self.open_records,
            state: BatchState::Pending,
            sent_first: false,
        });
        self.next_seq += 1;
        self.open_records = 0;
        self.open_since = None;
    }

    fn waiting_to_send(&self) -> bool {
        self.batches.iter().any(|b| b.state == BatchState::Pending)
    }

    /// The smallest seq not acknowledged yet (sealed or to be sealed).
    fn first_unacked(&self) -> u64 {
        self.batches
            .iter()
            .find(|b| b.state != BatchState::Acked)
            .map_or(self.next_seq, |b| b.seq)
    }

    fn pop_acked(&mut self) {
        while self
            .batches
            .front()
            .is_some_and(|b| b.state == BatchState::Acked)
        {
            let b = self.batches.pop_front().expect("front exists");
            bump(&self.counters.records_acked, b.records);
            bump(&self.counters.batches_acked, 1);
        }
    }

    fn answer_flushes(&mut self) {
        let acked_below = self.first_unacked();
        let mut i = 0;
        while i < self.flushes.len() {
            if self.flushes[i].0 <= acked_below {
                let (_, tx) = self.flushes.swap_remove(i);
                let _ = tx.send(Ok(()));
            } else {
                i += 1;
            }
        }
    }

    fn send_ready(&mut self) {
        if self.draining || self.retry_at.is_some() {
            return;
        }
        let first_unacked = self.first_unacked();
        for b in self.batches.iter_mut() {
            if self.in_flight.len() >= self.config.in_flight_max {
                break;
            }
            if b.state != BatchState::Pending {
                continue;
            }
            b.state = BatchState::InFlight;
            b.sent_first = b.seq == first_unacked;
            bump(&self.counters.requests, 1);
            let (request, seq, body) = (self.request.clone(), b.seq, b.body.clone());
            self.in_flight
                .spawn(async move { (seq, request.post(seq, body).await) });
        }
    }

    fn answered(&mut self, seq: u64, result: Result<bool>) -> Result<()> {
        let front = self.batches.front().expect("an answered batch is held").seq;
        let batch = &mut self.batches[(seq - front) as usize];
        assert_eq!(batch.seq, seq, "batches are held in seq order");
        assert_eq!(
            batch.state,
            BatchState::InFlight,
            "only sent batches are answered"
        );
        let e = match result {
            Ok(duplicate) => {
                batch.state = BatchState::Acked;
                if duplicate {
                    bump(&self.counters.duplicates, 1);
                }
                self.acked_since_recovery = true;
                self.failing_since = None;
                self.backoff.reset();
                return Ok(());
            }
            Err(e) => e,
        };
        batch.state = BatchState::Pending;
        self.draining = true;
        if let Some(Reason::SequenceGap { expected, .. }) = e.reason() {
            if batch.sent_first {
                return Err(Error::Decode {
                    request: format!("POST {} (Producer-Seq {seq})", self.request.stream.path()),
                    message: format!(
                        "the server expects Producer-Seq {expected}, but every batch below \
                         {seq} was acknowledged: it lost acknowledged batches"
                    ),
                });
            }
            bump(&self.counters.gaps, 1);
            return Ok(());
        }
        if !e.is_retryable() {
            return Err(e);
        }
        bump(&self.counters.failures, 1);
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.config.retry_for {
            return Err(e);
        }
        self.need_backoff = true;
        Ok(())
    }

    /// Every request of a failed round is answered: send again from the first
    /// unacknowledged batch, after a backoff unless the round made progress and
    /// only met early arrivals.
    fn recover(&mut self) {
        self.draining = false;
        if self.need_backoff || !self.acked_since_recovery {
            let wait = self.backoff.next_wait();
            self.retry_at = Some(tokio::time::Instant::now() + wait);
        }
        self.need_backoff = false;
        self.acked_since_recovery = false;
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
