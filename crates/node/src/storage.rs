//! Opening a node's object stores: `--store` and, if given, `--wal-store`, each
//! instrumented under its own `store` label (`data`, `wal`), WAL keys routed to the
//! WAL store. Injected latency (testing) goes below the instrumentation, so the
//! latency metrics include it.

use std::sync::Arc;
use std::time::Duration;

use picomq_engine::store::{self, fault::FaultyStore, instrumented, routed::RoutedStore};
use picomq_engine::CostConfig;

/// Faults injected below the instrumentation (testing and benchmarks).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub latency: Option<Duration>,
    pub error_rate: Option<f64>,
}

#[derive(Clone)]
pub struct OpenedStore {
    pub store: Arc<dyn store::ObjectStore>,
    pub stats: Vec<Arc<instrumented::StoreStats>>,
}

pub fn open(
    store_url: &str,
    wal_store_url: Option<&str>,
    cost: CostConfig,
    faults: Faults,
) -> Result<OpenedStore, String> {
    let open_one = |flag: &str, url: &str, label: &'static str| {
        let mut s = store::open(url).map_err(|e| format!("--{flag}: {e}"))?;
        if faults.latency.is_some() || faults.error_rate.is_some() {
            let (faulty, control) = FaultyStore::new(s);
            if let Some(latency) = faults.latency {
                control.set_latency(latency);
            }
            if let Some(rate) = faults.error_rate {
                control.set_error_rate(rate);
            }
            s = faulty;
        }
        let stats = instrumented::StoreStats::new(label, cost);
        let s: Arc<dyn store::ObjectStore> =
            Arc::new(instrumented::InstrumentedStore::new(s, stats.clone()));
        Ok::<_, String>((s, stats))
    };
    let (data, data_stats) = open_one("store", store_url, "data")?;
    let Some(wal_url) = wal_store_url else {
        return Ok(OpenedStore {
            store: data,
            stats: vec![data_stats],
        });
    };
    if wal_url.starts_with("memory:") != store_url.starts_with("memory:") {
        return Err("--wal-store: a memory:// store cannot be paired with a durable one (nothing would survive a restart on one side)".into());
    }
    let (wal, wal_stats) = open_one("wal-store", wal_url, "wal")?;
    Ok(OpenedStore {
        store: Arc::new(RoutedStore::new(data, wal)),
        stats: vec![data_stats, wal_stats],
    })
}

/// Staging files of uploads a crash interrupted (local directories only), removed in
/// the background: a big tree must not delay start-up.
pub fn clean_abandoned_uploads(urls: Vec<String>) {
    for url in urls {
        tokio::task::spawn_blocking(move || {
            match store::remove_abandoned_uploads(&url, Duration::from_secs(600)) {
                Ok(0) => {}
                Ok(n) => tracing::info!(store = %url, files = n, "removed abandoned uploads"),
                Err(e) => {
                    tracing::warn!(store = %url, error = %e, "could not clean abandoned uploads")
                }
            }
        });
    }
}
