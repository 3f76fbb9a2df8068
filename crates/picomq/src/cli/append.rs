//! `picomq append NAME`: records from stdin, one per line (or all of stdin with
//! `--raw`), batched into few requests. Each batch carries an idempotent-producer
//! stamp (a random Producer-Id per run, epoch 0, one Producer-Seq per batch), so a
//! batch retried after a lost answer, a restart or a 503 is never written twice.
//! Batches go one at a time (sequence order), and while one is in flight the next
//! one grows: a slow trickle of lines goes out at once, a fast file in big batches.

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use clap::Args;
use picomq_client::HttpMethod;
use serde_json::json;
use tokio::sync::mpsc;

use super::progress::Progress;
use super::{duration, note, out_json, stream_path, CliResult, Conn, Ctx, Failure, Kind};

/// Bytes per read from stdin.
const READ_CHUNK_BYTES: usize = 256 << 10;
/// Chunks read ahead of the sender (bounds memory: about 2 MiB).
const READ_AHEAD_CHUNKS: usize = 8;
/// A line longer than this is refused instead of buffered.
const LINE_BYTES_MAX: usize = 64 << 20;

#[derive(Args)]
pub struct AppendArgs {
    /// Stream name: its URL path on the server, e.g. logs/app.
    pub name: String,
    /// Append all of stdin as one record instead of one record per line.
    #[arg(long)]
    pub raw: bool,
    /// Records are JSON values, one per line, sent as JSON arrays [default: when the
    /// stream's content type is application/json].
    #[arg(long)]
    pub json: bool,
    /// Largest batch of lines sent in one request, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub batch_bytes: usize,
    /// Keep retrying a batch (server unreachable, restarting, 503) this long.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub retry_for: Duration,
    /// Close the stream after the last record.
    #[arg(long)]
    pub close: bool,
    /// Never draw the progress display (it shows only on a terminal, for large input).
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// What the server acknowledged for one request.
struct Ack {
    next_offset: Option<String>,
    /// Already written by an earlier attempt whose answer was lost.
    duplicate: bool,
    retries: u32,
}

struct Producer<'a> {
    ctx: &'a Ctx,
    path: String,
    content_type: String,
    id: String,
    retry_for: Duration,
    next_seq: u64,
}

impl Producer<'_> {
    /// Sends one batch (or, with an empty body and `close`, the close), retrying
    /// transient failures with the same stamp.
    async fn send(&mut self, body: Bytes, close: bool) -> CliResult<Ack> {
        let seq = self.next_seq.to_string();
        let mut headers = vec![
            ("producer-id", self.id.as_str()),
            ("producer-epoch", "0"),
            ("producer-seq", seq.as_str()),
        ];
        if !body.is_empty() {
            headers.push(("content-type", self.content_type.as_str()));
        }
        if close {
            headers.push(("stream-closed", "true"));
        }
        let (r, retries) = self
            .ctx
            .send_retrying(
                self.retry_for,
                HttpMethod::POST,
                &self.path,
                &headers,
                body.clone(),
            )
            .await?;
        match r.status.as_u16() {
            200 | 204 => {
                self.next_seq += 1;
                Ok(Ack {
                    next_offset: r.header("stream-next-offset").map(str::to_string),
                    // A batch with a body is answered 200 when written, 204 when it
                    // was already there.
                    duplicate: !body.is_empty() && r.status.as_u16() == 204,
                    retries,
                })
            }
            _ => Err(Failure::from_response(
                &format!("append to {}", self.path.trim_start_matches('/')),
                &r,
            )),
        }
    }
}

/// A random Producer-Id per run: never reused, so seq 0 always starts a new producer.
#[allow(clippy::disallowed_methods)] // the time is entropy here, not a timestamp
fn producer_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "picomq-cli-{:016x}{:08x}",
        fastrand::u64(..) ^ nanos,
        std::process::id()
    )
}

pub async fn run(args: AppendArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    if args.batch_bytes == 0 {
        return Err(Failure::new(
            Kind::Invalid,
            "--batch-bytes must be greater than 0",
        ));
    }
    // Learn the stream's content type first: appends must match it, and a missing or
    // closed stream should fail before stdin is read.
    let (head, _) = ctx
        .send_retrying(args.retry_for, HttpMethod::HEAD, &path, &[], Bytes::new())
        .await?;
    if head.status.as_u16() != 200 {
        return Err(Failure::from_response(
            &format!("append to {}", args.name),
            &head,
        ));
    }
    if head.header("stream-closed") == Some("true") {
        return Err(Failure::new(
            Kind::Conflict,
            format!("append to {}: the stream is closed", args.name),
        ));
    }
    let stream_type = head
        .header("content-type")
        .unwrap_or("application/octet-stream");
    let stream_is_json = media_type(stream_type) == "application/json";
    if args.json && !stream_is_json {
        return Err(Failure::new(
            Kind::Invalid,
            format!(
                "--json: {} is a {stream_type} stream, not application/json",
                args.name
            ),
        ));
    }
    let json_mode = args.json || stream_is_json;
    let mut producer = Producer {
        ctx: &ctx,
        path,
        content_type: stream_type.to_string(),
        id: producer_id(),
        retry_for: args.retry_for,
        next_seq: 0,
    };
    let (input_bytes, rx) = read_stdin();
    let progress = Progress::start(!args.no_progress && !ctx.json(), input_bytes);
    let started = Instant::now();
    let mut totals = Totals::default();
    let result = if args.raw {
        append_raw(&mut producer, rx, &mut totals).await
    } else {
        let mut batcher = Batcher {
            buf: BytesMut::new(),
            eof: false,
            rx,
            batch_bytes: args.batch_bytes,
        };
        append_lines(
            &mut producer,
            &mut batcher,
            json_mode,
            &mut totals,
            &progress,
        )
        .await
    };
    let result = match result {
        Ok(()) if args.close => producer.send(Bytes::new(), true).await.map(|ack| {
            totals.next_offset = ack.next_offset.or(totals.next_offset.take());
        }),
        other => other,
    };
    progress.finish().await;
    let seconds = started.elapsed().as_secs_f64();
    if let Err(mut f) = result {
        f.message = format!(
            "{} ({} records in {} batches were appended before this)",
            f.message, totals.records, totals.batches
        );
        return Err(f);
    }
    if ctx.json() {
        return out_json(&json!({
            "name": args.name,
            "records": totals.records,
            "batches": totals.batches,
            "bytes": totals.bytes,
            "retries": totals.retries,
            "duplicates": totals.duplicates,
            "closed": args.close,
            "nextOffset": totals.next_offset,
            "seconds": seconds,
        }));
    }
    let rate = if seconds > 0.0 {
        totals.records as f64 / seconds
    } else {
        0.0
    };
    note(
        &ctx,
        format!(
            "appended {} in {} ({} bytes) to {} in {seconds:.2}s ({rate:.0} records/s){}{}",
            plural(totals.records, "record"),
            plural(totals.batches, "batch"),
            totals.bytes,
            args.name,
            if args.close { "; closed it" } else { "" },
            totals
                .next_offset
                .as_deref()
                .map(|o| format!("; next offset {o}"))
                .unwrap_or_default(),
        ),
    );
    Ok(())
}

fn plural(n: u64, noun: &str) -> String {
    match (n, noun.ends_with('h')) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        _ => format!("{n} {noun}s"),
    }
}

#[derive(Default)]
struct Totals {
    records: u64,
    batches: u64,
    bytes: u64,
    retries: u64,
    duplicates: u64,
    next_offset: Option<String>,
}

impl Totals {
    fn add(&mut self, records: u64, bytes: u64, ack: Ack) {
        self.records += records;
        self.batches += 1;
        self.bytes += bytes;
        self.retries += ack.retries as u64;
        self.duplicates += ack.duplicate as u64;
        if ack.next_offset.is_some() {
            self.next_offset = ack.next_offset;
        }
    }
}

async fn append_raw(
    producer: &mut Producer<'_>,
    mut rx: mpsc::Receiver<std::io::Result<Bytes>>,
    totals: &mut Totals,
) -> CliResult {
    let mut all = BytesMut::new();
    while let Some(chunk) = rx.recv().await {
        all.extend_from_slice(&chunk.map_err(|e| Failure::io("reading stdin", e))?);
    }
    if all.is_empty() {
        return Err(Failure::new(
            Kind::Invalid,
            "stdin is empty: nothing to append",
        ));
    }
    let body = all.freeze();
    let bytes = body.len() as u64;
    let ack = producer.send(body, false).await?;
    totals.add(1, bytes, ack);
    Ok(())
}

async fn append_lines(
    producer: &mut Producer<'_>,
    batcher: &mut Batcher,
    json_mode: bool,
    totals: &mut Totals,
    progress: &Progress,
) -> CliResult {
    use std::sync::atomic::Ordering::Relaxed;
    let mut line_no = 1;
    while let Some(lines) = batcher.next().await? {
        let input_bytes = lines.len() as u64;
        let (body, records) = if json_mode {
            json_array(&lines, &mut line_no)?
        } else {
            let records = lines.iter().filter(|b| **b == b'\n').count() as u64;
            (lines, records)
        };
        if records > 0 {
            let ack = producer.send(body, false).await?;
            totals.add(records, input_bytes, ack);
        }
        progress.counters.records.fetch_add(records, Relaxed);
        progress.counters.bytes.fetch_add(input_bytes, Relaxed);
    }
    Ok(())
}

/// Whole lines (each ending in `\n`) as one JSON array of their values; blank lines
/// are skipped. `line_no` numbers the first line and is advanced past the last.
fn json_array(lines: &[u8], line_no: &mut u64) -> CliResult<(Bytes, u64)> {
    let mut body = BytesMut::with_capacity(lines.len() + 2);
    body.put_u8(b'[');
    let mut records = 0;
    for line in lines
        .strip_suffix(b"\n")
        .unwrap_or(lines)
        .split(|b| *b == b'\n')
    {
        let value = line.trim_ascii();
        if !value.is_empty() {
            serde_json::from_slice::<serde::de::IgnoredAny>(value).map_err(|e| {
                Failure::new(
                    Kind::Invalid,
                    format!("stdin line {line_no} is not valid JSON: {e}"),
                )
            })?;
            if records > 0 {
                body.put_u8(b',');
            }
            body.put_slice(value);
            records += 1;
        }
        *line_no += 1;
    }
    body.put_u8(b']');
    Ok((body.freeze(), records))
}

fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Reads stdin on its own thread (reads block) into a bounded channel. Returns the
/// input's size when stdin is a regular file.
fn read_stdin() -> (Option<u64>, mpsc::Receiver<std::io::Result<Bytes>>) {
    let size = stdin_file_size();
    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; READ_CHUNK_BYTES];
        loop {
            let chunk = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    });
    (size, rx)
}

fn stdin_file_size() -> Option<u64> {
    use std::os::fd::AsFd;
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    meta.is_file().then_some(meta.len())
}

/// Cuts stdin into batches of whole lines of at most `batch_bytes` (a longer line
/// goes alone). It never waits for a batch to fill: whatever whole lines have
/// arrived go out, so a slow producer's lines are not held back.
struct Batcher {
    buf: BytesMut,
    eof: bool,
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    batch_bytes: usize,
}

impl Batcher {
    fn push(&mut self, chunk: std::io::Result<Bytes>) -> CliResult {
        let chunk = chunk.map_err(|e| Failure::io("reading stdin", e))?;
        self.buf.extend_from_slice(&chunk);
        Ok(())
    }

    /// The next batch, ending in `\n`; `None` at the end of input.
    async fn next(&mut self) -> CliResult<Option<Bytes>> {
        loop {
            // Take what has already arrived, without waiting.
            while self.buf.len() < self.batch_bytes && !self.eof {
                match self.rx.try_recv() {
                    Ok(chunk) => self.push(chunk)?,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => self.eof = true,
                }
            }
            if self.eof && !self.buf.is_empty() && !self.buf.ends_with(b"\n") {
                // The last line had no newline: records are lines, so give it one.
                self.buf.put_u8(b'\n');
            }
            if let Some(end) = self.cut() {
                return Ok(Some(self.buf.split_to(end).freeze()));
            }
            if self.eof {
                return Ok(None);
            }
            if self.buf.len() > LINE_BYTES_MAX {
                return Err(Failure::new(
                    Kind::Invalid,
                    format!("a line of stdin is longer than {LINE_BYTES_MAX} bytes"),
                ));
            }
            match self.rx.recv().await {
                Some(chunk) => self.push(chunk)?,
                None => self.eof = true,
            }
        }
    }

    /// Where the next batch ends, if a whole line is buffered.
    fn cut(&self) -> Option<usize> {
        let window = &self.buf[..self.buf.len().min(self.batch_bytes)];
        if let Some(i) = window.iter().rposition(|b| *b == b'\n') {
            return Some(i + 1);
        }
        let rest = self.buf.get(self.batch_bytes..)?;
        rest.iter()
            .position(|b| *b == b'\n')
            .map(|i| self.batch_bytes + i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn batches(input: &[&str], batch_bytes: usize) -> Vec<String> {
        let (tx, rx) = mpsc::channel(input.len().max(1));
        for chunk in input {
            tx.send(Ok(Bytes::from(chunk.to_string()))).await.unwrap();
        }
        drop(tx);
        let mut b = Batcher {
            buf: BytesMut::new(),
            eof: false,
            rx,
            batch_bytes,
        };
        let mut out = Vec::new();
        while let Some(batch) = b.next().await.unwrap() {
            out.push(String::from_utf8(batch.to_vec()).unwrap());
        }
        out
    }

    #[tokio::test]
    async fn batches_are_whole_lines_within_the_limit() {
        assert_eq!(batches(&["a\nb", "b\nc"], 100).await, vec!["a\nbb\nc\n"]);
        assert_eq!(
            batches(&["aa\nbb\ncc\n"], 6).await,
            vec!["aa\nbb\n", "cc\n"]
        );
        // A line longer than a batch goes alone.
        assert_eq!(
            batches(&["a\nlonglongline\nb\n"], 4).await,
            vec!["a\n", "longlongline\n", "b\n"]
        );
        assert!(batches(&[], 10).await.is_empty());
        assert_eq!(batches(&["\n\n"], 10).await, vec!["\n\n"]);
    }

    #[test]
    fn json_lines_become_an_array() {
        let mut line = 1;
        let (body, n) = json_array(b"{\"a\":1}\n\n  2 \n\"x\"\n", &mut line).unwrap();
        assert_eq!(&body[..], b"[{\"a\":1},2,\"x\"]");
        assert_eq!((n, line), (3, 5));
        let mut line = 10;
        let err = json_array(b"1\n{oops\n", &mut line).unwrap_err();
        assert_eq!(err.kind, Kind::Invalid);
        assert!(err.message.contains("line 11"), "{}", err.message);
    }
}
