//! The CIFAR-10 binary format: records of 1 label byte + 3,072 pixel bytes (32×32, planar
//! R, G, B planes, each row-major), no header. Owns reading and checking those files;
//! knows nothing of batching or tensors.

use std::path::{Path, PathBuf};

use super::{DataError, Images};

pub const SIDE: usize = 32;
pub const CHANNELS: usize = 3;
pub const PIXELS: usize = CHANNELS * SIDE * SIDE;
pub const RECORD: usize = 1 + PIXELS;

/// Records in a file, from its size alone; a partial last record is an error that names
/// the byte offset where it starts.
pub fn count_records(path: &Path) -> Result<usize, DataError> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    if meta.is_dir() {
        return Err(
            DataError::new(path, "is a directory, not a file of CIFAR-10 records")
                .help("remove or rename it, or point at the .bin files it holds"),
        );
    }
    // A pipe, socket or device has no length to count by (a pipe was said to be empty).
    if !meta.is_file() {
        let kind = crate::recipe::odd_kind(path).unwrap_or("not a regular file");
        return Err(
            DataError::new(path, format!("is {kind}, not a file of CIFAR-10 records"))
                .help("remove or rename it, or point at a regular .bin file"),
        );
    }
    let len = meta.len() as usize;
    check_whole(path, len)?;
    Ok(len / RECORD)
}

fn check_whole(path: &Path, len: usize) -> Result<(), DataError> {
    if len == 0 {
        return Err(DataError::new(path, "is empty: no CIFAR-10 records")
            .help("point at a data_batch_*.bin or test_batch.bin file"));
    }
    if !len.is_multiple_of(RECORD) {
        // Text is no CIFAR-10 file cut short: cutting it to whole records (the help
        // below) would make records of its characters.
        if let Some(what) = looks_like_text(path) {
            return Err(DataError::new(
                path,
                format!("is {what}, not CIFAR-10 binary records ({len} bytes)"),
            )
            .help("name a CIFAR-10 .bin file (data_batch_*.bin, test_batch.bin); text data is format = \"jsonl\""));
        }
        let whole = len / RECORD;
        let offset = whole * RECORD;
        return Err(DataError::new(
            path,
            format!(
                "is truncated: {len} bytes is not a whole number of {RECORD}-byte records; \
                 record {whole} starts at byte offset {offset} and has only {} of its {RECORD} bytes",
                len - offset
            ),
        )
        .help(if whole == 0 {
            "the file is shorter than one record: download it again".to_string()
        } else {
            format!(
                "download the file again, or cut it to {offset} bytes to keep the {whole} whole records"
            )
        }));
    }
    Ok(())
}

/// What a file is, where its start reads as text: JSON Lines, or other text (CIFAR-10
/// records are pixel bytes, with NULs and bytes past 127 all through).
fn looks_like_text(path: &Path) -> Option<&'static str> {
    use std::io::Read;
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = &head[..n];
    let text = std::str::from_utf8(head)
        .or_else(|e| match e.error_len() {
            // Cut inside a character at the end of the read.
            None => std::str::from_utf8(&head[..e.valid_up_to()]),
            Some(_) => Err(e),
        })
        .ok()?;
    // Mostly printable: pixel bytes below 128 (a dark image) are control characters.
    let control = text
        .chars()
        .filter(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        .count();
    if text.is_empty() || control * 100 > text.len() {
        return None;
    }
    Some(match text.trim_start().starts_with('{') {
        true => "text (JSON Lines, it seems)",
        false => "text",
    })
}

/// Record `i` holds a label over the class count.
fn bad_label(path: &Path, i: usize, label: u8, classes: usize) -> DataError {
    DataError::new(
        path,
        format!(
            "record {i} (byte offset {}) has label {label}, but {}",
            i * RECORD,
            super::there_are_classes(classes)
        ),
    )
    .help(if path.with_file_name("batches.meta.txt").is_file() {
        "check the file is CIFAR-10 binary; fix it, or raise model.num_classes (or add the class to batches.meta.txt)"
    } else {
        "check the file is CIFAR-10 binary; fix it, or raise model.num_classes (or name the classes in batches.meta.txt beside the file, one a line)"
    })
}

/// What [`check_labels`] found in a file: each record's label, in order, and how many
/// records at its end are zero bytes only (black images of class 0: what a file
/// allocated ahead, or a copy cut short and padded, holds past what was written).
#[derive(Debug, Clone, Default)]
pub struct Labels {
    pub labels: Vec<u8>,
    pub blank_tail: usize,
}

/// Checks every record's label byte against `classes` without keeping the pixels (what
/// validation can afford: one pass over the file, a record at a time), and keeps the
/// file's sum (`sums`).
pub fn check_labels(path: &Path, classes: usize) -> Result<Labels, DataError> {
    use std::io::Read;
    let file = super::sums::Summing::open(path).map_err(|e| DataError::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut rec = vec![0u8; RECORD];
    let mut i = 0usize;
    let mut found = Labels::default();
    loop {
        match reader.read_exact(&mut rec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                // Read to its end: env.json's sum of the file needs no pass of its own.
                reader
                    .into_inner()
                    .finish()
                    .map_err(|e| DataError::io(path, e))?;
                return Ok(found);
            }
            Err(e) => return Err(DataError::io(path, e)),
        }
        found.labels.push(rec[0]);
        found.blank_tail = match rec.iter().all(|&b| b == 0) {
            true => found.blank_tail + 1,
            false => 0,
        };
        if rec[0] as usize >= classes {
            // Read on, for how many more records are bad.
            let first = bad_label(path, i, rec[0], classes);
            let mut more = super::MoreBad::default();
            loop {
                i += 1;
                match reader.read_exact(&mut rec) {
                    Ok(()) if rec[0] as usize >= classes => more.add(i),
                    Ok(()) => {}
                    Err(_) => return Err(more.said_after(first, "record")),
                }
            }
        }
        i += 1;
    }
}

/// Class names from `batches.meta.txt` beside the file (one per line), if it is there.
pub fn class_names(path: &Path) -> Result<Option<Vec<String>>, DataError> {
    super::names_beside(path, "batches.meta.txt")
}

/// Reads the first `limit` records of the files, in order, checking each label. Only
/// those are held: a file is read record by record (read whole, a 180 GB file with
/// `data.limit = 300` aborted the process allocating 180 GB), the rest of it passing
/// through its sum for env.json unless this process summed the file as it is already
/// (the labels' check reads it whole before a run).
pub fn read(files: &[PathBuf], limit: usize, classes: usize) -> Result<Images, DataError> {
    use std::io::Read;
    // Reserved up to what the files hold (a `limit` of usize::MAX is "all").
    let records: usize = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| usize::try_from(m.len()).unwrap_or(usize::MAX) / RECORD)
        .fold(0, usize::saturating_add);
    let held = limit.min(records);
    let mut pixels = Vec::with_capacity(held.saturating_mul(PIXELS));
    let mut labels = Vec::with_capacity(held);
    let mut rec = vec![0u8; RECORD];
    for path in files {
        if labels.len() >= limit {
            break;
        }
        let io = |e| DataError::io(path, e);
        let len = std::fs::metadata(path).map_err(io)?.len();
        check_whole(path, usize::try_from(len).unwrap_or(usize::MAX))?;
        let mut reader = std::io::BufReader::with_capacity(
            1 << 20,
            super::sums::Summing::open(path).map_err(io)?,
        );
        let mut i = 0usize;
        while labels.len() < limit {
            match reader.read_exact(&mut rec) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(io(e)),
            }
            let label = rec[0];
            if label as usize >= classes {
                let mut more = super::MoreBad::default();
                let mut j = i + 1;
                while reader.read_exact(&mut rec).is_ok() {
                    if rec[0] as usize >= classes {
                        more.add(j);
                    }
                    j += 1;
                }
                return Err(more.said_after(bad_label(path, i, label, classes), "record"));
            }
            labels.push(label as u32);
            pixels.extend_from_slice(&rec[1..]);
            i += 1;
        }
        if super::sums::recorded(path).is_none() {
            std::io::copy(&mut reader, &mut std::io::sink()).map_err(io)?;
            reader.into_inner().finish().map_err(io)?;
        }
    }
    Ok(Images {
        channels: CHANNELS,
        height: SIDE,
        width: SIDE,
        pixels,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `name` holding `bytes`, in a scratch directory of its own that goes with the test.
    fn write(name: &str, bytes: &[u8]) -> (crate::scratch::Scratch, PathBuf) {
        let dir = crate::scratch::Scratch::new(&format!("cifar-{name}"));
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        (dir, p)
    }

    #[test]
    fn reads_planar_records() {
        let mut rec = vec![7u8];
        rec.extend((0..PIXELS).map(|i| (i / 1024) as u8 * 100 + (i % 3) as u8));
        let (_dir, p) = write("one.bin", &rec);
        let img = read(&[p], 10, 10).unwrap();
        assert_eq!(img.labels, vec![7]);
        assert_eq!(img.pixels[0], 0);
        assert_eq!(img.pixels[1024], 101); // first G pixel: plane 1, index 1024 % 3 = 1
        assert_eq!(img.pixels[2048], 202);
    }

    #[test]
    fn truncation_names_the_offset() {
        let (_dir, p) = write("short.bin", &vec![1u8; RECORD * 2 + 100]);
        let e = count_records(&p).unwrap_err().to_string();
        assert!(
            e.contains("record 2 starts at byte offset 6146 and has only 100 of its 3073 bytes"),
            "{e}"
        );
    }

    /// A directory named like a batch file is not read as 4096 truncated bytes.
    #[test]
    fn a_directory_is_not_a_truncated_file() {
        let (_dir, p) = write("x.bin", b"");
        let p = p.with_file_name("data_batch_2.bin");
        std::fs::create_dir_all(&p).unwrap();
        let e = count_records(&p).unwrap_err().to_string();
        assert!(e.contains("is a directory, not a file"), "{e}");
    }

    /// Nor a named pipe as an empty file (nor is it opened, which would wait for ever).
    #[test]
    fn a_named_pipe_is_said_as_one() {
        let (_dir, p) = write("y.bin", b"");
        let p = p.with_file_name("data_batch_3.bin");
        let _ = std::fs::remove_file(&p);
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = count_records(&p).unwrap_err().to_string();
        assert!(
            e.contains("is a named pipe, not a file of CIFAR-10 records"),
            "{e}"
        );
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_bad_label_says_how_many_more_records_are_bad() {
        let mut bytes = vec![0u8; RECORD * 10];
        for i in [3, 4, 8] {
            bytes[RECORD * i] = 10;
        }
        let (_dir, p) = write("labels3.bin", &bytes);
        let e = check_labels(&p, 10).unwrap_err().to_string();
        assert!(
            e.contains("record 3 (byte offset 9219) has label 10"),
            "{e}"
        );
        assert!(e.ends_with(" (and 2 more bad records: 4, 8)"), "{e}");
        let e = read(&[p], 10, 10).unwrap_err().to_string();
        assert!(e.ends_with(" (and 2 more bad records: 4, 8)"), "{e}");
    }

    #[test]
    fn bad_label_names_record_and_offset() {
        let mut bytes = vec![0u8; RECORD * 2];
        bytes[RECORD] = 12;
        let (_dir, p) = write("label.bin", &bytes);
        let e = read(&[p], 10, 10).unwrap_err().to_string();
        assert!(
            e.contains("record 1 (byte offset 3073) has label 12"),
            "{e}"
        );
    }
}
