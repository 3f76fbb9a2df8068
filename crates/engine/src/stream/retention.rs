//! Age retention: a periodic pass that trims each stream with a retention up to the
//! end of its newest index row whose last record is older than the retention. It
//! decides from the metadata index alone and trims through the stream service
//! (`Engine::trim_at_boundary`, one WAL op per stream), so it owns no state and
//! touches no bytes: GC and compaction reclaim them later.
//!
//! Granularity is one index row (one stream's chunk of one WAL object): records
//! still only in the tail cache, not yet indexed, wait for the next pass.

use crate::domain::StreamName;
use crate::error::EngineError;
use crate::stream::Service;

/// Says which streams the retention pass leaves alone: their records are
/// trimmed by whoever holds them once it has them elsewhere (a table with
/// `trimSource` trims what it committed, `StreamAdmin::Tier`).
pub trait RetentionHold: Send + Sync {
    fn holds(&self, stream: &str) -> bool;
}

impl Service {
    /// Installs the hold (once; later calls are ignored).
    pub fn set_retention_hold(&self, hold: std::sync::Arc<dyn RetentionHold>) {
        let _ = self.inner.retention_hold.set(hold);
    }

    fn retention_held(&self, stream: &str) -> bool {
        self.inner
            .retention_hold
            .get()
            .is_some_and(|h| h.holds(stream))
    }
}

/// Streams looked at per pass; the next pass goes on after the last name, so a big
/// catalogue is covered in turns and cannot starve the rest of the node.
pub const STREAMS_PER_PASS: u32 = 1000;

/// Trims the expired prefix of up to `limit` streams with a retention whose names
/// follow `after`; returns where the next pass goes on (empty: from the start).
pub(crate) async fn pass(engine: &Service, after: String, limit: u32) -> String {
    if engine.health().is_err() {
        return after; // nothing can be written now; try the same page again later
    }
    let rows = match engine
        .meta()
        .retention_candidates(engine.clock().now_ms(), &after, limit)
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "scanning streams for retention failed");
            return after;
        }
    };
    let next = if rows.len() < limit as usize {
        String::new()
    } else {
        rows.last().map(|r| r.0.clone()).unwrap_or_default()
    };
    for (name, start, expired_end) in rows {
        let Some(end) = expired_end.filter(|end| *end > start) else {
            continue;
        };
        // In a cluster each owner trims its own streams; a held one is trimmed
        // by its holder.
        if !engine.serves(&name) || engine.retention_held(&name) {
            continue;
        }
        // A row's end is a record boundary: no need to check it.
        match engine
            .trim_at_boundary(&StreamName::stored(name.clone()), end)
            .await
        {
            Ok(start) => tracing::debug!(stream = %name, start = %start, "retention trimmed"),
            Err(EngineError::NotFound | EngineError::Gone) => {}
            Err(e) => {
                tracing::warn!(stream = %name, error = %e, "retention trim failed");
                if engine.health().is_err() {
                    return after;
                }
            }
        }
    }
    next
}
