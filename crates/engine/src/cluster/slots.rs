//! Which node a stream belongs to: its name hashes to one of [`SLOTS`] slots, and
//! each slot goes to the live member that scores highest for it (rendezvous
//! hashing). Every node computes the same assignment from the same member list, and
//! a change of members moves only the slots the joining or leaving node wins or
//! held: nothing else moves, and nothing moves back and forth.
//!
//! Pure functions; the decisions that act on them are in `membership`.

/// Slots in a cluster. Fixed for the life of a cluster (a stream's slot is part of
/// how every node routes it); enough that 3 to 30 nodes get even shares.
pub const SLOTS: u32 = 1024;

/// The slot a stream name belongs to. CRC-32C: stable across versions, platforms
/// and processes (the slot of a name must never change).
pub fn slot_of(name: &str) -> u32 {
    crc32c::crc32c(placed_by(name).as_bytes()) % SLOTS
}

/// Prefixes of companion streams: server-kept state about one stream (a consumer
/// group's, a consumer's position, records a Kafka transaction holds until its
/// outcome), named `PREFIX{key}/{stream}` with a `key` without `/`. A companion lives in its stream's slot, so the member serving the
/// stream serves its companions and works on both locally. No client can name a
/// stream starting with `__`, so no stream's slot is changed by this.
pub const COMPANION_PREFIXES: [&str; 3] = ["__groups/", "__positions/", "__kafka/stage/"];

/// The name whose slot `name` takes: its stream's for a companion, its own else.
pub fn placed_by(name: &str) -> &str {
    for prefix in COMPANION_PREFIXES {
        if let Some(rest) = name.strip_prefix(prefix) {
            if let Some((_, stream)) = rest.split_once('/') {
                return stream;
            }
        }
    }
    name
}

/// The score of `node_id` for `slot`; the highest score wins.
fn score(slot: u32, node_key: u64) -> u64 {
    splitmix64(node_key ^ u64::from(slot).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The stable key of a node id (its score inputs).
pub fn node_key(node_id: &str) -> u64 {
    splitmix64(u64::from(crc32c::crc32c(node_id.as_bytes())) << 32 | node_id.len() as u64)
}

#[cfg(test)]
mod companion_tests {
    use super::*;

    #[test]
    fn a_companion_stream_lives_in_its_streams_slot() {
        assert_eq!(slot_of("__groups/g1/orders/eu"), slot_of("orders/eu"));
        assert_eq!(slot_of("__positions/fn-a/orders/eu"), slot_of("orders/eu"));
        assert_eq!(slot_of("__kafka/stage/7.0/orders/eu"), slot_of("orders/eu"));
        assert_eq!(slot_of("orders/eu"), crc32c::crc32c(b"orders/eu") % SLOTS);
        assert_eq!(placed_by("__groups/nogroup"), "__groups/nogroup");
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The index into `nodes` (node ids) that should own `slot`; `None` without nodes.
/// Ties (identical ids) go to the lower index.
pub fn owner_index(slot: u32, nodes: &[&str]) -> Option<usize> {
    let mut best: Option<(u64, usize)> = None;
    for (i, id) in nodes.iter().enumerate() {
        let s = score(slot, node_key(id));
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, i));
        }
    }
    best.map(|(_, i)| i)
}

/// For every slot, the index into `nodes` that should own it.
pub fn assignment(nodes: &[&str]) -> Vec<Option<usize>> {
    (0..SLOTS).map(|slot| owner_index(slot, nodes)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(nodes: &[&str], streams: usize) -> Vec<usize> {
        let plan = assignment(nodes);
        let mut counts = vec![0; nodes.len()];
        for i in 0..streams {
            let owner = plan[slot_of(&format!("stream-{i}")) as usize].expect("nodes");
            counts[owner] += 1;
        }
        counts
    }

    #[test]
    fn slots_of_names_are_stable() {
        // Pinned: a change here would route existing streams to other nodes.
        assert_eq!(slot_of("orders"), crc32c::crc32c(b"orders") % SLOTS);
        assert_eq!(slot_of(""), 0);
        assert!(slot_of("a/b/c") < SLOTS);
    }

    #[test]
    fn three_nodes_share_streams_evenly() {
        let counts = shares(&["node-a", "node-b", "node-c"], 3000);
        for c in &counts {
            assert!(*c >= 750 && *c <= 1260, "shares {counts:?}");
        }
        let counts = shares(&["10.0.0.1:4437", "10.0.0.2:4437", "10.0.0.3:4437"], 3000);
        for c in &counts {
            assert!(*c >= 750 && *c <= 1260, "shares {counts:?}");
        }
    }

    #[test]
    fn a_join_moves_only_slots_to_the_new_node() {
        let before = assignment(&["a", "b", "c"]);
        let after = assignment(&["a", "b", "c", "d"]);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                assert_eq!(*a, Some(3), "a slot moved between old nodes");
                moved += 1;
            }
        }
        assert!(moved > 150 && moved < 370, "moved {moved}");
    }

    #[test]
    fn a_leave_moves_only_the_leavers_slots() {
        let before = assignment(&["a", "b", "c"]);
        let after = assignment(&["a", "c"]);
        for (b, a) in before.iter().zip(&after) {
            match b {
                Some(1) => assert!(a.is_some()),
                Some(0) => assert_eq!(*a, Some(0)),
                Some(2) => assert_eq!(*a, Some(1)),
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn order_of_members_does_not_matter() {
        let one = assignment(&["a", "b", "c"]);
        let other = assignment(&["c", "a", "b"]);
        let name =
            |plan: &[Option<usize>], nodes: &[&'static str], s: usize| nodes[plan[s].unwrap()];
        for s in 0..SLOTS as usize {
            assert_eq!(
                name(&one, &["a", "b", "c"], s),
                name(&other, &["c", "a", "b"], s)
            );
        }
        assert_eq!(owner_index(0, &[]), None);
    }
}
