//! The bucket layout: every object key PicoMQ writes, its format, its parser and the
//! store that holds it. Nothing else in the engine spells a key prefix.
//!
//! ```text
//! epochs/{epoch:010}                                   epoch claims (fencing)       WAL store
//! wal/{epoch:010}/{seq:012}.wal                        WAL objects and seals        WAL store
//! seg/{epoch:010}/{seq:012}-{n:06}.seg                 compacted segments and packs data store
//! checkpoints/{epoch:010}-{next_seq:012}-{ms:013}.ckpt metadata checkpoints         data store
//! wal-log/                                             the local store's WAL log files (a directory, not keys)
//! identity.json                                        the prefix's cluster, metadata  data store
//! ```
//!
//! Numbers are zero-padded so that keys sort in the order they were written. With
//! `--wal-store`, keys whose home is [`Home::Wal`] go to the WAL store, the rest to
//! the data store (see `store::routed`).

/// Which store a key lives in when the WAL has a store of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    Wal,
    Data,
}

/// Epoch claims: one create-only object per node incarnation (see `fencing`).
pub const CLAIMS: &str = "epochs";
/// WAL objects and the seals recovery writes into the gaps (see `recovery`).
pub const WAL: &str = "wal";
/// Objects written by compaction (see `compaction`).
pub const SEGMENTS: &str = "seg";
/// Metadata checkpoints (see `checkpoint`).
pub const CHECKPOINTS: &str = "checkpoints";
/// The prefix's identity: its cluster and metadata of record (see `identity`).
pub const IDENTITY: &str = "identity.json";
/// The directory of the local store's WAL log files (see `store::local_log`).
pub const LOCAL_LOG_DIR: &str = "wal-log";

/// The first path segments that live in the WAL store.
pub const WAL_HOMED: &[&str] = &[WAL, CLAIMS, LOCAL_LOG_DIR];

/// The store a key (or a listing prefix) belongs to.
pub fn home(key: &str) -> Home {
    let first = key.split('/').next().unwrap_or("");
    if WAL_HOMED.contains(&first) {
        Home::Wal
    } else {
        Home::Data
    }
}

/// The claim of node incarnation `epoch`.
pub fn claim_key(epoch: u64) -> String {
    format!("{CLAIMS}/{epoch:010}")
}

/// The epoch of a key made by [`claim_key`].
pub fn parse_claim_key(key: &str) -> Option<u64> {
    key.strip_prefix(CLAIMS)?.strip_prefix('/')?.parse().ok()
}

/// The key of WAL object `seq` of node incarnation `epoch`. Keys sort in write order.
pub fn wal_key(epoch: u64, seq: u64) -> String {
    format!("{WAL}/{epoch:010}/{seq:012}.wal")
}

/// The prefix of every WAL object of incarnation `epoch` (its log).
pub fn wal_epoch_prefix(epoch: u64) -> String {
    format!("{WAL}/{epoch:010}")
}

/// `(epoch, seq)` of a key made by [`wal_key`].
pub fn parse_wal_key(key: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(WAL)?.strip_prefix('/')?;
    let (epoch, file) = rest.split_once('/')?;
    let seq = file.strip_suffix(".wal")?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

/// The key of compacted object `n` written at WAL position `(epoch, seq)`.
pub fn segment_key(epoch: u64, seq: u64, n: u64) -> String {
    format!("{SEGMENTS}/{epoch:010}/{seq:012}-{n:06}.seg")
}

/// The prefix of every compacted object written under `epoch`.
pub fn segments_of(epoch: u64) -> String {
    format!("{SEGMENTS}/{epoch:010}")
}

/// The WAL position `(epoch, seq)` in a key made by [`segment_key`].
pub fn parse_segment_key(key: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(SEGMENTS)?.strip_prefix('/')?;
    let (epoch, file) = rest.split_once('/')?;
    let (seq, _) = file.strip_suffix(".seg")?.split_once('-')?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

/// A checkpoint's key: the WAL watermark it reflects, then when it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CheckpointKey {
    pub epoch: u64,
    pub next_seq: u64,
    pub written_ms: u64,
}

impl CheckpointKey {
    pub fn name(&self) -> String {
        format!(
            "{CHECKPOINTS}/{:010}-{:012}-{:013}.ckpt",
            self.epoch, self.next_seq, self.written_ms
        )
    }

    pub fn parse(key: &str) -> Option<CheckpointKey> {
        let name = key.strip_prefix(CHECKPOINTS)?.strip_prefix('/')?;
        let mut parts = name.strip_suffix(".ckpt")?.split('-');
        let mut next = || parts.next()?.parse().ok();
        let key = CheckpointKey {
            epoch: next()?,
            next_seq: next()?,
            written_ms: next()?,
        };
        parts.next().is_none().then_some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sort_in_write_order() {
        assert_eq!(parse_claim_key(&claim_key(42)), Some(42));
        assert_eq!(parse_wal_key(&wal_key(3, 7)), Some((3, 7)));
        assert_eq!(parse_segment_key(&segment_key(3, 7, 2)), Some((3, 7)));
        assert!(wal_key(1, 9) < wal_key(1, 10) && wal_key(1, 10) < wal_key(2, 0));
        let ck = CheckpointKey {
            epoch: 1,
            next_seq: 12,
            written_ms: 99,
        };
        assert_eq!(CheckpointKey::parse(&ck.name()), Some(ck));
        assert_eq!(CheckpointKey::parse("checkpoints/x-1.ckpt"), None);
        assert_eq!(
            CheckpointKey::parse("checkpoints/0000000001-000000000001.ckpt"),
            None
        );
        assert_eq!(CheckpointKey::parse(&wal_key(1, 1)), None);
        assert_eq!(parse_wal_key(&segment_key(1, 1, 0)), None);
    }

    #[test]
    fn every_key_has_one_home() {
        assert_eq!(home(&wal_key(1, 1)), Home::Wal);
        assert_eq!(home(&claim_key(1)), Home::Wal);
        assert_eq!(home(WAL), Home::Wal);
        assert_eq!(home(&segment_key(1, 1, 1)), Home::Data);
        assert_eq!(home("checkpoints/x"), Home::Data);
        assert_eq!(home("walrus/x"), Home::Data);
        assert_eq!(home(IDENTITY), Home::Data);
    }
}
