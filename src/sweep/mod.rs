//! Sweeps: a `[sweep]` table of dotted keys and lists of values expands into the cartesian
//! product of cells, in a fixed order (keys in file order, the last key varying fastest).
//! Each cell is the recipe with those values set, checked like any recipe, with a readable
//! name and an id derived from its resolved recipe; sharding. The sweep directory (a
//! manifest of the cells, one status file and lock per cell) and running the cells are in
//! `state`; the Slurm job-array script in `crate::slurm`. Running a cell is a function the
//! caller passes in; nothing here knows Burn.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::metrics::write_json_atomic;
use crate::plan::{self, Machine, Plan};
use crate::recipe::{self, schema, Diagnostic, Diagnostics, Loaded, Origin, Recipe};

/// Cells a grid may have unless `--max-cells` says otherwise.
pub const DEFAULT_MAX_CELLS: usize = 256;
/// The most `--max-cells` may allow: every cell is resolved and validated before the
/// first one runs (about 50 KB of memory each).
pub const MAX_CELLS_LIMIT: usize = 10_000;

/// One swept key and its values, with where each value was written.
#[derive(Debug, Clone)]
pub struct Axis {
    pub key: String,
    /// The shortest unambiguous name of the key, used in cell names.
    pub label: String,
    pub values: Vec<toml::Value>,
    pub origins: Vec<Option<Origin>>,
}

/// One cell of a grid.
#[derive(Debug, Clone)]
pub struct Cell {
    /// 0-based position in the expansion order.
    pub index: usize,
    /// `base/key=value,...` (just `base` for a recipe without a grid).
    pub name: String,
    /// Stable id ([`cell_id`]), from the cell's resolved recipe: set by [`check`], once the
    /// cell is validated (empty before).
    pub id: String,
    /// Its ids as earlier runners made them ([`earlier_cell_ids`]): `--resume` finds cells
    /// done by those in their sweep directories, so a grid in progress at an upgrade runs
    /// none again.
    pub earlier_ids: Vec<String>,
    /// The name its id is made with: `base/key=value,...` whatever its length. `name`
    /// falls back to the cell's index where that is too long for a directory, and an
    /// index moves when a value is added to an axis; the id must not, or `--resume`
    /// would run the done cells of a grown grid again.
    pub id_name: String,
    pub assignments: Vec<(String, toml::Value)>,
    pub loaded: Loaded,
}

/// Every leaf key of the format (`loader.workers`, ...).
fn all_keys() -> Vec<String> {
    schema::leaf_keys()
}

/// The shortest dotted suffix of `key` that no other key of the format ends with (at least
/// three letters long, so `on` reads `normalize.on`).
pub fn label(key: &str) -> String {
    let keys = all_keys();
    let parts: Vec<&str> = key.split('.').collect();
    for n in 1..=parts.len() {
        let suffix = parts[parts.len() - n..].join(".");
        let unique = keys
            .iter()
            .filter(|k| **k == suffix || k.ends_with(&format!(".{suffix}")))
            .count()
            <= 1;
        if unique && suffix.len() >= 3 {
            return suffix;
        }
    }
    key.to_string()
}

/// A value as it appears in a cell name.
fn show(v: &toml::Value) -> String {
    let s = match v {
        toml::Value::String(s) => s.clone(),
        // Debug writes 1e300 as `1e300`, where Display writes 301 digits.
        toml::Value::Float(f) => format!("{f:?}"),
        toml::Value::Array(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(";")),
        other => other.to_string(),
    };
    s.replace(['/', '\\'], "_")
}

/// Flattens the `[sweep]` table into axes, in file order; dotted keys may be written quoted
/// (`"loader.workers" = [...]`) or as nested tables.
fn axes(loaded: &Loaded, report: &mut Diagnostics) -> Vec<Axis> {
    let Some(sweep) = &loaded.sweep else {
        return vec![];
    };
    let mut leaves: Vec<(String, String, toml::Value)> = vec![];
    walk(sweep, "", "sweep", &mut leaves);
    let known = all_keys();
    let mut seen = BTreeSet::new();
    let mut out = vec![];
    let err = |okey: &str, key: &str, msg: String, help: String| {
        loaded
            .doc
            .diagnostic(
                &loaded.path,
                okey,
                Diagnostic::error(&loaded.path, msg).key(format!("sweep.{key}")),
            )
            .help(help)
    };
    for (key, okey, value) in leaves {
        if !seen.insert(key.clone()) {
            report.push(err(
                &okey,
                &key,
                "the same key is swept twice".into(),
                "write each key once, quoted or as a table, not both".into(),
            ));
            continue;
        }
        // A list of tables under a table's key (`"data.normalize" = [{on = "host"}, ..]`):
        // each axis sweeps one key, and cells are the product of the axes.
        let inner: Vec<&str> = known
            .iter()
            .filter_map(|k| k.strip_prefix(&format!("{key}.")))
            .collect();
        if !inner.is_empty() {
            let list = inner
                .iter()
                .map(|k| format!("`{key}.{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            report.push(err(
                &okey,
                &key,
                format!("`{key}` is a table: an axis sweeps one of its keys, not the table"),
                format!(
                    "sweep its keys, each as an axis of its own: {list} \
                     (e.g. \"{key}.{}\" = [..])",
                    inner[0]
                ),
            ));
            continue;
        }
        if !known.contains(&key) {
            let near: Vec<&str> = known.iter().map(String::as_str).collect();
            let help = match recipe::did_you_mean(&key, &near) {
                Some(s) => format!("did you mean `{s}`?"),
                None => "sweep keys are recipe keys, e.g. \"loader.workers\" (see README)".into(),
            };
            report.push(err(
                &okey,
                &key,
                format!("`{key}` is not a recipe key"),
                help,
            ));
            continue;
        }
        // Keys that are one for the whole grid: the job script's resources, and what
        // names or describes it. Swept, every cell got the first cell's.
        let whole_grid = if key.starts_with("slurm.") {
            Some((
                "the job script is one for the whole grid: every array task gets the same resources",
                "set it once, outside [sweep]; for other resources, another grid",
            ))
        } else if key == "name" {
            Some((
                "the grid's cells are named after it and their values",
                "remove the axis: each cell already has a name of its own",
            ))
        } else if key == "description" {
            Some((
                "the description is the grid's, and changes nothing that runs",
                "remove the axis",
            ))
        } else {
            None
        };
        if let Some((why, help)) = whole_grid {
            report.push(err(
                &okey,
                &key,
                format!("`{key}` cannot be swept: {why}"),
                help.into(),
            ));
            continue;
        }
        let Some(values) = sweep_values(loaded, (&key, &okey), value, &err, report) else {
            continue;
        };
        // Each value where it was written; the list as a whole where its values have no
        // place of their own (a `--set sweep.k=[..]`), not the top of the recipe file.
        let origins = (0..values.len())
            .map(|i| {
                let o = &loaded.doc.origins;
                o.get(&format!("{okey}[{i}]"))
                    .or_else(|| o.get(&okey))
                    .cloned()
            })
            .collect();
        out.push(Axis {
            label: label(&key),
            key,
            values,
            origins,
        });
    }
    out
}

/// The dotted keys a `[sweep]` table sweeps, however written (quoted, or as tables).
pub(crate) fn swept_keys(sweep: &toml::Table) -> Vec<String> {
    let mut leaves = vec![];
    walk(sweep, "", "sweep", &mut leaves);
    leaves.into_iter().map(|(key, _, _)| key).collect()
}

/// The `[sweep]` table's leaves: (dotted recipe key, its place in the file, values).
fn walk(
    t: &toml::Table,
    prefix: &str,
    origin_prefix: &str,
    out: &mut Vec<(String, String, toml::Value)>,
) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let okey = format!("{origin_prefix}.{k}");
        match v {
            toml::Value::Table(inner) => walk(inner, &key, &okey, out),
            other => out.push((key, okey, other.clone())),
        }
    }
}

/// A swept key's list of values, or the error it gets: not a list, empty, or a value
/// listed twice.
fn sweep_values(
    loaded: &Loaded,
    (key, okey): (&str, &str),
    value: toml::Value,
    err: &dyn Fn(&str, &str, String, String) -> Diagnostic,
    report: &mut Diagnostics,
) -> Option<Vec<toml::Value>> {
    let toml::Value::Array(values) = value else {
        report.push(err(
            okey,
            key,
            "a sweep value must be a list of the values to try".into(),
            format!("\"{key}\" = [a, b, c]"),
        ));
        return None;
    };
    if values.is_empty() {
        report.push(err(
            okey,
            key,
            "an empty list makes an empty grid".into(),
            "list at least one value".into(),
        ));
        return None;
    }
    // More values than any grid may have cells is refused before they are compared, pair
    // by pair (100,000 of them took minutes).
    if values.len() > MAX_CELLS_LIMIT {
        report.push(err(
            okey,
            key,
            format!(
                "{} values: more than any grid may have cells ({MAX_CELLS_LIMIT})",
                values.len()
            ),
            format!("sweep fewer values, or split the grid into recipes of at most {MAX_CELLS_LIMIT} cells"),
        ));
        return None;
    }
    if let Some(j) =
        (1..values.len()).find(|&j| values[..j].iter().any(|v| same_value(v, &values[j])))
    {
        let at = format!("{okey}[{j}]");
        let place = if loaded.doc.origins.contains_key(&at) {
            at
        } else {
            okey.to_string()
        };
        report.push(err(
            &place,
            key,
            format!(
                "{} is listed twice: the two cells would be the same run",
                values[j]
            ),
            "list each value once (repeat runs with separate invocations)".into(),
        ));
        return None;
    }
    Some(values)
}

/// Whether two sweep values are the same setting: equal, with an integer and a float of
/// the same number taken as one (`[1, 1.0]` of a float key made two cells of one run).
fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    use toml::Value::{Array, Float, Integer, Table};
    match (a, b) {
        (Integer(i), Float(f)) | (Float(f), Integer(i)) => *i as f64 == *f,
        (Array(x), Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Table(x), Table(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// The value indices of every cell, last axis fastest.
pub fn product(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in sizes {
        out = out
            .into_iter()
            .flat_map(|prefix| (0..n).map(move |i| [prefix.clone(), vec![i]].concat()))
            .collect();
    }
    out
}

/// The cells of a recipe: one for a plain recipe, the whole grid for one with `[sweep]`.
/// Every cell is type-checked; all findings come back together (each once).
pub fn cells(loaded: &Loaded, max_cells: usize) -> Result<Vec<Cell>, Diagnostics> {
    let cells = expand(loaded, max_cells)?;
    let mut report = Diagnostics::default();
    for c in &cells {
        report.0.extend(c.loaded.findings.0.iter().cloned());
    }
    if report.has_errors() {
        return Err(dedup(report));
    }
    Ok(cells)
}

/// As `cells`, but a cell's own findings (unknown keys, wrong types) stay in its `loaded`
/// for validation to report with every other finding; only a grid that cannot be
/// expanded is an error here.
pub fn expand(loaded: &Loaded, max_cells: usize) -> Result<Vec<Cell>, Diagnostics> {
    let (cells, report) = expand_all(loaded, max_cells);
    if report.has_errors() {
        return Err(dedup(report));
    }
    Ok(cells)
}

/// The cells the grid's good axes make, and what is wrong with the others (a key that is
/// not a recipe key, a value listed twice): a bad axis does not keep the cells of the
/// others from being checked, so that their findings are said with it.
fn expand_all(loaded: &Loaded, max_cells: usize) -> (Vec<Cell>, Diagnostics) {
    let mut report = Diagnostics::default();
    let axes = axes(loaded, &mut report);
    let base = loaded.recipe.name.clone().unwrap_or_else(|| {
        loaded
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "recipe".into())
    });
    let sizes: Vec<usize> = axes.iter().map(|a| a.values.len()).collect();
    if let Some(d) = over_cap(loaded, &sizes, max_cells) {
        report.push(d);
        return (vec![], report);
    }
    let picks = product(&sizes);
    let names = cell_names(&base, &axes, &picks);
    let mut out = vec![];
    for (index, pick) in picks.into_iter().enumerate() {
        let mut doc = loaded.doc.clone();
        let mut assignments = vec![];
        for (axis, &i) in axes.iter().zip(&pick) {
            let v = axis.values[i].clone();
            let origin = axis.origins[i].clone().unwrap_or(Origin {
                source: 0,
                key: 0..0,
                value: 0..0,
            });
            if let Err(e) = doc.set(&axis.key, v.clone(), origin) {
                report.push(Diagnostic::error(&loaded.path, e).key(axis.key.clone()));
            }
            assignments.push((axis.key.clone(), v));
        }
        let name = names[index].clone();
        let id_name = id_name(&base, &axes, &assignments);
        // The cell is named in its recipe, so its run directory and its resolved recipe say which it is.
        doc.table
            .insert("name".into(), toml::Value::String(name.clone()));
        let checked = match recipe::recheck(loaded, doc) {
            Ok(l) => l,
            Err(r) => {
                report.0.extend(r.0);
                continue;
            }
        };
        // The cell's own findings (unknown keys, wrong types) travel in `checked` to
        // validation, which adds every other finding: the user sees them all at once.
        out.push(Cell {
            index,
            id: String::new(),
            earlier_ids: vec![],
            name,
            id_name,
            assignments,
            loaded: checked,
        });
    }
    (out, report)
}

/// Each cell's name (`cell_name`). Values that differ only in characters a directory name
/// cannot hold (`a/b.bin` and `a_b.bin`) would name two cells alike, and share their runs'
/// directory and their row in a report: such cells are told apart by [`value_tag`].
fn cell_names(base: &str, axes: &[Axis], picks: &[Vec<usize>]) -> Vec<String> {
    let (names, tags): (Vec<String>, Vec<String>) = picks
        .iter()
        .map(|pick| {
            let assignments: Vec<(String, toml::Value)> = axes
                .iter()
                .zip(pick)
                .map(|(a, &i)| (a.key.clone(), a.values[i].clone()))
                .collect();
            let tag = value_tag(base, &assignments);
            (cell_name(base, axes, &assignments, &tag[..8]), tag)
        })
        .unzip();
    told_apart(&names, &tags)
}

/// `names` made distinct by the cells' value `tags` (hex): a name two cells share gains
/// `,cell=` and 8 digits of its tag (`cell-<8 digits>` takes 16); names still alike take 16.
fn told_apart(names: &[String], tags: &[String]) -> Vec<String> {
    let mut out: Vec<String> = names
        .iter()
        .zip(tags)
        .map(|(n, tag)| {
            if names.iter().filter(|m| *m == n).count() > 1 {
                // A name that is its tag already (`cell-<8 digits>`) takes 16.
                match n.strip_suffix(&tag[..8]).filter(|h| h.ends_with("/cell-")) {
                    Some(head) => format!("{head}{}", &tag[..16]),
                    None => format!("{n},cell={}", &tag[..8]),
                }
            } else {
                n.clone()
            }
        })
        .collect();
    // Two tags of 8 hex digits meet in about 1 grid of 10,000 long-named cells in 100: such
    // cells take 16 (which a grid of any size allowed does not meet), so no two cells share
    // a directory, as with the index.
    let seen = |out: &[String], n: &str| out.iter().filter(|m| *m == n).count();
    let twice: Vec<usize> = (0..out.len())
        .filter(|&i| seen(&out, &out[i]) > 1)
        .collect();
    for i in twice {
        // (Both forms end in the 8 digits.)
        let kept = out[i].len() - 8;
        out[i] = format!("{}{}", &out[i][..kept], &tags[i][..16]);
    }
    out
}

/// The name a cell had before its values' tag replaced its index (2026-12-06):
/// `base/cell-0003` for `base/cell-<tag>`, `...,cell=3` for `...,cell=<tag>`; other names
/// are as they were.
fn index_name(name: &str, index: usize) -> String {
    let tagged = |rest: &str| {
        (rest.len() == 8 || rest.len() == 16) && rest.chars().all(|c| c.is_ascii_hexdigit())
    };
    if let Some((head, _)) = name.rsplit_once("/cell-").filter(|(_, t)| tagged(t)) {
        return format!("{head}/cell-{index:04}");
    }
    if let Some((head, _)) = name.rsplit_once(",cell=").filter(|(_, t)| tagged(t)) {
        return format!("{head},cell={index}");
    }
    name.to_string()
}

/// The SHA-256 (hex) of the cell's keys and values as TOML (`x/y` and `x_y` differ there,
/// not in a name); its first 8 digits tell a cell apart where its `key=value` name cannot.
/// Not its index, which moves when an axis gains a value before its own: a grown grid's
/// cells then took names its earlier cells had, and one directory held two cells' runs.
fn value_tag(base: &str, assignments: &[(String, toml::Value)]) -> String {
    let text: Vec<String> = assignments
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    sha256_hex(format!("{base}/{}", text.join("\n")).as_bytes())
}

/// `base/label=value,...` of any length (a recipe without a grid: `base`): the name
/// [`Cell::id_name`] hashes.
fn id_name(base: &str, axes: &[Axis], assignments: &[(String, toml::Value)]) -> String {
    if axes.is_empty() {
        return base.to_string();
    }
    let parts: Vec<String> = axes
        .iter()
        .zip(assignments)
        .map(|(a, (_, v))| format!("{}={}", a.label, show(v)))
        .collect();
    format!("{base}/{}", parts.join(","))
}

/// `base/label=value,...`, or `base/cell-<value tag>` where that would not make a
/// readable directory name (too long for the file system, or control characters).
fn cell_name(
    base: &str,
    axes: &[Axis],
    assignments: &[(String, toml::Value)],
    tag: &str,
) -> String {
    if axes.is_empty() {
        return base.to_string();
    }
    let full = id_name(base, axes, assignments);
    let label = &full[base.len() + 1..];
    // A directory name must fit the file system (255 bytes) and stay readable; past that
    // the cell is named by its values' tag (the manifest maps it back).
    if label.len() > MAX_LABEL || label.chars().any(char::is_control) {
        format!("{base}/cell-{tag}")
    } else {
        format!("{base}/{label}")
    }
}

/// The error for a grid of more than `max_cells` cells.
fn over_cap(loaded: &Loaded, sizes: &[usize], max_cells: usize) -> Option<Diagnostic> {
    let count = sizes.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
    if count.is_some_and(|c| c <= max_cells) {
        return None;
    }
    // (Past 2^64 it said 18446744073709551615.)
    let count = count.map_or_else(|| "more than 2^64".to_string(), |c| c.to_string());
    let dims: Vec<String> = sizes.iter().map(|n| n.to_string()).collect();
    // The product spelled out where there is one (one axis: "10000 cells (10000)" said it twice).
    let product = match dims.len() {
        1 => String::new(),
        _ => format!(" ({})", dims.join(" × ")),
    };
    let d = loaded.doc.diagnostic(
        &loaded.path,
        "sweep",
        Diagnostic::error(
            &loaded.path,
            format!("the grid has {count} cells{product}, over the cap of {max_cells}"),
        )
        .key("sweep"),
    );
    // The cap can be raised up to MAX_CELLS_LIMIT: past that, or already there, raising it
    // is no help (it was offered of a grid of 20,000 cells at the cap of 10,000).
    let fits_under_limit = count.parse::<usize>().is_ok_and(|c| c <= MAX_CELLS_LIMIT);
    Some(d.help(match fits_under_limit {
        true => format!("sweep fewer values, split the grid, or raise the cap with --max-cells (up to {MAX_CELLS_LIMIT})"),
        false => format!("sweep fewer values, or split the grid into recipes of at most {MAX_CELLS_LIMIT} cells (the most --max-cells allows)"),
    }))
}

/// A recipe with its cells, each validated into a plan.
pub struct Checked {
    pub path: PathBuf,
    pub grid: bool,
    /// The recipe's name: the sweep directory's, and the prefix of its cells' names.
    pub base: String,
    pub cells: Vec<Cell>,
    pub plans: Vec<Plan>,
    /// The cells' warnings, each once, with the cells it holds in where not all (a plan's
    /// own `warnings` are its cell's alone, for its run's `warnings.txt`).
    pub warnings: Vec<Diagnostic>,
}

/// Loads, expands and validates one recipe, every cell of a grid, with `--set` overrides:
/// every finding at once (unknown keys, types, grid, rules), each once.
pub fn check(
    path: &Path,
    sets: &[String],
    machine: &Machine,
    max_cells: usize,
) -> Result<Checked, Diagnostics> {
    let loaded = recipe::load_with(path, sets)?;
    check_loaded(path, &loaded, machine, max_cells)
}

/// [`check`] of a recipe already loaded from `path`.
pub fn check_loaded(
    path: &Path,
    loaded: &Loaded,
    machine: &Machine,
    max_cells: usize,
) -> Result<Checked, Diagnostics> {
    let (mut cells, mut report) = expand_all(loaded, max_cells);
    if report.has_errors() {
        // The grid cannot be expanded as written; the cells of its good axes are still
        // checked (a bad value on one axis is said with a misspelt key on another), or,
        // with none, the recipe under it.
        if cells.is_empty() {
            if let Err(base) = plan::validate(loaded, machine) {
                report.0.extend(base.0);
            }
        }
        let mut found = vec![];
        for c in &cells {
            if let Err(r) = plan::validate(&c.loaded, machine) {
                let errors = r.0.into_iter().filter(|d| d.is_error()).collect();
                found.push((c, Diagnostics(errors)));
            }
        }
        report.0.extend(in_cells(found, &cells).0);
        return Err(dedup(report));
    }
    let mut plans = vec![];
    let mut found = vec![];
    for c in &cells {
        match plan::validate(&c.loaded, machine) {
            // Its warnings counted with the failed cells' (a warning of cells 4 to 7 was
            // said of 4 and 5, the two that also failed).
            Ok(p) => {
                if !p.warnings.is_empty() {
                    found.push((c, Diagnostics(p.warnings.clone())));
                }
                plans.push(p);
            }
            Err(r) => found.push((c, r)),
        }
    }
    report.0.extend(in_cells(found, &cells).0);
    if report.has_errors() {
        return Err(dedup(report));
    }
    for (c, p) in cells.iter_mut().zip(&plans) {
        let mut named = p.resolved.clone();
        named.name = Some(c.id_name.clone());
        c.id = cell_id(&named, &c.loaded.recipe);
        c.earlier_ids = earlier_cell_ids(&named, &c.loaded.recipe);
        // Before 2026-12-05 the id held the name as given, its index where too long (or
        // where names met): the same while the grid has not grown. That name is no longer
        // the cell's (its values' tag is), so it is made again from the index.
        let mut as_named = p.resolved.clone();
        as_named.name = Some(index_name(&c.name, c.index));
        let by_index = cell_id(&as_named, &c.loaded.recipe);
        if by_index != c.id && !c.earlier_ids.contains(&by_index) {
            c.earlier_ids.push(by_index);
        }
    }
    // Said once for the grid, naming its cells where not all have it (it was said with no
    // note, as if of every cell).
    let warned = cells
        .iter()
        .zip(&plans)
        .filter(|(_, p)| !p.warnings.is_empty())
        .map(|(c, p)| (c, Diagnostics(p.warnings.clone())))
        .collect();
    let warnings = in_cells(warned, &cells).0;
    let base = loaded.recipe.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or("recipe".into(), |s| s.to_string_lossy().into_owned())
    });
    Ok(Checked {
        path: path.to_path_buf(),
        grid: loaded.sweep.is_some(),
        base,
        cells,
        plans,
        warnings,
    })
}

/// The cells' findings, each said once: one that not every cell of a grid has gets a note
/// naming the cells that have it, by index and values, so that `runner show --cell N` (or
/// the values) can be looked up, where the place in the file alone may not say which.
fn in_cells(found: Vec<(&Cell, Diagnostics)>, all: &[Cell]) -> Diagnostics {
    let cells = all.len();
    // The value of the swept key a finding is about, where every cell with it has the
    // finding: the caret under that value says which cells already.
    let value_says = |key: &Option<String>, with: &[&Cell]| {
        let Some(key) = key else { return false };
        let value_of = |c: &Cell| {
            c.assignments
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let Some(v) = with.first().and_then(|c| value_of(c)) else {
            return false;
        };
        with.iter().all(|c| value_of(c).as_ref() == Some(&v))
            && all
                .iter()
                .filter(|c| value_of(c).as_ref() == Some(&v))
                .count()
                == with.len()
    };
    let first_line = |d: &Diagnostic| d.to_string().lines().next().unwrap_or_default().to_string();
    let mut said: Vec<(String, Diagnostic, Vec<&Cell>)> = vec![];
    for (cell, report) in found {
        for d in report.0 {
            let line = first_line(&d);
            match said.iter_mut().find(|(l, _, _)| *l == line) {
                Some((_, _, with)) => with.push(cell),
                None => said.push((line, d, vec![cell])),
            }
        }
    }
    let mut out = Diagnostics::default();
    for (_, mut d, with) in said {
        if cells > 1 && with.len() < cells && !value_says(&d.key, &with) {
            let values = |c: &Cell| {
                c.name
                    .rsplit_once('/')
                    .map_or(c.name.clone(), |(_, v)| v.into())
            };
            let named = |c: &&Cell| format!("{} ({})", c.index, values(c));
            const SHOWN: usize = 3;
            let mut parts: Vec<String> = with.iter().take(SHOWN).map(named).collect();
            if with.len() > SHOWN {
                parts.push(format!("{} more", with.len() - SHOWN));
            }
            let list = match parts.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let whose = match with.len() {
                1 => format!("in cell {} of {cells}: {}", with[0].index, values(with[0])),
                n => format!("in {n} of the {cells} cells: {list}"),
            };
            d.note = Some(match d.note.take() {
                Some(n) => format!("{whose}; {n}"),
                None => whose,
            });
        }
        out.push(d);
    }
    out
}

/// The longest `key=value,...` part of a cell's name; longer ones become `cell-<tag>`.
const MAX_LABEL: usize = 120;

/// A grid repeats one mistake in many cells: say it once.
pub fn dedup(report: Diagnostics) -> Diagnostics {
    let mut seen = vec![];
    let mut out = Diagnostics::default();
    for d in report.0 {
        // By its first line (place and message): cells mark the same key at their own
        // value of an axis, under one line and column.
        let text = d.to_string().lines().next().unwrap_or_default().to_string();
        if !seen.contains(&text) {
            seen.push(text);
            out.push(d);
        }
    }
    out.sorted()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The id of a cell: the first 12 hex digits of the SHA-256 of its resolved recipe (every
/// default filled in, so writing one out changes nothing), with the paths as `written`
/// (the same on every machine; resolved ones are absolute), and without what changes
/// nothing that runs: `[log]`, `description`, `[slurm]` (a job given more time resumes
/// the grid it was: its done cells are not trained again) and `backend.cache_dir`, as
/// `runner report` compares runs.
pub fn cell_id(resolved: &Recipe, written: &Recipe) -> String {
    short_sha(&id_text(resolved, written))
}

fn short_sha(text: &str) -> String {
    sha256_hex(text.as_bytes())[..12].to_string()
}

/// What [`cell_id`] hashes.
fn id_text(resolved: &Recipe, written: &Recipe) -> String {
    let mut r = id_recipe(resolved, written);
    r.description = String::new();
    // The default `[slurm]` as ids have always held it: `cpus_per_task` written out as 2
    // (unset since 2026-12-06, when its default became 4 for a task with a GPU).
    r.slurm = crate::recipe::SlurmSection {
        cpus_per_task: Some(2),
        ..Default::default()
    };
    r.backend.cache_dir = None;
    toml::to_string(&r).unwrap_or_default()
}

/// What changed in the format since cell ids were first made, newest first: a key added
/// (its lines, with the value every run had before it existed: a runner of before hashed
/// the same text without them), or a key's default changed (its line now, and the line
/// every run had before).
enum Change {
    Added(&'static [&'static str]),
    DefaultChanged(&'static str, &'static str),
}

const CHANGES: [Change; 5] = [
    // 2026-12-07
    Change::Added(&["matmul = \"fixed\""]),
    // 2026-12-06: `backend.fusion` took `"auto"` for `true`.
    Change::DefaultChanged("fusion = \"auto\"", "fusion = true"),
    // 2026-12-05, afternoon
    Change::Added(&["norm_sums = \"one_pass\""]),
    // 2026-12-05
    Change::Added(&["conv_split = \"auto\""]),
    // 2026-12-04
    Change::Added(&[
        "conv_kernel = \"simple_sync_cyclic\"",
        "conv_tile = \"cmma\"",
    ]),
];

impl Change {
    /// `text` as the runner of before this change wrote it.
    fn undo(&self, text: &str) -> String {
        text.split_inclusive('\n')
            .filter_map(|l| match self {
                Change::Added(lines) => (!lines.contains(&l.trim_end())).then(|| l.to_string()),
                Change::DefaultChanged(now, before) => Some(match l.trim_end() == *now {
                    true => l.replacen(now, before, 1),
                    false => l.to_string(),
                }),
            })
            .collect()
    }
}

/// [`Cell::earlier_ids`]: the cell's id as each earlier version made it, newest first:
/// with each change since undone in turn (a key added since left out where the cell has
/// its old value: a cell that sets another could not have run before), and, before
/// 2026-12-03, with `description`, `[slurm]` and `backend.cache_dir` in it.
pub fn earlier_cell_ids(resolved: &Recipe, written: &Recipe) -> Vec<String> {
    let undo_all = |text: String| CHANGES.iter().fold(text, |t, c| c.undo(&t));
    let mut text = id_text(resolved, written);
    let mut ids = vec![];
    for change in &CHANGES {
        text = change.undo(&text);
        ids.push(short_sha(&text));
    }
    // Before 2026-12-03 the id held `[slurm]`, whose `cpus_per_task` was written out as 2
    // whatever the task (unset now, it is 4 with a GPU: 2026-12-06).
    let legacy = toml::to_string(&id_recipe(resolved, written)).unwrap_or_default();
    let legacy = match resolved.slurm.cpus_per_task {
        Some(_) => legacy,
        None => legacy
            .split_inclusive('\n')
            .scan(false, |in_slurm, l| {
                if l.starts_with('[') {
                    *in_slurm = l.trim_end() == "[slurm]";
                }
                Some(match *in_slurm && l.starts_with("gpus_per_task = ") {
                    true => format!("{l}cpus_per_task = 2\n"),
                    false => l.to_string(),
                })
            })
            .collect(),
    };
    ids.push(short_sha(&undo_all(legacy)));
    let current = cell_id(resolved, written);
    let mut unique = vec![];
    for id in ids {
        if id != current && !unique.contains(&id) {
            unique.push(id);
        }
    }
    unique
}

/// The resolved recipe with its paths as written and without `[log]`.
fn id_recipe(resolved: &Recipe, written: &Recipe) -> Recipe {
    let mut r = resolved.clone();
    r.data.train.clone_from(&written.data.train);
    r.data.test.clone_from(&written.data.test);
    r.data
        .validation_file
        .clone_from(&written.data.validation_file);
    r.backend.cache_dir.clone_from(&written.backend.cache_dir);
    r.log = Default::default();
    r
}

/// The id of a grid: from its cells' ids in order.
pub fn grid_id(cells: &[Cell]) -> String {
    let all: Vec<&str> = cells.iter().map(|c| c.id.as_str()).collect();
    sha256_hex(all.join(",").as_bytes())[..12].to_string()
}

/// `--shard i/N`: 1 <= i <= N.
/// The arguments that make a later command check the same grid as this one: its `--set`
/// overrides and a `--max-cells` other than the default (the Slurm tasks' command, and the
/// command that continues an interrupted grid).
pub fn check_args(sets: &[String], max_cells: usize) -> Vec<String> {
    let mut args = vec![];
    for s in sets {
        args.extend(["--set".into(), s.clone()]);
    }
    if max_cells != DEFAULT_MAX_CELLS {
        args.extend(["--max-cells".into(), max_cells.to_string()]);
    }
    args
}

pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--shard {s}: expected i/N with 1 <= i <= N, e.g. 2/4");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || i == 0 || i > n {
        return Err(bad());
    }
    Ok((i, n))
}

/// Whether cell `index` belongs to shard `i` of `n`: round robin, so every shard gets an
/// even share and the shards together hold every cell once.
pub fn in_shard(index: usize, (i, n): (usize, usize)) -> bool {
    index % n == i - 1
}

mod state;
pub use state::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// Names two cells share are told apart by their tags' first 8 digits, and by 16 where
    /// those 8 meet too; a name of one cell is kept, and so is its legacy index name.
    #[test]
    fn cells_whose_tags_meet_take_longer_tags() {
        let own = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let tag = |head: &str, tail: &str| format!("{head}{tail}{}", "0".repeat(48));
        let names = own(&[
            "g/cell-aaaaaaaa",
            "g/cell-aaaaaaaa",
            "g/x=a_b",
            "g/x=a_b",
            "g/y=1",
        ]);
        let tags = [
            tag("aaaaaaaa", "11111111"),
            tag("aaaaaaaa", "22222222"),
            tag("bbbbbbbb", "33333333"),
            tag("cccccccc", "44444444"),
            tag("dddddddd", "55555555"),
        ];
        assert_eq!(
            told_apart(&names, &tags),
            own(&[
                "g/cell-aaaaaaaa11111111",
                "g/cell-aaaaaaaa22222222",
                "g/x=a_b,cell=bbbbbbbb",
                "g/x=a_b,cell=cccccccc",
                "g/y=1",
            ])
        );
        // Values alike in a name and in the first 8 digits of their tags.
        let names = own(&["g/x=a_b", "g/x=a_b"]);
        let tags = [tag("eeeeeeee", "66666666"), tag("eeeeeeee", "77777777")];
        assert_eq!(
            told_apart(&names, &tags),
            own(&[
                "g/x=a_b,cell=eeeeeeee66666666",
                "g/x=a_b,cell=eeeeeeee77777777"
            ])
        );
        // The 16-digit forms still map back to the index names of earlier versions.
        assert_eq!(
            index_name("g/x=a_b,cell=eeeeeeee66666666", 3),
            "g/x=a_b,cell=3"
        );
        assert_eq!(index_name("g/cell-aaaaaaaa11111111", 7), "g/cell-0007");
    }

    #[test]
    fn labels_are_short_but_unambiguous() {
        assert_eq!(label("loader.workers"), "workers");
        assert_eq!(
            label("cleanup.every"),
            "cleanup.every",
            "log.every exists too"
        );
        assert_eq!(label("data.normalize.on"), "normalize.on");
        assert_eq!(label("optim.lr"), "optim.lr", "too short alone");
        assert_eq!(label("seed"), "seed");
    }

    #[test]
    fn shards_split_the_grid() {
        assert_eq!(parse_shard("2/4"), Ok((2, 4)));
        assert!(
            parse_shard("0/4").is_err() && parse_shard("5/4").is_err() && parse_shard("x").is_err()
        );
        let mut union = vec![];
        for i in 1..=3 {
            let mine: Vec<usize> = (0..10).filter(|&c| in_shard(c, (i, 3))).collect();
            assert!(mine.len() >= 3 && mine.len() <= 4);
            union.extend(mine);
        }
        union.sort();
        assert_eq!(
            union,
            (0..10).collect::<Vec<_>>(),
            "disjoint, and together every cell"
        );
    }

    #[test]
    fn product_runs_the_last_axis_fastest() {
        assert_eq!(
            product(&[2, 3]),
            vec![
                vec![0, 0],
                vec![0, 1],
                vec![0, 2],
                vec![1, 0],
                vec![1, 1],
                vec![1, 2]
            ]
        );
        assert_eq!(product(&[]), vec![Vec::<usize>::new()]);
    }
}
