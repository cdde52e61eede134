//! The run's sink: where the training loop's records go (metrics.jsonl, metrics.csv,
//! TensorBoard, the progress display), the utilisation sampler beside it, and what it saw
//! written into the summary at the end.

use super::*;
use crate::metrics::Tally;

/// Writes metrics lines as they come, keeps them for the summary, drives the progress bar.
pub(super) struct FileSink {
    metrics: JsonLines,
    /// Taken (and stopped) when the loop ends.
    pub(super) sampler: Option<Sampler>,
    /// The run's counts so far, without the steps' times (see `record`).
    tally: Tally,
    evals: Vec<EvalRecord>,
    /// The model's trainable parameters, once it is built; shared with what a second
    /// signal writes (see `stop_at_second_signal`).
    pub(super) parameters: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) progress: Progress,
    pub(super) io_error: Option<String>,
    /// Start (the process's, or a grid's later cell's own) → first step done on the
    /// device, and that step's own time.
    startup_s: Option<f64>,
    origin: Instant,
    first_step_ms: Option<f64>,
    /// Loader workers the run's earlier processes started.
    workers_before: usize,
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
    /// The final weights' SHA-256, once saved.
    weights_sha256: Option<String>,
    /// `model-best.safetensors`'s, as last saved (by this process or an earlier one).
    best_weights_sha256: Option<String>,
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
        self.parameters
            .store(parameters, std::sync::atomic::Ordering::SeqCst);
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
                // Not in the summary either: its steps are the lines metrics.jsonl holds.
                return;
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
        self.tally.push(r);
    }
    fn eval(&mut self, e: &EvalRecord) {
        self.progress.eval(e);
        self.evals.push(e.clone());
        THIS_PROCESS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .evals
            .push(e.clone());
        self.event(
            e.step,
            &[("eval/accuracy", e.accuracy), ("eval/loss", e.loss)],
        );
    }
    fn epoch_end(&mut self, epoch: usize, held: Option<&StepRecord>, cut_short: Option<&str>) {
        self.progress.epoch_end(epoch, held, cut_short);
    }
    fn phase(&mut self, what: &str) {
        self.progress.phase(what);
    }
    fn validation(&mut self, e: &EvalRecord) {
        self.progress.validation(e);
        self.validations.push(e.clone());
        THIS_PROCESS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .validations
            .push(e.clone());
        self.event(
            e.step,
            &[("val/accuracy", e.accuracy), ("val/loss", e.loss)],
        );
    }
    fn best(&mut self, step: u64, value: f64, saved: Option<&str>) {
        self.best = Some((step, value));
        if let Some(sum) = saved {
            self.best_weights_sha256 = Some(sum.to_string());
        }
        crate::signals::best_saved_now(step, value, saved);
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
    fn recorded(&self) -> crate::checkpoint::Recorded {
        crate::checkpoint::Recorded {
            evals: self.evals.clone(),
            validations: self.validations.clone(),
            checkpoints_before: self.checkpoints,
            checkpoint_ms_before: self.checkpoint_ms,
            startup_s: self.startup_s,
            first_step_ms: self.first_step_ms,
            // This process's own are added by the loop, which has the loader.
            loader_workers_started: Some(self.workers_before),
            best_weights_sha256: self.best_weights_sha256.clone(),
        }
    }
    fn moved(&mut self, to: &Path) {
        // Said under -q too: the run's files are no longer where its start said.
        let s = format!(
            "note: the run directory was moved to {} while the run ran; the run goes on there",
            to.display()
        );
        if self.quiet {
            crate::errln!("{s}");
        } else {
            self.progress.note(s);
        }
    }
    fn should_stop(&mut self) -> Option<train::Stop> {
        if let Some(e) = &self.io_error {
            return Some(train::Stop::Failed(format!("cannot write {e}")));
        }
        let signal = crate::signals::received()?;
        // Before the first step is done a signal ends the process (see `signals`).
        crate::signals::exit_if_armed();
        crate::signals::say_received();
        Some(train::Stop::Signal(signal))
    }
    fn note(&mut self, line: &str) {
        // Said under -q too: it answers what the person did.
        if self.quiet {
            crate::errln!("{line}");
        } else {
            self.progress.note(line.to_string());
        }
    }
    fn last_step_taken(&mut self) -> Option<train::Stop> {
        if let Some(e) = &self.io_error {
            return Some(train::Stop::Failed(format!("cannot write {e}")));
        }
        let stop = crate::signals::last_step_taken()?;
        crate::signals::say_received();
        Some(train::Stop::Signal(stop))
    }
    fn weights_saved(&mut self, sha256: &str) {
        self.weights_sha256 = Some(sha256.to_string());
        crate::signals::final_weights_saved();
    }
    fn first_step(&mut self, step_ms: f64) {
        // From here a signal stops the run at a step boundary, with a checkpoint.
        crate::signals::first_step_done();
        let startup = self.origin.elapsed().as_secs_f64();
        // A resumed run's are its first process's: the run's start-up (a resume's first
        // step, on warm caches, said the run started at once).
        self.startup_s.get_or_insert(startup);
        self.first_step_ms.get_or_insert(step_ms);
        let counts = kernels::counts().since(self.counts_at_start);
        self.progress.first_step_done(startup, counts);
    }
}

impl FileSink {
    /// A sink continuing what `summary` and the metrics lines `kept` already hold (a
    /// resumed run), or starting empty.
    pub(super) fn new(
        (metrics, kept, evals): (JsonLines, super::Kept, Vec<EvalRecord>),
        mut progress: Progress,
        (counts_at_start, origin): (KernelCounts, Instant),
        summary: &Summary,
        quiet: bool,
        sampler: Sampler,
    ) -> Self {
        *THIS_PROCESS.lock().unwrap_or_else(|e| e.into_inner()) = Evaluated::default();
        progress.continue_epoch(kept.epoch);
        let tally = kept.tally;
        FileSink {
            metrics,
            sampler: Some(sampler),
            lines: kept.lines,
            t_offset_ms: kept.t_ms,
            tally,
            evals,
            parameters: Arc::default(),
            progress,
            io_error: None,
            startup_s: summary.startup_s,
            first_step_ms: summary.first_step_ms,
            workers_before: summary.loader_workers_started,
            origin,
            counts_at_start,
            checkpoints: summary.checkpoints,
            checkpoint_ms: summary.checkpoint_ms_total,
            quiet,
            csv: None,
            events: None,
            validations: summary.validations.clone(),
            best: summary.best_step.zip(summary.best_value),
            best_weights_sha256: summary.best_weights_sha256.clone(),
            early_stopped: None,
            weights_sha256: None,
        }
    }
}

/// The evaluations this process's run has made, for what a second signal writes (it
/// exits from the signals thread, which cannot reach the sink): its summary lost those
/// made after the latest checkpoint, or with none, all of them.
#[derive(Default, Clone)]
pub(super) struct Evaluated {
    pub evals: Vec<EvalRecord>,
    pub validations: Vec<EvalRecord>,
}

static THIS_PROCESS: std::sync::Mutex<Evaluated> = std::sync::Mutex::new(Evaluated {
    evals: Vec::new(),
    validations: Vec::new(),
});

/// This process's run's evaluations so far (see [`Evaluated`]).
pub(super) fn evaluated() -> Evaluated {
    THIS_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The utilisation sampler of the run's device (NVML on CUDA, /proc on the CPU), writing
/// to `samples.jsonl` in `dir` on the run's clock: from `t0`, after the `offset_ms` of a
/// resumed run's kept metrics lines.
pub(super) fn start_sampler(plan: &Plan, t0: Instant, offset_ms: f64, dir: &Path) -> Sampler {
    let source = match plan.device {
        Device::Cuda(i) => UtilSource::Nvml(i as u32),
        // No utilisation counter for a WebGPU adapter: the process's CPU use is recorded
        // (as CPU use; on a software Vulkan it is all the work there is).
        Device::Cpu | Device::Wgpu(_) => UtilSource::Proc,
    };
    let interval = std::time::Duration::from_millis(plan.profile.sample_ms);
    let to = crate::sampler::SampleTo {
        t0,
        offset_ms,
        // (A directory that cannot be opened has no file written in it either.)
        file: crate::rundir::RunDir::open(dir)
            .ok()
            .map(|d| (d, "samples.jsonl")),
    };
    Sampler::start(source, interval, to)
}

/// `metrics.csv` and the TensorBoard event file, opened before the first step so a bad
/// path fails early; a resumed run continues them. A `metrics.csv` whose columns are not
/// this version's (a run started by an older runner) is written again from the records.
pub(super) fn open_exports(
    plan: &Plan,
    dir: &Path,
    resumed_at: Option<u64>,
    sink: &mut FileSink,
) -> Result<(), String> {
    if plan.log.csv {
        let path = dir.join("metrics.csv");
        // Continued where it has this version's columns and a whole row for every metrics
        // line kept; else written again whole from metrics.jsonl: an older version's
        // columns, or rows missing (a write to it failed where metrics.jsonl's did not, a
        // copy cut short), which it went on after without a word.
        let header = StepRecord::csv_header() + "\n";
        // (Read a line at a time, as far as needed: a long run's is hundreds of MB.)
        let lines = |most, first: &dyn Fn(&[u8]) -> bool| {
            crate::metrics::whole_lines(&path, most, first).is_ok_and(|(n, _)| n == most)
        };
        // (Rows that are not UTF-8 text, as a CSV reader needs, are not continued either.)
        let continues = resumed_at.is_some()
            && lines(1, &|l| l == header.as_bytes())
            && lines(sink.lines + 1, &|l| std::str::from_utf8(l).is_ok());
        let opened = if continues {
            JsonLines::reopen_raw(&path, sink.lines + 1)
        } else {
            JsonLines::create(&path).and_then(|mut f| {
                f.write_line(StepRecord::csv_header())?;
                let mut written = Ok(());
                let lines = sink.lines as usize;
                let read = JsonLines::each::<StepRecord>(&dir.join("metrics.jsonl"), |r, n, _| {
                    if n > lines {
                        return false;
                    }
                    written = f.write_line(r.csv_row());
                    written.is_ok()
                });
                written?;
                read.map_err(|e| match e {
                    crate::metrics::Each::Io(e) => e,
                    crate::metrics::Each::Line(n, e) => {
                        std::io::Error::other(format!("metrics.jsonl line {n}: {e}"))
                    }
                })?;
                Ok(f)
            })
        };
        sink.csv = Some(opened.map_err(|e| format!("{}: {e}", path.display()))?);
    }
    if plan.log.tensorboard {
        // Its error names the events file.
        let mut w = crate::tensorboard::EventWriter::create(dir).map_err(|e| e.to_string())?;
        if let Some(step) = resumed_at {
            w.restart_at(step)
                .map_err(|e| format!("{}: {e}", w.path().display()))?;
        }
        sink.events = Some(w);
    }
    Ok(())
}

/// Stops the sampler (its samples are in `samples.jsonl` as they were taken); returns its
/// status.
pub(super) fn finish_sampler(sink: &mut FileSink) -> String {
    let sampler = sink.sampler.take().expect("the sampler runs until here");
    let status = sampler.status.clone();
    // The raw samples are extra: the steps' figures already hold their windows, so a
    // run that trained is not failed for them (a completed run was, and `report` and
    // `resume` then had nothing to say of it).
    if let Some(e) = sampler.finish().error {
        crate::errln!(
            "warning: cannot write {e}; the utilisation samples from then on are not kept (each step's figures in metrics.jsonl are)"
        );
    }
    status
}

/// What the sink saw, into the summary. The step figures are those of the lines in
/// `metrics` (the run's earlier processes' too), read back a line at a time: the run
/// keeps no step's times meanwhile, so its memory does not grow with its length (it kept
/// each step's record, then 64 bytes of each timed step's times: ~370 MB for a day of 15
/// ms steps), and its summary is what `report` recomputes from the same lines. Where they
/// cannot be read back, its counts, without the timing figures, and a warning.
pub(super) fn record(summary: &mut Summary, sink: &FileSink, metrics: &Path, warmup_steps: u64) {
    match Tally::read(metrics, warmup_steps) {
        Ok(tally) => tally.fill(summary),
        Err(e) => {
            crate::errln!(
                "warning: cannot read back {}: {e}; the summary gives the run's counts, without its step times",
                metrics.display()
            );
            sink.tally.fill(summary);
        }
    }
    summary.parameters = sink.parameters.load(std::sync::atomic::Ordering::SeqCst);
    summary.evals = sink.evals.clone();
    summary.test_accuracy = sink.evals.last().map(|e| e.accuracy);
    summary.startup_s = sink.startup_s;
    summary.first_step_ms = sink.first_step_ms;
    summary.checkpoints = sink.checkpoints;
    summary.checkpoint_ms_total = sink.checkpoint_ms;
    summary.validations = sink.validations.clone();
    summary.best_step = sink.best.map(|b| b.0);
    summary.best_value = sink.best.map(|b| b.1);
    summary
        .best_weights_sha256
        .clone_from(&sink.best_weights_sha256);
    summary.early_stopped_at_step = sink.early_stopped;
    if let Some(sum) = &sink.weights_sha256 {
        summary.weights_sha256 = Some(sum.clone());
    }
}

/// On CUDA, the kernels compiled and tuned during the run, into the summary and env.json:
/// the run's whole environment where this process started it, else (a resume) only the
/// counts, into its entry of `resumes`, the rest of env.json left as the run's start wrote
/// it.
pub(super) fn record_kernels(
    env: Environment,
    summary: &mut Summary,
    sink: &mut FileSink,
    dir: &Path,
    resumed: bool,
) {
    if !env.kernels.used {
        return;
    }
    let counts = kernels::counts().since(sink.counts_at_start);
    summary.kernels = Some(counts);
    let path = dir.join("env.json");
    let written = if resumed {
        (|| -> std::io::Result<()> {
            let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
                .map_err(std::io::Error::other)?;
            if let Some(this) = v
                .get_mut("resumes")
                .and_then(|r| r.as_array_mut())
                .and_then(|r| r.last_mut())
            {
                this["kernel_counts"] =
                    serde_json::to_value(counts).map_err(std::io::Error::other)?;
            }
            write_json_atomic(&path, &v)
        })()
    } else {
        write_json_atomic(
            &path,
            &Environment {
                kernel_counts: Some(counts),
                ..env
            },
        )
    };
    if let Err(e) = written {
        sink.io_error.get_or_insert(format!("env.json: {e}"));
    }
}
