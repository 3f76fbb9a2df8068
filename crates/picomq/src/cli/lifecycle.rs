//! `create`, `head`, `ls`, `close`, `rm` and `trim`: one request each (`ls` one per
//! page).

use bytes::Bytes;
use clap::Args;
use picomq_client::{HttpMethod, Response};
use serde_json::{json, Value};

use super::{
    note, out, out_json, path_form, query_value, stream_path, CliResult, Conn, Ctx, Failure, Kind,
};

/// Seconds (`3600`) or a duration (`1h`, `90m`).
fn ttl_secs(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .or_else(|_| humantime::parse_duration(s).map(|d| d.as_secs()))
        .map_err(|_| format!("{s:?} is neither seconds nor a duration like 1h"))
}

#[derive(Args)]
pub struct NameArgs {
    /// Stream name: its URL path on the server, e.g. logs/app.
    pub name: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct CreateArgs {
    /// Stream name: its URL path on the server, e.g. logs/app.
    pub name: String,
    /// Content type of the stream [default: text/plain].
    #[arg(long, conflicts_with = "json")]
    pub content_type: Option<String>,
    /// A JSON stream: records are JSON values (content type application/json).
    #[arg(long)]
    pub json: bool,
    /// Delete the stream after this long without reads or appends (seconds, or 1h).
    #[arg(long, value_name = "SECS", value_parser = ttl_secs, conflicts_with = "expires_at")]
    pub ttl: Option<u64>,
    /// Delete the stream at this time (RFC 3339, e.g. 2030-01-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub expires_at: Option<String>,
    /// Drop records older than this (seconds, or 7d); the server trims them in the
    /// background, a WAL object's worth at a time.
    #[arg(long, value_name = "SECS", value_parser = ttl_secs)]
    pub retention: Option<u64>,
    #[command(flatten)]
    pub conn: Conn,
}

pub async fn create(args: CreateArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    let content_type = match (&args.content_type, args.json) {
        (Some(ct), _) => ct.clone(),
        (None, true) => "application/json".to_string(),
        (None, false) => "text/plain".to_string(),
    };
    let ttl = args.ttl.map(|t| t.to_string());
    let mut headers = vec![("content-type", content_type.as_str())];
    if let Some(ttl) = &ttl {
        headers.push(("stream-ttl", ttl));
    }
    if let Some(at) = &args.expires_at {
        headers.push(("stream-expires-at", at));
    }
    let retention = args.retention.map(|r| r.to_string());
    if let Some(retention) = &retention {
        headers.push(("stream-retention", retention));
    }
    let r = ctx
        .send(HttpMethod::PUT, &path, &headers, Bytes::new())
        .await?;
    let created = match r.status.as_u16() {
        201 => true,
        200 => false,
        _ => return Err(Failure::from_response(&format!("create {}", args.name), &r)),
    };
    let stored_type = r.header("content-type").unwrap_or(&content_type);
    if ctx.json() {
        return out_json(&json!({
            "name": args.name,
            "created": created,
            "contentType": stored_type,
            "nextOffset": r.header("stream-next-offset"),
        }));
    }
    if created {
        note(&ctx, format!("created {} ({stored_type})", args.name));
    } else {
        note(
            &ctx,
            format!("{} already exists with this configuration", args.name),
        );
    }
    Ok(())
}

pub async fn head(args: NameArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    let r = ctx.send(HttpMethod::HEAD, &path, &[], Bytes::new()).await?;
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response(&format!("head {}", args.name), &r));
    }
    let info = json!({
        "name": args.name,
        "contentType": r.header("content-type"),
        "nextOffset": r.header("stream-next-offset"),
        "closed": r.header("stream-closed") == Some("true"),
        "ttlSeconds": r.header("stream-ttl").and_then(|t| t.parse::<u64>().ok()),
        "expiresAt": r.header("stream-expires-at"),
        "startOffset": r.header("stream-start-offset"),
        "retentionSeconds": r.header("stream-retention").and_then(|t| t.parse::<u64>().ok()),
    });
    if ctx.json() {
        return out_json(&info);
    }
    let field = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = format!(
        "name:         {}\ncontent-type: {}\nstart-offset: {}\nnext-offset:  {}\nclosed:       {}\nttl-seconds:  {}\nexpires-at:   {}\nretention:    {}\n",
        field(&info["name"]),
        field(&info["contentType"]),
        field(&info["startOffset"]),
        field(&info["nextOffset"]),
        field(&info["closed"]),
        field(&info["ttlSeconds"]),
        field(&info["expiresAt"]),
        field(&info["retentionSeconds"]),
    );
    out(text.as_bytes())
}

pub async fn close(args: NameArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    let r = ctx
        .send(
            HttpMethod::POST,
            &path,
            &[("stream-closed", "true")],
            Bytes::new(),
        )
        .await?;
    if !r.status.is_success() {
        return Err(Failure::from_response(&format!("close {}", args.name), &r));
    }
    let next = r.header("stream-next-offset");
    if ctx.json() {
        return out_json(&json!({ "name": args.name, "closed": true, "nextOffset": next }));
    }
    note(
        &ctx,
        format!("closed {} at offset {}", args.name, next.unwrap_or("?")),
    );
    Ok(())
}

pub async fn rm(args: NameArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = stream_path(&args.name)?;
    let r = ctx
        .send(HttpMethod::DELETE, &path, &[], Bytes::new())
        .await?;
    if !r.status.is_success() {
        return Err(Failure::from_response(&format!("rm {}", args.name), &r));
    }
    if ctx.json() {
        return out_json(&json!({ "name": args.name, "deleted": true }));
    }
    note(&ctx, format!("deleted {}", args.name));
    Ok(())
}

#[derive(Args)]
pub struct TrimArgs {
    /// Stream name: its URL path on the server, e.g. logs/app.
    pub name: String,
    /// Drop every record before this offset (a Stream-Next-Offset value, as `read`
    /// and `head` print them).
    #[arg(long, value_name = "OFFSET")]
    pub before: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// The trim endpoint of a stream path (reserved path; see the README's HTTP API).
fn trim_path(stream_path: &str, before: &str) -> String {
    format!(
        "/__picomq/streams{stream_path}/trim?before={}",
        query_value(before)
    )
}

pub async fn trim(args: TrimArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    let path = trim_path(&stream_path(&args.name)?, &args.before);
    let r = ctx.send(HttpMethod::POST, &path, &[], Bytes::new()).await?;
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response(&format!("trim {}", args.name), &r));
    }
    let body: Value = serde_json::from_slice(&r.body)
        .map_err(|e| Failure::new(Kind::Other, format!("trim: the answer is not JSON: {e}")))?;
    let start = body["start"].as_str().unwrap_or("?");
    if ctx.json() {
        return out_json(&json!({ "name": args.name, "startOffset": start }));
    }
    note(
        &ctx,
        format!("trimmed {}: it now starts at offset {start}", args.name),
    );
    Ok(())
}

#[derive(Args)]
pub struct LsArgs {
    /// Only streams whose names start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Start after this name (names are listed in byte order).
    #[arg(long, default_value = "")]
    pub after: String,
    /// Stop after this many streams.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Streams fetched per request (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub page_size: u32,
    /// Also print content type, next offset and whether the stream is closed.
    #[arg(short, long)]
    pub long: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// The listing endpoint (reserved path; see the README's "Reserved paths").
const LISTING_PATH: &str = "/__picomq/streams";

pub async fn ls(args: LsArgs) -> CliResult {
    let ctx = Ctx::new(&args.conn)?;
    // Names are listed in URL-path form, so the prefix and cursor are too.
    let prefix = path_form(args.prefix.trim_start_matches('/'));
    let mut after = path_form(args.after.trim_start_matches('/'));
    let mut printed: u64 = 0;
    let limit = args.limit.unwrap_or(u64::MAX);
    // JSON: one array, written as pages arrive so long listings stream.
    if ctx.json() {
        out(b"[")?;
    }
    'pages: while printed < limit {
        let page = (limit - printed).min(args.page_size as u64);
        let path = format!(
            "{LISTING_PATH}?prefix={}&after={}&limit={page}",
            query_value(&prefix),
            query_value(&after)
        );
        let r = ctx.send(HttpMethod::GET, &path, &[], Bytes::new()).await?;
        let body = listing(&r)?;
        let streams = body["streams"].as_array().cloned().unwrap_or_default();
        let mut text = String::new();
        for s in &streams {
            if ctx.json() {
                let sep = if printed == 0 { "\n" } else { ",\n" };
                text.push_str(sep);
                text.push_str(&s.to_string());
            } else if args.long {
                text.push_str(&format!(
                    "{}\t{}\t{}\t{}\n",
                    s["name"].as_str().unwrap_or(""),
                    s["contentType"].as_str().unwrap_or(""),
                    s["nextOffset"].as_str().unwrap_or(""),
                    if s["closed"] == Value::Bool(true) {
                        "closed"
                    } else {
                        "open"
                    },
                ));
            } else {
                text.push_str(s["name"].as_str().unwrap_or(""));
                text.push('\n');
            }
            printed += 1;
        }
        out(text.as_bytes())?;
        match body["next"].as_str() {
            Some(next) if !next.is_empty() => after = next.to_string(),
            _ => break 'pages,
        }
    }
    if ctx.json() {
        out(if printed == 0 { b"]\n" } else { b"\n]\n" })?;
    }
    Ok(())
}

fn listing(r: &Response) -> CliResult<Value> {
    if r.status.as_u16() == 404 {
        return Err(Failure {
            kind: Kind::Other,
            message: "this server has no stream listing (GET /__picomq/streams): is it PicoMQ?"
                .into(),
            status: Some(404),
            code: None,
        });
    }
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response("ls", r));
    }
    serde_json::from_slice(&r.body)
        .map_err(|e| Failure::new(Kind::Other, format!("ls: the listing is not JSON: {e}")))
}
