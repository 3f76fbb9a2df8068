//! Consumer groups: a named group on a stream whose members compete for its
//! messages, each message out to one member at a time under a lease, acked, nacked
//! (again after a delay) or, after too many deliveries, moved to a dead-letter
//! stream. The state machine is `state`, durability and delivery `manager`; here
//! the bounds of a request and the group's metrics.

pub mod manager;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use picomq_engine::metrics::Desc;
use serde_json::Value;

use crate::error::{ConsumerError, Result};
pub use manager::{
    check_group_name, not_found, raw_json, Group, Groups, Message, CLAIM_MAX, STATE_PREFIX,
};
pub use state::GroupConfig;

/// Lease bounds and default.
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 12 * 3600 * 1000;
pub const LEASE_MS_DEFAULT: u64 = 30_000;
pub const MAX_DELIVERIES_DEFAULT: u32 = 5;
/// Longest a claim waits for messages.
pub const WAIT_MS_MAX: u64 = 60_000;
pub const NACK_DELAY_MS_MAX: u64 = 24 * 3600 * 1000;

pub static PENDING: Desc = Desc::gauge(
    "picomq_group_pending",
    "Messages of a consumer group handed back (nacked or lapsed), waiting to be delivered again.",
);
pub static IN_FLIGHT: Desc = Desc::gauge(
    "picomq_group_in_flight",
    "Messages of a consumer group out to a member under a lease.",
);
pub static LAG: Desc = Desc::gauge(
    "picomq_group_lag_bytes",
    "Bytes of a group's stream past the last message it handed out.",
);
pub static ACKED: Desc = Desc::gauge(
    "picomq_group_acked",
    "Messages a consumer group acknowledged.",
);
pub static REDELIVERIES: Desc = Desc::gauge(
    "picomq_group_redeliveries",
    "Deliveries of a consumer group's messages after the first.",
);
pub static PARKED: Desc = Desc::gauge(
    "picomq_group_parked",
    "Messages of a consumer group out of deliveries that its dead-letter stream did not take (closed, not JSON, unreachable): kept, never delivered again, dead-lettering retried.",
);
pub static DEAD_LETTERED: Desc = Desc::gauge(
    "picomq_group_dead_lettered",
    "Messages a consumer group moved to its dead-letter stream.",
);

/// A group to create, as asked (names absolute, already authorized).
pub struct NewGroup {
    pub group: String,
    pub stream: String,
    pub max_deliveries: Option<u32>,
    pub dead_letter: Option<String>,
    pub lease_ms: Option<u64>,
    /// Where it starts: `-1`, `now` or an offset (default `-1`).
    pub from: Option<String>,
}

/// What a claim asks for.
pub struct ClaimRequest {
    pub consumer: String,
    pub max: Option<usize>,
    pub wait: Duration,
}

impl Groups {
    /// Creates a group (or finds the same one): `true` if created, and its
    /// description.
    pub async fn open(&self, new: NewGroup) -> Result<(bool, Value)> {
        check_group_name(&new.group)?;
        let lease_ms = new.lease_ms.unwrap_or(LEASE_MS_DEFAULT);
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
            return Err(ConsumerError::invalid(format!(
                "leaseMs must be from {LEASE_MS_MIN} to {LEASE_MS_MAX}"
            )));
        }
        if let Some(dlq) = &new.dead_letter {
            if *dlq == new.stream || dlq.is_empty() {
                return Err(ConsumerError::invalid("deadLetter must be another stream"));
            }
        }
        let config = GroupConfig {
            group: new.group.clone(),
            stream: new.stream.clone(),
            max_deliveries: new.max_deliveries.unwrap_or(MAX_DELIVERIES_DEFAULT),
            dead_letter: new.dead_letter,
            lease_ms,
            created_at: String::new(),
        };
        let created = self
            .create(config, new.from.as_deref().unwrap_or("-1"))
            .await?;
        let g = self
            .get(&new.group, &new.stream)
            .await?
            .ok_or_else(|| not_found(&new.group))?;
        Ok((created, self.describe(&g).await?))
    }

    /// The loaded group `group` on `stream`; a missing one is `group_not_found`.
    pub async fn named(&self, group: &str, stream: &str) -> Result<Arc<Group>> {
        match self.get(group, stream).await? {
            Some(g) => Ok(g),
            None => {
                self.forget_stream(group);
                Err(not_found(group))
            }
        }
    }

    /// Claims messages for `req.consumer`, waiting up to `req.wait` for some; the
    /// messages and the lease's end (ms since the Unix epoch).
    pub async fn claim_for(
        &self,
        group: &str,
        stream: &str,
        req: ClaimRequest,
    ) -> Result<(Vec<Message>, u64)> {
        if req.consumer.is_empty() || req.consumer.len() > 256 {
            return Err(ConsumerError::invalid("consumer must have 1 to 256 bytes"));
        }
        let max = req.max.unwrap_or(1).clamp(1, CLAIM_MAX);
        let wait = req.wait.min(Duration::from_millis(WAIT_MS_MAX));
        let g = self.named(group, stream).await?;
        self.claim(&g, &req.consumer, max, wait).await
    }

    /// Nacks `offsets`, delivered again no sooner than `delay` from now.
    pub async fn nack_for(
        &self,
        group: &str,
        stream: &str,
        offsets: Vec<u64>,
        delay: Duration,
    ) -> Result<usize> {
        if delay > Duration::from_millis(NACK_DELAY_MS_MAX) {
            return Err(ConsumerError::invalid(format!(
                "delayMs is at most {NACK_DELAY_MS_MAX}"
            )));
        }
        let g = self.named(group, stream).await?;
        self.nack(&g, offsets, delay).await
    }

    /// Acks `offsets`; how many were out or handed back.
    pub async fn ack_for(&self, group: &str, stream: &str, offsets: Vec<u64>) -> Result<usize> {
        let g = self.named(group, stream).await?;
        self.ack(&g, offsets).await
    }
}
