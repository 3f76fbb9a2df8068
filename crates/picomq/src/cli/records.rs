//! `records append|read|info`: the native record API through the SDK
//! (`picomq_client`): records with sequence numbers, server timestamps and headers.

use std::time::Duration;

use clap::{Args, Subcommand};
use futures::StreamExt;
use picomq_client::{
    Error as SdkError, FollowOptions, NewRecord, PicoMq, ReadBounds, ReadFrom, Record,
};
use serde_json::json;

use super::{out, out_json, CliResult, Conn, Failure, Kind, Output};

/// Records one append request carries (the server's limit).
const BATCH: usize = 1_000;

#[derive(Subcommand)]
pub enum RecordsCommand {
    /// Append stdin's lines as records (one per line, batched), with headers.
    Append(AppendArgs),
    /// Print records from a sequence number, a time or the tail; -f keeps following.
    Read(ReadArgs),
    /// Show the first and next sequence numbers, the record count and timestamps.
    Info(InfoArgs),
}

impl RecordsCommand {
    pub fn conn(&self) -> &Conn {
        match self {
            RecordsCommand::Append(a) => &a.conn,
            RecordsCommand::Read(a) => &a.conn,
            RecordsCommand::Info(a) => &a.conn,
        }
    }
}

#[derive(Args)]
pub struct AppendArgs {
    pub stream: String,
    /// A header on every record, NAME=VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE")]
    pub headers: Vec<String>,
    /// Append only if the stream's next sequence number is this (first batch).
    #[arg(long)]
    pub match_seq: Option<u64>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct ReadArgs {
    pub stream: String,
    /// Start at this sequence number (default: the first retained record).
    #[arg(long, conflicts_with_all = ["timestamp", "tail"])]
    pub seq: Option<u64>,
    /// Start at the first record at or after this time (ms since the Unix epoch or
    /// RFC 3339, e.g. 2026-12-04T10:00:00Z).
    #[arg(long, conflicts_with = "tail")]
    pub timestamp: Option<String>,
    /// Start this many records before the tail.
    #[arg(long)]
    pub tail: Option<u64>,
    /// Print at most this many records.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Keep following new records (until the stream is closed).
    #[arg(short = 'f', long)]
    pub follow: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct InfoArgs {
    pub stream: String,
    #[command(flatten)]
    pub conn: Conn,
}

pub async fn run(command: RecordsCommand) -> CliResult {
    match command {
        RecordsCommand::Append(a) => append(a).await,
        RecordsCommand::Read(a) => read(a).await,
        RecordsCommand::Info(a) => info(a).await,
    }
}

fn sdk(conn: &Conn) -> CliResult<PicoMq> {
    let mut b = PicoMq::builder(&conn.url)
        .http2(conn.http2)
        .request_timeout(conn.timeout);
    if let Some(t) = &conn.token {
        b = b.token(t.clone());
    }
    if let Some(ca) = &conn.ca_cert {
        b = b.ca_file(ca.clone());
    }
    b.build().map_err(failure)
}

/// An SDK error as the CLI's failure (the same exit codes as every command).
fn failure(e: SdkError) -> Failure {
    let kind = match e.status().map(|s| s.as_u16()) {
        Some(400 | 413) => Kind::Invalid,
        Some(401 | 403) => Kind::Auth,
        Some(404 | 410) => Kind::NotFound,
        Some(409 | 412) => Kind::Conflict,
        Some(429 | 502..=504) => Kind::Unavailable,
        Some(_) => Kind::Other,
        None if matches!(e, SdkError::InvalidArgument(_)) => Kind::Invalid,
        None => Kind::Unavailable,
    };
    Failure {
        kind,
        status: e.status().map(|s| s.as_u16()),
        code: e.code().map(str::to_string),
        message: e.to_string(),
    }
}

async fn append(a: AppendArgs) -> CliResult {
    let mut headers = Vec::new();
    for h in &a.headers {
        let (name, value) = h.split_once('=').ok_or_else(|| {
            Failure::new(Kind::Invalid, format!("--header {h:?}: use NAME=VALUE"))
        })?;
        headers.push((name.to_string(), value.to_string()));
    }
    let stream = sdk(&a.conn)?.stream(&a.stream);
    let stdin = std::io::stdin();
    let mut batch = Vec::new();
    let mut match_seq = a.match_seq;
    let (mut first, mut last) = (None, None);
    loop {
        let mut buf = String::new();
        let line = match stdin.read_line(&mut buf) {
            Ok(0) => None,
            Ok(_) => Some(buf.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) => return Err(Failure::io("reading stdin", e)),
        };
        if let Some(line) = &line {
            let mut r = NewRecord::text(line.clone());
            for (n, v) in &headers {
                r = r.header(n.clone(), v.clone());
            }
            batch.push(r);
        }
        if batch.len() >= BATCH || (line.is_none() && !batch.is_empty()) {
            let ack = stream
                .append_records(&batch, match_seq.take())
                .await
                .map_err(failure)?;
            first = first.or(ack.first_seq);
            last = ack.last_seq.or(last);
            batch.clear();
        }
        if line.is_none() {
            break;
        }
    }
    match a.conn.output {
        Output::Json => out_json(&json!({ "first_seq": first, "last_seq": last })),
        Output::Text => match (first, last) {
            (Some(f), Some(l)) => out(format!("appended records {f}..={l}\n").as_bytes()),
            _ => out(b"nothing to append\n"),
        },
    }
}

fn print(record: &Record, output: Output) -> CliResult {
    match output {
        Output::Json => out_json(&json!({
            "seq": record.seq,
            "timestamp": record.timestamp,
            "offset": record.offset.as_str(),
            "headers": record.headers,
            "body": String::from_utf8_lossy(&record.body),
        })),
        Output::Text => {
            let mut line = format!("{} {}", record.seq, record.timestamp);
            for (n, v) in &record.headers {
                line.push_str(&format!(" {n}={v}"));
            }
            line.push(' ');
            line.push_str(&String::from_utf8_lossy(&record.body));
            line.push('\n');
            out(line.as_bytes())
        }
    }
}

async fn read(a: ReadArgs) -> CliResult {
    let stream = sdk(&a.conn)?.stream(&a.stream);
    let from = match (&a.seq, &a.timestamp, &a.tail) {
        (Some(n), _, _) => ReadFrom::Seq(*n),
        (_, Some(t), _) => ReadFrom::Timestamp(timestamp(t)?),
        (_, _, Some(n)) => ReadFrom::Tail(*n),
        _ => ReadFrom::Start,
    };
    let limit = a.limit.unwrap_or(u64::MAX);
    let mut printed = 0;
    if a.follow {
        let options = FollowOptions {
            retry_for: Some(Duration::from_secs(300)),
            ..FollowOptions::default()
        };
        let mut records = stream.follow_records(from, ReadBounds::default(), options);
        while printed < limit {
            match records.next().await {
                Some(r) => print(&r.map_err(failure)?, a.conn.output)?,
                None => break,
            }
            printed += 1;
        }
        return Ok(());
    }
    // Up to the tail as it is now.
    let mut from = from;
    loop {
        let batch = stream
            .read_records(&from, &ReadBounds::default())
            .await
            .map_err(failure)?;
        for r in &batch.records {
            if printed == limit {
                return Ok(());
            }
            print(r, a.conn.output)?;
            printed += 1;
        }
        if batch.up_to_date || batch.records.is_empty() {
            return Ok(());
        }
        from = ReadFrom::Seq(batch.next_seq);
    }
}

/// Milliseconds since the Unix epoch, or RFC 3339.
fn timestamp(t: &str) -> CliResult<u64> {
    if let Ok(ms) = t.parse::<u64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(t)
        .ok()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            Failure::new(
                Kind::Invalid,
                format!("--timestamp {t:?}: use milliseconds since the Unix epoch or RFC 3339"),
            )
        })
}

async fn info(a: InfoArgs) -> CliResult {
    let info = sdk(&a.conn)?
        .stream(&a.stream)
        .info()
        .await
        .map_err(failure)?;
    match a.conn.output {
        Output::Json => out_json(&json!({
            "stream": info.stream,
            "content_type": info.content_type,
            "first_seq": info.first_seq,
            "next_seq": info.next_seq,
            "records": info.records,
            "first_offset": info.first_offset.as_str(),
            "next_offset": info.next_offset.as_str(),
        })),
        Output::Text => out(
            format!(
                "stream        {}\ncontent type  {}\nfirst seq     {}\nnext seq      {}\nrecords       {}\nnext offset   {}\n",
                info.stream,
                info.content_type,
                info.first_seq,
                info.next_seq,
                info.records,
                info.next_offset.as_str()
            )
            .as_bytes(),
        ),
    }
}
