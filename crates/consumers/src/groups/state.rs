//! A consumer group's state and its transitions, with no I/O: where the group is
//! in its stream (the cursor), the messages out under a lease, the ones handed
//! back (nacked or lapsed), and the counts. Every change is an [`Event`] the
//! manager makes durable before it answers; replaying the events (from the last
//! snapshot) gives the same state, lapsed leases included, since a lease's end is
//! part of the event that granted it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    pub group: String,
    pub stream: String,
    /// Deliveries after which a message is dead-lettered (0: never).
    pub max_deliveries: u32,
    pub dead_letter: Option<String>,
    pub lease_ms: u64,
    pub created_at: String,
}

/// A message out under a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Out {
    pub consumer: String,
    pub lease_until_ms: u64,
    pub deliveries: u32,
    /// Where the append holding it starts (reads begin at appends), and its end.
    pub append: u64,
    pub end: u64,
}

/// A message handed back, to be delivered again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Back {
    pub deliveries: u32,
    pub not_before_ms: u64,
    pub append: u64,
    pub end: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    pub config: GroupConfig,
    /// The next message never handed out, and the append it is in.
    pub cursor: u64,
    pub cursor_append: u64,
    #[serde(with = "pairs")]
    pub out: BTreeMap<u64, Out>,
    #[serde(with = "pairs")]
    pub back: BTreeMap<u64, Back>,
    pub acked_total: u64,
    pub redeliveries_total: u64,
    pub dead_lettered_total: u64,
}

/// Handed-back messages by offset.
pub type BackList = Vec<(u64, Back)>;

/// One message handed to a consumer: `(offset, append, end, deliveries)`.
pub type Handed = (u64, u64, u64, u32);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Event {
    /// The whole state (the first event of a group, and every so often after).
    Snapshot(Box<GroupState>),
    /// Messages handed to `consumer` until `until`; the cursor after them.
    Claim {
        consumer: String,
        until: u64,
        messages: Vec<Handed>,
        cursor: u64,
        cursor_append: u64,
    },
    Ack {
        offsets: Vec<u64>,
    },
    /// Handed back, not to be delivered before `not_before`.
    Nack {
        offsets: Vec<u64>,
        not_before: u64,
    },
    /// Appended to the dead-letter stream and never delivered again.
    Dead {
        offsets: Vec<u64>,
    },
}

impl GroupState {
    pub fn new(config: GroupConfig, cursor: u64, cursor_append: u64) -> GroupState {
        GroupState {
            config,
            cursor,
            cursor_append,
            out: BTreeMap::new(),
            back: BTreeMap::new(),
            acked_total: 0,
            redeliveries_total: 0,
            dead_lettered_total: 0,
        }
    }

    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Snapshot(s) => *self = (**s).clone(),
            Event::Claim {
                consumer,
                until,
                messages,
                cursor,
                cursor_append,
            } => {
                for &(offset, append, end, deliveries) in messages {
                    if self.back.remove(&offset).is_some() || self.out.contains_key(&offset) {
                        self.redeliveries_total += 1;
                    }
                    self.out.insert(
                        offset,
                        Out {
                            consumer: consumer.clone(),
                            lease_until_ms: *until,
                            deliveries,
                            append,
                            end,
                        },
                    );
                }
                if *cursor > self.cursor {
                    self.cursor = *cursor;
                    self.cursor_append = *cursor_append;
                }
            }
            Event::Ack { offsets } => {
                for o in offsets {
                    if self.out.remove(o).is_some() || self.back.remove(o).is_some() {
                        self.acked_total += 1;
                    }
                }
            }
            Event::Nack {
                offsets,
                not_before,
            } => {
                for o in offsets {
                    if let Some(out) = self.out.remove(o) {
                        self.back.insert(
                            *o,
                            Back {
                                deliveries: out.deliveries,
                                not_before_ms: *not_before,
                                append: out.append,
                                end: out.end,
                            },
                        );
                    }
                }
            }
            Event::Dead { offsets } => {
                for o in offsets {
                    if self.out.remove(o).is_some() | self.back.remove(o).is_some() {
                        self.dead_lettered_total += 1;
                    }
                }
            }
        }
    }

    /// Leases that ran out at `now_ms` become handed-back messages (in memory:
    /// a replay finds the same, from the lease ends it logged).
    pub fn lapse(&mut self, now_ms: u64) -> usize {
        let lapsed: Vec<u64> = self
            .out
            .iter()
            .filter(|(_, o)| o.lease_until_ms <= now_ms)
            .map(|(k, _)| *k)
            .collect();
        for k in &lapsed {
            let o = self.out.remove(k).expect("listed above");
            self.back.insert(
                *k,
                Back {
                    deliveries: o.deliveries,
                    not_before_ms: 0,
                    append: o.append,
                    end: o.end,
                },
            );
        }
        lapsed.len()
    }

    /// Handed-back messages due at `now_ms`, oldest first, at most `max`: those
    /// to deliver again, and those out of deliveries (to dead-letter).
    pub fn due(&self, now_ms: u64, max: usize) -> (BackList, BackList) {
        let mut again = Vec::new();
        let mut dead = Vec::new();
        for (o, b) in &self.back {
            if again.len() >= max {
                break;
            }
            if b.not_before_ms > now_ms {
                continue;
            }
            if self.exhausted(b.deliveries) {
                dead.push((*o, b.clone()));
            } else {
                again.push((*o, b.clone()));
            }
        }
        (again, dead)
    }

    /// Whether a message delivered `deliveries` times may not be delivered again.
    pub fn exhausted(&self, deliveries: u32) -> bool {
        self.config.max_deliveries > 0 && deliveries >= self.config.max_deliveries
    }

    /// When the next handed-back message falls due or the next lease runs out.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.next_due_ms_except(|_| false)
    }

    /// [`GroupState::next_due_ms`] with the handed-back messages `skip` names aside.
    pub fn next_due_ms_except(&self, skip: impl Fn(&u64) -> bool) -> Option<u64> {
        let back = self
            .back
            .iter()
            .filter(|(o, _)| !skip(o))
            .map(|(_, b)| b.not_before_ms)
            .min();
        let out = self.out.values().map(|o| o.lease_until_ms).min();
        match (back, out) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Maps keyed by offset as `[[offset, value], ...]`: JSON object keys are
/// strings, which an internally tagged [`Event`] cannot read back as numbers.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<V: Serialize, S: Serializer>(
        map: &BTreeMap<u64, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, V: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<u64, V>, D::Error> {
        Ok(Vec::<(u64, V)>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(max: u32) -> GroupState {
        GroupState::new(
            GroupConfig {
                group: "g".into(),
                stream: "s".into(),
                max_deliveries: max,
                dead_letter: None,
                lease_ms: 1_000,
                created_at: String::new(),
            },
            0,
            0,
        )
    }

    fn claim(consumer: &str, until: u64, messages: Vec<Handed>, cursor: u64) -> Event {
        Event::Claim {
            consumer: consumer.into(),
            until,
            messages,
            cursor,
            cursor_append: cursor,
        }
    }

    #[test]
    fn a_lapsed_lease_hands_the_message_back_and_a_replay_agrees() {
        let mut g = group(3);
        let events = vec![
            claim("a", 1_000, vec![(0, 0, 10, 1), (10, 0, 20, 1)], 20),
            Event::Ack { offsets: vec![0] },
        ];
        for e in &events {
            g.apply(e);
        }
        assert_eq!(g.out.len(), 1);
        assert_eq!(g.lapse(999), 0);
        assert_eq!(g.lapse(1_000), 1);
        let (again, dead) = g.due(1_000, 10);
        assert_eq!(again.len(), 1);
        assert!(dead.is_empty());
        // A replay of the same events, looked at as late, sees the same.
        let mut r = group(3);
        for e in &events {
            r.apply(e);
        }
        r.lapse(1_000);
        assert_eq!(r, g);
        assert_eq!(g.acked_total, 1);
    }

    #[test]
    fn a_message_out_of_deliveries_is_due_for_the_dead_letter_stream() {
        let mut g = group(2);
        g.apply(&claim("a", 100, vec![(0, 0, 5, 1)], 5));
        g.apply(&Event::Nack {
            offsets: vec![0],
            not_before: 50,
        });
        assert!(g.due(49, 10).0.is_empty(), "not before its delay");
        g.apply(&claim("b", 200, vec![(0, 0, 5, 2)], 5));
        assert_eq!(g.redeliveries_total, 1);
        g.apply(&Event::Nack {
            offsets: vec![0],
            not_before: 0,
        });
        let (again, dead) = g.due(0, 10);
        assert!(again.is_empty());
        assert_eq!(dead.len(), 1);
        g.apply(&Event::Dead { offsets: vec![0] });
        assert_eq!(g.dead_lettered_total, 1);
        assert!(g.back.is_empty() && g.out.is_empty());
    }

    #[test]
    fn events_round_trip_as_json() {
        let mut g = group(3);
        g.apply(&claim("a", 1, vec![(7, 0, 9, 1)], 9));
        g.apply(&Event::Nack {
            offsets: vec![7],
            not_before: 5,
        });
        g.apply(&claim("b", 1, vec![(9, 9, 12, 1)], 12));
        let snap = Event::Snapshot(Box::new(g));
        let text = serde_json::to_string(&snap).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), snap);
        let e = claim("a", 1, vec![(1, 0, 2, 1)], 2);
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.starts_with(r#"{"t":"claim""#), "{text}");
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), e);
    }
}
