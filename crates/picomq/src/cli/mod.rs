//! The client commands of `picomq`: each talks HTTP to a server through
//! `picomq_client`. Owns what they share: connection options, the mapping of
//! responses to failures and exit codes, stream names in URLs, and output. Data goes
//! to stdout, everything else to stderr; `--output json` makes both machine-readable.
//! Nothing here knows the server's internals: only the HTTP API.

mod append;
mod group;
mod lifecycle;
mod node;
mod progress;
mod records;
mod table;
mod tail;
mod token;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use picomq_client::{Client, ClientError, HttpMethod, Response};
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Create a stream (succeeds if it exists with the same configuration).
    Create(lifecycle::CreateArgs),
    /// Append records read from stdin: one per line, or all of it with --raw.
    Append(append::AppendArgs),
    /// Print a stream's records from an offset up to its current end.
    Read(tail::ReadArgs),
    /// Print a stream's records; with -f keep following until it is closed.
    Tail(tail::TailArgs),
    /// Show a stream's metadata.
    Head(lifecycle::NameArgs),
    /// List streams, optionally only those whose names start with a prefix.
    Ls(lifecycle::LsArgs),
    /// Close a stream: no more appends; readers see its end.
    Close(lifecycle::NameArgs),
    /// Delete a stream and its records.
    Rm(lifecycle::NameArgs),
    /// Drop a stream's records before an offset (reads there then answer 410).
    Trim(lifecycle::TrimArgs),
    /// Issue, list and revoke access tokens (servers run with --auth required).
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// A cluster's nodes: list them, drain one, resume one.
    Node {
        #[command(subcommand)]
        command: node::NodeCommand,
    },
    /// Consumer groups: create one on a stream, list them, show one, delete one.
    Group {
        #[command(subcommand)]
        command: group::GroupCommand,
    },
    /// Take messages from a consumer group: print each (or run --exec on it) and
    /// acknowledge it; a failed --exec hands it back.
    Consume(group::ConsumeArgs),
    /// Records with sequence numbers, timestamps and headers (the native API):
    /// append stdin's lines, read from a number, a time or the tail, show info.
    Records {
        #[command(subcommand)]
        command: records::RecordsCommand,
    },
    /// Streams as Apache Iceberg tables: define one, list them, show one (its
    /// snapshot and lag), drop one.
    Table {
        #[command(subcommand)]
        command: table::TableCommand,
    },
}

pub async fn run(command: ClientCommand) -> ExitCode {
    let output = match &command {
        ClientCommand::Create(a) => a.conn.output,
        ClientCommand::Append(a) => a.conn.output,
        ClientCommand::Read(a) => a.conn.output,
        ClientCommand::Tail(a) => a.read.conn.output,
        ClientCommand::Head(a) | ClientCommand::Close(a) | ClientCommand::Rm(a) => a.conn.output,
        ClientCommand::Ls(a) => a.conn.output,
        ClientCommand::Trim(a) => a.conn.output,
        ClientCommand::Token { command } => command.conn().output,
        ClientCommand::Node { command } => command.conn().output,
        ClientCommand::Group { command } => command.conn().output,
        ClientCommand::Consume(a) => a.conn.output,
        ClientCommand::Records { command } => command.conn().output,
        ClientCommand::Table { command } => command.conn().output,
    };
    let result = match command {
        ClientCommand::Create(a) => lifecycle::create(a).await,
        ClientCommand::Append(a) => append::run(a).await,
        ClientCommand::Read(a) => tail::read(a).await,
        ClientCommand::Tail(a) => tail::tail(a).await,
        ClientCommand::Head(a) => lifecycle::head(a).await,
        ClientCommand::Ls(a) => lifecycle::ls(a).await,
        ClientCommand::Close(a) => lifecycle::close(a).await,
        ClientCommand::Rm(a) => lifecycle::rm(a).await,
        ClientCommand::Trim(a) => lifecycle::trim(a).await,
        ClientCommand::Token { command } => token::run(command).await,
        ClientCommand::Node { command } => node::run(command).await,
        ClientCommand::Group { command } => group::run(command).await,
        ClientCommand::Consume(a) => group::consume(a).await,
        ClientCommand::Records { command } => records::run(command).await,
        ClientCommand::Table { command } => table::run(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`picomq read s | head`) is not a failure.
        Err(Failure {
            kind: Kind::StdoutClosed,
            ..
        }) => ExitCode::SUCCESS,
        Err(f) => {
            f.report(output);
            ExitCode::from(f.kind.exit_code())
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// For programs: one JSON document (read and tail: one JSON object per line).
    Json,
}

/// Where the server is and how to talk to it; shared by every client command.
#[derive(Args, Clone, Debug)]
pub struct Conn {
    /// Server URL.
    #[arg(long, env = "PICOMQ_URL", default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// Bearer token, sent as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "PICOMQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
    /// Speak HTTP/2 instead of HTTP/1.1 (h2c with prior knowledge on http://).
    #[arg(long)]
    pub http2: bool,
    /// For https:// URLs: trust only the certificates in this PEM file (a private CA
    /// or a self-signed server) instead of the system's trust store.
    #[arg(long, env = "PICOMQ_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// How long one request may take (live follows wait longer).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub timeout: Duration,
}

/// What went wrong, by what a script would do about it. Each kind has its own exit
/// code (documented in the README's CLI section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Anything else: a server error, an unexpected answer, local I/O.
    Other,
    /// Bad arguments or input, or a request the server rejected as invalid (400, 413).
    Invalid,
    /// No such stream (404, 410).
    NotFound,
    /// The request conflicts with the stream's state (409): exists with another
    /// configuration, closed, sequence conflict.
    Conflict,
    /// Authentication or authorization failed (401, 403).
    Auth,
    /// No answer: the server is unreachable, timed out, or unavailable (503, 429)
    /// even after retries. Worth retrying later.
    Unavailable,
    /// stdout was closed by its reader; not reported.
    StdoutClosed,
}

impl Kind {
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::StdoutClosed => 0,
            Kind::Other => 1,
            Kind::Invalid => 2,
            Kind::NotFound => 3,
            Kind::Conflict => 4,
            Kind::Auth => 5,
            Kind::Unavailable => 6,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Other => "error",
            Kind::Invalid => "invalid",
            Kind::NotFound => "not_found",
            Kind::Conflict => "conflict",
            Kind::Auth => "auth",
            Kind::Unavailable => "unavailable",
            Kind::StdoutClosed => "stdout_closed",
        }
    }
}

#[derive(Debug)]
pub struct Failure {
    pub kind: Kind,
    pub message: String,
    /// The HTTP status and the server's error code, when the server answered.
    pub status: Option<u16>,
    pub code: Option<String>,
}

pub type CliResult<T = ()> = Result<T, Failure>;

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            status: None,
            code: None,
        }
    }

    /// A non-success response, classified by status (and the server's error code).
    pub fn from_response(what: &str, r: &Response) -> Failure {
        let status = r.status.as_u16();
        let code = serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
        let kind = match status {
            400 | 413 | 414 | 431 => Kind::Invalid,
            401 => Kind::Auth,
            // A stale producer epoch is a conflict between writers, not a permission.
            403 if code.as_deref() == Some("producer_stale_epoch") => Kind::Conflict,
            403 => Kind::Auth,
            404 | 410 => Kind::NotFound,
            409 => Kind::Conflict,
            429 | 502 | 503 | 504 => Kind::Unavailable,
            _ => Kind::Other,
        };
        let detail = if r.body.is_empty() {
            match status {
                404 => "not found".to_string(),
                410 => "gone (deleted)".to_string(),
                _ => r.status.to_string(),
            }
        } else {
            r.error_message().trim().to_string()
        };
        Failure {
            kind,
            message: format!("{what}: {detail} (HTTP {status})"),
            status: Some(status),
            code,
        }
    }

    pub fn from_client(e: ClientError) -> Failure {
        let kind = match e {
            ClientError::Request(_) | ClientError::Tls(_) => Kind::Invalid,
            _ => Kind::Unavailable,
        };
        // The innermost cause says what happened ("Connection refused").
        let mut message = e.to_string();
        let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(&e);
        let mut root = None;
        while let Some(c) = cause {
            root = Some(c.to_string());
            cause = c.source();
        }
        if let Some(root) = root.filter(|r| !message.contains(r.as_str())) {
            message = format!("{message}: {root}");
        }
        Failure::new(kind, message)
    }

    pub fn io(what: &str, e: std::io::Error) -> Failure {
        Failure::new(Kind::Other, format!("{what}: {e}"))
    }

    fn report(&self, output: Output) {
        let mut err = std::io::stderr().lock();
        let _ = match output {
            Output::Text => writeln!(err, "picomq: {}", self.message),
            Output::Json => writeln!(
                err,
                "{}",
                json!({ "error": {
                    "kind": self.kind.name(),
                    "exitCode": self.kind.exit_code(),
                    "status": self.status,
                    "code": self.code,
                    "message": self.message,
                }})
            ),
        };
    }
}

/// An answer worth asking again for: the server may be restarting or overloaded.
pub fn transient(r: &Result<Response, Failure>) -> bool {
    match r {
        Ok(r) => matches!(r.status.as_u16(), 429 | 502 | 503 | 504),
        Err(f) => f.kind == Kind::Unavailable,
    }
}

/// Exponential backoff with jitter for retries: 100 ms doubling up to 5 s.
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
    pub async fn wait(&mut self) {
        let jitter = fastrand::u64(0..=self.next.as_millis() as u64 / 2);
        tokio::time::sleep(self.next + Duration::from_millis(jitter)).await;
        self.next = (self.next * 2).min(Self::MAX);
    }
}

/// A connected client plus the options every request needs.
pub struct Ctx {
    pub client: Client,
    pub conn: Conn,
    auth: Option<String>,
}

impl Ctx {
    pub fn new(conn: &Conn) -> CliResult<Ctx> {
        if !(conn.url.starts_with("http://") || conn.url.starts_with("https://")) {
            return Err(Failure::new(
                Kind::Invalid,
                format!("--url {:?} must start with http:// or https://", conn.url),
            ));
        }
        let client = Client::with_tls(&conn.url, conn.http2, conn.ca_cert.as_deref())
            .map_err(|e| Failure::new(Kind::Invalid, e.to_string()))?;
        Ok(Ctx {
            client,
            auth: conn.token.as_ref().map(|t| format!("Bearer {t}")),
            conn: conn.clone(),
        })
    }

    /// `extra` plus the Authorization header, if any.
    pub fn headers<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut h = extra.to_vec();
        if let Some(a) = &self.auth {
            h.push(("authorization", a.as_str()));
        }
        h
    }

    /// One request with the `--timeout` bound.
    pub async fn send(
        &self,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> CliResult<Response> {
        self.send_within(self.conn.timeout, method, path, headers, body)
            .await
    }

    pub async fn send_within(
        &self,
        timeout: Duration,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> CliResult<Response> {
        let headers = self.headers(headers);
        match tokio::time::timeout(timeout, self.client.send(method, path, &headers, body)).await {
            Ok(r) => r.map_err(Failure::from_client),
            Err(_) => Err(Failure::from_client(ClientError::Timeout(timeout))),
        }
    }

    /// A request retried with backoff while the answer is transient (unreachable,
    /// 503, 429), for up to `retry_for`. Only for requests that are safe to repeat.
    pub async fn send_retrying(
        &self,
        retry_for: Duration,
        method: HttpMethod,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> CliResult<(Response, u32)> {
        let started = std::time::Instant::now();
        let mut backoff = Backoff::new();
        let mut retries = 0;
        loop {
            let r = self.send(method.clone(), path, headers, body.clone()).await;
            if !transient(&r) || started.elapsed() >= retry_for {
                return r.map(|r| (r, retries));
            }
            if retries == 0 {
                let why = match &r {
                    Ok(r) => format!("HTTP {}", r.status.as_u16()),
                    Err(f) => f.message.clone(),
                };
                warn(self, format!("{why}; retrying for up to {retry_for:?}"));
            }
            retries += 1;
            backoff.wait().await;
        }
    }

    pub fn json(&self) -> bool {
        self.conn.output == Output::Json
    }
}

/// The URL path of a stream. A name is its URL path on the server (what `ls`
/// prints); characters a path cannot hold literally are percent-encoded, and `%`
/// is left alone so names from `ls` round-trip.
pub fn stream_path(name: &str) -> CliResult<String> {
    let name = name.trim_start_matches('/');
    if name.is_empty() {
        return Err(Failure::new(Kind::Invalid, "the stream name is empty"));
    }
    Ok(format!("/{}", path_form(name)))
}

/// A name (or the start of one) as the server stores it: in URL-path form.
pub fn path_form(name: &str) -> String {
    let mut path = String::with_capacity(name.len());
    for b in name.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
        if keep {
            path.push(b as char);
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

/// Percent-encodes a query parameter value.
pub fn query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Writes to stdout; a closed stdout ends the command quietly.
pub fn out(bytes: &[u8]) -> CliResult {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(stdout_error)
}

pub fn stdout_error(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::new(Kind::StdoutClosed, "stdout closed")
    } else {
        Failure::io("writing to stdout", e)
    }
}

/// Prints one JSON document (or line) to stdout.
pub fn out_json(v: &Value) -> CliResult {
    let mut line = v.to_string();
    line.push('\n');
    out(line.as_bytes())
}

/// The JSON body of an answer whose status is one of `ok` (`null` when empty),
/// else the failure it stands for.
pub fn expect_json(what: &str, r: Response, ok: &[u16]) -> CliResult<Value> {
    if !ok.contains(&r.status.as_u16()) {
        return Err(Failure::from_response(what, &r));
    }
    Ok(serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// A message for people, on stderr (never in JSON mode).
pub fn note(ctx: &Ctx, message: impl AsRef<str>) {
    if !ctx.json() {
        eprintln!("{}", message.as_ref());
    }
}

/// Something worth knowing that is not a failure (a retry), on stderr; in JSON mode
/// as `{"warning": {"message": ...}}`.
pub fn warn(ctx: &Ctx, message: impl AsRef<str>) {
    if ctx.json() {
        eprintln!("{}", json!({ "warning": { "message": message.as_ref() } }));
    } else {
        eprintln!("picomq: {}", message.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_paths() {
        assert_eq!(stream_path("logs/app").unwrap(), "/logs/app");
        assert_eq!(stream_path("/logs/app").unwrap(), "/logs/app");
        assert_eq!(stream_path("a b?c#d").unwrap(), "/a%20b%3Fc%23d");
        assert_eq!(stream_path("caf\u{e9}").unwrap(), "/caf%C3%A9");
        assert_eq!(stream_path("a%20b").unwrap(), "/a%20b");
        assert!(stream_path("/").is_err());
        assert_eq!(query_value("a/b c+"), "a%2Fb%20c%2B");
        assert_eq!(path_form("caf\u{e9}/"), "caf%C3%A9/");
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        let resp = |status: u16, body: &str| Response {
            status: picomq_client::StatusCode::from_u16(status).unwrap(),
            headers: Default::default(),
            body: Bytes::from(body.to_string()),
        };
        let kind = |s, b| Failure::from_response("x", &resp(s, b)).kind.exit_code();
        assert_eq!(kind(404, ""), 3);
        assert_eq!(kind(410, ""), 3);
        assert_eq!(kind(409, "{}"), 4);
        assert_eq!(kind(401, ""), 5);
        assert_eq!(kind(403, ""), 5);
        assert_eq!(
            kind(
                403,
                r#"{"error":{"code":"producer_stale_epoch","message":"m"}}"#
            ),
            4
        );
        assert_eq!(kind(503, ""), 6);
        assert_eq!(kind(400, ""), 2);
        assert_eq!(kind(500, ""), 1);
        let f = Failure::from_response(
            "append to s",
            &resp(
                409,
                r#"{"error":{"code":"stream_closed","message":"stream is closed"}}"#,
            ),
        );
        assert_eq!(f.message, "append to s: stream is closed (HTTP 409)");
        assert_eq!(f.code.as_deref(), Some("stream_closed"));
    }
}
