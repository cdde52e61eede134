//! A run directory held open while its run writes into it, so that what became of its
//! path is known before each write that names it (checkpoints, weights, the summary):
//! moved (`mv` within a file system), the run goes on where it now is; removed, or moved
//! to another file system, the run stops rather than create a new, empty directory at
//! the old path. (It did: a checkpoint's `create_dir_all` rebuilt a skeleton, which the
//! run then called completed while its metrics had gone to the removed file.) Knows
//! nothing of what is in the directory.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directory, open, with the path it was opened at.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    /// Held for `/proc/self/fd`, which names where the directory is now.
    file: File,
    /// Its device and inode: what makes a path name this directory.
    id: (u64, u64),
}

impl RunDir {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Self::held(path, File::open(path)?)
    }

    /// What `file`, opened at `path`, is: a file followed the same way (a lock in a run
    /// directory that may be moved).
    pub fn held(path: &Path, file: File) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(RunDir {
            path: path.to_path_buf(),
            file,
            id: (meta.dev(), meta.ino()),
        })
    }

    /// The path it was opened at.
    pub fn opened_at(&self) -> &Path {
        &self.path
    }

    /// Where the directory is now: its path, or where it was moved to. `Err` (in words)
    /// when no path leads to it any more.
    pub fn now(&self) -> Result<PathBuf, String> {
        if self.is_at(&self.path) {
            return Ok(self.path.clone());
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let fd = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            if let Ok(now) = std::fs::read_link(fd) {
                if self.is_at(&now) {
                    return Ok(now);
                }
            }
        }
        Err(format!(
            "the run directory {} was removed while the run ran (or moved to another file system, or replaced): the run stops, as what it would write next has nowhere to go",
            self.path.display()
        ))
    }

    fn is_at(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_a_move_and_says_when_it_was_removed() {
        let root = crate::scratch::Scratch::new("rundir");
        let a = root.join("a");
        std::fs::create_dir_all(&a).unwrap();
        let held = RunDir::open(&a).unwrap();
        assert_eq!(held.now().unwrap(), a);
        let b = root.join("b");
        std::fs::rename(&a, &b).unwrap();
        assert_eq!(held.now().unwrap(), b);
        // A new directory at the old path is not this one.
        std::fs::create_dir(&a).unwrap();
        assert_eq!(held.now().unwrap(), b);
        std::fs::remove_dir(&b).unwrap();
        let err = held.now().unwrap_err();
        assert!(err.contains("was removed"), "{err}");
    }
}
