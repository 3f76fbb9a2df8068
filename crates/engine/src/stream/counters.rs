//! Counters of the stream service (the WAL, the stores, the caches and the passes
//! keep their own), and its share of `/metrics`.

use crate::metrics::{Counter, Desc, Exposition, Gauge, Histogram, Source, LATENCY_BOUNDS_S};
use crate::read::{READS, READ_BYTES};
use crate::stream::Service;

static APPENDS: Desc = Desc::counter(
    "picomq_appends_total",
    "Appends acknowledged as durable (idempotent duplicates excluded).",
);
static APPEND_SECONDS: Desc = Desc::histogram(
    "picomq_append_duration_seconds",
    "Per append, from entering the engine (body read) until acknowledged durable.",
);
static APPEND_RECORDS: Desc = Desc::counter(
    "picomq_append_records_total",
    "Records (messages; a JSON array counts each element) in acknowledged appends.",
);
static APPEND_BYTES: Desc = Desc::counter(
    "picomq_append_bytes_total",
    "Request body bytes of acknowledged appends.",
);
static TRIMS: Desc = Desc::counter(
    "picomq_trims_total",
    "Trims that moved a stream's start (by request or by age retention).",
);
static EXPIRED: Desc = Desc::counter(
    "picomq_streams_expired_total",
    "Streams deleted because their TTL or Expires-At passed (in a cluster, by their owner).",
);
static WAITING_READS: Desc = Desc::gauge(
    "picomq_waiting_reads",
    "Live readers parked waiting for new data (long-polls and SSE connections between events).",
);
static READS_PARTIAL: Desc = Desc::counter(
    "picomq_reads_partial_total",
    "Catch-up reads answered with what was ready when the read budget ran out (the object store was slower).",
);
static ACTIVE_STREAMS: Desc =
    Desc::gauge("picomq_active_streams", "Streams currently held in memory.");
static STREAMS: Desc = Desc::gauge(
    "picomq_streams",
    "Streams that exist (not deleted), active or dormant.",
);

pub struct ServiceCounters {
    /// Appends acknowledged (durable), duplicates excluded.
    pub appends: Counter,
    /// Per acknowledged append (duplicates included), from entering the engine until
    /// durable: the server's share of an append's latency, without HTTP.
    pub append_seconds: Histogram,
    /// Records (messages) in those appends.
    pub append_records: Counter,
    pub append_bytes: Counter,
    /// Trims that moved a stream's start (by request or by age retention).
    pub trims: Counter,
    /// Streams deleted because their TTL or Expires-At passed.
    pub expired: Counter,
    /// Reads served from the in-memory tail cache, and their bytes.
    pub reads_memory: Counter,
    pub read_bytes_memory: Counter,
    /// Reads parked on a stream's notifier right now (long-polls, SSE).
    pub waiting_reads: Gauge,
    /// Reads cut short by the read budget.
    pub reads_partial: Counter,
}

impl Default for ServiceCounters {
    fn default() -> Self {
        ServiceCounters {
            appends: Counter::new(&APPENDS),
            append_seconds: Histogram::new(&APPEND_SECONDS, LATENCY_BOUNDS_S),
            append_records: Counter::new(&APPEND_RECORDS),
            append_bytes: Counter::new(&APPEND_BYTES),
            trims: Counter::new(&TRIMS),
            expired: Counter::new(&EXPIRED),
            reads_memory: Counter::labelled(&READS, &[("tier", "memory")]),
            read_bytes_memory: Counter::labelled(&READ_BYTES, &[("tier", "memory")]),
            waiting_reads: Gauge::new(&WAITING_READS),
            reads_partial: Counter::new(&READS_PARTIAL),
        }
    }
}

impl Source for ServiceCounters {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.appends)
            .histogram(&self.append_seconds, &[])
            .counter(&self.trims)
            .counter(&self.expired)
            .counter(&self.append_records)
            .counter(&self.append_bytes)
            .counter(&self.reads_memory)
            .counter(&self.read_bytes_memory)
            .gauge(&self.waiting_reads);
    }
}

impl Service {
    pub fn counters(&self) -> &ServiceCounters {
        &self.inner.counters
    }

    /// Counters of reads served from the object store.
    pub fn cold_stats(&self) -> &crate::read::cold::ColdStats {
        self.inner.cold.stats()
    }

    /// The stream service's families, with the store tier of reads next to the
    /// memory tier.
    pub(crate) async fn export_service(&self, out: &mut Exposition) {
        let inner = &self.inner;
        inner.counters.export(out);
        out.counter(&inner.cold.stats().reads)
            .counter(&inner.cold.stats().read_bytes)
            .counter(&inner.counters.reads_partial)
            .value(&ACTIVE_STREAMS, &[], inner.registry.len() as f64);
        if let Ok(n) = inner.meta.stream_count().await {
            out.value(&STREAMS, &[], n as f64);
        }
    }
}
