//! The data directory's lock: one `picomq serve` at a time per `--data-dir`. An
//! exclusive `flock` on `picomq.lock`, taken before anything in the directory is
//! opened and held until the node ends (the OS releases it when a process dies, even
//! by `kill -9`). The holder writes its pid into the file, so a second server can
//! say whom it found there.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "picomq.lock";

/// Held while the node runs; dropping it releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    pub path: PathBuf,
}

/// Takes the lock of `dir` (creating it), or says at once which process holds it.
pub fn lock(dir: &Path) -> Result<DataDirLock, String> {
    let shown = dir.display();
    std::fs::create_dir_all(dir).map_err(|e| format!("--data-dir {shown}: {e}"))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("--data-dir {shown}: {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut held_by = String::new();
            let _ = file.read_to_string(&mut held_by);
            let held_by = match held_by.trim() {
                "" => "another process".to_string(),
                pid => format!("another process (pid {pid})"),
            };
            return Err(format!(
                "--data-dir {shown} is in use by {held_by}: one picomq serve at a time per data directory; stop that one, or give this one another --data-dir"
            ));
        }
        Err(TryLockError::Error(e)) => {
            return Err(format!(
                "--data-dir {shown}: locking {}: {e}",
                path.display()
            ))
        }
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    written.map_err(|e| format!("--data-dir {shown}: {}: {e}", path.display()))?;
    Ok(DataDirLock { _file: file, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = std::env::temp_dir().join(format!("picomq-lock-test-{}", std::process::id()));
        let held = lock(&dir).expect("first lock");
        let err = lock(&dir).expect_err("second lock refused");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert!(err.contains(&dir.display().to_string()), "{err}");
        drop(held);
        lock(&dir).expect("free again once the first is dropped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
