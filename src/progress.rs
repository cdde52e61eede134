//! What a person watching a run sees: the start-up phase (what is being done before the
//! first step: loading data, compiling and tuning kernels, with counts and elapsed time),
//! then a progress bar with loss and ms/iter on a terminal, a line per epoch, the
//! evaluation results, and on CUDA what a new shape later in the run compiles. Writes to
//! stderr only; stdout carries the final one-line summary.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::kernels::{self, KernelCounts};
use crate::metrics::{EvalRecord, Stats, StepRecord};
use crate::plan::Plan;

/// How often the start-up phase (and later compilation) prints a line where there is no
/// terminal (logs, Slurm).
const LINE_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    epochs: usize,
    name: String,
    /// The first step is done.
    started: bool,
    /// The start-up phase's ticker, then (on CUDA) the watcher of later compilation.
    ticker: Option<Ticker>,
    /// Kernels are compiled at run time (CUDA): watch for them after start-up too.
    watch: bool,
    total_steps: u64,
    /// `run.warmup_steps`: left out of an epoch's ms/iter, as out of the run's.
    warmup_steps: u64,
    /// Without a terminal (a Slurm log, `nohup`): a step line every `STEP_LINE_EVERY`.
    step_lines: Option<StepLines>,
    /// The bar's last steps' times, for its ms/iter (one step's time jumps about).
    recent_ms: std::collections::VecDeque<f64>,
    /// The steps of the epoch under way, for its line.
    epoch: crate::metrics::EpochTally,
}

/// The bar's ms/iter is the median of this many last steps.
const RECENT_STEPS: usize = 20;

/// The bar's template and prefix for a terminal of `cols` columns: the message (epoch,
/// loss, ms/iter) in full where it fits, the run's name in what is left (its end, where a
/// grid cell's name holds the values that tell it from the others), and on a narrow
/// terminal the count and message alone, so that the bar keeps to one line (it wrapped at
/// 80 columns, every redraw a line more; a fixed-width name left the message no room).
fn bar_layout(name: &str, cols: usize) -> (&'static str, String) {
    // ` [` + 12 + `] ` + `9999/9999` + ` eta 10m` + two spaces, and the message.
    const FIXED: usize = 2 + 12 + 2 + 9 + 8 + 2;
    const MESSAGE: usize = 38;
    let room = cols.saturating_sub(FIXED + MESSAGE + 1);
    if cols < FIXED + 24 {
        return ("{pos}/{len}  {wide_msg}", String::new());
    }
    let prefix = if crate::columns::width(name) <= room {
        name.to_string()
    } else if room >= 8 {
        crate::columns::tail(name, room)
    } else {
        String::new()
    };
    let template = if prefix.is_empty() {
        "[{bar:12}] {pos}/{len} eta {eta}  {wide_msg}"
    } else {
        "{prefix} [{bar:12}] {pos}/{len} eta {eta}  {wide_msg}"
    };
    (template, prefix)
}

/// Columns of the terminal on stderr (80 where it does not say).
fn terminal_columns() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize; a failure leaves it zeroed.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

/// Without a terminal there is no bar: a line every this long says where training is
/// (only the epoch lines did, and a long epoch looked hung in a Slurm log).
const STEP_LINE_EVERY: Duration = Duration::from_secs(30);

/// When the last step line was written, and the first step seen (for the rate).
struct StepLines {
    last: std::time::Instant,
    from: Option<(std::time::Instant, u64)>,
}

/// `name: step 120/500 (epoch 2/5), loss 0.4213, 13.2 ms/iter, 1m20s left`: the time
/// left from the rate since `steps` steps took `elapsed`.
fn step_line(
    name: &str,
    r: &StepRecord,
    (total, epochs): (u64, usize),
    (elapsed, steps): (Duration, u64),
) -> String {
    let left = match steps {
        0 => String::new(),
        n => {
            let per_step = elapsed.as_secs_f64() / n as f64;
            let s = (per_step * total.saturating_sub(r.step) as f64).round() as u64;
            let t = match s {
                s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
                s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
                s => format!("{s}s"),
            };
            format!(", {t} left")
        }
    };
    format!(
        "{name}: step {}/{total} (epoch {}/{epochs}), loss {:.4}, {:.1} ms/iter{left}",
        r.step,
        r.epoch + 1,
        r.loss,
        r.iter_ms
    )
}

/// The ticker: during the start-up phase it updates the bar's message (terminal) or prints
/// a line every `LINE_EVERY` (no terminal) until the first step is done. After it,
/// on a device that compiles kernels, it watches for new ones: a new shape later in a run
/// (an epoch's shorter last batch, text of a new length) stops training while CubeCL
/// compiles and tunes, and the display says so instead of looking hung.
struct Ticker {
    shared: Arc<(Mutex<Phase>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

struct Phase {
    what: String,
    /// The first step is done: watching for later compilation.
    started: bool,
    stop: bool,
}

/// How often the ticker looks.
const TICK: Duration = Duration::from_millis(250);
/// On a terminal, a burst of compilation shows once it has lasted this long.
const BURST_SHOWN_AFTER: Duration = Duration::from_secs(1);
/// A burst ends after this long without a kernel compiled, loaded or tuned: CubeCL counts
/// a kernel as it starts compiling it, and one can take seconds.
const BURST_QUIET: Duration = Duration::from_secs(5);

/// How often the ticker writes a line without a terminal, and how long a quiet spell
/// ends a burst of compilation.
#[derive(Clone, Copy)]
struct Pace {
    every: Duration,
    quiet: Duration,
}

const PACE: Pace = Pace {
    every: LINE_EVERY,
    quiet: BURST_QUIET,
};

/// `<name>: starting, 12 s: first step (compiling and tuning kernels for the GPU); 40
/// kernels compiled, ...`
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

/// Kernels compiled, loaded or tuned between two readings (the autotune results a cache
/// file holds are read at once and are no sign of work).
fn compiling(before: KernelCounts, now: KernelCounts) -> bool {
    (now.compiled, now.from_cache, now.tuned) != (before.compiled, before.from_cache, before.tuned)
}

/// A burst of compilation after start-up: when it began and the counts then.
struct Burst {
    since: Instant,
    at: KernelCounts,
    /// The last tick that saw the counts move.
    last: Instant,
    /// A line about it was shown (so its end gets one too).
    shown: bool,
}

fn burst_line(name: &str, b: &Burst, now: KernelCounts, cache: &Option<PathBuf>) -> String {
    let mut s = format!(
        "{name}: a new shape, compiling and tuning its kernels, {} s: {}",
        b.since.elapsed().as_secs(),
        now.since(b.at).describe()
    );
    if let Some(dir) = cache {
        s += &format!(" (cached in {} for next time)", dir.display());
    }
    s
}

/// Where the ticker's lines go.
enum Out {
    Bar(ProgressBar),
    Stderr,
    #[cfg(test)]
    Captured(Arc<Mutex<Vec<String>>>),
}

impl Out {
    /// A status: the bar's message on a terminal, else a line.
    fn status(&self, line: String) {
        match self {
            Out::Bar(b) => b.set_message(line),
            _ => self.line(line),
        }
    }

    /// A line of its own.
    fn line(&self, line: String) {
        match self {
            Out::Bar(b) => b.println(line),
            Out::Stderr => crate::errln!("{line}"),
            #[cfg(test)]
            Out::Captured(v) => v.lock().unwrap().push(line),
        }
    }
}

/// The ticker thread's state between ticks.
struct Looker {
    name: String,
    cache: Option<PathBuf>,
    out: Out,
    pace: Pace,
    printed: Instant,
    prev: KernelCounts,
    burst: Option<Burst>,
}

impl Looker {
    /// Whether a status is due: on a terminal after `on_terminal`, else after `every`.
    fn due(&mut self, on_terminal: Duration) -> bool {
        let after = match self.out {
            Out::Bar(_) => on_terminal,
            _ => self.pace.every,
        };
        let due = self.printed.elapsed() >= after;
        if due {
            self.printed = Instant::now();
        }
        due
    }

    fn tick(&mut self, phase: &Phase) {
        let now = kernels::counts_live();
        let before = std::mem::replace(&mut self.prev, now);
        if !phase.started {
            if self.due(Duration::ZERO) {
                let line = startup_line(&self.name, &phase.what, now, &self.cache);
                self.out.status(line);
            }
            return;
        }
        let active = compiling(before, now);
        let Some(mut b) = self.burst.take() else {
            if active {
                self.printed = Instant::now();
                self.burst = Some(Burst {
                    since: Instant::now() - TICK,
                    at: before,
                    last: Instant::now(),
                    shown: false,
                });
            }
            return;
        };
        // Quiet long enough: the burst ended at its last change.
        if !active && b.last.elapsed() >= self.pace.quiet {
            if b.shown {
                self.out.line(format!(
                    "{}: the new shape's kernels are ready after {:.0} s ({})",
                    self.name,
                    (b.last - b.since).as_secs_f64(),
                    now.since(b.at).describe()
                ));
            }
            return;
        }
        if active {
            b.last = Instant::now();
        }
        if self.due(BURST_SHOWN_AFTER) {
            b.shown = true;
            self.out
                .status(burst_line(&self.name, &b, now, &self.cache));
        }
        self.burst = Some(b);
    }
}

impl Ticker {
    fn start(name: String, out: Out, cache: Option<PathBuf>, pace: Pace) -> Self {
        let shared = Arc::new((
            Mutex::new(Phase {
                what: "loading data".into(),
                started: false,
                stop: false,
            }),
            Condvar::new(),
        ));
        let state = Arc::clone(&shared);
        let mut looker = Looker {
            name,
            cache,
            out,
            pace,
            printed: Instant::now(),
            prev: kernels::counts_live(),
            burst: None,
        };
        let thread = std::thread::Builder::new()
            .name("runner-progress".into())
            .spawn(move || {
                let (lock, cv) = &*state;
                let mut phase = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let (p, _) = cv
                        .wait_timeout(phase, TICK)
                        .unwrap_or_else(|p| p.into_inner());
                    phase = p;
                    if phase.stop {
                        return;
                    }
                    looker.tick(&phase);
                }
            })
            .ok();
        Self { shared, thread }
    }

    fn phase(&self, what: &str) {
        let mut p = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
        p.what = what.into();
    }

    /// The first step is done: the ticker goes on watching (`watch`) or stops.
    fn started(self, watch: bool) -> Option<Self> {
        if !watch {
            self.stop();
            return None;
        }
        self.shared
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .started = true;
        Some(self)
    }

    fn stop(mut self) {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Progress {
    /// Starts the display, in its start-up phase (`cache`: where kernels are cached, for
    /// the lines that say so; `None` on the CPU).
    pub fn new(plan: &Plan, quiet: bool, cache: Option<PathBuf>) -> Self {
        // A bar where indicatif draws one: on a terminal, not a dumb one (TERM=dumb or
        // unset: Emacs' shell, some CI terminals), where it draws nothing and every line
        // sent through it was lost; there the lines are printed as into a file.
        let target = ProgressDrawTarget::stderr_with_hz(4);
        let show_bar = !quiet
            && plan.log.progress
            && std::io::IsTerminal::is_terminal(&std::io::stderr())
            && !target.is_hidden();
        let bar = show_bar.then(|| {
            let b = ProgressBar::with_draw_target(Some(plan.run.total_steps), target);
            let (template, prefix) = bar_layout(&plan.name, terminal_columns());
            b.set_style(
                // The message last, cut to what the terminal has left of its width.
                ProgressStyle::with_template(template)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_prefix(prefix);
            b
        });
        let watch = cache.is_some();
        let ticker = (!quiet).then(|| {
            let out = bar.clone().map_or(Out::Stderr, Out::Bar);
            Ticker::start(plan.name.clone(), out, cache, PACE)
        });
        let step_lines = (bar.is_none() && !quiet && plan.log.progress).then(|| StepLines {
            last: std::time::Instant::now(),
            from: None,
        });
        Self {
            bar,
            quiet,
            // Those the run reaches: `run.max_steps` can end it sooner.
            epochs: plan.run.epochs_reached(),
            name: plan.name.clone(),
            ticker,
            watch,
            started: false,
            total_steps: plan.run.total_steps,
            warmup_steps: plan.run.warmup_steps,
            step_lines,
            recent_ms: Default::default(),
            epoch: Default::default(),
        }
    }

    /// What the start-up phase is doing now (`building the model`, `first step`...).
    pub fn phase(&self, what: &str) {
        if let Some(t) = self.ticker.as_ref().filter(|_| !self.started) {
            t.phase(what);
        }
    }

    /// Ends the start-up phase with one line: how long it took and what was compiled.
    pub fn first_step_done(&mut self, startup_s: f64, counts: KernelCounts) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let Some(t) = self.ticker.take() else {
            return;
        };
        self.ticker = t.started(self.watch);
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

    /// The steps a resumed run kept of the epoch it goes on with, for that epoch's line.
    pub fn continue_epoch(&mut self, steps: crate::metrics::EpochTally) {
        self.epoch = steps;
    }

    pub fn step(&mut self, r: &StepRecord) {
        self.epoch.take(r, self.warmup_steps);
        if let Some(l) = &mut self.step_lines {
            let now = std::time::Instant::now();
            let (t0, s0) = *l.from.get_or_insert((now, r.step));
            if now.duration_since(l.last) >= STEP_LINE_EVERY {
                l.last = now;
                let line = step_line(
                    &self.name,
                    r,
                    (self.total_steps, self.epochs),
                    (now.duration_since(t0), r.step - s0),
                );
                self.line(line);
            }
        }
        if let Some(b) = &self.bar {
            if self.recent_ms.len() == RECENT_STEPS {
                self.recent_ms.pop_front();
            }
            self.recent_ms.push_back(r.iter_ms);
            let recent: Vec<f64> = self.recent_ms.iter().copied().collect();
            b.set_position(r.step);
            b.set_message(format!(
                "epoch {}/{} loss {:.4} {:.1} ms/iter",
                r.epoch + 1,
                self.epochs,
                r.loss,
                Stats::of(&recent).median
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
            None => crate::errln!("{s}"),
        }
    }

    /// The epoch's line, from its steps and its last step's if that one's line is still
    /// `held` (for the checkpoint at the epoch's end).
    /// `cut_short`: what ended the run inside this epoch (`run.max_steps`, early stopping).
    pub fn epoch_end(&mut self, epoch: usize, held: Option<&StepRecord>, cut_short: Option<&str>) {
        let mut this = match self.epoch.epoch == epoch {
            true => std::mem::replace(&mut self.epoch, crate::metrics::EpochTally::new(epoch + 1)),
            false => crate::metrics::EpochTally::new(epoch),
        };
        if let Some(r) = held.filter(|r| r.epoch == epoch) {
            this.push(r, self.warmup_steps);
        }
        if this.steps == 0 {
            return;
        }
        let loss = this.mean_loss();
        // The steps the run's ms/iter counts; an epoch of warm-up steps only, those, said.
        let (median, warm_only) = this.median_ms();
        let warm = if warm_only { " (warm-up steps)" } else { "" };
        self.line(format!(
            "epoch {}/{}: {} step{}{}, mean loss {loss:.4}, median {median:.1} ms/iter{warm}",
            epoch + 1,
            self.epochs,
            this.steps,
            if this.steps == 1 { "" } else { "s" },
            match cut_short {
                Some(by) => format!(" (cut short by {by})"),
                None => String::new(),
            },
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
        if let Some(t) = self.ticker.take() {
            t.stop();
        }
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_cut_to_the_bar_s_room_in_columns() {
        // 100 columns leave 100 - 35 - 38 - 1 = 26 for the name.
        let (_, p) = bar_layout("ベースライン/optim.lr=0.1,loader.workers=4", 100);
        assert!(p.starts_with('…') && p.ends_with("workers=4"), "{p}");
        assert!(crate::columns::width(&p) <= 26, "{p}");
        let (_, p) = bar_layout("ベースラインとその他の設定の長い名前", 100);
        // The `…` and 12 wide chars: a 13th would take 27 columns.
        assert_eq!(crate::columns::width(&p), 25, "{p}");
        let (_, p) = bar_layout("short", 100);
        assert_eq!(p, "short");
    }

    #[test]
    fn a_step_line_says_where_training_is_and_the_time_left() {
        let r = StepRecord {
            step: 120,
            epoch: 1,
            loss: 0.42131,
            iter_ms: 13.24,
            ..Default::default()
        };
        // 100 steps in 20 s: 380 left take 76 s.
        let line = step_line("q", &r, (500, 5), (Duration::from_secs(20), 100));
        assert_eq!(
            line,
            "q: step 120/500 (epoch 2/5), loss 0.4213, 13.2 ms/iter, 1m16s left"
        );
        let hours = step_line("q", &r, (100_120, 5), (Duration::from_secs(1), 1));
        assert!(hours.ends_with(", 27h46m left"), "{hours}");
        let none = step_line("q", &r, (500, 5), (Duration::ZERO, 0));
        assert!(none.ends_with("13.2 ms/iter"), "{none}");
    }

    /// A ticker whose lines are kept, past its start-up: a line at most every 300 ms, a
    /// burst over after 1.5 s without a kernel.
    fn captured(watch_after_start: bool) -> (Option<Ticker>, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = Out::Captured(Arc::clone(&lines));
        let cache = Some(PathBuf::from("/kc"));
        let pace = Pace {
            every: Duration::from_millis(300),
            quiet: Duration::from_millis(1500),
        };
        let t = Ticker::start("r".into(), out, cache, pace);
        std::thread::sleep(Duration::from_millis(700));
        (t.started(watch_after_start), lines)
    }

    /// Kernels compiled for `ms`, one every `every` ms, as CubeCL reports them.
    fn compile_for(ms: u64, every: u64) {
        for _ in 0..ms / every {
            kernels::observe(log::Level::Trace, "Compiling kernel");
            std::thread::sleep(Duration::from_millis(every));
        }
    }

    /// One test, so no other test of this module reports kernels meanwhile (the counters
    /// are the process's).
    #[test]
    fn a_new_shape_after_start_up_is_shown_while_it_compiles_and_when_done() {
        // Without run-time kernels (the CPU) nothing is watched after start-up.
        let (t, lines) = captured(false);
        assert!(t.is_none(), "the ticker stopped at the first step");
        let before = lines.lock().unwrap().len();
        compile_for(1000, 50);
        assert_eq!(lines.lock().unwrap().len(), before);

        let (t, lines) = captured(true);
        // Kernels that take 600 ms each (longer than a tick, shorter than the quiet spell
        // that ends a burst): one burst, one line at its end.
        compile_for(3000, 600);
        std::thread::sleep(Duration::from_millis(2500));
        t.expect("watching").stop();
        let lines = lines.lock().unwrap().clone();
        assert!(lines[0].starts_with("r: starting, "), "{lines:?}");
        let during = lines
            .iter()
            .position(|l| l.starts_with("r: a new shape, compiling and tuning its kernels, "))
            .unwrap_or_else(|| panic!("no line during the burst: {lines:?}"));
        assert!(lines[during].ends_with("(cached in /kc for next time)"));
        let ready: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("r: the new shape's kernels are ready after "))
            .collect();
        assert_eq!(ready.len(), 1, "one burst, one end: {lines:?}");
        assert!(ready[0] > during);
    }
}
