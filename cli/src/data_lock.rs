//! One `switchyard up` per data dir: an exclusive `flock(2)` on `<data_dir>/switchyard.lock`,
//! held for the life of the process (the kernel drops it when the process dies, even on
//! `kill -9`), with the holder's pid written in the file so a refused start can name it.

use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data dir.
pub const LOCK_FILE: &str = "switchyard.lock";

/// A held lock; released when dropped (or when the process exits).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
    path: PathBuf,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "data dir {dir} is in use by another `switchyard up` (pid {pid}); stop it first, or pass \
         another --data-dir"
    )]
    Busy {
        /// The data dir.
        dir: String,
        /// The holder's pid as written in the lock file (`unknown` if unreadable).
        pid: String,
    },
    /// Opening or writing the lock file failed.
    #[error("locking {path}: {source}")]
    Io {
        /// The lock file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

impl DataDirLock {
    /// Takes the lock on `dir` (created if missing) without waiting, and writes this process's
    /// pid into it. Errors: [`LockError::Busy`] naming the holder's pid, or [`LockError::Io`].
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Busy {
                    dir: dir.display().to_string(),
                    pid: if pid.is_empty() { "unknown" } else { pid }.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = tempfile::tempdir().unwrap();
        let held = DataDirLock::acquire(dir.path()).unwrap();
        let me = std::process::id();
        assert_eq!(
            std::fs::read_to_string(held.path()).unwrap(),
            format!("{me}\n")
        );
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "data dir {} is in use by another `switchyard up` (pid {me}); stop it first, or \
                 pass another --data-dir",
                dir.path().display()
            )
        );
        drop(held);
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
