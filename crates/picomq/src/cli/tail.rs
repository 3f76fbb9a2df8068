//! `picomq read` and `picomq tail [-f]`: catch-up reads to the current end, and live
//! following with long-poll (byte-exact, the default) or SSE. A follower only moves
//! its offset past data it has printed, so reconnecting after a dropped connection or
//! a server restart resumes exactly there: nothing lost, nothing printed twice.

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use clap::Args;
use picomq_client::{HttpMethod, SseParser};
use serde_json::{json, Value};

use super::{
    duration, out, out_json, query_value, stream_path, transient, warn, Backoff, CliResult, Conn,
    Ctx, Failure, Kind, Output,
};

/// Live requests (long-polls, SSE) outlast the server's hold time (25 s, SSE 60 s by
/// default): they get `--timeout` plus this before the client calls them dead.
const LIVE_GRACE: Duration = Duration::from_secs(60);

#[derive(Args)]
pub struct ReadArgs {
    /// Stream name: its URL path on the server, e.g. logs/app.
    pub name: String,
    /// Where to start: -1 (the beginning), now (the current end), or an offset that
    /// an earlier read returned.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub from: String,
    /// Stop after this many records: values of a JSON stream, lines of any other.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// Keep following: print records as they are appended, until the stream is closed.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Follow with Server-Sent Events instead of long-polls (text streams lose
    /// carriage returns in SSE; long-polls are byte-exact).
    #[arg(long, requires = "follow")]
    pub sse: bool,
    /// While following, keep reconnecting to an unreachable or restarting server this long.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub retry_for: Duration,
}

pub async fn read(args: ReadArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    let mut printer = Printer::new(&ctx, args.limit);
    let end = catch_up(&ctx, &path, args.from.clone(), &mut printer).await?;
    printer.end(&end)
}

pub async fn tail(args: TailArgs) -> CliResult {
    let ctx = Ctx::new(&args.read.conn)?;
    let path = stream_path(&args.read.name)?;
    let mut printer = Printer::new(&ctx, args.read.limit);
    let from = args.read.from.clone();
    let end = if !args.follow {
        catch_up(&ctx, &path, from, &mut printer).await?
    } else {
        let mut follower = Follower {
            ctx: &ctx,
            path,
            offset: from,
            retry_for: args.retry_for,
            failing_since: None,
            backoff: Backoff::new(),
        };
        if args.sse {
            // SSE events do not carry the content type that says how to print them.
            let (head, _) = ctx
                .send_retrying(
                    args.retry_for,
                    HttpMethod::HEAD,
                    &follower.path,
                    &[],
                    Bytes::new(),
                )
                .await?;
            if head.status.as_u16() != 200 {
                return Err(Failure::from_response(
                    &format!("tail {}", args.read.name),
                    &head,
                ));
            }
            printer.learn(head.header("content-type"));
            follower.sse(&mut printer).await?
        } else {
            follower.long_poll(&mut printer).await?
        }
    };
    printer.end(&end)
}

/// Where reading stopped.
struct End {
    offset: String,
    closed: bool,
    limit_reached: bool,
}

/// Catch-up reads from `offset` until the response says it is up to date.
async fn catch_up(
    ctx: &Ctx,
    path: &str,
    mut offset: String,
    printer: &mut Printer,
) -> CliResult<End> {
    loop {
        let url = format!("{path}?offset={}", query_value(&offset));
        let r = ctx.send(HttpMethod::GET, &url, &[], Bytes::new()).await?;
        if r.status.as_u16() != 200 {
            return Err(Failure::from_response(&format!("read {}", &path[1..]), &r));
        }
        printer.learn(r.header("content-type"));
        let next = next_offset(&r, &offset)?;
        if printer.chunk(&offset, &next, vec![r.body.clone()])? {
            return Ok(End {
                offset: next,
                closed: false,
                limit_reached: true,
            });
        }
        let closed = r.header("stream-closed") == Some("true");
        if r.header("stream-up-to-date") == Some("true") || closed {
            return Ok(End {
                offset: next,
                closed,
                limit_reached: false,
            });
        }
        if next == offset {
            return Err(Failure::new(
                Kind::Other,
                "the server's read made no progress",
            ));
        }
        offset = next;
    }
}

fn next_offset(r: &picomq_client::Response, current: &str) -> CliResult<String> {
    r.header("stream-next-offset")
        .map(str::to_string)
        .ok_or_else(|| {
            Failure::new(
                Kind::Other,
                format!("the response to a read at {current} has no Stream-Next-Offset"),
            )
        })
}

/// A live follower: its offset, and how long the server has been unreachable.
struct Follower<'a> {
    ctx: &'a Ctx,
    path: String,
    offset: String,
    retry_for: Duration,
    failing_since: Option<Instant>,
    backoff: Backoff,
}

impl Follower<'_> {
    fn name(&self) -> &str {
        &self.path[1..]
    }

    /// A transient failure: wait and retry, unless it has lasted `--retry-for`.
    async fn retry(&mut self, why: String) -> CliResult {
        // One warning per outage, not one per attempt.
        let first_failure = self.failing_since.is_none();
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.retry_for {
            return Err(Failure::new(
                Kind::Unavailable,
                format!(
                    "tail {}: gave up after {:?}: {why}",
                    self.name(),
                    self.retry_for
                ),
            ));
        }
        if first_failure {
            warn(
                self.ctx,
                format!("{why}; reconnecting from offset {}", self.offset),
            );
        }
        self.backoff.wait().await;
        Ok(())
    }

    fn connected(&mut self) {
        self.failing_since = None;
        self.backoff.reset();
    }

    async fn long_poll(&mut self, printer: &mut Printer) -> CliResult<End> {
        let timeout = self.ctx.conn.timeout + LIVE_GRACE;
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "{}?offset={}&live=long-poll",
                self.path,
                query_value(&self.offset)
            );
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={}", query_value(c)));
            }
            let r = self
                .ctx
                .send_within(timeout, HttpMethod::GET, &url, &[], Bytes::new())
                .await;
            if transient(&r) {
                let why = match &r {
                    Ok(r) => format!("HTTP {}", r.status.as_u16()),
                    Err(f) => f.message.clone(),
                };
                self.retry(why).await?;
                continue;
            }
            let r = r?;
            self.connected();
            let next = match r.status.as_u16() {
                200 => {
                    printer.learn(r.header("content-type"));
                    let next = next_offset(&r, &self.offset)?;
                    if printer.chunk(&self.offset, &next, vec![r.body.clone()])? {
                        return Ok(End {
                            offset: next,
                            closed: false,
                            limit_reached: true,
                        });
                    }
                    next
                }
                204 => next_offset(&r, &self.offset)?,
                _ => return Err(Failure::from_response(&format!("tail {}", self.name()), &r)),
            };
            self.offset = next;
            cursor = r.header("stream-cursor").map(str::to_string);
            if r.header("stream-closed") == Some("true") {
                return Ok(End {
                    offset: self.offset.clone(),
                    closed: true,
                    limit_reached: false,
                });
            }
        }
    }

    async fn sse(&mut self, printer: &mut Printer) -> CliResult<End> {
        let idle = self.ctx.conn.timeout + LIVE_GRACE;
        loop {
            let url = format!(
                "{}?offset={}&live=sse",
                self.path,
                query_value(&self.offset)
            );
            let headers = self.ctx.headers(&[]);
            let opened = tokio::time::timeout(
                self.ctx.conn.timeout,
                self.ctx
                    .client
                    .open(HttpMethod::GET, &url, &headers, Bytes::new()),
            )
            .await;
            let mut stream = match opened {
                Err(_) => {
                    self.retry(format!("no answer within {:?}", self.ctx.conn.timeout))
                        .await?;
                    continue;
                }
                Ok(Err(e)) => {
                    let f = Failure::from_client(e);
                    if f.kind != Kind::Unavailable {
                        return Err(f);
                    }
                    self.retry(f.message).await?;
                    continue;
                }
                Ok(Ok(s)) => s,
            };
            let status = stream.status.as_u16();
            if status != 200 {
                let mut body = BytesMut::new();
                while let Ok(Some(Ok(chunk))) =
                    tokio::time::timeout(idle, stream.next_chunk()).await
                {
                    body.extend_from_slice(&chunk);
                }
                let r = picomq_client::Response {
                    status: stream.status,
                    headers: stream.headers.clone(),
                    body: body.freeze(),
                };
                if matches!(status, 429 | 502 | 503 | 504) {
                    self.retry(format!("HTTP {status}")).await?;
                    continue;
                }
                return Err(Failure::from_response(&format!("tail {}", self.name()), &r));
            }
            self.connected();
            let base64 = stream
                .headers
                .get("stream-sse-data-encoding")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"base64"));
            let mut parser = SseParser::default();
            // Data is printed only when the control event after it names the offset
            // it ends at: a connection lost in between re-reads it, never skips it.
            let mut pending: Vec<Bytes> = Vec::new();
            let ended_cleanly = loop {
                let chunk = match tokio::time::timeout(idle, stream.next_chunk()).await {
                    Ok(Some(Ok(chunk))) => chunk,
                    Ok(None) => break true,
                    Ok(Some(Err(_))) | Err(_) => break false,
                };
                for event in parser.feed(&chunk) {
                    match event.event.as_str() {
                        "data" => pending.push(decode(&event.data, base64)?),
                        "control" => {
                            let control: Value =
                                serde_json::from_str(&event.data).map_err(|e| {
                                    Failure::new(Kind::Other, format!("bad SSE control event: {e}"))
                                })?;
                            let Some(next) = control["streamNextOffset"].as_str() else {
                                return Err(Failure::new(
                                    Kind::Other,
                                    "SSE control event without streamNextOffset",
                                ));
                            };
                            let next = next.to_string();
                            let parts = std::mem::take(&mut pending);
                            if !parts.is_empty() && printer.chunk(&self.offset, &next, parts)? {
                                return Ok(End {
                                    offset: next,
                                    closed: false,
                                    limit_reached: true,
                                });
                            }
                            self.offset = next;
                            if control["streamClosed"] == Value::Bool(true) {
                                return Ok(End {
                                    offset: self.offset.clone(),
                                    closed: true,
                                    limit_reached: false,
                                });
                            }
                        }
                        _ => {}
                    }
                }
            };
            if !ended_cleanly {
                self.retry("the live connection broke".to_string()).await?;
            }
            // A clean end (the server's SSE time limit, or its shutdown): reconnect.
        }
    }
}

fn decode(data: &str, base64: bool) -> CliResult<Bytes> {
    if base64 {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(Bytes::from)
            .map_err(|e| Failure::new(Kind::Other, format!("bad base64 in an SSE data event: {e}")))
    } else {
        Ok(Bytes::copy_from_slice(data.as_bytes()))
    }
}

/// How a stream's bytes are shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Not known yet (no response with a content type seen).
    Unknown,
    /// JSON stream: each response is an array; one value per line.
    Json,
    /// text/*: printed as is; JSON output carries it as a string.
    Text,
    /// Anything else: printed as is; JSON output carries base64.
    Binary,
}

/// Writes records to stdout, honouring `--limit` and `--output`.
struct Printer {
    output: Output,
    shape: Shape,
    /// Records still allowed by `--limit`.
    remaining: Option<u64>,
}

impl Printer {
    fn new(ctx: &Ctx, limit: Option<u64>) -> Printer {
        Printer {
            output: ctx.conn.output,
            shape: Shape::Unknown,
            remaining: limit,
        }
    }

    fn learn(&mut self, content_type: Option<&str>) {
        if self.shape != Shape::Unknown {
            return;
        }
        let media = content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        self.shape = if media == "application/json" {
            Shape::Json
        } else if media.starts_with("text/") {
            Shape::Text
        } else {
            Shape::Binary
        };
    }

    /// Prints the data between offsets `start` and `next`; `true` once `--limit`
    /// records have been printed.
    fn chunk(&mut self, start: &str, next: &str, parts: Vec<Bytes>) -> CliResult<bool> {
        if self.shape == Shape::Json {
            let mut values: Vec<&[u8]> = Vec::new();
            for part in &parts {
                values.extend(json_elements(part).ok_or_else(|| {
                    Failure::new(
                        Kind::Other,
                        "a JSON stream returned something other than a JSON array",
                    )
                })?);
            }
            let total = values.len();
            let allowed = self.take(total as u64) as usize;
            values.truncate(allowed);
            let done = self.remaining == Some(0);
            if values.is_empty() {
                return Ok(done);
            }
            // A chunk printed only in part does not end at `next`.
            let next = (allowed == total).then_some(next);
            let mut text =
                Vec::with_capacity(values.iter().map(|v| v.len() + 1).sum::<usize>() + 96);
            match self.output {
                Output::Json => {
                    // Written by hand so the records stay byte for byte as stored.
                    text.extend_from_slice(b"{\"type\":\"data\",\"offset\":");
                    text.extend_from_slice(json!(start).to_string().as_bytes());
                    text.extend_from_slice(b",\"nextOffset\":");
                    text.extend_from_slice(json!(next).to_string().as_bytes());
                    text.extend_from_slice(b",\"data\":[");
                    for (i, v) in values.iter().enumerate() {
                        if i > 0 {
                            text.push(b',');
                        }
                        text.extend_from_slice(v);
                    }
                    text.extend_from_slice(b"]}\n");
                }
                Output::Text => {
                    for v in &values {
                        text.extend_from_slice(v);
                        text.push(b'\n');
                    }
                }
            }
            out(&text)?;
            return Ok(done);
        }
        let mut bytes: Bytes = if parts.len() == 1 {
            parts.into_iter().next().unwrap_or_default()
        } else {
            parts.concat().into()
        };
        let mut whole = true;
        if let Some(remaining) = self.remaining {
            let lines = bytes.iter().filter(|b| **b == b'\n').count() as u64;
            if lines >= remaining {
                // Cut after the remaining-th newline.
                let end = bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'\n')
                    .nth(remaining.saturating_sub(1) as usize)
                    .map(|(i, _)| i + 1)
                    .unwrap_or(0);
                whole = end == bytes.len();
                bytes.truncate(end);
            }
            self.take(lines);
        }
        let done = self.remaining == Some(0);
        if bytes.is_empty() {
            return Ok(done);
        }
        match self.output {
            Output::Text => out(&bytes)?,
            Output::Json => {
                let data = match self.shape {
                    Shape::Binary => {
                        json!(base64::engine::general_purpose::STANDARD.encode(&bytes))
                    }
                    _ => json!(String::from_utf8_lossy(&bytes)),
                };
                let mut event = json!({
                    "type": "data", "offset": start, "nextOffset": whole.then_some(next), "data": data,
                });
                if self.shape == Shape::Binary {
                    event["encoding"] = json!("base64");
                }
                out_json(&event)?;
            }
        }
        Ok(done)
    }

    /// Takes up to `n` from the remaining budget; returns how many may be printed.
    fn take(&mut self, n: u64) -> u64 {
        match &mut self.remaining {
            None => n,
            Some(r) => {
                let k = n.min(*r);
                *r -= k;
                k
            }
        }
    }

    fn end(&mut self, end: &End) -> CliResult {
        if self.output == Output::Json {
            out_json(&json!({
                "type": "end",
                "nextOffset": (!end.limit_reached).then_some(&end.offset),
                "closed": end.closed,
                "limitReached": end.limit_reached,
            }))?;
        }
        Ok(())
    }
}

/// The elements of a JSON array as the exact bytes the server sent: no re-encoding,
/// so key order and number spelling survive. `None` if `body` is not an array.
/// The server validated every record on the way in; this only finds the commas
/// between elements (outside strings and nested values).
fn json_elements(body: &[u8]) -> Option<Vec<&[u8]>> {
    let inner = body.trim_ascii().strip_prefix(b"[")?.strip_suffix(b"]")?;
    let mut elements = Vec::new();
    let (mut depth, mut in_string, mut escaped, mut start) = (0i64, false, false, 0);
    for (i, &b) in inner.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                elements.push(inner[start..i].trim_ascii());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 || in_string {
        return None;
    }
    let last = inner[start..].trim_ascii();
    match (last.is_empty(), elements.is_empty()) {
        (false, _) => elements.push(last),
        (true, true) => {}
        (true, false) => return None, // a trailing comma
    }
    if elements.iter().any(|e| e.is_empty()) {
        return None;
    }
    Some(elements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_elements_keep_the_bytes() {
        let body = br#"[{"b":1,"a":[1,{"x":"],"}]},"s\"[,",2.50,[] ]"#;
        let got: Vec<&str> = json_elements(body)
            .unwrap()
            .into_iter()
            .map(|e| std::str::from_utf8(e).unwrap())
            .collect();
        assert_eq!(
            got,
            [r#"{"b":1,"a":[1,{"x":"],"}]}"#, r#""s\"[,""#, "2.50", "[]"]
        );
        assert_eq!(json_elements(b"[]").unwrap().len(), 0);
        for bad in [&b"{}"[..], b"[1,]", b"[1,,2]", b"[\"open]", b"[[1]"] {
            assert!(
                json_elements(bad).is_none(),
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
    }
}
