//! `group create|ls|rm` and `consume`: consumer groups (`/__picomq/groups`). A
//! consumer claims messages under a lease, prints (or runs a command on) each, and
//! acks it, or nacks it when the command fails; it retries through restarts and
//! failovers of the server, so a message is never lost, at worst delivered again.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use clap::{Args, Subcommand};
use picomq_client::HttpMethod;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::{duration, expect_json, note, out, out_json, CliResult, Conn, Ctx, Failure, Kind};

const GROUPS: &str = "/__picomq/groups";
/// How long a claim waits on the server for messages.
const CLAIM_WAIT_MS: u64 = 20_000;
/// How long `consume` keeps retrying an unavailable server before giving up.
const RETRY_FOR: Duration = Duration::from_secs(300);

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Create a consumer group on a stream (succeeds if it exists on that stream).
    Create(CreateArgs),
    /// List the consumer groups.
    Ls(LsArgs),
    /// Show a group's configuration and counts (pending, in flight, lag, ...).
    Show(NameArgs),
    /// Delete a consumer group (its stream stays).
    Rm(NameArgs),
}

impl GroupCommand {
    pub fn conn(&self) -> &Conn {
        match self {
            GroupCommand::Create(a) => &a.conn,
            GroupCommand::Ls(a) => &a.conn,
            GroupCommand::Show(a) | GroupCommand::Rm(a) => &a.conn,
        }
    }
}

#[derive(Args)]
pub struct CreateArgs {
    /// The group's name (A-Z a-z 0-9 - _ .).
    pub group: String,
    /// The stream whose messages the group's members share.
    #[arg(long)]
    pub stream: String,
    /// Deliveries after which a message goes to the dead-letter stream (0: never).
    #[arg(long, default_value_t = 5)]
    pub max_deliveries: u32,
    /// Where messages out of deliveries are appended (a JSON stream, created if
    /// absent); without it they are dropped and counted.
    #[arg(long)]
    pub dead_letter: Option<String>,
    /// How long a member holds a message before it is delivered to another.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub lease: Duration,
    /// Where the group starts: -1 (the stream's start), now (its tail), or an offset.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub from: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct NameArgs {
    pub group: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct ConsumeArgs {
    /// The group to take messages from.
    pub group: String,
    /// Run this command once per message (through `sh -c`), the message on its
    /// stdin: exit status 0 acks it, anything else nacks it.
    #[arg(long)]
    pub exec: Option<String>,
    /// This consumer's name (default: host and process id).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Messages claimed at once.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Stop after this many messages (default: run until interrupted).
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Delay before a nacked message is delivered again.
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub nack_delay: Duration,
    #[command(flatten)]
    pub conn: Conn,
}

fn group_path(group: &str) -> String {
    format!("{GROUPS}/{}", super::query_value(group))
}

pub async fn run(command: GroupCommand) -> CliResult {
    let ctx = Ctx::new(command.conn())?;
    match command {
        GroupCommand::Create(a) => {
            let body = json!({
                "stream": a.stream.trim_start_matches('/'),
                "maxDeliveries": a.max_deliveries,
                "deadLetter": a.dead_letter.as_deref().map(|d| d.trim_start_matches('/')),
                "leaseMs": a.lease.as_millis() as u64,
                "from": a.from,
            });
            let r = ctx
                .send(
                    HttpMethod::PUT,
                    &group_path(&a.group),
                    &[("content-type", "application/json")],
                    Bytes::from(body.to_string()),
                )
                .await?;
            let created = r.status.as_u16() == 201;
            let v = expect_json("group create", r, &[200, 201])?;
            if ctx.json() {
                return out_json(&v);
            }
            note(
                &ctx,
                format!(
                    "{} group {} on {}",
                    if created { "created" } else { "exists:" },
                    a.group,
                    v["stream"].as_str().unwrap_or("")
                ),
            );
            Ok(())
        }
        GroupCommand::Ls(_) => {
            let r = ctx.send(HttpMethod::GET, GROUPS, &[], Bytes::new()).await?;
            let v = expect_json("group ls", r, &[200])?;
            if ctx.json() {
                return out_json(&v);
            }
            let mut text = String::new();
            for g in v["groups"].as_array().cloned().unwrap_or_default() {
                text.push_str(&format!(
                    "{}\t{}\n",
                    g["group"].as_str().unwrap_or(""),
                    g["stream"].as_str().unwrap_or("")
                ));
            }
            out(text.as_bytes())
        }
        GroupCommand::Show(a) => {
            let r = ctx
                .send(HttpMethod::GET, &group_path(&a.group), &[], Bytes::new())
                .await?;
            let v = expect_json("group show", r, &[200])?;
            if ctx.json() {
                return out_json(&v);
            }
            let mut text = String::new();
            for k in [
                "group",
                "stream",
                "cursor",
                "lagBytes",
                "pending",
                "inFlight",
                "acked",
                "redeliveries",
                "deadLettered",
                "maxDeliveries",
                "deadLetter",
                "leaseMs",
            ] {
                text.push_str(&format!("{k}\t{}\n", v[k]));
            }
            out(text.as_bytes())
        }
        GroupCommand::Rm(a) => {
            let r = ctx
                .send(HttpMethod::DELETE, &group_path(&a.group), &[], Bytes::new())
                .await?;
            expect_json("group rm", r, &[204])?;
            Ok(())
        }
    }
}

/// POSTs `body` to the group's `action`, retrying while the server is unavailable
/// (a restart, a failover): claims, acks and nacks are all safe to repeat.
async fn call(
    ctx: &Ctx,
    group: &str,
    action: &str,
    body: Value,
    timeout: Duration,
) -> CliResult<Value> {
    let path = format!("{}/{action}", group_path(group));
    let started = std::time::Instant::now();
    let mut backoff = super::Backoff::new();
    loop {
        let r = ctx
            .send_within(
                timeout,
                HttpMethod::POST,
                &path,
                &[("content-type", "application/json")],
                Bytes::from(body.to_string()),
            )
            .await;
        if super::transient(&r) && started.elapsed() < RETRY_FOR {
            backoff.wait().await;
            continue;
        }
        let r = r?;
        return expect_json(action, r, &[200]);
    }
}

pub async fn consume(a: ConsumeArgs) -> CliResult {
    let ctx = Ctx::new(&a.conn)?;
    let consumer = a.consumer.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "consumer".into());
        format!("{host}-{}", std::process::id())
    });
    let batch = a.batch.clamp(1, 1_000);
    let wait = Duration::from_millis(CLAIM_WAIT_MS) + a.conn.timeout;
    let mut handled = 0u64;
    loop {
        if a.max_messages.is_some_and(|m| handled >= m) {
            return Ok(());
        }
        let want = a
            .max_messages
            .map_or(batch, |m| batch.min((m - handled) as usize));
        let claim = json!({ "consumer": consumer, "max": want, "waitMs": CLAIM_WAIT_MS });
        let v = call(&ctx, &a.group, "claim", claim, wait).await?;
        let messages = v["messages"].as_array().cloned().unwrap_or_default();
        let mut acks = Vec::new();
        let mut nacks = Vec::new();
        for m in &messages {
            let id = m["id"].as_str().unwrap_or("").to_string();
            let ok = match &a.exec {
                Some(cmd) => run_exec(cmd, m).await?,
                None => {
                    print_message(&ctx, m)?;
                    true
                }
            };
            if ok {
                acks.push(id);
            } else {
                nacks.push(id);
            }
            handled += 1;
        }
        if !acks.is_empty() {
            call(
                &ctx,
                &a.group,
                "ack",
                json!({ "ids": acks }),
                a.conn.timeout,
            )
            .await?;
        }
        if !nacks.is_empty() {
            let body = json!({ "ids": nacks, "delayMs": a.nack_delay.as_millis() as u64 });
            call(&ctx, &a.group, "nack", body, a.conn.timeout).await?;
        }
    }
}

/// The message's bytes as a command sees them on stdin.
fn payload(m: &Value) -> Vec<u8> {
    if let Some(b64) = m["bodyBase64"].as_str() {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default();
    }
    m["body"].to_string().into_bytes()
}

fn print_message(ctx: &Ctx, m: &Value) -> CliResult {
    if ctx.json() {
        return out_json(m);
    }
    let mut bytes = payload(m);
    bytes.push(b'\n');
    out(&bytes)
}

async fn run_exec(cmd: &str, m: &Value) -> CliResult<bool> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("PICOMQ_MESSAGE_ID", m["id"].as_str().unwrap_or(""))
        .env("PICOMQ_DELIVERIES", m["deliveries"].to_string())
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::new(Kind::Invalid, format!("--exec {cmd:?}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its stdin is fine.
        let _ = stdin.write_all(&payload(m)).await;
    }
    let status = child
        .wait()
        .await
        .map_err(|e| Failure::io("waiting for --exec", e))?;
    Ok(status.success())
}
