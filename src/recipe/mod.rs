//! Reading a recipe: TOML syntax, `extends` chains and `--set` overrides (through `doc`),
//! unknown keys and value types, every finding at once, each pointing at the file, line and
//! column that wrote the key. Owns the raw `Recipe` (what the user typed, with defaults) and
//! the provenance of every key that later checks use to point into the sources. Rules that
//! span keys, and anything touching the file system beyond reading recipes, belong to `plan`.

pub mod diag;
pub mod doc;
pub mod schema;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use diag::{did_you_mean, Diagnostic, Diagnostics, Severity};
pub use doc::{Doc, Origin, SourceFile};
pub use schema::*;

/// A recipe that parsed and type-checked, with what is needed to point into its sources.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub recipe: Recipe,
    /// The recipe file as the user named it.
    pub path: PathBuf,
    /// Values and where each key was written (this file, a file it extends, `--set`).
    pub doc: Doc,
    /// Unknown keys and values of the wrong type, already reported and left out of `recipe`
    /// (which holds the defaults in their place). Later checks add to these.
    pub findings: Diagnostics,
    dropped: Vec<String>,
    /// The `[sweep]` table, if the recipe is a grid (see `sweep`).
    pub sweep: Option<toml::Table>,
}

impl Loaded {
    /// Whether the sources set this dotted key (as opposed to it taking its default).
    pub fn is_set(&self, key: &str) -> bool {
        // A table is set by a key under it too (`--set padding.max_length=5` wrote no
        // `padding` of its own, and a table that does not apply went unsaid).
        let under = format!("{key}.");
        let written = self.doc.origins.contains_key(key)
            || self
                .doc
                .origins
                .range(under.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&under));
        written && !self.was_dropped(key)
    }

    /// Whether the key (or a table above it) was reported and dropped: later checks stay
    /// quiet about it rather than report the same mistake twice.
    pub fn was_dropped(&self, key: &str) -> bool {
        self.dropped
            .iter()
            .any(|d| key == d || key.starts_with(&format!("{d}.")))
    }

    /// An error about a key's value, placed where the value was written.
    pub fn error(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        self.doc.diagnostic(
            &self.path,
            key,
            Diagnostic::error(&self.path, message).key(key),
        )
    }

    /// A warning about a key, placed like `error`.
    pub fn warning(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        self.doc.diagnostic(
            &self.path,
            key,
            Diagnostic::warning(&self.path, message).key(key),
        )
    }

    /// The directory of the recipe file itself (see [`folder_of`]).
    pub fn base_dir(&self) -> PathBuf {
        folder_of(&self.path)
    }

    /// Whether the key's value came from `--set` (its paths are then relative to the
    /// working directory, not to a recipe file).
    pub fn set_on_command_line(&self, key: &str) -> bool {
        let from_set = |o: &Origin| self.doc.source(o).name == Path::new("--set");
        match self.doc.origins.get(key) {
            Some(o) => from_set(o),
            // A table that only --set keys below it made (`--set data.normalize.on=device`).
            None => {
                let below = format!("{key}.");
                let mut keys = self
                    .doc
                    .origins
                    .iter()
                    .filter(|(k, _)| k.starts_with(&below))
                    .peekable();
                keys.peek().is_some() && keys.all(|(_, o)| from_set(o))
            }
        }
    }

    /// The directory a relative path in `key` is resolved against: that of the file that
    /// wrote it (a parent recipe's paths stay relative to the parent).
    pub fn dir_of(&self, key: &str) -> PathBuf {
        match self.doc.origins.get(key) {
            Some(o) => self.doc.source(o).dir.clone(),
            None => self.base_dir(),
        }
    }

    /// The path `value` of `key` names: `~` expanded ([`home_path`]), then a relative
    /// path taken from the directory of the file that wrote it ([`Loaded::dir_of`]).
    pub fn path_of(&self, key: &str, value: &str) -> Result<PathBuf, String> {
        Ok(self.dir_of(key).join(home_path(value)?))
    }
}

/// A path value with a leading `~` or `~/` read as `$HOME`, as git reads its path
/// settings (a recipe is not read by a shell, and `"~/runs"` taken as written made a
/// folder named `~` in the working directory). `~user` and a `~` without `$HOME` are
/// refused rather than taken as a folder named `~...`.
pub fn home_path(value: &str) -> Result<PathBuf, String> {
    home_path_with(value, std::env::var_os("HOME"))
}

fn home_path_with(value: &str, home: Option<std::ffi::OsString>) -> Result<PathBuf, String> {
    let Some(rest) = value.strip_prefix('~') else {
        return Ok(PathBuf::from(value));
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return Err(format!(
            "{value:?}: only `~` and `~/...` (this user's home) are expanded; write the full path"
        ));
    }
    match home.filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(rest.trim_start_matches('/'))),
        None => Err(format!(
            "{value:?} starts with `~`, but $HOME is not set; write the full path"
        )),
    }
}

/// Reads and type-checks a recipe file (and the files it extends).
pub fn load(path: &Path) -> Result<Loaded, Diagnostics> {
    load_with(path, &[])
}

/// As `load`, with `key=value` overrides applied on top.
pub fn load_with(path: &Path, sets: &[String]) -> Result<Loaded, Diagnostics> {
    let mut report = Diagnostics::default();
    let Some(mut doc) = Doc::load(path, &mut report) else {
        return Err(report.sorted());
    };
    doc.apply_sets(sets, &mut report);
    check(path, doc, report)
}

/// Type-checks recipe text that claims to come from `path`.
pub fn parse(path: &Path, source: String) -> Result<Loaded, Diagnostics> {
    let mut report = Diagnostics::default();
    let Some(doc) = Doc::parse(path, Some(source), &mut report) else {
        return Err(report.sorted());
    };
    check(path, doc, report)
}

/// Unknown keys and value types of an assembled document. A file that is not TOML is an
/// error (`Err`); keys and values that do not fit the format are `findings` of the result,
/// so the checks that follow can add theirs and the user sees every mistake at once.
pub fn check(path: &Path, mut doc: Doc, mut report: Diagnostics) -> Result<Loaded, Diagnostics> {
    let sweep = match doc.table.remove("sweep") {
        None => None,
        Some(toml::Value::Table(t)) => Some(t),
        Some(_) => {
            report.push(
                doc.diagnostic(
                    path,
                    "sweep",
                    Diagnostic::error(path, "must be a table of dotted keys and lists of values")
                        .key("sweep"),
                )
                .help("[sweep]\n\"loader.workers\" = [0, 2, 4]"),
            );
            None
        }
    };
    let mut dropped: Vec<String> = vec![];
    check_unknown_keys(path, &mut doc, &mut report, &mut dropped);
    check_types(path, &mut doc, &mut report, &mut dropped);
    let recipe = match Recipe::deserialize(toml::Value::Table(doc.table.clone())) {
        Ok(r) => r,
        Err(e) => {
            report.push(Diagnostic::error(path, friendly(e.message())));
            return Err(report.sorted());
        }
    };
    Ok(Loaded {
        recipe,
        path: path.to_path_buf(),
        doc,
        findings: report,
        dropped,
        sweep,
    })
}

/// What `path` is when it is there but is not a regular file (followed through links):
/// "a folder", "a named pipe", "a socket" or "a device"; `None` for a regular file or
/// nothing there (`why_missing` says which).
pub fn odd_kind(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let t = std::fs::metadata(path).ok()?.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a device"
    })
}

/// Why `path` cannot be opened when `path.exists()` says no: "does not exist" only where
/// nothing is there; else a dangling symbolic link, a loop of them, or a folder on the way
/// this user may not enter (all of which `exists()` reports as missing).
pub fn why_missing(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(_) => "exists".into(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::read_link(path) {
            Ok(target) => format!(
                "is a symbolic link to {}, which does not exist",
                target.display()
            ),
            Err(_) => "does not exist".into(),
        },
        Err(e) => format!("cannot be reached: {e}"),
    }
}

/// The folder a recipe file's relative paths are resolved from: its own, or, for a
/// symbolic link, its target's, the file that wrote them (they resolved from the link's
/// folder, so a recipe linked from another folder, `recipes/mine.toml ->
/// ../team/base.toml`, lost its data files and the files it extends). As written, not
/// made absolute: the paths in messages stay the user's.
pub fn folder_of(path: &Path) -> PathBuf {
    let mut file = path.to_path_buf();
    // A loop of links is said where the file is read.
    for _ in 0..40 {
        match std::fs::read_link(&file) {
            Ok(target) => {
                file = match file.parent() {
                    Some(p) => p.join(target),
                    None => target,
                }
            }
            Err(_) => break,
        }
    }
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `a/b/../c` → `a/c`, without touching the file system (for messages about missing files);
/// `.` where nothing is left (`./.`, which messages showed as nothing at all).
pub fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = vec![];
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    match out.is_empty() {
        true => PathBuf::from("."),
        false => out.iter().collect(),
    }
}

/// Checks a variant of an already checked recipe (a sweep cell: `doc` is `base.doc` with
/// values set): the base's findings carry over, so a mistake in the base file is reported
/// for the cell too, and its dropped keys stay quiet.
pub fn recheck(base: &Loaded, doc: Doc) -> Result<Loaded, Diagnostics> {
    let mut l = check(&base.path, doc, base.findings.clone())?;
    l.dropped.extend(base.dropped.iter().cloned());
    l.sweep = base.sweep.clone();
    Ok(l)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn table_at<'a>(t: &'a toml::Table, path: &str) -> Option<&'a toml::Table> {
    if path.is_empty() {
        return Some(t);
    }
    let mut t = t;
    for part in path.split('.') {
        t = t.get(part)?.as_table()?;
    }
    Some(t)
}

/// Reports every key the format does not know, with the nearest known key (or the table it
/// belongs in), and removes it so the type check sees only known keys.
fn check_unknown_keys(
    path: &Path,
    doc: &mut Doc,
    report: &mut Diagnostics,
    dropped: &mut Vec<String>,
) {
    let tables = schema::tables();
    for (table_path, allowed) in &tables {
        let Some(t) = table_at(&doc.table, table_path) else {
            continue;
        };
        let unknown: Vec<String> = t
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .cloned()
            .collect();
        for key in unknown {
            let where_ = if table_path.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in [{table_path}]")
            };
            let full = join(table_path, &key);
            let d = Diagnostic::error(path, format!("unknown key {where_}")).key(full.clone());
            // Point at the key itself, not its value.
            // A table written only through dotted keys below it (`--set unknown.key=1`) has
            // no origin of its own: point at the first key under it.
            let prefix = format!("{full}.");
            let origin = doc.origins.get(&full).or_else(|| {
                doc.origins
                    .iter()
                    .find(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, o)| o)
            });
            let d = match origin {
                Some(o) => {
                    let s = doc.source(o);
                    let mut d = d.at(&s.text, o.key.clone());
                    d.file = s.name.clone();
                    d
                }
                None => d,
            };
            // A key of the same name elsewhere may mean something else (`run.warmup_steps`
            // times nothing that `optim.lr_warmup_steps` warms up): a near key of this
            // table comes first, the other table's is said beside it.
            // A table's name is a table, not a key of the top level.
            let is_table = tables.iter().any(|(p, _)| *p == key.as_str());
            let home = tables
                .iter()
                .find(|(p, f)| p != table_path && f.contains(&key.as_str()))
                .map(|(p, _)| match *p {
                    "" if is_table => format!("a table of its own, [{key}]"),
                    "" => "at the top level, above every [table]".to_string(),
                    p => format!("in [{p}]"),
                });
            // A table under an unknown name (`[optimizer]`) meant a table: a key of the
            // same name elsewhere (`optim.optimizer`, a string) is no help.
            let tables_here: Vec<&str> = tables
                .iter()
                .filter_map(|(p, _)| match *table_path {
                    "" => Some(*p).filter(|p| !p.is_empty() && !p.contains('.')),
                    t => p
                        .strip_prefix(t)
                        .and_then(|r| r.strip_prefix('.'))
                        .filter(|r| !r.contains('.')),
                })
                .collect();
            // ([sweep] is a table too, though not one of the format's sections.)
            let mut tables_here = tables_here;
            if table_path.is_empty() {
                tables_here.push("sweep");
            }
            let written_as_table = table_at(&doc.table, &full).is_some();
            let near_table = written_as_table
                .then(|| diag::near_key(&key, &tables_here))
                .flatten();
            // `extends` and `[sweep]` are read before the format's keys: known at the top
            // level too (`extend = ...` got a list without them, and no "did you mean").
            let mut known: Vec<&str> = allowed.to_vec();
            if table_path.is_empty() {
                known.extend(["extends", "sweep"]);
            }
            let d = match (home, diag::near_key_by(&key, &known)) {
                _ if near_table.is_some() => d.help(format!(
                    "did you mean [{}]?",
                    join(table_path, near_table.unwrap_or_default())
                )),
                // Near by more than spelling: said first, the other table's beside it.
                (Some(home), Some((s, true))) => d.help(format!(
                    "did you mean `{s}`? (there is a key `{key}` {home}, too)"
                )),
                (Some(home), _) if is_table => d.help(format!("`{key}` is {home}")),
                (Some(home), _) => d.help(format!("`{key}` belongs {home}")),
                (None, Some((s, _))) => d.help(format!("did you mean `{s}`?")),
                (None, None) => d.help(format!("known keys {where_}: {}", known.join(", "))),
            };
            // A quoted key holding dots (`"loader.workers" = 1`) is one key of this table,
            // not a path: said, and removed whole (split, it was left for serde to refuse
            // again with no place).
            let meant = key.rsplit_once('.').filter(|(head, tail)| {
                let table = join(table_path, head);
                tables
                    .iter()
                    .any(|(p, f)| *p == table.as_str() && f.contains(tail))
            });
            let d = match meant {
                Some((head, tail)) => d.help(format!(
                    "quoted, \"{key}\" is one key with dots in its name; for `{tail}` in [{}], write it unquoted: {key} = ...",
                    join(table_path, head)
                )),
                None => d,
            };
            report.push(d);
            doc.remove_in(table_path, &key);
            dropped.push(full);
        }
    }
}

/// Type-checks each value on its own (a recipe holding only that key), so every value of
/// the wrong type or shape is reported, and drops it.
fn check_types(path: &Path, doc: &mut Doc, report: &mut Diagnostics, dropped: &mut Vec<String>) {
    let tables = schema::tables();
    for (table_path, _) in &tables {
        let Some(t) = table_at(&doc.table, table_path) else {
            continue;
        };
        let entries: Vec<(String, toml::Value)> =
            t.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (k, v) in entries {
            let full = join(table_path, &k);
            let format_table = tables.iter().any(|(p, _)| *p == full);
            if v.is_table() && format_table {
                continue; // a table of the format: its keys are checked one by one
            }
            // serde would bind an array to a table's fields by position (`loader = [16, 0]`
            // read as batch_size 16, workers 0), and `[[loader]]` gets a message about the
            // first field's type.
            if format_table {
                let what = match &v {
                    toml::Value::Array(a)
                        if a.iter().all(toml::Value::is_table) && !a.is_empty() =>
                    {
                        format!("an array of tables ([[{full}]])")
                    }
                    other => format!("{} {}", article(other.type_str()), other.type_str()),
                };
                let d = doc.diagnostic(
                    path,
                    &full,
                    Diagnostic::error(path, format!("must be a table, not {what}"))
                        .key(full.clone()),
                );
                report.push(d.help(format!(
                    "write [{full}] with its keys on the lines below it, or {full} = {{ key = value, ... }}"
                )));
                doc.remove(&full);
                dropped.push(full);
                continue;
            }
            let word_of = v.type_str();
            // In a list of words (cleanup.actions), the element that is not one.
            let element = match &v {
                toml::Value::Array(a) => a.iter().find(|x| !x.is_str()).map(|x| x.type_str()),
                _ => None,
            };
            if let Err(e) = Recipe::deserialize(alone(&full, v)) {
                let msg = e.message().to_string();
                // A number or true where a word goes: serde said "unit variant, expected
                // string only", naming neither the value's type nor the words allowed.
                let words = match (
                    msg.contains("expected string only"),
                    msg.contains("expected a sequence"),
                ) {
                    (true, _) => allowed_words(&full),
                    // A list of words given one value that is no word (`cleanup.actions=3`;
                    // a word has its own help: that word in a list).
                    (_, true) if word_of != "string" => {
                        allowed_words(&full).filter(|(_, _, list)| *list)
                    }
                    _ => None,
                };
                let leaf = full.rsplit('.').next().unwrap_or(&full);
                let (said, help) = match (words, element) {
                    (Some((words, first, true)), element) => (
                        match element {
                            Some(element) => format!(
                                "invalid type: {} {element} in the list, expected words in quotes, each one of {words}",
                                article(element)
                            ),
                            None => format!(
                                "invalid type: {} {word_of}, expected a list of words in quotes, each one of {words}",
                                article(word_of)
                            ),
                        },
                        Some(format!(
                            "write {leaf} = [\"{first}\"] (or others of the words, in quotes)"
                        )),
                    ),
                    (Some((words, first, _)), _) => (
                        format!(
                            "invalid type: {} {word_of}, expected a word in quotes, one of {words}",
                            article(word_of)
                        ),
                        Some(format!(
                            "write {leaf} = \"{first}\" (or another of the words, in quotes)"
                        )),
                    ),
                    (None, _) => {
                        // The value as written (`0x1F`, not serde's 31), for a help that
                        // quotes it.
                        let written = doc.origins.get(&full).and_then(|o| {
                            doc.source(o)
                                .text
                                .get(o.value.clone())
                                .map(|t| t.trim().to_string())
                        });
                        let help = value_help(&msg, takes_numbers(&full)).map(|h| {
                            let h = h.replace("--set 'KEY=", &format!("--set '{full}="));
                            match (&written, quoted_value(&msg)) {
                                (Some(w), Some(q)) if !w.starts_with(['"', '\'']) => {
                                    h.replace(&format!("\"{q}\""), &format!("\"{w}\""))
                                }
                                _ => h,
                            }
                        });
                        (friendly(&msg), help)
                    }
                };
                let mut d =
                    doc.diagnostic(path, &full, Diagnostic::error(path, said).key(full.clone()));
                if let Some(help) = help {
                    d = d.help(help);
                }
                report.push(d);
                doc.remove(&full);
                dropped.push(full);
            }
        }
    }
}

/// Whether the recipe key takes a number (a value it could be given is an integer or a
/// float): so a `--set` value of digits TOML cannot read is a number mistyped, not a word.
fn takes_number(key: &str) -> bool {
    [toml::Value::Integer(1), toml::Value::Float(1.0)]
        .into_iter()
        .any(|v| Recipe::deserialize(alone(key, v)).is_ok())
}

/// Whether the recipe key takes a list of numbers (`data.normalize.mean`).
fn takes_numbers(key: &str) -> bool {
    Recipe::deserialize(alone(
        key,
        toml::Value::Array(vec![toml::Value::Float(1.0)]),
    ))
    .is_ok()
}

/// A number Rust reads but TOML may not (`01`, `.5`), as TOML writes it.
fn toml_number(word: &str) -> Option<String> {
    let x = word
        .replace('_', "")
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())?;
    Some(format!("{x}"))
}

/// A recipe holding only `key` (dotted) = `value`, for serde to check it alone.
fn alone(key: &str, value: toml::Value) -> toml::Value {
    let mut alone = toml::Value::Table(toml::Table::new());
    let mut slot = &mut alone;
    for part in key.split('.') {
        slot = slot
            .as_table_mut()
            .expect("table")
            .entry(part)
            .or_insert(toml::Value::Table(toml::Table::new()));
    }
    *slot = value;
    alone
}

/// The words a key of a closed set takes (`` `a`, `b` ``) and the first of them, as serde
/// lists them for a word it does not know.
fn allowed_words(key: &str) -> Option<(String, String, bool)> {
    let word = toml::Value::String("\u{1}".into());
    // A key of one word, or (`true`) a list of them.
    let one = Recipe::deserialize(alone(key, word.clone()))
        .err()
        .filter(|e| e.message().contains("unknown variant"));
    let list = one.is_none();
    let e = match one {
        Some(e) => e,
        None => Recipe::deserialize(alone(key, toml::Value::Array(vec![word]))).err()?,
    };
    let msg = e.message().to_string();
    // serde lists three words or more as "one of `a`, `b`, `c`", two as "`a` or `b`" (the
    // help was left out for the two-word keys: optimizer, stem, mode...).
    let listed = msg
        .split_once("unknown variant ")?
        .1
        .split_once(", expected ")?
        .1
        .trim();
    let words = listed
        .strip_prefix("one of ")
        .map_or_else(|| listed.replace("` or `", "`, `"), str::to_string);
    let first = words.split('`').nth(1)?.to_string();
    Some((words, first, list))
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// serde's type names in words a recipe author uses.
fn friendly(msg: &str) -> String {
    let mut m = msg.trim().to_string();
    for (from, to) in [
        ("expected usize", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected an array"),
        (
            "expected an array of length 2",
            "expected an array of 2 numbers",
        ),
    ] {
        m = m.replace(from, to);
    }
    // serde's names for shapes and Rust types are not the user's words.
    for (from, to) in [
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: table"),
        ("invalid type: unit variant", "invalid type: bare word"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
    ] {
        m = m.replace(from, to);
    }
    if let Some(i) = m.find("expected struct ") {
        m = format!("{}expected a table", &m[..i]);
    }
    if let Some(i) = m.find("expected enum ") {
        m = format!("{}expected one of the allowed words", &m[..i]);
    }
    if let Some(rest) = m.strip_prefix("unknown variant ") {
        m = format!("unknown value {rest}");
    }
    m
}

/// The value serde names between backticks in `msg` (`NaN`, `123`, `true`), as TOML
/// writes it.
fn quoted_value(msg: &str) -> Option<String> {
    let (_, rest) = msg.split_once('`')?;
    let (v, _) = rest.split_once('`')?;
    Some(match v {
        "NaN" => "nan".into(),
        "inf" | "+inf" => "inf".into(),
        v => v.into(),
    })
}

/// What to do about a value serde rejected: the nearest allowed word, or the quotes to drop.
fn value_help(msg: &str, numbers: bool) -> Option<String> {
    // One word where a list of words goes (`--set cleanup.actions=trim_host`).
    if let Some(rest) = msg.strip_prefix("invalid type: string \"") {
        if let Some((got, _)) = rest
            .split_once("\", expected a")
            .filter(|_| msg.ends_with("expected an array") || msg.ends_with("expected a sequence"))
        {
            // Words joined by commas are a list's words.
            let words: Vec<&str> = got
                .split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .collect();
            // A list of numbers (`normalize.mean=01`): the numbers as TOML writes them, not
            // in quotes (`["01"]` was refused next as text).
            let as_numbers: Option<Vec<String>> = numbers
                .then(|| words.iter().map(|w| toml_number(w)).collect())
                .flatten();
            let words =
                as_numbers.unwrap_or_else(|| words.iter().map(|w| format!("\"{w}\"")).collect());
            let list = format!("[{}]", words.join(", "));
            return Some(format!(
                "write an array: {list} (on the command line: --set 'KEY={list}')"
            ));
        }
    }
    if let Some(rest) = msg.strip_prefix("invalid type: string \"") {
        let (got, expected) = rest.split_once("\", expected ")?;
        let expected = friendly(&format!("expected {expected}"));
        let unquoted_fits = if expected.contains("true or false") {
            got == "true" || got == "false"
        } else if expected.contains("integer") {
            got.parse::<i64>().is_ok()
        } else if expected.contains("number") {
            got.parse::<f64>().is_ok()
        } else {
            return None;
        };
        // `.001` or `05` is a number to Rust but not to TOML: say the form TOML reads.
        let toml_reads = toml::from_str::<toml::Table>(&format!("v = {got}")).is_ok();
        // Only a finite number has a form to offer: `NaN` and `1e400` are numbers to Rust
        // that TOML writes otherwise or not at all.
        let canonical = match got.parse::<i64>() {
            Ok(n) => Some(n.to_string()),
            Err(_) => got
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(|f| format!("{f:?}")),
        }
        .filter(|c| toml::from_str::<toml::Table>(&format!("v = {c}")).is_ok());
        return Some(if unquoted_fits && toml_reads {
            format!("write {got} without quotes")
        } else if let Some(c) = canonical.filter(|_| unquoted_fits) {
            format!("write {c}, without quotes (TOML writes numbers with a digit on each side of a point, and no leading zeros)")
        } else if expected.contains("true or false") {
            "write true or false, without quotes".into()
        } else if expected.contains("integer") {
            "write a whole number, without quotes, e.g. 4".into()
        } else {
            "write a number, without quotes, e.g. 0.1".into()
        });
    }
    // A number where a whole number goes: `1e3` is a float to TOML.
    if let Some(rest) = msg.strip_prefix("invalid type: floating point `") {
        let (got, expected) = rest.split_once("`, expected ")?;
        if friendly(&format!("expected {expected}")).contains("integer") {
            return Some(match got.parse::<f64>() {
                Ok(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 => format!(
                    "write {}, without a point or an exponent (TOML reads 1e3 and 4.0 as fractional numbers)",
                    f as i64
                ),
                _ => "write a whole number, e.g. 4".into(),
            });
        }
    }
    // A number, a boolean, `nan` or `inf` where text goes (`--set name=nan`).
    if msg.starts_with("invalid type: ")
        && msg.ends_with("expected a string")
        && !msg.starts_with("invalid type: sequence")
        && !msg.starts_with("invalid type: map")
    {
        let got = quoted_value(msg).unwrap_or_else(|| "...".into());
        return Some(format!("write it in quotes, \"{got}\": unquoted, TOML reads numbers, true, false, nan and inf as other types than text (on the command line, in single quotes for the shell: --set 'KEY=\"{got}\"')"));
    }
    // One value where a list goes.
    if msg.starts_with("invalid type: ")
        && !msg.starts_with("invalid type: sequence")
        && msg.ends_with("expected a sequence")
    {
        let got = msg
            .strip_prefix("invalid type: ")
            .and_then(|r| r.split_once('`'))
            .and_then(|(_, r)| r.split_once('`'))
            .map_or("...", |(v, _)| v);
        return Some(format!("write an array, e.g. [{got}]"));
    }
    let rest = msg.strip_prefix("unknown variant `")?;
    let (got, rest) = rest.split_once('`')?;
    let allowed: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    if got == "off" && allowed.contains(&"balanced") {
        // backend.autotune: the level users expect from other tools' "no tuning".
        return Some("Burn 0.21 cannot turn autotuning off at run time (only a build without burn's `autotune` feature can, and its convolutions then take a slow kernel); convolutions are already off it (backend.conv = \"implicit_gemm\", the default; matrix products and reductions stay tuned), and tuning results are cached for later runs (runner warmup)".into());
    }
    did_you_mean(got, &allowed).map(|s| format!("did you mean \"{s}\"?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(src: &str) -> Vec<String> {
        match parse(Path::new("r.toml"), src.to_string()) {
            Ok(l) => l
                .findings
                .sorted()
                .errors()
                .map(|d| d.to_string())
                .collect(),
            Err(r) => r.errors().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn a_float_for_an_integer_and_a_value_for_a_list_say_what_to_write() {
        let e = errors("[loader]\nbatch_size = 1e3\n").join("\n");
        assert!(
            e.contains("expected a non-negative integer")
                && e.contains("help: write 1000, without a point"),
            "{e}"
        );
        let e = errors("[data.normalize]\nmean = 0.5\n").join("\n");
        assert!(e.contains("help: write an array, e.g. [0.5]"), "{e}");
    }

    #[test]
    fn a_leading_tilde_is_this_users_home() {
        let home = || Some("/home/u".into());
        for (value, path) in [
            ("~", "/home/u"),
            ("~/runs", "/home/u/runs"),
            ("~//runs", "/home/u/runs"),
            ("runs/~", "runs/~"),
            ("/abs/~x", "/abs/~x"),
        ] {
            assert_eq!(home_path_with(value, home()).unwrap(), Path::new(path));
        }
        assert!(home_path_with("~bob/runs", home())
            .unwrap_err()
            .contains("~bob"));
        assert!(home_path_with("~/runs", None)
            .unwrap_err()
            .contains("$HOME"));
        assert!(home_path_with("~/runs", Some("".into())).is_err());
    }

    #[test]
    fn every_table_lists_its_fields() {
        for (path, fields) in schema::tables() {
            assert!(!fields.is_empty(), "no fields found for [{path}]");
        }
    }

    #[test]
    fn reports_unknown_keys_and_types_together() {
        let e =
            errors("[loader]\nwokers = 4\nbatch_size = \"big\"\n[model]\narch = \"resnet19\"\n");
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].contains("r.toml:2:1: loader.wokers: unknown key in [loader]"));
        assert!(e[0].contains("did you mean `workers`?"));
        assert!(e[1].contains("r.toml:3:14: loader.batch_size: invalid type: string \"big\""));
        assert!(e[2].contains("model.arch: unknown value `resnet19`"));
        assert!(e[2].contains("did you mean \"resnet18\"?"));
    }

    #[test]
    fn nested_and_inline_tables_are_checked() {
        let e = errors("[data]\nnormalize = { mean = [0.5], sdt = [0.2] }\n");
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains("data.normalize.sdt: unknown key in [data.normalize]"),
            "{}",
            e[0]
        );
        let e = errors("[data.normalize]\nmean = [0.5, \"x\"]\n");
        assert!(e[0].contains("data.normalize.mean"), "{}", e[0]);
    }

    #[test]
    fn a_valid_recipe_keeps_spans() {
        let l = parse(Path::new("r.toml"), "[loader]\nworkers = 2\n".into()).unwrap();
        assert_eq!(l.recipe.loader.workers, 2);
        assert!(l.is_set("loader.workers"));
        assert!(!l.is_set("loader.prefetch"));
        assert_eq!(l.error("loader.workers", "x").line, Some(2));
    }

    #[test]
    fn overrides_are_typed_and_point_at_the_command_line() {
        let mut report = Diagnostics::default();
        let mut doc = Doc::parse(
            Path::new("r.toml"),
            Some("[loader]\nworkers = 2\n".into()),
            &mut report,
        )
        .unwrap();
        doc.apply_sets(
            &["loader.workers=four".into(), "loader.batch_size=16".into()],
            &mut report,
        );
        let l = check(Path::new("r.toml"), doc, report).unwrap();
        assert_eq!(l.recipe.loader.batch_size, 16);
        let e: Vec<String> = l.findings.errors().map(|d| d.to_string()).collect();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("error: --set: loader.workers: invalid type: string \"four\""),
            "{}",
            e[0]
        );
    }
}
