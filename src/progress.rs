//! What a person watching a run sees: the start-up phase (what is being done before the
//! first step: loading data, compiling and tuning kernels, with counts and elapsed time),
//! then a progress bar with loss and ms/iter on a terminal, a line per epoch, and the
//! evaluation results. Writes to stderr only; stdout carries the final one-line summary.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::kernels::{self, KernelCounts};
use crate::metrics::{EvalRecord, Stats, StepRecord};
use crate::plan::Plan;

/// How often the start-up phase prints a line where there is no terminal (logs, Slurm).
const STARTUP_LINE_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    epochs: usize,
    name: String,
    startup: Option<Startup>,
}

/// The ticker of the start-up phase: updates the bar's message (terminal) or prints a line
/// every `STARTUP_LINE_EVERY` (no terminal) until the first step is done.
struct Startup {
    shared: Arc<(Mutex<Phase>, Condvar)>,
    ticker: Option<JoinHandle<()>>,
}

struct Phase {
    what: String,
    done: bool,
}

/// `starting 12 s: first step (compiling kernels): 40 kernels compiled, ...`
fn startup_line(name: &str, what: &str, counts: KernelCounts, cache: &Option<PathBuf>) -> String {
    let secs = crate::clock::process_start().elapsed().as_secs();
    let mut s = format!("{name}: starting, {secs} s: {what}");
    if !counts.is_empty() {
        s += &format!("; {}", counts.describe());
        if let Some(dir) = cache {
            s += &format!(" (cached in {} for next time)", dir.display());
        }
    }
    s
}

impl Startup {
    fn start(name: String, bar: Option<ProgressBar>, cache: Option<PathBuf>) -> Self {
        let shared = Arc::new((
            Mutex::new(Phase {
                what: "loading data".into(),
                done: false,
            }),
            Condvar::new(),
        ));
        let every = if bar.is_some() {
            Duration::from_millis(250)
        } else {
            STARTUP_LINE_EVERY
        };
        let state = Arc::clone(&shared);
        let ticker = std::thread::Builder::new()
            .name("runner-startup".into())
            .spawn(move || {
                let (lock, cv) = &*state;
                let mut phase = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let (p, _) = cv
                        .wait_timeout(phase, every)
                        .unwrap_or_else(|p| p.into_inner());
                    phase = p;
                    if phase.done {
                        return;
                    }
                    let line = startup_line(&name, &phase.what, kernels::counts(), &cache);
                    match &bar {
                        Some(b) => b.set_message(line),
                        None => eprintln!("{line}"),
                    }
                }
            })
            .ok();
        Self { shared, ticker }
    }

    fn phase(&self, what: &str) {
        let mut p = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
        p.what = what.into();
    }

    fn stop(mut self) {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner()).done = true;
        self.shared.1.notify_all();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

impl Progress {
    /// Starts the display, in its start-up phase (`cache`: where kernels are cached, for
    /// the lines that say so; `None` on the CPU).
    pub fn new(plan: &Plan, quiet: bool, cache: Option<PathBuf>) -> Self {
        let show_bar =
            !quiet && plan.log.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = show_bar.then(|| {
            let b = ProgressBar::with_draw_target(
                Some(plan.run.total_steps),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} steps  {msg}  eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_prefix(plan.name.clone());
            b
        });
        let startup =
            (!quiet).then(|| Startup::start(plan.name.clone(), bar.clone(), cache.clone()));
        Self {
            bar,
            quiet,
            epochs: plan.run.epochs,
            name: plan.name.clone(),
            startup,
        }
    }

    /// What the start-up phase is doing now (`building the model`, `first step`...).
    pub fn phase(&self, what: &str) {
        if let Some(s) = &self.startup {
            s.phase(what);
        }
    }

    /// Ends the start-up phase with one line: how long it took and what was compiled.
    pub fn first_step_done(&mut self, startup_s: f64, counts: KernelCounts) {
        let Some(s) = self.startup.take() else {
            return;
        };
        s.stop();
        let mut line = format!(
            "{}: first step done {startup_s:.1} s after start",
            self.name
        );
        if !counts.is_empty() {
            line += &format!(" ({})", counts.describe());
        }
        if let Some(b) = &self.bar {
            b.set_message(String::new());
        }
        self.line(line);
    }

    pub fn step(&mut self, r: &StepRecord) {
        if let Some(b) = &self.bar {
            b.set_position(r.step);
            b.set_message(format!(
                "epoch {}  loss {:.4}  {:.1} ms/iter",
                r.epoch + 1,
                r.loss,
                r.iter_ms
            ));
        }
    }

    /// A line of its own (between the bar's redraws on a terminal).
    pub fn note(&self, s: String) {
        self.line(s);
    }

    fn line(&self, s: String) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    pub fn epoch_end(&mut self, epoch: usize, records: &[StepRecord]) {
        let this: Vec<&StepRecord> = records.iter().filter(|r| r.epoch == epoch).collect();
        if this.is_empty() {
            return;
        }
        let loss = this.iter().map(|r| r.loss).sum::<f64>() / this.len() as f64;
        let iters: Vec<f64> = this.iter().map(|r| r.iter_ms).collect();
        self.line(format!(
            "epoch {}/{}: {} steps, mean loss {loss:.4}, median {:.1} ms/iter",
            epoch + 1,
            self.epochs,
            this.len(),
            Stats::of(&iters).median
        ));
    }

    pub fn validation(&mut self, e: &EvalRecord) {
        self.line(format!(
            "  validation (step {}): accuracy {:.2}% on {} samples, loss {:.4}",
            e.step,
            100.0 * e.accuracy,
            e.samples,
            e.loss
        ));
    }

    pub fn eval(&mut self, e: &EvalRecord) {
        self.line(format!(
            "  test: accuracy {:.2}% on {} samples, loss {:.4} ({:.1} s)",
            100.0 * e.accuracy,
            e.samples,
            e.loss,
            e.ms / 1e3
        ));
    }

    pub fn finish(&mut self) {
        if let Some(s) = self.startup.take() {
            s.stop();
        }
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
