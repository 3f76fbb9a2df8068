//! The binding of a bucket prefix and its metadata store, so that neither can be
//! paired with the wrong other.
//!
//! The prefix holds `identity.json` (written create-only, once): the cluster's id
//! and the metadata of record it belongs to (its kind and, for Postgres, the id the
//! database made for itself). The metadata holds one `identity` row: its own id,
//! and, once bound, the cluster id and the store it was bound at. Each names the
//! other. [`bind`] checks both before a node writes anything to the bucket, and
//! [`Watch`] checks again while it runs (each lease renewal in a cluster, each fence
//! check on one node).
//!
//! Why it holds: the bucket's object is created before the metadata is bound, and
//! create-only, so of two first starts racing on one empty prefix exactly one
//! writes it; the other reads it back and finds another metadata named. A node
//! whose `--store` is another prefix of the same database finds that prefix empty
//! (or another cluster's) while its metadata is bound: refused. A single node
//! (SQLite: a local, rebuildable index of the bucket) may rebuild from any prefix
//! written by a single node, never from a cluster's, and a cluster never starts on
//! a single node's prefix.
//!
//! Prefixes written before identities existed are adopted when the two sides agree
//! (both new, or the bucket holds the claim of the newest epoch the metadata knows);
//! anything else is refused with both sides named. Deliberate moves go through
//! [`rebind`] (`picomq store rebind`), never through an edited row.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::layout;
use crate::meta::Meta;

/// What the bucket prefix says it belongs to (`identity.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreIdentity {
    pub cluster_id: String,
    /// `sqlite` (a single node: the bucket is the record) or `postgres` (a cluster).
    pub meta_kind: String,
    /// The id of the metadata of record (a Postgres database's); for SQLite, the
    /// id of the node's index when the prefix was first written (informational).
    pub meta_id: String,
    /// The store as first written, for messages.
    pub store: String,
    pub created_unix_ms: u64,
}

/// What a metadata store says of itself (its `identity` row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaIdentity {
    /// `sqlite` or `postgres`.
    pub kind: &'static str,
    /// Made by the database when its schema was created.
    pub meta_id: String,
    /// The cluster (bucket prefix) it belongs to, once bound.
    pub cluster_id: Option<String>,
    /// The store it was bound at (normalised URL), once bound.
    pub store: Option<String>,
}

/// What a node checked at start: the metadata and the store belong to each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub cluster_id: String,
    /// This node's store (normalised URL, no credentials).
    pub store: String,
    pub meta_kind: String,
    pub meta_id: String,
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster {} (store {}, {} metadata {})",
            self.cluster_id, self.store, self.meta_kind, self.meta_id
        )
    }
}

/// What a database (or prefix) is, in words for messages.
fn meta_words(kind: &str, id: &str) -> String {
    format!("{kind} metadata {id}")
}

/// Reads the prefix's identity; `None` when it has none.
pub async fn read(store: &dyn ObjectStore) -> Result<Option<StoreIdentity>> {
    match store.get(&Path::from(layout::IDENTITY)).await {
        Ok(got) => {
            let bytes = got.bytes().await?;
            let id = serde_json::from_slice(&bytes).map_err(|e| {
                EngineError::Internal(format!(
                    "{} in the store is not a PicoMQ identity: {e}",
                    layout::IDENTITY
                ))
            })?;
            Ok(Some(id))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `id` at the prefix create-only; `false` if the prefix already has one.
async fn create(store: &dyn ObjectStore, id: &StoreIdentity) -> Result<bool> {
    let body = serde_json::to_vec_pretty(id)
        .map_err(|e| EngineError::Internal(format!("identity: {e}")))?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let path = Path::from(layout::IDENTITY);
    match store
        .put_opts(&path, PutPayload::from(Bytes::from(body)), opts)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Checks, and on a first start makes, the binding of `meta` and the prefix `store`
/// (reached as `store_name`, see `store::name`). Writes nothing to the bucket but
/// the identity object, and only when the prefix has none and its contents agree
/// with the metadata. Refusals name both sides and say what to do.
pub async fn bind(store: &dyn ObjectStore, meta: &Meta, store_name: &str) -> Result<Binding> {
    let mine = meta.identity().await?;
    let mut found = read(store).await?;
    let mut created = false;
    if found.is_none() {
        adoptable(store, meta, &mine, store_name).await?;
        let made = StoreIdentity {
            cluster_id: mine.cluster_id.clone().unwrap_or_else(new_id),
            meta_kind: mine.kind.to_string(),
            meta_id: mine.meta_id.clone(),
            store: store_name.to_string(),
            created_unix_ms: crate::clock::Clock::system().now_ms(),
        };
        if create(store, &made).await? {
            tracing::info!(cluster = %made.cluster_id, store = %store_name, "wrote the store's identity (first start on this prefix)");
            found = Some(made);
            created = true;
        } else {
            // Another first start won the race: judge what it wrote.
            found = read(store).await?;
        }
    }
    let Some(found) = found else {
        return Err(EngineError::Unavailable(format!(
            "{} at {store_name} was created and then not found; retry",
            layout::IDENTITY
        )));
    };
    agree(&found, &mine, store_name)?;
    let bound = match &mine.cluster_id {
        Some(_) => mine,
        None => meta.bind(&found.cluster_id, store_name).await?,
    };
    // Two first starts on one database with different prefixes: one bound it. The
    // loser takes back the identity it just wrote, so its prefix stays untouched.
    if let Err(refused) = agree(&found, &bound, store_name) {
        if created {
            let _ = store.delete(&Path::from(layout::IDENTITY)).await;
        }
        return Err(refused);
    }
    Ok(Binding {
        cluster_id: found.cluster_id,
        store: store_name.to_string(),
        meta_kind: bound.kind.to_string(),
        meta_id: bound.meta_id,
    })
}

/// `Ok` if the prefix's identity and the metadata's belong to each other.
pub fn agree(found: &StoreIdentity, mine: &MetaIdentity, store_name: &str) -> Result<()> {
    match mismatch(found, mine, store_name) {
        Some(why) => Err(refusal(why)),
        None => Ok(()),
    }
}

/// Why the prefix's identity and the metadata's do not belong to each other, if
/// they do not.
pub fn mismatch(found: &StoreIdentity, mine: &MetaIdentity, store_name: &str) -> Option<String> {
    let theirs = meta_words(&found.meta_kind, &found.meta_id);
    let ours = meta_words(mine.kind, &mine.meta_id);
    if let Some(cluster) = &mine.cluster_id {
        if *cluster != found.cluster_id {
            let bound_at = mine.store.as_deref().unwrap_or("?");
            return Some(format!(
                "the metadata and the store belong to different clusters: this node's {ours} belongs to cluster {cluster} on store {bound_at}, but --store {store_name} belongs to cluster {} ({theirs})",
                found.cluster_id
            ));
        }
    }
    match (found.meta_kind.as_str(), mine.kind) {
        ("postgres", "postgres") if found.meta_id != mine.meta_id => Some(format!(
            "--store {store_name} belongs to cluster {} whose metadata of record is {theirs}, not this node's {ours} (another database, or a copy of it): point --meta at that database",
            found.cluster_id
        )),
        ("postgres", "sqlite") => Some(format!(
            "--store {store_name} belongs to cluster {} ({theirs}): a single node (SQLite) cannot serve a cluster's prefix; start it with --meta pointing at that database, or give it a prefix of its own",
            found.cluster_id
        )),
        ("sqlite", "postgres") => Some(format!(
            "--store {store_name} was written by a single node (cluster {}, {theirs}), and this node's {ours} is not its record; a cluster needs a prefix of its own (to move a single node's streams into a cluster, use `picomq store move-to-postgres`)",
            found.cluster_id
        )),
        _ => None,
    }
}

/// Whether `meta` and the prefix `store` belong to each other, judged as [`bind`]
/// judges them but writing nothing: `None` when they do (or a first start would
/// bind them), else why not. Also the prefix's identity, if it has one.
pub async fn check(
    store: &dyn ObjectStore,
    meta: &Meta,
    store_name: &str,
) -> Result<(Option<StoreIdentity>, Option<String>)> {
    let mine = meta.identity().await?;
    let found = read(store).await?;
    let why = match &found {
        Some(found) => mismatch(found, &mine, store_name),
        None => not_adoptable(store, meta, &mine, store_name).await?,
    };
    Ok((found, why))
}

/// Whether a prefix without an identity may be given one for `mine`: the metadata
/// is new (and, for a cluster, the prefix empty), or the prefix holds the claim of
/// the newest epoch the metadata knows.
async fn adoptable(
    store: &dyn ObjectStore,
    meta: &Meta,
    mine: &MetaIdentity,
    store_name: &str,
) -> Result<()> {
    match not_adoptable(store, meta, mine, store_name).await? {
        Some(why) => Err(refusal(why)),
        None => Ok(()),
    }
}

/// Why a prefix without an identity may not be given one for `mine`, if it may not.
async fn not_adoptable(
    store: &dyn ObjectStore,
    meta: &Meta,
    mine: &MetaIdentity,
    store_name: &str,
) -> Result<Option<String>> {
    let ours = meta_words(mine.kind, &mine.meta_id);
    if let Some(cluster) = &mine.cluster_id {
        let bound_at = mine.store.as_deref().unwrap_or("?");
        return Ok(Some(format!(
            "this node's {ours} belongs to cluster {cluster} on store {bound_at}, but --store {store_name} holds no identity (another prefix, or an emptied one): fix --store, or give this store its own --meta"
        )));
    }
    let newest = match meta.coordinator() {
        Some(coord) => coord.max_epoch().await?,
        None => meta.node_epoch().await?,
    };
    if newest == 0 {
        // A new database: a cluster's takes only an empty prefix (a single node's
        // index rebuilds from whatever its prefix holds).
        let claims = crate::fencing::list_claims(store).await?;
        if mine.kind == "postgres" && !claims.is_empty() {
            let shown: Vec<String> = claims.iter().take(5).map(u64::to_string).collect();
            return Ok(Some(format!(
                "--store {store_name} holds logs that this node's {ours} does not know (epochs {}): written by a single node, or by another cluster's database; a cluster needs a prefix of its own",
                shown.join(", ")
            )));
        }
        return Ok(None);
    }
    match store.head(&Path::from(layout::claim_key(newest))).await {
        Ok(_) => Ok(None),
        Err(object_store::Error::NotFound { .. }) => Ok(Some(format!(
            "this node's {ours} was written for another store: it knows epoch {newest}, which --store {store_name} never claimed; fix --store, or give this store its own --meta"
        ))),
        Err(e) => Err(e.into()),
    }
}

fn refusal(msg: String) -> EngineError {
    EngineError::conflict(format!(
        "refusing to start: {msg} (see \"Identity\" in docs/cluster.md)"
    ))
}

/// Whether the prefix holds any WAL object (a log someone's metadata indexes).
pub async fn holds_wal(store: &dyn ObjectStore) -> Result<bool> {
    use futures::StreamExt;
    let mut listing = store.list(Some(&Path::from(layout::WAL)));
    match listing.next().await {
        Some(Ok(_)) => Ok(true),
        Some(Err(e)) => Err(e.into()),
        None => Ok(false),
    }
}

/// A fresh random id (128 bits, hex).
pub fn new_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// Rebinds the prefix and the metadata to each other, whatever they said before: a
/// deliberate move (a single node's prefix into a cluster's database, metadata
/// restored onto a new database). The prefix keeps its cluster id when it has one.
pub async fn rebind(store: &dyn ObjectStore, meta: &Meta, store_name: &str) -> Result<Binding> {
    let mine = meta.identity().await?;
    let cluster_id = match read(store).await? {
        Some(found) => found.cluster_id,
        None => mine.cluster_id.clone().unwrap_or_else(new_id),
    };
    let id = StoreIdentity {
        cluster_id: cluster_id.clone(),
        meta_kind: mine.kind.to_string(),
        meta_id: mine.meta_id.clone(),
        store: store_name.to_string(),
        created_unix_ms: crate::clock::Clock::system().now_ms(),
    };
    let body = serde_json::to_vec_pretty(&id)
        .map_err(|e| EngineError::Internal(format!("identity: {e}")))?;
    store
        .put(
            &Path::from(layout::IDENTITY),
            PutPayload::from(Bytes::from(body)),
        )
        .await?;
    meta.rebind(&cluster_id, store_name).await?;
    Ok(Binding {
        cluster_id,
        store: store_name.to_string(),
        meta_kind: mine.kind.to_string(),
        meta_id: mine.meta_id,
    })
}

/// Checks, while a node runs, that its binding still holds.
pub struct Watch {
    pub binding: Binding,
}

impl Watch {
    /// `Some(why)` when the metadata or the prefix now names something else;
    /// `None` when both still agree, or when either could not be read (a store
    /// that is down is the lease's and the WAL's business, not a changed binding).
    pub async fn changed(&self, store: &dyn ObjectStore, meta: &Meta) -> Option<String> {
        let b = &self.binding;
        match read(store).await {
            Ok(Some(found)) if found.cluster_id != b.cluster_id => {
                return Some(format!(
                    "{} at {} now names cluster {} ({}), not {}",
                    layout::IDENTITY,
                    b.store,
                    found.cluster_id,
                    meta_words(&found.meta_kind, &found.meta_id),
                    b.cluster_id
                ))
            }
            Ok(Some(found)) if b.meta_kind == "postgres" && found.meta_id != b.meta_id => {
                return Some(format!(
                    "{} at {} now names {}, not this node's {}",
                    layout::IDENTITY,
                    b.store,
                    meta_words(&found.meta_kind, &found.meta_id),
                    meta_words(&b.meta_kind, &b.meta_id)
                ))
            }
            Ok(None) => {
                return Some(format!(
                    "{} at {} is gone (the prefix was emptied or replaced)",
                    layout::IDENTITY,
                    b.store
                ))
            }
            _ => {}
        }
        if b.meta_kind != "postgres" {
            // A single node's index is rebuilt from the bucket; the bucket decides.
            return None;
        }
        match meta.identity().await {
            Ok(m) if m.meta_id != b.meta_id || m.cluster_id.as_ref() != Some(&b.cluster_id) => {
                Some(format!(
                    "the metadata now is {} bound to cluster {} (store {}), not {}",
                    meta_words(m.kind, &m.meta_id),
                    m.cluster_id.as_deref().unwrap_or("none"),
                    m.store.as_deref().unwrap_or("none"),
                    b
                ))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    async fn sqlite() -> Meta {
        Meta::open("sqlite::memory:")
            .await
            .expect("in-memory SQLite")
    }

    fn refused(r: Result<Binding>) -> String {
        match r {
            Err(EngineError::Conflict(msg)) => msg,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_first_start_binds_both_sides_and_later_starts_agree() {
        let (store, meta) = (InMemory::new(), sqlite().await);
        let first = bind(&store, &meta, "memory://a").await.unwrap();
        let found = read(&store).await.unwrap().expect("identity written");
        assert_eq!(found.cluster_id, first.cluster_id);
        assert_eq!(found.meta_kind, "sqlite");
        let m = meta.identity().await.unwrap();
        assert_eq!(m.cluster_id.as_deref(), Some(first.cluster_id.as_str()));
        assert_eq!(bind(&store, &meta, "memory://a").await.unwrap(), first);
    }

    #[tokio::test]
    async fn metadata_bound_elsewhere_is_refused_and_writes_nothing() {
        let (a, b, meta) = (InMemory::new(), InMemory::new(), sqlite().await);
        let bound = bind(&a, &meta, "s3://bucket/a").await.unwrap();
        let msg = refused(bind(&b, &meta, "s3://bucket/b").await);
        assert!(
            msg.contains("s3://bucket/a") && msg.contains("s3://bucket/b"),
            "{msg}"
        );
        assert!(msg.contains(&bound.cluster_id), "{msg}");
        assert_eq!(
            read(&b).await.unwrap(),
            None,
            "nothing written to the wrong prefix"
        );
    }

    #[tokio::test]
    async fn a_single_node_rebuilds_from_a_single_nodes_prefix_not_a_clusters() {
        let store = InMemory::new();
        let first = bind(&store, &sqlite().await, "memory://s").await.unwrap();
        // A lost data directory: a new, empty index adopts the prefix.
        let rebuilt = bind(&store, &sqlite().await, "memory://s").await.unwrap();
        assert_eq!(rebuilt.cluster_id, first.cluster_id);
        // A cluster's prefix is not a single node's to rebuild from.
        let cluster = InMemory::new();
        let id = StoreIdentity {
            cluster_id: "c".into(),
            meta_kind: "postgres".into(),
            meta_id: "m.1".into(),
            store: "memory://c".into(),
            created_unix_ms: 0,
        };
        assert!(create(&cluster, &id).await.unwrap());
        let msg = refused(bind(&cluster, &sqlite().await, "memory://c").await);
        assert!(
            msg.contains("single node") && msg.contains("postgres metadata m.1"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn metadata_written_for_another_prefix_is_not_adopted() {
        let (store, meta) = (InMemory::new(), sqlite().await);
        meta.set_node_epoch(4).await.unwrap();
        let msg = refused(bind(&store, &meta, "memory://x").await);
        assert!(msg.contains("epoch 4"), "{msg}");
        assert_eq!(read(&store).await.unwrap(), None);
        // Where its newest epoch was claimed, it is the metadata of that prefix.
        let claimed = InMemory::new();
        crate::fencing::claim(&claimed, 4).await.unwrap();
        bind(&claimed, &meta, "memory://y").await.unwrap();
    }

    #[tokio::test]
    async fn one_database_racing_onto_two_prefixes_binds_one_and_leaves_the_other_empty() {
        let (a, b, meta) = (InMemory::new(), InMemory::new(), sqlite().await);
        let (ra, rb) = tokio::join!(bind(&a, &meta, "memory://a"), bind(&b, &meta, "memory://b"));
        assert!(ra.is_ok() != rb.is_ok(), "{ra:?} {rb:?}");
        let loser = if ra.is_ok() { &b } else { &a };
        assert_eq!(read(loser).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_watch_sees_the_prefix_change_hands() {
        let (store, meta) = (InMemory::new(), sqlite().await);
        let watch = Watch {
            binding: bind(&store, &meta, "memory://w").await.unwrap(),
        };
        assert_eq!(watch.changed(&store, &meta).await, None);
        store.delete(&Path::from(layout::IDENTITY)).await.unwrap();
        let why = watch.changed(&store, &meta).await.expect("gone");
        assert!(why.contains("is gone"), "{why}");
    }
}
