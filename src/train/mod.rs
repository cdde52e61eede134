//! The training loop, generic over the Burn backend: batches from our loader, forward,
//! cross-entropy, backward, gradient accumulation, the optimizer step with the scheduled
//! learning rate, the cleanup policy's actions (timed), and evaluation without autodiff.
//! It reports each step and evaluation to a `Sink` and writes no files itself.

mod batch;
pub mod checkpoint;
mod eval;
mod optim;
mod trainer;
mod warmup;

pub use batch::{Batcher, HostBatch};
pub use eval::evaluate_weights;
use eval::{eval_batches, evaluate};
pub use optim::{clip_grad_norm, loss_config, Accumulation, Optim};
use trainer::Trainer;
pub use warmup::{epochs_reached, kernel_family, kernel_signature, warm_up, Warmed};

use std::sync::Arc;
use std::time::Instant;

use crate::ops::TrainBackend;
use burn::module::AutodiffModule;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};

use crate::backend::MemFn;
use crate::data::{Collate, Dataset, HostData, Pixels, Prepare};
use crate::loader::{Batching, Loader, LoaderConfig};
use crate::metrics::{rss_bytes, EvalRecord, StepRecord};
use crate::model::{Input, Net, Shape};
use crate::plan::Plan;
use crate::policy::{self, trim_host, CleanupPolicy, Point};
use crate::recipe::{CleanupAction, EvalWhen, NormalizeOn, OptimizerKind};

/// Where the loop reports what happens.
pub trait Sink {
    /// Called once the model exists, before the first step.
    fn started(&mut self, parameters: usize);
    /// Each optimizer step's record, in order (written when its loss has been read back).
    fn step(&mut self, record: &StepRecord);
    fn eval(&mut self, eval: &EvalRecord);
    /// `held`: the epoch's last step, if its line waits for the checkpoint at its end;
    /// `cut_short`: what ended the run inside the epoch (`run.max_steps`, early stopping).
    fn epoch_end(&mut self, epoch: usize, held: Option<&StepRecord>, cut_short: Option<&str>);
    /// What the start-up phase is doing (before the first step is done).
    fn phase(&mut self, _what: &str) {}
    /// The first step is done on the device (its kernels compiled and tuned); `step_ms`
    /// is its own time, compilation included.
    fn first_step(&mut self, _step_ms: f64) {}
    /// Asked at every step boundary: a reason to stop now (a signal, a failed write).
    fn should_stop(&mut self) -> Option<Stop> {
        None
    }
    /// Asked once the run has taken its last step (by `max_steps`, its last epoch or early
    /// stopping): a reason to stop there, before the final evaluation. From here on the
    /// run finishes whatever comes.
    fn last_step_taken(&mut self) -> Option<Stop> {
        self.should_stop()
    }
    /// A line for the person watching (the progress display's, or stderr's).
    fn note(&mut self, _line: &str) {}
    /// The trained weights are saved (`model.safetensors`), before the final evaluation.
    /// The final weights are saved, their file's SHA-256 `sha256`.
    fn weights_saved(&mut self, _sha256: &str) {}
    /// An evaluation on the validation set (`data.validation`).
    fn validation(&mut self, _eval: &EvalRecord) {}
    /// A new best validation metric (its weights are in `model-best.safetensors`).
    /// A new best validation value; `saved`: the SHA-256 of `model-best.safetensors`,
    /// where it was saved.
    fn best(&mut self, _step: u64, _value: f64, _saved: Option<&str>) {}
    /// Early stopping ended the run after this step.
    fn early_stopped(&mut self, _step: u64) {}
    /// Metrics lines written so far (a checkpoint records where they end).
    fn lines_written(&self) -> u64 {
        0
    }
    /// A checkpoint was written, taking `ms`.
    fn checkpointed(&mut self, _dir: &std::path::Path, _ms: f64) {}
    /// The run directory was found moved to `to` (by a person, `mv`): the run goes on there.
    fn moved(&mut self, _to: &std::path::Path) {}
    /// What a checkpoint keeps of the summary so far (see `checkpoint::State::recorded`).
    fn recorded(&self) -> checkpoint::Recorded {
        checkpoint::Recorded::default()
    }
}

/// The trained weights, in the run directory.
pub const WEIGHTS: &str = "model.safetensors";
/// The weights at the best validation metric.
pub const BEST_WEIGHTS: &str = "model-best.safetensors";

/// The watched metric's state: its best (step, value) and the evaluations since.
#[derive(Debug, Clone, Default)]
struct Watching {
    best: Option<(u64, f64)>,
    since_best: u64,
}

/// `500 steps`, `epoch`.
fn every_words(e: crate::recipe::Every) -> String {
    match e {
        crate::recipe::Every::Steps(n) => format!("{n} steps"),
        crate::recipe::Every::Step => "step".into(),
        crate::recipe::Every::Epoch => "epoch".into(),
        crate::recipe::Every::Never => "never".into(),
    }
}

/// Why the loop ended before its last step.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The loss was not finite, or above `run.max_loss`, at this step.
    Diverged { step: u64, loss: f64, max_loss: f64 },
    /// SIGINT, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2.
    Signal(i32),
    /// Something the run needs failed (a write, a read-back from the device).
    Failed(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Stop::Diverged {
                step,
                loss,
                max_loss,
            } => {
                let loss = short_float(*loss);
                write!(
                    f,
                    "diverged at step {step}: the loss is {loss} (above run.max_loss = {max_loss}, or not a number); lower optim.lr, or set run.stop_on_divergence = false to go on"
                )
            }
            Stop::Signal(s) => write!(f, "interrupted by {}", crate::signals::name(*s)),
            Stop::Failed(m) => f.write_str(m),
        }
    }
}

/// A loss as said in a message: a huge one in a float's short form (it was written out in
/// 35 digits).
fn short_float(loss: f64) -> String {
    match loss.is_finite() && loss.abs() >= 1e6 {
        true => format!("{loss:.3e}"),
        false => loss.to_string(),
    }
}

/// What a finished loop hands back beyond what the sink saw.
#[derive(Debug, Clone, Default)]
pub struct TrainOutcome {
    pub parameters: usize,
    pub loader_workers_started: usize,
    pub epochs_completed: usize,
    /// Set when the loop ended early.
    pub stopped: Option<Stop>,
    /// With `run.stop_on_divergence = false`: the first step whose loss diverged.
    pub diverged: Option<(u64, f64)>,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// How the loader groups the plan's training samples.
pub fn batching(plan: &Plan, train: &Dataset) -> Batching {
    match (plan.data.text(), train) {
        (Some(t), Dataset::Text(set))
            if t.padding.strategy == crate::recipe::PaddingStrategy::Bucket =>
        {
            let lengths = set.lengths();
            let bounds = crate::data::pad::bucket_bounds(&lengths, t.buckets);
            Batching::Buckets {
                lengths: Arc::new(lengths),
                bounds,
            }
        }
        _ => Batching::Sequential,
    }
}

/// The loader settings of a plan's training set.
pub fn loader_config(plan: &Plan, train: &Dataset) -> LoaderConfig {
    let l = &plan.loader;
    LoaderConfig {
        batch_size: l.batch_size,
        workers: l.workers,
        persistent_workers: l.persistent_workers,
        prefetch: l.prefetch,
        shuffle: l.shuffle,
        drop_last: l.drop_last,
        step_batches: plan.optim.accumulation_steps,
        seed: plan.seed,
        batching: batching(plan, train),
    }
}

/// What a run keeps on disk, and where it restarts from.
pub struct Persist {
    /// Held open: checkpoints and weights go where it is now (see `RunDir`).
    run_dir: crate::rundir::RunDir,
    /// Where it was last seen, to say once that it moved.
    seen_at: std::sync::Mutex<std::path::PathBuf>,
    /// The resolved recipe's SHA-256, recorded in each checkpoint.
    pub recipe_sha256: String,
    /// The checkpoint to continue from, if this run is resumed.
    pub resume: Option<(std::path::PathBuf, checkpoint::State)>,
}

impl Persist {
    pub fn new(
        run_dir: crate::rundir::RunDir,
        recipe_sha256: String,
        resume: Option<(std::path::PathBuf, checkpoint::State)>,
    ) -> Self {
        let seen_at = std::sync::Mutex::new(run_dir.opened_at().to_path_buf());
        Persist {
            run_dir,
            seen_at,
            recipe_sha256,
            resume,
        }
    }

    /// Where the run directory is now, for a write into it; a move is said to `sink` once.
    /// Removed: the run stops (nothing would have anywhere to go).
    pub fn dir(&self, sink: &mut dyn Sink) -> Result<std::path::PathBuf, Stop> {
        let now = self.run_dir.now().map_err(Stop::Failed)?;
        let mut seen = self.seen_at.lock().unwrap_or_else(|e| e.into_inner());
        if *seen != now {
            sink.moved(&now);
            seen.clone_from(&now);
        }
        Ok(now)
    }
}

/// What a run trains on, from the run layer: the plan, its data and batcher, the clock its
/// records count from, and where it keeps what it writes (none: nothing is kept).
pub struct Inputs<'a> {
    pub plan: &'a Plan,
    pub batcher: Batcher,
    pub train: Arc<Dataset>,
    pub test: Arc<Dataset>,
    pub validation: Option<Arc<Dataset>>,
    pub t0: Instant,
    pub persist: Option<&'a Persist>,
}

/// Trains the plan's model on `train` and evaluates on `test`, reporting to `sink`.
/// With `persist`, writes the checkpoints the plan asks for (and one when a signal stops
/// the run), starts from a checkpoint when resuming, and saves the final weights.
///
/// burn-train's shape: this epoch loop hands each optimizer step, each epoch's end and the
/// run's end to a `Trainer` (`trainer.rs`), which owns the model, the optimizer and the
/// bookkeeping.
pub fn train<B: TrainBackend>(
    inputs: Inputs<'_>,
    device: B::Device,
    mem: MemFn<B::Device>,
    sink: &mut dyn Sink,
) -> TrainOutcome {
    let Inputs {
        plan,
        batcher,
        train,
        test,
        validation,
        t0,
        persist,
    } = inputs;
    let io = trainer::Io {
        plan,
        batcher: &batcher,
        device,
        mem,
        t0,
        persist,
    };
    let (mut t, start) = match Trainer::<B>::new(io, validation, sink) {
        Ok(x) => x,
        Err(outcome) => return *outcome,
    };
    let make = batch_maker::<B>(&batcher, &train, plan.loader.pin_memory, &t.io.device);
    let mut loader = Loader::new(loader_config(plan, &train), train.len(), make);
    t.loader_stats = Some(Arc::clone(&loader.stats));
    let mut stopped: Option<Stop> = None;
    for epoch in start.epoch..plan.run.epochs {
        let skip = if epoch == start.epoch { start.batch } else { 0 };
        let mut batches = match loader.epoch_from(epoch, skip) {
            Ok(batches) => batches,
            Err(e) => {
                stopped = Some(Stop::Failed(e));
                break;
            }
        };
        let mut pos = trainer::Position {
            epoch,
            left: batches.len(),
            consumed: skip,
        };
        while pos.left > 0 && t.step < plan.run.total_steps {
            if let Some(stop) = sink.should_stop() {
                stopped = Some(t.stop_at(stop, &pos, sink));
                break;
            }
            match t.step(&mut batches, &mut pos, sink) {
                Ok(trainer::Next::Continue) => {}
                Ok(trainer::Next::EarlyStop) => break,
                Err(stop) => {
                    stopped = Some(stop);
                    break;
                }
            }
        }
        // A signal during the run's last step stops it here too, before the final
        // evaluation (it ran, and the run said `completed` after the signal had said it
        // would stop); its checkpoint resumes to that evaluation.
        if stopped.is_none() && t.step >= plan.run.total_steps {
            if let Some(stop) = sink.last_step_taken() {
                stopped = Some(t.stop_at(stop, &pos, sink));
            }
        }
        drop(batches);
        if stopped.is_some() {
            break;
        }
        // `max_steps` can end the run inside an epoch; that epoch is not complete.
        match t.end_epoch(epoch, pos.left > 0, &test, sink) {
            Ok(trainer::Next::Continue) => {}
            Ok(trainer::Next::EarlyStop) => break,
            Err(stop) => {
                stopped = Some(stop);
                break;
            }
        }
    }
    let workers = loader
        .stats
        .workers_started
        .load(std::sync::atomic::Ordering::Relaxed);
    t.finish(stopped, workers, sink)
}

/// What the loader's workers run for each batch: the host batch, staged in page-locked
/// memory when `pin_memory` asks for it.
fn batch_maker<B: TrainBackend>(
    batcher: &Batcher,
    train: &Arc<Dataset>,
    stage: bool,
    device: &B::Device,
) -> crate::loader::MakeBatch<HostBatch> {
    let data = Arc::clone(train);
    let batcher = batcher.clone();
    let device = device.clone();
    Arc::new(move |idx: &[usize], epoch: usize| {
        let mut b = batcher.host(&data, idx, epoch, true);
        if stage {
            B::staging(b.data_mut().into_iter(), &device);
        }
        b
    })
}

/// Reads the pending steps' losses back in one transfer and hands the records on. The
/// read waits for the device; it and the writing of the earlier lines are the last
/// record's `log_ms` (and part of its `iter_ms`). Every pending record is handed on; a
/// loss that diverged (`run.max_loss`) is then an error when the plan stops on it, and a
/// failed read-back always is. With `hold_last` the last record is returned instead of
/// written (its line waits for the checkpoint at the epoch's end, to carry its time).
fn flush<B: Backend>(
    pending: &mut Vec<(StepRecord, Tensor<B, 1>)>,
    sink: &mut dyn Sink,
    plan: &Plan,
    diverged: &mut Option<(u64, f64)>,
    hold_last: bool,
) -> Result<Option<StepRecord>, Stop> {
    if pending.is_empty() {
        return Ok(None);
    }
    let t = Instant::now();
    let (recs, losses): (Vec<StepRecord>, Vec<Tensor<B, 1>>) = pending.drain(..).unzip();
    let values: Vec<f32> = Tensor::cat(losses, 0)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| {
            Stop::Failed(format!(
                "cannot read the losses back from the device: {e:?}"
            ))
        })?;
    if values.len() != recs.len() {
        return Err(Stop::Failed(format!(
            "read {} losses back from the device for {} steps",
            values.len(),
            recs.len()
        )));
    }
    let n = recs.len();
    let mut held = None;
    for (i, (mut r, v)) in recs.into_iter().zip(values).enumerate() {
        r.loss = v as f64;
        if i + 1 == n {
            r.log_ms = ms(t);
            r.iter_ms += r.log_ms;
            r.t_ms += r.log_ms;
        }
        let per_s = |n: f64| {
            if r.iter_ms > 0.0 {
                n / (r.iter_ms / 1e3)
            } else {
                0.0
            }
        };
        r.samples_per_s = per_s(r.samples as f64);
        if let (Some(real), Some(padded)) = (r.real_tokens, r.padded_tokens) {
            r.pad_waste_pct = Some(crate::data::pad::waste_pct(real as usize, padded as usize));
            r.real_tokens_per_s = Some(per_s(real as f64));
            r.padded_tokens_per_s = Some(per_s(padded as f64));
        }
        if diverged.is_none() && !(r.loss.is_finite() && r.loss <= plan.run.max_loss) {
            *diverged = Some((r.step, r.loss));
            // Going on (`run.stop_on_divergence = false`): said when it happens, not only
            // in summary.json (the console said "mean loss NaN", then a summary line like
            // any run's).
            if !plan.run.stop_on_divergence {
                sink.note(&format!(
                    "warning: diverged at step {}: the loss is {} (above run.max_loss = {}, or not a number); going on, as run.stop_on_divergence = false asks (summary.json records diverged_at_step)",
                    r.step,
                    short_float(r.loss),
                    plan.run.max_loss
                ));
            }
        }
        if hold_last && i + 1 == n {
            held = Some(r);
        } else {
            sink.step(&r);
        }
    }
    match *diverged {
        Some((step, loss)) if plan.run.stop_on_divergence => {
            // The run stops here: no line is held for a checkpoint that will not come.
            if let Some(r) = held {
                sink.step(&r);
            }
            Err(Stop::Diverged {
                step,
                loss,
                max_loss: plan.run.max_loss,
            })
        }
        _ => Ok(held),
    }
}

/// Evaluates on the validation set, reports it, and updates the watched metric: a new
/// best saves `model-best.safetensors`; `Ok(true)` when patience has run out before the
/// run's last step.
fn validate<B: TrainBackend>(
    (plan, batcher, device, persist): (&Plan, &Batcher, &B::Device, Option<&Persist>),
    model: &Net<B>,
    data: &Dataset,
    epoch: usize,
    step: u64,
    watching: &mut Watching,
    sink: &mut dyn Sink,
) -> Result<bool, Stop> {
    let all: Vec<usize> = (0..data.len()).collect();
    let valid = model.valid();
    let e = evaluate(&valid, data, &all, batcher, plan, device);
    sink.validation(&EvalRecord { epoch, step, ..e });
    let Some(w) = &plan.run.watch else {
        return Ok(false);
    };
    let value = match w.metric {
        crate::recipe::EarlyStopMetric::ValLoss => e.loss,
        crate::recipe::EarlyStopMetric::ValAccuracy => e.accuracy,
    };
    let better = match watching.best {
        None => value.is_finite(),
        Some((_, b)) if w.maximize => value > b + w.min_delta,
        Some((_, b)) => value < b - w.min_delta,
    };
    if better {
        watching.best = Some((step, value));
        watching.since_best = 0;
        let saved = match persist {
            Some(p) => Some(
                checkpoint::save_weights(&valid, &p.dir(sink)?.join(BEST_WEIGHTS))
                    .map_err(Stop::Failed)?,
            ),
            None => None,
        };
        sink.best(step, value, saved.as_deref());
    } else {
        watching.since_best += 1;
    }
    // At the run's last step there is nothing left to stop: its patience running out there
    // is no early stop (`early_stopped_at_step` was set on runs that ran every step).
    Ok(w.patience.is_some_and(|p| watching.since_best >= p) && step < plan.run.total_steps)
}

fn run_cleanup<B: Backend>(actions: &[CleanupAction], device: &B::Device) {
    for a in actions {
        match a {
            CleanupAction::Sync => {
                let _ = B::sync(device);
            }
            CleanupAction::EmptyCache => B::memory_cleanup(device),
            CleanupAction::TrimHost => trim_host(),
        }
    }
}
