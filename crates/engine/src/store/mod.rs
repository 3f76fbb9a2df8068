//! Object-store backends by URL. Everything durable goes through `object_store`;
//! this module only decides which backend a URL means and how it is configured.

use std::path::Path;
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::ObjectStore;

use crate::error::{EngineError, Result};

pub mod fault;

/// Opens the object store named by `url`:
/// - `file:///abs/path`: a local directory; every write is fsynced (file and
///   directory) before it returns, so an acknowledged append survives power loss.
/// - `memory://`: in-process, for tests and demos; nothing survives a restart.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>> {
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(EngineError::bad_request(format!(
                "store URL {url:?}: file:// needs an absolute path, e.g. file:///var/lib/picomq"
            )));
        }
        return open_dir(Path::new(path));
    }
    if url == "memory://" || url == "memory:" || url == "memory:///" {
        return Ok(Arc::new(InMemory::new()));
    }
    let scheme = url.split("://").next().unwrap_or(url);
    Err(EngineError::bad_request(format!(
        "store URL {url:?}: unsupported scheme {scheme:?} (supported: file:///path, memory://)"
    )))
}

/// A durable local-directory store rooted at `dir` (created if missing).
pub fn open_dir(dir: &Path) -> Result<Arc<dyn ObjectStore>> {
    std::fs::create_dir_all(dir).map_err(|e| {
        EngineError::Unavailable(format!(
            "cannot create store directory {}: {e}",
            dir.display()
        ))
    })?;
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| EngineError::Unavailable(format!("cannot open {}: {e}", dir.display())))?
        .with_fsync(true);
    Ok(Arc::new(fs))
}
