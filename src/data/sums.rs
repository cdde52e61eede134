//! The size and CRC-32 of each data file as this process read it, so that `env.json`
//! (and `runner resume`'s check that the data is the same) needs no pass of its own over
//! files the checks and the load have just read. A sum counts only while the file is the
//! one that was read: same path, size, modification time and inode; otherwise it is read
//! again.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// A file's size in bytes and CRC-32 (8 hex digits): what env.json keeps of each data
/// file, and a checkpoint's `state.json` of each of its files (enough to find a file cut
/// short or changed by accident, not to tell a forged one).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub crc32: String,
}

/// A file's size and CRC-32, read through once (nothing kept).
pub fn file_sum(path: &Path) -> std::io::Result<FileSum> {
    let mut f = std::fs::File::open(path)?;
    let mut hash = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    let crc32 = format!("{:08x}", hash.finalize());
    Ok(FileSum { bytes, crc32 })
}

/// What tells one version of a file from another without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Identity {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        }
    }
}

type Entry = (PathBuf, Identity, FileSum);

static READ: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn key(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Keeps the sum of `path`, read as `identity` (the open file's metadata, taken before
/// the read: a file changed while it was read then no longer matches, and is read again).
fn keep(path: &Path, identity: Identity, bytes: u64, crc: u32) {
    if identity.len != bytes {
        return; // it grew or shrank while it was read
    }
    let path = key(path);
    let sum = FileSum {
        bytes,
        crc32: format!("{crc:08x}"),
    };
    let mut read = READ.lock().unwrap_or_else(|p| p.into_inner());
    read.retain(|(p, _, _)| *p != path);
    read.push((path, identity, sum));
}

/// The whole of `path` (as `std::fs::read`), its sum kept; an error if the file changed
/// while it was read (its size or modification time then is not what it was at the
/// start): what was read is then no version of the file (a file cut while a run loaded
/// it was said "not a whole number of records" of a size it never had, and advised cut to
/// a size that lost its data).
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let identity = Identity::of(&file.metadata()?);
    // A file larger than memory is an error, not an abort allocating it.
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(identity.len as usize)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    file.read_to_end(&mut bytes)?;
    unchanged(&file, &identity, bytes.len() as u64)?;
    keep(path, identity, bytes.len() as u64, crc32fast::hash(&bytes));
    Ok(bytes)
}

/// An error if `file`, `read` bytes of it read whole, is not as it was when opened.
fn unchanged(file: &std::fs::File, identity: &Identity, read: u64) -> std::io::Result<()> {
    let now = Identity::of(&file.metadata()?);
    if read == identity.len && now == *identity {
        return Ok(());
    }
    Err(std::io::Error::other(Changed(format!(
        "changed while it was read ({} bytes when opened, {read} read, {} now)",
        identity.len, now.len
    ))))
}

/// A file that changed while it was read (`DataError::io` says it in its own words).
#[derive(Debug)]
pub struct Changed(pub String);

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Changed {}

/// A reader of `path` that sums what passes through it; [`Summing::finish`] keeps the
/// sum once the file has been read to its end.
pub struct Summing {
    path: PathBuf,
    file: std::fs::File,
    identity: Identity,
    hash: crc32fast::Hasher,
    bytes: u64,
}

impl Summing {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let identity = Identity::of(&file.metadata()?);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            identity,
            hash: crc32fast::Hasher::new(),
            bytes: 0,
        })
    }

    /// Keeps the sum: call only when the reads reached the end of the file. An error if
    /// the file changed while it was read (see [`read`]).
    pub fn finish(self) -> std::io::Result<()> {
        unchanged(&self.file, &self.identity, self.bytes)?;
        keep(&self.path, self.identity, self.bytes, self.hash.finalize());
        Ok(())
    }
}

impl Read for Summing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The sum of `path` as this process last read it whole, whatever is there now: what a
/// run trained on, for env.json (a file cut after the load was recorded by the sum of
/// the cut file, and `runner resume` then took that file for the run's data).
pub fn loaded(path: &Path) -> Option<FileSum> {
    let path = key(path);
    let read = READ.lock().unwrap_or_else(|p| p.into_inner());
    read.iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, _, sum)| sum.clone())
}

/// The sum of `path` as this process read it, if the file there is still the one read.
pub fn recorded(path: &Path) -> Option<FileSum> {
    let identity = Identity::of(&std::fs::metadata(path).ok()?);
    let path = key(path);
    let read = READ.lock().unwrap_or_else(|p| p.into_inner());
    read.iter()
        .find(|(p, id, _)| *p == path && *id == identity)
        .map(|(_, _, sum)| sum.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_file_is_summed_until_it_changes() {
        let dir = crate::scratch::Scratch::new("sums-a");
        let p = dir.join("a.bin");
        std::fs::write(&p, b"123456789").unwrap();
        assert_eq!(recorded(&p), None, "nothing read yet");
        assert_eq!(read(&p).unwrap(), b"123456789");
        let sum = recorded(&p).unwrap();
        assert_eq!(sum.bytes, 9);
        // CRC-32's standard check value.
        assert_eq!(sum.crc32, "cbf43926");
        // Another file put in its place: a new inode, though the size is the same.
        let q = dir.join("a.bin.new");
        std::fs::write(&q, b"987654321").unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert_eq!(recorded(&p), None, "the file was replaced");
        // What was read is still what was loaded.
        assert_eq!(loaded(&p).map(|s| s.crc32).as_deref(), Some("cbf43926"));
    }

    #[test]
    fn a_file_cut_while_it_is_read_is_an_error() {
        let dir = crate::scratch::Scratch::new("sums-c");
        let p = dir.join("c.bin");
        std::fs::write(&p, vec![1u8; 10_000]).unwrap();
        let mut r = Summing::open(&p).unwrap();
        let mut some = vec![0u8; 4_000];
        r.read_exact(&mut some).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(6_000)
            .unwrap();
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        let e = r.finish().unwrap_err().to_string();
        assert!(
            e.contains("changed while it was read (10000 bytes when opened, 6000 read, 6000 now)"),
            "{e}"
        );
        assert_eq!(loaded(&p), None);
    }

    #[test]
    fn a_streamed_file_is_summed_only_when_read_to_its_end() {
        let dir = crate::scratch::Scratch::new("sums-b");
        let p = dir.join("b.bin");
        std::fs::write(&p, vec![7u8; 10_000]).unwrap();
        let mut r = Summing::open(&p).unwrap();
        let mut half = vec![0u8; 5_000];
        r.read_exact(&mut half).unwrap();
        assert!(r.finish().is_err(), "half a file is no read of it");
        assert_eq!(recorded(&p), None, "half a file is no sum of it");
        let mut r = Summing::open(&p).unwrap();
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        r.finish().unwrap();
        let want = format!("{:08x}", crc32fast::hash(&[7u8; 10_000]));
        assert_eq!(recorded(&p).map(|s| s.crc32), Some(want));
    }
}
