//! `picomq store identity`, `picomq store rebind` and `picomq store move-to-postgres`:
//! the binding of a bucket prefix and its metadata (`picomq_engine::identity`), read
//! and, deliberately, rewritten; and a single node's streams moved into a cluster
//! (`picomq_engine::into_cluster`). Unlike the client commands these open the store
//! and the database themselves, with `serve`'s flags and defaults; no server needs
//! to run (and for a rebind or a move none may).

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
    /// Move a single node's streams into a cluster: bring its metadata (SQLite, in
    /// --data-dir) up to date with its store, copy it into an empty Postgres
    /// database, and bind the store's prefix to that database, so cluster nodes
    /// started with the same --store and that --meta serve every stream. The single
    /// node must be stopped, and no node may run on the database.
    #[command(name = "move-to-postgres")]
    MoveToPostgres(MoveArgs),
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

#[derive(Args)]
pub struct MoveArgs {
    /// The single node's data directory (its metadata is DATA_DIR/meta.sqlite).
    #[arg(long, env = "PICOMQ_DATA_DIR", default_value = "./picomq-data")]
    pub data_dir: PathBuf,
    /// The single node's object store URL [default: file://DATA_DIR/objects]; the
    /// cluster's nodes get the same.
    #[arg(long, env = "PICOMQ_STORE")]
    pub store: Option<String>,
    /// The single node's WAL store, if it had one; the cluster's nodes get the same.
    #[arg(long, env = "PICOMQ_WAL_STORE", value_name = "URL")]
    pub wal_store: Option<String>,
    /// The single node's metadata, if it was not in its data directory
    /// [default: sqlite://DATA_DIR/meta.sqlite].
    #[arg(long, value_name = "URL")]
    pub from_meta: Option<String>,
    /// The cluster's database (postgres://...): empty, and no node running on it.
    #[arg(long, value_name = "URL")]
    pub meta: String,
    /// Do it (without this, only check and say what would happen).
    #[arg(long)]
    pub yes: bool,
}

pub async fn run(command: StoreCommand) -> ExitCode {
    let result = match command {
        StoreCommand::Identity(t) => show(&t).await,
        StoreCommand::Rebind(a) => rebind(&a).await,
        StoreCommand::MoveToPostgres(a) => move_to_postgres(&a).await,
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
                "{} holds a single node's streams, whose metadata is in that node's SQLite, not in {}: rebinding would leave them unindexed; to move them into a cluster, use `picomq store move-to-postgres` (docs/cluster.md, \"Deliberate moves\")",
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

/// The path of a `sqlite://PATH[?...]` URL.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://")?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty()).then(|| PathBuf::from(path))
}

async fn move_to_postgres(a: &MoveArgs) -> Result<(), String> {
    use picomq_engine::into_cluster::{self, Source, Stage};
    use picomq_engine::meta::{is_shared_url, PostgresMeta, SqliteMeta};
    let target_shown = redacted_url(&a.meta);
    if !is_shared_url(&a.meta) {
        return Err(format!(
            "--meta {target_shown}: the cluster's database must be a postgres:// (or postgresql://) URL"
        ));
    }
    let config = Config {
        data_dir: a.data_dir.clone(),
        store: a.store.clone(),
        meta: a.from_meta.clone(),
        ..Config::default()
    };
    let dir = config.absolute_data_dir()?;
    if !dir.is_dir() {
        return Err(format!(
            "--data-dir {}: no such directory (the single node's data directory)",
            dir.display()
        ));
    }
    let store_url = config.store_url()?;
    if store_url.starts_with("memory:") {
        return Err("--store memory://: a memory store holds nothing to move".into());
    }
    let sqlite_url = config.meta_url()?;
    let Some(sqlite_file) = sqlite_path(&sqlite_url) else {
        return Err(format!(
            "--from-meta {}: the single node's metadata must be a sqlite://PATH URL",
            redacted_url(&sqlite_url)
        ));
    };
    if !sqlite_file.is_file() {
        return Err(format!(
            "no single node's metadata at {}: is --data-dir the single node's data directory?",
            sqlite_file.display()
        ));
    }
    // While the single node runs, its data directory is locked.
    let _lock = picomq_node::data_dir::lock(&dir).map_err(|e| {
        match e.split_once(": one picomq serve") {
            Some((held, _)) => {
                format!("refusing to move: the single node still runs ({held}); stop it first")
            }
            None => e,
        }
    })?;
    let opened = picomq_node::storage::open(
        &store_url,
        a.wal_store.as_deref(),
        picomq_engine::CostConfig::default(),
        picomq_node::storage::Faults::default(),
    )?;
    // Recovery must finish as a whole: each request is retried on its own.
    let store: std::sync::Arc<dyn ObjectStore> = std::sync::Arc::new(
        picomq_engine::store::retrying::RetryingStore::new(opened.store),
    );
    let sqlite = SqliteMeta::open(&sqlite_url)
        .await
        .map_err(|e| format!("the single node's metadata: {e}"))?;
    let target = PostgresMeta::open(&a.meta)
        .await
        .map_err(|e| format!("--meta: {e}"))?;
    let source = Source {
        store,
        store_name: picomq_engine::store::name(&store_url),
        sqlite,
    };
    let plan = into_cluster::plan(&source, &target)
        .await
        .map_err(|e| e.to_string())?;
    let cluster = plan.cluster_id.as_deref().unwrap_or("(new)");
    println!(
        "single node: {} ({}), store {}, cluster {cluster}",
        dir.display(),
        describe_meta(&plan.single),
        source.store_name
    );
    println!("  holds {}", plan.counts);
    let first_last = match (plan.epochs.first(), plan.epochs.last()) {
        (Some(f), Some(l)) => format!("epochs {f} to {l}"),
        _ => "no epoch yet".into(),
    };
    println!(
        "  log: {first_last}; {} WAL objects past its index (indexed before the copy)",
        plan.unindexed
    );
    println!("target: {target_shown} ({})", describe_meta(&plan.target));
    match plan.stage {
        Stage::Done => {
            println!(
                "already moved: {} is bound to this database; start the cluster's nodes with the same --store and this --meta",
                source.store_name
            );
            return Ok(());
        }
        Stage::Unfinished => println!(
            "an earlier move of this store into this database did not finish: its copy is replaced"
        ),
        Stage::Fresh => {}
    }
    if !a.yes {
        println!(
            "would: recover the single node's metadata from its store (claiming a new epoch and sealing every log), copy it into the database in one transaction with every epoch recorded as a finished member, then bind {} to the database; run again with --yes to do it",
            source.store_name
        );
        return Ok(());
    }
    let Some(moved) = into_cluster::run(&source, &target)
        .await
        .map_err(|e| e.to_string())?
    else {
        println!("already moved");
        return Ok(());
    };
    let restored = match moved.restored_checkpoint {
        true => ", restored from a checkpoint",
        false => "",
    };
    println!(
        "recovered: epoch {} claimed, {} WAL objects replayed{restored}",
        moved.epoch, moved.replayed
    );
    println!("copied: {}", moved.counts);
    let epochs: Vec<String> = moved.members.iter().map(|(e, _)| e.to_string()).collect();
    println!(
        "logs: epochs {} recorded as finished members",
        epochs.join(", ")
    );
    println!("bound: {}", moved.binding);
    println!(
        "start the cluster's nodes with the same --store (and --wal-store) and --meta {target_shown}; {} is no longer used",
        sqlite_file.display()
    );
    Ok(())
}
