//! A recipe document assembled from its sources: TOML values plus, for every key, where it
//! was written (file, key span, value span). Owns reading files, following `extends`
//! chains (table-wise merge, cycles refused), and applying `--set key=value` overrides and
//! sweep assignments on top. It knows the format only as far as `extends` goes.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::de::{DeTable, DeValue};

use super::diag::{Diagnostic, Diagnostics};

/// Text a key can come from: a recipe file, or a command-line override.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFile {
    /// The file as named (relative to the working directory), or `--set`.
    pub name: PathBuf,
    pub text: String,
    /// Relative paths written in this source are resolved against this directory.
    pub dir: PathBuf,
}

/// Where a key was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    pub source: usize,
    pub key: Range<usize>,
    pub value: Range<usize>,
}

/// Values and their origins. `table` never holds `extends`.
#[derive(Debug, Clone)]
pub struct Doc {
    pub table: toml::Table,
    /// Dotted key → where its current value was written.
    pub origins: BTreeMap<String, Origin>,
    pub sources: Arc<Vec<SourceFile>>,
}

impl Doc {
    pub fn source(&self, o: &Origin) -> &SourceFile {
        &self.sources[o.source]
    }

    /// A finding about a key, placed at its value (or at the nearest table above it that
    /// the sources write), in the file that wrote it.
    pub fn diagnostic(&self, fallback: &Path, key: &str, d: Diagnostic) -> Diagnostic {
        // A value written only through keys below it (`--set loader.workers.x=1` made
        // `loader.workers` a table): where the last of them was written, not the table
        // around it.
        let below = format!("{key}.");
        let child = (!self.origins.contains_key(key))
            .then(|| {
                self.origins
                    .iter()
                    .filter(|(k, _)| k.starts_with(&below))
                    .max_by_key(|(_, o)| o.source)
                    .map(|(_, o)| o)
            })
            .flatten();
        if let Some(o) = child {
            let s = self.source(o);
            let mut d = d.at(&s.text, o.key.start..o.value.end);
            d.file = s.name.clone();
            return d;
        }
        let mut k = key;
        loop {
            if let Some(o) = self.origins.get(k) {
                let s = self.source(o);
                let mut d = d.at(&s.text, o.value.clone());
                d.file = s.name.clone();
                return d;
            }
            match k.rfind('.') {
                Some(i) => k = &k[..i],
                None => {
                    let mut d = d;
                    d.file = fallback.to_path_buf();
                    return d;
                }
            }
        }
    }

    /// The value at a dotted key.
    pub fn get(&self, key: &str) -> Option<&toml::Value> {
        let mut parts = key.split('.');
        let mut v = self.table.get(parts.next()?)?;
        for p in parts {
            v = v.as_table()?.get(p)?;
        }
        Some(v)
    }

    /// Removes a dotted key (and the origins under it).
    pub fn remove(&mut self, key: &str) -> Option<toml::Value> {
        let (parent, leaf) = split(key);
        let t = if parent.is_empty() {
            Some(&mut self.table)
        } else {
            table_mut(&mut self.table, parent, false)
        };
        let v = t?.remove(leaf);
        self.origins
            .retain(|k, _| k != key && !k.starts_with(&format!("{key}.")));
        v
    }

    /// Removes `leaf`, a key of the table at `parent` (dotted), taken whole: a quoted key
    /// with dots in it (`"loader.workers" = 1`) is one key, which `remove` would split.
    pub fn remove_in(&mut self, parent: &str, leaf: &str) -> Option<toml::Value> {
        let t = if parent.is_empty() {
            Some(&mut self.table)
        } else {
            table_mut(&mut self.table, parent, false)
        };
        let v = t?.remove(leaf);
        let key = if parent.is_empty() {
            leaf.to_string()
        } else {
            format!("{parent}.{leaf}")
        };
        self.origins
            .retain(|k, _| *k != key && !k.starts_with(&format!("{key}.")));
        v
    }

    /// Sets grid axis `axis` (dotted) where the recipe has it: under `[sweep]` as a quoted
    /// key (`"loader.workers" = [0, 2]`, as the shipped grids write it) it is replaced in
    /// place; else set as nested tables.
    fn set_axis(&mut self, axis: &str, value: toml::Value, origin: Origin) -> Result<(), String> {
        let key = format!("sweep.{axis}");
        if let Some(slot) = self
            .table
            .get_mut("sweep")
            .and_then(|s| s.as_table_mut())
            .and_then(|s| s.get_mut(axis))
        {
            *slot = value;
            // The file's values had places of their own (`sweep.<axis>[i]`): those are
            // gone with them, so a finding in a value set here points at the `--set`, and
            // a relative path in it is read from where the `--set` was given.
            let element = format!("{key}[");
            self.origins.retain(|k, _| !k.starts_with(&element));
            self.origins.insert(key, origin);
            return Ok(());
        }
        self.set_merged(&key, value, origin)
    }

    /// Removes a key a `--set '~KEY'` names, a grid axis written quoted (`"loader.workers"`
    /// under `[sweep]`) included; whether there was one.
    fn remove_key(&mut self, key: &str) -> bool {
        let sweep = self.table.get_mut("sweep").and_then(|s| s.as_table_mut());
        let axis = key.strip_prefix("sweep.");
        if let (Some(sweep), Some(axis)) = (sweep, axis) {
            if sweep.remove(axis).is_some() {
                self.origins
                    .retain(|k, _| k != key && !k.starts_with(&format!("{key}.")));
                return true;
            }
        }
        self.remove(key).is_some()
    }

    /// Sets a dotted key, creating tables on the way; the value's origin replaces any
    /// origins under the key.
    pub fn set(&mut self, key: &str, value: toml::Value, origin: Origin) -> Result<(), String> {
        let (parent, leaf) = split(key);
        let t = if parent.is_empty() {
            &mut self.table
        } else {
            table_mut(&mut self.table, parent, true)
                .ok_or_else(|| format!("`{parent}` is not a table"))?
        };
        t.insert(leaf.to_string(), value);
        // (An array's values have places of their own, `key[i]`.)
        let (below, element) = (format!("{key}."), format!("{key}["));
        self.origins
            .retain(|k, _| !k.starts_with(&below) && !k.starts_with(&element));
        self.origins.insert(key.to_string(), origin);
        Ok(())
    }

    /// As `set`, but a table set over a table merges into it key by key, as a recipe's
    /// table merges over the one it extends: `--set 'run={max_steps=3}'` keeps the rest of
    /// `[run]`.
    pub fn set_merged(
        &mut self,
        key: &str,
        value: toml::Value,
        origin: Origin,
    ) -> Result<(), String> {
        match value {
            toml::Value::Table(t) if matches!(self.get(key), Some(toml::Value::Table(_))) => {
                for (k, v) in t {
                    self.set_merged(&format!("{key}.{k}"), v, origin.clone())?;
                }
                Ok(())
            }
            v => self.set(key, v, origin),
        }
    }

    /// Reads `path` and the files it extends, merged (each file's tables over its parent's).
    pub fn load(path: &Path, report: &mut Diagnostics) -> Option<Doc> {
        Self::parse(path, None, report)
    }

    /// As `load`, with the top file's text given (it need not exist on disk; the files it
    /// extends must).
    pub fn parse(path: &Path, text: Option<String>, report: &mut Diagnostics) -> Option<Doc> {
        let mut sources = vec![];
        let (table, origins) = load_chain(path, text, &mut vec![], &mut sources, report)?;
        Some(Doc {
            table,
            origins,
            sources: Arc::new(sources),
        })
    }

    /// Applies `key=value` overrides from the command line. The value is TOML (`4`,
    /// `"step"`, `[1, 2]`, `true`); a bare word that is not TOML is taken as a string.
    pub fn apply_sets(&mut self, sets: &[String], report: &mut Diagnostics) {
        let mut sources = (*self.sources).clone();
        // Each key set (a table's leaves), its value, its argument and where the value
        // starts there.
        let mut set_leaves: Vec<(String, toml::Value, String, usize)> = vec![];
        for arg in sets {
            let text = arg.clone();
            let name = PathBuf::from("--set");
            // `~KEY=VALUE`: a removal takes no value (it was read as the key `~optim`).
            if let Some((k, v)) = arg.strip_prefix('~').and_then(|r| r.split_once('=')) {
                sources.push(SourceFile {
                    name: name.clone(),
                    text: text.clone(),
                    dir: PathBuf::from("."),
                });
                self.sources = Arc::new(sources.clone());
                let (k, v) = (k.trim(), v.trim());
                let help = match v.is_empty() {
                    true => format!("to remove it: --set '~{k}'"),
                    false => format!("to remove it: --set '~{k}'; to set it: --set '{k}={v}'"),
                };
                report.push(
                    Diagnostic::error(&name, "`~KEY` removes a key and takes no value")
                        .at(&text, 0..text.len())
                        .help(help),
                );
                continue;
            }
            // `~KEY` removes a key the recipe (or a file it extends) sets, as Hydra's `~`.
            if let Some(rest) = arg.strip_prefix('~').filter(|_| !arg.contains('=')) {
                sources.push(SourceFile {
                    name: name.clone(),
                    text: text.clone(),
                    dir: PathBuf::from("."),
                });
                self.sources = Arc::new(sources.clone());
                let key = dotted(rest.trim());
                if key.is_empty() || key.split('.').any(str::is_empty) {
                    report.push(
                        Diagnostic::error(&name, format!("`{key}` is not a dotted key"))
                            .at(&text, 0..text.len())
                            .help("e.g. --set '~model.width' removes model.width"),
                    );
                } else if key == "extends" {
                    // Followed when the file was read: its keys are merged in by then (it
                    // said "not set by the recipe", of a file that sets it).
                    report.push(
                        Diagnostic::error(&name, "`extends` cannot be removed with --set")
                            .at(&text, 0..text.len())
                            .help("the file it names is read with the recipe; to run without it, write a recipe that does not extend it"),
                    );
                } else if !self.remove_key(&key) {
                    let swept = self
                        .get("sweep")
                        .and_then(|s| s.as_table())
                        .is_some_and(|s| s.contains_key(&key))
                        || self.get(&format!("sweep.{key}")).is_some();
                    let set: Vec<&str> = self.origins.keys().map(String::as_str).collect();
                    let help = if swept {
                        format!("it is a grid axis: remove the axis with --set '~sweep.\"{key}\"'")
                    } else if let Some(near) = super::did_you_mean(&key, &set) {
                        format!("did you mean `{near}`?")
                    } else {
                        "check the key's spelling (`runner schema` lists the keys); a key left out takes its default".into()
                    };
                    report.push(
                        Diagnostic::error(
                            &name,
                            format!(
                                "`{key}` is not set by the recipe, so there is nothing to remove"
                            ),
                        )
                        .at(&text, 1..text.len())
                        .help(help),
                    );
                }
                continue;
            }
            let Some((key, raw)) = arg.split_once('=') else {
                sources.push(SourceFile {
                    name: name.clone(),
                    text: text.clone(),
                    dir: PathBuf::from("."),
                });
                report.push(
                    Diagnostic::error(&name, format!("`{arg}` is not key=value"))
                        .at(&text, 0..text.len())
                        .help("e.g. --set loader.workers=4 or --set cleanup.every=\"step\""),
                );
                continue;
            };
            let (key, raw) = (key.trim(), raw.trim());
            let key_span = 0..at_key_end(arg);
            // TOML's quoted keys (`sweep."loader.workers"`), as a recipe file may write them.
            let key = &dotted(key);
            let at = arg.find('=').unwrap_or(0) + 1;
            sources.push(SourceFile {
                name: name.clone(),
                text: text.clone(),
                dir: PathBuf::from("."),
            });
            // `extends` is followed before any override is applied.
            if key == "extends" {
                report.push(
                    Diagnostic::error(&name, "extends cannot be set with --set: the recipe's own `extends` is read before any --set")
                        .at(&text, key_span)
                        .help("run the other recipe with these --set, or write a recipe that extends it"),
                );
                continue;
            }
            let parsed = toml::from_str::<toml::Table>(&format!("v = {raw}"));
            // `--set 'name="a"\nseed=5'` is TOML for two keys: the second would be dropped.
            if parsed.as_ref().is_ok_and(|t| t.len() > 1) {
                report.push(
                    Diagnostic::error(
                        &name,
                        format!("the value of `{key}` holds more keys after it"),
                    )
                    .at(&text, 0..text.len())
                    .help("give each key its own --set"),
                );
                continue;
            }
            // A number TOML cannot hold would otherwise become a string, and be refused as one;
            // for a key that takes no number (`name=007`, `checkpoint.save_final=01`) it is the
            // string, as any word TOML does not read (the help said to write 7: refused next).
            let digits = raw.strip_prefix(['-', '+']).unwrap_or(raw);
            if parsed.is_err()
                && !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit() || c == '_')
                && super::takes_number(key)
            {
                let written = digits.replace('_', "");
                let help = match written.trim_start_matches('0') {
                    // `04`: TOML allows no leading zeros.
                    n if n.len() < written.len() && (n.is_empty() || n.parse::<i64>().is_ok()) => {
                        let sign = if raw.starts_with('-') { "-" } else { "" };
                        format!(
                            "write {sign}{}: TOML integers have no leading zeros",
                            if n.is_empty() { "0" } else { n }
                        )
                    }
                    // `1_0_`: an underscore only between two digits.
                    n if raw.contains('_') && n.parse::<i64>().is_ok() => {
                        let sign = if raw.starts_with('-') { "-" } else { "" };
                        format!("write {sign}{n}: in TOML an underscore goes between two digits")
                    }
                    _ => "TOML integers are 64-bit signed: at most 9223372036854775807".into(),
                };
                report.push(
                    Diagnostic::error(&name, format!("{key}: {raw} is not a TOML integer"))
                        .at(&text, at..text.len())
                        .help(help),
                );
                continue;
            }
            // Likewise a float past f64's range (TOML reads `1e400` as an overflow).
            if parsed.is_err()
                && digits.starts_with(|c: char| c.is_ascii_digit())
                && raw.parse::<f64>().is_ok_and(f64::is_infinite)
                && super::takes_number(key)
            {
                report.push(
                    Diagnostic::error(&name, format!("{key}: {raw} is too large for a float"))
                        .at(&text, at..text.len())
                        .help("TOML floats are 64-bit: at most 1.7976931348623157e308"),
                );
                continue;
            }
            // A value that opens as TOML does (an array, a table, a quoted string) but does
            // not parse is a typo, not a string: `[128, 64` would be refused as "a string,
            // expected an array", and `"a" b` taken as the name `"a" b`, quotes and all.
            // Free text (`name`, `description`) may open with a bracket, as it always
            // could (`description=[wip] adam`); a quote that does not close is a typo
            // everywhere (`log.dir="/x` made a folder named `"`).
            if let Err(e) = &parsed {
                let free_text = matches!(key.as_str(), "name" | "description");
                if raw.starts_with(['"', '\'']) || (raw.starts_with(['[', '{']) && !free_text) {
                    let what = e.message().trim_end_matches('\n').replace('\n', "; ");
                    let shown = super::diag::shorten(raw, 60);
                    // `[trim_host]`: words in an array are strings, which TOML quotes.
                    let help = match quoted_words(raw) {
                        Some(fixed) => format!("the words in it are strings, which TOML quotes: --set '{key}={fixed}'"),
                        None => "close the array, table or string; a string with no quotes in it may go unquoted: --set name=my-run, or in single quotes for the shell: --set 'name=\"my run\"'".into(),
                    };
                    report.push(
                        Diagnostic::error(
                            &name,
                            format!("{key}: {shown} is not a TOML value: {what}"),
                        )
                        .at(&text, at..text.len())
                        .help(help),
                    );
                    continue;
                }
            }
            // TOML if it parses as TOML, else the text as a string (as `parse_value`).
            let value = parsed
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.to_string()));
            let origin = Origin {
                source: sources.len() - 1,
                key: key_span,
                value: at..text.len(),
            };
            self.sources = Arc::new(sources.clone());
            if key.is_empty() || key.split('.').any(str::is_empty) {
                report.push(
                    Diagnostic::error(&name, format!("`{key}` is not a dotted key"))
                        .at(&text, 0..at)
                        .help("e.g. loader.workers"),
                );
                continue;
            }
            // A grid axis the recipe writes quoted (`"loader.workers" = [0, 2]` under
            // [sweep], as the shipped grids do) is replaced where it stands: set as nested
            // tables it would be a second axis of the same key (refused as swept twice).
            // Axes given as a table (`sweep={"loader.workers"=[1]}`, `sweep.loader={workers=
            // [1]}`) are set one by one, each as `sweep.<axis>=` would be: merged as tables,
            // a quoted axis became a second one of the same key.
            if key.starts_with("sweep.") || (key == "sweep" && value.is_table()) {
                let prefix = key.strip_prefix("sweep").unwrap_or_default();
                let prefix = prefix.strip_prefix('.').unwrap_or(prefix);
                let mut leaves = vec![];
                axis_leaves(prefix, value, &mut leaves);
                for (axis, value) in leaves {
                    if let Err(e) = self.set_axis(&axis, value, origin.clone()) {
                        report.push(Diagnostic::error(&name, e).key(key).at(&text, 0..at));
                    }
                }
                continue;
            }
            let mut leaves = vec![];
            axis_leaves(key, value.clone(), &mut leaves);
            set_leaves.extend(leaves.into_iter().map(|(k, v)| (k, v, text.clone(), at)));
            if let Err(e) = self.set_merged(key, value, origin) {
                report.push(Diagnostic::error(&name, e).key(key).at(&text, 0..at));
            }
        }
        self.sources = Arc::new(sources);
        // A key the grid sweeps takes each cell's value: a --set of it would be overridden
        // in every cell, in silence (the run is not what was asked).
        for (key, value, text, at) in set_leaves {
            if !self.is_axis(&key) {
                continue;
            }
            report.push(
                Diagnostic::error(
                    Path::new("--set"),
                    format!("set to {value}, but it is an axis of the recipe's grid, whose cells each take their own value from [sweep]: this --set would change no cell"),
                )
                .key(&key)
                .at(&text, at..text.len())
                .help(format!(
                    "to run the grid with this value only: --set 'sweep.\"{key}\"=[{value}]'; to drop the axis and set the key: --set '~sweep.\"{key}\"' --set '{key}={value}'"
                )),
            );
        }
    }

    /// Whether `key` (dotted) is an axis of the recipe's grid, however [sweep] writes it:
    /// quoted (`"loader.workers" = [..]`), as nested tables, or both (`[sweep.data]`
    /// `"normalize.on" = [..]`).
    fn is_axis(&self, key: &str) -> bool {
        self.table
            .get("sweep")
            .and_then(|s| s.as_table())
            .is_some_and(|s| crate::sweep::swept_keys(s).iter().any(|k| k == key))
    }
}

/// The axes a `--set sweep...=` value gives: `(dotted axis, values)` for each value that is
/// not a table, under `prefix` (the key's part after `sweep.`). An empty prefix and a value
/// that is not a table is `--set sweep=[..]`, left to be refused as a sweep that is no table.
fn axis_leaves(prefix: &str, value: toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let axis = match prefix {
                    "" => k,
                    p => format!("{p}.{k}"),
                };
                axis_leaves(&axis, v, out);
            }
        }
        v => out.push((prefix.to_string(), v)),
    }
}

/// Where a `key=value` argument's key ends (its trailing spaces left out).
fn at_key_end(arg: &str) -> usize {
    arg.split_once('=').map_or(0, |(k, _)| k.trim_end().len())
}

/// A `--set` key as the dotted path the recipe's keys use: `sweep."loader.workers"` and
/// `sweep.loader.workers` are one key; a key TOML cannot read is left as written.
fn dotted(key: &str) -> String {
    let Ok(mut t) = toml::from_str::<toml::Table>(&format!("{key} = 0")) else {
        return key.to_string();
    };
    let mut parts = vec![];
    loop {
        let Some((k, v)) = t.into_iter().next() else {
            return key.to_string();
        };
        parts.push(k);
        match v {
            toml::Value::Table(inner) => t = inner,
            _ => return parts.join("."),
        }
    }
}

/// A command-line or sweep value: TOML if it parses as TOML, else the text as a string.
pub fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

fn split(key: &str) -> (&str, &str) {
    match key.rfind('.') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => ("", key),
    }
}

fn table_mut<'a>(t: &'a mut toml::Table, path: &str, create: bool) -> Option<&'a mut toml::Table> {
    let mut t = t;
    for part in path.split('.') {
        if create && !t.contains_key(part) {
            t.insert(part.to_string(), toml::Value::Table(toml::Table::new()));
        }
        t = t.get_mut(part)?.as_table_mut()?;
    }
    Some(t)
}

fn load_chain(
    path: &Path,
    text: Option<String>,
    stack: &mut Vec<PathBuf>,
    sources: &mut Vec<SourceFile>,
    report: &mut Diagnostics,
) -> Option<(toml::Table, BTreeMap<String, Origin>)> {
    let text = read_text(path, text, report)?;
    let (mut table, mut origins) = parse(path, &text, sources.len(), report)?;
    let dir = super::folder_of(path);
    sources.push(SourceFile {
        name: path.to_path_buf(),
        text: text.clone(),
        dir: dir.clone(),
    });

    let Some(extends) = table.remove("extends") else {
        return Some((table, origins));
    };
    let here = |key: &str| {
        let o = &origins[key];
        (o.value.clone(), o.key.clone())
    };
    let Some(parent) = extends.as_str() else {
        report.push(
            Diagnostic::error(
                path,
                "extends must be a string: the path of the recipe this one builds on",
            )
            .key("extends")
            .at(&text, here("extends").0)
            .help("e.g. extends = \"base.toml\" (relative to this file)"),
        );
        return None;
    };
    if parent.trim().is_empty() {
        report.push(
            Diagnostic::error(path, "extends is empty")
                .key("extends")
                .at(&text, here("extends").0)
                .help("name the recipe file this one builds on, e.g. extends = \"base.toml\" (relative to this file), or remove the key"),
        );
        return None;
    }
    // `..` after a folder that is a symbolic link leaves the link's target, as the OS has
    // it (and as data paths are opened): the path folded (`a/b/../c` as `a/c`, for
    // messages) only where it is the same file; else as written. (Folded first, a base
    // file beside the link was read where the OS opens the one beside its target.)
    // `~/` is this user's home, as in the recipe's other paths.
    let raw = match super::home_path(parent) {
        Ok(p) => dir.join(p),
        Err(e) => {
            report.push(
                Diagnostic::error(path, e)
                    .key("extends")
                    .at(&text, here("extends").0),
            );
            return None;
        }
    };
    let folded = super::lexical(&raw);
    let same_file = |a: &Path, b: &Path| matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y);
    let parent_path = match raw.exists() {
        true if same_file(&raw, &folded) => folded,
        true => raw,
        false => folded,
    };
    let canonical = std::fs::canonicalize(&parent_path).unwrap_or_else(|_| parent_path.clone());
    let me_canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    stack.push(me_canonical);
    if stack.contains(&canonical) {
        let chain: Vec<String> = stack
            .iter()
            .chain([&canonical])
            .map(|p| {
                p.file_name()
                    .map_or(String::new(), |n| n.to_string_lossy().into_owned())
            })
            .collect();
        report.push(
            Diagnostic::error(
                path,
                format!("extends forms a cycle: {}", chain.join(" → ")),
            )
            .key("extends")
            .at(&text, here("extends").0)
            .help("a recipe cannot extend itself, directly or through others"),
        );
        return None;
    }
    if !parent_path.is_file() {
        let (what, help) = if parent_path.is_dir() {
            (
                "is a directory, not a recipe file",
                "name the .toml file to build on, relative to this recipe file",
            )
        } else if parent_path.exists() {
            (
                "is not a regular file",
                "name the .toml file to build on, relative to this recipe file",
            )
        } else {
            match super::why_missing(&parent_path).as_str() {
                "does not exist" if parent.starts_with('~') => (
                    "no such file",
                    "a leading ~ is $HOME; check the path under it",
                ),
                "does not exist" => ("no such file", "the path is relative to this recipe file"),
                _ => (
                    "cannot be read (a dangling or looping symbolic link, or a folder on the way this user may not enter)",
                    "check the path, its links and the permissions of the folders on the way",
                ),
            }
        };
        report.push(
            Diagnostic::error(
                path,
                format!("extends {}: {what}", super::lexical(&parent_path).display()),
            )
            .key("extends")
            .at(&text, here("extends").0)
            .help(help),
        );
        return None;
    }
    let before = report.0.len();
    let Some((mut base, mut base_origins)) = load_chain(&parent_path, None, stack, sources, report)
    else {
        // A file that cannot be read as a recipe (a data file, too large) is one the user
        // never named: where this recipe names it is said with it.
        let at = Diagnostic::error(path, "").at(&text, here("extends").0);
        let whence = format!(
            "it is what {}:{}:{} extends",
            path.display(),
            at.line.unwrap_or(1),
            at.col.unwrap_or(1)
        );
        for d in report.0[before..].iter_mut() {
            if d.file == parent_path && d.line.is_none() && d.note.is_none() {
                d.note = Some(whence.clone());
            }
        }
        return None;
    };
    stack.pop();
    origins.remove("extends");
    merge(&mut base, &mut base_origins, table, origins, "");
    Some((base, base_origins))
}

/// The most a recipe file may hold. Recipes are a few KiB; this stops a path that is not
/// one (`/dev/zero`, a data file given by mistake) from being read without end.
pub const MAX_RECIPE_BYTES: u64 = 4 << 20;

/// The recipe's text: given, or read from `path` (at most `MAX_RECIPE_BYTES`).
fn read_text(path: &Path, text: Option<String>, report: &mut Diagnostics) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(t) = text {
        return Some(t);
    }
    // Opened without waiting for a writer: a named pipe nothing writes to waited for
    // ever. Then read as usual, so a pipe with a writer (`runner <(make-recipe)`) is read
    // to its end; one without reads as empty at once.
    let pipe = super::odd_kind(path) == Some("a named pipe");
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(if pipe { libc::O_NONBLOCK } else { 0 })
        .open(path)
        .and_then(|f| {
            use std::io::Read as _;
            if pipe {
                use std::os::fd::AsRawFd as _;
                // SAFETY: plain fcntl calls on a descriptor this function owns.
                unsafe {
                    let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
                }
            }
            let mut bytes = vec![];
            f.take(MAX_RECIPE_BYTES + 1).read_to_end(&mut bytes)?;
            Ok(bytes)
        });
    match read {
        // `/dev/null` read as an empty recipe, then refused for what it lacks.
        Ok(bytes) if bytes.is_empty() && super::odd_kind(path) == Some("a device") => {
            report.push(
                Diagnostic::error(
                    path,
                    "cannot read recipe: a device, not a file (it reads empty)",
                )
                .help("give the recipe file (.toml)"),
            );
            None
        }
        Ok(bytes) if pipe && bytes.is_empty() => {
            report.push(
                Diagnostic::error(
                    path,
                    "cannot read recipe: a named pipe that nothing writes to",
                )
                .help("give the recipe file (.toml), or write the recipe into the pipe"),
            );
            None
        }
        Ok(bytes) if bytes.len() as u64 > MAX_RECIPE_BYTES => {
            report.push(
                Diagnostic::error(
                    path,
                    format!(
                        "cannot read recipe: more than {} MiB; a recipe is a short TOML text",
                        MAX_RECIPE_BYTES >> 20
                    ),
                )
                .help("check the path: is this the recipe (a .toml file), not a data file or a device?"),
            );
            None
        }
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(t) => Some(t),
            // Not UTF-8: where, so the byte can be found.
            Err(e) => {
                report.push(
                    Diagnostic::error(
                        path,
                        format!("cannot read recipe: {}", crate::metrics::not_utf8(&e)),
                    )
                    .help("save the recipe as UTF-8 (TOML files are UTF-8)"),
                );
                None
            }
        },
        Err(e) => {
            let shown = path.display().to_string();
            // `runner validate loader.workers=1`: an override without its `--set`.
            let set = format!("to change a key of a recipe: runner RECIPE --set '{shown}'");
            let help = if e.kind() == std::io::ErrorKind::NotFound
                && shown.contains('=')
                && !shown.contains('/')
            {
                set.as_str()
            } else if e.kind() == std::io::ErrorKind::NotFound {
                "check the path; recipes ship under recipes/ (`runner ls` lists them)"
            } else if path.is_dir() {
                "give a recipe file (.toml), not a directory; `runner ls` lists the shipped ones"
            } else {
                "check that the file is readable UTF-8 text"
            };
            report.push(Diagnostic::error(path, format!("cannot read recipe: {e}")).help(help));
            None
        }
    }
}

/// The recipe's table and where each key and value sits (`source` is the file's index
/// among the sources); every syntax error is reported.
fn parse(
    path: &Path,
    text: &str,
    source: usize,
    report: &mut Diagnostics,
) -> Option<(toml::Table, BTreeMap<String, Origin>)> {
    let (de, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        // The recovering parser may meet one mistake twice (an inline table extended by a
        // later header): said once.
        let mut said: Vec<(String, Option<std::ops::Range<usize>>)> = vec![];
        // After a carriage return alone the parser reads the rest of its line as new keys:
        // errors it then finds on that line are the same mistake.
        let mut bare_cr_line: Option<usize> = None;
        let line_of =
            |s: &std::ops::Range<usize>| text[..s.start.min(text.len())].matches('\n').count();
        for e in syntax {
            let key = (e.message().trim().to_string(), e.span());
            if said.contains(&key) {
                continue;
            }
            if e.span().is_some_and(|s| Some(line_of(&s)) == bare_cr_line) {
                continue;
            }
            said.push(key);
            let message = e.message().trim();
            let d = Diagnostic::error(path, format!("TOML syntax: {message}"));
            let d = match e.span() {
                Some(s) => d.at(text, s),
                None => d,
            };
            let help = if message.starts_with("carriage return") {
                bare_cr_line = e.span().map(|s| line_of(&s));
                "a carriage return alone is no line end in TOML (classic Mac OS wrote them): save the file with LF or CRLF line ends"
            } else if message.starts_with("duplicate key") {
                "a table or key is written once in a file: merge this one into the first"
            } else {
                "see https://toml.io for the syntax"
            };
            report.push(d.help(help));
        }
        return None;
    }
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            let message = e.message().trim();
            // An integer past 64 bits: "invalid type: integer `1…6` as i128, expected any
            // valid TOML value" said neither what is wrong nor what to do.
            let d = match message
                .strip_prefix("invalid type: integer `")
                .and_then(|m| m.split_once("` as i128"))
            {
                Some((n, _)) => Diagnostic::error(path, format!("{n} is not a TOML integer"))
                    .help("TOML integers are 64-bit signed: at most 9223372036854775807"),
                None if message.contains("value was too large") => {
                    Diagnostic::error(path, "integer too large for TOML")
                        .help("TOML integers are 64-bit signed: at most 9223372036854775807")
                }
                None if message.contains("number overflowed") => {
                    Diagnostic::error(path, "number too large for a TOML float")
                        .help("TOML floats are 64-bit: at most 1.7976931348623157e308")
                }
                None => Diagnostic::error(path, format!("TOML: {message}")),
            };
            report.push(match e.span() {
                Some(s) => d.at(text, s),
                None => d,
            });
            return None;
        }
    };
    let mut origins = BTreeMap::new();
    index_spans(de.get_ref(), "", source, &mut origins);
    Some((table, origins))
}

/// Merges `child` over `base`: tables merge key by key, anything else replaces.
fn merge(
    base: &mut toml::Table,
    base_origins: &mut BTreeMap<String, Origin>,
    child: toml::Table,
    child_origins: BTreeMap<String, Origin>,
    prefix: &str,
) {
    for (k, v) in child {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(c)) => {
                let sub: BTreeMap<String, Origin> = child_origins
                    .iter()
                    .filter(|(p, _)| p.starts_with(&format!("{path}.")))
                    .map(|(p, o)| (p.clone(), o.clone()))
                    .collect();
                merge(b, base_origins, c, sub, &path);
                if let Some(o) = child_origins.get(&path) {
                    base_origins.insert(path.clone(), o.clone());
                }
            }
            (_, v) => {
                base.insert(k, v);
                base_origins.retain(|p, _| p != &path && !p.starts_with(&format!("{path}.")));
                for (p, o) in child_origins
                    .iter()
                    .filter(|(p, _)| *p == &path || p.starts_with(&format!("{path}.")))
                {
                    base_origins.insert(p.clone(), o.clone());
                }
            }
        }
    }
}

fn index_spans(t: &DeTable<'_>, prefix: &str, source: usize, out: &mut BTreeMap<String, Origin>) {
    for (k, v) in t.iter() {
        let path = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        match v.get_ref() {
            DeValue::Table(inner) => index_spans(inner, &path, source, out),
            // Array elements too, so a sweep can point at the one value that is wrong.
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    out.insert(
                        format!("{path}[{i}]"),
                        Origin {
                            source,
                            key: k.span(),
                            value: item.span(),
                        },
                    );
                }
            }
            _ => {}
        }
        out.insert(
            path,
            Origin {
                source,
                key: k.span(),
                value: v.span(),
            },
        );
    }
}

/// An array of bare words (`[trim_host, sync]`), or an inline table of bare-word values
/// (`{on = host}`), with each word quoted, where that makes it TOML: what an unquoted
/// string in it was meant to be.
fn quoted_words(raw: &str) -> Option<String> {
    if let Some(inner) = raw
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
    {
        let mut changed = false;
        let pairs: Vec<String> = inner
            .split(',')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => {
                    let v = v.trim();
                    match quoted_words(&format!("[{v}]")) {
                        Some(q) => {
                            changed = true;
                            format!("{} = {}", k.trim(), &q[1..q.len() - 1])
                        }
                        None => format!("{} = {v}", k.trim()),
                    }
                }
                None => pair.trim().to_string(),
            })
            .collect();
        let fixed = format!("{{{}}}", pairs.join(", "));
        return (changed && toml::from_str::<toml::Table>(&format!("v = {fixed}")).is_ok())
            .then_some(fixed);
    }
    let inner = raw.trim().strip_prefix('[')?.strip_suffix(']')?;
    let bare = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && !matches!(w, "true" | "false" | "inf" | "nan")
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let words: Vec<&str> = inner
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    if !words.iter().any(|w| bare(w)) {
        return None;
    }
    let fixed = words
        .iter()
        .map(|w| match bare(w) {
            true => format!("\"{w}\""),
            false => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let fixed = format!("[{fixed}]");
    toml::from_str::<toml::Table>(&format!("v = {fixed}"))
        .is_ok()
        .then_some(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_from_the_command_line_are_toml_or_strings() {
        assert_eq!(parse_value("4"), toml::Value::Integer(4));
        assert_eq!(parse_value("\"step\""), toml::Value::String("step".into()));
        assert_eq!(parse_value("step"), toml::Value::String("step".into()));
        assert_eq!(
            parse_value("[1, 2]"),
            toml::Value::Array(vec![1.into(), 2.into()])
        );
        assert_eq!(parse_value("true"), toml::Value::Boolean(true));
    }
}
