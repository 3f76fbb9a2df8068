//! The entry format of a log file: headers, checksums, and scanning a log.

use super::*;

/// An entry's `header_crc`: of its bytes 5..36 and its key, seeded with its log's salt.
pub(super) fn header_crc(salt: Option<u64>, head: &[u8], key: &[u8]) -> u32 {
    let seed = salt.map_or(0, |s| crc32c::crc32c(&s.to_le_bytes()));
    crc32c::crc32c_append(crc32c::crc32c_append(seed, &head[5..36]), key)
}

pub(super) fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

pub(super) fn entry_len(key_len: usize, data_len: u64) -> u64 {
    pad8(ENTRY_HEADER + key_len as u64 + data_len)
}

/// An entry's header and key; its data follows them (and zeros pad it to 8 bytes:
/// the log is sparse, its unwritten bytes read as zeros).
pub(super) fn encode_head(
    log: u64,
    salt: Option<u64>,
    key: &str,
    data_len: u64,
    data_crc: u32,
    written_ms: i64,
) -> Vec<u8> {
    let mut e = Vec::with_capacity(ENTRY_HEADER as usize + key.len());
    e.extend_from_slice(ENTRY_MAGIC);
    e.push(LIVE);
    e.extend_from_slice(&(key.len() as u16).to_le_bytes());
    e.push(0);
    e.extend_from_slice(&log.to_le_bytes());
    e.extend_from_slice(&data_len.to_le_bytes());
    e.extend_from_slice(&written_ms.to_le_bytes());
    e.extend_from_slice(&data_crc.to_le_bytes());
    let crc = header_crc(salt, &e, key.as_bytes());
    e.extend_from_slice(&crc.to_le_bytes());
    e.extend_from_slice(key.as_bytes());
    e
}

/// An entry's header fields, as [`encode_head`] lays them out.
pub(super) struct EntryHead {
    pub(super) state: u8,
    pub(super) key_len: usize,
    pub(super) log: u64,
    pub(super) data_len: u64,
    pub(super) written_ms: i64,
    pub(super) data_crc: u32,
    /// `header_crc`.
    pub(super) crc: u32,
}

impl EntryHead {
    /// Reads the first [`ENTRY_HEADER`] bytes of `h`; `None` without the entry magic.
    pub(super) fn parse(h: &[u8]) -> Option<EntryHead> {
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        (&h[..4] == ENTRY_MAGIC).then(|| EntryHead {
            state: h[STATE_AT as usize],
            key_len: u16::from_le_bytes([h[5], h[6]]) as usize,
            log: u64_at(8),
            data_len: u64_at(16),
            written_ms: u64_at(24) as i64,
            data_crc: u32_at(32),
            crc: u32_at(36),
        })
    }
}

/// Objects that are never deleted: epoch claims and the seals that fence an old
/// epoch's writers (`fencing`, `wal::recovery`; one of each per start). In a shared
/// log one would keep the whole log, with the bytes of every object deleted from it,
/// for ever; in a log of its own it keeps a few hundred bytes.
pub(super) fn kept_forever(key: &str, data: &[u8]) -> bool {
    crate::layout::parse_claim_key(key).is_some()
        || data.starts_with(crate::wal::format::SEAL_MAGIC)
}

/// Writes an entry at `at`: its head, then its data in place (not copied behind the
/// head first: WAL objects run to megabytes).
pub(super) fn write_entry(file: &File, at: u64, head: &[u8], data: &[u8]) -> std::io::Result<()> {
    file.write_all_at(head, at)?;
    file.write_all_at(data, at + head.len() as u64)
}

/// What opening found in one log file.
pub(super) struct Scanned {
    pub(super) entries: Vec<(Path, Loc, u8)>,
    pub(super) end: u64,
    pub(super) capacity: u64,
    pub(super) sealed: bool,
    pub(super) salt: Option<u64>,
}

/// Reads a log's entries up to its first invalid one. `Ok(None)`: not a log (a torn
/// header, or a file being prepared).
pub(super) fn scan(file: &File, id: u64) -> std::io::Result<Option<Scanned>> {
    let capacity = file.metadata()?.len();
    let mut head = [0u8; LOG_HEADER as usize];
    if capacity < LOG_HEADER || file.read_exact_at(&mut head, 0).is_err() {
        return Ok(None);
    }
    let salt = match &head[..8] {
        m if m == LOG_MAGIC => Some(u64::from_le_bytes(
            head[SALT_AT..SALT_AT + 8].try_into().unwrap(),
        )),
        m if m == LOG_MAGIC_V1 => None,
        _ => return Ok(None),
    };
    if u64::from_le_bytes(head[8..16].try_into().unwrap()) != id {
        return Ok(None);
    }
    let sealed = head[SEALED_AT as usize] == 1;
    let mut entries = Vec::new();
    let mut at = LOG_HEADER;
    let mut h = [0u8; ENTRY_HEADER as usize];
    while at + ENTRY_HEADER <= capacity {
        file.read_exact_at(&mut h, at)?;
        let Some(EntryHead {
            state,
            key_len,
            log,
            data_len,
            written_ms,
            data_crc,
            crc,
        }) = EntryHead::parse(&h)
        else {
            break;
        };
        let len = entry_len(key_len, data_len);
        if log != id || key_len > MAX_KEY || (state != LIVE && state != DELETED) {
            break;
        }
        if at.checked_add(len).is_none_or(|end| end > capacity) {
            break;
        }
        let mut key = vec![0u8; key_len];
        file.read_exact_at(&mut key, at + ENTRY_HEADER)?;
        // A recycled log's old entries carry its old id and salt: the first of them
        // after the new ones ends it, like the zeros of a new log.
        if header_crc(salt, &h, &key) != crc {
            break;
        }
        if !sealed {
            let mut data = vec![0u8; data_len as usize];
            file.read_exact_at(&mut data, at + ENTRY_HEADER + key_len as u64)?;
            if crc32c::crc32c(&data) != data_crc {
                break;
            }
        }
        let Some(path) = String::from_utf8(key)
            .ok()
            .and_then(|k| Path::parse(k).ok())
        else {
            break;
        };
        entries.push((
            path,
            Loc {
                log: id,
                entry_at: at,
                len: data_len,
                written_ms,
            },
            state,
        ));
        at += len;
    }
    Ok(Some(Scanned {
        entries,
        end: at,
        capacity,
        sealed,
        salt,
    }))
}

/// The header and key of the entry at `loc` if it is `path`'s (state byte zeroed),
/// `None` if the bytes there are no longer that entry.
pub(super) fn entry_head(
    file: &File,
    loc: &Loc,
    salt: Option<u64>,
    path: &Path,
) -> std::io::Result<Option<Vec<u8>>> {
    let key = path.as_ref().as_bytes();
    let mut h = vec![0u8; ENTRY_HEADER as usize + key.len()];
    match file.read_exact_at(&mut h, loc.entry_at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let (head, stored_key) = h.split_at(ENTRY_HEADER as usize);
    let whole = EntryHead::parse(head).is_some_and(|e| {
        e.log == loc.log
            && e.data_len == loc.len
            && stored_key == key
            && header_crc(salt, head, key) == e.crc
    });
    h[STATE_AT as usize] = 0;
    Ok(whole.then_some(h))
}
