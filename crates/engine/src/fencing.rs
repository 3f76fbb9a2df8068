//! Fencing between processes sharing a bucket: epoch claims.
//!
//! Each process incarnation writes its WAL under its own epoch. It gets the epoch by
//! creating `epochs/{epoch}` create-only (`PutMode::Create`): exactly one process can
//! own a number, whatever data directory it runs from. Claims are made in increasing
//! order (one past the highest claim listed, retrying upwards on `AlreadyExists`),
//! so once a claim succeeds every lower claim already exists, and recovery, which
//! lists the claims after claiming, seals each lower epoch's log (see `recovery`):
//! an older process, alive or not, can never again make a write durable.
//!
//! An older process learns it was fenced on its next WAL write (the sealed key
//! exists with other bytes), or earlier through the fence watch, a pass that asks
//! [`superseded`] (one HEAD request of the next claim, `epochs/{mine + 1}`) every
//! `--fence-check-interval`.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{EngineError, Result};
use crate::layout;

/// Prefix of the claim objects.
/// Give up claiming after this many lost races in a row (a runaway loop, not a
/// plausible number of concurrent starts).
const CLAIM_ATTEMPTS_MAX: u64 = 1000;

/// Every claimed epoch in the bucket, ascending.
pub async fn list_claims(store: &dyn ObjectStore) -> Result<Vec<u64>> {
    let mut claims: Vec<u64> = store
        .list(Some(&Path::from(layout::CLAIMS)))
        .map_ok(|meta| layout::parse_claim_key(meta.location.as_ref()))
        .try_filter_map(|e| async move { Ok(e) })
        .try_collect()
        .await?;
    claims.sort_unstable();
    Ok(claims)
}

/// Claims the lowest free epoch above `at_least - 1` and above every listed claim.
pub async fn claim(store: &dyn ObjectStore, at_least: u64) -> Result<u64> {
    let highest = list_claims(store).await?.last().copied().unwrap_or(0);
    let mut epoch = at_least.max(highest + 1);
    let since_unix_ms = crate::clock::Clock::system().now_ms();
    for _ in 0..CLAIM_ATTEMPTS_MAX {
        // Unique bytes per claimant: identical bytes would give identical ETags.
        let body = format!(
            "{{\"epoch\":{epoch},\"pid\":{},\"nonce\":\"{:016x}\",\"claimed_unix_ms\":{since_unix_ms}}}",
            std::process::id(),
            fastrand::u64(..)
        );
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store
            .put_opts(
                &Path::from(layout::claim_key(epoch)),
                PutPayload::from(Bytes::from(body)),
                opts,
            )
            .await
        {
            Ok(_) => return Ok(epoch),
            Err(object_store::Error::AlreadyExists { .. }) => epoch += 1,
            Err(object_store::Error::NotImplemented { .. }) => {
                return Err(EngineError::Unavailable(
                    "the object store does not support create-only writes (conditional PUT), which PicoMQ needs to fence writers".into(),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(EngineError::Unavailable(format!(
        "could not claim an epoch after {CLAIM_ATTEMPTS_MAX} attempts"
    )))
}

/// `true` once a newer process has claimed an epoch above `epoch`.
pub async fn superseded(store: &dyn ObjectStore, epoch: u64) -> Result<bool> {
    match store.head(&Path::from(layout::claim_key(epoch + 1))).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn claims_are_unique_and_increasing() {
        let store = InMemory::new();
        assert_eq!(claim(&store, 1).await.unwrap(), 1);
        assert_eq!(claim(&store, 1).await.unwrap(), 2);
        // A stale lower bound still lands above every existing claim.
        assert_eq!(claim(&store, 1).await.unwrap(), 3);
        assert_eq!(claim(&store, 7).await.unwrap(), 7);
        assert_eq!(list_claims(&store).await.unwrap(), vec![1, 2, 3, 7]);
        assert!(superseded(&store, 2).await.unwrap());
        assert!(!superseded(&store, 7).await.unwrap());
    }

    #[tokio::test]
    async fn racing_claimants_never_share_an_epoch() {
        let store = std::sync::Arc::new(InMemory::new());
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { claim(&*store, 1).await.unwrap() })
            })
            .collect();
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap());
        }
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), 16);
    }
}
