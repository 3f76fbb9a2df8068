//! Durable Streams subscriptions (PROTOCOL.md sections 6 and 7): parsing and checks
//! (`config`), the state machine (`state`), durability and delivery (`manager`),
//! the webhook signing keys (`signing`), and here the actions a client asks for
//! (links, callbacks, pull-wake claims, acks and releases), in domain terms. The
//! HTTP edge routes `{root}__ds/...` requests here and translates the answers.

pub mod config;
pub mod manager;
pub mod signing;
pub mod state;
pub mod webhook;

use std::sync::Arc;

use picomq_engine::metrics::{Counter, Desc, Exposition, Source};
use serde_json::{json, Value};

use crate::error::{ConsumerError, Result};
pub use manager::{not_found, state_stream, Settings, Sub, Subscriptions, STATE_PREFIX};
pub use state::WakeRequest;

/// Wake tokens (webhook callback tokens, pull-wake claim tokens) start with this;
/// the edge's authentication leaves them to the subscription actions.
pub const WAKE_TOKEN_PREFIX: &str = "dsw_";

pub fn rfc3339_ms(ms: u64) -> String {
    picomq_engine::units::format_rfc3339_ms(ms)
}

/// A subscription id: 1 to [`config::ID_BYTES_MAX`] characters of `A-Z a-z 0-9 - _ . ~`.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= config::ID_BYTES_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(ConsumerError::invalid(format!(
            "a subscription id has 1 to {} characters of A-Z a-z 0-9 - _ . ~",
            config::ID_BYTES_MAX
        ))
        .with_code("INVALID_REQUEST"))
    }
}

fn wrong_kind(kind: &str, what: &str) -> ConsumerError {
    ConsumerError::invalid(format!("{what} is for {kind} subscriptions"))
        .with_code("INVALID_REQUEST")
}

/// Applies a wake's acks (a webhook callback or a pull-wake ack, checked against
/// the wake in flight): with `done` the wake ends, else its lease is extended.
/// `Ok(next_wake)`: whether another wake follows at once.
fn settle(
    live: &mut manager::Live,
    token: Option<&str>,
    req: &WakeRequest,
    now: u64,
) -> Result<bool> {
    live.state.check_fence(token, req)?;
    live.state.apply_acks(&req.acks, &live.tails)?;
    if req.done {
        live.state.wake = None;
    } else {
        live.state.extend_lease(now);
    }
    Ok(req.done && live.state.pending(&live.tails))
}

impl Subscriptions {
    async fn existing(self: &Arc<Self>, path: &str) -> Result<Arc<Sub>> {
        self.get(path).await?.ok_or_else(not_found)
    }

    /// The subscription at `path` as the protocol describes it.
    pub async fn describe(self: &Arc<Self>, sub: &Arc<Sub>) -> Result<Value> {
        let kid = self.signer.active(self.engine()).await?.kid.clone();
        self.with_state(sub, false, |live, _| {
            let mut out = live.state.describe(Some(&kid));
            if live.state.config.kind == config::Kind::PullWake {
                out["webhook"] = Value::Null;
            }
            Ok((out, false))
        })
        .await
    }

    /// Links the streams `paths` (root-relative, checked) explicitly, each at its
    /// tail. `root` is the subscription's absolute root.
    pub async fn link(self: &Arc<Self>, path: &str, root: &str, paths: Vec<String>) -> Result<()> {
        let sub = self.existing(path).await?;
        let mut tails = Vec::with_capacity(paths.len());
        for p in &paths {
            tails.push(self.tail_of(&format!("{root}{p}")).await?.unwrap_or(0));
        }
        self.with_state(&sub, false, |live, _| {
            let mut write = false;
            for (p, tail) in paths.into_iter().zip(tails) {
                let links = &mut live.state.links;
                if !links.contains_key(&p) && links.len() >= config::STREAMS_MAX {
                    return Err(ConsumerError::invalid(format!(
                        "a subscription links at most {} streams",
                        config::STREAMS_MAX
                    )));
                }
                let link = links.entry(p.clone()).or_insert_with(|| state::Link {
                    acked: tail,
                    ..Default::default()
                });
                if !link.explicit {
                    link.explicit = true;
                    write = true;
                }
                live.tails.entry(p).or_insert(tail);
            }
            Ok(((), write))
        })
        .await
    }

    /// Removes the explicit link of stream `p` (a glob's link stays).
    pub async fn unlink(self: &Arc<Self>, path: &str, p: &str) -> Result<()> {
        let p = p.trim_matches('/').to_string();
        let sub = self.existing(path).await?;
        self.with_state(&sub, false, |live, _| {
            let Some(link) = live.state.links.get_mut(&p) else {
                return Ok(((), false));
            };
            if !link.explicit {
                return Ok(((), false));
            }
            link.explicit = false;
            if !link.glob {
                live.state.links.remove(&p);
                live.tails.remove(&p);
            }
            Ok(((), true))
        })
        .await
    }

    /// A webhook receiver's callback with the wake's token; `Ok(next_wake)`.
    pub async fn callback(
        self: &Arc<Self>,
        path: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<bool> {
        let sub = self.existing(path).await?;
        self.with_state(&sub, false, |live, now| {
            if live.state.config.kind != config::Kind::Webhook {
                return Err(wrong_kind("webhook", "callback"));
            }
            let next = settle(live, token, &req, now)?;
            live.state.retry = None;
            Ok((next, true))
        })
        .await
    }

    /// A pull-wake worker claims the wake: its id, generation, token, streams and
    /// lease, as the protocol answers them.
    pub async fn claim(self: &Arc<Self>, path: &str, worker: &str) -> Result<Value> {
        if worker.is_empty() || worker.len() > config::WORKER_BYTES_MAX {
            return Err(ConsumerError::invalid(format!(
                "worker must have 1 to {} bytes",
                config::WORKER_BYTES_MAX
            ))
            .with_code("INVALID_REQUEST"));
        }
        let sub = self.existing(path).await?;
        let answer = self
            .with_state(&sub, true, |live, now| {
                if live.state.config.kind != config::Kind::PullWake {
                    return Err(wrong_kind("pull-wake", "claim"));
                }
                let token = live.state.claim(worker, &live.tails, now)?;
                let wake = live.state.wake.as_ref().expect("claimed");
                let tails = wake.snapshot.clone().into_iter().collect();
                let answer = json!({
                    "wake_id": wake.wake_id,
                    "generation": live.state.generation,
                    "token": token,
                    "streams": live.state.stream_infos(&tails),
                    "lease_ttl_ms": live.state.config.lease_ttl_ms,
                });
                Ok((answer, true))
            })
            .await?;
        self.counters.claims.inc();
        Ok(answer)
    }

    /// A pull-wake worker acks (and, with `done`, ends) its wake; `Ok(next_wake)`.
    pub async fn ack(
        self: &Arc<Self>,
        path: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<bool> {
        let sub = self.existing(path).await?;
        self.with_state(&sub, req.done, |live, now| {
            if live.state.config.kind != config::Kind::PullWake {
                return Err(wrong_kind("pull-wake", "ack"));
            }
            Ok((settle(live, token, &req, now)?, true))
        })
        .await
    }

    /// A pull-wake worker gives its wake back without acking.
    pub async fn release(
        self: &Arc<Self>,
        path: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<()> {
        let sub = self.existing(path).await?;
        self.with_state(&sub, false, |live, _| {
            if live.state.config.kind != config::Kind::PullWake {
                return Err(wrong_kind("pull-wake", "release"));
            }
            live.state.check_fence(token, &req)?;
            live.state.wake = None;
            Ok(((), true))
        })
        .await
    }

    /// The paths of the subscriptions under `prefix` (absolute), in name order,
    /// at most `max`, that `visible` lets through.
    pub async fn paths(
        &self,
        prefix: &str,
        max: usize,
        visible: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>> {
        let prefix = state_stream(prefix);
        let mut paths = Vec::new();
        let mut after = String::new();
        loop {
            let page = self.engine().list(&prefix, &after, 500).await?;
            for s in &page.streams {
                let path = &s.name[STATE_PREFIX.len()..];
                if !visible(path) {
                    continue;
                }
                paths.push(path.to_string());
                if paths.len() == max {
                    return Ok(paths);
                }
            }
            match page.next {
                Some(next) => after = next,
                None => return Ok(paths),
            }
        }
    }

    /// Rotates the webhook signing key: the new key's id and the JWK Set.
    pub async fn rotate_key(&self) -> Result<(String, Value)> {
        let kid = self.signer.rotate(self.engine()).await?;
        let jwks = self.signer.jwks(self.engine()).await?;
        Ok((kid, jwks))
    }
}

static CREATED: Desc = Desc::counter(
    "picomq_subscriptions_created_total",
    "Durable Streams subscriptions created on this node.",
);
static WAKES: Desc = Desc::counter(
    "picomq_subscription_wakes_total",
    "Wakes issued (webhook notifications and pull-wake wake events).",
);
static DELIVERIES: Desc = Desc::counter(
    "picomq_subscription_webhook_deliveries_total",
    "Webhook wakes a receiver answered with 2xx.",
);
static DELIVERY_FAILURES: Desc = Desc::counter(
    "picomq_subscription_webhook_failures_total",
    "Webhook attempts that failed (error, timeout, non-2xx); each schedules a retry.",
);
static CLAIMS: Desc = Desc::counter(
    "picomq_subscription_claims_total",
    "Pull-wake claims granted.",
);
static LEASES_LAPSED: Desc = Desc::counter(
    "picomq_subscription_leases_lapsed_total",
    "Wakes whose lease ran out before they were acked or released.",
);

pub struct Counters {
    pub created: Counter,
    pub wakes: Counter,
    pub deliveries: Counter,
    pub delivery_failures: Counter,
    pub claims: Counter,
    pub leases_lapsed: Counter,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            created: Counter::new(&CREATED),
            wakes: Counter::new(&WAKES),
            deliveries: Counter::new(&DELIVERIES),
            delivery_failures: Counter::new(&DELIVERY_FAILURES),
            claims: Counter::new(&CLAIMS),
            leases_lapsed: Counter::new(&LEASES_LAPSED),
        }
    }
}

impl Source for Subscriptions {
    fn export(&self, out: &mut Exposition) {
        let c = &self.counters;
        out.counter(&c.created)
            .counter(&c.wakes)
            .counter(&c.deliveries)
            .counter(&c.delivery_failures)
            .counter(&c.claims)
            .counter(&c.leases_lapsed);
    }
}
