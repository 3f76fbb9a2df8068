//! Crash points for tests: `PICOMQ_FAILPOINTS=name[,name...]` makes the process
//! abort (no cleanup, no flush: what `kill -9` leaves) when it reaches a named
//! point, so crash tests can stop a node exactly between two steps of a protocol
//! (e.g. after compaction wrote an object, before it committed). Unset, a point
//! costs one relaxed load.

use std::sync::OnceLock;

static ARMED: OnceLock<Vec<String>> = OnceLock::new();

pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var("PICOMQ_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    });
    if armed.iter().any(|a| a == name) {
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}
