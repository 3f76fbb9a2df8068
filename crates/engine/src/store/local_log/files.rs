//! Log files: making, recycling and publishing them, locking the directory, and
//! loading what is there when the store opens.

use super::*;

pub(super) fn log_path(dir: &FsPath, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.log"))
}

pub(super) fn free_path(dir: &FsPath, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.free"))
}

pub(super) fn sync_dir(dir: &FsPath) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A log being made, written and synced under a temporary name of its own.
pub(super) struct NewLog {
    pub(super) tmp: PathBuf,
    pub(super) file: File,
    pub(super) salt: u64,
}

/// Makes log `id`, `capacity` bytes long, synced, under a temporary name unique to
/// this call (two processes, or a store and the one reopened after it, may make the
/// same id at once). From `free`, an emptied log of that size, when given and still
/// there: only its header is rewritten (the new id and salt end it before its old
/// entries). Otherwise a new sparse file, its blocks allocated as it is written.
pub(super) fn make_log(
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
pub(super) fn recycle(
    free: &FsPath,
    tmp: &FsPath,
    capacity: u64,
    head: &[u8],
) -> std::io::Result<File> {
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
pub(super) fn publish(dir: &FsPath, id: u64, new: NewLog) -> std::io::Result<(File, u64)> {
    std::fs::rename(&new.tmp, log_path(dir, id))?;
    sync_dir(dir)?;
    Ok((new.file, new.salt))
}

/// Makes and names log `id`; the caller is the directory's writer.
pub(super) fn create_log(
    dir: &FsPath,
    id: u64,
    capacity: u64,
    free: Option<PathBuf>,
) -> std::io::Result<(File, u64)> {
    publish(dir, id, make_log(dir, id, capacity, free)?)
}

impl State {
    pub(super) fn empty() -> State {
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
pub(super) fn legacy_files(root: &FsPath) -> std::io::Result<BTreeMap<Path, ObjectMeta>> {
    let mut found = BTreeMap::new();
    let roots = [crate::layout::WAL, crate::layout::CLAIMS]
        .iter()
        .map(|p| root.join(p))
        .collect();
    crate::store::walk_files(roots, |entry| {
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
pub(super) fn try_lock(dir: &FsPath) -> std::io::Result<Option<File>> {
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
pub(super) fn load(dir: &FsPath, legacy_root: &FsPath) -> std::io::Result<State> {
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

pub(super) fn new_log(file: File, capacity: u64, salt: u64) -> Log {
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
pub(super) fn next_log(state: &mut State, segment_bytes: u64, need: u64) -> (u64, u64) {
    let id = state.next_id;
    state.next_id += 1;
    (id, segment_bytes.max(LOG_HEADER + need))
}

/// Marks a log sealed: every entry in it was whole when this was written.
pub(super) fn seal(log: &Log) -> std::io::Result<()> {
    log.file.write_all_at(&[1], SEALED_AT)?;
    log.file.sync_data()
}
