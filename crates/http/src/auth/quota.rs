//! `--max-streams-per-namespace`, exact under concurrent creates.
//!
//! The count of a namespace's streams comes from the metadata index after an index
//! barrier, so it includes every create that has finished. Creates still running are
//! not in it: checked one after another against that count alone, N concurrent creates
//! could all see room for one more. So the check runs one at a time per namespace, and
//! a create it admits counts as in flight until it finishes (the guard's drop). By
//! then its stream is durable, so a check that starts later finds it in the index. A
//! check already running may have counted before it was indexed: for that check it
//! still counts (`finished_during_check`). A create that turns out to re-create an
//! existing stream counts for a moment too many: the error is on the side of
//! refusing, never of overshooting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One namespace's creates, as the checks see them.
#[derive(Default)]
struct State {
    /// Admitted and not finished.
    in_flight: u64,
    /// A check is between its count and its decision.
    checking: bool,
    /// Creates that finished while that check ran: its count may have been taken
    /// before they were indexed, so it still counts them. The next check's count,
    /// taken after they finished, holds them.
    finished_during_check: u64,
}

type States = Arc<Mutex<HashMap<String, State>>>;

#[derive(Default)]
pub struct NamespaceQuota {
    /// One check at a time per namespace; entries live while someone holds them.
    checks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    states: States,
}

/// A create admitted under the quota: counted as pending until dropped.
pub struct Admitted {
    states: States,
    namespace: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut states = lock(&self.states);
        if let Some(st) = states.get_mut(&self.namespace) {
            st.in_flight -= 1;
            if st.checking {
                st.finished_during_check += 1;
            } else if st.in_flight == 0 {
                states.remove(&self.namespace);
            }
        }
    }
}

impl NamespaceQuota {
    /// Runs `count` (the streams the index holds under `namespace`, read after an
    /// index barrier) alone for this namespace; admits a create when that count plus
    /// the creates not in it is below `max`. `Ok(None)`: no room.
    pub async fn admit<E>(
        &self,
        namespace: &str,
        max: u64,
        count: impl std::future::Future<Output = Result<u64, E>>,
    ) -> Result<Option<Admitted>, E> {
        let check = lock(&self.checks)
            .entry(namespace.to_string())
            .or_default()
            .clone();
        let result = {
            let _alone = check.lock().await;
            {
                let mut states = lock(&self.states);
                let st = states.entry(namespace.to_string()).or_default();
                st.checking = true;
                st.finished_during_check = 0;
            }
            let counted = count.await;
            let mut states = lock(&self.states);
            let st = states.entry(namespace.to_string()).or_default();
            let not_indexed = st.in_flight + st.finished_during_check;
            st.checking = false;
            st.finished_during_check = 0;
            let admitted = match counted {
                Ok(indexed) if indexed + not_indexed < max => {
                    st.in_flight += 1;
                    Ok(Some(Admitted {
                        states: self.states.clone(),
                        namespace: namespace.to_string(),
                    }))
                }
                Ok(_) => Ok(None),
                Err(e) => Err(e),
            };
            if st.in_flight == 0 {
                states.remove(namespace);
            }
            admitted
        };
        let mut checks = lock(&self.checks);
        drop(check);
        if checks
            .get(namespace)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            checks.remove(namespace);
        }
        result
    }

    /// Namespaces with a check or a create in flight (bounded by the requests served).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        lock(&self.checks).len() + lock(&self.states).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_creates_never_overshoot_and_nothing_is_left_behind() {
        let quota = Arc::new(NamespaceQuota::default());
        // What the index holds: creates become visible there once finished.
        let indexed = Arc::new(AtomicU64::new(0));
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (quota, indexed, admitted) = (quota.clone(), indexed.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let count = async { Ok::<_, ()>(indexed.load(Ordering::SeqCst)) };
                let Some(guard) = quota.admit("t/", 5, count).await.unwrap() else {
                    return;
                };
                admitted.fetch_add(1, Ordering::SeqCst);
                // The create: durable (and, for the next barrier, indexed) before the
                // guard goes.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                indexed.fetch_add(1, Ordering::SeqCst);
                drop(guard);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::SeqCst), 5);
        assert_eq!(quota.tracked(), 0);
        // A create that finishes while a check counts (before its stream was
        // indexed) still counts for that check.
        let quota = NamespaceQuota::default();
        let first = quota
            .admit("v/", 2, async { Ok::<_, ()>(0) })
            .await
            .unwrap()
            .unwrap();
        let count = async move {
            drop(first); // finished, but the index read below does not hold it yet
            Ok::<_, ()>(1)
        };
        let second = quota.admit("v/", 2, count).await.unwrap();
        assert!(
            second.is_none(),
            "1 indexed + 1 finished during the count = full"
        );
        assert_eq!(quota.tracked(), 0);
        // Another namespace has its own room; a failing count admits nothing.
        let ok = async { Ok::<_, ()>(0) };
        assert!(quota.admit("u/", 1, ok).await.unwrap().is_some());
        let failing = async { Err::<u64, _>("index down") };
        assert_eq!(
            quota.admit("t/", 5, failing).await.err(),
            Some("index down")
        );
        assert_eq!(quota.tracked(), 0);
    }
}
