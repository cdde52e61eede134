//! One run of a plan: reads the data, creates the run directory (resolved recipe,
//! environment record, metrics, summary), picks the backend and runs the training loop,
//! and records how it ended, a crash included. Owns the run directory's layout.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend;
use crate::clock::utc_now;
use crate::data::{self, Dataset};
use crate::kernels::{self, KernelCounts, KernelSettings};
use crate::metrics::{write_json_atomic, Eval, JsonLines, StepRecord, Summary};
use crate::plan::{Device, Plan};
use crate::progress::Progress;
use crate::sampler::{Sampler, Source};
use crate::train::{self, Sink};

/// The Burn version this binary is built against (pinned in Cargo.toml; a test checks).
pub const BURN_VERSION: &str = "0.21.0";

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// No progress bar or per-epoch lines.
    pub quiet: bool,
}

/// Why a run could not start (nothing written) or how it ended early (its directory says
/// more). Each has its exit code; `main` renders them.
#[derive(Debug)]
pub enum RunError {
    /// Bad input found before anything was written: exit code 2.
    Input(String),
    /// The run started and failed; its directory holds what was recorded: exit code 1.
    Failed { dir: PathBuf, message: String },
    /// SIGINT or SIGTERM stopped the run at a step boundary: exit code 128 + signal.
    Interrupted { dir: PathBuf, signal: i32 },
    /// The runner's own files (sweep state) could not be written: exit code 1.
    Io(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            RunError::Input(m) | RunError::Io(m) => f.write_str(m),
            RunError::Failed { message, .. } => f.write_str(message),
            RunError::Interrupted { signal, .. } => {
                write!(f, "interrupted by {}", crate::signals::name(*signal))
            }
        }
    }
}

impl RunError {
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Input(_) => 2,
            RunError::Failed { .. } | RunError::Io(_) => 1,
            RunError::Interrupted { signal, .. } => (128 + signal) as u8,
        }
    }
}

pub struct Finished {
    pub dir: PathBuf,
    pub summary: Summary,
}

/// `env.json`: what a colleague needs to know to reproduce the run.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub runner_version: String,
    pub burn_version: String,
    pub backend: String,
    pub device: String,
    pub device_reason: String,
    pub threads: usize,
    pub cpus: usize,
    pub os: String,
    pub arch: String,
    pub hostname: Option<String>,
    pub command: Vec<String>,
    pub recipe: String,
    /// Every file that made the recipe (it, then what it extends), each with its hash and
    /// git state, so a colleague can check out the same recipe.
    pub sources: Vec<SourceInfo>,
    /// `--set` overrides, as given.
    pub overrides: Vec<String>,
    pub started_at: String,
    /// Where CUDA kernels and autotune results are cached and how they are tuned; with
    /// what the run compiled, loaded from the cache and tuned (hits and misses), filled in
    /// when the run ends.
    pub kernels: crate::kernels::KernelSettings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_counts: Option<crate::kernels::KernelCounts>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SourceInfo {
    pub path: String,
    pub sha256: String,
    pub git: Option<GitInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GitInfo {
    /// HEAD of the repository holding the file.
    pub commit: String,
    /// The file differs from that commit, or is not tracked.
    pub dirty: bool,
    /// When dirty: `git diff HEAD` of the file (its whole text when untracked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// The commit of the git repository holding `file`, if any, and whether the file differs.
pub fn git_info(file: &Path) -> Option<GitInfo> {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"])?;
    let name = file.file_name()?.to_str()?;
    let status = git(&["status", "--porcelain", "--", name]).unwrap_or_default();
    let dirty = !status.is_empty();
    let diff = dirty.then(|| {
        if status.starts_with("??") {
            std::fs::read_to_string(file).unwrap_or_default()
        } else {
            git(&["diff", "HEAD", "--", name]).unwrap_or_default()
        }
    });
    Some(GitInfo {
        commit,
        dirty,
        diff,
    })
}

fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    std::fs::read(path)
        .map(|b| {
            Sha256::digest(&b)
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect()
        })
        .unwrap_or_default()
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
    evals: Vec<Eval>,
    parameters: usize,
    progress: Progress,
    io_error: Option<String>,
    /// Process start → first step done on the device, and that step's own time.
    startup_s: Option<f64>,
    first_step_ms: Option<f64>,
    /// CubeCL's counters when the run started (a process may run several).
    counts_at_start: KernelCounts,
}

impl Sink for FileSink {
    fn started(&mut self, parameters: usize) {
        self.parameters = parameters;
    }
    fn step(&mut self, r: &StepRecord) {
        let mut r = r.clone();
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
        if let Err(e) = self.metrics.write(r) {
            self.io_error
                .get_or_insert(format!("{}: {e}", self.metrics.path().display()));
        }
        self.progress.step(r);
        self.records.push(r.clone());
    }
    fn eval(&mut self, e: &Eval) {
        self.progress.eval(e);
        self.evals.push(e.clone());
    }
    fn epoch_end(&mut self, epoch: usize) {
        self.progress.epoch_end(epoch, &self.records);
    }
    fn phase(&mut self, what: &str) {
        self.progress.phase(what);
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
    t0: Instant,
    sink: &'a mut dyn Sink,
}

impl backend::Job for Train<'_> {
    type Output = train::Outcome;
    fn run<B: burn::tensor::backend::AutodiffBackend>(
        self,
        device: B::Device,
        mem: backend::MemFn<B::Device>,
    ) -> train::Outcome {
        train::train::<B>(
            self.plan,
            self.batcher,
            self.train_set,
            self.test_set,
            device,
            mem,
            self.t0,
            self.sink,
        )
    }
}

/// Runs a validated plan. Data errors come back before anything is written.
pub fn execute(plan: &Plan, opts: &RunOptions) -> Result<Finished, RunError> {
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
        "# Resolved recipe of run {}/{run_id}: every default filled in, paths absolute.\n# Re-run with: runner {}\n",
        plan.name,
        dir.join("recipe.toml").display()
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
    let env = Environment {
        runner_version: env!("CARGO_PKG_VERSION").into(),
        burn_version: BURN_VERSION.into(),
        backend: backend_name.clone(),
        device: device_name.clone(),
        device_reason: plan.device_reason.clone(),
        threads,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        hostname: crate::clock::hostname(),
        command: std::env::args().collect(),
        recipe: plan.recipe_path.display().to_string(),
        sources: plan
            .sources
            .iter()
            .map(|p| SourceInfo {
                path: p.display().to_string(),
                sha256: sha256_file(p),
                git: git_info(p),
            })
            .collect(),
        overrides: plan.overrides.clone(),
        started_at: utc_now(),
        kernels: settings,
        kernel_counts: None,
    };
    write_json_atomic(&dir.join("env.json"), &env).map_err(|e| fail(format!("env.json: {e}")))?;
    let mut summary = Summary {
        name: plan.name.clone(),
        run_id: run_id.clone(),
        status: "running".into(),
        pid: Some(std::process::id()),
        host: crate::clock::hostname(),
        backend: backend_name,
        device: device_name,
        ..Default::default()
    };
    let summary_path = dir.join("summary.json");
    write_json_atomic(&summary_path, &summary).map_err(|e| fail(format!("summary.json: {e}")))?;
    let metrics = JsonLines::create(&dir.join("metrics.jsonl"))
        .map_err(|e| fail(format!("metrics.jsonl: {e}")))?;

    let source = match plan.device {
        Device::Cuda(i) => Source::Nvml(i as u32),
        Device::Cpu => Source::Proc,
    };
    let t0 = Instant::now();
    let sampler = Sampler::start(
        source,
        std::time::Duration::from_millis(plan.profile.sample_ms),
        t0,
    );
    let mut sink = FileSink {
        metrics,
        sampler: Some(sampler),
        records: vec![],
        evals: vec![],
        parameters: 0,
        progress,
        io_error: None,
        startup_s: None,
        first_step_ms: None,
        counts_at_start,
    };
    let vocab = sets.tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    if let Some(t) = &sets.tokenizer {
        t.save(&dir.join("tokenizer.json"))
            .map_err(|e| fail(format!("tokenizer.json: {e}")))?;
    }
    let batcher = train::Batcher::new(plan, vocab);
    let (train_set, test_set) = (Arc::new(sets.train), Arc::new(sets.test));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let job = Train {
            plan,
            batcher,
            train_set: Arc::clone(&train_set),
            test_set: Arc::clone(&test_set),
            t0,
            sink: &mut sink,
        };
        backend::dispatch(plan.device, plan.kernels.fusion, job)
    }));
    sink.progress.finish();
    let sampler = sink.sampler.take().expect("the sampler runs until here");
    let util_source = sampler.status.clone();
    let samples = sampler.finish();
    if !samples.is_empty() {
        let written = JsonLines::create(&dir.join("samples.jsonl"))
            .and_then(|mut f| samples.iter().try_for_each(|s| f.write(s)));
        if let Err(e) = written {
            sink.io_error.get_or_insert(format!("samples.jsonl: {e}"));
        }
    }

    summary.absorb(&sink.records, plan.run.warmup_steps);
    summary.util_source = util_source;
    summary.parameters = sink.parameters;
    summary.evals = sink.evals.clone();
    summary.test_accuracy = sink.evals.last().map(|e| e.accuracy);
    summary.wall_s = wall.elapsed().as_secs_f64();
    summary.startup_s = sink.startup_s;
    summary.first_step_ms = sink.first_step_ms;
    let counts = kernels::counts().since(sink.counts_at_start);
    if env.kernels.used {
        summary.kernels = Some(counts);
        let env = Environment {
            kernel_counts: Some(counts),
            ..env
        };
        if let Err(e) = write_json_atomic(&dir.join("env.json"), &env) {
            sink.io_error.get_or_insert(format!("env.json: {e}"));
        }
    }
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

/// What `warmup` did for one plan.
#[derive(Debug, Clone)]
pub struct Warmup {
    pub backend: String,
    pub device: String,
    pub warmed: train::Warmed,
    /// What CubeCL compiled, took from the cache and tuned (zero on the CPU).
    pub counts: KernelCounts,
    pub seconds: f64,
    pub settings: KernelSettings,
}

/// Compiles and tunes what a run of `plan` needs (see `train::warm_up`) without creating a
/// run: nothing is written but the kernel cache. A failure is the warm-up's own message.
pub fn warmup(plan: &Plan) -> Result<Warmup, RunError> {
    let settings = kernel_settings(plan)?;
    for note in &settings.notes {
        eprintln!("warning: {note}");
    }
    let sets = data::load(&plan.data, plan.model.num_classes, plan.seed)
        .map_err(|e| RunError::Input(format!("error: {e}\n  = help: {}", e.help_text())))?;
    backend::set_cpu_threads(plan.threads);
    let (backend_name, device) = backend::describe(plan.device, &plan.kernels);
    let vocab = sets.tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    let batcher = train::Batcher::new(plan, vocab);
    let before = kernels::counts();
    let t = Instant::now();
    struct Warm<'a> {
        plan: &'a Plan,
        batcher: &'a train::Batcher,
        sets: &'a data::Sets,
    }
    impl backend::Job for Warm<'_> {
        type Output = train::Warmed;
        fn run<B: burn::tensor::backend::AutodiffBackend>(
            self,
            device: B::Device,
            _: backend::MemFn<B::Device>,
        ) -> train::Warmed {
            train::warm_up::<B>(
                self.plan,
                self.batcher,
                &self.sets.train,
                &self.sets.test,
                &device,
            )
        }
    }
    let job = Warm {
        plan,
        batcher: &batcher,
        sets: &sets,
    };
    let failed = |message| RunError::Failed {
        dir: PathBuf::new(),
        message,
    };
    let warmed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        backend::dispatch(plan.device, plan.kernels.fusion, job)
    }))
    .map_err(|p| failed(panic_message(p.as_ref())))?
    .map_err(failed)?;
    Ok(Warmup {
        backend: backend_name,
        device,
        warmed,
        counts: kernels::counts().since(before),
        seconds: t.elapsed().as_secs_f64(),
        settings,
    })
}

pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "the training loop panicked".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_version_matches_the_pin() {
        let cargo = include_str!("../Cargo.toml");
        assert!(cargo.contains(&format!("version = \"={BURN_VERSION}\"")));
    }
}
