//! Diagnostics: an error or warning that points into a file (path, line, column, key) and
//! says what to do. Owns rendering and "did you mean"; it does not decide what is wrong.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One finding about an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// The file as the user named it.
    pub file: PathBuf,
    /// 1-based line and column, when the finding has a place in the file.
    pub line: Option<usize>,
    pub col: Option<usize>,
    /// The source line shown under the message, and the span's columns within it.
    pub snippet: Option<(String, Range<usize>)>,
    /// The dotted key, as the user wrote it (`loader.workers`).
    pub key: Option<String>,
    pub message: String,
    /// What else the reader needs to know, said before the help.
    pub note: Option<String>,
    /// What to do about it.
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(file: &Path, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            file: file.to_path_buf(),
            line: None,
            col: None,
            snippet: None,
            key: None,
            message: message.into(),
            note: None,
            help: None,
        }
    }

    pub fn warning(file: &Path, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(file, message)
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Places the finding at a byte span of `source`.
    pub fn at(mut self, source: &str, span: Range<usize>) -> Self {
        let start = span.start.min(source.len());
        let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..]
            .find('\n')
            .map_or(source.len(), |i| start + i);
        let line_no = source[..start].matches('\n').count() + 1;
        let text = source[line_start..line_end].trim_end_matches('\r');
        let col_chars = source[line_start..start].chars().count();
        let end = span.end.clamp(start, line_end);
        let width = source[start..end].chars().count().max(1);
        self.line = Some(line_no);
        self.col = Some(col_chars + 1);
        self.snippet = Some(window(text, col_chars, width));
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// The part of a source `line` shown under a finding at char `col`, `width` chars wide,
/// and the span's chars there: a long line (a 3 MB description) is cut to
/// [`SNIPPET_CHARS`] around the span, with `…` where it was cut, and a long span is
/// underlined for that many chars.
fn window(line: &str, col: usize, width: usize) -> (String, Range<usize>) {
    let chars: Vec<char> = line.chars().collect();
    if chars.len() <= SNIPPET_CHARS {
        return (line.to_string(), col..col + width);
    }
    let width = width.min(SNIPPET_CHARS / 2);
    let from = col.saturating_sub(SNIPPET_CHARS / 4);
    let to = (from + SNIPPET_CHARS).min(chars.len());
    let head = if from > 0 { "…" } else { "" };
    let tail = if to < chars.len() { "…" } else { "" };
    let shown: String = chars[from..to].iter().collect();
    let start = col - from + head.chars().count();
    (format!("{head}{shown}{tail}"), start..start + width)
}

/// `text` cut to its first `chars` characters, with `…` where it was cut: a value echoed
/// in a message (a 3,000-element array) stays a line.
pub fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The most chars of a source line a finding shows.
const SNIPPET_CHARS: usize = 120;

impl fmt::Display for Diagnostic {
    /// `error: recipes/x.toml:12:9: loader.wokers: unknown key`, the source line with a
    /// caret under the span, and `help:` when there is one.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let label = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let shown = crate::columns::escaped;
        write!(
            f,
            "{label}: {}",
            shown(&self.file.display().to_string(), false)
        )?;
        // A `--set` is one line, shown with a caret: `--set:1:16` named no place to go.
        let from_set = self.file == Path::new("--set");
        if let (Some(l), Some(c), false) = (self.line, self.col, from_set) {
            write!(f, ":{l}:{c}")?;
        }
        write!(f, ": ")?;
        if let Some(k) = &self.key {
            write!(f, "{}: ", shown(k, false))?;
        }
        write!(f, "{}", shown(&self.message, true))?;
        if let (Some(l), Some((text, cols))) = (self.line, &self.snippet) {
            let l = if from_set { " ".into() } else { l.to_string() };
            let gutter = l.len();
            let (text, marks) = crate::columns::underline(text, cols.clone());
            write!(
                f,
                "\n{:gutter$} |\n{l} | {text}\n{:gutter$} | {marks}",
                "", ""
            )?;
        }
        if let Some(n) = &self.note {
            write!(f, "\n  = note: {}", shown(n, true))?;
        }
        if let Some(h) = &self.help {
            write!(f, "\n  = help: {}", shown(h, true))?;
        }
        Ok(())
    }
}

/// All findings about one input, errors and warnings together.
#[derive(Debug, Clone, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.is_error())
    }
    /// Errors first, each kind in file order.
    pub fn sorted(mut self) -> Self {
        self.0
            .sort_by_key(|d| (!d.is_error(), d.line.unwrap_or(usize::MAX), d.col));
        self
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "{d}")?;
        }
        let n = self.errors().count();
        if n > 0 {
            // Per file, in order of appearance: a recipe's errors may sit in what it extends.
            let mut files: Vec<(&std::path::Path, usize)> = vec![];
            for e in self.errors() {
                match files.iter_mut().find(|(p, _)| *p == e.file.as_path()) {
                    Some((_, k)) => *k += 1,
                    None => files.push((e.file.as_path(), 1)),
                }
            }
            let s = |n: usize| if n == 1 { "" } else { "s" };
            if let [(file, _)] = files[..] {
                let file = crate::columns::escaped(&file.display().to_string(), false).into_owned();
                write!(f, "{n} error{} in {file}", s(n))?;
            } else {
                let parts: Vec<String> = files
                    .iter()
                    .map(|(p, k)| {
                        let p = p.display().to_string();
                        format!("{k} in {}", crate::columns::escaped(&p, false))
                    })
                    .collect();
                write!(f, "{n} error{}: {}", s(n), parts.join(", "))?;
            }
        }
        Ok(())
    }
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a typo.
pub fn did_you_mean<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1) + 1;
    candidates
        .iter()
        .map(|c| (edit_distance(&word.to_lowercase(), c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The key of `keys` a mistyped or misremembered `word` most likely meant: a typo of it
/// (`wokers`), its initials (`wd` for `weight_decay`), or a key that holds it whole
/// (`warmup_steps` in `lr_warmup_steps`, `warmup` in `warmup_steps`), or a key it holds
/// as a word with a qualifier before or after (`samples` in `train_samples`, `epochs` in
/// `max_epochs`: other tools' names; by distance alone `train_samples` was
/// `test_samples`, and `max_epochs` `max_steps`). Two letters are too
/// few to tell a typo by distance (`wd` is 2 from `lr`): there only a swap counts.
pub fn near_key<'a>(word: &str, keys: &[&'a str]) -> Option<&'a str> {
    near_key_by(word, keys).map(|(k, _)| k)
}

/// [`near_key`], and whether the match is by more than spelling (initials, or a key that
/// holds the word): a guess by edit distance alone (`epochs` for `eps`) loses to the same
/// key in another table.
pub fn near_key_by<'a>(word: &str, keys: &[&'a str]) -> Option<(&'a str, bool)> {
    let word = word.to_lowercase();
    let n = word.chars().count();
    let limit = if n <= 2 { 1 } else { (n / 3).max(1) + 1 };
    let typo = keys
        .iter()
        .map(|c| (edit_distance(&word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c);
    let initials = || {
        keys.iter().copied().find(|k| {
            k.contains('_')
                && k.split('_')
                    .filter_map(|p| p.chars().next())
                    .eq(word.chars())
        })
    };
    let holds = || {
        keys.iter()
            .copied()
            .filter(|k| n >= 3 && k.split('_').count() > 1 && k.contains(word.as_str()))
            .min_by_key(|k| k.len())
    };
    let held = || {
        keys.iter()
            .copied()
            .filter(|k| {
                k.len() >= 3
                    && (word.ends_with(&format!("_{k}")) || word.starts_with(&format!("{k}_")))
            })
            .max_by_key(|k| k.len())
    };
    // A key the word holds is a guess as the typo is: the word itself as a key of
    // another table wins over it (`lr_warmup_steps` in [run] is [optim]'s, not [run]'s
    // `warmup_steps`).
    match (initials().or_else(holds), held().or(typo)) {
        (Some(k), _) => Some((k, true)),
        (None, Some(k)) => Some((k, false)),
        (None, None) => None,
    }
}

/// Damerau–Levenshtein distance (optimal string alignment): a swap of neighbours costs 1.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_keys_only() {
        let keys = ["workers", "batch_size", "pin_memory"];
        assert_eq!(did_you_mean("wokers", &keys), Some("workers"));
        assert_eq!(did_you_mean("batchsize", &keys), Some("batch_size"));
        assert_eq!(did_you_mean("pin_memroy", &keys), Some("pin_memory"));
        assert_eq!(did_you_mean("colour", &keys), None);
        let optim = [
            "lr",
            "momentum",
            "weight_decay",
            "lr_warmup_steps",
            "step_size",
        ];
        assert_eq!(near_key("warmup_steps", &optim), Some("lr_warmup_steps"));
        assert_eq!(near_key("wd", &optim), Some("weight_decay"));
        assert_eq!(near_key("rl", &optim), Some("lr"));
        assert_eq!(near_key("xy", &optim), None);
        let run = ["max_steps", "warmup_steps", "epochs", "eval"];
        assert_eq!(near_key("warmup", &run), Some("warmup_steps"));
        assert_eq!(near_key("steps", &run), Some("max_steps"));
        assert_eq!(near_key("colour", &run), None);
        assert_eq!(near_key("max_epochs", &run), Some("epochs"));
        let synthetic = [
            "samples",
            "test_samples",
            "classes",
            "image_size",
            "channels",
        ];
        assert_eq!(near_key("train_samples", &synthetic), Some("samples"));
        assert_eq!(near_key("num_classes", &synthetic), Some("classes"));
        assert_eq!(near_key("channels_last", &synthetic), Some("channels"));
    }

    #[test]
    fn long_lines_are_cut_around_the_span() {
        let line = format!("description = \"{}\" x", "y".repeat(100_000));
        let at = line.len() - 1;
        let d = Diagnostic::error(Path::new("r.toml"), "expected newline").at(&line, at..at + 1);
        let text = d.to_string();
        assert!(text.len() < 400, "{text}");
        assert!(
            text.contains("| …yyy") && text.contains("yyy\" x\n"),
            "{text}"
        );
        // The caret stands under the `x`.
        let lines: Vec<&str> = text.lines().collect();
        let (shown, caret) = (lines[2], lines[3]);
        assert_eq!(
            shown.chars().nth(caret.chars().count() - 1),
            Some('x'),
            "{text}"
        );
        // Short lines are whole.
        let d = Diagnostic::error(Path::new("r.toml"), "m").at("a = 1", 4..5);
        assert!(d.to_string().contains("1 | a = 1\n  |     ^"), "{d}");
    }

    #[test]
    fn renders_place_and_caret() {
        let src = "[loader]\nwokers = 4\n";
        let d = Diagnostic::error(Path::new("r.toml"), "unknown key")
            .key("loader.wokers")
            .at(src, 9..15)
            .help("did you mean `workers`?");
        assert_eq!(
            d.to_string(),
            "error: r.toml:2:1: loader.wokers: unknown key\n  |\n2 | wokers = 4\n  | ^^^^^^\n  = help: did you mean `workers`?"
        );
    }
}
