//! The registry of active streams: name and id to in-memory handle. Idle streams are
//! not here; they are loaded from the metadata store on demand and dropped again
//! after the dormancy timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::handle::StreamHandle;

#[derive(Default)]
pub struct Registry {
    maps: Mutex<Maps>,
}

#[derive(Default)]
struct Maps {
    by_name: HashMap<String, Arc<StreamHandle>>,
    by_id: HashMap<u64, Arc<StreamHandle>>,
}

impl Registry {
    pub fn by_name(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.maps
            .lock()
            .expect("registry lock")
            .by_name
            .get(name)
            .cloned()
    }

    pub fn by_id(&self, id: u64) -> Option<Arc<StreamHandle>> {
        self.maps
            .lock()
            .expect("registry lock")
            .by_id
            .get(&id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.maps.lock().expect("registry lock").by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts `handle` unless its name or id is already active; returns the handle
    /// that is active afterwards. `replace` decides whether an existing entry for the
    /// name or the id gives way (e.g. a deleted tombstone, a handle of an earlier
    /// ownership term).
    pub fn insert(
        &self,
        handle: Arc<StreamHandle>,
        replace: impl Fn(&StreamHandle) -> bool,
    ) -> Arc<StreamHandle> {
        let mut maps = self.maps.lock().expect("registry lock");
        if let Some(existing) = maps.by_id.get(&handle.config.id) {
            if !replace(existing) {
                return existing.clone();
            }
            let existing = existing.clone();
            maps.by_id.remove(&existing.config.id);
            if maps
                .by_name
                .get(&existing.config.name)
                .is_some_and(|h| Arc::ptr_eq(h, &existing))
            {
                maps.by_name.remove(&existing.config.name);
            }
        }
        if let Some(existing) = maps.by_name.get(&handle.config.name) {
            if !replace(existing) {
                return existing.clone();
            }
            let old_id = existing.config.id;
            maps.by_id.remove(&old_id);
        }
        maps.by_name
            .insert(handle.config.name.clone(), handle.clone());
        maps.by_id.insert(handle.config.id, handle.clone());
        handle
    }

    /// Removes `handle` if it is still the active one for its id.
    pub fn remove(&self, handle: &Arc<StreamHandle>) {
        let mut maps = self.maps.lock().expect("registry lock");
        if maps
            .by_id
            .get(&handle.config.id)
            .is_some_and(|h| Arc::ptr_eq(h, handle))
        {
            maps.by_id.remove(&handle.config.id);
        }
        if maps
            .by_name
            .get(&handle.config.name)
            .is_some_and(|h| Arc::ptr_eq(h, handle))
        {
            maps.by_name.remove(&handle.config.name);
        }
    }

    /// Evicts every idle, settled handle; returns `(id, last access)` of each evicted.
    pub fn sweep(&self, idle_since_ms: u64) -> Vec<(u64, u64)> {
        let mut maps = self.maps.lock().expect("registry lock");
        let evicted: Vec<Arc<StreamHandle>> = maps
            .by_id
            .values()
            .filter(|h| h.try_evict(idle_since_ms))
            .cloned()
            .collect();
        for h in &evicted {
            maps.by_id.remove(&h.config.id);
            if maps
                .by_name
                .get(&h.config.name)
                .is_some_and(|x| Arc::ptr_eq(x, h))
            {
                maps.by_name.remove(&h.config.name);
            }
        }
        evicted
            .iter()
            .map(|h| (h.config.id, h.last_access_ms()))
            .collect()
    }

    /// Handles for which `pred` holds (e.g. expired), cloned out of the lock.
    pub fn filter(&self, pred: impl Fn(&StreamHandle) -> bool) -> Vec<Arc<StreamHandle>> {
        let maps = self.maps.lock().expect("registry lock");
        maps.by_id.values().filter(|h| pred(h)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::handle::tests::handle;

    #[test]
    fn a_handle_of_a_newer_term_replaces_one_of_an_older_term_by_id_and_name() {
        let registry = Registry::default();
        let old = Arc::new(handle().with_term(3));
        assert!(Arc::ptr_eq(&registry.insert(old.clone(), |_| false), &old));

        // Same id and name, loaded again after the slot changed hands.
        let new = Arc::new(handle().with_term(5));
        let active = registry.insert(new.clone(), |existing| existing.term() < new.term());
        assert!(Arc::ptr_eq(&active, &new));
        assert!(Arc::ptr_eq(&registry.by_id(7).unwrap(), &new));
        assert!(Arc::ptr_eq(&registry.by_name("s").unwrap(), &new));
        assert_eq!(registry.len(), 1);

        // A handle of the older term does not displace the current one.
        let stale = Arc::new(handle().with_term(3));
        let active = registry.insert(stale.clone(), |existing| existing.term() < stale.term());
        assert!(Arc::ptr_eq(&active, &new));
    }
}
