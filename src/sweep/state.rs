//! A grid's directory: each cell's state (and the manifest naming them), the per-cell lock
//! files that let shards and Slurm tasks share a grid, and running the cells in order.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    Done,
    Failed,
    /// Stopped by a signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1/2): `--resume` runs it again.
    Interrupted,
}

/// A grid's cell as env.json names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridCell {
    /// Its position in the grid's expansion order.
    pub index: usize,
    /// Its id (`sweep::cell_id`), the end of its status file's name.
    pub id: String,
}

impl GridCell {
    /// The cell env.json in `run_dir` names; `None` where it names none (a run by itself,
    /// or of a version before 2026-12-06) or cannot be read.
    pub fn of_run(run_dir: &Path) -> Option<GridCell> {
        let text = crate::metrics::read_text(run_dir.join("env.json")).ok()?;
        let env: serde_json::Value = serde_json::from_str(&text).ok()?;
        serde_json::from_value(env.get("cell")?.clone()).ok()
    }
}

/// A cell's status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellStatus {
    pub state: State,
    pub run_dir: Option<PathBuf>,
    pub host: String,
    pub pid: u32,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestCell {
    pub index: usize,
    pub name: String,
    pub id: String,
    pub assignments: Vec<(String, toml::Value)>,
}

/// `manifest.json`: written once, when the sweep directory is made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub grid_id: String,
    pub recipe: String,
    pub axes: Vec<String>,
    pub cells: Vec<ManifestCell>,
}

/// `<log.dir>/<name>/sweeps/<grid-id>/`: the manifest, `cells/<index>-<id>.json` status
/// files (one writer each, written whole by rename, so shards on a shared file system never
/// write the same file), `locks/` (see `CellLock`), and the Slurm script.
pub struct SweepDir {
    pub dir: PathBuf,
}

impl SweepDir {
    pub fn open(root: &Path, base: &str, recipe: &Path, cells: &[Cell]) -> std::io::Result<Self> {
        let dir = root.join(base).join("sweeps").join(grid_id(cells));
        // Each error names its path (a `cells` that is a file said only "File exists").
        let at = |p: &Path| {
            let p = p.to_path_buf();
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
        };
        for sub in ["cells", "locks"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(at(&dir.join(sub)))?;
        }
        let manifest = dir.join("manifest.json");
        // Written once; rewritten if it cannot be read (cut by a crash or a full disk).
        let readable = crate::metrics::read_text(&manifest)
            .ok()
            .is_some_and(|t| serde_json::from_str::<Manifest>(&t).is_ok());
        if !readable {
            let m = Manifest {
                grid_id: grid_id(cells),
                recipe: recipe.display().to_string(),
                axes: cells
                    .first()
                    .map(|c| c.assignments.iter().map(|(k, _)| k.clone()).collect())
                    .unwrap_or_default(),
                cells: cells
                    .iter()
                    .map(|c| ManifestCell {
                        index: c.index,
                        name: c.name.clone(),
                        id: c.id.clone(),
                        assignments: c.assignments.clone(),
                    })
                    .collect(),
            };
            write_json_atomic(&manifest, &m).map_err(at(&manifest))?;
        }
        Ok(Self { dir })
    }

    /// The cell's lock file (see `CellLock`).
    pub fn lock_path(&self, c: &Cell) -> PathBuf {
        self.dir
            .join("locks")
            .join(format!("{:04}-{}.lock", c.index, c.id))
    }

    fn status_path(&self, c: &Cell) -> PathBuf {
        self.dir
            .join("cells")
            .join(format!("{:04}-{}.json", c.index, c.id))
    }

    /// The cell's status, its run directory found again (see `locate`).
    pub fn status(&self, c: &Cell) -> Option<CellStatus> {
        self.read_status(&self.status_path(c))
    }

    /// Why the cell's status file is there but cannot be read, if it is.
    pub fn unreadable_status(&self, c: &Cell) -> Option<String> {
        let path = self.status_path(c);
        let text = match crate::metrics::read_text(&path) {
            Ok(text) => text,
            Err(e) if path.exists() => return Some(e.to_string()),
            Err(_) => return None,
        };
        serde_json::from_str::<CellStatus>(&text)
            .err()
            .map(|e| e.to_string())
    }

    fn read_status(&self, path: &Path) -> Option<CellStatus> {
        let text = crate::metrics::read_text(path).ok()?;
        let mut s: CellStatus = serde_json::from_str(&text).ok()?;
        s.run_dir = s.run_dir.map(|d| self.locate(d));
        Some(s)
    }

    /// A run directory a status file names: as written where it is there, else the one
    /// under this grid's `<log.dir>/<name>/` that ends in the same components (longest
    /// first). Status files are written with absolute paths, and hold paths relative to
    /// the writer's working directory where older versions wrote them; either goes stale
    /// when the log directory is moved or copied (to another machine, another mount
    /// point), and a relative one from any other working directory. Done cells were then
    /// trained again by `--resume`. A path outside this grid's folder that is there is
    /// taken only where no run under it ends the same way: a grid's folder copied into
    /// another clone (another user's, on a shared file system) resumed the original's runs,
    /// in the other clone, and left the copy's as they were.
    fn locate(&self, stored: PathBuf) -> PathBuf {
        let Some(base) = self.dir.parent().and_then(Path::parent) else {
            return stored;
        };
        if stored.starts_with(base) && stored.is_dir() {
            return stored;
        }
        let parts: Vec<&std::ffi::OsStr> = stored
            .components()
            .filter_map(|p| match p {
                std::path::Component::Normal(s) => Some(s),
                _ => None,
            })
            .collect();
        (0..parts.len())
            .map(|from| {
                parts[from..]
                    .iter()
                    .fold(base.to_path_buf(), |d, p| d.join(p))
            })
            .find(|d| d.is_dir())
            .unwrap_or(stored)
    }

    pub fn mark(
        &self,
        c: &Cell,
        state: State,
        run_dir: Option<&Path>,
        error: Option<String>,
    ) -> std::io::Result<()> {
        let s = CellStatus {
            state,
            // Absolute: `--resume` from another working directory finds it as written.
            run_dir: run_dir.map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf())),
            host: crate::clock::hostname().unwrap_or_default(),
            pid: std::process::id(),
            updated_at: crate::clock::utc_now(),
            error,
        };
        write_json_atomic(&self.status_path(c), &s)
    }

    /// The cell's status in the grid's other sweep directories (ones made when its axes
    /// had other values: the grid's id changed, its cells' ids did not), found by its id
    /// or by the ids earlier versions gave it; each with the path of its lock there.
    fn elsewhere(&self, c: &Cell) -> Vec<(CellStatus, PathBuf)> {
        let Some(sweeps) = self.dir.parent() else {
            return vec![];
        };
        let suffixes: Vec<String> = std::iter::once(&c.id)
            .chain(&c.earlier_ids)
            .map(|id| format!("-{id}.json"))
            .collect();
        let others = std::fs::read_dir(sweeps)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|d| *d != self.dir);
        let mut found = vec![];
        for other in others {
            let statuses = std::fs::read_dir(other.join("cells"))
                .into_iter()
                .flatten()
                .flatten();
            for f in statuses {
                let name = f.file_name().to_string_lossy().into_owned();
                if !suffixes
                    .iter()
                    .any(|s| !s.starts_with("-.") && name.ends_with(s))
                {
                    continue;
                }
                let lock = other
                    .join("locks")
                    .join(Path::new(&name).with_extension("lock"));
                let sweep = SweepDir { dir: other.clone() };
                if let Some(s) = sweep.read_status(&f.path()) {
                    found.push((s, lock));
                }
            }
        }
        found
    }

    /// Whether the cell is done in another sweep directory of this grid; if so it is
    /// marked done here too, with that run. (`--resume` ran every done cell again when an
    /// axis gained a value.)
    pub fn adopt_done_elsewhere(
        &self,
        c: &Cell,
        current: impl Fn(&Path) -> bool,
    ) -> std::io::Result<bool> {
        let done = self.elsewhere(c).into_iter().find_map(|(s, _)| {
            s.run_dir
                .filter(|d| s.state == State::Done && completed(d) && current(d))
        });
        match done {
            Some(run_dir) => self
                .mark(c, State::Done, Some(&run_dir), None)
                .map(|()| true),
            None => Ok(false),
        }
    }

    /// The cell's run as it stopped in another sweep directory of this grid (interrupted,
    /// or killed while it ran) where no live process holds its lock: the latest such.
    /// `--resume` continues that run from its checkpoint; it trained the cell again from
    /// its first step when an axis had gained a value meanwhile.
    pub fn stopped_elsewhere(&self, c: &Cell) -> Option<CellStatus> {
        let host = crate::clock::hostname().unwrap_or_else(|| "unnamed-host".into());
        let held = |lock: &Path| {
            crate::metrics::read_text(lock).is_ok_and(|owner| !CellLock::stale(lock, &owner, &host))
        };
        self.elsewhere(c)
            .into_iter()
            .filter(|(s, lock)| {
                matches!(s.state, State::Interrupted | State::Running)
                    && s.run_dir.is_some()
                    && !held(lock)
            })
            .map(|(s, _)| s)
            .max_by(|a, b| a.updated_at.cmp(&b.updated_at))
    }

    /// Another live process of this host that holds a cell of this grid besides `c` (two
    /// plain runs of one grid, in two terminals, split its cells): the lock's file name
    /// and its owner in words.
    fn running_beside(&self, c: &Cell) -> Option<(String, String)> {
        let host = crate::clock::hostname().unwrap_or_else(|| "unnamed-host".into());
        let mine = self.lock_path(c);
        let me = std::process::id().to_string();
        std::fs::read_dir(self.dir.join("locks"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| *p != mine)
            .find_map(|p| {
                let text = crate::metrics::read_text(&p).ok()?;
                let mut words = text.split_whitespace();
                let here = words.next() == Some(host.as_str()) && words.next() != Some(&me);
                (here && !CellLock::stale(&p, &text, &host)).then(|| {
                    let name = p
                        .file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
                    (name, CellLock::owner(&text))
                })
            })
    }

    /// Done means: marked done, and the run directory's summary says completed.
    pub fn is_done(&self, c: &Cell) -> bool {
        self.done_run(c).is_some()
    }

    /// A cell marked done taken as not done again (its status file removed; its run is
    /// kept): a later round of `--repeat` runs it again, and a `--resume` of that round,
    /// interrupted, runs it too.
    pub fn forget_done(&self, c: &Cell) -> std::io::Result<()> {
        match self.status(c) {
            Some(s) if s.state == State::Done => std::fs::remove_file(self.status_path(c)),
            _ => Ok(()),
        }
    }

    /// The run of a cell marked done here, where its summary says it completed.
    pub fn done_run(&self, c: &Cell) -> Option<PathBuf> {
        self.status(c)
            .filter(|s| s.state == State::Done)
            .and_then(|s| s.run_dir)
            .filter(|d| completed(d))
    }
}

/// Which cells this process runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection {
    pub shard: Option<(usize, usize)>,
    pub only: Option<usize>,
    pub resume: bool,
}

impl Selection {
    /// Whether the cell of `index` is this process's (`--cell`, `--shard`).
    pub fn takes(&self, index: usize) -> bool {
        self.only.is_none_or(|i| i == index) && self.shard.is_none_or(|s| in_shard(index, s))
    }
}

#[derive(Debug, Default)]
pub struct SweepOutcome {
    pub ran: Vec<usize>,
    pub skipped: Vec<usize>,
    /// Cells another live process holds the lock of (it is running them).
    pub busy: Vec<(usize, String)>,
    pub failed: Vec<(usize, String)>,
    /// Of the skipped, those found done in another sweep directory of the grid.
    pub adopted: usize,
    /// A signal came while a cell finished (its final evaluation): that cell completed,
    /// and the next one to run (its index here) was not started.
    pub stopped_by: Option<(i32, usize)>,
}

/// How a cell's run ended when it did not complete.
#[derive(Debug, Clone, PartialEq)]
pub struct CellEnd {
    /// The run directory, if the run got as far as making one.
    pub dir: Option<PathBuf>,
    pub message: String,
    /// `Failed` or `Interrupted`.
    pub state: State,
    /// Run no further cell (an interrupt; input that every cell shares is bad).
    pub stop_sweep: bool,
}

/// Runs the selected cells in order (`run` gets each cell and its status before this
/// process took it). Each cell is locked while it runs (see `CellLock`),
/// so two processes on one grid never run the same cell; one locked by a live process is
/// left to it. A cell is marked running before it starts and done only after `run`
/// returned its completed run directory; a cell whose run fails is marked failed (or
/// interrupted) and the sweep goes on unless `stop_sweep`. With `resume`, cells already
/// done are skipped, unless `stale` says why a done cell's run is not the cell as it
/// stands now (it trained on other data than the files its recipe names now): such a cell
/// runs again, and the reason is said. Every such judgement is made again under the cell's
/// lock.
pub fn execute(
    sweep: &SweepDir,
    cells: &[Cell],
    sel: Selection,
    stale: impl Fn(&Cell, &Path) -> Option<String>,
    mut run: impl FnMut(&Cell, Option<CellStatus>) -> Result<PathBuf, CellEnd>,
) -> std::io::Result<SweepOutcome> {
    let mut out = SweepOutcome::default();
    let mut said_beside = false;
    // Which cells' stale runs were said (each once, though judged twice).
    let said_stale = std::cell::RefCell::new(std::collections::HashSet::new());
    let current = |c: &Cell, run_dir: &Path| {
        let why = match other_cells_run(c, run_dir) {
            Some(other) => format!(
                "is cell {}'s (id {}, its env.json says), not this cell's (id {})",
                other.index, other.id, c.id
            ),
            None => match stale(c, run_dir) {
                None => return true,
                Some(why) => format!("trained on other data ({why})"),
            },
        };
        if said_stale.borrow_mut().insert(c.index) {
            crate::errln!(
                "{}: its run {} {why}: the cell runs again",
                c.name,
                run_dir.display()
            );
        }
        false
    };
    for c in cells {
        if !sel.takes(c.index) {
            continue;
        }
        if sel.resume && sweep.done_run(c).is_some_and(|d| current(c, &d)) {
            out.skipped.push(c.index);
            continue;
        }
        // (A done cell whose status file was damaged ran again without a word.)
        if let Some(why) = sweep.unreadable_status(c).filter(|_| sel.resume) {
            crate::errln!(
                "warning: {}: unreadable ({why}); cell {} ({}) is taken as not done and runs again",
                sweep.status_path(c).display(),
                c.index,
                c.name
            );
        }
        if sel.resume && sweep.adopt_done_elsewhere(c, |d| current(c, d))? {
            out.skipped.push(c.index);
            out.adopted += 1;
            continue;
        }
        let _lock = match CellLock::acquire(&sweep.lock_path(c))? {
            Ok(lock) => lock,
            Err(owner) => {
                out.busy.push((c.index, owner));
                continue;
            }
        };
        // Checked again under the lock: another process may have finished it meanwhile.
        if sel.resume && sweep.done_run(c).is_some_and(|d| current(c, &d)) {
            out.skipped.push(c.index);
            continue;
        }
        // Stopped here, then finished by `runner resume` of its run directory: done, and
        // marked so (it was resumed again, to no end, and counted as run, not skipped).
        if let Some(dir) = sweep
            .status(c)
            .filter(|s| s.state != State::Done)
            .and_then(|s| s.run_dir)
            .filter(|d| sel.resume && completed(d) && current(c, d))
        {
            sweep.mark(c, State::Done, Some(&dir), None)?;
            out.skipped.push(c.index);
            continue;
        }
        // A signal that came as the previous cell finished (its final evaluation): the
        // grid stops before this one, as it does inside a cell (this cell was marked
        // running and then left so, with its lock, by the exit before its first step, and
        // no way to go on was said). Checked here, after the cells it would skip anyway.
        if let Some(sig) = crate::signals::received() {
            out.stopped_by = Some((sig, c.index));
            break;
        }
        // Cells timed side by side on one machine are each slower than alone: said once,
        // as the table that follows would not. (Not for `--cell` and `--shard`, which
        // split a grid on purpose: Slurm's tasks on a node, each on a GPU of its own.)
        let plain = sel.only.is_none() && sel.shard.is_none();
        if let Some((lock, owner)) = sweep.running_beside(c).filter(|_| plain && !said_beside) {
            said_beside = true;
            crate::errln!(
                "warning: process {owner} on this host runs a cell of this grid at the same time (locks/{lock}): the two share this machine's cores (and GPU), so the step times of cells run meanwhile are slower than alone\n  = help: to compare timings, run one process per machine (--shard I/N on several machines) or one after the other"
            );
        }
        // What the cell was before this process took it (an interrupted run to resume),
        // here or, with `--resume`, in an earlier version of the grid.
        let mut previous = match sweep.status(c) {
            None if sel.resume => sweep.stopped_elsewhere(c),
            here => here,
        };
        // A stopped run of another cell is that cell's to resume, not this one's.
        if let Some(s) = previous.as_mut() {
            if let Some((dir, other)) = s
                .run_dir
                .as_deref()
                .and_then(|d| Some((d.to_path_buf(), other_cells_run(c, d)?)))
            {
                // (Said already where that run had completed.)
                if said_stale.borrow_mut().insert(c.index) {
                    crate::errln!(
                    "{}: its status names the run {}, which is cell {}'s (id {}, its env.json says): not resumed here; the cell starts over",
                    c.name,
                    dir.display(),
                    other.index,
                    other.id
                    );
                }
                s.run_dir = None;
            }
        }
        // Its run directory kept: one being resumed, killed again, is resumed again.
        let stopped = previous
            .as_ref()
            .filter(|s| matches!(s.state, State::Interrupted | State::Running))
            .and_then(|s| s.run_dir.clone());
        sweep.mark(c, State::Running, stopped.as_deref(), None)?;
        match run(c, previous) {
            Ok(dir) => {
                sweep.mark(c, State::Done, Some(&dir), None)?;
                out.ran.push(c.index);
            }
            Err(end) => {
                sweep.mark(c, end.state, end.dir.as_deref(), Some(end.message.clone()))?;
                out.failed.push((c.index, end.message));
                if end.stop_sweep {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// The cell a run directory's env.json names where that is not `c` (by its id now or as
/// an earlier version made it): a status file pointing there (copied, edited, or found by
/// `locate` in a moved folder) was taken as this cell's run, done or to resume. A run
/// that names no cell (of a version before 2026-12-06) or whose env.json cannot be read
/// is not judged here.
fn other_cells_run(c: &Cell, run_dir: &Path) -> Option<GridCell> {
    GridCell::of_run(run_dir).filter(|g| g.id != c.id && !c.earlier_ids.contains(&g.id))
}

/// Whether a run directory's summary says the run completed.
fn completed(run_dir: &Path) -> bool {
    crate::metrics::Summary::completed_in(run_dir).is_some()
}

/// How long a lock may go without its owner's heartbeat before another process takes it
/// over (the owner was killed, or its node died). The owner touches it every 10 s.
pub const LOCK_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// `locks/<index>-<id>.lock` (and a run directory's `run.lock`): created exclusively
/// (`O_EXCL`) by the process that runs the cell, holding its host, pid and pid namespace,
/// touched every 10 s by a heartbeat thread, removed when the cell ends. A lock is stale,
/// and taken over, when its owner is a dead process on this host in this pid namespace, or
/// its heartbeat is older than `LOCK_STALE_AFTER`. (A pid of another namespace, a
/// container's, means nothing here: its owner is judged by the heartbeat alone.)
pub struct CellLock {
    /// The lock file, followed where its directory is moved (a run directory `mv`ed while
    /// its run goes on): the heartbeat and the removal reach it there, and never a lock
    /// another process made at its old path. (The lock was left behind in the moved
    /// directory, and resuming that run later waited for it to go stale.)
    at: crate::rundir::RunDir,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl CellLock {
    /// `Ok(Err(owner))` when a live process holds it.
    pub fn acquire(path: &Path) -> std::io::Result<Result<CellLock, String>> {
        use std::io::Write;
        // A host without a name still writes a word there, so the pid stays second.
        let host = crate::clock::hostname().unwrap_or_else(|| "unnamed-host".into());
        let me = format!(
            "{host} {} {}\n",
            std::process::id(),
            pid_namespace().unwrap_or_default()
        );
        for _ in 0..3 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(mut f) => {
                    // An empty lock (a full disk) reads as "a process that is starting"
                    // for a minute: it is not left behind.
                    let held = f
                        .write_all(me.as_bytes())
                        .and_then(|()| f.sync_data())
                        .and_then(|()| Self::held(path, f));
                    if held.is_err() {
                        let _ = std::fs::remove_file(path);
                    }
                    return held.map(Ok);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = crate::metrics::read_text(path).unwrap_or_default();
                    // `host pid ns` as said: `host pid 123`; empty while its owner starts.
                    let owner = Self::owner(&text);
                    if !Self::stale(path, &text, &host) {
                        return Ok(Err(if owner.is_empty() {
                            "a process that is starting".into()
                        } else {
                            format!("process {owner}")
                        }));
                    }
                    // Stale: remove and try again (another process may win the race).
                    // Two processes that both found it stale took turns: the second
                    // removed the lock the first had just made, and both ran the same
                    // run. Only the holder of `<lock>.takeover` removes a stale lock, and
                    // only if it is still the one it judged.
                    let guard = PathBuf::from(format!("{}.takeover", path.display()));
                    match Self::takeover(&guard) {
                        Ok(true) => {}
                        Ok(false) => {
                            let age = std::fs::metadata(&guard)
                                .and_then(|m| m.modified())
                                .ok()
                                .and_then(|t| t.elapsed().ok())
                                .map_or(0, |a| a.as_secs());
                            return Ok(Err(format!(
                                "another process (one taking over a stale lock: it holds {}, made {age} s ago; left by a process that was killed, it is stale after {} s, or remove it)",
                                guard.display(),
                                LOCK_STALE_AFTER.as_secs()
                            )));
                        }
                        // A folder this user may not write (another user's sticky
                        // `locks/`): the removal below fails too, and says so.
                        Err(_) => {}
                    }
                    let again = crate::metrics::read_text(path);
                    let same = again.as_ref().is_ok_and(|t| *t == text);
                    let removed = if same && Self::stale(path, &text, &host) {
                        std::fs::remove_file(path)
                    } else {
                        Ok(())
                    };
                    let _ = std::fs::remove_file(&guard);
                    // One this user may not remove (another user's, in a sticky `locks/`)
                    // would block the cell for good while each try said it was busy.
                    match removed {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            let owner = if owner.is_empty() {
                                "no process"
                            } else {
                                &owner
                            };
                            return Err(std::io::Error::new(
                                e.kind(),
                                format!(
                                    "the lock {} is stale (its owner, {owner}, is gone) and \
                                     cannot be removed: {e}; remove it (as its owner or \
                                     root), then run again",
                                    path.display()
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Err(
            "another process (the lock changed hands while this one looked)".into(),
        ))
    }

    /// Takes `guard`, the right to remove a stale lock: false while another process holds
    /// it. A guard left by a process that died while it held it (it holds it for a few
    /// system calls) is stale after `LOCK_STALE_AFTER`.
    fn takeover(guard: &Path) -> std::io::Result<bool> {
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(guard)
            {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let old = std::fs::metadata(guard)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|a| a > LOCK_STALE_AFTER);
                    if !old {
                        return Ok(false);
                    }
                    let _ = std::fs::remove_file(guard);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// A lock's owner in words, `host pid 123`, or "" (an owner that is starting).
    fn owner(text: &str) -> String {
        let mut parts = text.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some(host), Some(pid)) if pid.parse::<u32>().is_ok() => format!("{host} pid {pid}"),
            (None, _) => String::new(),
            // Not a lock the runner wrote (`host pid namespace`): what it holds, quoted
            // and cut short ("process garbage is running" named no process).
            _ => {
                let shown: String = text.trim().chars().take(40).collect();
                let cut = if shown.len() < text.trim().len() {
                    "…"
                } else {
                    ""
                };
                format!("unknown (its lock holds {shown:?}{cut}, not a host and pid)")
            }
        }
    }

    fn stale(path: &Path, owner: &str, host: &str) -> bool {
        let mut parts = owner.split_whitespace();
        let (owner_host, pid, ns) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<u32>().ok()),
            parts.next(),
        );
        // Locks of earlier versions name no namespace: as before, this one's.
        let here = pid_namespace();
        let same_namespace = ns.is_none() || ns == here.as_deref();
        if let (Some(h), Some(pid)) = (owner_host, pid) {
            if h == host && same_namespace && !Path::new(&format!("/proc/{pid}")).exists() {
                return true;
            }
        }
        // The entry's own age: a link to nowhere in its place had none, and was never
        // stale (its cell left to "a process that is starting" for good).
        let age = std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        age.is_some_and(|a| a > LOCK_STALE_AFTER)
    }

    fn held(path: &Path, file: std::fs::File) -> std::io::Result<Self> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (touch, flag) = (file.try_clone()?, std::sync::Arc::clone(&stop));
        let heartbeat = std::thread::Builder::new()
            .name("runner-cell-lock".into())
            .spawn(move || {
                let mut ticks = 0;
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    ticks += 1;
                    if ticks % 100 == 0 {
                        let _ = touch.set_modified(std::time::SystemTime::now());
                    }
                }
            })
            .ok();
        Ok(Self {
            at: crate::rundir::RunDir::held(path, file)?,
            stop,
            heartbeat,
        })
    }
}

/// This process's pid namespace (`4026531836` of `/proc/self/ns/pid`'s `pid:[4026531836]`):
/// pids of two namespaces (a container's and the host's) are different processes.
fn pid_namespace() -> Option<String> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let text = link.to_string_lossy();
    let id = text.strip_prefix("pid:[")?.strip_suffix(']')?;
    Some(id.to_string())
}

impl Drop for CellLock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        // Where it is now, if it is still this process's (not removed as stale and
        // made again by another process).
        if let Ok(path) = self.at.now() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock that holds no `host pid` (written by hand, or damaged) is said as such
    /// while fresh ("process garbage is running" named no process).
    #[test]
    fn a_lock_of_no_host_and_pid_is_said_as_one() {
        let dir = crate::scratch::Scratch::new("garbage-lock");
        let lock = dir.join("run.lock");
        std::fs::write(&lock, "garbage\n").unwrap();
        let owner = CellLock::acquire(&lock).unwrap().err().unwrap();
        assert_eq!(
            owner,
            "process unknown (its lock holds \"garbage\", not a host and pid)"
        );
        assert_eq!(CellLock::owner("h 12 ns"), "h pid 12");
        assert_eq!(CellLock::owner(""), "");
    }

    /// A stale lock is taken over by the one process that holds `<lock>.takeover`: a
    /// second that found it stale too waits its turn instead of removing the new lock.
    #[test]
    fn a_stale_lock_is_taken_over_by_one_process() {
        let dir = crate::scratch::Scratch::new("takeover");
        let lock = dir.join("run.lock");
        let host = crate::clock::hostname().unwrap_or_else(|| "unnamed-host".into());
        // A pid above any pid_max: no such process.
        let dead = format!("{host} 4294967 {}\n", pid_namespace().unwrap_or_default());
        std::fs::write(&lock, &dead).unwrap();
        let guard = dir.join("run.lock.takeover");
        std::fs::write(&guard, "").unwrap();
        let busy = CellLock::acquire(&lock).unwrap();
        assert!(
            busy.as_ref()
                .is_err_and(|w| w.contains("taking over a stale lock")),
            "{:?}",
            busy.err()
        );
        assert_eq!(
            std::fs::read_to_string(&lock).unwrap(),
            dead,
            "left as it was"
        );
        // A guard its holder left behind, older than a stale lock, is no obstacle.
        let old = std::time::SystemTime::now() - LOCK_STALE_AFTER * 2;
        std::fs::File::options()
            .write(true)
            .open(&guard)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let held = CellLock::acquire(&lock).unwrap();
        assert!(held.is_ok(), "{:?}", held.err());
        assert!(!guard.exists());
        let mine = std::fs::read_to_string(&lock).unwrap();
        assert!(
            mine.contains(&format!(" {} ", std::process::id())),
            "{mine}"
        );
        drop(held);
    }

    /// A link to nowhere in a lock's place ages like a lock: it had no age, so it was
    /// never stale, and its cell was left to "a process that is starting" for good.
    #[test]
    fn a_lock_that_links_to_nowhere_goes_stale() {
        let dir = crate::scratch::Scratch::new("dangling-lock");
        let lock = dir.join("run.lock");
        std::os::unix::fs::symlink(dir.join("nowhere"), &lock).unwrap();
        let host = crate::clock::hostname().unwrap_or_else(|| "unnamed-host".into());
        assert!(!CellLock::stale(&lock, "", &host), "new: not stale yet");
        let old = std::time::SystemTime::now() - LOCK_STALE_AFTER * 2;
        let when = libc::timespec {
            tv_sec: old.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as libc::time_t,
            tv_nsec: 0,
        };
        let path = std::ffi::CString::new(lock.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and two timespecs that outlive the call.
        let set = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                path.as_ptr(),
                [when, when].as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(set, 0);
        assert!(CellLock::stale(&lock, "", &host));
    }
}
