//! One run of a plan: reads the data, creates the run directory (resolved recipe,
//! environment record, metrics, summary), picks the backend and runs the training loop,
//! and records how it ended, a crash included. Owns the run directory's layout.

mod env;
mod eval;
mod resume;
mod sink;
mod warmup;

use sink::{finish_sampler, open_exports, record, record_kernels, start_sampler, FileSink};

pub use crate::clock::panic_message;
/// The run layer's name for the crate's one error type.
pub use crate::error::Error as RunError;
pub use env::{data_files, git_info, other_data, Environment, GitInfo, SourceInfo};
use env::{environment, sha256_file};
pub use eval::{eval, EvalReport};
pub use resume::{resumable, resume, still_interrupted};
pub use warmup::{warmup, Warmup};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend;
use crate::clock::utc_now;
use crate::data::{self, Dataset};
use crate::kernels::{self, KernelCounts, KernelSettings};
use crate::metrics::{
    write_json_atomic, write_json_keeping_room, EvalRecord, JsonLines, Process, RunStatus,
    StepRecord, Summary, KEPT_ROOM,
};
use crate::plan::{Device, Plan};
use crate::progress::Progress;
use crate::sampler::{Sampler, UtilSource};
use crate::train::{self, Sink};

/// The Burn version this binary is built against (pinned in Cargo.toml; a test checks).
pub const BURN_VERSION: &str = "0.21.0";

#[derive(Clone, Default)]
pub struct RunOptions {
    /// No progress bar or per-epoch lines.
    pub quiet: bool,
    /// Told the run directory as soon as it exists (a grid records it in the cell's
    /// status, so that a cell killed outright is resumed, not started over).
    pub started: Option<RunDirHook>,
    /// Told the run directory when a signal ends the process before the run's first step
    /// (a grid marks the cell interrupted).
    pub interrupted: Option<RunDirHook>,
    /// Called when a signal ends the process while the run's data loads, before it has a
    /// directory (a grid marks the cell interrupted and lets go of its lock: it was left
    /// running, locked, and no way to go on was said).
    pub unstarted: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
    /// The command that continues this run's work after an interruption, when it is not
    /// `runner resume RUN_DIR` (a grid's cell: the grid with `--resume`).
    pub again: Option<String>,
    /// What of the call is not started if the process exits before this run's first step,
    /// with the command that runs it ("2 recipe(s) after it not started; run them with:
    /// ..."): said after the run's own line.
    pub rest: Option<String>,
    /// The grid cell this run is (env.json's `cell`).
    pub cell: Option<crate::sweep::GridCell>,
}

/// See [`RunOptions::started`].
pub type RunDirHook = std::sync::Arc<dyn Fn(&Path) + Send + Sync>;

pub struct Finished {
    pub dir: PathBuf,
    pub summary: Summary,
}

/// Creates `<dir>/<name>/<run-id>`; the id is the UTC start time, with a suffix if taken.
/// `<root>/<name>/<time>` made, and its time; else the path that could not be made, and
/// why (a file where a folder goes said "File exists").
fn create_run_dir(root: &Path, name: &str) -> Result<(PathBuf, String), (PathBuf, String)> {
    let parent = root.join(name);
    // Linux takes paths of up to 4,095 bytes: the run's id (`/20261207T101500-999`) and
    // its longest file (`/events.out.tfevents.<time>.<host>.<pid>`, a checkpoint's files)
    // must fit after it. A log.dir that left less made the directory, then failed at a
    // file in it (exit 1, a run marked failed) instead of being refused (exit 2).
    const ROOM: usize = 21 + 128;
    let length = parent.as_os_str().len();
    if length + ROOM > 4095 {
        return Err((
            parent,
            format!(
                "its path is {length} bytes, and the run's files need up to {ROOM} more, past the 4,095 bytes a path may have"
            ),
        ));
    }
    if let Err(e) = std::fs::create_dir_all(&parent) {
        // The first path on the way that is not a folder, if that is why.
        let mut at = parent.as_path();
        let mut not_folder = None;
        loop {
            if at.symlink_metadata().is_ok() && !at.is_dir() {
                not_folder = Some(at.to_path_buf());
            }
            match at.parent() {
                Some(up) if !up.as_os_str().is_empty() => at = up,
                _ => break,
            }
        }
        return Err(match not_folder {
            Some(p) => {
                let what = match crate::recipe::odd_kind(&p) {
                    Some(kind) => format!("it is {kind}, not a folder"),
                    None if p.exists() => "it is a file, not a folder".into(),
                    None => crate::recipe::why_missing(&p),
                };
                (p, what)
            }
            None => (parent, e.to_string()),
        });
    }
    let stamp: String = utc_now()
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    for k in 0..1000 {
        let id = if k == 0 {
            stamp.clone()
        } else {
            format!("{stamp}-{k}")
        };
        match std::fs::create_dir(parent.join(&id)) {
            Ok(()) => return Ok((parent.join(&id), id)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err((parent.join(&id), e.to_string())),
        }
    }
    Err((
        parent,
        "no free run id: 1,000 runs started this second".into(),
    ))
}

/// The kernel settings a plan runs with: CubeCL configured for CUDA, recorded for the CPU.
fn kernel_settings(plan: &Plan) -> Result<KernelSettings, RunError> {
    match plan.device {
        Device::Cpu => Ok(kernels::cpu_settings(&plan.kernels)),
        Device::Cuda(_) | Device::Wgpu(_) => {
            kernels::configure_cubecl(&plan.kernels).map_err(|e| {
                RunError::Input(format!(
                    "error: {e}\n  = help: set backend.cache_dir or ${} to a writable directory",
                    kernels::CACHE_ENV
                ))
            })
        }
    }
}

/// The training loop as a backend-generic job.
struct Train<'a> {
    inputs: train::Inputs<'a>,
    sink: &'a mut dyn Sink,
}

impl backend::Job for Train<'_> {
    type Output = train::TrainOutcome;
    fn run<B: crate::ops::TrainBackend>(
        self,
        device: B::Device,
        mem: backend::MemFn<B::Device>,
    ) -> train::TrainOutcome {
        train::train::<B>(self.inputs, device, mem, self.sink)
    }
}

/// What a process needs before it writes anything: the kernel settings, the display, the
/// data (whose errors come back before anything is written).
struct Prepared {
    wall: Instant,
    /// What start-up is counted from: the process's start for its first run, a later
    /// run's (a grid's next cell) own start.
    origin: Instant,
    settings: KernelSettings,
    counts_at_start: KernelCounts,
    progress: Progress,
    sets: data::Sets,
    threads: usize,
    backend_name: String,
    device_name: String,
}

/// Whether a run has started in this process (a grid runs its cells one after another).
static RAN_BEFORE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn prepare(plan: &Plan, opts: &RunOptions) -> Result<Prepared, RunError> {
    let wall = Instant::now();
    let origin = match RAN_BEFORE.swap(true, std::sync::atomic::Ordering::SeqCst) {
        false => crate::clock::process_start(),
        true => wall,
    };
    let settings = kernel_settings(plan)?;
    for note in &settings.notes {
        crate::errln!("warning: {note}");
    }
    let counts_at_start = kernels::counts();
    let progress = Progress::new(
        plan,
        opts.quiet,
        settings.used.then(|| settings.cache.dir.clone()),
    );
    let sets = data::load(&plan.data, plan.model.num_classes, plan.seed)
        .map_err(|e| RunError::Input(format!("error: {e}\n  = help: {}", e.help_text())))?;
    let threads = backend::set_cpu_threads(plan.threads);
    let (backend_name, device_name) = backend::describe(plan.device, &plan.kernels);
    Ok(Prepared {
        wall,
        origin,
        settings,
        counts_at_start,
        progress,
        sets,
        threads,
        backend_name,
        device_name,
    })
}

/// The resolved recipe of a run directory (what `resume` and `eval` start from).
fn run_recipe(run_dir: &Path) -> Result<PathBuf, RunError> {
    let recipe_path = run_dir.join("recipe.toml");
    if recipe_path.is_file() {
        return Ok(recipe_path);
    }
    let help = "name a directory under log.dir, e.g. runs/<name>/<run-id>";
    // What is there instead, in words (all of it was "has no recipe.toml").
    let why = if !run_dir.is_dir() {
        match crate::recipe::odd_kind(run_dir) {
            None if run_dir.exists() => "is a file, not a run directory".to_string(),
            None => crate::recipe::why_missing(run_dir),
            Some(kind) => format!("is {kind}, not a run directory"),
        }
    } else if recipe_path.exists() || std::fs::symlink_metadata(&recipe_path).is_ok() {
        let what = crate::recipe::odd_kind(&recipe_path).map_or_else(
            || crate::recipe::why_missing(&recipe_path),
            |k| format!("is {k}"),
        );
        return Err(RunError::Input(format!(
            "error: {} {what}, not the file a run writes\n  = help: put the run's recipe.toml back (a copy of the run has it)",
            recipe_path.display()
        )));
    } else {
        format!("is not a run directory (it has no recipe.toml)\n  = help: {help}")
    };
    let why = match why.contains("= help:") {
        true => why,
        false => format!("{why}\n  = help: {help}"),
    };
    Err(RunError::Input(format!(
        "error: {} {why}",
        run_dir.display()
    )))
}

/// A run directory's recipe validated again, on this machine, with `sets` on top; its
/// findings as they are, for the caller to say in its own terms.
fn run_plan(
    recipe_path: &Path,
    sets: &[String],
    machine: &crate::plan::Machine,
) -> Result<Plan, crate::recipe::Diagnostics> {
    let checked = crate::sweep::check(recipe_path, sets, machine, 1).map_err(|mut d| {
        // Resume and eval take no --set, which a help may offer: the file is to be edited.
        for e in d.0.iter_mut() {
            if e.help.as_deref().is_some_and(|h| h.contains("--set")) && e.note.is_none() {
                e.note = Some(format!(
                    "`runner resume` and `runner eval` take no --set: edit {} instead",
                    recipe_path.display()
                ));
            }
        }
        d
    })?;
    Ok(checked
        .plans
        .into_iter()
        .next()
        .expect("a recipe has a plan"))
}

pub use crate::metrics::RUN_LOCK;

/// A run directory as the loop continues it: what earlier processes recorded.
struct Files {
    dir: PathBuf,
    env: Environment,
    summary: Summary,
    metrics: JsonLines,
    kept: Kept,
    evals: Vec<EvalRecord>,
    resume: Option<(PathBuf, crate::checkpoint::State)>,
}

/// What a run goes on from of its metrics lines (a resumed run's, up to its checkpoint;
/// a new run's, none), taken a line at a time: the lines of a long run are hundreds of
/// MB, which a resume read whole and kept as records (~500 bytes a line) to the end.
pub(super) struct Kept {
    warmup_steps: u64,
    pub lines: u64,
    /// The last line's time: the run's clock goes on from it.
    pub t_ms: f64,
    /// The run's counts so far (see `sink::record`).
    pub tally: crate::metrics::Tally,
    /// The steps of the last line's epoch, for that epoch's line.
    pub epoch: crate::metrics::EpochTally,
    /// The lines that wrote a checkpoint: their step and its time.
    pub checkpoints: Vec<(u64, f64)>,
}

impl Kept {
    pub fn new(warmup_steps: u64) -> Self {
        Kept {
            warmup_steps,
            lines: 0,
            t_ms: 0.0,
            tally: crate::metrics::Tally::counting(warmup_steps),
            epoch: Default::default(),
            checkpoints: vec![],
        }
    }

    pub fn push(&mut self, r: &StepRecord) {
        self.lines += 1;
        self.t_ms = r.t_ms;
        self.tally.push(r);
        self.epoch.take(r, self.warmup_steps);
        if r.checkpoint_ms > 0.0 {
            self.checkpoints.push((r.step, r.checkpoint_ms));
        }
    }
}

/// Runs a validated plan. Data errors come back before anything is written.
pub fn execute(plan: &Plan, opts: &RunOptions) -> Result<Finished, RunError> {
    on_its_threads(plan, || execute_here(plan, opts))
}

/// `body` on the plan's CPU threads (`backend::with_cpu_threads`); on a GPU, as it is.
fn on_its_threads<R: Send>(plan: &Plan, body: impl FnOnce() -> R + Send) -> R {
    match plan.device {
        crate::plan::Device::Cpu => backend::with_cpu_threads(plan.threads, body),
        _ => body(),
    }
}

fn execute_here(plan: &Plan, opts: &RunOptions) -> Result<Finished, RunError> {
    // Nothing is written while the data loads: a signal then ends the process at once.
    let (unstarted, again, rest) = (
        opts.unstarted.clone(),
        opts.again.clone(),
        opts.rest.clone(),
    );
    let loading = crate::signals::exit_before_first_step(move |_| {
        if let Some(hook) = &unstarted {
            hook();
        }
        let said = match &again {
            Some(cmd) => format!(
                "exiting now, before the run started: nothing was written; continue the grid with: {cmd}"
            ),
            None => "exiting now, before the run started: nothing was written".into(),
        };
        with_rest(said, rest.as_deref())
    });
    let prepared = prepare(plan, opts)?;
    drop(loading);
    let (dir, run_id) = create_run_dir(&plan.log.dir, &plan.name).map_err(|(at, e)| {
        let help = match e.contains("a path may have") {
            true => "runs go in <log.dir>/<name>/<time>; point log.dir (or --set log.dir=...) at a shorter path",
            false => "runs go in <log.dir>/<name>/<time>; point log.dir (or --set log.dir=...) at a folder this user can write",
        };
        RunError::Input(format!(
            "error: cannot create the run directory {}: {e}\n  = help: {help}",
            at.display()
        ))
    })?;
    if let Some(started) = &opts.started {
        started(&dir);
    }
    let mut summary = Summary {
        name: plan.name.clone(),
        run_id: run_id.clone(),
        status: RunStatus::Running,
        pid: Some(std::process::id()),
        pid_started: crate::clock::process_started(std::process::id()),
        host: crate::clock::hostname(),
        backend: prepared.backend_name.clone(),
        device: prepared.device_name.clone(),
        ..Default::default()
    };
    // No step yet: the speed figures are null, as for a run with no timed step (0.0 read
    // as a real time to any tool but ours, for a run going on or killed outright).
    summary.absorb(&[], plan.run.warmup_steps);
    // A file of the run that cannot be written: its path in the error, no half of it left
    // (a `ulimit -f` cut recipe.toml at 1 KiB, a broken recipe that looked runnable), and
    // a summary that says the run failed, where one can be written (the directory held
    // no summary, or one left `running`, read by `report` as a process killed outright).
    let wall = prepared.wall;
    let gave_up = |summary: &Summary, file: Option<&Path>, message: String| {
        if let Some(f) = file {
            let _ = std::fs::remove_file(f);
        }
        // With no summary (a disk too full for one), what this run wrote of its new
        // directory goes too: a directory of a recipe.toml and an env.json, and no summary,
        // is no run to `report`, `eval` or `resume`, and the caller removes it empty.
        if !ended_before_start(&dir, summary, wall, &message) {
            for f in ["recipe.toml", "warnings.txt", "env.json", "tokenizer.json"] {
                let _ = std::fs::remove_file(dir.join(f));
            }
        }
        RunError::Failed {
            dir: dir.clone(),
            message,
        }
    };
    let cannot = |file: &Path, e: std::io::Error| format!("cannot write {}: {e}", file.display());
    // Held while this process writes the run: a `runner resume` of it from another node
    // or container (whose pid check cannot see this process) is refused.
    let lock_path = dir.join(RUN_LOCK);
    let _lock = match crate::sweep::CellLock::acquire(&lock_path) {
        Ok(Ok(lock)) => lock,
        Ok(Err(owner)) => {
            return Err(RunError::Failed {
                dir: dir.clone(),
                message: format!("{}: {owner} holds it already", lock_path.display()),
            })
        }
        Err(e) => {
            return Err(gave_up(
                &summary,
                None,
                format!("cannot take {}: {e}", lock_path.display()),
            ))
        }
    };
    let header = format!(
        "# Resolved recipe of run {}/{run_id}: every default filled in, paths absolute.\n# Re-run with: runner {}\n# Continue it after an interruption with: runner resume {}\n",
        plan.name,
        crate::slurm::shell_word(&dir.join("recipe.toml").display().to_string()),
        crate::slurm::shell_word(&dir.display().to_string())
    );
    let toml = toml::to_string(&plan.resolved).map_err(|e| {
        gave_up(
            &summary,
            None,
            format!("cannot write the resolved recipe: {e}"),
        )
    })?;
    let path = dir.join("recipe.toml");
    std::fs::write(&path, header + &toml)
        .map_err(|e| gave_up(&summary, Some(&path), cannot(&path, e)))?;
    if !plan.warnings.is_empty() {
        let text: Vec<String> = plan.warnings.iter().map(|w| w.to_string()).collect();
        let path = dir.join("warnings.txt");
        std::fs::write(&path, text.join("\n") + "\n")
            .map_err(|e| gave_up(&summary, Some(&path), cannot(&path, e)))?;
    }
    let mut env = environment(plan, &prepared);
    env.cell = opts.cell.clone();
    // Both are rewritten at the end: room is kept for that on a disk that fills up.
    let path = dir.join("env.json");
    write_json_keeping_room(&path, &env, KEPT_ROOM)
        .map_err(|e| gave_up(&summary, None, cannot(&path, e)))?;
    // Before the summary, which records its sum (`runner eval` checks the file by it).
    if let Some(t) = &prepared.sets.tokenizer {
        let path = dir.join("tokenizer.json");
        t.save(&path)
            .map_err(|e| gave_up(&summary, Some(&path), cannot(&path, e)))?;
        summary.tokenizer_sha256 = crate::checkpoint::sha256_of(&path).ok();
    }
    let path = dir.join("summary.json");
    write_json_keeping_room(&path, &summary, KEPT_ROOM)
        .map_err(|e| gave_up(&summary, None, cannot(&path, e)))?;
    let path = dir.join("metrics.jsonl");
    let metrics =
        JsonLines::create(&path).map_err(|e| gave_up(&summary, Some(&path), cannot(&path, e)))?;
    let files = Files {
        dir,
        env,
        summary,
        metrics,
        kept: Kept::new(plan.run.warmup_steps),
        evals: vec![],
        resume: None,
    };
    drive(plan, opts, prepared, files)
}

/// A run that ends before its first step, for `why`: its summary says so, where it can
/// be written (else it is the caller's error alone that says it).
fn ended_before_start(dir: &Path, summary: &Summary, wall: Instant, why: &str) -> bool {
    let mut s = summary.clone();
    s.status = RunStatus::Failed;
    s.error = Some(why.to_string());
    s.wall_s += wall.elapsed().as_secs_f64();
    write_json_atomic(&dir.join("summary.json"), &s).is_ok()
}

/// The loop, on the backend the plan chose, and how it ended, written to the run directory.
fn drive(
    plan: &Plan,
    opts: &RunOptions,
    prepared: Prepared,
    files: Files,
) -> Result<Finished, RunError> {
    let Prepared {
        wall,
        origin,
        counts_at_start,
        progress,
        sets,
        ..
    } = prepared;
    let Files {
        dir,
        env,
        mut summary,
        metrics,
        kept,
        evals,
        resume,
    } = files;
    let fail = |message: String| RunError::Failed {
        dir: dir.clone(),
        message,
    };
    let t0 = Instant::now();
    let sampler = start_sampler(plan, t0, kept.t_ms, &dir);
    let mut sink = FileSink::new(
        (metrics, kept, evals),
        progress,
        (counts_at_start, origin),
        &summary,
        opts.quiet,
        sampler,
    );
    let resumed_at = resume.as_ref().map(|(_, s)| s.step);
    // The run ends before its first step: its summary says so, not "running" (read by
    // `report` as a process killed outright).
    // Its files are closed first: out of file descriptors (`ulimit -n`), the summary
    // could not be opened beside them.
    // A resume that ends so leaves the run as its checkpoint had it, to resume again once
    // that is put right (it was marked failed, and a grid then started the cell over).
    let before_start = |mut sink: FileSink, summary: &mut Summary, message: String| {
        sink.progress.finish();
        summary.util_source = finish_sampler(&mut sink);
        drop(sink);
        match resumed_at {
            Some(step) => {
                let mut s = summary.clone();
                s.status = RunStatus::Interrupted;
                s.resumes = s.resumes.saturating_sub(1);
                s.error = Some(format!(
                    "a resume failed before its first step ({message}); the run is as its checkpoint at step {step} left it, to resume again"
                ));
                let _ = write_json_atomic(&dir.join("summary.json"), &s);
            }
            None => {
                ended_before_start(&dir, summary, wall, &message);
            }
        }
        fail(message)
    };
    if let Err(e) = open_exports(plan, &dir, resumed_at, &mut sink) {
        return Err(before_start(
            sink,
            &mut summary,
            format!("cannot write {e}"),
        ));
    }
    let vocab = sets.tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    let batcher = train::Batcher::new(plan, vocab);
    let cannot_open = |e: std::io::Error| format!("cannot open {}: {e}", dir.display());
    let held = match crate::rundir::RunDir::open(&dir) {
        Ok(held) => held,
        Err(e) => return Err(before_start(sink, &mut summary, cannot_open(e))),
    };
    let persist = train::Persist::new(held, sha256_file(&dir.join("recipe.toml")), resume);
    let armed =
        match stop_before_first_step((&summary, &dir), wall, counts_at_start, resumed_at, opts) {
            Ok(armed) => armed,
            Err(e) => {
                drop(persist);
                return Err(before_start(sink, &mut summary, cannot_open(e)));
            }
        };
    let at_second = match stop_at_second_signal(
        (&summary, &dir),
        (wall, counts_at_start, sink.parameters.clone()),
        plan,
        opts,
    ) {
        Ok(at_second) => at_second,
        Err(e) => {
            drop((persist, armed));
            return Err(before_start(sink, &mut summary, cannot_open(e)));
        }
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let job = Train {
            inputs: train::Inputs {
                plan,
                batcher,
                train: Arc::new(sets.train),
                test: Arc::new(sets.test),
                validation: sets.validation.map(Arc::new),
                t0,
                persist: Some(&persist),
            },
            sink: &mut sink,
        };
        backend::dispatch(plan.device, &plan.kernels, job)
    }));
    drop(armed);
    sink.progress.finish();
    // The rest goes where the run directory is now; removed, it has nowhere to go, and
    // nothing is written (a new directory at its path would hold a skeleton of the run).
    let dir = match persist.dir(&mut sink) {
        Ok(now) => now,
        Err(gone) => {
            let _ = sink.sampler.take().map(|s| s.finish());
            return Err(fail(gone.to_string()));
        }
    };
    let fail = |message: String| RunError::Failed {
        dir: dir.clone(),
        message,
    };
    summary.util_source = finish_sampler(&mut sink);
    summary.wall_s += wall.elapsed().as_secs_f64();
    record(
        &mut summary,
        &sink,
        &dir.join("metrics.jsonl"),
        plan.run.warmup_steps,
    );
    record_kernels(env, &mut summary, &mut sink, &dir, resumed_at.is_some());
    let stop = ending(outcome, &mut summary, &sink);
    let summary_path = dir.join("summary.json");
    if let Err(e) = at_second.disarm_while(|| write_json_atomic(&summary_path, &summary)) {
        // What it would have said is not lost with it: the figures go into the error.
        let message = format!(
            "{}: {e}; the run {}: {}",
            summary_path.display(),
            summary.status,
            summary.headline(),
        );
        return Err(fail(match &summary.error {
            Some(first) => format!("{first}; then cannot write {message}"),
            None => format!("cannot write {message}"),
        }));
    }
    match stop {
        None => Ok(Finished { dir, summary }),
        Some(train::Stop::Signal(signal)) => Err(RunError::Interrupted { dir, signal }),
        Some(_) => Err(fail(summary.error.clone().unwrap_or_default())),
    }
}

/// Arms what a signal does until the run's first step is done (see `signals`): there is
/// no step boundary near (on CUDA the first step compiles and tunes the run's kernels,
/// minutes on a cold cache) and nothing to keep, so the process ends at once, the summary
/// marked `interrupted`. A resumed run is left as its checkpoint had it, to resume again.
fn stop_before_first_step(
    (summary, dir): (&Summary, &Path),
    wall: Instant,
    counts_at_start: KernelCounts,
    resumed_at: Option<u64>,
    opts: &RunOptions,
) -> std::io::Result<crate::signals::Armed> {
    // Its own handle: the summary goes where the directory is by then.
    let held = crate::rundir::RunDir::open(dir)?;
    let mut summary = summary.clone();
    let (hook, again, rest) = (
        opts.interrupted.clone(),
        opts.again.clone(),
        opts.rest.clone(),
    );
    Ok(crate::signals::exit_before_first_step(move |sig| {
        let signal = crate::signals::name(sig);
        summary.status = RunStatus::Interrupted;
        summary.wall_s += wall.elapsed().as_secs_f64();
        let counts = kernels::counts().since(counts_at_start);
        if counts != KernelCounts::default() {
            summary.kernels = Some(counts);
        }
        let (error, next) = match resumed_at {
            None => (
                format!("interrupted by {signal} before its first step was done"),
                match &again {
                    Some(cmd) => format!("nothing to keep: it starts over with: {cmd}"),
                    None => "nothing to keep: run the recipe again to start over".to_string(),
                },
            ),
            Some(step) => (
                format!("interrupted by {signal} after step {step}, again before the first step of its resume was done"),
                format!(
                    "its checkpoint of step {step} is kept: resume it again with: {} resume",
                    crate::program()
                ),
            ),
        };
        summary.error = Some(error);
        let compiled = if counts.compiled > 0 {
            format!(
                " ({} kernel(s) compiled so far are cached for the next run)",
                counts.compiled
            )
        } else {
            String::new()
        };
        let written = held.now().and_then(|d| {
            let path = d.join("summary.json");
            match write_json_atomic(&path, &summary) {
                Ok(()) => Ok(d),
                Err(e) => Err(format!("cannot write {}: {e}", path.display())),
            }
        });
        if let (Some(hook), Ok(d)) = (&hook, &written) {
            hook(d);
        }
        // The process exits without unwinding: the lock is let go of here.
        if let Ok(d) = &written {
            let _ = std::fs::remove_file(d.join(RUN_LOCK));
        }
        let said = match written {
            Ok(d) => {
                let next = if resumed_at.is_some() {
                    format!(
                        "{next} {}",
                        crate::slurm::shell_word(&d.display().to_string())
                    )
                } else {
                    next
                };
                format!(
                    "exiting now, before the first step was done{compiled}; {} is marked interrupted, {next}",
                    d.display()
                )
            }
            Err(e) => format!("exiting now, before the first step was done{compiled}; {e}"),
        };
        with_rest(said, rest.as_deref())
    }))
}

/// `said`, then on a line of its own what of the call is not started (`RunOptions::rest`).
fn with_rest(said: String, rest: Option<&str>) -> String {
    match rest {
        Some(rest) => format!("{said}\nnote: {rest}"),
        None => said,
    }
}

/// Arms what a second signal does (see `signals`): the process ends at once, where the
/// loop is, and the summary says `interrupted` with the steps `metrics.jsonl` holds and
/// the checkpoint a resume continues from. Before, it was left `running`, as after
/// `kill -9`, and the report could only guess.
fn stop_at_second_signal(
    (summary, dir): (&Summary, &Path),
    (wall, counts_at_start, parameters): (
        Instant,
        KernelCounts,
        Arc<std::sync::atomic::AtomicUsize>,
    ),
    plan: &Plan,
    opts: &RunOptions,
) -> std::io::Result<crate::signals::AtSecond> {
    let held = crate::rundir::RunDir::open(dir)?;
    let mut summary = summary.clone();
    let warmup = plan.run.warmup_steps;
    let hook = opts.interrupted.clone();
    Ok(crate::signals::exit_at_second_signal(move |sig| {
        let Ok(d) = held.now() else {
            return "exiting now; the run directory is gone".into();
        };
        // The lines written so far, and no more after them: the summary counts these (one
        // being written is finished first).
        crate::metrics::stop_line_writes();
        // This summary is the run's start's: what the run did besides its steps, up to its
        // latest checkpoint, is in that checkpoint (the checkpoints written, the
        // evaluations), and a resume goes on from there.
        let latest = crate::checkpoint::list(&d).pop();
        // The lines a line at a time (a long run's are hundreds of MB), and the latest
        // checkpoint's own time on the line of its step.
        let mut tally = crate::metrics::Tally::new(warmup);
        let mut own_ms = 0.0;
        let _ = JsonLines::each::<StepRecord>(&d.join("metrics.jsonl"), |r, _, _| {
            tally.push(&r);
            if latest.as_ref().is_some_and(|(_, s)| s.step == r.step) {
                own_ms = r.checkpoint_ms;
            }
            true
        });
        tally.fill(&mut summary);
        match parameters.load(std::sync::atomic::Ordering::SeqCst) {
            0 => {}
            n => summary.parameters = n,
        }
        if let Some((_, state)) = &latest {
            if let Some((n, ms)) = resume::checkpoints_up_to(state, own_ms) {
                summary.checkpoints = n;
                summary.checkpoint_ms_total = ms;
            }
            if let Some(r) = &state.recorded {
                summary.evals.clone_from(&r.evals);
                summary.validations.clone_from(&r.validations);
                summary.startup_s = summary.startup_s.or(r.startup_s);
                summary.first_step_ms = summary.first_step_ms.or(r.first_step_ms);
                summary.loader_workers_started = summary
                    .loader_workers_started
                    .max(r.loader_workers_started.unwrap_or(0));
            }
            // (It said 0 however many epochs had ended.)
            summary.epochs_completed = summary.epochs_completed.max(state.epochs_completed);
            summary.best_step = state.best.map(|b| b.0);
            summary.best_value = state.best.map(|b| b.1);
            summary.diverged_at_step = state.diverged_at_step;
        }
        summary.status = RunStatus::Interrupted;
        summary.wall_s += wall.elapsed().as_secs_f64();
        // The trained weights saved before the final evaluation this signal cuts short: their
        // sum, for `runner eval` to check the file by (it said none).
        if crate::signals::final_weights() {
            summary.weights_sha256 =
                crate::checkpoint::sha256_of(&d.join(crate::train::WEIGHTS)).ok();
        }
        // The best and its weights' sum: the latest checkpoint's, as it recorded them (a
        // best saved after it is saved again by the resume); with no checkpoint, this
        // process's as saved (it said none); else (checkpoints of earlier versions, which
        // recorded no sum) the file as on disk.
        // The evaluations this process made after that checkpoint (or with none, all of
        // them) are kept too: they were done, and a resume makes them again in any case
        // (they were lost, with a best saved after the checkpoint: `eval --best` then
        // scored a file the summary did not name).
        let after = latest.as_ref().map_or(0, |(_, s)| s.step);
        let this = sink::evaluated();
        for (kept, new) in [
            (&mut summary.evals, this.evals),
            (&mut summary.validations, this.validations),
        ] {
            kept.retain(|e| e.step <= after);
            kept.extend(new.into_iter().filter(|e| e.step > after));
        }
        summary.test_accuracy = summary.evals.last().map(|e| e.accuracy);
        let recorded = latest
            .as_ref()
            .and_then(|(_, s)| s.recorded.as_ref())
            .map(|r| r.best_weights_sha256.clone());
        // A best saved after the checkpoint is the file on disk: the summary names it.
        let this_process =
            crate::signals::best_saved().filter(|(step, ..)| latest.is_none() || *step > after);
        let recorded = match this_process {
            Some(_) => None,
            None => recorded,
        };
        match (recorded, this_process) {
            (Some(sum), _) => summary.best_weights_sha256 = sum,
            (None, Some((step, value, sum))) => {
                summary.best_step = Some(step);
                summary.best_value = Some(value);
                summary.best_weights_sha256 = sum;
            }
            (None, None) => {
                if let Ok(sum) = crate::checkpoint::sha256_of(&d.join(crate::train::BEST_WEIGHTS)) {
                    summary.best_weights_sha256 = Some(sum);
                }
            }
        }
        let counts = kernels::counts().since(counts_at_start);
        if counts != KernelCounts::default() {
            summary.kernels = Some(counts);
        }
        let name = crate::signals::name(crate::signals::received().unwrap_or(sig));
        summary.error = Some(format!(
            "interrupted by {name} after step {}, then at once by a second signal",
            summary.steps
        ));
        let path = d.join("summary.json");
        if let Err(e) = write_json_atomic(&path, &summary) {
            return format!("exiting now; cannot write {}: {e}", path.display());
        }
        if let Some(hook) = &hook {
            hook(&d);
        }
        // The process exits without unwinding: the lock is let go of here, and a weights
        // file cut short by this exit (`*.safetensors.tmp`, which nothing would read or
        // remove) with it.
        let _ = std::fs::remove_file(d.join(RUN_LOCK));
        for weights in [crate::train::WEIGHTS, "model-best.safetensors"] {
            let _ = std::fs::remove_file(d.join(weights).with_extension("safetensors.tmp"));
        }
        // What is on disk now: the training thread went on meanwhile, and may have
        // finished a checkpoint since `latest` was read (it said "no checkpoint: run the
        // recipe again", of a run `runner resume` then continued).
        let latest = crate::checkpoint::list(&d).pop().or(latest);
        let being_written = std::fs::read_dir(d.join("checkpoints"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-step-"));
        let resume = latest.map(|(_, state)| {
            format!(
                "resume it from its checkpoint of step {} with: {} resume {}",
                state.step,
                crate::program(),
                crate::slurm::shell_word(&d.display().to_string())
            )
        });
        // Saved after the last step, before the final evaluation this signal cut short.
        let weights = crate::signals::final_weights().then(|| {
            format!(
                "its trained weights are in {}: score them with: {} eval {}",
                d.join(crate::train::WEIGHTS).display(),
                crate::program(),
                crate::slurm::shell_word(&d.display().to_string())
            )
        });
        let next = match (weights, resume) {
            (Some(w), Some(r)) => format!("{w}, or {r}"),
            (Some(w), None) => w,
            (None, Some(r)) => r,
            (None, None) if being_written => format!(
                "a checkpoint was being written as it exited: `{} resume {}` takes it if it was completed, else says so",
                crate::program(),
                crate::slurm::shell_word(&d.display().to_string())
            ),
            (None, None) => "it has no checkpoint: run the recipe again to start over".into(),
        };
        format!(
            "exiting now, after step {}; {} is marked interrupted, {next}",
            summary.steps,
            d.display()
        )
    }))
}

/// How the loop ended (a stop, an error, a panic, or a write that failed at the very
/// end), with the summary's status and error set from it.
fn ending(
    outcome: std::thread::Result<Result<train::TrainOutcome, String>>,
    summary: &mut Summary,
    sink: &FileSink,
) -> Option<train::Stop> {
    let stop = match outcome {
        Ok(Ok(o)) => {
            // Over all the run's processes, as `wall_s`.
            summary.loader_workers_started += o.loader_workers_started;
            summary.epochs_completed = o.epochs_completed;
            summary.diverged_at_step = o.diverged.map(|(step, _)| step);
            // A failed write stops the loop; one at the very end is caught here.
            o.stopped.or_else(|| {
                sink.io_error
                    .clone()
                    .map(|e| train::Stop::Failed(format!("cannot write {e}")))
            })
        }
        Ok(Err(e)) => Some(train::Stop::Failed(e)),
        Err(panic) => Some(train::Stop::Failed(format!(
            "the training loop panicked: {}",
            panic_message(panic.as_ref())
        ))),
    };
    summary.status = match &stop {
        None => RunStatus::Completed,
        Some(train::Stop::Signal(_)) => RunStatus::Interrupted,
        Some(_) => RunStatus::Failed,
    };
    summary.error = stop.as_ref().map(|s| match s {
        train::Stop::Signal(_) => format!("{s} after step {}", summary.steps),
        _ => s.to_string(),
    });
    stop
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_version_matches_the_pin() {
        let cargo = include_str!("../../Cargo.toml");
        assert!(cargo.contains(&format!("version = \"={BURN_VERSION}\"")));
    }
}
