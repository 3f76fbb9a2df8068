//! `node ls`, `node drain` and `node resume`: a cluster's members
//! (`/__picomq/nodes`), with an admin token when the server needs one.

use bytes::Bytes;
use clap::{Args, Subcommand};
use picomq_client::HttpMethod;
use serde_json::Value;

use super::{note, out, out_json, CliResult, Conn, Ctx, Failure, Kind};

const NODES: &str = "/__picomq/nodes";

#[derive(Subcommand)]
pub enum NodeCommand {
    /// List the cluster's nodes: state, lease, share of the streams (after a line
    /// naming the cluster, its store and its metadata).
    Ls(LsArgs),
    /// Hand a node's streams to the other nodes without stopping it.
    Drain(NodeArgs),
    /// Let a drained node take its share of the streams again.
    Resume(NodeArgs),
}

impl NodeCommand {
    pub fn conn(&self) -> &Conn {
        match self {
            NodeCommand::Ls(a) => &a.conn,
            NodeCommand::Drain(a) | NodeCommand::Resume(a) => &a.conn,
        }
    }
}

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct NodeArgs {
    /// The node's id (the NODE column of node ls).
    pub node_id: String,
    #[command(flatten)]
    pub conn: Conn,
}

pub async fn run(command: NodeCommand) -> CliResult {
    let ctx = Ctx::new(command.conn())?;
    match command {
        NodeCommand::Ls(_) => ls(&ctx).await,
        NodeCommand::Drain(a) => set(&ctx, &a.node_id, "drain").await,
        NodeCommand::Resume(a) => set(&ctx, &a.node_id, "resume").await,
    }
}

async fn ls(ctx: &Ctx) -> CliResult {
    let r = ctx.send(HttpMethod::GET, NODES, &[], Bytes::new()).await?;
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response("node ls", &r));
    }
    let v: Value = serde_json::from_slice(&r.body)
        .map_err(|e| Failure::new(Kind::Other, format!("node ls: bad answer: {e}")))?;
    if ctx.json() {
        return out_json(&v);
    }
    let c = &v["cluster"];
    let mut text = format!(
        "cluster {}  store {}  metadata {} {}\n",
        c["clusterId"].as_str().unwrap_or("?"),
        c["store"].as_str().unwrap_or("?"),
        c["meta"]["kind"].as_str().unwrap_or("?"),
        c["meta"]["id"].as_str().unwrap_or("?"),
    );
    text.push_str("NODE\tSTATE\tLEASE\tSLOTS\tSHARE\tEPOCH\tURL\n");
    for n in v["nodes"].as_array().into_iter().flatten() {
        let lease = n["leaseExpiresInMs"].as_i64().unwrap_or(0);
        let lease = if lease > 0 {
            format!("{:.1}s", lease as f64 / 1000.0)
        } else {
            "-".into()
        };
        text.push_str(&format!(
            "{}{}\t{}\t{}\t{}\t{:.1}%\t{}\t{}\n",
            n["nodeId"].as_str().unwrap_or("?"),
            if n["thisNode"].as_bool() == Some(true) {
                " *"
            } else {
                ""
            },
            n["state"].as_str().unwrap_or("?"),
            lease,
            n["slots"].as_u64().unwrap_or(0),
            n["share"].as_f64().unwrap_or(0.0) * 100.0,
            n["epoch"].as_u64().unwrap_or(0),
            n["advertise"].as_str().unwrap_or(""),
        ));
    }
    out(text.as_bytes())
}

async fn set(ctx: &Ctx, node_id: &str, action: &str) -> CliResult {
    let path = format!("{NODES}/{}/{action}", super::query_value(node_id));
    let r = ctx.send(HttpMethod::POST, &path, &[], Bytes::new()).await?;
    if r.status.as_u16() != 200 {
        return Err(Failure::from_response(&format!("node {action}"), &r));
    }
    if ctx.json() {
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        return out_json(&v);
    }
    let done = if action == "drain" {
        "draining: its streams move to the other nodes (node ls shows its slots fall to 0)"
    } else {
        "resumed: it takes its share of the streams again"
    };
    note(ctx, format!("{node_id}: {done}"));
    Ok(())
}
