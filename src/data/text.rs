//! Text data: JSONL files (one object per line; a bad line is an error naming the file and
//! line), the tokenizers (a word vocabulary built from the training split, or UTF-8 bytes),
//! and `TextSet`, the token ids the loader batches. Knows nothing of padding (`pad`).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::DataError;
use crate::recipe::TokenizerKind;

/// Token ids (each sequence already cut to the maximum length, never empty) and labels.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TextSet {
    pub seqs: Vec<Vec<u32>>,
    pub labels: Vec<u32>,
}

impl TextSet {
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    pub fn lengths(&self) -> Vec<usize> {
        self.seqs.iter().map(Vec::len).collect()
    }
}

/// What validation needs of a JSONL file: its rows and the labels they use, and for the
/// memory pre-flight the longest text in tokens and the words a vocabulary could hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Scan {
    pub rows: usize,
    pub labels: BTreeSet<u32>,
    /// The most tokens of one text (before any cut to `max_length`; an empty text is one):
    /// words as [`words`] splits them, and UTF-8 bytes.
    pub longest_words: usize,
    pub longest_bytes: usize,
    /// How many times each distinct word of the file occurs, the most first: a word
    /// vocabulary built from it holds those at `min_freq` or more, at most `max_vocab`.
    pub word_freqs: Vec<usize>,
    /// Each text's length in words and in bytes (as `longest_*`), in the file's order: how
    /// many a `max_length` cuts, of the first `data.limit`.
    pub word_lengths: Vec<u32>,
    pub byte_lengths: Vec<u32>,
    /// The texts (0-based, in file order) with no word (empty, or only white space) and
    /// with no byte (empty): each is one unknown token to its tokenizer.
    pub no_words: Vec<usize>,
    pub no_bytes: Vec<usize>,
}

impl Scan {
    /// Of the first `first` texts: how many are longer than `max_length` tokens of the
    /// tokenizer `kind` (cut to it), and the most tokens of one. (Counted over the whole
    /// file, a run of `data.limit = 10` was warned of 58 cuts.)
    pub fn longer_than(
        &self,
        kind: TokenizerKind,
        max_length: usize,
        first: usize,
    ) -> (usize, usize) {
        let lengths = match kind {
            TokenizerKind::Word => &self.word_lengths,
            TokenizerKind::Byte => &self.byte_lengths,
        };
        let max = u32::try_from(max_length).unwrap_or(u32::MAX);
        let used = &lengths[..first.min(lengths.len())];
        let cut = used.iter().filter(|&&l| l > max).count();
        (cut, used.iter().copied().max().unwrap_or(1) as usize)
    }
}

/// [`read_jsonl`]'s checks, keeping only the counts. Remembered for the life of the
/// process per file (path, size, modification time) and reading (fields, classes): a grid
/// validates every cell against the same files, and each cell would otherwise parse them
/// all again before its run loads them. Errors are not remembered.
/// Texts are counted as the tokenizer sees them: lower-cased first when `lowercase`.
pub fn scan_jsonl(
    path: &Path,
    text_field: &str,
    label_field: &str,
    classes: Option<usize>,
    lowercase: bool,
) -> Result<Scan, DataError> {
    type Key = (
        PathBuf,
        u64,
        Option<SystemTime>,
        String,
        String,
        Option<usize>,
        bool,
    );
    static SEEN: Mutex<Vec<(Key, Scan)>> = Mutex::new(Vec::new());
    let meta = std::fs::metadata(path).ok();
    let key: Key = (
        path.to_path_buf(),
        meta.as_ref().map_or(0, |m| m.len()),
        meta.as_ref().and_then(|m| m.modified().ok()),
        text_field.to_string(),
        label_field.to_string(),
        classes,
        lowercase,
    );
    let seen = |k: &Key| {
        let cache = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, s)| s.clone())
    };
    if let Some(scan) = meta.as_ref().and(seen(&key)) {
        return Ok(scan);
    }
    let rows = read_jsonl(path, text_field, label_field, classes, usize::MAX)?;
    let mut seen_words: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let (mut longest_words, mut longest_bytes) = (1, 1);
    let mut word_lengths = Vec::with_capacity(rows.len());
    let mut byte_lengths = Vec::with_capacity(rows.len());
    let (mut no_words, mut no_bytes) = (vec![], vec![]);
    for (row, (text, _)) in rows.iter().enumerate() {
        let cased = cased(text, lowercase);
        let t = &*cased;
        longest_bytes = longest_bytes.max(t.len());
        let mut n = 0;
        for w in words(t) {
            n += 1;
            match seen_words.get_mut(w) {
                Some(k) => *k += 1,
                None => {
                    seen_words.insert(w.to_string(), 1);
                }
            }
        }
        if n == 0 {
            no_words.push(row);
        }
        if t.is_empty() {
            no_bytes.push(row);
        }
        longest_words = longest_words.max(n);
        // An empty text is one (unknown) token.
        word_lengths.push(n.max(1) as u32);
        byte_lengths.push(t.len().max(1) as u32);
    }
    let scan = Scan {
        rows: rows.len(),
        labels: rows.iter().map(|(_, l)| *l).collect(),
        longest_words,
        longest_bytes,
        word_freqs: most_first(seen_words),
        word_lengths,
        byte_lengths,
        no_words,
        no_bytes,
    };
    SEEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key, scan.clone()));
    Ok(scan)
}

/// `text` lower-cased where the tokenizer lower-cases.
fn cased(text: &str, lowercase: bool) -> std::borrow::Cow<'_, str> {
    match lowercase {
        true => text.to_lowercase().into(),
        false => text.into(),
    }
}

/// How many times each distinct word of `texts` (as the word tokenizer splits them)
/// occurs, the most first: what a vocabulary built from them can hold.
pub fn word_counts<'a>(texts: impl Iterator<Item = &'a str>, lowercase: bool) -> Vec<usize> {
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for text in texts {
        for w in words(&cased(text, lowercase)) {
            *counts.entry(w.to_string()).or_default() += 1;
        }
    }
    most_first(counts)
}

fn most_first(counts: std::collections::HashMap<String, usize>) -> Vec<usize> {
    let mut freqs: Vec<usize> = counts.into_values().collect();
    freqs.sort_unstable_by(|a, b| b.cmp(a));
    freqs
}

/// The words a vocabulary keeps ([`Tokenizer::build_word`]) of words occurring `freqs`
/// times (the most first): those seen `min_freq` times or more, at most `max_vocab`.
pub fn kept_words(freqs: &[usize], min_freq: usize, max_vocab: usize) -> usize {
    freqs.partition_point(|&n| n >= min_freq).min(max_vocab)
}

/// Reads `(text, label)` pairs. Blank lines are skipped; anything else that is not an object
/// with a string `text_field` and an integer `label_field` in `0..classes` is an error.
pub fn read_jsonl(
    path: &Path,
    text_field: &str,
    label_field: &str,
    classes: Option<usize>,
    limit: usize,
) -> Result<Vec<(String, u32)>, DataError> {
    // Zero bytes only (a file allocated and never written, a disk image) are no text:
    // said from the file's start, before gigabytes of zeros are read.
    let zeros = || {
        DataError::new(path, "starts with zero bytes only (its first 4 KiB, or all of it, if less): it is no text file").help(
            "check the file (was it written whole?): JSON Lines are UTF-8 text, one object a line",
        )
    };
    if all_zeros(&head_of(path).map_err(|e| DataError::io(path, e))?) {
        return Err(zeros());
    }
    let bytes = super::sums::read(path).map_err(|e| DataError::io(path, e))?;
    // Zeros after the text: what a download or copy cut short into a file allocated
    // ahead leaves (it read as UTF-16, as a line that is not JSON, or, cut inside a
    // character, as text that is not UTF-8).
    let written = bytes.len() - bytes.iter().rev().take_while(|&&b| b == 0).count();
    // Where the whole lines before `end` end: what `truncate -s` keeps of them.
    let whole_lines = |end: usize| {
        bytes[..end]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |i| i + 1)
    };
    if bytes.len() - written >= 8 {
        let line = 1 + bytes[..written].iter().filter(|&&b| b == b'\n').count();
        let keep = whole_lines(written);
        let cut = match keep == written {
            true => String::new(),
            false => format!(" (line {line} is cut short before them)"),
        };
        return Err(DataError::new(
            path,
            format!(
                "line {line}: zero bytes from byte offset {written} to the end of the file ({} bytes){cut}: it was not written whole (a copy or download cut short, or a file allocated ahead)",
                bytes.len() - written
            ),
        )
        .help(format!(
            "write the file again; or keep its whole lines, before the zeros: truncate -s {keep} FILE"
        )));
    }
    // A file that ends inside a character was cut short there (a copy or download that
    // stopped), not written in another encoding.
    if let Err(e) = std::str::from_utf8(&bytes) {
        if e.error_len().is_none() {
            let line = 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            let keep = whole_lines(bytes.len());
            return Err(DataError::new(
                path,
                format!(
                    "line {line}: the file ends inside a character (byte offset {}): it was cut short",
                    bytes.len()
                ),
            )
            .help(format!(
                "write the file again; or keep its whole lines: truncate -s {keep} FILE"
            )));
        }
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
        let b = e.as_bytes();
        let head = &b[..b.len().min(4096)];
        // UTF-16 is said as the file's encoding, not as its lines (with a byte-order mark,
        // or of text that is not ASCII, it was "line 1 is not UTF-8, and 19 more").
        if head.starts_with(&[0xff, 0xfe]) || head.starts_with(&[0xfe, 0xff]) || utf16_zeros(head)
        {
            return DataError::new(path, "is UTF-16 text, not UTF-8").help(UTF16_HELP);
        }
        // gzip starts 1f 8b: neither it nor UTF-16 is a CIFAR-10 file.
        let help = if head.starts_with(&[0x1f, 0x8b]) {
            "this is a gzip file: decompress it (gunzip -k FILE) and name the .jsonl"
        } else if head.contains(&0) {
            "this looks like a binary file: is it a CIFAR-10 .bin given as format = \"jsonl\"?"
        } else {
            "JSON Lines are UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8)"
        };
        // Where in its line, as the JSON errors say it; and the other such lines counted.
        let line_start = b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        let mut more = super::MoreBad::default();
        let rest = b[at..].iter().position(|&c| c == b'\n').map_or(b.len(), |i| at + i + 1);
        for (k, l) in b[rest..].split(|&c| c == b'\n').enumerate() {
            if std::str::from_utf8(l).is_err() {
                more.add(line + 1 + k);
            }
        }
        more.said_after(
            DataError::new(
                path,
                format!(
                    "line {line} is not UTF-8 text (byte 0x{:02x}, at byte {} of the line; file offset {at})",
                    b[at],
                    at - line_start + 1
                ),
            ),
            "line",
        )
        .help(help)
    })?;
    // UTF-16 without a byte-order mark is valid UTF-8 where it is ASCII (a NUL beside every
    // character), and failed as JSON on every line: said as what it is.
    let head = &text.as_bytes()[..text.len().min(4096)];
    if all_zeros(head) {
        return Err(zeros());
    }
    if utf16_zeros(head) {
        return Err(DataError::new(path, "is UTF-16 text, not UTF-8").help(UTF16_HELP));
    }

    // A byte-order mark (some editors write one) is not part of the first object.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // Lines ended by a carriage return alone (classic Mac OS) read as one long line, and
    // serde's "trailing characters at column 37" did not say why.
    // (Mostly so: a file whose last line alone ends in a newline read so too.)
    // Only a CR after an object's end counts: inside a line it is JSON's whitespace.
    let bare_cr = text
        .trim_end()
        .match_indices('\r')
        .filter(|(i, _)| !text[i + 1..].starts_with('\n') && text[..*i].ends_with('}'))
        .count();
    if bare_cr > 0 && bare_cr >= text.matches('\n').count() {
        return Err(DataError::new(
            path,
            "ends its lines with a carriage return alone (CR, as classic Mac OS did), so it reads as one line",
        )
        .help("convert the line ends: tr '\\r' '\\n' < FILE > FILE.jsonl"));
    }
    let fields = (text_field, label_field);
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if out.len() >= limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let at = |msg: String| DataError::new(path, format!("line {}: {msg}", i + 1));
        match parse_line(line, fields, classes, at) {
            Ok(row) => out.push(row),
            Err(first) => {
                // The rest of the file is read too, for how many more lines are bad.
                let mut more = super::MoreBad::default();
                for (j, line) in text.lines().enumerate().skip(i + 1) {
                    let at = |msg: String| DataError::new(path, msg);
                    if !line.trim().is_empty() && parse_line(line, fields, classes, at).is_err() {
                        more.add(j + 1);
                    }
                }
                return Err(more.said_after(first, "line"));
            }
        }
    }
    if out.is_empty() && limit > 0 {
        // A test file like this turned evaluation off in silence, the run exiting 0.
        return Err(
            DataError::new(path, "holds no records: it is empty, or only blank lines").help(
                format!(
                    "point at a JSON Lines file of one {{\"{text_field}\": ..., \"{label_field}\": ...}} object per line"
                ),
            ),
        );
    }
    Ok(out)
}

/// A JSON object's entries in the order written, repeated keys kept.
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Entries, A::Error> {
                let mut out = vec![];
                while let Some(entry) = m.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One line's `(text, label)`; `at` makes an error that names the file and line.
fn parse_line(
    line: &str,
    (text_field, label_field): (&str, &str),
    classes: Option<usize>,
    at: impl Fn(String) -> DataError,
) -> Result<(String, u32), DataError> {
    // Values echoed in messages are cut: a bad line can be megabytes long.
    let short = |v: &serde_json::Value| {
        let s = v.to_string();
        match s.char_indices().nth(60) {
            Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
            None => s,
        }
    };
    let Ok(Entries(entries)) = serde_json::from_str::<Entries>(line) else {
        // Not an object: say whether it is JSON at all.
        return Err(match serde_json::from_str::<serde_json::Value>(line) {
            // A mark is accepted at the file's start only (files joined with `cat` keep each
            // one's); it read as "expected value at line 1 column 1" of the file's line 2.
            Err(_) if line.starts_with('\u{feff}') => at("starts with a byte-order mark (U+FEFF), which only the file's first line may have".into())
                .help("remove it (files joined with `cat` keep each one's mark: `sed -i '2,$ s/^\\xEF\\xBB\\xBF//' FILE`)"),
            // Its place in the line, not serde's "line 1" of the one line it was given.
            Err(e) => {
                let whole = e.to_string();
                let what = whole
                    .strip_suffix(&format!(" at line {} column {}", e.line(), e.column()))
                    .unwrap_or(&whole);
                let t = line.trim();
                // A JSON document given as JSON Lines: an array, or pretty-printed objects
                // (each line a piece of one).
                let help = if t.starts_with('[') {
                    "this looks like a JSON array, not JSON Lines (one object a line): convert it (jq -c '.[]' FILE > FILE.jsonl)"
                } else if t == "{" || t.ends_with([',', '{', '[']) {
                    "this looks like an object spread over several lines (pretty-printed JSON): JSON Lines hold one object a line; convert it (jq -c . FILE > FILE.jsonl)"
                } else {
                    "each line must be one JSON object, e.g. {\"label\": 1, \"text\": \"...\"}"
                };
                at(format!("not JSON at byte {} of the line ({what})", e.column())).help(help)
            }
            Ok(serde_json::Value::Array(_)) => at("not a JSON object, but an array".into()).help(
                "JSON Lines hold one object a line; a JSON array of objects converts with jq -c '.[]' FILE > FILE.jsonl",
            ),
            Ok(_) => at("not a JSON object".into()).help("each line must be one JSON object"),
        });
    };
    // serde_json's map would keep the last of two equal keys, in silence.
    for field in [text_field, label_field] {
        if entries.iter().filter(|(k, _)| k == field).count() > 1 {
            return Err(at(format!("field \"{field}\" is given more than once"))
                .help("keep one value per field: which one is meant cannot be told"));
        }
    }
    let obj: serde_json::Map<String, serde_json::Value> = entries.into_iter().collect();
    // At most 10 names of at most 60 characters each: a one-line JSON object of 100,000
    // keys (a dict given as data) made a message of a megabyte.
    let fields = || {
        let name = |k: &String| match k.char_indices().nth(60) {
            Some((at, _)) => format!("\"{}…\" ({} bytes)", &k[..at], k.len()),
            None => format!("\"{k}\""),
        };
        let mut said = obj.keys().take(10).map(name).collect::<Vec<_>>();
        if obj.len() > 10 {
            said.push(format!("and {} more", obj.len() - 10));
        }
        said.join(", ")
    };
    let t = match obj.get(text_field) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(at(format!(
                "field \"{text_field}\" is {}, not a string",
                short(other)
            ))
            .help("set data.text_field to the field holding the text"))
        }
        None => {
            return Err(at(format!(
                "no field \"{text_field}\" (the line has {})",
                fields()
            ))
            .help("set data.text_field to the field holding the text"))
        }
    };
    let label = match obj.get(label_field) {
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some_and(|l| l <= u32::MAX as u64) => {
            n.as_u64().unwrap_or(0) as u32
        }
        // A whole number past u32 is a class index no model can have.
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => {
            return Err(
                at(format!("label {n} is too large for a class index")).help(format!(
                    "labels are class indices 0, 1, ..., at most {} (the cap on classes)",
                    super::MAX_CLASSES - 1
                )),
            )
        }
        // As written in the line: serde_json reads an integer past u64 as a float, and
        // "99999999999999999999999" was said as "1e+23", "-0" as "-0.0".
        Some(other) => {
            let written = label_text(line, label_field).unwrap_or_else(|| short(other));
            // A whole number past u64 (serde_json reads it as a float): too large, not wrong.
            if let serde_json::Value::Number(n) = other {
                if n.as_f64()
                    .is_some_and(|f| f > u32::MAX as f64 && f.fract() == 0.0)
                {
                    return Err(
                        at(format!("label {written} is too large for a class index")).help(
                            format!(
                            "labels are class indices 0, 1, ..., at most {} (the cap on classes)",
                            super::MAX_CLASSES - 1
                        ),
                        ),
                    );
                }
            }
            // What kind of value it is says what to do about it.
            let help = match other {
                serde_json::Value::String(s) if s.trim().parse::<u32>().is_ok() => format!(
                    "labels are class indices 0, 1, ... written as numbers: write {} without quotes (jq -c '.{label_field} |= tonumber' FILE)",
                    s.trim()
                ),
                serde_json::Value::String(_) => format!(
                    "labels are class indices 0, 1, ...: map each class name to its index (the names, one a line in that order, go in labels.txt beside the file); or is \"{label_field}\" the text, and data.label_field another field?"
                ),
                serde_json::Value::Number(n) if n.as_f64().is_some_and(|f| (0.0..=u32::MAX as f64).contains(&f) && f.fract() == 0.0) => {
                    format!("labels are class indices 0, 1, ... written as integers: write {} without its fraction", n.as_f64().unwrap_or(0.0) as u64)
                }
                _ => "labels are class indices 0, 1, ...".to_string(),
            };
            return Err(at(format!("label {written} is not a non-negative integer")).help(help));
        }
        None => {
            return Err(at(format!(
                "no field \"{label_field}\" (the line has {})",
                fields()
            ))
            .help("set data.label_field to the field holding the label"))
        }
    };
    if classes.is_none() && label as usize >= super::MAX_CLASSES {
        return Err(at(format!(
            "label {label} would make {} classes, over the cap of {}",
            label as u64 + 1,
            super::MAX_CLASSES
        ))
        .help("labels are class indices 0, 1, ...: fix the line"));
    }
    if let Some(c) = classes {
        if label as usize >= c {
            return Err(at(format!(
                "label {label} is out of range: {}",
                super::there_are_classes(c)
            ))
            .help("fix the line, or raise model.num_classes (or add the class to labels.txt)"));
        }
    }
    Ok((t, label))
}

const UTF16_HELP: &str = "this looks like UTF-16 text (what Windows PowerShell 5 and Notepad's \"Unicode\" write): convert it (iconv -f utf-16 -t utf-8 FILE > FILE8)";

/// The first 4 KiB of `path` (less where it is shorter).
fn head_of(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)?
        .take(4096)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// Eight bytes or more, all zero.
fn all_zeros(head: &[u8]) -> bool {
    head.len() >= 8 && head.iter().all(|&b| b == 0)
}

/// Whether `head` has a zero byte beside (nearly) every other byte, and the others
/// (nearly) all not zero: UTF-16 (Windows PowerShell 5's `>`, Notepad's "Unicode") of
/// mostly ASCII text. (Zeros at both, as text followed by a file's unwritten end, are not.)
fn utf16_zeros(head: &[u8]) -> bool {
    let zeros_at = |odd: usize| {
        head.iter()
            .skip(odd)
            .step_by(2)
            .filter(|&&x| x == 0)
            .count()
    };
    let half = head.len() / 2;
    let mostly = |n: usize| n * 4 >= half * 3;
    let few = |n: usize| n * 4 <= half;
    head.len() >= 8
        && ((mostly(zeros_at(0)) && few(zeros_at(1))) || (mostly(zeros_at(1)) && few(zeros_at(0))))
}

/// The label's value as the line writes it, where it is a plain number (`"label": -0`):
/// the text after the top-level key `field` up to the next `,` or `}`, at most 60
/// characters. Only the object's own keys count (a `"label"` in a nested object, or inside
/// a string, is not it).
fn label_text(line: &str, field: &str) -> Option<String> {
    let key = serde_json::to_string(field).ok()?;
    let bytes = line.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // A string: the key itself where it stands at depth 1, else skipped whole.
                if depth == 1 && line[i..].starts_with(&key) {
                    let after = line[i + key.len()..].trim_start();
                    if let Some(value) = after.strip_prefix(':') {
                        let value = value.trim_start();
                        let end = value.find([',', '}']).unwrap_or(value.len());
                        let v = value[..end].trim_end();
                        let number = !v.is_empty()
                            && v.len() <= 60
                            && v.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c));
                        return number.then(|| v.to_string());
                    }
                }
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Class names from `labels.txt` beside the file (one per line), if it is there.
pub fn class_names(path: &Path) -> Result<Option<Vec<String>>, DataError> {
    super::names_beside(path, "labels.txt")
}

/// Turns text into token ids. Saved as `tokenizer.json` in the run directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tokenizer {
    pub kind: TokenizerKind,
    pub lowercase: bool,
    pub pad_id: u32,
    pub unk_id: u32,
    /// `word`: the token of each id (`<pad>`, `<unk>` at their ids). `byte`: empty.
    pub vocab: Vec<String>,
    /// `byte`: the id of each byte value.
    pub byte_ids: Vec<u32>,
    #[serde(skip)]
    index: HashMap<String, u32>,
}

/// Letters and digits form words; every other non-space character is a token of its own.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        let mut chars = rest.char_indices();
        let (_, first) = chars.next()?;
        let end = if first.is_alphanumeric() {
            chars
                .find(|(_, c)| !c.is_alphanumeric())
                .map_or(rest.len(), |(i, _)| i)
        } else {
            first.len_utf8()
        };
        let (w, r) = rest.split_at(end);
        rest = r;
        Some(w)
    })
}

/// Ids `0, 1, 2, ...` skipping the reserved ones.
fn free_ids(reserved: [u32; 2]) -> impl Iterator<Item = u32> {
    (0u32..).filter(move |i| !reserved.contains(i))
}

impl Tokenizer {
    /// A word vocabulary of the texts: the `max_vocab` most frequent words seen at least
    /// `min_freq` times (ties broken by first appearance), plus padding and unknown.
    pub fn build_word(
        texts: &[&str],
        max_vocab: usize,
        min_freq: usize,
        lowercase: bool,
        pad_id: u32,
    ) -> Self {
        let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
        let mut order = 0;
        for t in texts {
            let t = if lowercase {
                t.to_lowercase()
            } else {
                t.to_string()
            };
            for w in words(&t) {
                let e = counts.entry(w.to_string()).or_insert_with(|| {
                    order += 1;
                    (0, order)
                });
                e.0 += 1;
            }
        }
        let mut kept: Vec<(String, (usize, usize))> = counts
            .into_iter()
            .filter(|(_, (n, _))| *n >= min_freq)
            .collect();
        kept.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
        kept.truncate(max_vocab);
        let unk_id = if pad_id == 0 { 1 } else { 0 };
        let mut vocab = vec![String::new(); kept.len() + 2];
        let size = vocab.len().max(pad_id as usize + 1);
        vocab.resize(size, String::new());
        vocab[pad_id as usize] = "<pad>".into();
        vocab[unk_id as usize] = "<unk>".into();
        for ((w, _), id) in kept.into_iter().zip(free_ids([pad_id, unk_id])) {
            vocab[id as usize] = w;
        }
        let mut t = Self {
            kind: TokenizerKind::Word,
            lowercase,
            pad_id,
            unk_id,
            vocab,
            byte_ids: vec![],
            index: HashMap::new(),
        };
        t.reindex();
        t
    }

    /// UTF-8 bytes, each its own id; nothing to learn.
    pub fn byte(lowercase: bool, pad_id: u32) -> Self {
        let unk_id = if pad_id == 0 { 1 } else { 0 };
        let byte_ids: Vec<u32> = free_ids([pad_id, unk_id]).take(256).collect();
        Self {
            kind: TokenizerKind::Byte,
            lowercase,
            pad_id,
            unk_id,
            vocab: vec![],
            byte_ids,
            index: HashMap::new(),
        }
    }

    fn reindex(&mut self) {
        self.index = self
            .vocab
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.is_empty())
            .map(|(i, w)| (w.clone(), i as u32))
            .collect();
    }

    /// Rows the embedding table needs.
    pub fn vocab_size(&self) -> usize {
        match self.kind {
            TokenizerKind::Word => self.vocab.len(),
            TokenizerKind::Byte => self
                .byte_ids
                .iter()
                .max()
                .map_or(0, |m| *m as usize + 1)
                .max(self.pad_id as usize + 1),
        }
    }

    /// Token ids of `text`, cut to `max_len`; an empty text is one unknown token, so every
    /// sequence has a last real token.
    pub fn encode(&self, text: &str, max_len: usize) -> Vec<u32> {
        let t = if self.lowercase {
            text.to_lowercase()
        } else {
            text.to_string()
        };
        let mut ids: Vec<u32> = match self.kind {
            TokenizerKind::Word => words(&t)
                .take(max_len)
                .map(|w| self.index.get(w).copied().unwrap_or(self.unk_id))
                .collect(),
            TokenizerKind::Byte => t
                .bytes()
                .take(max_len)
                .map(|b| self.byte_ids[b as usize])
                .collect(),
        };
        if ids.is_empty() {
            ids.push(self.unk_id);
        }
        ids
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        crate::metrics::write_json_atomic(path, self)
    }

    /// The SHA-256 of the file `save` writes (a summary's `tokenizer_sha256`), hex.
    pub fn sha256(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = serde_json::to_string_pretty(self).unwrap_or_default() + "\n";
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A tokenizer `save` wrote (a run's `tokenizer.json`), checked: its reserved ids in
    /// range, a word vocabulary without repeats, 256 byte ids.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| match path.exists() {
            true => e.to_string(),
            false => crate::recipe::why_missing(path),
        })?;
        let mut t: Self = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let ids = match t.kind {
            TokenizerKind::Word => t.vocab.len(),
            TokenizerKind::Byte => t.vocab_size(),
        };
        if t.pad_id as usize >= ids.max(1) || t.unk_id as usize >= ids.max(1) {
            return Err(format!(
                "its pad_id {} or unk_id {} is not among its {ids} ids",
                t.pad_id, t.unk_id
            ));
        }
        if t.kind == TokenizerKind::Byte && t.byte_ids.len() != 256 {
            return Err(format!("it has {} byte ids, not 256", t.byte_ids.len()));
        }
        // `byte` lays the 256 bytes out on the ids 0..258 other than pad and unknown: an id
        // past them (10^9 sized an embedding table of 64 GB and aborted), or a byte id
        // shared with another byte or a reserved id, is not a tokenizer `byte` wrote.
        if t.kind == TokenizerKind::Byte {
            let mut seen = std::collections::HashSet::new();
            if let Some((b, id)) =
                t.byte_ids.iter().enumerate().find(|&(_, &id)| {
                    id >= 258 || id == t.pad_id || id == t.unk_id || !seen.insert(id)
                })
            {
                return Err(format!(
                    "byte {b} has the id {id}, which is past the 258 ids of a byte tokenizer, reserved, or another byte's"
                ));
            }
        }
        t.reindex();
        let words = t.vocab.iter().filter(|w| !w.is_empty()).count();
        if t.index.len() != words {
            return Err("a word appears twice in its vocabulary".into());
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_letters_from_punctuation() {
        let w: Vec<&str> = words("Burns's film -- 10/10, wow!").collect();
        assert_eq!(
            w,
            ["Burns", "'", "s", "film", "-", "-", "10", "/", "10", ",", "wow", "!"]
        );
    }

    #[test]
    fn word_vocabulary_keeps_the_frequent_and_reserves_pad_and_unk() {
        let t = Tokenizer::build_word(&["a b b c", "B c c d"], 3, 1, true, 0);
        assert_eq!(t.vocab, ["<pad>", "<unk>", "b", "c", "a"]);
        assert_eq!(t.encode("A b z", 10), [4, 2, 1]);
        assert_eq!(t.encode("b b b b", 2), [2, 2], "cut to the maximum length");
        assert_eq!(t.encode("", 5), [1], "never empty");
        let min2 = Tokenizer::build_word(&["a b b c", "b c c d"], 100, 2, true, 0);
        assert_eq!(min2.vocab, ["<pad>", "<unk>", "b", "c"]);
        let pad5 = Tokenizer::build_word(&["a b"], 100, 1, true, 5);
        assert_eq!(pad5.vocab_size(), 6);
        assert_eq!(pad5.encode("a b q", 10), [1, 2, 0]);
    }

    /// Text that is not UTF-8 is named by its line, and a binary file is told apart.
    #[test]
    fn a_bad_line_says_how_many_more_are_bad() {
        let dir = crate::scratch::Scratch::new("morebad");
        let p = dir.join("bad.jsonl");
        let good = r#"{"text": "a", "label": 0}"#;
        let mut lines = vec![good; 20];
        lines[1] = "{not json";
        lines[4] = r#"{"text": "b", "label": 7}"#;
        lines[6] = r#"{"text": 3, "label": 0}"#;
        std::fs::write(&p, lines.join("\n")).unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), 3).unwrap_err();
        assert!(
            e.message.starts_with("line 2: not JSON")
                && e.message.ends_with(" (and 2 more bad lines: 5, 7)"),
            "{}",
            e.message
        );
        lines = vec!["[]"; 9];
        lines[0] = good;
        std::fs::write(&p, lines.join("\n")).unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
        assert!(
            e.message
                .ends_with("(and 7 more bad lines: 3, 4, 5, 6, 7, …)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn non_utf8_lines_are_named() {
        let dir = crate::scratch::Scratch::new("utf8");
        let latin1 = dir.join("latin1.jsonl");
        std::fs::write(
            &latin1,
            b"{\"text\": \"ok\", \"label\": 0}\n{\"text\": \"caf\xe9\", \"label\": 1}\n",
        )
        .unwrap();
        let e = read_jsonl(&latin1, "text", "label", None, usize::MAX).unwrap_err();
        assert_eq!(
            e.message,
            "line 2 is not UTF-8 text (byte 0xe9, at byte 14 of the line; file offset 40)"
        );
        // The others counted, as other bad lines are.
        std::fs::write(
            &latin1,
            b"{\"text\": \"ok\", \"label\": 0}\n{\"text\": \"caf\xe9\", \"label\": 1}\n{\"text\": \"ok\", \"label\": 0}\n\xe9\n\xff\n",
        )
        .unwrap();
        let e = read_jsonl(&latin1, "text", "label", None, usize::MAX).unwrap_err();
        assert!(
            e.message.ends_with("(and 2 more bad lines: 4, 5)"),
            "{}",
            e.message
        );
        assert!(e.help_text().contains("iconv"));
        let binary = dir.join("data.bin");
        std::fs::write(&binary, [7u8, 0, 0, 255, 0]).unwrap();
        let e = read_jsonl(&binary, "text", "label", None, usize::MAX).unwrap_err();
        assert!(e.help_text().contains("binary file"), "{}", e.help_text());
    }

    #[test]
    fn bytes_skip_the_reserved_ids() {
        let t = Tokenizer::byte(false, 0);
        assert_eq!(t.encode("Ab", 10), [b'A' as u32 + 2, b'b' as u32 + 2]);
        assert_eq!(t.vocab_size(), 258);
    }

    #[test]
    fn a_byte_tokenizer_with_a_bad_byte_id_is_refused() {
        let dir = crate::scratch::Scratch::new("tok");
        let p = dir.join("tokenizer.json");
        for pad in [0, 1, 300] {
            let t = Tokenizer::byte(true, pad);
            t.save(&p).unwrap();
            assert_eq!(Tokenizer::load(&p).unwrap(), t, "pad_id {pad}");
            for (b, id) in [(7, 1_000_000_000), (7, t.unk_id), (9, t.byte_ids[8])] {
                let mut bad = t.clone();
                bad.byte_ids[b] = id;
                bad.save(&p).unwrap();
                let e = Tokenizer::load(&p).unwrap_err();
                assert!(e.contains(&format!("byte {b} has the id {id}")), "{e}");
            }
        }
    }

    #[test]
    fn scans_are_remembered_until_the_file_changes() {
        let dir = crate::scratch::Scratch::new("text");
        let p = dir.join("scan.jsonl");
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\n{\"label\": 3, \"text\": \"b\"}\n",
        )
        .unwrap();
        let first = scan_jsonl(&p, "text", "label", None, true).unwrap();
        assert_eq!(
            (first.rows, first.labels.iter().copied().collect::<Vec<_>>()),
            (2, vec![1, 3])
        );
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"The cat, the hat\"}\n{\"label\": 3, \"text\": \"\"}\n",
        )
        .unwrap();
        let s = scan_jsonl(&p, "text", "label", None, true).unwrap();
        assert_eq!(
            (s.longest_words, s.longest_bytes, &s.word_freqs[..]),
            (5, 16, &[2, 1, 1, 1][..])
        );
        let s = scan_jsonl(&p, "text", "label", None, false).unwrap();
        assert_eq!(s.word_freqs, [1; 5]);
        assert_eq!(kept_words(&[3, 2, 2, 1], 2, 10), 3);
        assert_eq!(kept_words(&[3, 2, 2, 1], 2, 1), 1);
        assert_eq!(kept_words(&[3, 2, 2, 1], 4, 10), 0);
        assert_eq!(
            [4, 5].map(|m| s.longer_than(TokenizerKind::Word, m, usize::MAX)),
            [(1, 5), (0, 5)]
        );
        assert_eq!(s.longer_than(TokenizerKind::Byte, 15, usize::MAX), (1, 16));
        // Of the first text alone (data.limit = 1); the empty second one counts as one.
        assert_eq!(s.longer_than(TokenizerKind::Word, 4, 1), (1, 5));
        assert_eq!(s.longer_than(TokenizerKind::Word, 0, 2), (2, 5));
        assert_eq!(s.longer_than(TokenizerKind::Byte, 15, 0), (0, 1));
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\n{\"label\": 3, \"text\": \"b\"}\n",
        )
        .unwrap();
        let first = scan_jsonl(&p, "text", "label", None, true).unwrap();
        assert_eq!(scan_jsonl(&p, "text", "label", None, true).unwrap(), first);
        // A changed file (another size) is read again, and its errors are not remembered.
        std::fs::write(&p, "{\"label\": 0, \"text\": \"a\"}\n").unwrap();
        assert_eq!(scan_jsonl(&p, "text", "label", None, true).unwrap().rows, 1);
        std::fs::write(&p, "{\"label\": 0, \"text\": \"a\"}\nnot json\n").unwrap();
        assert!(scan_jsonl(&p, "text", "label", None, true).is_err());
        assert!(scan_jsonl(&p, "text", "label", None, true).is_err());
    }

    #[test]
    fn bad_lines_name_the_file_and_line() {
        let dir = crate::scratch::Scratch::new("text2");
        let p = dir.join("t.jsonl");
        let cases = [
            (
                "{\"label\": 1, \"text\": \"ok\"}\n{\"label\": 1, \"text\": \"ok\"\n",
                "line 2: not JSON at byte 25 of the line (EOF while parsing an object)",
            ),
            (
                "{\"label\": 1, \"text\": \"ok\"}\n{\"label\": 1, \"text\": ok}\n",
                "line 2: not JSON at byte 22 of the line (expected value)",
            ),
            (
                "\u{feff}{\"label\": 1, \"text\": \"ok\"}\n\u{feff}{\"label\": 1, \"text\": \"ok\"}\n",
                "line 2: starts with a byte-order mark (U+FEFF)",
            ),
            (
                "\n{\"label\": 1}\n",
                "line 2: no field \"text\" (the line has \"label\")",
            ),
            (
                "{\"label\": 3, \"text\": \"x\"}\n",
                "line 1: label 3 is out of range: there are 2 classes",
            ),
            (
                "{\"label\": -1, \"text\": \"x\"}\n",
                "line 1: label -1 is not a non-negative integer",
            ),
            (
                "{\"label\": 4294967296, \"text\": \"x\"}\n",
                "line 1: label 4294967296 is too large for a class index",
            ),
            (
                "{\"label\": 99999999999999999999999, \"text\": \"x\"}\n",
                "line 1: label 99999999999999999999999 is too large for a class index",
            ),
            (
                "{\"text\": \"x\", \"label\": -0}\n",
                "line 1: label -0 is not a non-negative integer",
            ),
            (
                "{\"meta\": {\"label\": 3}, \"text\": \"\\\"label\\\": 4\", \"label\": -1}\n",
                "line 1: label -1 is not a non-negative integer",
            ),
            (
                "{\"label\": \"1\", \"text\": \"x\"}\n",
                "line 1: label \"1\" is not a non-negative integer",
            ),

            ("[1, 2]\n", "line 1: not a JSON object"),
            (
                "{\"label\": 0, \"text\": \"a\", \"label\": 1}\n",
                "line 1: field \"label\" is given more than once",
            ),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("t.jsonl"), "{e}");
        }
        // Each kind of wrong label with what to do about it.
        for (text, want) in [
            (
                "{\"label\": \" 1\", \"text\": \"x\"}\n",
                "write 1 without quotes (jq -c '.label |= tonumber' FILE)",
            ),
            (
                "{\"label\": \"spam\", \"text\": \"x\"}\n",
                "map each class name to its index",
            ),
            (
                "{\"label\": 1.0, \"text\": \"x\"}\n",
                "write 1 without its fraction",
            ),
            (
                "{\"label\": 1e23, \"text\": \"x\"}\n",
                "at most 99999 (the cap on classes)",
            ),
            ("[{\"label\": 1, \"text\": \"x\"}]\n", "jq -c '.[]'"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
            assert!(e.help_text().contains(want), "{e}: {}", e.help_text());
        }
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\r{\"label\": 0, \"text\": \"b\"}\r",
        )
        .unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
        assert!(e.to_string().contains("carriage return alone"), "{e}");
        // The last line alone ended by a newline (an editor's fix-up): the same.
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\r{\"label\": 0, \"text\": \"b\"}\r{\"label\": 0, \"text\": \"c\"}\n",
        )
        .unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
        assert!(e.to_string().contains("carriage return alone"), "{e}");
        // A CR inside a line is JSON's whitespace: read as it is.
        std::fs::write(
            &p,
            "{\"label\": 1,\r\"text\": \"a\"}\n{\"label\": 0,\r\"text\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(
            read_jsonl(&p, "text", "label", Some(2), usize::MAX)
                .unwrap()
                .len(),
            2
        );
        // Cut short inside a character: said so, with the size that keeps the whole lines.
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\n{\"label\": 0, \"text\": \"caf\u{e9}"
                .as_bytes()
                .split_last()
                .unwrap()
                .1,
        )
        .unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
        assert!(
            e.message
                .starts_with("line 2: the file ends inside a character")
                && e.help_text().contains("truncate -s 26 FILE"),
            "{e}: {}",
            e.help_text()
        );
        // CRLF is read as it is.
        std::fs::write(
            &p,
            "{\"label\": 1, \"text\": \"a\"}\r\n{\"label\": 0, \"text\": \"b\"}\r\n",
        )
        .unwrap();
        assert_eq!(
            read_jsonl(&p, "text", "label", Some(2), usize::MAX)
                .unwrap()
                .len(),
            2
        );
        // Encoded files get the help that fits them.
        let utf16: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain(
                "{\"label\": 1, \"text\": \"ok\"}\n"
                    .bytes()
                    .flat_map(|c| [c, 0]),
            )
            .collect();
        let gzip = [0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef];
        let no_bom = &utf16[2..];
        let zeros = [0u8; 512];
        for (bytes, want) in [
            (&utf16[..], "UTF-16"),
            (no_bom, "UTF-16"),
            (&gzip[..], "gzip file"),
            (&zeros[..], "was it written whole?"),
        ] {
            std::fs::write(&p, bytes).unwrap();
            let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
            assert!(e.help_text().contains(want), "{}", e.help_text());
        }
        // A JSON array, or pretty-printed objects, given as JSON Lines: said as such.
        for (text, want) in [
            (
                "[{\"label\": 1, \"text\": \"ok\"},\n{\"label\": 0, \"text\": \"b\"}]\n",
                "jq -c '.[]'",
            ),
            (
                "{\n  \"label\": 1,\n  \"text\": \"ok\"\n}\n",
                "pretty-printed JSON",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
            assert!(e.help_text().contains(want), "{e}");
        }
        // Text, then the zeros of a file allocated ahead (a download cut short): not
        // UTF-16 (zeros at every byte, not every other one), and said where they start,
        // within the first 4 KiB or past it.
        for (lines, cut) in [
            (2, ""),
            (200, ""),
            (2, "{\"label\": 1, \"text\": \"caf\u{e9}"),
        ] {
            let mut bytes = "{\"label\": 1, \"text\": \"ok\"}\n"
                .repeat(lines)
                .into_bytes();
            // A line cut inside its last character (é is two bytes: one is kept).
            bytes.extend(&cut.as_bytes()[..cut.len().saturating_sub(1)]);
            let at = bytes.len();
            bytes.resize(at + 4096, 0);
            std::fs::write(&p, bytes).unwrap();
            let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX).unwrap_err();
            assert!(
                e.message.starts_with(&format!(
                    "line {}: zero bytes from byte offset {at} to the end of the file (4096 bytes)",
                    lines + 1
                )) && e.help_text().contains(&format!(
                    "truncate -s {} FILE",
                    at - cut.len().saturating_sub(1)
                )),
                "{e}"
            );
        }
        // A dict of many keys as one line: the names said are few and short.
        let keys: Vec<String> = (0..1000)
            .map(|i| format!("\"{}{i}\": {i}", "k".repeat(100)))
            .collect();
        std::fs::write(&p, format!("{{{}}}\n", keys.join(", "))).unwrap();
        let e = read_jsonl(&p, "text", "label", Some(2), usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(
            e.len() < 1500 && e.contains("and 990 more") && e.contains("(101 bytes)"),
            "{} bytes: {}",
            e.len(),
            &e[..e.len().min(2000)]
        );
    }
}
