//! `runner report`: the comparison table of runs, recomputed from their `metrics.jsonl`
//! (not copied from their summaries), one row per recipe with repeats aggregated, each
//! row's ratio to a baseline and whether the difference is within the noise. Renders a
//! terminal table, Markdown or CSV; `plot` draws the figure. No Burn here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::metrics::{Each, JsonLines, Process, RunStatus, Stats, StepRecord, Summary, Tally};

/// One run directory, read back.
#[derive(Debug, Clone)]
pub struct Run {
    pub dir: PathBuf,
    pub name: String,
    /// What the run ran, as `(key, value)` pairs: its resolved `recipe.toml` flattened to
    /// dotted keys, without what changes nothing that runs (`[log]` but `log.every`,
    /// `[slurm]`, `description`, `backend.cache_dir`) and with the data files by content
    /// (their size and CRC-32 from `env.json`) instead of by path, so the same recipe run
    /// from two clones is the same, and the device it ran on (`device`, from
    /// `summary.json`; on the CPU its threads and the cores it could use, from `env.json`).
    /// Runs of one name are repeats only where these are equal. Empty when the run has no
    /// `recipe.toml`.
    pub recipe: Vec<(String, String)>,
    /// Its step times, for the figure.
    pub trace: Trace,
    /// Recomputed from `metrics.jsonl` (and `summary.json` for what metrics lines lack).
    pub summary: Summary,
}

/// A run's step times for the figure: every step's, up to [`Trace::MAX`] of them; a
/// longer run's as means of 2, 4, 8, ... consecutive steps, at their mean step (a figure
/// 1,200 pixels wide shows no more, and a million-step run drew a million points).
#[derive(Debug, Clone, Default)]
pub struct Trace {
    points: Vec<(f64, f64)>,
    /// Steps a point stands for.
    per: usize,
    /// The steps of the point being made: their steps' and times' sums, and how many.
    pending: (f64, f64, usize),
    /// Steps taken, and the slowest step's time.
    pub steps: u64,
    pub max_ms: f64,
}

impl Trace {
    pub const MAX: usize = 4096;

    pub fn push(&mut self, step: u64, ms: f64) {
        self.per = self.per.max(1);
        self.steps += 1;
        self.max_ms = self.max_ms.max(ms);
        let p = &mut self.pending;
        (p.0, p.1, p.2) = (p.0 + step as f64, p.1 + ms, p.2 + 1);
        if p.2 == self.per {
            self.points.push((p.0 / p.2 as f64, p.1 / p.2 as f64));
            self.pending = (0.0, 0.0, 0);
        }
        if self.points.len() == 2 * Self::MAX {
            self.points = self
                .points
                .chunks(2)
                .map(|c| ((c[0].0 + c[1].0) / 2.0, (c[0].1 + c[1].1) / 2.0))
                .collect();
            self.per *= 2;
        }
    }

    /// The points, `(step, ms)`, the steps of an unfinished point's too.
    pub fn points(&self) -> impl Iterator<Item = (f64, f64)> + Clone + '_ {
        let (s, ms, n) = self.pending;
        let last = (n > 0).then(|| (s / n as f64, ms / n as f64));
        self.points.iter().copied().chain(last)
    }
}

/// A run left out of the table, and why, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Excluded {
    pub dir: PathBuf,
    pub why: String,
}

/// Completed runs (the table's), and the others with what became of them: failed and
/// interrupted runs with their error, runs still going, and runs whose process is gone
/// while their summary still says running (killed outright: kill -9, a node lost; or a
/// summary that could not be written at the end, which the run said on its stderr).
///
/// A copy of a run (a backup, `cp -a` of its directory) is the same run: the same name,
/// run id and process (host, pid and its start time). It is counted once, as first
/// found, and the copy listed as such; before, it was a second repeat and halved the
/// spread.
pub fn split_completed(runs: Vec<Run>) -> (Vec<Run>, Vec<Excluded>) {
    let mut done: Vec<Run> = vec![];
    let mut left = vec![];
    for r in runs {
        let s = &r.summary;
        let why = match s.status {
            RunStatus::Completed => {
                let same = |o: &Run| {
                    let t = &o.summary;
                    (&t.name, &t.run_id, &t.host, t.pid, t.pid_started)
                        == (&s.name, &s.run_id, &s.host, s.pid, s.pid_started)
                };
                match done.iter().find(|o| same(o)) {
                    Some(first) => format!(
                        "a copy of {} (the same run id {}, host and process): counted once",
                        first.dir.display(),
                        s.run_id
                    ),
                    None => {
                        done.push(r);
                        continue;
                    }
                }
            }
            RunStatus::Running => match s.process() {
                Process::Alive(pid) => format!("still running (pid {pid})"),
                Process::Gone(pid) => format!("killed (kill -9, out of memory, a node lost, or a third Ctrl-C), or unable to write its summary at its end (its stderr says): its process (pid {pid}) is gone, and summary.json still says running"),
                // Its process's heartbeat in `run.lock` tells (runs of earlier versions
                // have none).
                Process::Elsewhere { host, pid } => match heartbeat_age(&r.dir) {
                    Some(age) if age < crate::sweep::LOCK_STALE_AFTER => format!(
                        "still running on {host} (pid {pid}; its run.lock was touched {} s ago)",
                        age.as_secs()
                    ),
                    Some(age) => format!(
                        "killed on {host} (pid {pid}; a node lost, kill -9, out of memory): its run.lock has had no heartbeat for {} s, and summary.json still says running",
                        age.as_secs()
                    ),
                    None => format!("running, or killed, on {host} (pid {pid})"),
                },
                Process::Unknown => "running, or killed (no process recorded)".into(),
            },
            other => match &s.error {
                Some(e) => format!("{other}: {e}"),
                None => other.to_string(),
            },
        };
        left.push(Excluded { dir: r.dir, why });
    }
    (done, left)
}

/// How long ago the process writing the run in `dir` last touched its `run.lock`.
fn heartbeat_age(dir: &Path) -> Option<std::time::Duration> {
    let touched = std::fs::metadata(dir.join(crate::metrics::RUN_LOCK))
        .and_then(|m| m.modified())
        .ok()?;
    Some(touched.elapsed().unwrap_or_default())
}

/// The run directories under `paths` (see [`find_runs_said`]).
pub fn find_runs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Error> {
    find_runs_said(paths).map(|(found, _)| found)
}

/// The run directories under `paths`, in the order the paths are given; under each, a
/// grid's cells in the grid's order (from its `manifest.json`), then the other runs by
/// path (a run's directory name is its start time, so repeats come in the order they ran).
/// Symbolic links to directories are followed, after the directories themselves: a run
/// reached a second time (by a link, `runs/latest`, or a path given twice) counts once,
/// as first found, and is returned apart with why. (Links were not followed at all: a run
/// reached only through one was not found.)
pub fn find_runs_said(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<Excluded>), Error> {
    use std::collections::HashMap;
    let canonical = |d: &Path| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf());
    let mut out = vec![];
    // Each directory walked, by where it really is: a link to one already walked (a loop,
    // `up -> ..`, or a second way to a run) is not walked again.
    let mut walked: HashMap<PathBuf, PathBuf> = HashMap::new();
    let mut again: Vec<Excluded> = vec![];
    // Either file: a run missing one of them (a copy made in part) is listed with what it
    // lacks (by `load_run`), where it was left out in silence.
    let is_run = |d: &Path| {
        let there = |f: &str| d.join(f).symlink_metadata().is_ok();
        there("summary.json") || there("metrics.jsonl")
    };
    // Paths given that hold no run: refused as one that does not exist is (beside others
    // that hold runs, they were left out in silence).
    let mut empty = vec![];
    for p in paths {
        let mut found = vec![];
        let again_before = again.len();
        // Walked already under a path given before (`runs runs/quickstart`): its runs are
        // counted there.
        let covered = walked.contains_key(&canonical(p));
        let mut cells: Vec<(PathBuf, usize, PathBuf)> = vec![];
        if !p.exists() {
            return Err(Error::Input(format!("error: {} does not exist\n  = help: give run directories or folders holding them, e.g. runs/", p.display())));
        }
        if !p.is_dir() {
            empty.push(p);
            continue;
        }
        // A grid's sweep directory (`runs/<grid>/sweeps/<id>`, the "state in" a grid
        // prints): the runs its cells name, in the grid's order (it held no run, and was
        // "no run directories ... run a recipe first" of a grid whose cells were done).
        if let Some(runs) = sweep_runs(p) {
            for d in runs {
                if walked.insert(canonical(&d), d.clone()).is_none() {
                    out.push(d);
                }
            }
            continue;
        }
        let mut stack = vec![p.clone()];
        let mut links = vec![];
        // A link up to the path given or above it (`up -> ..`) would walk what holds it.
        let given = canonical(p);
        while let Some(d) = stack.pop().or_else(|| links.pop()) {
            if let Some(first) = walked.get(&canonical(&d)) {
                if is_run(&d) {
                    again.push(Excluded {
                        dir: d.clone(),
                        why: format!(
                            "the same run as {} (a link to it, or named twice): counted once",
                            first.display()
                        ),
                    });
                }
                continue;
            }
            walked.insert(canonical(&d), d.clone());
            // A run's two files; listed when they are there at all, so that one that is
            // not a file (a named pipe) is reported by `load_run` rather than skipped.
            let run = is_run(&d);
            if run {
                found.push(d.clone());
            }
            if d.file_name().is_some_and(|n| n == "sweeps") {
                cells.extend(grid_order(&d));
            }
            match std::fs::read_dir(&d) {
                // Below a run too (a run named `a/<run id of a>` lies in that run's
                // directory), but not into its checkpoints.
                Ok(rd) => {
                    for e in rd.flatten() {
                        if run && e.file_name() == "checkpoints" {
                            continue;
                        }
                        match e.file_type() {
                            Ok(t) if t.is_dir() => stack.push(e.path()),
                            Ok(t)
                                if t.is_symlink()
                                    && e.path().is_dir()
                                    && !given.starts_with(canonical(&e.path())) =>
                            {
                                links.push(e.path());
                            }
                            _ => {}
                        }
                    }
                }
                // One that cannot be listed (another user's run) is reported as such by
                // `load_run`, not left out in silence.
                Err(e) if e.kind() != std::io::ErrorKind::NotFound && d != *p => found.push(d),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => found.push(d),
                Err(_) => {}
            }
        }
        // A cell's runs lie in `<log.dir>/<cell name>/`, its sweep directory in
        // `<log.dir>/<grid name>/sweeps/`. Each grid's cells together, in its order (a
        // key of the cell index alone interleaved the grids under `runs/`), the grids by
        // the path of their `sweeps/`, then the runs of no grid. A grid that grew (a value
        // added to an axis) has a sweep directory for each version: the newest one's order
        // comes first, as the grid's own table has it, then cells only older ones hold.
        let mut grids: Vec<&PathBuf> = cells.iter().map(|(g, ..)| g).collect();
        grids.sort_by_cached_key(|g| {
            let made = std::fs::metadata(g.join("manifest.json")).and_then(|m| m.modified());
            (
                g.parent().map(Path::to_path_buf),
                std::cmp::Reverse(made.ok()),
                (*g).clone(),
            )
        });
        grids.dedup();
        let place = |d: &PathBuf| {
            cells
                .iter()
                .filter(|(_, _, cell)| d.parent().is_some_and(|p| p.ends_with(cell)))
                .map(|(g, i, _)| (grids.iter().position(|x| *x == g).unwrap_or(usize::MAX), *i))
                .min()
                .unwrap_or((usize::MAX, usize::MAX))
        };
        found.sort_by_cached_key(|d| (place(d), d.clone()));
        if found.is_empty() && again.len() == again_before && !covered {
            empty.push(p);
        }
        out.extend(found);
    }
    if !empty.is_empty() && (!out.is_empty() || empty.iter().any(|p| !p.is_dir())) {
        let said: Vec<String> = empty
            .iter()
            .map(|p| match p.is_dir() {
                true => format!("{} holds no run directory", p.display()),
                false => format!("{} is a file, not a run directory", p.display()),
            })
            .collect();
        return Err(Error::Input(format!(
            "error: {}\n  = help: give run directories (with summary.json or metrics.jsonl) or folders holding them, e.g. runs/; leave out the paths without runs",
            said.join("; ")
        )));
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "error: no run directories (with summary.json or metrics.jsonl) under {}\n  = help: run a recipe first; runs go to runs/<name>/<run-id>/",
            paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok((out, again))
}

/// Where `dir` is a grid's sweep directory (its `manifest.json` and `cells/`), the run
/// directories its cells' states name, in the cells' order; runs that are gone are left
/// out.
fn sweep_runs(dir: &Path) -> Option<Vec<PathBuf>> {
    if !dir.join("manifest.json").is_file() || !dir.join("cells").is_dir() {
        return None;
    }
    let mut states: Vec<PathBuf> = std::fs::read_dir(dir.join("cells"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    // `<index>-<id>.json`, the index written to four digits or more: in the grid's order.
    states.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let index = name
            .as_deref()
            .and_then(|n| n.split('-').next()?.parse::<usize>().ok());
        (index.unwrap_or(usize::MAX), p.clone())
    });
    Some(
        states
            .iter()
            .filter_map(|p| {
                let text = crate::metrics::read_text(p).ok()?;
                serde_json::from_str::<crate::sweep::CellStatus>(&text)
                    .ok()?
                    .run_dir
            })
            .filter(|d| d.join("summary.json").is_file())
            .collect(),
    )
}

/// The cells of the grids whose sweep directories are in `sweeps`: each one's sweep
/// directory, index and name as a path.
fn grid_order(sweeps: &Path) -> Vec<(PathBuf, usize, PathBuf)> {
    let Ok(grids) = std::fs::read_dir(sweeps) else {
        return vec![];
    };
    grids
        .filter_map(|g| {
            let dir = g.ok()?.path();
            let text = crate::metrics::read_text(dir.join("manifest.json")).ok()?;
            let m = serde_json::from_str::<crate::sweep::Manifest>(&text).ok()?;
            Some((dir, m))
        })
        .flat_map(|(dir, m)| {
            m.cells
                .into_iter()
                .map(move |c| (dir.clone(), c.index, PathBuf::from(c.name)))
        })
        .collect()
}

/// Reads a run directory and recomputes its statistics from the metrics lines.
pub fn load_run(dir: &Path) -> Result<Run, Error> {
    let sp = dir.join("summary.json");
    let mp = dir.join("metrics.jsonl");
    for p in [&sp, &mp] {
        if crate::recipe::why_missing(p) == "does not exist" {
            return Err(Error::Input(format!(
                "error: {} does not exist: a run directory holds it from the run's start\n  = help: a copy of the run made in part? copy it again from where the run ran",
                p.display()
            )));
        }
    }
    // Read only regular files: a named pipe would block the report for good.
    // (One that cannot be reached at all is said by the read below.)
    for p in [&sp, &mp] {
        if let Some(kind) = crate::recipe::odd_kind(p) {
            return Err(Error::Input(format!(
                "error: {}: not a regular file but {kind} (the runner writes it as a file)",
                p.display()
            )));
        }
    }
    let text = crate::metrics::read_utf8(&sp)
        .map_err(|e| Error::Input(format!("error: {}: {e}", sp.display())))?;
    let stored: Summary = serde_json::from_str(&text).map_err(|e| {
        Error::Input(format!(
            "error: {}:{}:{}: not a summary: {e}",
            sp.display(),
            e.line(),
            e.column()
        ))
    })?;
    // Every field has a default, so `{}` read as a summary of no run, and such runs were
    // grouped as repeats of one nameless recipe.
    if stored.name.is_empty() || stored.run_id.is_empty() {
        return Err(Error::Input(format!(
            "error: {}: names no run (no `name` or `run_id`)\n  = help: summary.json is written by runner; was it edited? `runner resume` of an interrupted run writes it again",
            sp.display()
        )));
    }
    // A line at a time, into the figures: a run of a million steps has ~800 MB of lines
    // (read whole, and every run's records kept to the table's end, before).
    let mut tally = Tally::new(stored.warmup_steps);
    let mut trace = Trace::default();
    JsonLines::each::<StepRecord>(&mp, |r, _, _| {
        tally.push(&r);
        trace.push(r.step, r.iter_ms);
        true
    })
    .map_err(|e| match e {
        Each::Io(e) => Error::Input(format!("error: {}: {e}", mp.display())),
        Each::Line(line, e) => Error::Input(format!(
            "error: {}:{line}:{}: not a metrics record: {e}\n  = help: metrics.jsonl is written by runner; was it edited?",
            mp.display(),
            e.column()
        )),
    })?;
    // A completed run's figures are recomputed from its lines: fewer than its steps (the
    // file cut short, emptied or edited) would make a row of other figures (it was one,
    // of nothing).
    // (A summary that gives no steps, as hand-made ones, is not checked.)
    if stored.status == RunStatus::Completed && stored.steps > 0 && tally.steps() != stored.steps {
        return Err(Error::Input(format!(
            "error: {}: {} lines for the {} steps summary.json says the run took; its figures cannot be recomputed\n  = help: metrics.jsonl is written by runner, a line a step; was it cut short or edited?",
            mp.display(),
            tally.steps(),
            stored.steps
        )));
    }
    let mut summary = Summary {
        name: stored.name.clone(),
        run_id: stored.run_id.clone(),
        status: stored.status,
        error: stored.error.clone(),
        pid: stored.pid,
        pid_started: stored.pid_started,
        host: stored.host.clone(),
        backend: stored.backend.clone(),
        device: stored.device.clone(),
        util_source: stored.util_source.clone(),
        evals: stored.evals.clone(),
        test_accuracy: stored.test_accuracy,
        parameters: stored.parameters,
        // What the metrics lines do not hold: the start-up and what it compiled.
        startup_s: stored.startup_s,
        first_step_ms: stored.first_step_ms,
        kernels: stored.kernels,
        diverged_at_step: stored.diverged_at_step,
        ..Default::default()
    };
    tally.fill(&mut summary);
    // What it ran on, too: one recipe on an H100 and an H200 (or two CPUs) is no repeat,
    // and their mean is neither machine's figure.
    // env.json once: the data files, the threads and the cores.
    let env = env_json(dir);
    let mut recipe = what_ran(dir, env.as_ref());
    if !recipe.is_empty() && !stored.device.is_empty() {
        recipe.push(("device".into(), stored.device.clone()));
    }
    // On the CPU, the threads it ran on (`threads = 0` is one per core, which differs
    // between machines): its speed, and the bits of its sums, follow them.
    if !recipe.is_empty() && stored.backend.contains("cpu") {
        let threads = env.as_ref().and_then(|e| e.get("threads")?.as_u64());
        if let Some(n) = threads {
            recipe.push(("cpu threads".into(), n.to_string()));
        }
        // And the cores it could use (`taskset`, a cgroup's quota): its loader's workers
        // share them, and its CPU util is a share of them.
        if let Some(cpus) = env.as_ref().and_then(cpus_of) {
            recipe.push(("cpus".into(), cpus));
        }
    }
    Ok(Run {
        dir: dir.to_path_buf(),
        name: stored.name,
        recipe,
        trace,
        summary,
    })
}

fn env_json(dir: &Path) -> Option<serde_json::Value> {
    crate::metrics::read_text(dir.join("env.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
}

/// The CPUs the run's processes could use, in order, each count once: `2`, or `2,1` for a
/// run resumed on one (its steps on both are no repeat of either).
fn cpus_of(env: &serde_json::Value) -> Option<String> {
    let mut counts = vec![env.get("cpus")?.as_u64()?];
    let resumed = env.get("resumes").and_then(|r| r.as_array());
    for n in resumed
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("cpus")?.as_u64())
    {
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    Some(
        counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// [`Run::recipe`] of the run in `dir`, its `env.json` given.
fn what_ran(dir: &Path, env: Option<&serde_json::Value>) -> Vec<(String, String)> {
    let Some(mut recipe) = crate::metrics::read_text(dir.join("recipe.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
    else {
        return vec![];
    };
    // Where and what it logs changes nothing that runs, but how often it reads the
    // losses back does: on a GPU the step that reads waits for the steps queued before it.
    let every = recipe.get("log").and_then(|l| l.get("every")).cloned();
    recipe.remove("log");
    if let Some(every) = every {
        let mut log = toml::Table::new();
        log.insert("every".into(), every);
        recipe.insert("log".into(), toml::Value::Table(log));
    }
    recipe.remove("description");
    // How the job is submitted, not what it runs: a grid resubmitted with more time was
    // split into rows (a cell's id leaves `[slurm]` out too).
    recipe.remove("slurm");
    if let Some(toml::Value::Table(b)) = recipe.get_mut("backend") {
        b.remove("cache_dir");
    }
    let mut files = None;
    if let Some(toml::Value::Table(d)) = recipe.get_mut("data") {
        for key in ["train", "test", "validation_file"] {
            d.remove(key);
        }
        // The files read, by content; the order is the runner's (training, test,
        // validation), the same for the same recipe.
        files = env.and_then(|e| e["data"].as_array()).map(|all| {
            all.iter()
                .map(|f| format!("{}:{}", f["bytes"], f["crc32"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(" ")
        });
    }
    let mut out = vec![];
    flatten("", &recipe, &mut out);
    if let Some(f) = files {
        out.push(("data files".into(), f));
    }
    out.sort();
    out
}

/// `table`'s values under dotted keys (arrays and inline values as TOML writes them,
/// strings without their quotes).
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, String)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            toml::Value::String(s) => out.push((key, s.clone())),
            other => out.push((key, other.to_string())),
        }
    }
}

/// The row label of each run: its recipe's name, and where runs of one name ran different
/// recipes, the keys they differ in with this run's values (`quickstart [cleanup.every=step]`),
/// so that an A/B of `--set` runs gives two rows instead of one row of "repeats". A run
/// whose `recipe.toml` is gone or unreadable, beside runs of its name that have theirs, is
/// a row of its own, `name [recipe.toml unreadable]`: compared with them key by key, it
/// differed in every key, and every row's label listed them all. The keys are found once
/// per name (it compared every pair of runs: 24 s for 2,000 repeats).
pub(crate) fn labels(runs: &[Run]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    let maps: Vec<HashMap<&str, &str>> = runs
        .iter()
        .map(|r| {
            r.recipe
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        })
        .collect();
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        groups.entry(r.name.as_str()).or_default().push(i);
    }
    // Per name: whether any run has its recipe, and the keys whose values differ among
    // those that have, each with its usual value (the one most of them ran; of a tie, the
    // first run's). A run is labelled by where it leaves the usual: after ten `--set`
    // A/Bs of one recipe each label listed every key any of them changed (350 chars),
    // each row the same keys, most of them at the usual value.
    type Usual<'a> = Vec<(&'a str, Option<&'a str>)>;
    let mut differing: HashMap<&str, (bool, Usual)> = HashMap::new();
    for (name, group) in &groups {
        let known: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&i| !runs[i].recipe.is_empty())
            .collect();
        let keys: BTreeSet<&str> = known
            .iter()
            .flat_map(|&i| maps[i].keys().copied())
            .collect();
        let keys = keys
            .into_iter()
            .filter_map(|k| {
                // Each value with its count, in the order the runs first have it.
                let mut counts: Vec<(Option<&str>, usize)> = vec![];
                for &i in &known {
                    let v = maps[i].get(k).copied();
                    match counts.iter_mut().find(|(value, _)| *value == v) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((v, 1)),
                    }
                }
                let most = counts.iter().map(|c| c.1).max()?;
                let usual = counts.iter().find(|c| c.1 == most)?.0;
                (counts.len() > 1).then_some((k, usual))
            })
            .collect();
        differing.insert(name, (!known.is_empty(), keys));
    }
    // Each run's parts: every key where it leaves the usual, each marked incidental where
    // only one side has the key: a key one `--set` brings in or drops with another
    // (`optim.schedule=step` brings `step_size` and `gamma`, and drops `min_lr`) said
    // nothing the other key does not, and made the label long. `None` for a run without
    // its recipe. The CPU thread count the run had is left out beside the
    // `backend.threads` that set it (`[backend.threads=1, cpu threads=1]`).
    struct Part<'a> {
        key: &'a str,
        text: String,
        incidental: bool,
    }
    let parts: Vec<Option<Vec<Part>>> = runs
        .iter()
        .zip(&maps)
        .map(|(r, map)| {
            if r.recipe.is_empty() {
                return None;
            }
            let (_, keys) = &differing[r.name.as_str()];
            let mut out = vec![];
            for (k, usual) in keys {
                let value = map.get(k).copied();
                if value == *usual {
                    continue;
                }
                out.push(Part {
                    key: k,
                    text: format!("{k}={}", value.unwrap_or("-")),
                    incidental: value.is_none() || usual.is_none(),
                });
            }
            let set_threads = out
                .iter()
                .find(|p| p.key == "backend.threads")
                .map(|p| p.text["backend.threads=".len()..].to_string());
            out.retain(|p| {
                !(p.key == "cpu threads"
                    && set_threads.as_deref() == Some(&p.text["cpu threads=".len()..]))
            });
            Some(out)
        })
        .collect();
    let label = |r: &Run, parts: &[&Part], keep: &dyn Fn(&Part) -> bool| {
        let mut shown: Vec<&str> = parts
            .iter()
            .filter(|p| keep(p))
            .map(|p| p.text.as_str())
            .collect();
        if shown.is_empty() {
            shown = parts.iter().map(|p| p.text.as_str()).collect();
        }
        match shown.is_empty() {
            true => r.name.clone(),
            false => format!("{} [{}]", r.name, shown.join(", ")),
        }
    };
    let short = |i: usize, extra: &[&str]| -> String {
        let p: Vec<&Part> = parts[i].iter().flatten().collect();
        label(&runs[i], &p, &|p: &Part| {
            !p.incidental || extra.contains(&p.key)
        })
    };
    // What tells the runs apart: a run's name and what it ran.
    // A run's name, and its recipe's pairs (`None` without one).
    type Group<'a> = (&'a str, Option<Vec<(&'a str, &'a str)>>);
    let group: Vec<Group> = runs
        .iter()
        .map(|r| {
            let recipe = (!r.recipe.is_empty()).then(|| {
                let mut kv: Vec<(&str, &str)> = r
                    .recipe
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                kv.sort();
                kv
            });
            (r.name.as_str(), recipe)
        })
        .collect();
    let mut labels: Vec<String> = (0..runs.len())
        .map(|i| match parts[i] {
            Some(_) => short(i, &[]),
            None => match differing[runs[i].name.as_str()].0 {
                true => format!("{} [recipe.toml unreadable]", runs[i].name),
                false => runs[i].name.clone(),
            },
        })
        .collect();
    // Runs of other recipes that the short label names alike are told apart by the
    // one-sided keys whose values differ among them (two `optim.schedule=step` runs by
    // their `step_size`), not by every one-sided key.
    // Each label's distinct recipes, by a run of each: found in one pass (comparing every
    // pair of runs took seconds for thousands of repeats).
    let recipes_of = |labels: &[String]| {
        let mut of: HashMap<String, Vec<usize>> = HashMap::new();
        for i in 0..runs.len() {
            let firsts = of.entry(labels[i].clone()).or_default();
            if !firsts.iter().any(|&j| group[j] == group[i]) {
                firsts.push(i);
            }
        }
        of
    };
    let alike: Vec<Vec<usize>> = {
        let of = recipes_of(&labels);
        let mut sets: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for i in 0..runs.len() {
            if of[&labels[i]].len() > 1 && parts[i].is_some() {
                sets.entry(labels[i].as_str()).or_default().push(i);
            }
        }
        sets.into_values().collect()
    };
    for set in alike {
        let keys: BTreeSet<&str> = set
            .iter()
            .flat_map(|&i| {
                parts[i]
                    .iter()
                    .flatten()
                    .filter(|p| p.incidental)
                    .map(|p| p.key)
            })
            .collect();
        let telling: Vec<&str> = keys
            .into_iter()
            .filter(|k| {
                let values: BTreeSet<Option<&str>> =
                    set.iter().map(|&i| maps[i].get(k).copied()).collect();
                values.len() > 1
            })
            .collect();
        for &i in &set {
            labels[i] = short(i, &telling);
        }
    }
    // Still alike (a recipe named as another's label, `name = "q [optim.lr=0.5]"`): the
    // later runs' labels numbered, so that no row holds runs of two recipes.
    let of = recipes_of(&labels);
    for i in 0..runs.len() {
        let firsts = &of[&labels[i]];
        if firsts.len() > 1 {
            // Numbered in the order the recipes first come.
            let n = 1 + firsts
                .iter()
                .position(|&j| group[j] == group[i])
                .unwrap_or(0);
            labels[i] = with_number(&labels[i], n);
        }
    }
    labels
}

/// `label`, or `label (n)` for the `n`-th of several recipes labelled alike.
fn with_number(label: &str, n: usize) -> String {
    match n {
        1 => label.to_string(),
        n => format!("{label} ({n})"),
    }
}

/// Whether `given` names the row labelled `label`: the same, or the same name and parts
/// in another order (`--baseline 'q [optim.lr=0.5, loader.workers=0]'` for the row
/// `q [loader.workers=0, optim.lr=0.5]`, which it did not find).
fn same_label(label: &str, given: &str) -> bool {
    let split = |l: &str| -> Option<(String, Vec<String>)> {
        let (name, rest) = l.split_once(" [")?;
        let inner = rest.strip_suffix(']')?;
        let mut parts: Vec<String> = inner.split(", ").map(|p| p.trim().to_string()).collect();
        parts.sort();
        Some((name.to_string(), parts))
    };
    // A grid cell's, `grid/k=v,k=v`: the cell's part starts after the last `/` before
    // its first `=`.
    let cell = |l: &str| -> Option<(String, Vec<String>)> {
        let first = l.find('=')?;
        let at = l[..first].rfind('/')?;
        let mut parts: Vec<String> = l[at + 1..].split(',').map(str::to_string).collect();
        parts.sort();
        Some((l[..at].to_string(), parts))
    };
    label == given
        || (split(label).is_some() && split(label) == split(given))
        || (!label.contains(" [") && cell(label).is_some() && cell(label) == cell(given))
}

/// The samples a step of `run` takes, from its resolved recipe (the batch size times the
/// accumulation steps, 1 where the recipe leaves it out).
fn step_samples(run: &Run) -> Option<u64> {
    let value = |key: &str| {
        run.recipe
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    Some(value("loader.batch_size")? * value("optim.accumulation_steps").unwrap_or(1))
}

/// One line of the comparison: a recipe, over its repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The row's label: the runs' name, and what tells it from the name's other rows.
    pub recipe: String,
    /// The runs' name (the recipe's `name`; a grid cell's `<grid>/<cell>`) and the devices
    /// they ran on (` | ` between several), as their summaries say: columns of their own
    /// in the CSV.
    pub name: String,
    pub device: String,
    pub runs: usize,
    /// Runs with a step after `run.warmup_steps`: only these give the time columns (a
    /// run cut short inside its warm-up has no step time to average in).
    pub timed: usize,
    pub backend: String,
    /// Mean over the timed repeats of each run's median / p95 step time; NaN when none
    /// is timed (shown as `-`).
    pub ms_median: f64,
    pub ms_p95: f64,
    /// Spread of `ms_median` in percent: between repeats when there are several (their
    /// coefficient of variation), else the standard error of one run's median.
    pub cv_pct: f64,
    pub samples_per_s: f64,
    pub gpu_util_pct: Option<f64>,
    pub cpu_util_pct: Option<f64>,
    pub peak_in_use_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    pub data_wait_pct: f64,
    pub cleanup_pct: f64,
    pub test_accuracy: Option<f64>,
    /// Text runs: padding waste (percent of padded positions) and token rates.
    pub pad_waste_pct: Option<f64>,
    /// Text runs: padding positions (padded − real tokens) per run, mean over repeats.
    pub pad_tokens: Option<f64>,
    pub real_tokens_per_s: Option<f64>,
    pub padded_tokens_per_s: Option<f64>,
    /// Runs that compiled kernels at run time (CUDA): process start to the first step
    /// done, the shortest and longest over repeats. A cold kernel cache shows here, not in
    /// `ms_median`.
    pub startup_s: Option<(f64, f64)>,
    /// Samples an optimizer step takes (`loader.batch_size` × `optim.accumulation_steps`
    /// of its recipe); `None` where the run kept no recipe.
    pub samples_per_step: Option<u64>,
    /// `ms_median / baseline's ms_median`; where the row's steps take another number of
    /// samples than the baseline's ([`Row::per_sample`]), the ratio of those medians per
    /// sample (each over its `samples_per_step`): medians both ways, so a heavy tail turns
    /// neither (the mean rate, `samples_per_s`, made a row faster by its median read slower).
    pub ratio: f64,
    /// The ratio compares time per sample, not per step (another batch size).
    pub per_sample: bool,
    /// The difference to the baseline is smaller than twice the combined spread between
    /// runs (a row of one run: the pooled spread of the rows with repeats): of the ratio's
    /// logarithm, so the verdict is the same whichever of two rows is the baseline. `None`
    /// where the row's or the baseline's spread is unknown (no row of the table repeated).
    pub within_noise: Option<bool>,
    pub is_baseline: bool,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn mean_opt(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = v.flatten().collect();
    (!v.is_empty()).then(|| mean(&v))
}

/// Whether `row` is one of the rows of recipe `name` told apart by what they ran
/// (`name [device=...]`, `name [optim.lr=0.5]`), or a cell of grid `name` (`name/cell`:
/// `--baseline GRID` found no row).
fn labelled(row: &Row, name: &str) -> bool {
    row.recipe
        .strip_prefix(name)
        .is_some_and(|rest| rest.starts_with(" [") || rest.starts_with('/'))
}

/// What `--baseline NAME` left to chance: where NAME is no row's whole label but the name of
/// several rows' recipe, the note says which row was taken and how to name another.
pub fn baseline_note(rows: &[Row], name: &str) -> Option<String> {
    // A baseline without a timed run compares with nothing: every ratio is `-`.
    if let Some(b) = rows.iter().find(|r| r.is_baseline && r.timed == 0) {
        let timed: Vec<String> = rows
            .iter()
            .filter(|r| r.timed > 0)
            .take(3)
            .map(|r| format!("--baseline {}", crate::slurm::shell_word(&r.recipe)))
            .collect();
        return Some(format!(
            "note: --baseline {name}: `{}` has no timed step (its runs ended within run.warmup_steps), so no row is compared with it\n  = help: {}",
            b.recipe,
            match timed.is_empty() {
                true => "no row has a timed step: run longer than run.warmup_steps".to_string(),
                false => format!("name a row with timed runs: {}", timed.join(", ")),
            }
        ));
    }
    if rows.iter().any(|r| r.recipe == name) {
        return None;
    }
    let of: Vec<&str> = rows
        .iter()
        .filter(|r| labelled(r, name))
        .map(|r| r.recipe.as_str())
        .collect();
    (of.len() > 1).then(|| {
        // Quoted for the shell; the first few (a grid has dozens).
        let mut others: Vec<String> = of[1..]
            .iter()
            .take(3)
            .map(|r| format!("--baseline {}", crate::slurm::shell_word(r)))
            .collect();
        if of.len() > 4 {
            others.push(format!("{} more", of.len() - 4));
        }
        format!(
            "note: --baseline {name}: {} rows are runs of that recipe; the first, `{}`, is the \
             baseline\n  = help: to compare with another, name its whole row: {}",
            of.len(),
            of[0],
            others.join(", ")
        )
    })
}

/// Groups runs by recipe (its name, and what it ran: [`Run::recipe`]), in order of first
/// appearance, and compares each group with the baseline: `baseline` names a row, or the
/// first timed row is the baseline.
pub fn rows(runs: &[Run], baseline: Option<&str>) -> Result<Vec<Row>, Error> {
    let label = labels(runs);
    let mut order: Vec<&str> = vec![];
    for l in &label {
        if !order.contains(&l.as_str()) {
            order.push(l);
        }
    }
    let mut out: Vec<Row> = order
        .iter()
        .map(|name| {
            let group: Vec<&Run> = runs
                .iter()
                .zip(&label)
                .filter(|(_, l)| l == name)
                .map(|(r, _)| r)
                .collect();
            let s: Vec<&Summary> = group.iter().map(|r| &r.summary).collect();
            // The time columns come from the runs with timed steps alone.
            let t: Vec<&Summary> = s.iter().copied().filter(|s| s.iter_ms.count > 0).collect();
            let timed_mean = |f: fn(&Summary) -> f64| {
                if t.is_empty() {
                    f64::NAN
                } else {
                    mean(&t.iter().map(|s| f(s)).collect::<Vec<_>>())
                }
            };
            let medians: Vec<f64> = t.iter().map(|s| s.iter_ms.median).collect();
            let m = timed_mean(|s| s.iter_ms.median);
            let cv_pct = if medians.len() > 1 {
                100.0 * Stats::of(&medians).std / m
            } else if t.is_empty() {
                f64::NAN
            } else {
                let st = &t[0].iter_ms;
                // Standard error of a median: 1.2533 σ / √n. One timed step has no spread
                // to tell (it said 0.0, and any difference then read as real).
                if st.count > 1 && m > 0.0 {
                    100.0 * 1.2533 * st.std / (st.count as f64).sqrt() / m
                } else {
                    f64::NAN
                }
            };
            Row {
                recipe: name.to_string(),
                name: group[0].name.clone(),
                // Every device of the row's runs (runs without recipe.toml are one row
                // whatever they ran on).
                device: {
                    let mut all: Vec<&str> = vec![];
                    for d in s.iter().map(|s| s.device.as_str()) {
                        if !all.contains(&d) {
                            all.push(d);
                        }
                    }
                    all.join(" | ")
                },
                runs: group.len(),
                timed: t.len(),
                backend: s[0].backend.clone(),
                ms_median: m,
                ms_p95: timed_mean(|s| s.iter_ms.p95),
                cv_pct,
                samples_per_s: timed_mean(|s| s.samples_per_s),
                samples_per_step: step_samples(group[0]),
                gpu_util_pct: mean_opt(s.iter().map(|s| s.gpu_util_pct)),
                cpu_util_pct: mean_opt(s.iter().map(|s| s.cpu_util_pct)),
                peak_in_use_bytes: s.iter().filter_map(|s| s.peak_mem_in_use_bytes).max(),
                peak_reserved_bytes: s.iter().filter_map(|s| s.peak_mem_reserved_bytes).max(),
                peak_rss_bytes: s.iter().filter_map(|s| s.peak_rss_bytes).max(),
                data_wait_pct: timed_mean(|s| s.data_wait_pct),
                cleanup_pct: timed_mean(|s| s.cleanup_pct),
                test_accuracy: mean_opt(s.iter().map(|s| s.test_accuracy)),
                pad_waste_pct: mean_opt(s.iter().map(|s| s.pad_waste_pct)),
                pad_tokens: mean_opt(
                    s.iter()
                        .map(|s| Some(s.padded_tokens?.saturating_sub(s.real_tokens?) as f64)),
                ),
                real_tokens_per_s: mean_opt(s.iter().map(|s| s.real_tokens_per_s)),
                padded_tokens_per_s: mean_opt(s.iter().map(|s| s.padded_tokens_per_s)),
                startup_s: s.iter().filter_map(|s| s.kernels.and(s.startup_s)).fold(
                    None,
                    |r, v| match r {
                        None => Some((v, v)),
                        Some((lo, hi)) => Some((f64::min(lo, v), f64::max(hi, v))),
                    },
                ),
                ratio: 1.0,
                per_sample: false,
                within_noise: Some(true),
                is_baseline: false,
            }
        })
        .collect();
    let base = match baseline {
        // The first recipe with a timed run: an untimed one has no time to compare with.
        None => out.iter().position(|r| r.timed > 0).unwrap_or(0),
        Some(b) => {
            // A recipe's name where its runs are rows of their own (`name [device=...]`):
            // the first of them, as the default takes the first row.
            out.iter()
                    .position(|r| r.recipe == b)
                    .or_else(|| out.iter().position(|r| same_label(&r.recipe, b)))
                    .or_else(|| out.iter().position(|r| labelled(r, b)))
                    .ok_or_else(|| {
                        // Quoted for the shell: a label holds spaces and commas.
                        Error::Input(format!(
                            "error: --baseline {b}: no run of that recipe\n  = help: the rows here are: {}",
                            out.iter()
                                .map(|r| crate::slurm::shell_word(&r.recipe))
                                .collect::<Vec<_>>()
                                .join(" ")
                        ))
                    })?
        }
    };
    out[base].is_baseline = true;
    // The spread between runs the verdict needs: a row's own over its repeats; a row of one
    // run takes the pooled spread (root mean square) of the rows with repeats, as runs on
    // one machine share its noise; with no repeats in the table there is none (`?`). One
    // run's standard error tells how well its median is known, not how far another run of
    // it would land: five runs of one recipe read 0.97x to 1.11x of each other, at 0.8%
    // each, and each of those differences was claimed.
    let repeated: Vec<f64> = out
        .iter()
        .filter(|r| r.timed > 1 && r.cv_pct.is_finite())
        .map(|r| r.cv_pct)
        .collect();
    let pooled = (!repeated.is_empty())
        .then(|| (repeated.iter().map(|c| c * c).sum::<f64>() / repeated.len() as f64).sqrt());
    let between = |r: &Row| {
        if r.timed > 1 {
            r.cv_pct
        } else {
            pooled.unwrap_or(f64::NAN)
        }
    };
    let (bm, bcv) = (out[base].ms_median, between(&out[base]));
    let bn = out[base].samples_per_step;
    for r in &mut out {
        // A step of another batch size is another amount of work: compared per sample.
        r.per_sample = matches!((r.samples_per_step, bn), (Some(a), Some(b)) if a != b);
        // NaN (shown as `-`) when either side has no timed step.
        r.ratio = match (r.samples_per_step, bn) {
            _ if bm.is_nan() || bm <= 0.0 => f64::NAN,
            (Some(a), Some(b)) if r.per_sample => (r.ms_median / a as f64) / (bm / b as f64),
            _ => r.ms_median / bm,
        };
        // `None` where a spread is unknown: no claim either way.
        let noise = 2.0 * ((between(r) / 100.0).powi(2) + (bcv / 100.0).powi(2)).sqrt();
        r.within_noise = if r.is_baseline {
            Some(true)
        } else {
            (!noise.is_nan()).then(|| r.ratio.ln().abs() <= noise)
        };
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// A Markdown table (for BENCHMARKS.md, issues, pull requests).
    Md,
    /// Comma-separated values, full precision.
    Csv,
}

fn gib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.2}", b as f64 / (1u64 << 30) as f64)
    })
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// A time column: `-` where no run was timed.
fn num(v: f64, digits: usize) -> String {
    opt(v.is_finite().then_some(v), digits)
}

/// The table's header and cells, as text.
fn cells(rows: &[Row]) -> (Vec<String>, Vec<Vec<String>>) {
    let gpu = rows.iter().any(|r| r.gpu_util_pct.is_some());
    let cpu = rows.iter().any(|r| r.cpu_util_pct.is_some());
    let dev_mem = rows.iter().any(|r| r.peak_in_use_bytes.is_some());
    let mut header: Vec<String> = ["recipe", "runs", "ms/iter", "± %", "p95 ms", "samples/s"]
        .map(String::from)
        .to_vec();
    if gpu {
        header.push("GPU util %".into());
    }
    if cpu {
        header.push("CPU util %".into());
    }
    if dev_mem {
        header.extend(["mem in use GiB".into(), "mem reserved GiB".into()]);
    }
    let text = rows.iter().any(|r| r.pad_waste_pct.is_some());
    header.extend(["peak RSS GiB", "data wait %", "cleanup %"].map(String::from));
    if text {
        header
            .extend(["pad tokens", "pad waste %", "real tok/s", "padded tok/s"].map(String::from));
    }
    let startup = rows.iter().any(|r| r.startup_s.is_some());
    if startup {
        header.push("startup s".into());
    }
    header.extend(["test acc %", "vs baseline"].map(String::from));
    let body = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.recipe.clone(),
                if r.timed == r.runs {
                    r.runs.to_string()
                } else {
                    format!("{} ({} timed)", r.runs, r.timed)
                },
                num(r.ms_median, 2),
                num(r.cv_pct, 1),
                num(r.ms_p95, 2),
                num(r.samples_per_s, 1),
            ];
            if gpu {
                c.push(opt(r.gpu_util_pct, 1));
            }
            if cpu {
                c.push(opt(r.cpu_util_pct, 1));
            }
            if dev_mem {
                c.extend([gib(r.peak_in_use_bytes), gib(r.peak_reserved_bytes)]);
            }
            c.extend([
                gib(r.peak_rss_bytes),
                num(r.data_wait_pct, 1),
                num(r.cleanup_pct, 1),
            ]);
            if text {
                c.extend([
                    opt(r.pad_tokens, 0),
                    opt(r.pad_waste_pct, 1),
                    opt(r.real_tokens_per_s, 0),
                    opt(r.padded_tokens_per_s, 0),
                ]);
            }
            if startup {
                c.push(match r.startup_s {
                    None => "-".into(),
                    Some((lo, hi)) if lo == hi => format!("{lo:.1}"),
                    Some((lo, hi)) => format!("{lo:.1}-{hi:.1}"),
                });
            }
            c.extend([
                opt(r.test_accuracy.map(|a| 100.0 * a), 2),
                if r.is_baseline {
                    "baseline".into()
                } else if !r.ratio.is_finite() {
                    "-".into()
                } else {
                    let per = if r.per_sample { "/sample" } else { "" };
                    let noise = match r.within_noise {
                        Some(true) => " ≈",
                        Some(false) => "",
                        None => " ?",
                    };
                    format!("{:.2}x{per}{noise}", r.ratio)
                },
            ]);
            c
        })
        .collect();
    (header, body)
}

/// One CSV line of the report: the columns, in order, named as in the header.
#[derive(serde::Serialize)]
struct CsvRow<'a> {
    recipe: &'a str,
    runs: usize,
    timed_runs: usize,
    backend: &'a str,
    ms_median: Option<f64>,
    ms_p95: Option<f64>,
    /// The table's `± %`: a coefficient of variation over repeats, or one run's standard
    /// error (`cv_pct` named it for the first alone).
    #[serde(rename = "spread_pct")]
    cv_pct: Option<f64>,
    samples_per_s: Option<f64>,
    gpu_util_pct: Option<f64>,
    cpu_util_pct: Option<f64>,
    peak_mem_in_use_bytes: Option<u64>,
    peak_mem_reserved_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
    data_wait_pct: Option<f64>,
    cleanup_pct: Option<f64>,
    pad_tokens: Option<f64>,
    pad_waste_pct: Option<f64>,
    real_tokens_per_s: Option<f64>,
    padded_tokens_per_s: Option<f64>,
    startup_s_min: Option<f64>,
    startup_s_max: Option<f64>,
    test_accuracy: Option<f64>,
    ratio: Option<f64>,
    /// Empty where there is no ratio.
    within_noise: Option<bool>,
    /// What the ratio compares: `step` (ms/iter) or `sample` (another batch size than the
    /// baseline's: samples/s); empty where there is no ratio.
    ratio_per: Option<&'static str>,
    /// The runs' name and device(s), to group rows by (last: the columns before them keep
    /// their places).
    name: &'a str,
    device: &'a str,
}

/// An empty CSV field where no run was timed.
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The rows as CSV (the `csv` crate: quoting, and an empty field for a missing value).
fn csv_rows(rows: &[Row]) -> String {
    let mut w = csv::Writer::from_writer(vec![]);
    for r in rows {
        let line = CsvRow {
            recipe: &r.recipe,
            runs: r.runs,
            timed_runs: r.timed,
            backend: &r.backend,
            ms_median: finite(r.ms_median),
            ms_p95: finite(r.ms_p95),
            cv_pct: finite(r.cv_pct),
            samples_per_s: finite(r.samples_per_s),
            gpu_util_pct: r.gpu_util_pct,
            cpu_util_pct: r.cpu_util_pct,
            peak_mem_in_use_bytes: r.peak_in_use_bytes,
            peak_mem_reserved_bytes: r.peak_reserved_bytes,
            peak_rss_bytes: r.peak_rss_bytes,
            data_wait_pct: finite(r.data_wait_pct),
            cleanup_pct: finite(r.cleanup_pct),
            pad_tokens: r.pad_tokens,
            pad_waste_pct: r.pad_waste_pct,
            real_tokens_per_s: r.real_tokens_per_s,
            padded_tokens_per_s: r.padded_tokens_per_s,
            startup_s_min: r.startup_s.map(|s| s.0),
            startup_s_max: r.startup_s.map(|s| s.1),
            test_accuracy: r.test_accuracy,
            ratio: finite(r.ratio),
            within_noise: r.within_noise.filter(|_| r.ratio.is_finite()),
            ratio_per: r
                .ratio
                .is_finite()
                .then_some(if r.per_sample { "sample" } else { "step" }),
            name: &r.name,
            device: &r.device,
        };
        w.serialize(line)
            .expect("a flat record serialises into memory");
    }
    let bytes = w.into_inner().expect("an in-memory writer cannot fail");
    String::from_utf8(bytes).expect("CSV of UTF-8 fields is UTF-8")
}

/// Renders the rows. The table and Markdown end with a note on reading them.
pub fn render(rows: &[Row], format: Format) -> String {
    let mut out = String::new();
    match format {
        Format::Csv => return csv_rows(rows),
        Format::Md => {
            let (h, body) = cells(rows);
            let _ = writeln!(out, "| {} |", h.join(" | "));
            let _ = writeln!(
                out,
                "|{}|",
                h.iter().map(|_| " --- ").collect::<Vec<_>>().join("|")
            );
            for c in body {
                // A `|` in a name (a recipe's, a value's) would end its cell.
                let c: Vec<String> = c.iter().map(|x| x.replace('|', "\\|")).collect();
                let _ = writeln!(out, "| {} |", c.join(" | "));
            }
        }
        Format::Table => {
            let (h, body) = cells(rows);
            let widths: Vec<usize> = (0..h.len())
                .map(|i| {
                    body.iter()
                        .map(|c| crate::columns::width(&c[i]))
                        .chain([crate::columns::width(&h[i])])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |c: &[String]| {
                c.iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(i, (s, w))| {
                        if i == 0 {
                            crate::columns::pad_right(s, *w)
                        } else {
                            crate::columns::pad_left(s, *w)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
            };
            let _ = writeln!(out, "{}", line(&h));
            for c in &body {
                let _ = writeln!(out, "{}", line(c));
            }
        }
    }
    out.push_str(
        "\nms/iter: mean over the timed runs of each run's median step time after warm-up; ± %: spread of that \
         median (coefficient of variation over repeats, or one run's standard error; - for a \
         single run of one timed step); ≈: the difference to the baseline is within twice the \
         combined spread between runs (a row of one run takes the pooled spread of the rows \
         with repeats); ?: no row was repeated, so noise cannot be told apart from a \
         difference (run the recipes again, then runner report, or run them with --repeat 2). vs \
         baseline: the \
         row's ms/iter over the baseline's (above 1x: slower per iteration); a row whose \
         steps take another number of samples (batch × accumulation) is compared per sample \
         (x/sample: the row's ms/iter per sample over the baseline's). p95 ms, samples/s, data wait % and \
         cleanup %: means over the timed runs; GPU/CPU util % and test acc %: means over the runs \
         (CPU util: of the cores the run could use); memory: the largest over the runs.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, iters: &[f64]) -> Run {
        run_with(name, iters, 10, 0)
    }

    /// A run of steps of `iters` ms and `samples` samples each, the first `warmup` untimed.
    fn run_with(name: &str, iters: &[f64], samples: usize, warmup: u64) -> Run {
        let records: Vec<StepRecord> = iters
            .iter()
            .enumerate()
            .map(|(i, &ms)| StepRecord {
                step: i as u64 + 1,
                samples,
                iter_ms: ms,
                ..Default::default()
            })
            .collect();
        let mut summary = Summary {
            name: name.into(),
            ..Default::default()
        };
        summary.absorb(&records, warmup);
        let mut trace = Trace::default();
        records.iter().for_each(|r| trace.push(r.step, r.iter_ms));
        Run {
            dir: PathBuf::new(),
            name: name.into(),
            recipe: vec![],
            trace,
            summary,
        }
    }

    /// The CSV's `device` names every device of a row's runs: runs without a recipe.toml
    /// are one row whatever they ran on (it named the first run's alone).
    #[test]
    fn a_row_names_every_device_its_runs_ran_on() {
        let mut a = run("plain", &[10.0, 10.0]);
        let mut b = run("plain", &[20.0, 20.0]);
        a.summary.device = "NVIDIA A100".into();
        b.summary.device = "AMD EPYC".into();
        let r = rows(&[a.clone(), b, a], None).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].name.as_str(), r[0].device.as_str()),
            ("plain", "NVIDIA A100 | AMD EPYC")
        );
        let csv = render(&r, Format::Csv);
        assert!(
            csv.lines()
                .nth(1)
                .unwrap()
                .ends_with(",plain,NVIDIA A100 | AMD EPYC"),
            "{csv}"
        );
    }

    #[test]
    fn runs_of_one_name_that_ran_different_recipes_are_rows_of_their_own() {
        let with = |name: &str, recipe: &[(&str, &str)], ms: f64| Run {
            recipe: recipe
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..run(name, &[ms, ms, ms])
        };
        let runs = vec![
            with("q", &[("cleanup.every", "never"), ("seed", "1")], 10.0),
            with("q", &[("cleanup.every", "step"), ("seed", "1")], 20.0),
            with("q", &[("cleanup.every", "never"), ("seed", "1")], 12.0),
            with(
                "q",
                &[("cleanup.every", "step"), ("seed", "1"), ("x", "1")],
                30.0,
            ),
            with("other", &[("seed", "2")], 5.0),
        ];
        let r = rows(&runs, None).unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.recipe.as_str()).collect();
        assert_eq!(
            names,
            [
                // Where each leaves the usual: cleanup.every is "never" (a tie of 2 and 2:
                // the first run's), and x unset.
                "q",
                "q [cleanup.every=step]",
                "q [cleanup.every=step, x=1]",
                "other"
            ]
        );
        assert_eq!((r[0].runs, r[0].ms_median), (2, 11.0));
        assert_eq!((r[1].runs, r[1].ms_median), (1, 20.0));
        assert!(rows(&runs, Some("q [cleanup.every=step, x=1]")).unwrap()[2].is_baseline);
        // A key one side alone has (brought in or dropped with another) is left out of the
        // label, unless it is what tells two recipes apart.
        let base = [("optim.schedule", "cosine"), ("optim.min_lr", "0")];
        let step = [("optim.schedule", "step"), ("optim.gamma", "0.1")];
        let step2 = [("optim.schedule", "step"), ("optim.gamma", "0.5")];
        let runs = vec![
            with("s", &base, 10.0),
            with("s", &base, 10.0),
            with("s", &step, 10.0),
            with("s", &[("optim.schedule", "constant")], 10.0),
        ];
        assert_eq!(
            labels(&runs),
            [
                "s",
                "s",
                "s [optim.schedule=step]",
                "s [optim.schedule=constant]"
            ]
        );
        let runs = vec![
            with("s", &base, 10.0),
            with("s", &base, 10.0),
            with("s", &step, 10.0),
            with("s", &step2, 10.0),
        ];
        assert_eq!(
            labels(&runs),
            [
                "s",
                "s",
                // Told apart by the one-sided key whose values differ, not every one.
                "s [optim.gamma=0.1, optim.schedule=step]",
                "s [optim.gamma=0.5, optim.schedule=step]"
            ]
        );
        // The thread count a run had, beside the key that set it, is said once.
        let runs = vec![
            with("t", &[("backend.threads", "0"), ("cpu threads", "2")], 10.0),
            with("t", &[("backend.threads", "0"), ("cpu threads", "2")], 10.0),
            with("t", &[("backend.threads", "1"), ("cpu threads", "1")], 10.0),
        ];
        assert_eq!(labels(&runs), ["t", "t", "t [backend.threads=1]"]);
        // A recipe named as another's label is no repeat of it.
        fn lr(v: &str) -> [(&str, &str); 2] {
            [("optim.lr", v), ("seed", "1")]
        }
        let runs = vec![
            with("q", &lr("0.5"), 10.0),
            with("q", &lr("0.02"), 10.0),
            with("q", &lr("0.02"), 10.0),
            with("q [optim.lr=0.5]", &lr("0.02"), 30.0),
        ];
        let r = rows(&runs, None).unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.recipe.as_str()).collect();
        assert_eq!(names, ["q [optim.lr=0.5]", "q", "q [optim.lr=0.5] (2)"]);
        assert_eq!((r[0].runs, r[2].runs), (1, 1));
        // --baseline takes a label's parts in any order.
        let runs = vec![
            with("o", &[("a", "1"), ("b", "1")], 10.0),
            with("o", &[("a", "1"), ("b", "1")], 10.0),
            with("o", &[("a", "2"), ("b", "2")], 20.0),
        ];
        assert!(rows(&runs, Some("o [b=2, a=2]")).unwrap()[1].is_baseline);
        assert!(same_label("g/a=1,b=2", "g/b=2,a=1"));
        assert!(same_label("x/g/lr=0.1,w=[1/2]", "x/g/w=[1/2],lr=0.1"));
        assert!(!same_label("g/a=1,b=2", "h/b=2,a=1"));
        // Ten A/Bs of one key each: a label names its own key alone.
        let base = [("optim.lr", "0.1"), ("loader.workers", "0"), ("seed", "1")];
        let mut runs = vec![with("r", &base, 10.0), with("r", &base, 10.0)];
        for (k, v) in [("optim.lr", "0.5"), ("loader.workers", "4"), ("seed", "2")] {
            let mut recipe = base;
            recipe.iter_mut().find(|(key, _)| *key == k).unwrap().1 = v;
            runs.push(with("r", &recipe, 10.0));
        }
        let r = rows(&runs, None).unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.recipe.as_str()).collect();
        assert_eq!(
            names,
            [
                "r",
                "r [optim.lr=0.5]",
                "r [loader.workers=4]",
                "r [seed=2]"
            ]
        );
    }

    #[test]
    fn a_bar_in_a_name_stays_in_its_markdown_cell() {
        let r = rows(&[run("p|q", &[10.0, 10.0])], None).unwrap();
        let md = render(&r, Format::Md);
        let row = md.lines().nth(2).unwrap();
        assert!(row.starts_with("| p\\|q | "), "{md}");
        let cells = row.replace("\\|", "").matches('|').count();
        assert_eq!(
            cells,
            md.lines().next().unwrap().matches('|').count(),
            "{md}"
        );
    }

    /// A run of `batch` samples a step (× `accumulation`), each step `ms`.
    fn run_of(name: &str, ms: f64, batch: u64, accumulation: u64) -> Run {
        let mut r = run_with(name, &[ms; 8], (batch * accumulation) as usize, 0);
        r.recipe = vec![
            ("loader.batch_size".into(), batch.to_string()),
            ("optim.accumulation_steps".into(), accumulation.to_string()),
        ];
        r
    }

    #[test]
    fn a_row_of_another_batch_size_is_compared_per_sample() {
        let runs = vec![
            run_of("b16", 10.0, 16, 1),
            run_of("b64", 30.0, 64, 1),
            run_of("b8x2", 12.0, 8, 2),
        ];
        let r = rows(&runs, None).unwrap();
        // 64 samples in 30 ms is faster per sample than 16 in 10 ms, though slower per step.
        assert!(r[1].per_sample && (r[1].ratio - (30.0 / 64.0) / (10.0 / 16.0)).abs() < 1e-12);
        assert!(r[1].ratio < 1.0, "{}", r[1].ratio);
        // 8 × 2 accumulated is the baseline's 16 a step: compared per step.
        assert!(!r[2].per_sample && (r[2].ratio - 1.2).abs() < 1e-12);
        let (_, body) = cells(&r);
        // (One run each: no spread between runs, so no verdict on noise.)
        assert_eq!(
            body[1].last().unwrap(),
            &format!("{:.2}x/sample ?", r[1].ratio)
        );
        assert_eq!(body[2].last().unwrap(), "1.20x ?");
        let csv = render(&r, Format::Csv);
        assert!(csv.lines().nth(2).unwrap().contains(",sample,"), "{csv}");
        assert!(csv.lines().nth(3).unwrap().contains(",step,"), "{csv}");
    }

    #[test]
    fn the_noise_verdict_is_the_same_whichever_row_is_the_baseline() {
        // Spread 12.9% each, so noise 0.36: 0.7x is 0.30 from 1 and its inverse, 1.43x,
        // 0.43 (a verdict that turned with the baseline); the ratio's logarithm is 0.357.
        let runs = vec![
            run("a", &[10.0, 10.0, 10.0]),
            run("a", &[12.0, 12.0, 12.0]),
            run("b", &[7.0, 7.0, 7.0]),
            run("b", &[8.4, 8.4, 8.4]),
        ];
        let from_a = rows(&runs, Some("a")).unwrap();
        let from_b = rows(&runs, Some("b")).unwrap();
        assert!((from_a[1].ratio - 0.7).abs() < 1e-12, "{}", from_a[1].ratio);
        assert_eq!(from_a[1].within_noise, Some(true));
        assert_eq!(from_b[0].within_noise, Some(true));
    }

    #[test]
    fn repeats_aggregate_and_noise_is_marked() {
        let runs = vec![
            run("base", &[10.0, 10.0, 10.0]),
            run("base", &[12.0, 12.0, 12.0]),
            run("slow", &[20.0, 20.0, 20.0]),
            run("same", &[11.2, 11.0, 10.8]),
        ];
        let r = rows(&runs, None).unwrap();
        assert_eq!(
            r.iter().map(|r| r.recipe.as_str()).collect::<Vec<_>>(),
            ["base", "slow", "same"]
        );
        assert_eq!(r[0].runs, 2);
        assert_eq!(r[0].ms_median, 11.0);
        assert!((r[0].cv_pct - 100.0 * 2f64.sqrt() / 11.0).abs() < 1e-9);
        assert!(r[1].within_noise == Some(false) && (r[1].ratio - 20.0 / 11.0).abs() < 1e-12);
        assert_eq!(r[2].within_noise, Some(true), "11.0 vs 11.0 ± 12.9%");
        // A run without its recipe beside runs of its name that have theirs: a row of its
        // own, and theirs are labelled among themselves (every key was listed).
        let with = |name: &str, lr: &str| Run {
            recipe: vec![("optim.lr".into(), lr.into()), ("seed".into(), "1".into())],
            ..run(name, &[1.0, 2.0])
        };
        let mixed = vec![
            with("q", "0.1"),
            with("q", "0.1"),
            run("q", &[1.0]),
            with("q", "0.2"),
        ];
        assert_eq!(
            labels(&mixed),
            ["q", "q", "q [recipe.toml unreadable]", "q [optim.lr=0.2]"]
        );
        let alike = vec![with("q", "0.1"), with("q", "0.1"), run("q", &[1.0])];
        assert_eq!(labels(&alike), ["q", "q", "q [recipe.toml unreadable]"]);
        // One run of one timed step has no spread: none is claimed, nor any difference.
        let one = vec![run("base", &[10.0]), run("other", &[20.0])];
        let r = rows(&one, None).unwrap();
        assert!(r[0].cv_pct.is_nan() && r[1].cv_pct.is_nan());
        assert_eq!((r[0].within_noise, r[1].within_noise), (Some(true), None));
        let (_, body) = cells(&r);
        assert!(body[1].last().unwrap().ends_with("2.00x ?"), "{body:?}");
        // Every rendered row has a cell under every header, text columns included.
        let mut text = runs.clone();
        for r in &mut text {
            r.summary.pad_waste_pct = Some(10.0);
            r.summary.real_tokens = Some(90);
            r.summary.padded_tokens = Some(100);
        }
        for rows in [rows(&runs, None).unwrap(), rows(&text, None).unwrap()] {
            let md = render(&rows, Format::Md);
            let widths: Vec<usize> = md
                .lines()
                .filter(|l| l.starts_with('|'))
                .map(|l| l.matches(" | ").count())
                .collect();
            assert!(widths.windows(2).all(|w| w[0] == w[1]), "{md}");
            let (h, body) = cells(&rows);
            assert!(body.iter().all(|c| c.len() == h.len()));
        }
        let by = rows(&runs, Some("slow")).unwrap();
        assert_eq!(by[1].ratio, 1.0);
        assert!(rows(&runs, Some("nope"))
            .unwrap_err()
            .to_string()
            .contains("the rows here are: base slow same"));
    }

    /// A run with no step after its warm-up (cut short, or a smoke test) adds nothing to
    /// the time columns: not a 0 ms median pulling the mean down, nor a NaN spread.
    #[test]
    fn runs_without_timed_steps_are_left_out_of_the_times() {
        let short = run_with("quickstart", &[30.0, 40.0], 10, 5);
        assert_eq!(short.summary.iter_ms.count, 0);
        let runs = vec![
            run("quickstart", &[18.0, 18.5, 19.0]),
            short.clone(),
            run("other", &[9.0, 9.0, 9.0]),
            Run {
                name: "untimed".into(),
                ..short
            },
        ];
        let r = rows(&runs, None).unwrap();
        assert_eq!((r[0].runs, r[0].timed), (2, 1));
        assert_eq!(r[0].ms_median, 18.5, "the timed run's median alone");
        assert!(r[0].cv_pct.is_finite() && r[0].samples_per_s > 0.0);
        assert_eq!(r[0].cleanup_pct, 0.0);
        assert!((r[1].ratio - 9.0 / 18.5).abs() < 1e-12);
        assert!(r[2].ms_median.is_nan() && r[2].ratio.is_nan());
        let (_, body) = cells(&r);
        assert_eq!(body[0][1], "2 (1 timed)");
        assert_eq!(body[0][2], "18.50");
        assert_eq!(&body[2][1..6], ["1 (0 timed)", "-", "-", "-", "-"]);
        assert_eq!(body[2].last().unwrap(), "-", "no ratio");
        let csv = render(&r, Format::Csv);
        let untimed = csv.lines().find(|l| l.starts_with("untimed,")).unwrap();
        assert!(untimed.starts_with("untimed,1,0,,,,,,"), "{untimed}");
        assert!(!csv.contains("NaN"), "{csv}");
        assert!(
            untimed.ends_with(",,,untimed,"),
            "no ratio, and no verdict on noise; then its name and (here) no device: {untimed}"
        );
        // Named as the baseline, an untimed recipe gives no ratio at all; by default the
        // first timed recipe is the baseline.
        let by = rows(&runs, Some("untimed")).unwrap();
        assert!(by.iter().all(|r| r.ratio.is_nan()));
        let mut first_untimed = runs.clone();
        first_untimed.rotate_right(1);
        let by = rows(&first_untimed, None).unwrap();
        assert_eq!(by[0].recipe, "untimed");
        assert!(by[1].is_baseline && (by[2].ratio - 9.0 / 18.5).abs() < 1e-12);
    }

    /// The figure's step times: every step's up to `Trace::MAX`, then means of 2, 4, ...
    /// consecutive steps, at their mean step, with the slowest step kept.
    #[test]
    fn a_long_run_s_trace_is_means_of_consecutive_steps() {
        let mut short = Trace::default();
        (1..=10).for_each(|s| short.push(s, s as f64));
        let points: Vec<(f64, f64)> = short.points().collect();
        assert_eq!(
            points,
            (1..=10).map(|s| (s as f64, s as f64)).collect::<Vec<_>>()
        );
        let mut long = Trace::default();
        let n = 5 * Trace::MAX as u64 + 3;
        (1..=n).for_each(|s| long.push(s, if s == 77 { 1e6 } else { s as f64 }));
        let points: Vec<(f64, f64)> = long.points().collect();
        assert!(points.len() <= 2 * Trace::MAX, "{}", points.len());
        assert_eq!((long.steps, long.max_ms), (n, 1e6));
        // Four steps a point (2 × MAX points were reached twice), the last three as one.
        assert_eq!(points[0], (2.5, 2.5));
        assert_eq!(points[1], (6.5, 6.5));
        assert_eq!(*points.last().unwrap(), ((n - 1) as f64, (n - 1) as f64));
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
