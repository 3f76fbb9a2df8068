//! Crash points for tests: `PICOMQ_FAILPOINTS=name[,name...]` makes the process
//! abort (no cleanup, no flush: what `kill -9` leaves) when it reaches a named
//! point, so crash tests can stop a node exactly between two steps of a protocol
//! (e.g. after compaction wrote an object, before it committed). Unset, a point
//! costs one relaxed load.
//!
//! Pause points, for races: `PICOMQ_FAILPOINT_PAUSES=name=MS[,name=MS...]` makes the
//! task that reaches a named [`pause`] sleep that long, so a test can hold one step
//! of a protocol open while another node goes on (e.g. a fork's index write while a
//! delete counts the forks).

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

static PAUSES: OnceLock<Vec<(String, u64)>> = OnceLock::new();

/// Sleeps at a named pause point when `PICOMQ_FAILPOINT_PAUSES` names it.
pub async fn pause(name: &str) {
    let pauses = PAUSES.get_or_init(|| {
        std::env::var("PICOMQ_FAILPOINT_PAUSES")
            .map(|v| {
                v.split(',')
                    .filter_map(|p| {
                        let (n, ms) = p.trim().split_once('=')?;
                        Some((n.to_string(), ms.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    if let Some((_, ms)) = pauses.iter().find(|(n, _)| n == name) {
        tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
    }
}
