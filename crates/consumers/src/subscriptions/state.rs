//! A subscription's state and its transitions (PROTOCOL.md section 7), with no I/O:
//! links and their acked offsets, the wake generation, the wake in flight (its
//! token, snapshot, holder and lease), and the webhook retry schedule. The manager
//! persists the whole state after every transition that changes it, so what is
//! here is what a restart (or another node taking the subscription over) resumes.

use std::collections::{BTreeMap, HashMap};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use picomq_engine::Offset;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::config::{Kind, SubConfig};
use crate::error::{ConsumerError, Refusal};

/// Webhook retries: from 1 s doubling up to 60 s, with 20% jitter.
pub const RETRY_BASE_MS: u64 = 1_000;
pub const RETRY_MAX_MS: u64 = 60_000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub explicit: bool,
    pub glob: bool,
    /// Last processed offset, inclusive: the next read starts here.
    pub acked: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    pub wake_id: String,
    /// SHA-256 (hex) of the wake's bearer token; the token itself is never stored.
    pub token_sha: String,
    /// The tails the wake was issued (or claimed) for, by path.
    pub snapshot: BTreeMap<String, u64>,
    /// The pull-wake worker holding the claim.
    pub holder: Option<String>,
    /// When the lease lapses (ms since the epoch); `None` for a pull-wake wake that
    /// no worker claimed yet.
    pub lease_until_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub attempt: u32,
    pub next_attempt_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubState {
    pub id: String,
    /// The stream root, as an absolute name prefix (`v1/stream/`): linked paths are
    /// relative to it.
    pub root: String,
    /// Where this server's stream root is reached (`http://host:port/v1/stream/`),
    /// for the callback and JWKS URLs.
    pub root_url: String,
    pub config: SubConfig,
    pub hash: String,
    pub created_at: String,
    pub links: BTreeMap<String, Link>,
    pub generation: u64,
    pub wake: Option<Wake>,
    pub retry: Option<Retry>,
}

/// Why a callback, ack or release was refused.
pub fn fenced() -> ConsumerError {
    ConsumerError::conflict(
        "FENCED",
        "this wake is no longer current (a newer generation was issued, or it finished)",
    )
}

fn invalid_offset(message: impl Into<String>) -> ConsumerError {
    ConsumerError::conflict("INVALID_OFFSET", message)
}

/// A fresh bearer token and its stored digest.
pub fn new_token() -> (String, String) {
    let token = format!(
        "dsw_{}",
        URL_SAFE_NO_PAD.encode(crate::random_bytes::<32>())
    );
    let sha = sha_hex(&token);
    (token, sha)
}

pub fn sha_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn new_wake_id() -> String {
    let b = crate::random_bytes::<12>();
    format!("w_{}", URL_SAFE_NO_PAD.encode(b))
}

fn offset_str(pos: u64) -> String {
    Offset(pos).to_string()
}

/// One acknowledgement of a callback or ack body.
#[derive(Deserialize)]
pub struct AckItem {
    pub stream: Option<String>,
    pub path: Option<String>,
    pub offset: String,
}

#[derive(Deserialize)]
pub struct WakeRequest {
    pub wake_id: Option<String>,
    pub generation: Option<u64>,
    #[serde(default)]
    pub acks: Vec<AckItem>,
    #[serde(default)]
    pub done: bool,
}

impl SubState {
    /// Whether any linked stream has data past its acked offset.
    pub fn pending(&self, tails: &HashMap<String, u64>) -> bool {
        self.first_pending(tails).is_some()
    }

    pub fn first_pending(&self, tails: &HashMap<String, u64>) -> Option<&str> {
        self.links
            .iter()
            .find(|(path, link)| tails.get(*path).is_some_and(|t| *t > link.acked))
            .map(|(p, _)| p.as_str())
    }

    /// Issues the next wake for the current tails; returns its bearer token.
    pub fn issue_wake(&mut self, tails: &HashMap<String, u64>, now_ms: u64) -> String {
        let (token, token_sha) = new_token();
        self.generation += 1;
        let lease_until_ms = match self.config.kind {
            Kind::Webhook => Some(now_ms + self.config.lease_ttl_ms),
            Kind::PullWake => None,
        };
        self.wake = Some(Wake {
            wake_id: new_wake_id(),
            token_sha,
            snapshot: self.snapshot(tails),
            holder: None,
            lease_until_ms,
        });
        token
    }

    fn snapshot(&self, tails: &HashMap<String, u64>) -> BTreeMap<String, u64> {
        self.links
            .iter()
            .map(|(p, l)| (p.clone(), tails.get(p).copied().unwrap_or(l.acked)))
            .collect()
    }

    /// A worker claims the wake in flight (issued for it if there was none);
    /// returns the claim's bearer token.
    pub fn claim(
        &mut self,
        worker: &str,
        tails: &HashMap<String, u64>,
        now_ms: u64,
    ) -> Result<String, ConsumerError> {
        if let Some(holder) = self.wake.as_ref().and_then(|w| w.holder.clone()) {
            return Err(ConsumerError::conflict(
                "ALREADY_CLAIMED",
                format!("worker {holder:?} holds this subscription's lease"),
            )
            .with_field("current_holder", json!(holder))
            .with_field("generation", json!(self.generation)));
        }
        if !self.pending(tails) {
            return Err(ConsumerError::conflict(
                "NO_PENDING_WORK",
                "no linked stream has data past its acked offset",
            ));
        }
        if self.wake.is_none() {
            self.issue_wake(tails, now_ms);
        }
        let (token, token_sha) = new_token();
        let lease = now_ms + self.config.lease_ttl_ms;
        let snapshot = self.snapshot(tails);
        let wake = self.wake.as_mut().expect("a wake was issued above");
        wake.holder = Some(worker.to_string());
        wake.token_sha = token_sha;
        wake.lease_until_ms = Some(lease);
        wake.snapshot = snapshot;
        Ok(token)
    }

    /// Checks a callback, ack or release against the wake in flight (section 7.3).
    pub fn check_fence(&self, token: Option<&str>, req: &WakeRequest) -> Result<(), ConsumerError> {
        let wake = self.wake.as_ref().ok_or_else(fenced)?;
        if req.generation != Some(self.generation)
            || req.wake_id.as_deref() != Some(wake.wake_id.as_str())
        {
            return Err(fenced());
        }
        match token {
            Some(t) if sha_hex(t) == wake.token_sha => Ok(()),
            Some(_) => Err(fenced()),
            None => Err(ConsumerError::refused(
                Refusal::Unauthorized,
                "UNAUTHORIZED",
                "a wake's bearer token is required (Authorization: Bearer <token>)",
            )),
        }
    }

    /// Applies acks (all or none); an ack never moves a cursor back, nor past the
    /// tail it could have seen.
    pub fn apply_acks(
        &mut self,
        acks: &[AckItem],
        tails: &HashMap<String, u64>,
    ) -> Result<(), ConsumerError> {
        let mut moves = Vec::with_capacity(acks.len());
        for ack in acks {
            let path = ack
                .stream
                .as_deref()
                .or(ack.path.as_deref())
                .unwrap_or("")
                .trim_matches('/');
            let Some(link) = self.links.get(path) else {
                return Err(invalid_offset(format!(
                    "ack names {path:?}, which is not a stream of this subscription"
                )));
            };
            let pos = Offset::parse(&ack.offset)
                .map_err(|e| invalid_offset(format!("ack of {path:?}: {e}")))?
                .0;
            let seen = self
                .wake
                .as_ref()
                .and_then(|w| w.snapshot.get(path).copied())
                .unwrap_or(0)
                .max(tails.get(path).copied().unwrap_or(0));
            if pos > seen {
                return Err(invalid_offset(format!(
                    "ack of {path:?} at {} is past the stream's tail",
                    ack.offset
                )));
            }
            moves.push((path.to_string(), pos.max(link.acked)));
        }
        for (path, pos) in moves {
            if let Some(link) = self.links.get_mut(&path) {
                link.acked = pos;
            }
        }
        Ok(())
    }

    /// Acks every tail of the wake's snapshot (a webhook's synchronous `done`).
    pub fn ack_snapshot(&mut self) {
        let Some(wake) = &self.wake else { return };
        for (path, tail) in &wake.snapshot {
            if let Some(link) = self.links.get_mut(path) {
                link.acked = link.acked.max(*tail);
            }
        }
    }

    pub fn extend_lease(&mut self, now_ms: u64) {
        let ttl = self.config.lease_ttl_ms;
        if let Some(w) = self.wake.as_mut() {
            w.lease_until_ms = Some(now_ms + ttl);
        }
    }

    /// Whether the wake's lease lapsed at `now_ms`.
    pub fn lease_lapsed(&self, now_ms: u64) -> bool {
        self.wake
            .as_ref()
            .and_then(|w| w.lease_until_ms)
            .is_some_and(|t| t <= now_ms)
    }

    /// A failed webhook attempt: the wake is dropped (its token fenced) and the next
    /// attempt scheduled. `jitter` is in [-1, 1].
    pub fn schedule_retry(&mut self, now_ms: u64, jitter: f64) {
        let attempt = self.retry.as_ref().map_or(1, |r| r.attempt + 1);
        let base = RETRY_BASE_MS
            .saturating_mul(1u64 << (attempt - 1).min(20))
            .min(RETRY_MAX_MS);
        let delay = (base as f64 * (1.0 + 0.2 * jitter.clamp(-1.0, 1.0))).round() as u64;
        self.wake = None;
        self.retry = Some(Retry {
            attempt,
            next_attempt_at_ms: now_ms + delay,
        });
    }

    /// When the driver must look at the subscription next, if nothing wakes it.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let lease = self.wake.as_ref().and_then(|w| w.lease_until_ms);
        let retry = if self.wake.is_none() {
            self.retry.as_ref().map(|r| r.next_attempt_at_ms)
        } else {
            None
        };
        match (lease, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn link_type(link: &Link) -> &'static str {
        if link.explicit {
            "explicit"
        } else {
            "glob"
        }
    }

    /// The streams of a wake notification or claim answer.
    pub fn stream_infos(&self, tails: &HashMap<String, u64>) -> Vec<Value> {
        self.links
            .iter()
            .map(|(path, link)| {
                let tail = tails.get(path).copied().unwrap_or(link.acked);
                json!({
                    "path": path,
                    "link_type": Self::link_type(link),
                    "acked_offset": offset_str(link.acked),
                    "tail_offset": offset_str(tail),
                    "has_pending": tail > link.acked,
                })
            })
            .collect()
    }

    pub fn jwks_url(&self) -> String {
        format!("{}__ds/jwks.json", self.root_url)
    }

    pub fn action_url(&self, action: &str) -> String {
        // Ids are URL-safe as they are (`check_id`).
        format!("{}__ds/subscriptions/{}/{action}", self.root_url, self.id)
    }

    /// The subscription as GET answers it.
    pub fn describe(&self, kid: Option<&str>) -> Value {
        let streams: Vec<Value> = self
            .links
            .iter()
            .map(|(path, link)| {
                json!({
                    "path": path,
                    "link_type": Self::link_type(link),
                    "acked_offset": offset_str(link.acked),
                })
            })
            .collect();
        let webhook = self.config.webhook_url.as_ref().map(|url| {
            json!({
                "url": url,
                "signing": { "alg": "ed25519", "kid": kid, "jwks_url": self.jwks_url() },
            })
        });
        let mut out = json!({
            "id": self.id,
            "subscription_id": self.id,
            "type": self.config.kind.as_str(),
            "pattern": self.config.pattern,
            "streams": streams,
            "webhook": webhook,
            "wake_stream": self.config.wake_stream,
            "lease_ttl_ms": self.config.lease_ttl_ms,
            "created_at": self.created_at,
            "status": if self.retry.is_some() { "failed" } else { "active" },
            "description": self.config.description,
            "generation": self.generation,
        });
        if let Some(r) = &self.retry {
            out["next_attempt_at"] = json!(crate::subscriptions::rfc3339_ms(r.next_attempt_at_ms));
            out["attempt"] = json!(r.attempt);
        }
        if let Some(w) = &self.wake {
            out["wake"] = json!({
                "wake_id": w.wake_id,
                "holder": w.holder,
                "lease_until": w.lease_until_ms.map(crate::subscriptions::rfc3339_ms),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kind: Kind) -> SubState {
        SubState {
            id: "s".into(),
            root: "v1/stream/".into(),
            root_url: "http://h/v1/stream/".into(),
            config: SubConfig {
                kind,
                pattern: Some("events/*".into()),
                streams: vec![],
                webhook_url: None,
                wake_stream: None,
                lease_ttl_ms: 1_000,
                description: None,
            },
            hash: String::new(),
            created_at: String::new(),
            links: BTreeMap::from([(
                "events/a".to_string(),
                Link {
                    explicit: false,
                    glob: true,
                    acked: 10,
                },
            )]),
            generation: 0,
            wake: None,
            retry: None,
        }
    }

    fn req(s: &SubState) -> WakeRequest {
        WakeRequest {
            wake_id: s.wake.as_ref().map(|w| w.wake_id.clone()),
            generation: Some(s.generation),
            acks: vec![],
            done: true,
        }
    }

    #[test]
    fn a_wake_is_fenced_once_a_newer_one_is_issued() {
        let mut s = state(Kind::Webhook);
        let tails = HashMap::from([("events/a".to_string(), 20)]);
        assert!(s.pending(&tails));
        let t1 = s.issue_wake(&tails, 0);
        let r1 = req(&s);
        assert!(s.check_fence(Some(&t1), &r1).is_ok());
        assert_eq!(
            s.check_fence(Some("other"), &r1).unwrap_err().code(),
            "FENCED"
        );
        s.wake = None;
        let t2 = s.issue_wake(&tails, 0);
        assert_eq!(s.check_fence(Some(&t1), &r1).unwrap_err().code(), "FENCED");
        assert!(s.check_fence(Some(&t2), &req(&s)).is_ok());
        assert_eq!(s.generation, 2);
    }

    #[test]
    fn acks_move_forward_only_and_never_past_the_tail() {
        let mut s = state(Kind::PullWake);
        let tails = HashMap::from([("events/a".to_string(), 20)]);
        let ack = |o: u64| AckItem {
            stream: Some("events/a".into()),
            path: None,
            offset: Offset(o).to_string(),
        };
        s.apply_acks(&[ack(15)], &tails).unwrap();
        assert_eq!(s.links["events/a"].acked, 15);
        s.apply_acks(&[ack(12)], &tails).unwrap();
        assert_eq!(s.links["events/a"].acked, 15);
        assert_eq!(
            s.apply_acks(&[ack(21)], &tails).unwrap_err().code(),
            "INVALID_OFFSET"
        );
        let unknown = AckItem {
            stream: Some("events/b".into()),
            path: None,
            offset: Offset(1).to_string(),
        };
        assert!(s.apply_acks(&[ack(20), unknown], &tails).is_err());
        assert_eq!(s.links["events/a"].acked, 15, "all or none");
    }

    #[test]
    fn a_claim_is_exclusive_until_its_wake_ends() {
        let mut s = state(Kind::PullWake);
        let idle = HashMap::from([("events/a".to_string(), 10)]);
        assert_eq!(
            s.claim("w1", &idle, 0).unwrap_err().code(),
            "NO_PENDING_WORK"
        );
        let tails = HashMap::from([("events/a".to_string(), 20)]);
        s.claim("w1", &tails, 0).unwrap();
        let busy = s.claim("w2", &tails, 0).unwrap_err();
        assert_eq!(busy.code(), "ALREADY_CLAIMED");
        assert!(s.lease_lapsed(1_000) && !s.lease_lapsed(999));
    }

    #[test]
    fn retries_back_off_from_one_second_to_a_minute() {
        let mut s = state(Kind::Webhook);
        let mut delays = vec![];
        for _ in 0..9 {
            s.schedule_retry(0, 0.0);
            delays.push(s.retry.as_ref().unwrap().next_attempt_at_ms);
        }
        assert_eq!(
            delays,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]
        );
        s.retry = None;
        s.schedule_retry(0, 1.0);
        assert_eq!(s.retry.as_ref().unwrap().next_attempt_at_ms, 1_200);
    }
}
