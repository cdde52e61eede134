//! The metrics schema and its files. `StepRecord` is the one schema of a `metrics.jsonl`
//! line (CSV is generated from the same struct, so the two cannot drift); `Summary` is
//! `summary.json`. Writers open their file before the first step and flush every record,
//! so a crash leaves whole lines. No Burn types here.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What CubeCL compiled and tuned so far in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelCounts {
    /// Kernels compiled by NVRTC (cache misses).
    pub compiled: u64,
    /// Kernels loaded from the compiled-kernel cache (hits).
    pub from_cache: u64,
    /// Shapes the autotuner benchmarked (misses of the autotune cache).
    pub tuned: u64,
    /// Autotune results loaded from the cache file.
    pub tune_results_loaded: u64,
    /// Wall-clock milliseconds during which any of those tunings was under way (compiling
    /// and timing candidate kernels), from CubeCL's lines at the start and end of each; a
    /// tuning whose end line never came makes it err low.
    #[serde(default)]
    pub tune_ms: u64,
}

impl KernelCounts {
    pub fn since(self, before: KernelCounts) -> KernelCounts {
        KernelCounts {
            compiled: self.compiled - before.compiled,
            from_cache: self.from_cache - before.from_cache,
            tuned: self.tuned - before.tuned,
            tune_results_loaded: self.tune_results_loaded - before.tune_results_loaded,
            tune_ms: self.tune_ms - before.tune_ms,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == KernelCounts::default()
    }

    /// `12 kernels compiled, 30 from the cache, 4 shapes tuned in 9.8 s`.
    pub fn describe(&self) -> String {
        let took = if self.tune_ms > 0 {
            format!(" in {:.1} s", self.tune_ms as f64 / 1e3)
        } else {
            String::new()
        };
        format!(
            "{} kernels compiled, {} from the cache, {} shapes tuned{took}",
            self.compiled, self.from_cache, self.tuned
        )
    }
}

/// JSON has no NaN: serde_json writes non-finite floats as `null`; read them back as NaN.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One optimizer step. Times are host wall-clock milliseconds; in a `synced` step each
/// phase ends with a device sync, so its time is the device's too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// 1-based optimizer step.
    pub step: u64,
    /// 0-based epoch.
    pub epoch: usize,
    /// When the step ended, milliseconds since the run started.
    pub t_ms: f64,
    /// Training loss over the step's samples (its micro-batches' weighted by their size);
    /// `null` when it was not a number (a diverged step).
    #[serde(deserialize_with = "nan_from_null")]
    pub loss: f64,
    /// Learning rate used for this step.
    pub lr: f64,
    /// Samples in the step (all micro-batches).
    pub samples: usize,
    /// Micro-batches in the step (`accumulation_steps`, fewer at an epoch's end).
    pub micro_batches: usize,
    /// Inside the `[profile] steps` window: every phase below ended with a device sync.
    pub synced: bool,
    /// Among the first `run.warmup_steps` steps of a resumed process (its kernels loaded
    /// or compiled again, its caches cold): left out of the timing, as the run's own first
    /// steps are. (A resume's first steps were timed: 40 ms among steps of 20 on the CPU,
    /// seconds of compiling on a GPU.)
    #[serde(default)]
    pub rewarm: bool,
    /// Whole step: from asking for its first batch to the end of its logging.
    pub iter_ms: f64,
    /// Waiting for the loader (or, with no workers, building the batch).
    pub data_wait_ms: f64,
    /// Creating device tensors from the host batch (the host-to-device copy).
    pub h2d_ms: f64,
    /// Forward, loss and backward of every micro-batch.
    pub forward_backward_ms: f64,
    /// The optimizer update.
    pub optimizer_ms: f64,
    /// The cleanup actions run after this step (0 when none was due).
    pub cleanup_ms: f64,
    /// Writing a checkpoint after this step (0 when none was due; one written at an
    /// epoch's end, after its evaluation, is in the summary only).
    #[serde(default)]
    pub checkpoint_ms: f64,
    /// Reading losses back from the device and writing metrics lines (0 when not due).
    pub log_ms: f64,
    /// Asking the device's memory pool for the `mem_*` figures (and for the memory around
    /// a cleanup): on CUDA a round trip to CubeCL's device thread (after fusion launches
    /// what it still queues), on the CPU nothing.
    #[serde(default)]
    pub mem_query_ms: f64,
    /// `samples / iter_ms`.
    pub samples_per_s: f64,
    /// Device memory in use / reserved by the backend's pool, where the backend reports it.
    pub mem_in_use_bytes: Option<u64>,
    pub mem_reserved_bytes: Option<u64>,
    /// Resident memory of this process.
    pub rss_bytes: Option<u64>,
    /// Memory just before and after this step's cleanup (the pool's reserved bytes on
    /// CUDA, the process's resident bytes on the CPU): what the cleanup freed.
    pub cleanup_mem_before_bytes: Option<u64>,
    pub cleanup_mem_after_bytes: Option<u64>,
    /// Sampler readings during the step (see `sampler`): GPU utilisation, device memory
    /// used (all processes), SM clock and power from NVML; CPU utilisation from /proc.
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub cpu_util_pct: Option<f64>,
    /// Text: tokens in the step's batches, and all positions of their padded rows.
    pub real_tokens: Option<u64>,
    pub padded_tokens: Option<u64>,
    /// Text: `(padded - real) / padded`, percent.
    pub pad_waste_pct: Option<f64>,
    /// Text: real and padded tokens per second of the step.
    pub real_tokens_per_s: Option<f64>,
    pub padded_tokens_per_s: Option<f64>,
}

impl StepRecord {
    /// The CSV header: the field names, in order (as in JSON).
    pub fn csv_header() -> String {
        let mut w = csv::Writer::from_writer(vec![]);
        w.serialize(StepRecord::default())
            .expect("a flat record serialises into memory");
        let text = String::from_utf8(w.into_inner().expect("in memory")).expect("UTF-8");
        text.lines().next().unwrap_or_default().to_string()
    }

    /// The record as one CSV row (the `csv` crate), field for field as in JSON; a missing
    /// value is an empty field, a diverged loss `NaN`.
    pub fn csv_row(&self) -> String {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(vec![]);
        w.serialize(self)
            .expect("a flat record serialises into memory");
        let text = String::from_utf8(w.into_inner().expect("in memory")).expect("UTF-8");
        text.trim_end_matches('\n').to_string()
    }
}

/// Order statistics of a set of times. Of no values, every figure is NaN, written `null`
/// (it was 0.0: a run of no timed step read as one of 0 ms/iter to any tool but ours).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: usize,
    #[serde(deserialize_with = "nan_from_null")]
    pub median: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub mean: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub p95: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub min: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub max: f64,
    /// Standard deviation (sample, n-1).
    #[serde(deserialize_with = "nan_from_null")]
    pub std: f64,
}

impl Stats {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self {
                count: 0,
                median: f64::NAN,
                mean: f64::NAN,
                p95: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                std: f64::NAN,
            };
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Self {
            count: n,
            median: quantile(&v, 0.5),
            mean,
            p95: quantile(&v, 0.95),
            min: v[0],
            max: v[n - 1],
            std: var.sqrt(),
        }
    }
}

/// Linear interpolation between closest ranks (numpy's default) on sorted data.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// One evaluation on the test set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub epoch: usize,
    pub step: u64,
    pub samples: usize,
    pub accuracy: f64,
    /// `null` when not a number (a diverged model).
    #[serde(deserialize_with = "nan_from_null")]
    pub loss: f64,
    pub ms: f64,
}

/// Per-phase medians over a set of steps, milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    pub steps: usize,
    pub data_wait_ms: f64,
    pub h2d_ms: f64,
    pub forward_backward_ms: f64,
    pub optimizer_ms: f64,
    pub cleanup_ms: f64,
    pub log_ms: f64,
    #[serde(default)]
    pub mem_query_ms: f64,
    /// What the step spent outside the phases above (bookkeeping, scheduling): the
    /// median of each step's rest, so the medians above and this one need not add up to
    /// `iter_ms`'s. A checkpoint is not in the step (`iter_ms`), nor taken from it here.
    pub other_ms: f64,
    pub iter_ms: f64,
}

impl Phases {
    pub fn of(steps: &[&StepRecord]) -> Option<Self> {
        let mut c = Columns::default();
        steps.iter().for_each(|r| c.push(r));
        c.phases()
    }
}

/// A set of steps' times, a column each: what their medians need, and no more (a step
/// record is ~360 bytes; these are 64).
#[derive(Debug, Clone, Default)]
struct Columns {
    iter_ms: Vec<f64>,
    data_wait_ms: Vec<f64>,
    h2d_ms: Vec<f64>,
    forward_backward_ms: Vec<f64>,
    optimizer_ms: Vec<f64>,
    cleanup_ms: Vec<f64>,
    log_ms: Vec<f64>,
    mem_query_ms: Vec<f64>,
}

impl Columns {
    fn push(&mut self, r: &StepRecord) {
        self.iter_ms.push(r.iter_ms);
        self.data_wait_ms.push(r.data_wait_ms);
        self.h2d_ms.push(r.h2d_ms);
        self.forward_backward_ms.push(r.forward_backward_ms);
        self.optimizer_ms.push(r.optimizer_ms);
        self.cleanup_ms.push(r.cleanup_ms);
        self.log_ms.push(r.log_ms);
        self.mem_query_ms.push(r.mem_query_ms);
    }

    fn phases(&self) -> Option<Phases> {
        if self.iter_ms.is_empty() {
            return None;
        }
        let med = |v: &[f64]| Stats::of(v).median;
        let other: Vec<f64> = (0..self.iter_ms.len())
            .map(|i| {
                self.iter_ms[i]
                    - self.data_wait_ms[i]
                    - self.h2d_ms[i]
                    - self.forward_backward_ms[i]
                    - self.optimizer_ms[i]
                    - self.cleanup_ms[i]
                    - self.log_ms[i]
                    - self.mem_query_ms[i]
            })
            .collect();
        Some(Phases {
            steps: self.iter_ms.len(),
            data_wait_ms: med(&self.data_wait_ms),
            h2d_ms: med(&self.h2d_ms),
            forward_backward_ms: med(&self.forward_backward_ms),
            optimizer_ms: med(&self.optimizer_ms),
            cleanup_ms: med(&self.cleanup_ms),
            log_ms: med(&self.log_ms),
            mem_query_ms: med(&self.mem_query_ms),
            other_ms: med(&other),
            iter_ms: med(&self.iter_ms),
        })
    }
}

/// A sum as `Iterator::sum` makes it (from -0.0, in order), a value at a time.
#[derive(Debug, Clone, Copy)]
struct Sum(f64);

impl Default for Sum {
    fn default() -> Self {
        Sum(-0.0)
    }
}

/// A mean of the values given, a value at a time; none of none.
#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    sum: Sum,
    n: usize,
}

impl Mean {
    fn add(&mut self, x: Option<f64>) {
        if let Some(x) = x {
            self.sum.0 += x;
            self.n += 1;
        }
    }
    fn get(self) -> Option<f64> {
        (self.n > 0).then(|| self.sum.0 / self.n as f64)
    }
}

/// A saturating count of the values given; none of none.
fn add_count(total: &mut Option<u64>, x: Option<u64>) {
    if let Some(x) = x {
        *total = Some(total.unwrap_or(0).saturating_add(x));
    }
}

/// What the timed figures take from a set of steps.
#[derive(Debug, Clone, Default)]
struct Timed {
    steps: usize,
    columns: Columns,
    samples: usize,
    real_tokens: Option<u64>,
    padded_tokens: Option<u64>,
    gpu_util_pct: Mean,
    cpu_util_pct: Mean,
    sm_clock_mhz: Mean,
    power_w: Mean,
}

impl Timed {
    fn push(&mut self, r: &StepRecord, times: bool) {
        self.steps += 1;
        if times {
            self.columns.push(r);
        }
        self.samples = self.samples.saturating_add(r.samples);
        add_count(&mut self.real_tokens, r.real_tokens);
        add_count(&mut self.padded_tokens, r.padded_tokens);
        self.gpu_util_pct.add(r.gpu_util_pct);
        self.cpu_util_pct.add(r.cpu_util_pct);
        self.sm_clock_mhz.add(r.sm_clock_mhz);
        self.power_w.add(r.power_w);
    }
}

/// A run's figures from its steps, taken one at a time (from `metrics.jsonl` a line at a
/// time: [`Tally::read`]), without keeping them: the run kept every step's record to the
/// end (a million steps: 500 MB, which its own `rss_bytes` then counted as the run's
/// memory), and `report` every run's. What a step adds is its times (64 bytes) where it
/// is timed, for the exact medians; [`Summary::absorb`] is this over a slice. One made
/// [`Tally::counting`] keeps no times: its medians are of no step.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Whether the timed steps' times are kept.
    times: bool,
    warmup_steps: u64,
    steps: u64,
    samples: u64,
    final_loss: Option<f64>,
    cleanup_ms_total: Sum,
    data_wait_ms_total: Sum,
    freed: Option<u64>,
    peak_mem_in_use_bytes: Option<u64>,
    peak_mem_reserved_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
    real_tokens: Option<u64>,
    padded_tokens: Option<u64>,
    /// The steps after the warm-up (the run's first `warmup_steps`, and a resumed
    /// process's own, `rewarm`), outside the profile window and in it: the steps whose
    /// time counts are the first (the window's are synced, so slower), or where there are
    /// none, the second.
    unsynced: Timed,
    synced_after: Timed,
    /// Every step in the profile window, warm-up steps too.
    synced: Columns,
}

impl Tally {
    pub fn new(warmup_steps: u64) -> Self {
        Tally {
            times: true,
            warmup_steps,
            ..Default::default()
        }
    }

    /// A tally without the steps' times: its counts, sums, peaks and means only.
    pub fn counting(warmup_steps: u64) -> Self {
        Tally {
            times: false,
            ..Tally::new(warmup_steps)
        }
    }

    /// The tally of a `metrics.jsonl`, read a line at a time.
    pub fn read(path: &Path, warmup_steps: u64) -> Result<Self, Each> {
        let mut tally = Tally::new(warmup_steps);
        JsonLines::each::<StepRecord>(path, |r, _, _| {
            tally.push(&r);
            true
        })?;
        Ok(tally)
    }

    pub fn push(&mut self, r: &StepRecord) {
        self.steps += 1;
        // Saturating sums: a hand-edited line's huge count wrapped around in silence.
        self.samples = self.samples.saturating_add(r.samples as u64);
        self.final_loss = Some(r.loss);
        self.cleanup_ms_total.0 += r.cleanup_ms;
        self.data_wait_ms_total.0 += r.data_wait_ms;
        if let (Some(before), Some(after)) = (r.cleanup_mem_before_bytes, r.cleanup_mem_after_bytes)
        {
            add_count(&mut self.freed, Some(before.saturating_sub(after)));
        }
        self.peak_mem_in_use_bytes = self.peak_mem_in_use_bytes.max(r.mem_in_use_bytes);
        self.peak_mem_reserved_bytes = self.peak_mem_reserved_bytes.max(r.mem_reserved_bytes);
        self.peak_rss_bytes = self.peak_rss_bytes.max(r.rss_bytes);
        add_count(&mut self.real_tokens, r.real_tokens);
        add_count(&mut self.padded_tokens, r.padded_tokens);
        if r.synced && self.times {
            self.synced.push(r);
        }
        if r.step > self.warmup_steps && !r.rewarm {
            match r.synced {
                false => self.unsynced.push(r, self.times),
                true => self.synced_after.push(r, self.times),
            }
        }
    }

    /// The steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Into `summary`: its step figures, as [`Summary::absorb`] documents them.
    pub fn fill(&self, summary: &mut Summary) {
        let s = summary;
        s.warmup_steps = self.warmup_steps;
        s.steps = self.steps;
        s.samples = self.samples;
        s.final_loss = self.final_loss;
        let timed = match self.unsynced.steps {
            0 => &self.synced_after,
            _ => &self.unsynced,
        };
        let c = &timed.columns;
        s.iter_ms = Stats::of(&c.iter_ms);
        let total_ms: f64 = c.iter_ms.iter().sum();
        s.samples_per_s = if total_ms > 0.0 {
            timed.samples as f64 / (total_ms / 1e3)
        } else {
            f64::NAN
        };
        s.cleanup_ms_total = self.cleanup_ms_total.0;
        s.data_wait_ms_total = self.data_wait_ms_total.0;
        let pct = |v: &[f64]| {
            if total_ms > 0.0 {
                100.0 * v.iter().sum::<f64>() / total_ms
            } else {
                f64::NAN
            }
        };
        s.cleanup_pct = pct(&c.cleanup_ms);
        s.data_wait_pct = pct(&c.data_wait_ms);
        // The timed steps outside the window: none where the window holds them all.
        s.phases = self.unsynced.columns.phases();
        s.synced_phases = self.synced.phases();
        s.cleanup_freed_bytes = self.freed;
        s.peak_mem_in_use_bytes = self.peak_mem_in_use_bytes;
        s.peak_mem_reserved_bytes = self.peak_mem_reserved_bytes;
        s.peak_rss_bytes = self.peak_rss_bytes;
        s.real_tokens = self.real_tokens;
        s.padded_tokens = self.padded_tokens;
        s.pad_waste_pct = match (self.real_tokens, self.padded_tokens) {
            (Some(r), Some(p)) if p > 0 => Some(100.0 * p.saturating_sub(r) as f64 / p as f64),
            _ => None,
        };
        let per_s = |n: Option<u64>| {
            n.filter(|_| total_ms > 0.0)
                .map(|n| n as f64 / (total_ms / 1e3))
        };
        s.real_tokens_per_s = per_s(timed.real_tokens);
        s.padded_tokens_per_s = per_s(timed.padded_tokens);
        s.gpu_util_pct = timed.gpu_util_pct.get();
        s.cpu_util_pct = timed.cpu_util_pct.get();
        s.sm_clock_mhz = timed.sm_clock_mhz.get();
        s.power_w = timed.power_w.get();
    }
}

/// One epoch's line in the progress display, from its steps as they come: its steps,
/// their mean loss, and the median time of those the run's ms/iter counts.
#[derive(Debug, Clone, Default)]
pub struct EpochTally {
    pub epoch: usize,
    pub steps: usize,
    /// Each step's loss times its samples, summed from 0.0.
    loss: f64,
    samples: usize,
    unsynced: Vec<f64>,
    synced_after: Vec<f64>,
    warm: Vec<f64>,
}

impl EpochTally {
    pub fn new(epoch: usize) -> Self {
        EpochTally {
            epoch,
            ..Default::default()
        }
    }

    /// A step into the tally of its epoch: a later epoch's starts the tally over, an
    /// earlier one's is not taken (its line is out: its last step, held for the
    /// checkpoint at the epoch's end, is in it already).
    pub fn take(&mut self, r: &StepRecord, warmup_steps: u64) {
        if r.epoch > self.epoch {
            *self = EpochTally::new(r.epoch);
        }
        if r.epoch == self.epoch {
            self.push(r, warmup_steps);
        }
    }

    pub fn push(&mut self, r: &StepRecord, warmup_steps: u64) {
        self.steps += 1;
        self.loss += r.loss * r.samples as f64;
        self.samples += r.samples;
        let list = match (r.step > warmup_steps && !r.rewarm, r.synced) {
            (true, false) => &mut self.unsynced,
            (true, true) => &mut self.synced_after,
            (false, _) => &mut self.warm,
        };
        list.push(r.iter_ms);
    }

    /// Mean loss: a step's loss is the mean over its samples, so the mean of several
    /// steps' weighs each by them (a short last batch's 8 samples counted as much as a
    /// full step's 96).
    pub fn mean_loss(&self) -> f64 {
        self.loss / self.samples as f64
    }

    /// The median of the timed steps' times, and whether the epoch had none (only
    /// warm-up steps: then the median of all its steps).
    pub fn median_ms(&self) -> (f64, bool) {
        let warm_only = self.unsynced.is_empty() && self.synced_after.is_empty();
        let times = if !self.unsynced.is_empty() {
            &self.unsynced
        } else if !self.synced_after.is_empty() {
            &self.synced_after
        } else {
            &self.warm
        };
        (Stats::of(times).median, warm_only)
    }
}

/// How a run stands, as `summary.json` says it (in lower case).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Under way, or its process was killed outright (`Summary::process` tells which).
    #[default]
    Running,
    Completed,
    /// Stopped by an error (`Summary::error`).
    Failed,
    /// Stopped by SIGINT, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2 (`Summary::error` says which, and when).
    Interrupted,
}

impl RunStatus {
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of the process a `running` summary names.
#[derive(Debug, Clone, PartialEq)]
pub enum Process {
    /// On this host, still going.
    Alive(u32),
    /// On this host, gone: killed outright (kill -9, out of memory), or it could not write
    /// its summary at the end.
    Gone(u32),
    /// On another host: the pid cannot tell (`run.lock`'s heartbeat can).
    Elsewhere { host: String, pid: u32 },
    /// The summary names no process.
    Unknown,
}

/// In a run directory while a process writes it (a run, or its resume): the process's
/// host, pid and pid namespace, touched every 10 s (`sweep::CellLock`).
pub const RUN_LOCK: &str = "run.lock";

/// `summary.json`. Missing fields read as their defaults, so older summaries still load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub name: String,
    pub run_id: String,
    /// `pid` and `host` say which process to look for while it is `running`.
    pub status: RunStatus,
    pub pid: Option<u32>,
    /// When that process started (clock ticks after boot): a pid alone may be another
    /// process's by now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_started: Option<u64>,
    pub host: Option<String>,
    /// With `run.stop_on_divergence = false`: the first step whose loss diverged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diverged_at_step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub backend: String,
    pub device: String,
    pub steps: u64,
    pub epochs_completed: usize,
    pub samples: u64,
    /// Trainable parameters (BatchNorm running statistics excluded, as torchvision counts).
    pub parameters: usize,
    /// Steps left out of the timing statistics below.
    pub warmup_steps: u64,
    /// `iter_ms` over the timed steps (after warm-up).
    pub iter_ms: Stats,
    /// Timed samples over timed time (`null` without a timed step, as the two shares below).
    #[serde(deserialize_with = "nan_from_null")]
    pub samples_per_s: f64,
    /// Host-side phase medians over the timed steps outside the profile window.
    pub phases: Option<Phases>,
    /// Phase medians over the synced steps of `[profile] steps`: device times.
    pub synced_phases: Option<Phases>,
    pub data_wait_ms_total: f64,
    pub cleanup_ms_total: f64,
    /// Checkpoints written, and the time they took.
    pub checkpoints: usize,
    pub checkpoint_ms_total: f64,
    /// How often the run was resumed (`runner resume`).
    pub resumes: usize,
    /// Evaluations on the validation set (`data.validation`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub validations: Vec<EvalRecord>,
    /// The watched validation metric's best: step and value (`model-best.safetensors`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_value: Option<f64>,
    /// Early stopping ended the run after this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stopped_at_step: Option<u64>,
    /// Cleanup time as a share of the timed steps' time, in percent.
    #[serde(deserialize_with = "nan_from_null")]
    pub cleanup_pct: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub data_wait_pct: f64,
    /// Sum over cleanups of (memory before − memory after), bytes.
    pub cleanup_freed_bytes: Option<u64>,
    pub peak_mem_in_use_bytes: Option<u64>,
    pub peak_mem_reserved_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    /// The sampler: `nvml: <device>`, `proc`, `off` or `unavailable: <why>`.
    pub util_source: String,
    /// Means over the timed steps of the sampler's readings.
    pub gpu_util_pct: Option<f64>,
    pub cpu_util_pct: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    /// Text: totals over the run, padding waste, and token rates over the timed steps.
    pub real_tokens: Option<u64>,
    pub padded_tokens: Option<u64>,
    pub pad_waste_pct: Option<f64>,
    pub real_tokens_per_s: Option<f64>,
    pub padded_tokens_per_s: Option<f64>,
    pub final_loss: Option<f64>,
    pub test_accuracy: Option<f64>,
    pub evals: Vec<EvalRecord>,
    pub loader_workers_started: usize,
    pub wall_s: f64,
    /// Process start → the first step done on the device (data loading, model building,
    /// and on a GPU compiling and tuning its kernels), seconds; for a grid's later cells,
    /// run in the same process, from the cell's own start.
    pub startup_s: Option<f64>,
    /// The first step's own time, compilation and tuning included, ms.
    pub first_step_ms: Option<f64>,
    /// CUDA and WebGPU: what CubeCL compiled, took from the cache and tuned during the
    /// run, and how long the tuning took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelCounts>,
    /// `model.safetensors`'s SHA-256 as the run saved it: `runner eval` checks the file
    /// against it, and two runs' weights compare by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_sha256: Option<String>,
    /// `model-best.safetensors`'s, as last saved (`runner eval --best` checks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_weights_sha256: Option<String>,
    /// A text run's `tokenizer.json`'s, as the run wrote it: `runner eval` encodes the
    /// test text with that file, and checks it against this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer_sha256: Option<String>,
}

impl Summary {
    /// The summary of the run in `run_dir`, where it says the run completed.
    pub fn completed_in(run_dir: &Path) -> Option<Summary> {
        let text = crate::metrics::read_text(run_dir.join("summary.json")).ok()?;
        let s: Summary = serde_json::from_str(&text).ok()?;
        (s.status == RunStatus::Completed).then_some(s)
    }

    /// What became of the process this summary names (meaningful while `running`).
    pub fn process(&self) -> Process {
        match (self.pid, &self.host) {
            (Some(pid), Some(h)) if Some(h) == crate::clock::hostname().as_ref() => {
                if crate::clock::still_running(pid, self.pid_started) {
                    Process::Alive(pid)
                } else {
                    Process::Gone(pid)
                }
            }
            (Some(pid), Some(h)) => Process::Elsewhere {
                host: h.clone(),
                pid,
            },
            _ => Process::Unknown,
        }
    }

    /// Its figures in one line: steps, speed, test accuracy (what a completed run prints,
    /// and what a run whose summary cannot be written says on stderr instead).
    pub fn headline(&self) -> String {
        // No test set, or `run.eval = "never"`.
        let acc = self.test_accuracy.map_or("no test accuracy".into(), |a| {
            format!("test accuracy {:.2}%", 100.0 * a)
        });
        // No timed step (run.warmup_steps took them all): no speed to report.
        let speed = if self.iter_ms.count == 0 {
            "none timed (all within run.warmup_steps)".to_string()
        } else {
            format!(
                "median {:.2} ms/iter (p95 {:.2}), {:.0} samples/s",
                self.iter_ms.median, self.iter_ms.p95, self.samples_per_s
            )
        };
        let s = if self.steps == 1 { "" } else { "s" };
        // A run that went on past its divergence (`run.stop_on_divergence = false`) says
        // so where its figures are read.
        let diverged = self
            .diverged_at_step
            .map_or(String::new(), |d| format!(" (diverged at step {d})"));
        format!("{} step{s}{diverged}, {speed}, {acc}", self.steps)
    }

    /// Fills the statistics from the step records. Timed ones are those after warm-up and
    /// outside the profile window (whose device syncs slow them down), unless the window
    /// holds every step after warm-up. (A [`Tally`] of them: one that takes the steps as
    /// they come does the same without keeping them.)
    pub fn absorb(&mut self, records: &[StepRecord], warmup_steps: u64) {
        let mut tally = Tally::new(warmup_steps);
        records.iter().for_each(|r| tally.push(r));
        tally.fill(self);
    }
}

/// Reads the whole lines of a file, a line at a time, up to `most` of them or until
/// `go_on` returns `false` for one (given each line, its newline included); returns how
/// many lines it read and the byte after the last. A last line without its newline is
/// not one.
pub fn whole_lines(
    path: &Path,
    most: u64,
    mut go_on: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<(u64, u64)> {
    use std::io::BufRead as _;
    let file = open_regular(path, false)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let (mut line, mut n, mut end) = (vec![], 0u64, 0u64);
    while n < most {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read == 0 || line.last() != Some(&b'\n') || !go_on(&line) {
            break;
        }
        n += 1;
        end += read as u64;
    }
    Ok((n, end))
}

/// Why [`JsonLines::each`] stopped short.
#[derive(Debug)]
pub enum Each {
    Io(std::io::Error),
    /// The line (from 1) that is not a record, and why.
    Line(usize, serde_json::Error),
}

impl std::fmt::Display for Each {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Each::Io(e) => write!(f, "{e}"),
            Each::Line(n, e) => write!(f, "line {n}: {e}"),
        }
    }
}

/// An append-only JSON-lines file; every record is written whole and flushed.
pub struct JsonLines {
    file: File,
    path: PathBuf,
    /// Bytes of whole lines written: a failed write is cut back to this.
    len: u64,
    /// The device and inode of the folder it was opened in: a file removed with its
    /// folder is not written again into another folder made at that path.
    folder: Option<(u64, u64)>,
}

/// The device and inode of the folder holding `path`.
fn folder_of(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::metadata(parent).ok().map(|m| (m.dev(), m.ino()))
}

/// Held while a line is written to any [`JsonLines`], and for good by a process about to
/// exit at a second signal ([`stop_line_writes`]): the summary it writes counts the lines
/// on disk, and the training thread, going on meanwhile, wrote one more (a summary of 49
/// steps beside 50 lines).
static LINE_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held while one record is written to a run's files: a line of a [`JsonLines`], or a
/// TensorBoard event (`tensorboard::EventWriter`), so that none is written past a second
/// signal's summary.
pub(crate) fn writing() -> std::sync::MutexGuard<'static, ()> {
    LINE_WRITES.lock().unwrap_or_else(|e| e.into_inner())
}

/// No line is written to any [`JsonLines`] of this process from now on, nor a TensorBoard
/// event (one being written is finished first); a writer waits until the process exits. For the second signal's
/// exit only.
pub fn stop_line_writes() {
    std::mem::forget(LINE_WRITES.lock().unwrap_or_else(|e| e.into_inner()));
}

impl JsonLines {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: File::create(path)?,
            path: path.to_path_buf(),
            len: 0,
            folder: folder_of(path),
        })
    }

    /// Opens `path` for appending to what it holds.
    pub fn append(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
            folder: folder_of(path),
        })
    }

    /// The records of a JSON-lines file, read a line at a time (a long run's
    /// `metrics.jsonl` is hundreds of MB: it was read whole, and its records kept), taken
    /// as [`JsonLines::records`] takes them from text: blank lines skipped, and a partial
    /// last line too. `f` is given each record, with its line's number and the bytes up
    /// to its end, until it returns `false`. A line that is not a record is
    /// `Err(Line(number, why))`; one that is not UTF-8, an `InvalidData` error saying
    /// where.
    pub fn each<T: serde::de::DeserializeOwned>(
        path: &Path,
        mut f: impl FnMut(T, usize, u64) -> bool,
    ) -> Result<(), Each> {
        use std::io::BufRead as _;
        let file = open_regular(path, false).map_err(Each::Io)?;
        let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
        let (mut line, mut n, mut end) = (vec![], 0usize, 0u64);
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line).map_err(Each::Io)?;
            if read == 0 {
                return Ok(());
            }
            n += 1;
            end += read as u64;
            let text = std::str::from_utf8(&line).map_err(|e| {
                let column = 1 + String::from_utf8_lossy(&line[..e.valid_up_to()])
                    .chars()
                    .count();
                Each::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "line {n}, column {column} is not UTF-8 text (byte 0x{:02x})",
                        line[e.valid_up_to()]
                    ),
                ))
            })?;
            if text.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<T>(text) {
                Ok(r) => {
                    if !f(r, n, end) {
                        return Ok(());
                    }
                }
                // Only the last piece can lack its newline.
                Err(_) if !text.ends_with('\n') => return Ok(()),
                Err(e) => return Err(Each::Line(n, e)),
            }
        }
    }

    /// The records of a JSON-lines file's text, blank lines skipped, and a partial last
    /// line too (a process killed mid-write leaves at most that). The first line that is
    /// not a record comes back as its number (from 1) and why.
    pub fn records<T: serde::de::DeserializeOwned>(
        text: &str,
    ) -> Result<Vec<T>, (usize, serde_json::Error)> {
        let mut records = vec![];
        for (i, line) in text.split_inclusive('\n').enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<T>(line) {
                Ok(r) => records.push(r),
                // Only the last piece can lack its newline.
                Err(_) if !line.ends_with('\n') => {}
                Err(e) => return Err((i + 1, e)),
            }
        }
        Ok(records)
    }

    /// Keeps the first `keep` lines of `path` (a resumed run continues after them), gives
    /// each to `f` as it reads them (a line at a time: a long run's are hundreds of MB,
    /// which were read whole and kept), and opens the file to append. Fewer lines than
    /// `keep` is an error.
    pub fn reopen<T: serde::de::DeserializeOwned>(
        path: &Path,
        keep: u64,
        mut f: impl FnMut(T),
    ) -> std::io::Result<Self> {
        use std::io::BufRead as _;
        let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        let file = open_regular(path, false)?;
        let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
        let (mut line, mut n, mut end) = (vec![], 0u64, 0u64);
        while n < keep {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 {
                break;
            }
            let text = std::str::from_utf8(&line).map_err(|e| {
                bad(format!(
                    "line {}, column {} is not UTF-8 text (byte 0x{:02x})",
                    n + 1,
                    1 + String::from_utf8_lossy(&line[..e.valid_up_to()])
                        .chars()
                        .count(),
                    line[e.valid_up_to()]
                ))
            })?;
            let r = serde_json::from_str(text.trim_end())
                .map_err(|e| bad(format!("line {}: {e}", n + 1)))?;
            f(r);
            n += 1;
            end += read as u64;
        }
        if n < keep {
            return Err(bad(format!("has {n} lines, the checkpoint expects {keep}")));
        }
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(end)?;
        drop(file);
        Self::append(path)
    }

    /// Keeps the first `keep` lines of `path` as they are and opens it to append.
    pub fn reopen_raw(path: &Path, keep: u64) -> std::io::Result<Self> {
        let (_, end) = whole_lines(path, keep, |_| true)?;
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(end)?;
        drop(file);
        Self::append(path)
    }

    /// Appends one record as a line, flushed. A write that fails (a full disk) is undone,
    /// so the file never holds half a line, and later lines cannot follow a cut one.
    pub fn write<T: Serialize>(&mut self, record: &T) -> std::io::Result<()> {
        let line = serde_json::to_string(record).map_err(std::io::Error::other)?;
        self.write_line(line)
    }

    /// Appends one line of text (without its newline), as `write` does.
    pub fn write_line(&mut self, mut line: String) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let _writing = writing();
        self.keep_named()?;
        line.push('\n');
        match self
            .file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
        {
            Ok(()) => {
                self.len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
                Err(e)
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file, removed while it was written (a temp-folder cleaner, an `rm` of the
    /// wrong run, an editor's save over it), is written again where it was from the copy
    /// this process holds open, and the run writes on there: its lines went to a file no
    /// name led to, and the run called itself completed with none on disk. A file put in
    /// its place is moved aside first, not lost. One check per line (an `fstat`).
    #[cfg(target_os = "linux")]
    fn keep_named(&mut self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        if self.file.metadata()?.nlink() > 0 {
            return Ok(());
        }
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let fd = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        // "<where it was> (deleted)": the run directory's path now, were it moved.
        let link = std::fs::read_link(&fd)?.into_os_string().into_vec();
        let Some(was) = link.strip_suffix(b" (deleted)") else {
            return Ok(());
        };
        let was = PathBuf::from(std::ffi::OsStr::from_bytes(was));
        if self.folder.is_none() || folder_of(&was) != self.folder {
            // The whole folder is gone (or another made in its place): the run stops on
            // that (`RunDir::now`), and writes nothing into a folder that is not its own.
            return Ok(());
        }
        let mut aside = None;
        if was.symlink_metadata().is_ok() {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut to = PathBuf::from(format!("{}.replaced-{stamp}", was.display()));
            let mut n = 1;
            while to.symlink_metadata().is_ok() {
                n += 1;
                to = PathBuf::from(format!("{}.replaced-{stamp}-{n}", was.display()));
            }
            std::fs::rename(&was, &to)?;
            aside = Some(to);
        }
        let mut copy = File::open(&fd)?;
        let mut again = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&was)?;
        std::io::copy(&mut copy, &mut again)?;
        again.flush()?;
        let file = std::fs::OpenOptions::new().append(true).open(&was)?;
        self.len = file.metadata()?.len();
        self.file = file;
        self.path = was;
        crate::errln!(
            "warning: {} was removed while the run wrote it: written again from the run's own copy ({} bytes){}",
            self.path.display(),
            self.len,
            aside.map_or(String::new(), |a| format!(
                "; the file put in its place is now {}",
                a.display()
            ))
        );
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn keep_named(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `path` is marked immutable or append-only (`chattr +i` / `+a`): no rename may
/// replace it, whatever its permissions say. False where that cannot be asked.
pub fn immutable(path: &Path) -> bool {
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    {
        use std::os::fd::AsRawFd;
        // _IOR('f', 1, long); FS_IMMUTABLE_FL | FS_APPEND_FL.
        const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
        const FIXED: libc::c_long = 0x10 | 0x20;
        use std::os::unix::fs::OpenOptionsExt as _;
        // Without waiting: a named pipe in its place held the resume at this open.
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        else {
            return false;
        };
        let mut flags: libc::c_long = 0;
        // SAFETY: the ioctl writes one `long` through the pointer, which outlives the call.
        let ok = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) } == 0;
        ok && flags & FIXED != 0
    }
    #[cfg(not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )))]
    {
        let _ = path;
        false
    }
}

/// A text file read whole. One that is not UTF-8 is an error saying where (`not_utf8`):
/// "stream did not contain valid UTF-8" named no place.
pub fn read_utf8(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, not_utf8(&e)))
}

/// A file the runner wrote and reads back (a run's, a checkpoint's, a grid's), read only
/// where it is a file (or a folder, which the read then refuses as before): it is opened
/// without waiting, so a named pipe in its place (or a link to one, or to `/dev/zero`) is
/// "is a named pipe, not a file" rather than a read that waits for a writer for good (a
/// resume, a report, an eval, a grid's `--resume` hung) or never ends.
pub fn read_regular(path: impl AsRef<Path>) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut file = open_regular(path, false)?;
    let len = file.metadata()?.len();
    let mut bytes = Vec::with_capacity(len.min(1 << 30) as usize);
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Opens a file the runner wrote, to read (and with `write`, to write too), as
/// [`read_regular`] reads it: a named pipe, socket or device in its place is an error.
pub fn open_regular(path: impl AsRef<Path>, write: bool) -> std::io::Result<File> {
    let path = path.as_ref();
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    let t = meta.file_type();
    if !t.is_file() && !t.is_dir() {
        let kind = if t.is_fifo() {
            "a named pipe"
        } else if t.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {kind}, not a file"),
        ));
    }
    Ok(file)
}

/// [`read_regular`], as text (the error of `std::fs::read_to_string` where it is not UTF-8).
pub fn read_text(path: impl AsRef<Path>) -> std::io::Result<String> {
    String::from_utf8(read_regular(path)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Where text that is not UTF-8 first is not, so the byte can be found: "line 2, column 4
/// is not UTF-8 text (byte 0xff)".
pub fn not_utf8(e: &std::string::FromUtf8Error) -> String {
    let bytes = e.as_bytes();
    let at = e.utf8_error().valid_up_to();
    let before = &bytes[..at];
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = 1 + String::from_utf8_lossy(&before[start..]).chars().count();
    format!(
        "line {line}, column {column} is not UTF-8 text (byte 0x{:02x})",
        bytes.get(at).copied().unwrap_or(0)
    )
}

/// Writes a JSON file whole: to a temporary name first, then renamed over the target, so
/// a reader never sees half a file. Where no new file can be written (a full disk, a
/// quota, `ulimit -f`), the old file is rewritten in place if the new text fits in the
/// space it already holds: a run's last summary is not lost to the disk filling up.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    write_json(path, value, 0)
}

/// Room kept for a file the run rewrites at its end (`summary.json`, `env.json`).
pub const KEPT_ROOM: u64 = 16 << 10;

/// `write_json_atomic`, then `room` more bytes kept on disk for the file beyond its end
/// (its size unchanged), so that its rewrite later fits in place on a full disk.
pub fn write_json_keeping_room<T: Serialize>(
    path: &Path,
    value: &T,
    room: u64,
) -> std::io::Result<()> {
    write_json(path, value, room)
}

/// Writes `bytes` to a new file at `path`: whatever is there first removed (a link is
/// removed, not followed), and the file created only if nothing is there then. A temporary
/// file of a known name (`summary.json.tmp`, `plot.svg.tmp`) planted as a link to another
/// file had that file overwritten.
pub fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?
        .write_all(bytes)
}

fn write_json<T: Serialize>(path: &Path, value: &T, room: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)? + "\n";
    match write_new(&tmp, text.as_bytes()).and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => {
            if room > 0 {
                keep_room(path, text.len() as u64 + room);
            }
            Ok(())
        }
        Err(e) => {
            // A full disk leaves no partial temporary file beside the last good one.
            let _ = std::fs::remove_file(&tmp);
            match rewrite_in_place(path, text.as_bytes()) {
                Ok(true) => Ok(()),
                _ => Err(e),
            }
        }
    }
}

/// Rewrites the regular file at `path` with `text` without asking the file system for
/// space: only where `text` fits in the blocks the file holds already (its size, rounded
/// up to its blocks, or the room `keep_room` kept). A shorter text is padded with spaces
/// to the old length (valid JSON still), so the room stays for a next rewrite. `false`:
/// it does not fit, and the file is untouched.
fn rewrite_in_place(path: &Path, text: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || text.len() as u64 > meta.blocks().saturating_mul(512) {
        return Ok(false);
    }
    let mut bytes = text.to_vec();
    if (bytes.len() as u64) < meta.len() {
        let newline = bytes.pop();
        bytes.resize(meta.len() as usize - 1, b' ');
        bytes.extend(newline);
    }
    file.write_all_at(&bytes, 0)?;
    Ok(true)
}

/// Asks the file system to hold `bytes` on disk for `path` (blocks past its end, its size
/// unchanged): best effort, as not every file system can (then nothing is kept).
fn keep_room(path: &Path, bytes: u64) {
    #[cfg(target_os = "linux")]
    if let Ok(file) = std::fs::OpenOptions::new().write(true).open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: `fallocate` on an open descriptor this function owns; it only allocates
        // blocks past the file's end (FALLOC_FL_KEEP_SIZE), changing no byte of it.
        unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                0,
                bytes as libc::off_t,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (path, bytes);
}

/// Whether this process can create files in `dir`: by creating one (and removing it), as
/// permission bits alone do not tell (root, ACLs, read-only mounts).
pub fn takes_new_file(dir: &Path) -> std::io::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let name = dir.join(format!(".runner-probe-{}-{nanos}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&name)?;
    std::fs::remove_file(&name)
}

/// Resident set size of this process, from `/proc/self/statm` (Linux).
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts in a hand-edited metrics.jsonl (more real tokens than padded ones, a step of
    /// usize::MAX samples) give bounded figures: they wrapped around to 18446744073709551615
    /// pad tokens and a padding waste of 3.7e18 %.
    #[test]
    fn counts_that_cannot_add_up_stop_at_their_bound() {
        let step = |n: u64, samples: usize| StepRecord {
            step: n,
            samples,
            iter_ms: 1.0,
            real_tokens: Some(10),
            padded_tokens: Some(5),
            ..Default::default()
        };
        let mut s = Summary::default();
        s.absorb(&[step(1, usize::MAX), step(2, 1)], 0);
        assert_eq!(s.samples, u64::MAX);
        assert_eq!(s.pad_waste_pct, Some(0.0));
    }

    /// A lines file removed, or replaced by another, while it is written is written again
    /// from the open copy; the replacement is moved aside, not lost.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lines_file_removed_or_replaced_is_written_again() {
        let dir = crate::scratch::Scratch::new("lines");
        let path = dir.join("m.jsonl");
        let mut lines = JsonLines::create(&path).unwrap();
        lines.write_line("1".into()).unwrap();
        std::fs::remove_file(&path).unwrap();
        lines.write_line("2".into()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n");
        // Its folder removed and another made at its path: nothing is written there.
        let sub = dir.join("run");
        std::fs::create_dir_all(&sub).unwrap();
        let mut inner = JsonLines::create(&sub.join("m.jsonl")).unwrap();
        inner.write_line("1".into()).unwrap();
        std::fs::remove_dir_all(&sub).unwrap();
        std::fs::create_dir_all(&sub).unwrap();
        let _ = inner.write_line("2".into());
        assert!(!sub.join("m.jsonl").exists());
        // Another file renamed over it (an editor's save).
        let other = dir.join("other");
        std::fs::write(&other, "theirs\n").unwrap();
        std::fs::rename(&other, &path).unwrap();
        lines.write_line("3".into()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n3\n");
        let aside: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("m.jsonl.replaced-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), "theirs\n");
    }

    #[test]
    fn a_file_not_utf8_is_said_with_the_line_and_column() {
        let scratch = crate::scratch::Scratch::new("utf8-lines");
        let path = scratch.join("m.jsonl");
        std::fs::write(&path, b"{\"step\":1}\nab\xc3\xa9\xff\n").unwrap();
        let e = read_utf8(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2, column 4 is not UTF-8 text (byte 0xff)"
        );
        std::fs::write(&path, "fine\n").unwrap();
        assert_eq!(read_utf8(&path).unwrap(), "fine\n");
    }

    #[test]
    fn records_skip_blank_lines_and_a_cut_last_one_but_name_a_bad_one() {
        let read = |t: &str| JsonLines::records::<u32>(t).map_err(|(line, _)| line);
        assert_eq!(read("1\n\n2\n"), Ok(vec![1, 2]));
        assert_eq!(read("1\n2\n{\"st"), Ok(vec![1, 2]));
        assert_eq!(read("1\n3"), Ok(vec![1, 3]));
        assert_eq!(read("1\nx\n2\n"), Err(2));
    }

    #[test]
    fn a_steps_rest_leaves_out_its_checkpoint_as_its_time_does() {
        let r = StepRecord {
            iter_ms: 10.0,
            forward_backward_ms: 6.0,
            optimizer_ms: 1.0,
            checkpoint_ms: 5.0,
            ..Default::default()
        };
        assert_eq!(Phases::of(&[&r]).unwrap().other_ms, 3.0);
    }

    #[test]
    fn quantiles_match_numpy() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0, 10.0]);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.mean, 4.0);
        assert!((s.p95 - 8.8).abs() < 1e-12); // numpy.percentile([1,2,3,4,10], 95)
        assert_eq!((s.min, s.max), (1.0, 10.0));
    }

    #[test]
    fn csv_and_json_carry_the_same_fields() {
        let r = StepRecord {
            step: 3,
            loss: 0.5,
            mem_in_use_bytes: Some(7),
            ..Default::default()
        };
        let json = serde_json::to_value(&r).unwrap();
        let header = StepRecord::csv_header();
        let row = r.csv_row();
        let keys: Vec<&str> = header.split(',').collect();
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(keys.len(), cells.len());
        assert_eq!(
            keys,
            json.as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
        for (k, c) in keys.iter().zip(cells) {
            let v = &json[*k];
            assert_eq!(
                if v.is_null() {
                    String::new()
                } else {
                    v.to_string()
                },
                c,
                "field {k}"
            );
        }
    }

    #[test]
    fn summary_excludes_warmup_from_timing() {
        let recs: Vec<StepRecord> = (1..=4)
            .map(|s| StepRecord {
                step: s,
                samples: 10,
                iter_ms: if s == 1 { 1000.0 } else { 10.0 },
                cleanup_ms: 1.0,
                ..Default::default()
            })
            .collect();
        let mut sum = Summary::default();
        sum.absorb(&recs, 1);
        assert_eq!(sum.iter_ms.median, 10.0);
        assert_eq!(sum.samples_per_s, 1000.0);
        assert!((sum.cleanup_pct - 10.0).abs() < 1e-9);
        assert_eq!(sum.cleanup_ms_total, 4.0);
    }

    /// An epoch's line: the mean loss weighs each step by its samples, and the median
    /// is of the steps the run's ms/iter counts (outside the profile window where there
    /// are such), or of all its steps where they are all warm-up.
    #[test]
    fn an_epoch_s_line_takes_the_steps_the_run_times() {
        let step = |step: u64, ms: f64, synced: bool, samples: usize, loss: f64| StepRecord {
            step,
            iter_ms: ms,
            synced,
            samples,
            loss,
            ..Default::default()
        };
        let mut e = EpochTally::new(0);
        e.push(&step(1, 100.0, false, 32, 2.0), 2);
        e.push(&step(2, 90.0, false, 32, 2.0), 2);
        assert_eq!(e.median_ms(), (95.0, true), "warm-up steps only");
        e.push(&step(3, 30.0, true, 32, 1.0), 2);
        assert_eq!(
            e.median_ms(),
            (30.0, false),
            "the window's, where none is outside"
        );
        e.push(&step(4, 10.0, false, 8, 1.0), 2);
        e.push(&step(5, 12.0, false, 32, 1.0), 2);
        assert_eq!(e.median_ms(), (11.0, false));
        assert_eq!(e.steps, 5);
        assert!((e.mean_loss() - (2.0 * 64.0 + 72.0) / 136.0).abs() < 1e-12);
    }

    /// A counting tally (what a run keeps while it trains, for a summary whose lines
    /// cannot be read back) has the full tally's counts, sums and peaks, and no times.
    #[test]
    fn a_counting_tally_has_the_counts_and_no_times() {
        let recs: Vec<StepRecord> = (1..=6)
            .map(|step| StepRecord {
                step,
                samples: 10,
                iter_ms: step as f64,
                cleanup_ms: 0.5,
                rss_bytes: Some(step * 100),
                loss: 1.0 / step as f64,
                ..Default::default()
            })
            .collect();
        let (mut full, mut counting) = (Tally::new(2), Tally::counting(2));
        for r in &recs {
            full.push(r);
            counting.push(r);
        }
        let (mut a, mut b) = (Summary::default(), Summary::default());
        full.fill(&mut a);
        counting.fill(&mut b);
        assert_eq!((a.steps, a.samples, a.iter_ms.count), (6, 60, 4));
        assert_eq!((b.steps, b.samples, b.iter_ms.count), (6, 60, 0));
        assert_eq!(
            (b.final_loss, b.cleanup_ms_total, b.peak_rss_bytes),
            (a.final_loss, a.cleanup_ms_total, a.peak_rss_bytes)
        );
        assert!(b.phases.is_none() && b.iter_ms.median.is_nan());
    }
}
