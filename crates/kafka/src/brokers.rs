//! Who the brokers are and who leads what. One node is one broker (id 1). On a
//! cluster every member with a Kafka listener is a broker: its id is the member's
//! epoch (unique to that incarnation, so two processes can never answer as one
//! broker), its address the one it published when it joined (`--kafka-advertise`).
//! A partition's leader is the member that owns its stream's slot, and the slot's
//! generation (how many times it changed hands) is the partition's leader epoch.
//! A group's coordinator is the member owning its offsets stream's slot.

use picomq_engine::cluster::slot_of;

use crate::Kafka;

/// The broker id of a node that is no cluster member.
pub(crate) const SINGLE_NODE_ID: i32 = 1;

/// A broker as Metadata names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Broker {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

/// A partition's (or a group's) leader: its broker and leader epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leader {
    pub broker: i32,
    pub epoch: i32,
}

/// The broker id of the member of epoch `epoch`.
fn broker_of(epoch: u64) -> i32 {
    (epoch % i32::MAX as u64) as i32
}

/// `HOST:PORT` (a bracketed IPv6 host too) as Metadata gives it.
fn parse_addr(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), i32::from(port)))
}

impl Kafka {
    /// This node's broker id.
    pub(crate) fn broker_id(&self) -> i32 {
        self.engine
            .cluster()
            .map_or(SINGLE_NODE_ID, |c| broker_of(c.epoch))
    }

    /// Every broker: this node, and on a cluster every running member that
    /// published a Kafka listener.
    pub(crate) fn brokers(&self) -> Vec<Broker> {
        let me = Broker {
            id: self.broker_id(),
            host: self.host.clone(),
            port: self.port,
        };
        let Some(cluster) = self.engine.cluster() else {
            return vec![me];
        };
        let mut out = vec![me];
        for m in cluster.members() {
            if m.this_node || !m.row.state.is_running() {
                continue;
            }
            let Some((host, port)) = m.row.kafka.as_deref().and_then(parse_addr) else {
                continue;
            };
            out.push(Broker {
                id: broker_of(m.row.epoch),
                host,
                port,
            });
        }
        out
    }

    /// The leader of the stream `name` (absolute); `None` while it has none a
    /// Kafka client could reach (it is moving between members, or its owner has
    /// no Kafka listener).
    pub(crate) fn leader(&self, name: &str) -> Option<Leader> {
        let Some(cluster) = self.engine.cluster() else {
            return Some(Leader {
                broker: SINGLE_NODE_ID,
                epoch: 0,
            });
        };
        let l = cluster.leader(slot_of(name))?;
        if l.epoch != cluster.epoch {
            l.kafka.as_deref().and_then(parse_addr)?;
        }
        Some(Leader {
            broker: broker_of(l.epoch),
            epoch: (l.generation % i32::MAX as u64) as i32,
        })
    }

    /// The broker (id, host, port) leading `name`, for FindCoordinator.
    pub(crate) fn leader_broker(&self, name: &str) -> Option<Broker> {
        let leader = self.leader(name)?;
        self.brokers().into_iter().find(|b| b.id == leader.broker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_metadata_gives_them() {
        assert_eq!(parse_addr("10.0.0.1:9092"), Some(("10.0.0.1".into(), 9092)));
        assert_eq!(parse_addr("[::1]:9092"), Some(("::1".into(), 9092)));
        assert_eq!(
            parse_addr("kafka.example:1"),
            Some(("kafka.example".into(), 1))
        );
        assert_eq!(parse_addr("nohost"), None);
        assert_eq!(parse_addr(":9092"), None);
        assert_eq!(parse_addr("h:99999"), None);
        assert_eq!(broker_of(7), 7);
        assert_eq!(broker_of(i32::MAX as u64 + 3), 3);
    }
}
