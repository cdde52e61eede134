//! Reading a recipe file: TOML syntax, unknown keys and value types, every finding at once,
//! each pointing at its line and column. Owns the raw `Recipe` (what the user typed, with
//! defaults) and the key → span index that later checks use to point into the file.
//! Rules that span keys, and anything touching the file system beyond reading the recipe,
//! belong to `plan`.

pub mod diag;
pub mod schema;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

pub use diag::{did_you_mean, Diagnostic, Report, Severity};
pub use schema::*;

/// A recipe that parsed and type-checked, with what is needed to point into its source.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub recipe: Recipe,
    /// The recipe file as the user named it.
    pub path: PathBuf,
    pub source: String,
    /// Dotted key → (span of the key, span of the value), for every key in the file.
    spans: BTreeMap<String, (Range<usize>, Range<usize>)>,
    /// Unknown keys and values of the wrong type, already reported and left out of `recipe`
    /// (which holds the defaults in their place). Later checks add to these.
    pub findings: Report,
    dropped: Vec<String>,
}

impl Loaded {
    /// Whether the file sets this dotted key (as opposed to taking its default).
    pub fn is_set(&self, key: &str) -> bool {
        self.spans.contains_key(key) && !self.was_dropped(key)
    }

    /// Whether the key (or a table above it) was reported and dropped: later checks stay
    /// quiet about it rather than report the same mistake twice.
    pub fn was_dropped(&self, key: &str) -> bool {
        self.dropped
            .iter()
            .any(|d| key == d || key.starts_with(&format!("{d}.")))
    }

    /// An error about a key's value, placed at the value when the file sets it.
    pub fn error(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        self.place(Diagnostic::error(&self.path, message).key(key), key)
    }

    /// A warning about a key, placed like `error`.
    pub fn warning(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        self.place(Diagnostic::warning(&self.path, message).key(key), key)
    }

    fn place(&self, d: Diagnostic, key: &str) -> Diagnostic {
        // A key the file does not set is reported at its table's header, if any.
        let mut k = key;
        loop {
            if let Some((_, v)) = self.spans.get(k) {
                return d.at(&self.source, v.clone());
            }
            match k.rfind('.') {
                Some(i) => k = &k[..i],
                None => return d,
            }
        }
    }

    /// The directory that relative paths in the recipe are resolved against.
    pub fn base_dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// Reads and type-checks a recipe file. A file that cannot be read or is not TOML is an
/// error; keys and values that do not fit the format are `findings` of the result, so the
/// checks that follow can add theirs and the user sees every mistake at once.
pub fn load(path: &Path) -> Result<Loaded, Report> {
    let source = std::fs::read_to_string(path).map_err(|e| {
        let help = if e.kind() == std::io::ErrorKind::NotFound {
            "check the path; recipes ship under recipes/ (`runner ls` lists them)"
        } else {
            "check that the file is readable UTF-8 text"
        };
        Report(vec![Diagnostic::error(
            path,
            format!("cannot read recipe: {e}"),
        )
        .help(help)])
    })?;
    parse(path, source)
}

/// Type-checks recipe text that claims to come from `path`.
pub fn parse(path: &Path, source: String) -> Result<Loaded, Report> {
    let mut report = Report::default();
    let (mut doc, syntax) = DeTable::parse_recoverable(&source);
    if !syntax.is_empty() {
        for e in syntax {
            let d = Diagnostic::error(path, format!("TOML syntax: {}", e.message().trim()));
            let d = match e.span() {
                Some(s) => d.at(&source, s),
                None => d,
            };
            report.push(d.help("see https://toml.io for the syntax"));
        }
        return Err(report);
    }
    let mut spans = BTreeMap::new();
    index_spans(doc.get_ref(), "", &mut spans);

    check_unknown_keys(path, &source, &mut doc, &mut report);
    let mut dropped = vec![];
    let recipe = deserialize_collecting(path, &source, &mut doc, &spans, &mut report, &mut dropped);
    match recipe {
        Some(recipe) => Ok(Loaded {
            recipe,
            path: path.to_path_buf(),
            source,
            spans,
            findings: report,
            dropped,
        }),
        None => Err(report.sorted()),
    }
}

fn index_spans(
    t: &DeTable<'_>,
    prefix: &str,
    out: &mut BTreeMap<String, (Range<usize>, Range<usize>)>,
) {
    for (k, v) in t.iter() {
        let path = join(prefix, k.get_ref());
        if let DeValue::Table(inner) = v.get_ref() {
            index_spans(inner, &path, out);
        }
        out.insert(path, (k.span(), v.span()));
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn table_at<'a, 'i>(doc: &'a mut DeTable<'i>, path: &str) -> Option<&'a mut DeTable<'i>> {
    if path.is_empty() {
        return Some(doc);
    }
    let mut t = doc;
    for part in path.split('.') {
        match t.get_mut(part).map(|v| v.get_mut()) {
            Some(DeValue::Table(inner)) => t = inner,
            _ => return None,
        }
    }
    Some(t)
}

/// Reports every key the format does not know, with the nearest known key, and removes it
/// so the type check below sees only known keys.
fn check_unknown_keys(
    path: &Path,
    source: &str,
    doc: &mut Spanned<DeTable<'_>>,
    report: &mut Report,
) {
    let tables = schema::tables();
    for (table_path, allowed) in &tables {
        // A table the user wrote where a value belongs is a type error, reported below.
        let Some(t) = table_at(doc.get_mut(), table_path) else {
            continue;
        };
        let unknown: Vec<(String, Range<usize>)> = t
            .iter()
            .filter(|(k, _)| !allowed.contains(&k.get_ref().as_ref()))
            .map(|(k, _)| (k.get_ref().to_string(), k.span()))
            .collect();
        for (key, span) in unknown {
            let where_ = if table_path.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in [{table_path}]")
            };
            let d = Diagnostic::error(path, format!("unknown key {where_}"))
                .key(join(table_path, &key))
                .at(source, span);
            // A key that belongs to another table is a common slip: say which.
            let home = tables
                .iter()
                .find(|(p, f)| !p.is_empty() && p != table_path && f.contains(&key.as_str()));
            let d = match (home, did_you_mean(&key, allowed)) {
                (Some((other, _)), _) => d.help(format!("`{key}` belongs in [{other}]")),
                (None, Some(s)) => d.help(format!("did you mean `{s}`?")),
                (None, None) => d.help(format!("known keys {where_}: {}", allowed.join(", "))),
            };
            report.push(d);
            t.remove(key.as_str());
        }
    }
}

/// Deserializes the recipe; each value of the wrong type or shape is reported and dropped,
/// and the rest tried again, so one run reports every such value.
fn deserialize_collecting(
    path: &Path,
    source: &str,
    doc: &mut Spanned<DeTable<'_>>,
    spans: &BTreeMap<String, (Range<usize>, Range<usize>)>,
    report: &mut Report,
    dropped: &mut Vec<String>,
) -> Option<Recipe> {
    dropped.extend(report.0.iter().filter_map(|d| d.key.clone()));
    for _ in 0..=spans.len() {
        let de = toml::de::Deserializer::from(doc.clone());
        let err = match Recipe::deserialize(de) {
            Ok(r) => return Some(r),
            Err(e) => e,
        };
        let span = err.span().unwrap_or(0..0);
        // The innermost key whose value holds the error's span.
        let key = spans
            .iter()
            .filter(|(_, (k, v))| {
                (v.start <= span.start && span.end <= v.end.max(v.start + 1))
                    || k.start == span.start
            })
            .max_by_key(|(p, _)| p.matches('.').count())
            .map(|(p, _)| p.clone());
        let mut d = Diagnostic::error(path, friendly(err.message())).at(source, span.clone());
        if let Some(help) = value_help(err.message()) {
            d = d.help(help);
        }
        match key {
            Some(k) => {
                report.push(d.key(k.clone()));
                dropped.push(k.clone());
                let (parent, leaf) = match k.rfind('.') {
                    Some(i) => (&k[..i], &k[i + 1..]),
                    None => ("", k.as_str()),
                };
                let removed = table_at(doc.get_mut(), parent).and_then(|t| t.remove(leaf));
                if removed.is_none() {
                    return None;
                }
            }
            None => {
                report.push(d);
                return None;
            }
        }
    }
    None
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
    if let Some(rest) = m.strip_prefix("unknown variant ") {
        m = format!("unknown value {rest}");
    }
    m
}

/// What to do about a value serde rejected: the nearest allowed word, or the quotes to drop.
fn value_help(msg: &str) -> Option<String> {
    if let Some(rest) = msg.strip_prefix("invalid type: string \"") {
        let (got, expected) = rest.split_once("\", expected ")?;
        let expected = friendly(&format!("expected {expected}"));
        if ["integer", "number", "true or false"]
            .iter()
            .any(|k| expected.contains(k))
        {
            return Some(format!("write {got} without quotes"));
        }
        return None;
    }
    let rest = msg.strip_prefix("unknown variant `")?;
    let (got, rest) = rest.split_once('`')?;
    let allowed: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
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
}
