//! `token create`, `token ls` and `token revoke`: the token API
//! (`/__picomq/tokens`), with the caller's own token in `--token`.

use bytes::Bytes;
use clap::{Args, Subcommand};
use picomq_client::HttpMethod;
use serde_json::{json, Value};

use super::{note, out, out_json, CliResult, Conn, Ctx, Failure, Kind};

const TOKENS: &str = "/__picomq/tokens";

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issue a token (never with more rights than --token); prints its secret once.
    Create(CreateArgs),
    /// List the tokens --token manages: itself and those issued under it.
    Ls(LsArgs),
    /// Revoke a token, and every token issued under it, at once.
    Revoke(RevokeArgs),
}

impl TokenCommand {
    pub fn conn(&self) -> &Conn {
        match self {
            TokenCommand::Create(a) => &a.conn,
            TokenCommand::Ls(a) => &a.conn,
            TokenCommand::Revoke(a) => &a.conn,
        }
    }
}

fn seconds(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .or_else(|_| humantime::parse_duration(s).map(|d| d.as_secs()))
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("{s:?} is neither seconds nor a duration like 30d"))
}

#[derive(Args)]
pub struct CreateArgs {
    /// OPS:PATTERN, repeatable. OPS: create, append, read, delete, admin, tokens,
    /// subscribe, claim, schemas, tables or all, comma-separated; PATTERN: a stream name, a prefix (`orders/**`) or a glob
    /// (`orders/*/events`). Example: --scope read,append:orders/**
    #[arg(long = "scope", required = true, value_name = "OPS:PATTERN")]
    pub scopes: Vec<String>,
    /// The token expires after this long (seconds, or 1h, 30d) [default: never, or
    /// the issuing token's expiry].
    #[arg(long, value_parser = seconds, value_name = "DURATION")]
    pub expires_in: Option<u64>,
    /// Confine the token to a namespace, e.g. tenant-a/: every stream name it uses is
    /// taken as relative to it.
    #[arg(long)]
    pub namespace: Option<String>,
    /// What the token is for (shown by token ls).
    #[arg(long, default_value = "")]
    pub description: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct RevokeArgs {
    /// The token's id (tok_..., from token ls or token create).
    pub id: String,
    #[command(flatten)]
    pub conn: Conn,
}

pub async fn run(command: TokenCommand) -> CliResult {
    let ctx = Ctx::new(command.conn())?;
    if command.conn().token.is_none() {
        return Err(Failure::new(
            Kind::Auth,
            "token commands need --token (or PICOMQ_TOKEN) with the tokens scope",
        ));
    }
    match command {
        TokenCommand::Create(a) => create(&ctx, a).await,
        TokenCommand::Ls(_) => ls(&ctx).await,
        TokenCommand::Revoke(a) => revoke(&ctx, a).await,
    }
}

async fn create(ctx: &Ctx, args: CreateArgs) -> CliResult {
    let mut body = json!({ "scopes": args.scopes, "description": args.description });
    if let Some(s) = args.expires_in {
        body["expiresInSeconds"] = json!(s);
    }
    if let Some(ns) = &args.namespace {
        body["namespace"] = json!(ns);
    }
    let r = ctx
        .send(
            HttpMethod::POST,
            TOKENS,
            &[("content-type", "application/json")],
            Bytes::from(body.to_string()),
        )
        .await?;
    if r.status.as_u16() != 201 {
        return Err(Failure::from_response("token create", &r));
    }
    let v: Value = serde_json::from_slice(&r.body)
        .map_err(|e| Failure::new(Kind::Other, format!("token create: bad answer: {e}")))?;
    if ctx.json() {
        return out_json(&v);
    }
    note(
        ctx,
        format!(
            "created token {} (scopes: {}{}); the secret below is shown only once",
            v["id"].as_str().unwrap_or("?"),
            list(&v["scopes"]),
            v["expiresAt"]
                .as_str()
                .map(|e| format!(", expires {e}"))
                .unwrap_or_default(),
        ),
    );
    out(format!("{}\n", v["token"].as_str().unwrap_or_default()).as_bytes())
}

fn list(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

async fn ls(ctx: &Ctx) -> CliResult {
    let r = ctx.send(HttpMethod::GET, TOKENS, &[], Bytes::new()).await?;
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response("token ls", &r));
    }
    let v: Value = serde_json::from_slice(&r.body)
        .map_err(|e| Failure::new(Kind::Other, format!("token ls: bad answer: {e}")))?;
    if ctx.json() {
        return out_json(&v);
    }
    let mut text = String::new();
    for t in v["tokens"].as_array().into_iter().flatten() {
        let state = match (t["revokedAt"].as_str(), t["expiresAt"].as_str()) {
            (Some(at), _) => format!("revoked {at}"),
            (None, Some(at)) => format!("expires {at}"),
            (None, None) => "no expiry".to_string(),
        };
        let ns = t["namespace"].as_str().filter(|s| !s.is_empty());
        text.push_str(&format!(
            "{}\t{}\t{}{}\t{}\n",
            t["id"].as_str().unwrap_or("?"),
            list(&t["scopes"]),
            ns.map(|n| format!("namespace {n} ")).unwrap_or_default(),
            state,
            t["description"].as_str().unwrap_or(""),
        ));
    }
    out(text.as_bytes())
}

async fn revoke(ctx: &Ctx, args: RevokeArgs) -> CliResult {
    let path = format!("{TOKENS}/{}", super::query_value(&args.id));
    let r = ctx
        .send(HttpMethod::DELETE, &path, &[], Bytes::new())
        .await?;
    if r.status.as_u16() != 204 {
        return Err(Failure::from_response("token revoke", &r));
    }
    if ctx.json() {
        return out_json(&json!({ "revoked": args.id }));
    }
    note(
        ctx,
        format!("revoked {} (and every token issued under it)", args.id),
    );
    Ok(())
}
