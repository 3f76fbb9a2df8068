//! `picomq serve`'s object-storage options: where the WAL lives, outage and fencing
//! detection, background passes, caches, the prices behind the cost estimate, and
//! the admin listener. Defaults come from the engine's configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use picomq_engine::units::{HumanDuration, Size};
use picomq_engine::{CostConfig, EngineConfig};
use picomq_node::Config;

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

fn engine() -> EngineConfig {
    EngineConfig::default()
}

/// An interval that can be off (`None`) shows and takes `0` for off.
fn every(d: Option<Duration>) -> HumanDuration {
    HumanDuration(d.unwrap_or_default())
}

fn on(d: HumanDuration) -> Option<Duration> {
    (!d.0.is_zero()).then_some(d.0)
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
    #[arg(long, env = "PICOMQ_STORE_DOWN_AFTER", default_value_t = HumanDuration(engine().wal.store_down_after))]
    pub store_down_after: HumanDuration,
    /// How often to check the bucket for a newer process that took over (fenced) this
    /// one, at one HEAD request per check; 0 = learn it only on the next write.
    #[arg(long, env = "PICOMQ_FENCE_CHECK_INTERVAL", default_value_t = every(engine().fence_check_interval))]
    pub fence_check_interval: HumanDuration,
    /// How often the metadata database is checkpointed into the object store (when
    /// it changed), so a node with an empty data directory restores it from one object
    /// instead of replaying every WAL object; 0 = never.
    #[arg(long, env = "PICOMQ_CHECKPOINT_INTERVAL", default_value_t = every(engine().checkpoint_interval))]
    pub checkpoint_interval: HumanDuration,
    /// How often garbage collection deletes WAL objects that no stream points into
    /// any more (deleted and expired streams' data, below the oldest checkpoint);
    /// 0 = never.
    #[arg(long, env = "PICOMQ_GC_INTERVAL", default_value_t = every(engine().gc_interval))]
    pub gc_interval: HumanDuration,
    /// How often compaction rewrites old WAL data into large per-stream segments
    /// and packed objects (so history costs few objects to keep and few GETs to
    /// read); 0 = only when asked (POST /__picomq/compact).
    #[arg(long, env = "PICOMQ_COMPACTION_INTERVAL", default_value_t = every(engine().compaction.interval))]
    pub compaction_interval: HumanDuration,
    /// WAL data younger than this is left where it is.
    #[arg(long, env = "PICOMQ_COMPACTION_DELAY", default_value_t = HumanDuration(engine().compaction.delay))]
    pub compaction_delay: HumanDuration,
    /// Object-store bytes per second (read + written) compaction may use.
    #[arg(long, env = "PICOMQ_COMPACTION_BYTES_PER_SEC", default_value_t = engine().compaction.bytes_per_sec)]
    pub compaction_bytes_per_sec: u64,
    /// Object-store requests per second compaction may use. Compaction reads every
    /// WAL object once, so below the WAL's own PUT rate it falls behind for good
    /// [default: 50 when the store or WAL store is a bucket; unlimited when both are
    /// file:// or memory://, whose requests cost nothing]
    #[arg(long, env = "PICOMQ_COMPACTION_REQUESTS_PER_SEC", value_parser = positive)]
    pub compaction_requests_per_sec: Option<f64>,
    /// Memory for chunks read from the object store (LRU), in bytes; 0 = none.
    #[arg(long, env = "PICOMQ_BLOCK_CACHE_BYTES", default_value_t = Size(engine().block_cache_bytes as u64))]
    pub block_cache_bytes: Size,
    /// Bytes of adjacent chunks a cold read fetches in one GET (readahead).
    #[arg(long, env = "PICOMQ_READAHEAD_BYTES", default_value_t = Size(engine().readahead_bytes as u64))]
    pub readahead_bytes: Size,
    /// Recent history stays only in WAL objects (one small chunk per stream each) at
    /// most about this long: then the packer rewrites it, from memory, into packs
    /// where each stream's records lie together (fast cold reads after a restart);
    /// 0 = off.
    #[arg(long, env = "PICOMQ_PACK_DELAY", default_value_t = HumanDuration(engine().pack.l0_delay))]
    pub pack_delay: HumanDuration,
    /// Memory for recent records awaiting their packs, in bytes (records and
    /// their bookkeeping: about 520 bytes an append on top of its records).
    #[arg(long, env = "PICOMQ_PACK_BUFFER_BYTES", default_value_t = Size(engine().pack.buffer_bytes_max as u64))]
    pub pack_buffer_bytes: Size,
    /// How long a catch-up read waits for the object store before it answers with
    /// what is ready (clients read on from its Stream-Next-Offset).
    #[arg(long, env = "PICOMQ_READ_BUDGET", default_value_t = HumanDuration(engine().read_budget))]
    pub read_budget: HumanDuration,
    /// How often the age-retention pass trims streams created with a retention
    /// (Stream-Retention) down to their retained records; 0 = never.
    #[arg(long, env = "PICOMQ_RETENTION_INTERVAL", default_value_t = every(engine().retention_interval))]
    pub retention_interval: HumanDuration,
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
    /// Sets the options these flags own.
    pub fn configure(&self, config: &mut Config) {
        config.wal_store = self.wal_store.clone();
        config.admin_listen = self.admin_listen;
        config.compaction_requests_per_sec = self.compaction_requests_per_sec;
        let e = &mut config.engine;
        e.wal.store_down_after = self.store_down_after.0;
        e.fence_check_interval = on(self.fence_check_interval);
        e.checkpoint_interval = on(self.checkpoint_interval);
        e.gc_interval = on(self.gc_interval);
        e.compaction.interval = on(self.compaction_interval);
        e.compaction.delay = self.compaction_delay.0;
        e.compaction.bytes_per_sec = self.compaction_bytes_per_sec;
        e.block_cache_bytes = self.block_cache_bytes.bytes();
        e.readahead_bytes = self.readahead_bytes.bytes();
        e.retention_interval = on(self.retention_interval);
        if self.pack_delay.0.is_zero() {
            e.pack.interval = None;
        } else {
            e.pack.l0_delay = self.pack_delay.0;
        }
        e.pack.buffer_bytes_max = self.pack_buffer_bytes.bytes();
        e.read_budget = self.read_budget.0;
        e.cost = CostConfig {
            put_per_1000_usd: self.price_put_per_1000,
            get_per_1000_usd: self.price_get_per_1000,
            storage_gb_month_usd: self.price_gb_month,
        };
    }
}
