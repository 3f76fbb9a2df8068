//! `picomq store identity` and `picomq store rebind`: the binding of a bucket prefix
//! and its metadata (`picomq_engine::identity`), read and, deliberately, rewritten.
//! Unlike the client commands these open the store and the database themselves,
//! with `serve`'s flags and defaults; no server needs to run (and for a rebind none
//! may).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use picomq_engine::identity::{self, StoreIdentity};
use picomq_engine::meta::{redacted_url, Meta, MetaIdentity};
use picomq_engine::store::ObjectStore;
use picomq_node::Config;

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Show what the store's prefix and the metadata say they belong to, and
    /// whether a node started with them would be refused.
    Identity(Target),
    /// Bind the store's prefix and the metadata to each other, whatever they were
    /// bound to before: for deliberate moves (metadata restored onto a new
    /// database, a prefix copied elsewhere). Every node must be stopped.
    Rebind(RebindArgs),
}

/// The store and metadata, spelt as for `picomq serve`.
#[derive(Args)]
pub struct Target {
    /// Directory of the default object store and metadata database.
    #[arg(long, env = "PICOMQ_DATA_DIR", default_value = "./picomq-data")]
    pub data_dir: PathBuf,
    /// Object store URL [default: file://DATA_DIR/objects].
    #[arg(long, env = "PICOMQ_STORE")]
    pub store: Option<String>,
    /// Metadata database URL [default: sqlite://DATA_DIR/meta.sqlite].
    #[arg(long, env = "PICOMQ_META")]
    pub meta: Option<String>,
}

#[derive(Args)]
pub struct RebindArgs {
    #[command(flatten)]
    pub target: Target,
    /// Do it (without this, only say what would change).
    #[arg(long)]
    pub yes: bool,
}

pub async fn run(command: StoreCommand) -> ExitCode {
    let result = match command {
        StoreCommand::Identity(t) => show(&t).await,
        StoreCommand::Rebind(a) => rebind(&a).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("picomq store: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a target opens to.
struct Opened {
    store: std::sync::Arc<dyn ObjectStore>,
    store_name: String,
    meta: Meta,
    meta_shown: String,
    /// Held while the command runs, when the data directory is used.
    _lock: Option<picomq_node::data_dir::DataDirLock>,
}

async fn open(t: &Target) -> Result<Opened, String> {
    let config = Config {
        data_dir: t.data_dir.clone(),
        store: t.store.clone(),
        meta: t.meta.clone(),
        ..Config::default()
    };
    let lock = match config.uses_data_dir() {
        true => Some(picomq_node::data_dir::lock(&config.absolute_data_dir()?)?),
        false => None,
    };
    let store_url = config.store_url()?;
    let meta_url = config.meta_url()?;
    let store = picomq_engine::store::open(&store_url).map_err(|e| format!("--store: {e}"))?;
    let meta = Meta::open(&meta_url)
        .await
        .map_err(|e| format!("--meta: {e}"))?;
    Ok(Opened {
        store,
        store_name: picomq_engine::store::name(&store_url),
        meta,
        meta_shown: redacted_url(&meta_url),
        _lock: lock,
    })
}

fn describe_store(found: &Option<StoreIdentity>) -> String {
    match found {
        Some(f) => format!(
            "cluster {}, {} metadata {}, first written as {}",
            f.cluster_id, f.meta_kind, f.meta_id, f.store
        ),
        None => "no identity (never started by this version, or empty)".into(),
    }
}

fn describe_meta(m: &MetaIdentity) -> String {
    match &m.cluster_id {
        Some(c) => format!(
            "{} metadata {}, bound to cluster {c} at {}",
            m.kind,
            m.meta_id,
            m.store.as_deref().unwrap_or("?")
        ),
        None => format!("{} metadata {}, not bound yet", m.kind, m.meta_id),
    }
}

async fn show(t: &Target) -> Result<(), String> {
    let o = open(t).await?;
    let found = identity::read(&*o.store).await.map_err(|e| e.to_string())?;
    let mine = o.meta.identity().await.map_err(|e| e.to_string())?;
    println!("store {}: {}", o.store_name, describe_store(&found));
    println!("meta  {}: {}", o.meta_shown, describe_meta(&mine));
    let verdict = match &found {
        Some(f) => match identity::agree(f, &mine, &o.store_name) {
            Ok(()) => "they belong to each other: a node starts".to_string(),
            Err(e) => e.to_string(),
        },
        None if mine.cluster_id.is_some() => {
            "the metadata is bound to another prefix: a node is refused".into()
        }
        None => "neither is bound: the first node to start binds them (if they agree)".into(),
    };
    println!("{verdict}");
    Ok(())
}

async fn rebind(a: &RebindArgs) -> Result<(), String> {
    let o = open(&a.target).await?;
    if let Some(coord) = o.meta.coordinator() {
        let members = coord.members().await.map_err(|e| e.to_string())?;
        let alive: Vec<String> = members
            .iter()
            .filter(|m| m.is_alive())
            .map(|m| m.node_id.clone())
            .collect();
        if !alive.is_empty() {
            return Err(format!(
                "nodes still run on this metadata ({}): stop every node first",
                alive.join(", ")
            ));
        }
    }
    let found = identity::read(&*o.store).await.map_err(|e| e.to_string())?;
    let mine = o.meta.identity().await.map_err(|e| e.to_string())?;
    if let Some(f) = &found {
        let holds_data = identity::holds_wal(&*o.store)
            .await
            .map_err(|e| e.to_string())?;
        if f.meta_kind == "sqlite" && mine.kind == "postgres" && holds_data {
            return Err(format!(
                "{} holds a single node's streams, whose metadata is in that node's SQLite, not in {}: rebinding would leave them unindexed. Moving a single node's streams into a cluster is not supported yet (docs/cluster.md, \"Identity\")",
                o.store_name, o.meta_shown
            ));
        }
    }
    println!("store {}: {}", o.store_name, describe_store(&found));
    println!("meta  {}: {}", o.meta_shown, describe_meta(&mine));
    if !a.yes {
        println!("would bind them to each other; run again with --yes to do it");
        return Ok(());
    }
    let b = identity::rebind(&*o.store, &o.meta, &o.store_name)
        .await
        .map_err(|e| e.to_string())?;
    println!("bound: {b}");
    Ok(())
}
