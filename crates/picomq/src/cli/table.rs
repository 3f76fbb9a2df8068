//! `table create|ls|show|rm`: streams exported as Apache Iceberg tables
//! (`/__picomq/tables`, docs/tables.md).

use bytes::Bytes;
use clap::{Args, Subcommand};
use picomq_client::HttpMethod;
use serde_json::json;

use super::{expect_json, note, out, out_json, CliResult, Conn, Ctx, Failure, Kind};

const TABLES: &str = "/__picomq/tables";

#[derive(Subcommand)]
pub enum TableCommand {
    /// Define a table fed by streams (succeeds if it exists with the same
    /// definition).
    Create(CreateArgs),
    /// List the tables.
    Ls(LsArgs),
    /// Show a table: its definition, current snapshot and each stream's lag.
    Show(NameArgs),
    /// Drop a table and its files (its streams stay).
    Rm(NameArgs),
}

impl TableCommand {
    pub fn conn(&self) -> &Conn {
        match self {
            TableCommand::Create(a) => &a.conn,
            TableCommand::Ls(a) => &a.conn,
            TableCommand::Show(a) | TableCommand::Rm(a) => &a.conn,
        }
    }
}

#[derive(Args)]
pub struct CreateArgs {
    /// NAMESPACE/TABLE (or NAMESPACE.TABLE).
    pub table: String,
    /// The streams that feed it: a name, or a prefix ending in `**` (`orders/**`).
    /// Repeat for several.
    #[arg(long, required = true)]
    pub source: Vec<String>,
    /// A schema registry subject whose latest schema types the body columns.
    #[arg(long)]
    pub schema_subject: Option<String>,
    /// How often the table commits at most (1s to 24h).
    #[arg(long, default_value = "1m")]
    pub commit_interval: String,
    /// Partition fields: identity(stream), day(timestamp), hour(timestamp), ...
    /// Repeat for several.
    #[arg(long)]
    pub partition_by: Vec<String>,
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
    /// NAMESPACE/TABLE (or NAMESPACE.TABLE).
    pub table: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// The table's path, from `ns/table` or `ns.table`.
fn table_path(name: &str) -> CliResult<String> {
    let (ns, t) = name
        .split_once('/')
        .or_else(|| name.split_once('.'))
        .ok_or_else(|| {
            Failure::new(
                Kind::Invalid,
                format!("{name:?}: name a table as NAMESPACE/TABLE"),
            )
        })?;
    Ok(format!(
        "{TABLES}/{}/{}",
        super::query_value(ns),
        super::query_value(t)
    ))
}

pub async fn run(command: TableCommand) -> CliResult {
    let ctx = Ctx::new(command.conn())?;
    match command {
        TableCommand::Create(a) => {
            let path = table_path(&a.table)?;
            let source = match a.source.as_slice() {
                [one] => json!(one),
                many => json!(many),
            };
            let mut body = json!({
                "source": source,
                "commitInterval": a.commit_interval,
                "partitionBy": a.partition_by,
            });
            if let Some(s) = &a.schema_subject {
                body["schemaSubject"] = json!(s);
            }
            let r = ctx
                .send(
                    HttpMethod::PUT,
                    &path,
                    &[("content-type", "application/json")],
                    Bytes::from(body.to_string()),
                )
                .await?;
            let created = r.status.as_u16() == 201;
            let v = expect_json("table create", r, &[200, 201])?;
            if ctx.json() {
                return out_json(&v);
            }
            note(
                &ctx,
                format!(
                    "{} table {}.{} at {}",
                    if created { "created" } else { "exists:" },
                    v["namespace"].as_str().unwrap_or(""),
                    v["table"].as_str().unwrap_or(""),
                    v["location"].as_str().unwrap_or("")
                ),
            );
            Ok(())
        }
        TableCommand::Ls(_) => {
            let r = ctx.send(HttpMethod::GET, TABLES, &[], Bytes::new()).await?;
            let v = expect_json("table ls", r, &[200])?;
            if ctx.json() {
                return out_json(&v);
            }
            let mut text = String::new();
            for t in v["tables"].as_array().cloned().unwrap_or_default() {
                text.push_str(&format!(
                    "{}.{}\t{}\n",
                    t["namespace"].as_str().unwrap_or(""),
                    t["table"].as_str().unwrap_or(""),
                    t["definition"]["source"]
                ));
            }
            out(text.as_bytes())
        }
        TableCommand::Show(a) => {
            let r = ctx
                .send(HttpMethod::GET, &table_path(&a.table)?, &[], Bytes::new())
                .await?;
            let v = expect_json("table show", r, &[200])?;
            if ctx.json() {
                return out_json(&v);
            }
            let mut text = String::new();
            for k in [
                "namespace",
                "table",
                "definition",
                "location",
                "metadataLocation",
                "snapshot",
                "streamCount",
                "lagRecords",
                "lagSeconds",
            ] {
                text.push_str(&format!("{k}\t{}\n", v[k]));
            }
            for s in v["streams"].as_array().cloned().unwrap_or_default() {
                text.push_str(&format!(
                    "stream\t{}\texported {}\ttail {}\tlag {} records, {}s\n",
                    s["stream"].as_str().unwrap_or(""),
                    s["exportedSeq"],
                    s["tailSeq"],
                    s["lagRecords"],
                    s["lagSeconds"]
                ));
            }
            out(text.as_bytes())
        }
        TableCommand::Rm(a) => {
            let r = ctx
                .send(
                    HttpMethod::DELETE,
                    &table_path(&a.table)?,
                    &[],
                    Bytes::new(),
                )
                .await?;
            expect_json("table rm", r, &[204])?;
            Ok(())
        }
    }
}
