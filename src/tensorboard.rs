//! TensorBoard event files, written without TensorFlow: each record is a TFRecord (length,
//! masked CRC-32C of the length, data, masked CRC-32C of the data) holding an `Event`
//! protocol buffer, encoded here by hand (the few fields TensorBoard's scalar view reads:
//! `wall_time`, `step`, `file_version`, `summary.value{tag, simple_value}`, and
//! `session_log` to discard steps a resumed run redoes). Owns the format only; which
//! scalars are written is the run's business.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli), the checksum TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TFRecord's masked CRC.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(((field << 3) | 2) as u64, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// One `Event` message.
fn event(wall_time: f64, step: Option<i64>, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = vec![0x09];
    e.extend_from_slice(&wall_time.to_le_bytes());
    if let Some(s) = step {
        e.push(0x10);
        varint(s as u64, &mut e);
    }
    body(&mut e);
    e
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An event file being written.
pub struct EventWriter {
    file: File,
    path: PathBuf,
    /// The bytes of the whole records written: a record cut by a failed write (a full
    /// disk) is undone to here, so no later record follows half of one (TensorBoard stops
    /// reading a file at a record that fails its checksum).
    len: u64,
}

impl EventWriter {
    /// Creates `events.out.tfevents.<time>.<host>` in `dir` (a new file each time: a
    /// resumed run adds one, which TensorBoard reads together with the first).
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        let host = crate::clock::hostname().unwrap_or_else(|| "localhost".into());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}",
            now() as u64,
            std::process::id()
        ));
        let file = File::create(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let mut w = Self { file, path, len: 0 };
        match w.record(&event(now(), None, |e| field_bytes(3, b"brain.Event:2", e))) {
            Ok(()) => Ok(w),
            Err(e) => {
                // No empty events file left behind (each process writes its own).
                let _ = std::fs::remove_file(&w.path);
                Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", w.path.display()),
                ))
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut buf = Vec::with_capacity(data.len() + 16);
        buf.extend_from_slice(&len);
        buf.extend_from_slice(&masked_crc(&len).to_le_bytes());
        buf.extend_from_slice(data);
        buf.extend_from_slice(&masked_crc(data).to_le_bytes());
        let _writing = crate::metrics::writing();
        match self.file.write_all(&buf).and_then(|()| self.file.flush()) {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                use std::io::{Seek, SeekFrom};
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
                Err(e)
            }
        }
    }

    /// Scalars at one step, as one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let mut summary = vec![];
        // A NaN or infinite loss is written as such (TensorBoard shows it): dropped, a
        // diverged run's curve simply ended early, and its evaluation loss was missing.
        for (tag, v) in values {
            let mut value = vec![];
            field_bytes(1, tag.as_bytes(), &mut value);
            value.push(0x15);
            value.extend_from_slice(&(*v as f32).to_le_bytes());
            field_bytes(1, &value, &mut summary);
        }
        self.record(&event(now(), Some(step as i64), |e| {
            field_bytes(5, &summary, e)
        }))
    }

    /// A resume after the checkpoint of `step`: `SessionLog START` (Event field 7, its
    /// status 1) at `step + 1`, the first step the resumed run does again. TensorBoard drops what
    /// earlier files said at that step and past it (it keeps the events of steps before a
    /// START's), so the steps redone after a kill -9 show once. (Field 6 is the deprecated
    /// `log_message`, which TensorBoard reads and ignores: every redone step showed twice.)
    pub fn restart_at(&mut self, step: u64) -> std::io::Result<()> {
        self.record(&event(now(), Some(step as i64 + 1), |e| {
            field_bytes(7, &[0x08, 0x01], e)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The CRC-32C of "123456789" is 0xE3069283 (RFC 3720, B.4).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }
}
