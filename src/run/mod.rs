//! One run of a plan: reads the data, creates the run directory (resolved recipe,
//! environment record, metrics, summary), picks the backend and runs the training loop,
//! and records how it ended, a crash included. Owns the run directory's layout.

mod env;
mod eval;
mod resume;
mod warmup;

pub use crate::clock::panic_message;
/// The run layer's name for the crate's one error type.
pub use crate::error::Error as RunError;
use env::{environment, sha256_file};
pub use env::{git_info, Environment, GitInfo, SourceInfo};
pub use eval::{eval, EvalReport};
pub use resume::resume;
pub use warmup::{warmup, Warmup};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend;
use crate::clock::utc_now;
use crate::data::{self, Dataset};
use crate::kernels::{self, KernelCounts, KernelSettings};
use crate::metrics::{write_json_atomic, EvalRecord, JsonLines, StepRecord, Summary};
use crate::plan::{Device, Plan};
use crate::progress::Progress;
use crate::sampler::{Sampler, UtilSource};
use crate::train::{self, Sink};

/// The Burn version this binary is built against (pinned in Cargo.toml; a test checks).
pub const BURN_VERSION: &str = "0.21.0";

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// No progress bar or per-epoch lines.
    pub quiet: bool,
}

pub struct Finished {
    pub dir: PathBuf,
    pub summary: Summary,
}

/// Creates `<dir>/<name>/<run-id>`; the id is the UTC start time, with a suffix if taken.
fn create_run_dir(root: &Path, name: &str) -> std::io::Result<(PathBuf, String)> {
    let parent = root.join(name);
    std::fs::create_dir_all(&parent)?;
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
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free run id"))
}

/// Writes metrics lines as they come, keeps them for the summary, drives the progress bar.
struct FileSink {
    metrics: JsonLines,
    /// Taken (and stopped) when the loop ends.
    sampler: Option<Sampler>,
    records: Vec<StepRecord>,
    evals: Vec<EvalRecord>,
    parameters: usize,
    progress: Progress,
    io_error: Option<String>,
    /// Process start → first step done on the device, and that step's own time.
    startup_s: Option<f64>,
    first_step_ms: Option<f64>,
    /// CubeCL's counters when the run started (a process may run several).
    counts_at_start: KernelCounts,
    /// Lines written to `metrics.jsonl` (those of earlier processes included).
    lines: u64,
    /// A resumed run's clock continues from its last record.
    t_offset_ms: f64,
    checkpoints: usize,
    checkpoint_ms: f64,
    quiet: bool,
    /// `metrics.csv` and the TensorBoard events, when the plan asks for them.
    csv: Option<JsonLines>,
    events: Option<crate::tensorboard::EventWriter>,
    validations: Vec<EvalRecord>,
    best: Option<(u64, f64)>,
    early_stopped: Option<u64>,
}

impl FileSink {
    /// The scalars TensorBoard shows for a step.
    fn scalars(r: &StepRecord) -> Vec<(&'static str, f64)> {
        let pct = |x: f64| {
            if r.iter_ms > 0.0 {
                100.0 * x / r.iter_ms
            } else {
                0.0
            }
        };
        let mut v = vec![
            ("train/loss", r.loss),
            ("train/lr", r.lr),
            ("time/iter_ms", r.iter_ms),
            ("time/samples_per_s", r.samples_per_s),
            ("time/data_wait_pct", pct(r.data_wait_ms)),
        ];
        let opt = [
            ("memory/in_use_bytes", r.mem_in_use_bytes.map(|b| b as f64)),
            (
                "memory/reserved_bytes",
                r.mem_reserved_bytes.map(|b| b as f64),
            ),
            ("memory/rss_bytes", r.rss_bytes.map(|b| b as f64)),
            ("util/gpu_pct", r.gpu_util_pct),
            ("util/cpu_pct", r.cpu_util_pct),
        ];
        v.extend(opt.into_iter().filter_map(|(k, x)| Some((k, x?))));
        v
    }

    /// Scalars at a step into the TensorBoard events, when the plan writes them.
    fn event(&mut self, step: u64, values: &[(&str, f64)]) {
        if let Some(ev) = &mut self.events {
            if let Err(e) = ev.scalars(step, values) {
                let p = ev.path().to_path_buf();
                self.io(&p, e);
            }
        }
    }

    fn io(&mut self, what: &Path, e: std::io::Error) {
        self.io_error
            .get_or_insert(format!("{}: {e}", what.display()));
    }
}

impl Sink for FileSink {
    fn started(&mut self, parameters: usize) {
        self.parameters = parameters;
    }
    fn step(&mut self, r: &StepRecord) {
        let mut r = r.clone();
        r.t_ms += self.t_offset_ms;
        if let Some(s) = self
            .sampler
            .as_ref()
            .and_then(|s| s.window(r.t_ms - r.iter_ms, r.t_ms))
        {
            r.gpu_util_pct = s.gpu_util_pct;
            r.gpu_mem_used_bytes = s.gpu_mem_used_bytes;
            r.sm_clock_mhz = s.sm_clock_mhz;
            r.power_w = s.power_w;
            r.cpu_util_pct = s.cpu_util_pct;
        }
        let r = &r;
        match self.metrics.write(r) {
            Ok(()) => self.lines += 1,
            Err(e) => {
                self.io_error
                    .get_or_insert(format!("{}: {e}", self.metrics.path().display()));
            }
        }
        if let Some(csv) = &mut self.csv {
            if let Err(e) = csv.write_line(r.csv_row()) {
                let p = csv.path().to_path_buf();
                self.io(&p, e);
            }
        }
        self.event(r.step, &Self::scalars(r));
        self.progress.step(r);
        self.records.push(r.clone());
    }
    fn eval(&mut self, e: &EvalRecord) {
        self.progress.eval(e);
        self.evals.push(e.clone());
        self.event(
            e.step,
            &[("eval/accuracy", e.accuracy), ("eval/loss", e.loss)],
        );
    }
    fn epoch_end(&mut self, epoch: usize) {
        self.progress.epoch_end(epoch, &self.records);
    }
    fn phase(&mut self, what: &str) {
        self.progress.phase(what);
    }
    fn validation(&mut self, e: &EvalRecord) {
        self.progress.validation(e);
        self.validations.push(e.clone());
        self.event(
            e.step,
            &[("val/accuracy", e.accuracy), ("val/loss", e.loss)],
        );
    }
    fn best(&mut self, step: u64, value: f64) {
        self.best = Some((step, value));
    }
    fn early_stopped(&mut self, step: u64) {
        self.early_stopped = Some(step);
        if !self.quiet {
            let (b, v) = self.best.unwrap_or((0, f64::NAN));
            self.progress.note(format!(
                "early stop after step {step}: no better validation since step {b} ({v:.4})"
            ));
        }
    }
    fn lines_written(&self) -> u64 {
        self.lines
    }
    fn checkpointed(&mut self, dir: &Path, ms: f64) {
        self.checkpoints += 1;
        self.checkpoint_ms += ms;
        if !self.quiet {
            self.progress
                .note(format!("checkpoint {} ({ms:.0} ms)", dir.display()));
        }
    }
    fn should_stop(&mut self) -> Option<train::Stop> {
        if let Some(e) = &self.io_error {
            return Some(train::Stop::Failed(format!("cannot write {e}")));
        }
        crate::signals::received().map(train::Stop::Signal)
    }
    fn first_step(&mut self, step_ms: f64) {
        let startup = crate::clock::process_start().elapsed().as_secs_f64();
        self.startup_s = Some(startup);
        self.first_step_ms = Some(step_ms);
        let counts = kernels::counts().since(self.counts_at_start);
        self.progress.first_step_done(startup, counts);
    }
}

/// The kernel settings a plan runs with: CubeCL configured for CUDA, recorded for the CPU.
fn kernel_settings(plan: &Plan) -> Result<KernelSettings, RunError> {
    match plan.device {
        Device::Cpu => Ok(kernels::cpu_settings(&plan.kernels)),
        Device::Cuda(_) => kernels::configure_cuda(&plan.kernels).map_err(|e| {
            RunError::Input(format!(
                "error: {e}\n  = help: set backend.cache_dir or ${} to a writable directory",
                kernels::CACHE_ENV
            ))
        }),
    }
}

/// The training loop as a backend-generic job.
struct Train<'a> {
    plan: &'a Plan,
    batcher: train::Batcher,
    train_set: Arc<Dataset>,
    test_set: Arc<Dataset>,
    validation: Option<Arc<Dataset>>,
    t0: Instant,
    sink: &'a mut dyn Sink,
    persist: &'a train::Persist,
}

impl backend::Job for Train<'_> {
    type Output = train::TrainOutcome;
    fn run<B: crate::ops::TrainBackend>(
        self,
        device: B::Device,
        mem: backend::MemFn<B::Device>,
    ) -> train::TrainOutcome {
        train::train::<B>(
            self.plan,
            self.batcher,
            self.train_set,
            self.test_set,
            self.validation,
            device,
            mem,
            self.t0,
            self.sink,
            Some(self.persist),
        )
    }
}

/// What a process needs before it writes anything: the kernel settings, the display, the
/// data (whose errors come back before anything is written).
struct Prepared {
    wall: Instant,
    settings: KernelSettings,
    counts_at_start: KernelCounts,
    progress: Progress,
    sets: data::Sets,
    threads: usize,
    backend_name: String,
    device_name: String,
}

fn prepare(plan: &Plan, opts: &RunOptions) -> Result<Prepared, RunError> {
    let wall = Instant::now();
    let settings = kernel_settings(plan)?;
    for note in &settings.notes {
        eprintln!("warning: {note}");
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
    Err(RunError::Input(format!(
        "error: {} is not a run directory (it has no recipe.toml)\n  = help: name a directory under log.dir, e.g. runs/<name>/<run-id>",
        run_dir.display()
    )))
}

/// A run directory's recipe validated again, on this machine, with `sets` on top.
fn run_plan(
    recipe_path: &Path,
    sets: &[String],
    machine: &crate::plan::Machine,
) -> Result<Plan, RunError> {
    let checked = crate::sweep::check(recipe_path, sets, machine, 1)
        .map_err(|r| RunError::Input(r.to_string()))?;
    Ok(checked
        .plans
        .into_iter()
        .next()
        .expect("a recipe has a plan"))
}

/// A run directory as the loop continues it: what earlier processes recorded.
struct Files {
    dir: PathBuf,
    env: Environment,
    summary: Summary,
    metrics: JsonLines,
    records: Vec<StepRecord>,
    evals: Vec<EvalRecord>,
    resume: Option<(PathBuf, crate::checkpoint::State)>,
}

/// Runs a validated plan. Data errors come back before anything is written.
pub fn execute(plan: &Plan, opts: &RunOptions) -> Result<Finished, RunError> {
    let prepared = prepare(plan, opts)?;
    let (dir, run_id) = create_run_dir(&plan.log.dir, &plan.name).map_err(|e| {
        RunError::Input(format!(
            "error: cannot create a run directory under {}: {e}\n  = help: check log.dir",
            plan.log.dir.display()
        ))
    })?;
    let fail = |message: String| RunError::Failed {
        dir: dir.clone(),
        message,
    };
    let header = format!(
        "# Resolved recipe of run {}/{run_id}: every default filled in, paths absolute.\n# Re-run with: runner {}\n# Continue it after an interruption with: runner resume {}\n",
        plan.name,
        dir.join("recipe.toml").display(),
        dir.display()
    );
    let toml = toml::to_string(&plan.resolved)
        .map_err(|e| fail(format!("cannot write the resolved recipe: {e}")))?;
    std::fs::write(dir.join("recipe.toml"), header + &toml)
        .map_err(|e| fail(format!("recipe.toml: {e}")))?;
    if !plan.warnings.is_empty() {
        let text: Vec<String> = plan.warnings.iter().map(|w| w.to_string()).collect();
        std::fs::write(dir.join("warnings.txt"), text.join("\n") + "\n")
            .map_err(|e| fail(format!("warnings.txt: {e}")))?;
    }
    let env = environment(plan, &prepared);
    write_json_atomic(&dir.join("env.json"), &env).map_err(|e| fail(format!("env.json: {e}")))?;
    let summary = Summary {
        name: plan.name.clone(),
        run_id: run_id.clone(),
        status: "running".into(),
        pid: Some(std::process::id()),
        host: crate::clock::hostname(),
        backend: prepared.backend_name.clone(),
        device: prepared.device_name.clone(),
        ..Default::default()
    };
    write_json_atomic(&dir.join("summary.json"), &summary)
        .map_err(|e| fail(format!("summary.json: {e}")))?;
    let metrics = JsonLines::create(&dir.join("metrics.jsonl"))
        .map_err(|e| fail(format!("metrics.jsonl: {e}")))?;
    if let Some(t) = &prepared.sets.tokenizer {
        t.save(&dir.join("tokenizer.json"))
            .map_err(|e| fail(format!("tokenizer.json: {e}")))?;
    }
    let files = Files {
        dir,
        env,
        summary,
        metrics,
        records: vec![],
        evals: vec![],
        resume: None,
    };
    drive(plan, opts, prepared, files)
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
        records,
        evals,
        resume,
    } = files;
    let fail = |message: String| RunError::Failed {
        dir: dir.clone(),
        message,
    };
    let t0 = Instant::now();
    let sampler = start_sampler(plan, t0);
    let mut sink = FileSink::new(
        (metrics, records, evals),
        progress,
        counts_at_start,
        &summary,
        opts.quiet,
        sampler,
    );
    let resumed_at = resume.as_ref().map(|(_, s)| s.step);
    open_exports(plan, &dir, resumed_at, &mut sink).map_err(fail)?;
    let vocab = sets.tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    let batcher = train::Batcher::new(plan, vocab);
    let (train_set, test_set) = (Arc::new(sets.train), Arc::new(sets.test));
    let validation = sets.validation.map(Arc::new);
    let persist = train::Persist {
        run_dir: dir.clone(),
        recipe_sha256: sha256_file(&dir.join("recipe.toml")),
        resume,
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let job = Train {
            plan,
            batcher,
            train_set: Arc::clone(&train_set),
            test_set: Arc::clone(&test_set),
            validation: validation.clone(),
            t0,
            sink: &mut sink,
            persist: &persist,
        };
        backend::dispatch(plan.device, plan.kernels.fusion, job)
    }));
    sink.progress.finish();
    summary.util_source = finish_sampler(&mut sink, &dir);
    summary.wall_s += wall.elapsed().as_secs_f64();
    record(&mut summary, &sink, plan);
    record_kernels(env, &mut summary, &mut sink, &dir);
    let stop = ending(outcome, &mut summary, &sink);
    let summary_path = dir.join("summary.json");
    if let Err(e) = write_json_atomic(&summary_path, &summary) {
        let message = format!("{}: {e}", summary_path.display());
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

impl FileSink {
    /// A sink continuing what `summary` and the metrics `records` already hold (a resumed
    /// run), or starting empty.
    fn new(
        (metrics, records, evals): (JsonLines, Vec<StepRecord>, Vec<EvalRecord>),
        progress: Progress,
        counts_at_start: KernelCounts,
        summary: &Summary,
        quiet: bool,
        sampler: Sampler,
    ) -> Self {
        FileSink {
            metrics,
            sampler: Some(sampler),
            lines: records.len() as u64,
            t_offset_ms: records.last().map_or(0.0, |r| r.t_ms),
            records,
            evals,
            parameters: 0,
            progress,
            io_error: None,
            startup_s: None,
            first_step_ms: None,
            counts_at_start,
            checkpoints: summary.checkpoints,
            checkpoint_ms: summary.checkpoint_ms_total,
            quiet,
            csv: None,
            events: None,
            validations: summary.validations.clone(),
            best: summary.best_step.zip(summary.best_value),
            early_stopped: None,
        }
    }
}

/// The utilisation sampler of the run's device (NVML on CUDA, /proc on the CPU).
fn start_sampler(plan: &Plan, t0: Instant) -> Sampler {
    let source = match plan.device {
        Device::Cuda(i) => UtilSource::Nvml(i as u32),
        Device::Cpu => UtilSource::Proc,
    };
    let interval = std::time::Duration::from_millis(plan.profile.sample_ms);
    Sampler::start(source, interval, t0)
}

/// `metrics.csv` and the TensorBoard event file, opened before the first step so a bad
/// path fails early; a resumed run continues them.
fn open_exports(
    plan: &Plan,
    dir: &Path,
    resumed_at: Option<u64>,
    sink: &mut FileSink,
) -> Result<(), String> {
    if plan.log.csv {
        let path = dir.join("metrics.csv");
        let opened = if resumed_at.is_some() && path.is_file() {
            JsonLines::reopen_raw(&path, sink.lines + 1)
        } else {
            JsonLines::create(&path).and_then(|mut f| {
                f.write_line(StepRecord::csv_header())?;
                for r in &sink.records {
                    f.write_line(r.csv_row())?;
                }
                Ok(f)
            })
        };
        sink.csv = Some(opened.map_err(|e| format!("{}: {e}", path.display()))?);
    }
    if plan.log.tensorboard {
        let mut w = crate::tensorboard::EventWriter::create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some(step) = resumed_at {
            w.restart_at(step)
                .map_err(|e| format!("{}: {e}", w.path().display()))?;
        }
        sink.events = Some(w);
    }
    Ok(())
}

/// Stops the sampler and writes its samples to `samples.jsonl`; returns its status.
fn finish_sampler(sink: &mut FileSink, dir: &Path) -> String {
    let sampler = sink.sampler.take().expect("the sampler runs until here");
    let status = sampler.status.clone();
    let samples = sampler.finish();
    if !samples.is_empty() {
        let written = JsonLines::append(&dir.join("samples.jsonl"))
            .and_then(|mut f| samples.iter().try_for_each(|s| f.write(s)));
        if let Err(e) = written {
            sink.io_error.get_or_insert(format!("samples.jsonl: {e}"));
        }
    }
    status
}

/// What the sink saw, into the summary.
fn record(summary: &mut Summary, sink: &FileSink, plan: &Plan) {
    summary.absorb(&sink.records, plan.run.warmup_steps);
    summary.parameters = sink.parameters;
    summary.evals = sink.evals.clone();
    summary.test_accuracy = sink.evals.last().map(|e| e.accuracy);
    summary.startup_s = sink.startup_s;
    summary.first_step_ms = sink.first_step_ms;
    summary.checkpoints = sink.checkpoints;
    summary.checkpoint_ms_total = sink.checkpoint_ms;
    summary.validations = sink.validations.clone();
    summary.best_step = sink.best.map(|b| b.0);
    summary.best_value = sink.best.map(|b| b.1);
    summary.early_stopped_at_step = sink.early_stopped;
}

/// On CUDA, the kernels compiled and tuned during the run, into the summary and env.json.
fn record_kernels(env: Environment, summary: &mut Summary, sink: &mut FileSink, dir: &Path) {
    if !env.kernels.used {
        return;
    }
    let counts = kernels::counts().since(sink.counts_at_start);
    summary.kernels = Some(counts);
    let env = Environment {
        kernel_counts: Some(counts),
        ..env
    };
    if let Err(e) = write_json_atomic(&dir.join("env.json"), &env) {
        sink.io_error.get_or_insert(format!("env.json: {e}"));
    }
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
            summary.loader_workers_started = o.loader_workers_started;
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
        None => "completed",
        Some(train::Stop::Signal(_)) => "interrupted",
        Some(_) => "failed",
    }
    .into();
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
