//! Unit tests' scratch directories: one per test and process under the system's temporary
//! directory, emptied when made and removed when the test ends (also when it fails), so a
//! test run leaves nothing behind in `/tmp`.

use std::path::{Path, PathBuf};

/// `<tmp>/runner-<tag>-<pid>`, new and empty; removed with everything in it on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("runner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // A test may leave a folder read-only (a fault it provokes); make it removable.
        #[cfg(unix)]
        if std::fs::remove_dir_all(&self.0).is_err() {
            open_up(&self.0);
            let _ = std::fs::remove_dir_all(&self.0);
        }
        #[cfg(not(unix))]
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every folder under `dir` readable and writable again (a test may have taken that away).
#[cfg(unix)]
fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            open_up(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scratch_directory_is_gone_after_its_test() {
        let kept;
        {
            let s = super::Scratch::new("scratch-self");
            std::fs::create_dir_all(s.join("a/b")).unwrap();
            std::fs::write(s.join("a/b/c"), b"x").unwrap();
            kept = s.path().to_path_buf();
            assert!(kept.join("a/b/c").is_file());
        }
        assert!(!kept.exists(), "{} left behind", kept.display());
    }
}
