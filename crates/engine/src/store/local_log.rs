//! The local store's WAL: objects packed into preallocated log files.
//!
//! A `file://` store keeps most objects one file per key (object_store's
//! `LocalFileSystem`). WAL objects are different: one is written per group commit and
//! an append waits for it, so its write is the floor of every append's latency. As a
//! file per key it costs an inode, a staging name, a link and two fsyncs (file and
//! directory): 0.5-0.6 ms on the benchmark VM, more under load, and ext4 without a
//! journal then also scans recently deleted inodes on every create. Here a WAL object
//! is one `pwrite` into a log file that already exists (with its name synced), then
//! one `fdatasync`: 0.27-0.28 ms on the same disk (docs/storage.md, "The local WAL
//! log").
//!
//! Layout: `DIR/{id:020}.log`, each `segment_bytes` long (an object too large for one
//! gets a log file of its own), made ahead of need by a background thread: from an
//! emptied log kept for reuse (`DIR/{id:020}.free`, at most [`FREE_MAX`]) when there is
//! one, else a new sparse file.
//!
//! ```text
//! log    = header(64 bytes) entry* (zeros, or a reused log's old entries)
//! header = "PMQLOG02" id:u64 sealed:u8 0*7 salt:u64 zero-padding
//! entry  = "PMQE" state:u8 key_len:u16 0:u8 log_id:u64 data_len:u64 written_ms:u64
//!          data_crc:u32 header_crc:u32 key data padding-to-8
//! state  = 1 live | 2 deleted
//! ```
//!
//! `header_crc` is crc32c of the log's salt, then the entry's bytes 5..36 and its key
//! (everything but the magic, the state byte and itself); `data_crc` covers the data.
//! A log gets a new random salt whenever it is made or reused, so the old entries
//! behind a reused log's new ones (or entry-like bytes inside an object's data) never
//! read as its entries. Logs of format 1 (`PMQLOG01`, before reuse) have no salt and
//! are read as before. An entry is
//! acknowledged only after the `fdatasync` that follows its `pwrite`, and entries are
//! written in offset order under one lock, so a sync also covers every entry before
//! it. A crash can therefore only tear entries at the tail of a log, after the last
//! acknowledged one; opening stops reading a log at its first invalid entry, and
//! checks data checksums in logs that were not sealed (every log a process stopped
//! writing to is sealed once its writes are synced; the one written at a crash is
//! not). A delete rewrites the entry's state byte in place and syncs; a log whose
//! entries are all deleted is freed for reuse (or removed). Entries carry their log's
//! id, so a log file can never be mistaken for another. A read checks the entry's
//! header before and after reading its data: a log reused under a read (a delete
//! racing it, or another process writing the directory) reads as "not found", never as
//! another object's bytes.
//!
//! One process writes a log directory (`DIR/LOCK`, taken when the store opens, or at
//! its first write if another process held it then, reading the directory afresh);
//! others may open it to read, and see the objects durable when they opened it. Objects
//! written as files by earlier versions (`legacy`) stay readable, listable and
//! deletable: they are listed once when the store opens.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};

const STORE: &str = "LocalLog";
/// Logs written before recycling: entries' `header_crc` has no salt.
const LOG_MAGIC_V1: &[u8; 8] = b"PMQLOG01";
const LOG_MAGIC: &[u8; 8] = b"PMQLOG02";
const LOG_HEADER: u64 = 64;
const SEALED_AT: u64 = 16;
const SALT_AT: usize = 24;
/// Emptied logs kept for reuse (`{id}.free`); more are removed.
const FREE_MAX: usize = 4;
const ENTRY_MAGIC: &[u8; 4] = b"PMQE";
const ENTRY_HEADER: u64 = 40;
const STATE_AT: u64 = 4;
const LIVE: u8 = 1;
const DELETED: u8 = 2;
/// Keys longer than this are refused (WAL keys are ~34 bytes).
const MAX_KEY: usize = 1024;
/// How long a first write waits for another holder of the write lock to let go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Default size of one log file.
pub const SEGMENT_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy, Debug)]
struct Loc {
    log: u64,
    entry_at: u64,
    len: u64,
    written_ms: i64,
}

impl Loc {
    fn data_at(&self, key_len: usize) -> u64 {
        self.entry_at + ENTRY_HEADER + key_len as u64
    }
}

struct Log {
    file: Arc<File>,
    capacity: u64,
    /// Mixed into every entry's `header_crc` (`None`: a log of format 1). A log is
    /// given a fresh random salt each time it is made or recycled.
    salt: Option<u64>,
    /// Next entry's offset (for the log being written).
    write_at: u64,
    live: usize,
    /// Entries written but not yet synced.
    in_flight: usize,
    sealed: bool,
    /// No longer written: sealed once `in_flight` is 0, removed once `live` is 0.
    retired: bool,
    /// A sync failed: what is on disk is unknown, so the log is never sealed and the
    /// next open checks every entry's data.
    poisoned: bool,
}

struct State {
    index: BTreeMap<Path, Loc>,
    /// Keys being written (a concurrent create of the same key fails).
    pending: HashSet<Path>,
    logs: HashMap<u64, Log>,
    active: Option<u64>,
    /// A log made in the background, not yet named: the writer names it when it
    /// takes it (only the writer decides which ids exist, and the background thread
    /// must not hold the store, and so its write lock, while it works).
    spare: Option<(u64, u64, NewLog)>,
    preparing: bool,
    /// Emptied logs, renamed `{id}.free`, kept to be made into new logs: their blocks
    /// are allocated and written, so a write into one changes no file metadata and
    /// its `fdatasync` flushes data only, and no delete discards 64 MiB meanwhile.
    free: Vec<PathBuf>,
    next_id: u64,
    /// Older copies of keys written twice, found when opening: marked deleted on the
    /// first write.
    stale: Vec<Loc>,
    /// WAL objects that earlier versions wrote as files under the store's root, read
    /// through `legacy`. Listed once when opening: a create checks them without I/O.
    legacy: BTreeMap<Path, ObjectMeta>,
    /// The write lock on `DIR/LOCK`, once this process has written.
    writer: Option<File>,
}

struct Inner {
    dir: PathBuf,
    segment_bytes: u64,
    legacy: Arc<dyn ObjectStore>,
    legacy_root: PathBuf,
    state: Mutex<State>,
}

#[derive(Clone)]
pub struct LocalLogStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for LocalLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalLogStore({})", self.inner.dir.display())
    }
}

impl fmt::Display for LocalLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalLog({})", self.inner.dir.display())
    }
}

fn generic(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: e.into(),
    }
}

fn not_found(path: &Path) -> object_store::Error {
    object_store::Error::NotFound {
        path: path.to_string(),
        source: "no such object".into(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn log_path(dir: &FsPath, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.log"))
}

fn free_path(dir: &FsPath, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.free"))
}

/// An entry's `header_crc`: of its bytes 5..36 and its key, seeded with its log's salt.
fn header_crc(salt: Option<u64>, head: &[u8], key: &[u8]) -> u32 {
    let seed = salt.map_or(0, |s| crc32c::crc32c(&s.to_le_bytes()));
    crc32c::crc32c_append(crc32c::crc32c_append(seed, &head[5..36]), key)
}

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

fn entry_len(key_len: usize, data_len: u64) -> u64 {
    pad8(ENTRY_HEADER + key_len as u64 + data_len)
}

/// An entry's header and key; its data follows them (and zeros pad it to 8 bytes:
/// the log is sparse, its unwritten bytes read as zeros).
fn encode_head(
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
struct EntryHead {
    state: u8,
    key_len: usize,
    log: u64,
    data_len: u64,
    written_ms: i64,
    data_crc: u32,
    /// `header_crc`.
    crc: u32,
}

impl EntryHead {
    /// Reads the first [`ENTRY_HEADER`] bytes of `h`; `None` without the entry magic.
    fn parse(h: &[u8]) -> Option<EntryHead> {
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
fn kept_forever(key: &str, data: &[u8]) -> bool {
    crate::fencing::parse_claim_key(key).is_some()
        || data.starts_with(crate::wal::format::SEAL_MAGIC)
}

/// Writes an entry at `at`: its head, then its data in place (not copied behind the
/// head first: WAL objects run to megabytes).
fn write_entry(file: &File, at: u64, head: &[u8], data: &[u8]) -> std::io::Result<()> {
    file.write_all_at(head, at)?;
    file.write_all_at(data, at + head.len() as u64)
}

fn sync_dir(dir: &FsPath) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What opening found in one log file.
struct Scanned {
    entries: Vec<(Path, Loc, u8)>,
    end: u64,
    capacity: u64,
    sealed: bool,
    salt: Option<u64>,
}

/// Reads a log's entries up to its first invalid one. `Ok(None)`: not a log (a torn
/// header, or a file being prepared).
fn scan(file: &File, id: u64) -> std::io::Result<Option<Scanned>> {
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

/// A log being made, written and synced under a temporary name of its own.
struct NewLog {
    tmp: PathBuf,
    file: File,
    salt: u64,
}

/// Makes log `id`, `capacity` bytes long, synced, under a temporary name unique to
/// this call (two processes, or a store and the one reopened after it, may make the
/// same id at once). From `free`, an emptied log of that size, when given and still
/// there: only its header is rewritten (the new id and salt end it before its old
/// entries). Otherwise a new sparse file, its blocks allocated as it is written.
fn make_log(
    dir: &FsPath,
    id: u64,
    capacity: u64,
    free: Option<PathBuf>,
) -> std::io::Result<NewLog> {
    let tmp = dir.join(format!(
        "{id:020}.log.tmp-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let salt = fastrand::u64(..);
    let mut head = vec![0u8; LOG_HEADER as usize];
    head[..8].copy_from_slice(LOG_MAGIC);
    head[8..16].copy_from_slice(&id.to_le_bytes());
    head[SALT_AT..SALT_AT + 8].copy_from_slice(&salt.to_le_bytes());
    if let Some(free) = free {
        match recycle(&free, &tmp, capacity, &head) {
            Ok(file) => return Ok(NewLog { tmp, file, salt }),
            Err(e) => {
                tracing::debug!(error = %e, free = %free.display(), "not reusing a free WAL log");
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    file.write_all(&head)?;
    file.set_len(capacity)?;
    file.sync_all()?;
    Ok(NewLog { tmp, file, salt })
}

/// Claims the free log `free` (renaming it to `tmp`: of two claimants one fails) and
/// writes `head` over its header.
fn recycle(free: &FsPath, tmp: &FsPath, capacity: u64, head: &[u8]) -> std::io::Result<File> {
    std::fs::rename(free, tmp)?;
    let file = OpenOptions::new().read(true).write(true).open(tmp)?;
    if file.metadata()?.len() != capacity {
        return Err(std::io::Error::other("a free log of another size"));
    }
    file.write_all_at(head, 0)?;
    file.sync_data()?;
    Ok(file)
}

/// Gives a made log its name and syncs the directory: from here on a write into it
/// needs no new inode or name. Only the directory's writer may do this (it decides
/// which ids exist), so a crash never leaves a half-made log under a log's name.
fn publish(dir: &FsPath, id: u64, new: NewLog) -> std::io::Result<(File, u64)> {
    std::fs::rename(&new.tmp, log_path(dir, id))?;
    sync_dir(dir)?;
    Ok((new.file, new.salt))
}

/// Makes and names log `id`; the caller is the directory's writer.
fn create_log(
    dir: &FsPath,
    id: u64,
    capacity: u64,
    free: Option<PathBuf>,
) -> std::io::Result<(File, u64)> {
    publish(dir, id, make_log(dir, id, capacity, free)?)
}

impl State {
    fn empty() -> State {
        State {
            index: BTreeMap::new(),
            pending: HashSet::new(),
            logs: HashMap::new(),
            active: None,
            spare: None,
            preparing: false,
            free: Vec::new(),
            next_id: 1,
            stale: Vec::new(),
            legacy: BTreeMap::new(),
            writer: None,
        }
    }
}

/// The WAL objects (`wal/`, `epochs/`) stored as files under `root`, as
/// object_store's `LocalFileSystem` names them (staging files, `KEY#N`, left out).
fn legacy_files(root: &FsPath) -> std::io::Result<BTreeMap<Path, ObjectMeta>> {
    let mut found = BTreeMap::new();
    let roots = ["wal", "epochs"].iter().map(|p| root.join(p)).collect();
    super::walk_files(roots, |entry| {
        if entry.file_name().to_string_lossy().contains('#') {
            return Ok(());
        }
        let path = entry.path();
        let Some(key) = path
            .strip_prefix(root)
            .ok()
            .and_then(|rel| rel.to_str())
            .and_then(|rel| Path::parse(rel).ok())
        else {
            return Ok(());
        };
        let meta = entry.metadata()?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        found.insert(
            key.clone(),
            ObjectMeta {
                location: key,
                last_modified: chrono::DateTime::from_timestamp_millis(modified)
                    .unwrap_or_default(),
                size: meta.len(),
                e_tag: None,
                version: None,
            },
        );
        Ok(())
    })?;
    Ok(found)
}

/// `DIR/LOCK`, locked for writing, or `None` if another process holds it.
fn try_lock(dir: &FsPath) -> std::io::Result<Option<File>> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    match lock.try_lock() {
        Ok(()) => Ok(Some(lock)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Reads every log in `dir` into an index of the live objects, and lists the WAL
/// files under `legacy_root`.
fn load(dir: &FsPath, legacy_root: &FsPath) -> std::io::Result<State> {
    let mut ids = Vec::new();
    let mut free = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(id) = name
            .strip_suffix(".log")
            .and_then(|n| n.parse::<u64>().ok())
        {
            ids.push(id);
        } else if let Some(id) = name
            .strip_suffix(".free")
            .and_then(|n| n.parse::<u64>().ok())
        {
            free.push(free_path(dir, id));
        }
    }
    ids.sort_unstable();
    free.sort_unstable();
    let mut state = State::empty();
    state.free = free;
    state.next_id = ids.last().map_or(1, |id| id + 1);
    state.legacy = legacy_files(legacy_root)?;
    for id in ids {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .open(log_path(dir, id))
        {
            Ok(f) => f,
            // Removed by the process writing the directory since we listed it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let Some(scanned) = scan(&file, id)? else {
            continue;
        };
        let mut log = Log {
            file: Arc::new(file),
            capacity: scanned.capacity,
            salt: scanned.salt,
            write_at: scanned.end,
            live: 0,
            in_flight: 0,
            sealed: scanned.sealed,
            retired: true,
            poisoned: false,
        };
        for (path, loc, entry_state) in scanned.entries {
            if entry_state != LIVE {
                continue;
            }
            // A key written twice (an overwrite interrupted before the old entry
            // was marked deleted): the later entry wins.
            if let Some(old) = state.index.insert(path, loc) {
                if let Some(l) = state.logs.get_mut(&old.log) {
                    l.live -= 1;
                } else {
                    log.live -= 1;
                }
                state.stale.push(old);
            }
            log.live += 1;
        }
        state.logs.insert(id, log);
    }
    Ok(state)
}

impl LocalLogStore {
    /// Opens (creating if missing) the log directory `dir`, reading every log in it.
    /// `legacy` is where WAL objects were files before (the store's root).
    pub fn open(
        dir: &FsPath,
        legacy: Arc<dyn ObjectStore>,
        legacy_root: &FsPath,
    ) -> std::io::Result<LocalLogStore> {
        LocalLogStore::open_with(dir, legacy, legacy_root, SEGMENT_BYTES)
    }

    pub fn open_with(
        dir: &FsPath,
        legacy: Arc<dyn ObjectStore>,
        legacy_root: &FsPath,
        segment_bytes: u64,
    ) -> std::io::Result<LocalLogStore> {
        assert!(segment_bytes > LOG_HEADER + ENTRY_HEADER);
        std::fs::create_dir_all(dir)?;
        // The write lock first, when free, so that what is read next is not changed
        // by another writer before this process writes.
        let lock = try_lock(dir)?;
        let mut state = load(dir, legacy_root)?;
        let store = LocalLogStore {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                segment_bytes,
                legacy,
                legacy_root: legacy_root.to_path_buf(),
                state: Mutex::new(State::empty()),
            }),
        };
        if let Some(lock) = lock {
            store.take_over(&mut state, lock)?;
        }
        *store.state() = state;
        Ok(store)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn meta(path: &Path, loc: &Loc) -> ObjectMeta {
        ObjectMeta {
            location: path.clone(),
            last_modified: chrono::DateTime::from_timestamp_millis(loc.written_ms)
                .unwrap_or_default(),
            size: loc.len,
            e_tag: Some(format!("\"{:x}-{:x}\"", loc.log, loc.entry_at)),
            version: None,
        }
    }

    /// The state, with this store as the directory's writer. If this process opened
    /// the store while another was writing it, takes the write lock now (waiting a
    /// moment for a holder that is letting go, without holding the state, so reads
    /// go on meanwhile), reads the directory afresh (the other may have written
    /// since), then takes over.
    fn writer_state(&self) -> object_store::Result<MutexGuard<'_, State>> {
        let state = self.state();
        if state.writer.is_some() {
            return Ok(state);
        }
        drop(state);
        let deadline = Instant::now() + LOCK_WAIT;
        let lock = loop {
            // Another write of this store may have taken over meanwhile.
            let state = self.state();
            if state.writer.is_some() {
                return Ok(state);
            }
            drop(state);
            if let Some(lock) = try_lock(&self.inner.dir).map_err(generic)? {
                break lock;
            }
            if Instant::now() >= deadline {
                return Err(generic(format!(
                    "{} is being written by another process",
                    self.inner.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut state = self.state();
        // The lock is per open file: no other write of this store can hold it too,
        // so the state is still a reader's.
        *state = load(&self.inner.dir, &self.inner.legacy_root).map_err(generic)?;
        self.take_over(&mut state, lock).map_err(generic)?;
        Ok(state)
    }

    /// Becomes the directory's writer: removes what a crashed writer left half done
    /// (logs being prepared, the older copy of a key written twice), frees logs
    /// with nothing live, and seals the logs it left unsealed.
    fn take_over(&self, state: &mut State, lock: File) -> std::io::Result<()> {
        state.writer = Some(lock);
        for entry in std::fs::read_dir(&self.inner.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().contains(".log.tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        for stale in std::mem::take(&mut state.stale) {
            let log = &state.logs[&stale.log];
            log.file
                .write_all_at(&[DELETED], stale.entry_at + STATE_AT)
                .and_then(|()| log.file.sync_data())?;
        }
        while state.free.len() > FREE_MAX {
            let _ = std::fs::remove_file(state.free.pop().unwrap());
        }
        let mut ids: Vec<u64> = state.logs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let log = &state.logs[&id];
            if log.live == 0 {
                self.remove_log(state, id);
            } else if !log.sealed {
                // Checked entry by entry when opened, up to its first invalid entry
                // (a write torn by a crash). Its magic is cleared first, so that once
                // sealed (headers only are read) it still ends the log.
                if log.write_at + 4 <= log.capacity {
                    log.file.write_all_at(&[0; 4], log.write_at)?;
                }
                seal(log)?;
                state.logs.get_mut(&id).unwrap().sealed = true;
            }
        }
        Ok(())
    }

    /// Starts preparing the next log in the background, unless one is ready or
    /// being made.
    fn prepare_spare(&self, state: &mut State) {
        if state.spare.is_some() || state.preparing {
            return;
        }
        state.preparing = true;
        let (id, capacity) = next_log(state, self.inner.segment_bytes, 0);
        let free = state.free.pop();
        let unused = free.clone();
        // Weak: a store dropped meanwhile (its write lock released) stays dropped.
        let inner = Arc::downgrade(&self.inner);
        let dir = self.inner.dir.clone();
        let spawned = std::thread::Builder::new()
            .name("picomq-wal-log".into())
            .spawn(move || {
                let made = make_log(&dir, id, capacity, free);
                let Some(inner) = inner.upgrade() else {
                    // The store is gone, its write lock with it: another store may
                    // be writing the directory now, and it decides which ids exist.
                    if let Ok(new) = made {
                        let _ = std::fs::remove_file(new.tmp);
                    }
                    return;
                };
                let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
                state.preparing = false;
                match made {
                    Ok(new) => state.spare = Some((id, capacity, new)),
                    Err(e) => tracing::warn!(error = %e, "preparing a WAL log file failed"),
                }
            });
        if spawned.is_err() {
            state.preparing = false;
            state.free.extend(unused);
        }
    }

    /// Writes `data` as `path` and syncs it. Blocking.
    fn put_blocking(&self, path: &Path, data: &[u8], mode: &PutMode) -> object_store::Result<Loc> {
        let key = path.as_ref();
        if key.len() > MAX_KEY {
            return Err(generic(format!("key longer than {MAX_KEY} bytes")));
        }
        let len = entry_len(key.len(), data.len() as u64);
        // Before the lock: the checksum of a large object takes a while.
        let data_crc = crc32c::crc32c(data);
        let mut state = self.writer_state()?;
        if matches!(mode, PutMode::Create)
            && (state.index.contains_key(path)
                || state.pending.contains(path)
                || state.legacy.contains_key(path))
        {
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "the object exists".into(),
            });
        }
        if LOG_HEADER + len > self.inner.segment_bytes || kept_forever(key, data) {
            // Too large for a log, or never deleted: a log file of its own.
            drop(state);
            return self.put_alone(path, data, data_crc, mode);
        }
        let id = loop {
            if let Some(id) = state.active {
                let log = &state.logs[&id];
                if log.write_at + len <= log.capacity {
                    break id;
                }
                self.retire(&mut state, id)?;
            }
            match state.spare.take() {
                Some((id, capacity, new)) => {
                    let (file, salt) = publish(&self.inner.dir, id, new).map_err(generic)?;
                    state.logs.insert(id, new_log(file, capacity, salt));
                    state.active = Some(id);
                    self.prepare_spare(&mut state);
                }
                None => {
                    // Nothing prepared (the first write, or writes outran the
                    // preparation): make one here.
                    let (id, capacity) = next_log(&mut state, self.inner.segment_bytes, len);
                    let free = state.free.pop();
                    let (file, salt) =
                        create_log(&self.inner.dir, id, capacity, free).map_err(generic)?;
                    state.logs.insert(id, new_log(file, capacity, salt));
                    state.active = Some(id);
                    self.prepare_spare(&mut state);
                }
            }
        };
        let written_ms = now_ms();
        let log = state.logs.get_mut(&id).unwrap();
        let head = encode_head(id, log.salt, key, data.len() as u64, data_crc, written_ms);
        let at = log.write_at;
        // Written under the lock, so entries reach the file in offset order and a
        // sync covers every entry before the one it follows.
        write_entry(&log.file, at, &head, data).map_err(generic)?;
        log.write_at += len;
        log.in_flight += 1;
        let file = log.file.clone();
        state.pending.insert(path.clone());
        drop(state);

        let synced = file.sync_data();
        let loc = Loc {
            log: id,
            entry_at: at,
            len: data.len() as u64,
            written_ms,
        };
        let mut state = self.state();
        state.pending.remove(path);
        let log = state.logs.get_mut(&id).unwrap();
        log.in_flight -= 1;
        if let Err(e) = synced {
            log.poisoned = true;
            if state.active == Some(id) {
                self.retire(&mut state, id)?;
            }
            return Err(generic(e));
        }
        log.live += 1;
        if log.retired && log.in_flight == 0 && !log.sealed && !log.poisoned {
            seal(log).map_err(generic)?;
            log.sealed = true;
        }
        if let Some(old) = state.index.insert(path.clone(), loc) {
            let file = self.delete_entry(&mut state, old)?;
            drop(state);
            file.sync_data().map_err(generic)?;
        }
        Ok(loc)
    }

    /// A log file holding one object.
    fn put_alone(
        &self,
        path: &Path,
        data: &[u8],
        data_crc: u32,
        mode: &PutMode,
    ) -> object_store::Result<Loc> {
        let key = path.as_ref();
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.pending.insert(path.clone());
        drop(state);
        let written_ms = now_ms();
        let capacity = LOG_HEADER + entry_len(key.len(), data.len() as u64);
        let made = create_log(&self.inner.dir, id, capacity, None).and_then(|(file, salt)| {
            let head = encode_head(id, Some(salt), key, data.len() as u64, data_crc, written_ms);
            write_entry(&file, LOG_HEADER, &head, data)?;
            file.sync_data()?;
            Ok((file, salt))
        });
        let mut state = self.state();
        state.pending.remove(path);
        let (file, salt) = made.map_err(generic)?;
        if matches!(mode, PutMode::Create) && state.index.contains_key(path) {
            drop(state);
            let _ = std::fs::remove_file(log_path(&self.inner.dir, id));
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "the object exists".into(),
            });
        }
        let mut log = new_log(file, capacity, salt);
        log.write_at = log.capacity;
        log.live = 1;
        log.retired = true;
        seal(&log).map_err(generic)?;
        log.sealed = true;
        state.logs.insert(id, log);
        let loc = Loc {
            log: id,
            entry_at: LOG_HEADER,
            len: data.len() as u64,
            written_ms,
        };
        if let Some(old) = state.index.insert(path.clone(), loc) {
            let file = self.delete_entry(&mut state, old)?;
            drop(state);
            file.sync_data().map_err(generic)?;
        }
        Ok(loc)
    }

    /// Stops writing log `id`; seals it if nothing is in flight on it.
    fn retire(&self, state: &mut State, id: u64) -> object_store::Result<()> {
        state.active = None;
        let log = state.logs.get_mut(&id).unwrap();
        log.retired = true;
        if log.in_flight == 0 && !log.sealed && !log.poisoned {
            seal(log).map_err(generic)?;
            log.sealed = true;
        }
        if log.live == 0 && log.in_flight == 0 {
            self.remove_log(state, id);
        }
        Ok(())
    }

    /// Marks `loc` deleted on disk and removes its log once nothing in it is live.
    /// Returns the log file, for the caller to sync once it has let go of the state
    /// (a sync under the lock would hold up every write). Blocking.
    fn delete_entry(&self, state: &mut State, loc: Loc) -> object_store::Result<Arc<File>> {
        let log = state.logs.get_mut(&loc.log).unwrap();
        log.file
            .write_all_at(&[DELETED], loc.entry_at + STATE_AT)
            .map_err(generic)?;
        log.live -= 1;
        let file = log.file.clone();
        if log.live == 0 && log.retired && log.in_flight == 0 {
            self.remove_log(state, loc.log);
        }
        Ok(file)
    }

    /// Lets go of emptied log `id`: kept as `{id}.free` to be made into a later log
    /// while fewer than [`FREE_MAX`] are, else removed. (Renamed without a directory
    /// sync: after a crash it may be back under its old name, empty, and is freed
    /// again.)
    fn remove_log(&self, state: &mut State, id: u64) {
        let Some(log) = state.logs.remove(&id) else {
            return;
        };
        let path = log_path(&self.inner.dir, id);
        if log.capacity == self.inner.segment_bytes && state.free.len() < FREE_MAX {
            let free = free_path(&self.inner.dir, id);
            match std::fs::rename(&path, &free) {
                Ok(()) => return state.free.push(free),
                Err(e) => tracing::warn!(error = %e, id, "keeping an emptied WAL log failed"),
            }
        }
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(error = %e, id, "removing an emptied WAL log file failed");
        }
    }

    /// Deletes `path` from the logs; `true` if it is (also) a legacy file, which the
    /// caller deletes through `legacy`.
    fn delete_blocking(&self, path: &Path) -> object_store::Result<bool> {
        let mut state = self.writer_state()?;
        let legacy = state.legacy.remove(path).is_some();
        let Some(loc) = state.index.remove(path) else {
            return Ok(legacy);
        };
        let file = self.delete_entry(&mut state, loc)?;
        drop(state);
        file.sync_data().map_err(generic)?;
        Ok(legacy)
    }

    fn read_blocking(
        &self,
        path: &Path,
        range: Option<Range<u64>>,
    ) -> Option<std::io::Result<(ObjectMeta, Range<u64>, Bytes)>> {
        let state = self.state();
        let loc = *state.index.get(path)?;
        let log = &state.logs[&loc.log];
        let (file, salt) = (log.file.clone(), log.salt);
        drop(state);
        let meta = Self::meta(path, &loc);
        let range = range.unwrap_or(0..loc.len);
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        let at = loc.data_at(path.as_ref().len()) + range.start;
        // The log may be emptied and made into a new one while this reads (a delete
        // that raced the read, or another process writing the directory this one
        // reads): the entry's header, read before and after its data, must be this
        // object's both times, or the object is gone.
        let mut read = || -> std::io::Result<Option<Bytes>> {
            let Some(before) = entry_head(&file, &loc, salt, path)? else {
                return Ok(None);
            };
            file.read_exact_at(&mut buf, at)?;
            let after = entry_head(&file, &loc, salt, path)?;
            Ok((after.as_ref() == Some(&before)).then(|| Bytes::from(std::mem::take(&mut buf))))
        };
        match read() {
            Ok(Some(data)) => Some(Ok((meta, range, data))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Objects under `prefix`, in key order: the logs', then legacy files not
    /// overwritten in a log.
    fn listed(&self, prefix: Option<&Path>) -> Vec<ObjectMeta> {
        let under = |k: &Path| prefix.is_none_or(|p| k.prefix_match(p).is_some());
        let state = self.state();
        let mut all: Vec<ObjectMeta> = state
            .index
            .iter()
            .filter(|(k, _)| under(k))
            .map(|(k, loc)| Self::meta(k, loc))
            .collect();
        all.extend(
            state
                .legacy
                .iter()
                .filter(|(k, _)| under(k) && !state.index.contains_key(*k))
                .map(|(_, meta)| meta.clone()),
        );
        all.sort_by(|a, b| a.location.cmp(&b.location));
        all
    }
}

/// The header and key of the entry at `loc` if it is `path`'s (state byte zeroed),
/// `None` if the bytes there are no longer that entry.
fn entry_head(
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

fn new_log(file: File, capacity: u64, salt: u64) -> Log {
    Log {
        file: Arc::new(file),
        capacity,
        salt: Some(salt),
        write_at: LOG_HEADER,
        live: 0,
        in_flight: 0,
        sealed: false,
        retired: false,
        poisoned: false,
    }
}

/// Id and size for the next log made, big enough for an entry of `need` bytes.
fn next_log(state: &mut State, segment_bytes: u64, need: u64) -> (u64, u64) {
    let id = state.next_id;
    state.next_id += 1;
    (id, segment_bytes.max(LOG_HEADER + need))
}

/// Marks a log sealed: every entry in it was whole when this was written.
fn seal(log: &Log) -> std::io::Result<()> {
    log.file.write_all_at(&[1], SEALED_AT)?;
    log.file.sync_data()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> object_store::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| object_store::Error::JoinError { source })?
}

#[async_trait]
impl ObjectStore for LocalLogStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if let PutMode::Update(_) = opts.mode {
            return Err(object_store::Error::NotImplemented {
                operation: "put with PutMode::Update".into(),
                implementer: STORE.into(),
            });
        }
        let this = self.clone();
        let path = location.clone();
        let loc = blocking(move || {
            let data: Bytes = payload.into();
            this.put_blocking(&path, &data, &opts.mode)
        })
        .await?;
        Ok(PutResult {
            e_tag: Self::meta(location, &loc).e_tag,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(object_store::Error::NotImplemented {
            operation: "multipart upload".into(),
            implementer: STORE.into(),
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let (meta, legacy) = {
            let state = self.state();
            (
                state
                    .index
                    .get(location)
                    .map(|loc| Self::meta(location, loc)),
                state.legacy.contains_key(location),
            )
        };
        let Some(meta) = meta else {
            if legacy {
                return self.inner.legacy.get_opts(location, options).await;
            }
            return Err(not_found(location));
        };
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(r) => {
                Some(
                    r.as_range(meta.size)
                        .map_err(|source| object_store::Error::Generic {
                            store: STORE,
                            source: Box::new(source),
                        })?,
                )
            }
            None => None,
        };
        let (meta, range, data) = if options.head {
            let range = range.unwrap_or(0..meta.size);
            (meta, range, Bytes::new())
        } else {
            let this = self.clone();
            let path = location.clone();
            blocking(move || match this.read_blocking(&path, range) {
                Some(r) => r.map_err(generic),
                None => Err(not_found(&path)),
            })
            .await?
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(data) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        locations
            .then(move |location| {
                let this = this.clone();
                async move {
                    let location = location?;
                    let path = location.clone();
                    let inner = this.clone();
                    let legacy = blocking(move || inner.delete_blocking(&path)).await?;
                    if legacy {
                        this.inner.legacy.delete(&location).await?;
                    }
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        stream::iter(self.listed(prefix).into_iter().map(Ok)).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let root = Path::default();
        let base = prefix.unwrap_or(&root);
        let mut common_prefixes = std::collections::BTreeSet::new();
        let mut objects = Vec::new();
        for meta in self.listed(prefix) {
            let nested = {
                let Some(mut parts) = meta.location.prefix_match(base) else {
                    continue;
                };
                let Some(first) = parts.next() else {
                    continue;
                };
                parts.next().is_some().then(|| base.clone().join(first))
            };
            match nested {
                Some(dir) => {
                    common_prefixes.insert(dir);
                }
                None => objects.push(meta),
            }
        }
        Ok(ListResult {
            common_prefixes: common_prefixes.into_iter().collect(),
            objects,
            extensions: Default::default(),
        })
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let data = self.get(from).await?.bytes().await?;
        let mode = match options.mode {
            CopyMode::Overwrite => PutMode::Overwrite,
            CopyMode::Create => PutMode::Create,
        };
        self.put_opts(to, data.into(), mode.into()).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::local::LocalFileSystem;

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!(
                "picomq-local-log-{tag}-{}-{}",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }

        fn open(&self, segment_bytes: u64) -> LocalLogStore {
            let legacy = Arc::new(LocalFileSystem::new_with_prefix(&self.0).unwrap());
            LocalLogStore::open_with(&self.0.join("wal-log"), legacy, &self.0, segment_bytes)
                .unwrap()
        }

        fn logs(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(self.0.join("wal-log"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".log"))
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn key(n: u64) -> Path {
        Path::from(format!("wal/0000000001/{n:012}.wal"))
    }

    fn body(n: u64, len: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|i| (n as usize + i) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    async fn keys(store: &LocalLogStore) -> Vec<String> {
        let mut k: Vec<String> = store
            .list(Some(&Path::from("wal")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        k.sort();
        k
    }

    #[tokio::test]
    async fn objects_round_trip_and_survive_reopening() {
        let dir = Dir::new("round-trip");
        let store = dir.open(4096);
        for n in 0..20 {
            store.put(&key(n), body(n, 700).into()).await.unwrap();
        }
        // Create-only: a taken key is refused, the object untouched.
        let err = store
            .put_opts(&key(3), body(99, 10).into(), PutMode::Create.into())
            .await
            .unwrap_err();
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err}"
        );
        assert_eq!(
            store.get(&key(3)).await.unwrap().bytes().await.unwrap(),
            body(3, 700)
        );
        assert_eq!(
            store.get_range(&key(4), 10..20).await.unwrap(),
            body(4, 700).slice(10..20)
        );
        assert_eq!(store.head(&key(5)).await.unwrap().size, 700);
        assert!(matches!(
            store.get(&key(77)).await.unwrap_err(),
            object_store::Error::NotFound { .. }
        ));
        // 4 KiB logs hold five 700-byte objects each.
        assert!(dir.logs().len() >= 4, "{:?}", dir.logs());
        for n in 0..5 {
            store.delete(&key(n)).await.unwrap();
        }
        assert_eq!(keys(&store).await.len(), 15);
        // Overwrite replaces.
        store.put(&key(9), body(1000, 33).into()).await.unwrap();
        drop(store);

        let store = dir.open(4096);
        let listed = keys(&store).await;
        assert_eq!(listed.len(), 15, "{listed:?}");
        assert!(!listed.contains(&key(0).to_string()));
        for n in 5..20 {
            let expect = if n == 9 { body(1000, 33) } else { body(n, 700) };
            assert_eq!(
                store.get(&key(n)).await.unwrap().bytes().await.unwrap(),
                expect
            );
        }
        // Deleting everything removes every log but the one being written.
        for n in 5..20 {
            store.delete(&key(n)).await.unwrap();
        }
        assert!(keys(&store).await.is_empty());
        assert!(dir.logs().len() <= 2, "{:?}", dir.logs());
        // An object larger than a log gets one of its own.
        store
            .put(&key(100), body(100, 10_000).into())
            .await
            .unwrap();
        drop(store);
        let store = dir.open(4096);
        assert_eq!(
            store.get(&key(100)).await.unwrap().bytes().await.unwrap(),
            body(100, 10_000)
        );
    }

    #[tokio::test]
    async fn a_torn_write_is_not_an_object_after_a_crash() {
        let dir = Dir::new("torn");
        let store = dir.open(1 << 20);
        for n in 0..3 {
            store.put(&key(n), body(n, 500).into()).await.unwrap();
        }
        let last = {
            let state = store.state();
            let loc = state.index[&key(2)];
            (
                log_path(&dir.0.join("wal-log"), loc.log),
                loc.data_at(key(2).as_ref().len()),
            )
        };
        // A crash mid-write: the last entry's header reached the disk, part of its
        // data did not (the process never synced it, so never acknowledged it).
        drop(store);
        let f = OpenOptions::new().write(true).open(&last.0).unwrap();
        f.write_all_at(&[0xFF; 100], last.1 + 300).unwrap();
        drop(f);

        let store = dir.open(1 << 20);
        assert_eq!(
            keys(&store).await,
            vec![key(0).to_string(), key(1).to_string()]
        );
        // The next write seals that log; reading it by headers alone later must still
        // end before the torn entry.
        store.put(&key(3), body(3, 500).into()).await.unwrap();
        drop(store);
        let store = dir.open(1 << 20);
        assert_eq!(
            keys(&store).await,
            vec![key(0).to_string(), key(1).to_string(), key(3).to_string()]
        );
        assert_eq!(
            store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
            body(1, 500)
        );
    }

    #[tokio::test]
    async fn one_process_writes_a_log_directory_others_read_it() {
        let dir = Dir::new("writer");
        let writer = dir.open(1 << 20);
        writer.put(&key(1), body(1, 100).into()).await.unwrap();
        let reader = dir.open(1 << 20);
        assert_eq!(keys(&reader).await, vec![key(1).to_string()]);
        let err = reader.put(&key(2), body(2, 100).into()).await.unwrap_err();
        assert!(err.to_string().contains("another process"), "{err}");
        // Written after the reader read the directory.
        writer.put(&key(3), body(3, 100).into()).await.unwrap();
        drop(writer);
        // The reader may write now, and reads the directory afresh first: it keeps
        // the writer's last object and writes after it.
        reader.put(&key(4), body(4, 100).into()).await.unwrap();
        assert_eq!(
            keys(&reader).await,
            vec![key(1).to_string(), key(3).to_string(), key(4).to_string()]
        );
        drop(reader);
        let again = dir.open(1 << 20);
        assert_eq!(
            again.get(&key(3)).await.unwrap().bytes().await.unwrap(),
            body(3, 100)
        );
        assert_eq!(
            again.get(&key(4)).await.unwrap().bytes().await.unwrap(),
            body(4, 100)
        );
    }

    /// Random puts, creates, deletes and reopenings, some of them concurrent, against
    /// a model: the store holds exactly what the model says, before and after every
    /// reopening, across log rollovers and removals.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn behaves_like_a_map_through_random_operations_and_reopenings() {
        let dir = Dir::new("model");
        let mut rng = fastrand::Rng::with_seed(7);
        let mut model: BTreeMap<String, Bytes> = BTreeMap::new();
        let mut store = dir.open(16 << 10);
        for round in 0..40 {
            // A burst of concurrent creates of fresh keys (what the WAL does).
            let fresh: Vec<u64> = (0..rng.usize(1..8))
                .map(|i| 1_000 * round + i as u64)
                .collect();
            let writes = fresh.iter().map(|&n| {
                let store = store.clone();
                let data = body(n, rng.usize(0..3_000));
                async move {
                    store
                        .put_opts(&key(n), data.clone().into(), PutMode::Create.into())
                        .await
                        .map(|_| (key(n).to_string(), data))
                }
            });
            for written in futures::future::join_all(writes).await {
                let (k, data) = written.unwrap();
                model.insert(k, data);
            }
            // Deletes and overwrites of random existing keys.
            for _ in 0..rng.usize(0..6) {
                let Some(k) = model.keys().nth(rng.usize(0..model.len().max(1))).cloned() else {
                    break;
                };
                if rng.bool() {
                    store.delete(&Path::from(k.as_str())).await.unwrap();
                    model.remove(&k);
                } else {
                    let data = body(rng.u64(..), rng.usize(0..2_000));
                    store
                        .put(&Path::from(k.as_str()), data.clone().into())
                        .await
                        .unwrap();
                    model.insert(k, data);
                }
            }
            if rng.usize(0..4) == 0 {
                drop(store);
                store = dir.open(16 << 10);
            }
            assert_eq!(
                keys(&store).await,
                model.keys().cloned().collect::<Vec<_>>()
            );
            for (k, data) in &model {
                let got = store.get(&Path::from(k.as_str())).await.unwrap();
                assert_eq!(&got.bytes().await.unwrap(), data, "{k}");
            }
        }
        // Logs whose objects are all gone were removed: what is left holds the model.
        let live: u64 = model.values().map(|d| d.len() as u64 + 100).sum();
        let on_disk: u64 = dir
            .logs()
            .iter()
            .map(|n| {
                std::fs::metadata(dir.0.join("wal-log").join(n))
                    .unwrap()
                    .len()
            })
            .sum();
        assert!(
            on_disk <= live * 4 + (64 << 10),
            "{on_disk} bytes of logs for {live} live"
        );
    }

    fn inode(path: &FsPath) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    /// Epoch claims and seals, never deleted, get logs of their own: a shared log
    /// they landed in would never empty, and would keep its deleted objects' bytes.
    #[tokio::test]
    async fn claims_and_seals_never_pin_a_shared_log() {
        let dir = Dir::new("pinned");
        let store = dir.open(4096);
        let claim = Path::from("epochs/0000000002");
        let seal = key(1000);
        let seal_body = [&crate::wal::format::SEAL_MAGIC[..], b"sealed"].concat();
        store.put(&key(0), body(0, 700).into()).await.unwrap();
        store
            .put(&claim, Bytes::from_static(b"claim").into())
            .await
            .unwrap();
        store.put(&seal, seal_body.clone().into()).await.unwrap();
        // Enough to retire the first log (five 700-byte objects fill 4 KiB).
        for n in 1..10 {
            store.put(&key(n), body(n, 700).into()).await.unwrap();
        }
        let shared = store.state().index[&key(0)].log;
        for kept in [&claim, &seal] {
            let log = store.state().index[kept].log;
            assert_ne!(log, shared, "{kept} is in the shared log");
        }
        // Emptied, the shared log goes (to be reused).
        for n in 0..10 {
            if store.state().index[&key(n)].log == shared {
                store.delete(&key(n)).await.unwrap();
            }
        }
        let logs = dir.0.join("wal-log");
        assert!(!log_path(&logs, shared).exists(), "{:?}", dir.logs());
        drop(store);
        let store = dir.open(4096);
        assert_eq!(
            store.get(&claim).await.unwrap().bytes().await.unwrap(),
            Bytes::from_static(b"claim")
        );
        assert_eq!(
            store.get(&seal).await.unwrap().bytes().await.unwrap(),
            seal_body
        );
    }

    /// Emptied logs become new ones; what they held never comes back, in the process
    /// that reused them, after reopening, or in a reader that had them open.
    #[tokio::test]
    async fn emptied_logs_are_reused_and_their_old_objects_stay_gone() {
        let dir = Dir::new("reuse");
        let logs = dir.0.join("wal-log");
        let writer = dir.open(4096);
        // 4 KiB logs hold five 700-byte objects each: 0..5 fill the first log.
        for n in 0..12 {
            writer.put(&key(n), body(n, 700).into()).await.unwrap();
        }
        let first = writer.state().index[&key(0)].log;
        let first_inode = inode(&log_path(&logs, first));
        let reader = dir.open(4096);
        for n in 0..5 {
            writer.delete(&key(n)).await.unwrap();
        }
        assert!(free_path(&logs, first).exists(), "{:?}", dir.logs());
        assert!(!log_path(&logs, first).exists());
        for n in 100..130 {
            writer.put(&key(n), body(n, 700).into()).await.unwrap();
        }
        let reused = dir
            .logs()
            .iter()
            .any(|name| inode(&logs.join(name)) == first_inode);
        assert!(reused, "the emptied log was not reused: {:?}", dir.logs());
        // The reader still maps key 0 into that file, which now holds other objects.
        assert!(
            matches!(
                reader.get(&key(0)).await.unwrap_err(),
                object_store::Error::NotFound { .. }
            ),
            "a reader returned bytes of a reused log"
        );
        assert_eq!(
            reader.get(&key(7)).await.unwrap().bytes().await.unwrap(),
            body(7, 700)
        );
        let live: Vec<u64> = (5..12).chain(100..130).collect();
        drop(reader);
        drop(writer);
        let store = dir.open(4096);
        let mut expect: Vec<String> = live.iter().map(|&n| key(n).to_string()).collect();
        expect.sort();
        assert_eq!(keys(&store).await, expect);
        for &n in &live {
            assert_eq!(
                store.get(&key(n)).await.unwrap().bytes().await.unwrap(),
                body(n, 700)
            );
        }
        // At most FREE_MAX emptied logs are kept.
        for &n in &live {
            store.delete(&key(n)).await.unwrap();
        }
        let free = std::fs::read_dir(&logs)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".free")
            })
            .count();
        assert!((1..=FREE_MAX).contains(&free), "{free} free logs");
    }

    /// A log's salt is in every entry's checksum, so bytes left from an earlier use of
    /// the file, or written as data by a client, never read as an entry of the log,
    /// even with its id.
    #[test]
    fn an_entry_without_its_logs_salt_ends_the_log() {
        let dir = Dir::new("salt");
        let logs = dir.0.join("wal-log");
        std::fs::create_dir_all(&logs).unwrap();
        let (file, salt) = create_log(&logs, 5, 4096, None).unwrap();
        let k = key(1);
        let data = body(1, 100);
        for (entry_salt, found) in [(None, 0), (Some(salt ^ 1), 0), (Some(salt), 1)] {
            let head = encode_head(5, entry_salt, k.as_ref(), 100, crc32c::crc32c(&data), 0);
            write_entry(&file, LOG_HEADER, &head, &data).unwrap();
            let scanned = scan(&file, 5).unwrap().unwrap();
            assert_eq!(scanned.entries.len(), found, "salt {entry_salt:?}");
        }
    }

    /// Logs of format 1 (no salt) from the version before reuse open and read as
    /// before, and are reused like any other once emptied.
    #[tokio::test]
    async fn logs_of_format_1_stay_readable() {
        let dir = Dir::new("format-1");
        let logs = dir.0.join("wal-log");
        std::fs::create_dir_all(&logs).unwrap();
        let file = File::create_new(log_path(&logs, 1)).unwrap();
        let mut head = vec![0u8; LOG_HEADER as usize];
        head[..8].copy_from_slice(LOG_MAGIC_V1);
        head[8..16].copy_from_slice(&1u64.to_le_bytes());
        file.write_all_at(&head, 0).unwrap();
        file.set_len(4096).unwrap();
        let mut at = LOG_HEADER;
        for n in 0..3 {
            let data = body(n, 500);
            let k = key(n);
            let entry = encode_head(1, None, k.as_ref(), 500, crc32c::crc32c(&data), 0);
            write_entry(&file, at, &entry, &data).unwrap();
            at += entry_len(k.as_ref().len(), 500);
        }
        drop(file);
        let store = dir.open(4096);
        assert_eq!(
            keys(&store).await,
            (0..3).map(|n| key(n).to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
            body(1, 500)
        );
        store.put(&key(9), body(9, 500).into()).await.unwrap();
        for n in 0..3 {
            store.delete(&key(n)).await.unwrap();
        }
        assert!(free_path(&logs, 1).exists(), "{:?}", dir.logs());
        drop(store);
        let store = dir.open(4096);
        assert_eq!(keys(&store).await, vec![key(9).to_string()]);
    }

    #[tokio::test]
    async fn wal_files_of_earlier_versions_stay_readable() {
        let dir = Dir::new("legacy");
        let files = LocalFileSystem::new_with_prefix(&dir.0).unwrap();
        files.put(&key(1), body(1, 50).into()).await.unwrap();
        let store = dir.open(1 << 20);
        store.put(&key(2), body(2, 50).into()).await.unwrap();
        assert_eq!(
            keys(&store).await,
            vec![key(1).to_string(), key(2).to_string()]
        );
        assert_eq!(
            store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
            body(1, 50)
        );
        let err = store
            .put_opts(&key(1), body(9, 5).into(), PutMode::Create.into())
            .await
            .unwrap_err();
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err}"
        );
        store.delete(&key(1)).await.unwrap();
        assert_eq!(keys(&store).await, vec![key(2).to_string()]);
        drop(store);
        let store = dir.open(1 << 20);
        assert_eq!(keys(&store).await, vec![key(2).to_string()]);
        assert!(!dir.0.join(key(1).as_ref()).exists());
    }
}
