//! `picomq serve`'s object-storage options: where the WAL lives, outage and fencing
//! detection, the prices behind the cost estimate, and the admin listener. Opens the
//! stores, each instrumented under its own `store` label (`data`, `wal`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use picomq_engine::store::{self, fault::FaultyStore, instrumented, routed::RoutedStore};
use picomq_engine::{CostConfig, EngineConfig};

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

fn price(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a price in dollars (e.g. 0.005)")),
    }
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

#[derive(Args, Debug)]
pub struct StorageArgs {
    /// Object store for WAL objects, if not --store (e.g. a low-latency bucket such as
    /// S3 Express One Zone). Every node sharing a --store must use the same --wal-store
    /// [default: --store].
    #[arg(long, env = "PICOMQ_WAL_STORE", value_name = "URL")]
    pub wal_store: Option<String>,
    /// After WAL uploads have failed (or hung) this long, the store is reported down:
    /// appends fail at once with 503 until it answers again.
    #[arg(long, env = "PICOMQ_STORE_DOWN_AFTER", default_value = "5s", value_parser = duration)]
    pub store_down_after: Duration,
    /// How often to check the bucket for a newer process that took over (fenced) this
    /// one, at one HEAD request per check; 0 = learn it only on the next write.
    #[arg(long, env = "PICOMQ_FENCE_CHECK_INTERVAL", default_value = "10s", value_parser = duration)]
    pub fence_check_interval: Duration,
    /// How often the metadata database is checkpointed into the object store (when
    /// it changed), so a node with an empty data directory restores it from one object
    /// instead of replaying every WAL object; 0 = never.
    #[arg(long, env = "PICOMQ_CHECKPOINT_INTERVAL", default_value = "5m", value_parser = duration)]
    pub checkpoint_interval: Duration,
    /// How often garbage collection deletes WAL objects that no stream points into
    /// any more (deleted and expired streams' data, below the oldest checkpoint);
    /// 0 = never.
    #[arg(long, env = "PICOMQ_GC_INTERVAL", default_value = "10m", value_parser = duration)]
    pub gc_interval: Duration,
    /// How often compaction rewrites old WAL data into large per-stream segments
    /// and packed objects (so history costs few objects to keep and few GETs to
    /// read); 0 = only when asked (POST /__picomq/compact).
    #[arg(long, env = "PICOMQ_COMPACTION_INTERVAL", default_value = "1m", value_parser = duration)]
    pub compaction_interval: Duration,
    /// WAL data younger than this is left where it is.
    #[arg(long, env = "PICOMQ_COMPACTION_DELAY", default_value = "10m", value_parser = duration)]
    pub compaction_delay: Duration,
    /// Object-store bytes per second (read + written) compaction may use.
    #[arg(long, env = "PICOMQ_COMPACTION_BYTES_PER_SEC", default_value_t = EngineConfig::default().compaction.bytes_per_sec)]
    pub compaction_bytes_per_sec: u64,
    /// Object-store requests per second compaction may use. Compaction reads every
    /// WAL object once, so below the WAL's own PUT rate it falls behind for good
    /// [default: 50 when the store or WAL store is a bucket; unlimited when both are
    /// file:// or memory://, whose requests cost nothing]
    #[arg(long, env = "PICOMQ_COMPACTION_REQUESTS_PER_SEC", value_parser = positive)]
    pub compaction_requests_per_sec: Option<f64>,
    /// Memory for chunks read from the object store (LRU), in bytes; 0 = none.
    #[arg(long, env = "PICOMQ_BLOCK_CACHE_BYTES", default_value_t = EngineConfig::default().block_cache_bytes)]
    pub block_cache_bytes: usize,
    /// Bytes of adjacent chunks a cold read fetches in one GET (readahead).
    #[arg(long, env = "PICOMQ_READAHEAD_BYTES", default_value_t = EngineConfig::default().readahead_bytes)]
    pub readahead_bytes: usize,
    /// How often the age-retention pass trims streams created with a retention
    /// (Stream-Retention) down to their retained records; 0 = never.
    #[arg(long, env = "PICOMQ_RETENTION_INTERVAL", default_value = "1m", value_parser = duration)]
    pub retention_interval: Duration,
    /// Price of 1,000 PUT/COPY/POST/LIST requests, in dollars (for the cost estimate
    /// in /metrics; default: S3 Standard us-east-1).
    #[arg(long, env = "PICOMQ_PRICE_PUT_PER_1000", default_value_t = CostConfig::default().put_per_1000_usd, value_parser = price)]
    pub price_put_per_1000: f64,
    /// Price of 1,000 GET/HEAD requests, in dollars.
    #[arg(long, env = "PICOMQ_PRICE_GET_PER_1000", default_value_t = CostConfig::default().get_per_1000_usd, value_parser = price)]
    pub price_get_per_1000: f64,
    /// Price of storing 1 GB for a month, in dollars.
    #[arg(long, env = "PICOMQ_PRICE_GB_MONTH", default_value_t = CostConfig::default().storage_gb_month_usd, value_parser = price)]
    pub price_gb_month: f64,
    /// Also serve /metrics, /healthz and /readyz on this address (e.g. a port that
    /// only the monitoring network reaches) [default: none].
    #[arg(long, env = "PICOMQ_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
}

impl StorageArgs {
    /// Sets the engine options these flags own; `store_url` is `--store` (or its
    /// default).
    pub fn configure(&self, config: &mut EngineConfig, store_url: &str) {
        config.wal.store_down_after = self.store_down_after;
        config.fence_check_interval =
            (!self.fence_check_interval.is_zero()).then_some(self.fence_check_interval);
        config.checkpoint_interval =
            (!self.checkpoint_interval.is_zero()).then_some(self.checkpoint_interval);
        config.gc_interval = (!self.gc_interval.is_zero()).then_some(self.gc_interval);
        config.compaction.interval =
            (!self.compaction_interval.is_zero()).then_some(self.compaction_interval);
        config.compaction.delay = self.compaction_delay;
        config.compaction.bytes_per_sec = self.compaction_bytes_per_sec;
        let local = |url: &str| url.starts_with("file:") || url.starts_with("memory:");
        let local = local(store_url) && self.wal_store.as_deref().is_none_or(local);
        config.compaction.requests_per_sec = match self.compaction_requests_per_sec {
            Some(rate) => rate,
            // The local store's requests are reads and writes of local files: only
            // the byte budget means anything there.
            None if local => f64::INFINITY,
            None => EngineConfig::default().compaction.requests_per_sec,
        };
        config.block_cache_bytes = self.block_cache_bytes;
        config.readahead_bytes = self.readahead_bytes;
        config.retention_interval =
            (!self.retention_interval.is_zero()).then_some(self.retention_interval);
        config.cost = CostConfig {
            put_per_1000_usd: self.price_put_per_1000,
            get_per_1000_usd: self.price_get_per_1000,
            storage_gb_month_usd: self.price_gb_month,
        };
    }
}

pub struct OpenedStore {
    pub store: Arc<dyn store::ObjectStore>,
    pub stats: Vec<Arc<instrumented::StoreStats>>,
}

/// Opens `--store` (and `--wal-store`), instruments each, and routes WAL keys to the
/// WAL store. `latency` (testing) is added below the instrumentation, so the
/// latency metrics include it.
pub fn open(
    store_url: &str,
    args: &StorageArgs,
    cost: CostConfig,
    latency: Option<Duration>,
) -> Result<OpenedStore, String> {
    let open_one = |flag: &str, url: &str, label: &'static str| {
        let mut s = store::open(url).map_err(|e| format!("--{flag}: {e}"))?;
        if let Some(latency) = latency {
            let (faulty, control) = FaultyStore::new(s);
            control.set_latency(latency);
            s = faulty;
        }
        let stats = instrumented::StoreStats::new(label, cost);
        let s: Arc<dyn store::ObjectStore> =
            Arc::new(instrumented::InstrumentedStore::new(s, stats.clone()));
        Ok::<_, String>((s, stats))
    };
    let (data, data_stats) = open_one("store", store_url, "data")?;
    match &args.wal_store {
        None => Ok(OpenedStore {
            store: data,
            stats: vec![data_stats],
        }),
        Some(wal_url) => {
            if wal_url.starts_with("memory:") != store_url.starts_with("memory:") {
                return Err("--wal-store: a memory:// store cannot be paired with a durable one (nothing would survive a restart on one side)".into());
            }
            let (wal, wal_stats) = open_one("wal-store", wal_url, "wal")?;
            Ok(OpenedStore {
                store: Arc::new(RoutedStore::new(data, wal)),
                stats: vec![data_stats, wal_stats],
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        storage: StorageArgs,
    }

    fn budget(flags: &[&str], store_url: &str) -> f64 {
        let cli =
            Cli::try_parse_from(std::iter::once("picomq").chain(flags.iter().copied())).unwrap();
        let mut config = EngineConfig::default();
        cli.storage.configure(&mut config, store_url);
        config.compaction.requests_per_sec
    }

    #[test]
    fn compaction_request_budget_is_unlimited_only_on_local_stores() {
        assert_eq!(budget(&[], "file:///var/lib/picomq/objects"), f64::INFINITY);
        assert_eq!(budget(&[], "memory://"), f64::INFINITY);
        assert_eq!(budget(&[], "s3://bucket/prefix"), 50.0);
        assert_eq!(
            budget(
                &["--wal-store", "s3://wal"],
                "file:///var/lib/picomq/objects"
            ),
            50.0
        );
        assert_eq!(
            budget(&["--compaction-requests-per-sec", "7"], "file:///x"),
            7.0
        );
    }
}
