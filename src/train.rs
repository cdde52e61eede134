//! The training loop, generic over the Burn backend: batches from our loader, forward,
//! cross-entropy, backward, gradient accumulation, the optimizer step with the scheduled
//! learning rate, the cleanup policy's actions (timed), and evaluation without autodiff.
//! It reports each step and evaluation to a `Sink` and writes no files itself.

use std::sync::Arc;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    AdamW, AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer, Sgd, SgdConfig,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};

use crate::backend::MemFn;
use crate::checkpoint;
use crate::data::{Collate, Dataset, HostData, Pixels, Prepare};
use crate::loader::{Batching, Loader, LoaderConfig};
use crate::metrics::{rss_bytes, Eval as EvalRecord, StepRecord};
use crate::model::{Input, Net, Shape};
use crate::plan::Plan;
use crate::policy::{self, trim_host, CleanupPolicy, Point};
use crate::recipe::{CleanupAction, Eval, NormalizeOn, Optimizer as OptimKind};

/// Where the loop reports what happens.
pub trait Sink {
    /// Called once the model exists, before the first step.
    fn started(&mut self, parameters: usize);
    /// Each optimizer step's record, in order (written when its loss has been read back).
    fn step(&mut self, record: &StepRecord);
    fn eval(&mut self, eval: &EvalRecord);
    fn epoch_end(&mut self, epoch: usize);
    /// What the start-up phase is doing (before the first step is done).
    fn phase(&mut self, _what: &str) {}
    /// The first step is done on the device (its kernels compiled and tuned); `step_ms`
    /// is its own time, compilation included.
    fn first_step(&mut self, _step_ms: f64) {}
    /// Asked at every step boundary: a reason to stop now (a signal, a failed write).
    fn should_stop(&mut self) -> Option<Stop> {
        None
    }
    /// An evaluation on the validation set (`data.validation`).
    fn validation(&mut self, _eval: &EvalRecord) {}
    /// A new best validation metric (its weights are in `model-best.safetensors`).
    fn best(&mut self, _step: u64, _value: f64) {}
    /// Early stopping ended the run after this step.
    fn early_stopped(&mut self, _step: u64) {}
    /// Metrics lines written so far (a checkpoint records where they end).
    fn lines_written(&self) -> u64 {
        0
    }
    /// A checkpoint was written, taking `ms`.
    fn checkpointed(&mut self, _dir: &std::path::Path, _ms: f64) {}
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
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// Something the run needs failed (a write, a read-back from the device).
    Failed(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Stop::Diverged { step, loss, max_loss } => write!(
                f,
                "diverged at step {step}: the loss is {loss} (above run.max_loss = {max_loss}, or not a number); lower optim.lr, or set run.stop_on_divergence = false to go on"
            ),
            Stop::Signal(s) => write!(f, "interrupted by {}", crate::signals::name(*s)),
            Stop::Failed(m) => f.write_str(m),
        }
    }
}

/// What a finished loop hands back beyond what the sink saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub parameters: usize,
    pub loader_workers_started: usize,
    pub epochs_completed: usize,
    /// Set when the loop ended early.
    pub stopped: Option<Stop>,
    /// With `run.stop_on_divergence = false`: the first step whose loss diverged.
    pub diverged: Option<(u64, f64)>,
}

/// A batch as the loader's workers prepare it: host tensors, staged for the copy if asked.
pub struct HostBatch {
    input: HostInput,
    labels: TensorData,
    /// Text: real and padded token positions.
    tokens: Option<(usize, usize)>,
}

enum HostInput {
    Images(TensorData),
    Tokens {
        ids: TensorData,
        pad: TensorData,
        lengths: TensorData,
    },
}

impl HostBatch {
    fn data_mut(&mut self) -> Vec<&mut TensorData> {
        let mut v = vec![&mut self.labels];
        match &mut self.input {
            HostInput::Images(x) => v.push(x),
            HostInput::Tokens { ids, pad, lengths } => v.extend([ids, pad, lengths]),
        }
        v
    }
}

/// The recipe's optimizer, built with PyTorch's semantics.
pub enum Optim<B: AutodiffBackend> {
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, Net<B>, B>),
    AdamW(OptimizerAdaptor<AdamW, Net<B>, B>),
}

impl<B: AutodiffBackend> Optim<B> {
    /// PyTorch semantics: SGD momentum without dampening (Burn defaults to 0.1), L2 weight
    /// decay on the gradient; AdamW with decoupled decay and the recipe's eps (Burn: 1e-5).
    pub fn new(p: &crate::plan::OptimPlan) -> Self {
        match p.optimizer {
            OptimKind::Sgd => {
                let momentum = (p.momentum > 0.0).then(|| MomentumConfig {
                    momentum: p.momentum,
                    dampening: 0.0,
                    nesterov: p.nesterov,
                });
                let decay = (p.weight_decay > 0.0).then(|| WeightDecayConfig {
                    penalty: p.weight_decay as f32,
                });
                Optim::Sgd(
                    SgdConfig::new()
                        .with_momentum(momentum)
                        .with_weight_decay(decay)
                        .init(),
                )
            }
            OptimKind::Adamw => Optim::AdamW(
                AdamWConfig::new()
                    .with_beta_1(p.betas[0] as f32)
                    .with_beta_2(p.betas[1] as f32)
                    .with_epsilon(p.eps as f32)
                    .with_weight_decay(p.weight_decay as f32)
                    .init(),
            ),
        }
    }

    pub fn step(&mut self, lr: f64, model: Net<B>, grads: GradientsParams) -> Net<B> {
        match self {
            Optim::Sgd(o) => o.step(lr, model, grads),
            Optim::AdamW(o) => o.step(lr, model, grads),
        }
    }
}

/// Scales the gradients so that their global L2 norm (every parameter together) is at most
/// `max_norm`, as `torch.nn.utils.clip_grad_norm_` (coefficient `max_norm / (norm + 1e-6)`,
/// clamped to 1). The norm stays on the device: no read-back, no sync.
pub fn clip_grad_norm<B: AutodiffBackend>(
    model: &Net<B>,
    grads: GradientsParams,
    max_norm: f64,
) -> GradientsParams {
    use burn::module::{Module, ModuleVisitor, Param};
    struct SumSquares<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        total: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let sq = g.powi_scalar(2).sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + sq,
                    None => sq,
                });
            }
        }
    }
    struct Scale<B: AutodiffBackend> {
        grads: GradientsParams,
        coef: Tensor<B::InnerBackend, 1>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let coef = self.coef.clone().reshape([1; D]);
                self.grads.register(param.id, g * coef);
            }
        }
    }
    let mut sum = SumSquares::<B> {
        grads: &grads,
        total: None,
    };
    model.visit(&mut sum);
    let Some(total) = sum.total else {
        return grads;
    };
    let coef = (total.sqrt().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
    let mut scale = Scale::<B> { grads, coef };
    model.visit(&mut scale);
    scale.grads
}

/// The training loss: cross-entropy, with the plan's label smoothing. (Evaluation reports
/// the plain cross-entropy, as PyTorch's usual validation loss.)
pub fn loss_config(plan: &Plan) -> CrossEntropyLossConfig {
    let e = plan.optim.label_smoothing;
    CrossEntropyLossConfig::new().with_smoothing((e > 0.0).then_some(e as f32))
}

/// The gradients of one optimizer step, summed over its micro-batches. Burn's
/// `GradientsAccumulator` sums, so each micro-batch's loss is scaled by 1/k first: the step
/// then sees the mean gradient, as one batch k times larger would give.
pub struct Accumulation<B: AutodiffBackend> {
    group: usize,
    acc: GradientsAccumulator<Net<B>>,
    single: Option<GradientsParams>,
}

impl<B: AutodiffBackend> Accumulation<B> {
    /// For a step of `group` micro-batches.
    pub fn new(group: usize) -> Self {
        Self {
            group,
            acc: GradientsAccumulator::new(),
            single: None,
        }
    }

    /// Back-propagates one micro-batch's mean loss; returns it, unscaled and detached.
    pub fn add(&mut self, model: &Net<B>, loss: Tensor<B, 1>) -> Tensor<B::InnerBackend, 1> {
        let value = loss.clone().inner();
        if self.group == 1 {
            self.single = Some(GradientsParams::from_grads(loss.backward(), model));
        } else {
            let scaled = loss / self.group as f32;
            self.acc
                .accumulate(model, GradientsParams::from_grads(scaled.backward(), model));
        }
        value
    }

    pub fn grads(mut self) -> GradientsParams {
        self.single.take().unwrap_or_else(|| self.acc.grads())
    }
}

/// How a plan's batches are made on the host (by the loader's workers) and finished on
/// the device: images are augmented and normalised on the host or copied as bytes and
/// normalised on the device; text is padded by the plan's strategy.
#[derive(Debug, Clone)]
pub struct Batcher {
    pub collate: Collate,
    /// Per-channel `(scale, shift)` applied on the device to bytes; `None` for text or host
    /// normalisation.
    pub device_affine: Option<Vec<(f32, f32)>>,
    pub shape: Shape,
}

impl Batcher {
    pub fn new(plan: &Plan, vocab: usize) -> Self {
        let d = &plan.data;
        if let Some(t) = &d.text {
            return Self {
                collate: Collate::Text(t.padding.clone()),
                device_affine: None,
                shape: Shape::Text {
                    vocab,
                    max_len: t.padding.max_row_len(),
                },
            };
        }
        let n = &d.normalize;
        let affine = Prepare::affine(&n.mean, &n.std);
        let on_host = n.on == NormalizeOn::Host;
        Self {
            collate: Collate::Images(Prepare {
                crop_padding: d.crop_padding,
                hflip: d.hflip,
                host_affine: on_host.then(|| affine.clone()),
                seed: plan.seed,
            }),
            device_affine: (!on_host).then_some(affine),
            shape: Shape::Image {
                channels: d.channels,
                side: d.height,
            },
        }
    }

    /// The host batch of these samples.
    pub fn host(&self, data: &Dataset, indices: &[usize], epoch: usize, train: bool) -> HostBatch {
        let labels: Vec<i32> = indices.iter().map(|&i| data.labels()[i] as i32).collect();
        let n = labels.len();
        let labels = TensorData::new(labels, [n]);
        match self.collate.batch(data, indices, epoch, train) {
            HostData::Pixels(p) => {
                let Shape::Image { channels, side } = self.shape else {
                    unreachable!("image batcher")
                };
                let shape = [n, channels, side, side];
                let images = match p {
                    Pixels::F32(v) => TensorData::new(v, shape),
                    Pixels::U8(v) => TensorData::new(v, shape),
                };
                HostBatch {
                    input: HostInput::Images(images),
                    labels,
                    tokens: None,
                }
            }
            HostData::Tokens(t) => {
                let pad: Vec<bool> = t
                    .lengths
                    .iter()
                    .flat_map(|&l| (0..t.len).map(move |j| j >= l))
                    .collect();
                let tokens = Some((t.real_tokens(), t.padded_tokens()));
                let lengths: Vec<i32> = t.lengths.iter().map(|&l| l as i32).collect();
                HostBatch {
                    input: HostInput::Tokens {
                        ids: TensorData::new(t.ids, [n, t.len]),
                        pad: TensorData::new(pad, [n, t.len]),
                        lengths: TensorData::new(lengths, [n]),
                    },
                    labels,
                    tokens,
                }
            }
        }
    }

    /// What decides a batch's tensor shapes: its size, and for text its padded row length.
    pub fn shape_of(&self, data: &Dataset, indices: &[usize]) -> (usize, usize) {
        match (&self.collate, data) {
            (Collate::Text(padding), Dataset::Text(set)) => {
                let longest = indices.iter().map(|&i| set.seqs[i].len()).max();
                (indices.len(), padding.row_len(longest.unwrap_or(0)))
            }
            _ => (indices.len(), 0),
        }
    }

    /// Host batch → device tensors. Bytes are cast and normalised on the device.
    pub fn to_device<B: Backend>(
        &self,
        b: HostBatch,
        device: &B::Device,
    ) -> (Input<B>, Tensor<B, 1, Int>) {
        let labels = Tensor::<B, 1, Int>::from_data(b.labels, device);
        let input = match b.input {
            HostInput::Images(x) if x.dtype == DType::U8 => {
                let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
                let (scale, shift): (Vec<f32>, Vec<f32>) = match &self.device_affine {
                    Some(a) => a.iter().copied().unzip(),
                    None => (vec![1.0 / 255.0; c], vec![0.0; c]),
                };
                // One (scale, shift) per image plane, as `[n·c, 1]` columns: a per-row
                // multiply-add, which the CPU backend runs with SIMD (a `[1, c, 1, 1]`
                // broadcast it walks element by element) and CUDA fuses the same.
                let rows = |v: &[f32]| {
                    let col: Vec<f32> = (0..n).flat_map(|_| v.iter().copied()).collect();
                    Tensor::<B, 2>::from_data(TensorData::new(col, [n * c, 1]), device)
                };
                let bytes = Tensor::<B, 4, Int>::from_data(x, (device, DType::U8))
                    .float()
                    .reshape([n * c, h * w]);
                Input::Images((bytes * rows(&scale) + rows(&shift)).reshape([n, c, h, w]))
            }
            HostInput::Images(x) => Input::Images(Tensor::<B, 4>::from_data(x, device)),
            HostInput::Tokens { ids, pad, lengths } => Input::Tokens {
                ids: Tensor::<B, 2, Int>::from_data(ids, device),
                pad: Tensor::<B, 2, Bool>::from_data(pad, device),
                lengths: Tensor::<B, 1, Int>::from_data(lengths, device),
            },
        };
        (input, labels)
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// How the loader groups the plan's training samples.
pub fn batching(plan: &Plan, train: &Dataset) -> Batching {
    match (&plan.data.text, train) {
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
        seed: plan.seed,
        batching: batching(plan, train),
    }
}

/// What a run keeps on disk, and where it restarts from.
pub struct Persist {
    pub run_dir: std::path::PathBuf,
    /// The resolved recipe's SHA-256, recorded in each checkpoint.
    pub recipe_sha256: String,
    /// The checkpoint to continue from, if this run is resumed.
    pub resume: Option<(std::path::PathBuf, checkpoint::State)>,
}

/// Trains the plan's model on `train` and evaluates on `test`, reporting to `sink`.
/// With `persist`, writes the checkpoints the plan asks for (and one when a signal stops
/// the run), starts from a checkpoint when resuming, and saves the final weights.
#[allow(clippy::too_many_arguments)]
pub fn train<B: AutodiffBackend>(
    plan: &Plan,
    batcher: Batcher,
    train: Arc<Dataset>,
    test: Arc<Dataset>,
    validation: Option<Arc<Dataset>>,
    device: B::Device,
    mem: MemFn<B::Device>,
    t0: Instant,
    sink: &mut dyn Sink,
    persist: Option<&Persist>,
) -> Outcome {
    sink.phase("building the model");
    let mut model: Net<B> = Net::new(&plan.model, batcher.shape, plan.seed, &device);
    let parameters = model.parameters();
    let mut optim = Optim::<B>::new(&plan.optim);
    let mut watching = Watching::default();
    // Where the loop starts: the beginning, or a checkpoint's step, epoch and batch.
    let (mut step, mut epochs_completed, start_epoch, start_batch): (u64, usize, usize, usize) =
        match persist.and_then(|p| p.resume.as_ref()) {
            None => (0, 0, 0, 0),
            Some((dir, state)) => {
                watching = Watching {
                    best: state.best,
                    since_best: state.since_best,
                };
                sink.phase("loading the checkpoint");
                match checkpoint::load::<B>(dir, model, optim, &device) {
                    Ok((m, o)) => {
                        (model, optim) = (m, o);
                    }
                    Err(e) => {
                        return Outcome {
                            parameters,
                            stopped: Some(Stop::Failed(e)),
                            ..Default::default()
                        }
                    }
                }
                (state.step, state.epochs_completed, state.epoch, state.batch)
            }
        };
    sink.started(parameters);
    sink.phase("first step (compiling and tuning kernels on a GPU)");
    let loss_fn: CrossEntropyLoss<B> = loss_config(plan).init(&device);
    let schedule = plan.lr_schedule();
    let policy = CleanupPolicy {
        every: plan.cleanup.every,
        actions: plan.cleanup.actions.clone(),
    };

    let make = {
        let data = Arc::clone(&train);
        let batcher = batcher.clone();
        let stage = plan.loader.pin_memory;
        let device = device.clone();
        Arc::new(move |idx: &[usize], epoch: usize| {
            let mut b = batcher.host(&data, idx, epoch, true);
            if stage {
                B::staging(b.data_mut().into_iter(), &device);
            }
            b
        })
    };
    let mut loader = Loader::new(loader_config(plan, &train), train.len(), make);

    let accum = plan.optim.accumulation_steps;
    let total = plan.run.total_steps;
    // Records whose loss is still on the device, read back every `log.every` steps.
    let mut pending: Vec<(StepRecord, Tensor<B::InnerBackend, 1>)> = vec![];
    let first_step = step + 1;
    // Dropout draws from Burn's process-wide generator: reseeded from the step, so a
    // resumed run draws what the uninterrupted one would have.
    let reseed = plan.model.arch == crate::recipe::Arch::Transformer && plan.model.dropout > 0.0;
    let checkpoint_at = |sink: &mut dyn Sink,
                         model: &Net<B>,
                         optim: &Optim<B>,
                         state: checkpoint::State|
     -> Result<f64, Stop> {
        let Some(p) = persist else { return Ok(0.0) };
        let t = Instant::now();
        let dir = checkpoint::save::<B>(
            &p.run_dir,
            model,
            optim,
            &checkpoint::State {
                recipe_sha256: p.recipe_sha256.clone(),
                ..state
            },
            plan.checkpoint.keep,
        )
        .map_err(Stop::Failed)?;
        let took = ms(t);
        sink.checkpointed(&dir, took);
        Ok(took)
    };
    // What a cleanup frees: the pool's reserved bytes on a device with one, else RSS.
    let cleanup_mem = || {
        mem(&device)
            .map(|(_, reserved)| reserved)
            .or_else(rss_bytes)
    };

    let mut stopped: Option<Stop> = None;
    let mut diverged: Option<(u64, f64)> = None;
    // Early stopping decided the run is done.
    let mut early = false;
    for epoch in start_epoch..plan.run.epochs {
        let skip = if epoch == start_epoch { start_batch } else { 0 };
        let mut batches = loader.epoch_from(epoch, skip);
        let mut left = batches.len();
        // Micro-batches of this epoch consumed (a checkpoint's position in it).
        let mut consumed = skip;
        while left > 0 && step < total {
            if let Some(stop) = sink.should_stop() {
                // A signal: keep the work (a Slurm time limit, a preempted node).
                if matches!(stop, Stop::Signal(_)) && persist.is_some() {
                    let flushed = flush(&mut pending, sink, plan, &mut diverged);
                    let state = checkpoint::State {
                        step,
                        epoch,
                        batch: consumed,
                        epochs_completed,
                        metrics_lines: sink.lines_written(),
                        recipe_sha256: String::new(),
                        reason: format!("{stop}"),
                        written_at: crate::clock::utc_now(),
                        best: watching.best,
                        since_best: watching.since_best,
                    };
                    let saved = flushed.and_then(|_| checkpoint_at(sink, &model, &optim, state));
                    if let Err(e) = saved {
                        stopped = Some(e);
                        break;
                    }
                }
                stopped = Some(stop);
                break;
            }
            if reseed {
                B::seed(
                    &device,
                    plan.seed ^ (step + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
            }
            let synced = plan
                .profile
                .window
                .as_ref()
                .is_some_and(|w| w.contains(&(step + 1)));
            // In the profile window each phase ends with a device sync, so its time is the
            // device's; work queued by earlier steps is drained first, outside the timing.
            let sync = || {
                if synced {
                    let _ = B::sync(&device);
                }
            };
            sync();
            let started = Instant::now();
            let group = accum.min(left);
            left -= group;
            consumed += group;
            let mut rec = StepRecord {
                step: step + 1,
                epoch,
                lr: schedule.at(step),
                micro_batches: group,
                synced,
                ..Default::default()
            };
            let mut acc = Accumulation::<B>::new(group);
            let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
            for _ in 0..group {
                let b = batches.next().expect("the epoch has this many batches");
                rec.data_wait_ms += b.wait.as_secs_f64() * 1e3;
                rec.samples += b.samples;
                let t = Instant::now();
                if let Some((real, padded)) = b.value.tokens {
                    *rec.real_tokens.get_or_insert(0) += real as u64;
                    *rec.padded_tokens.get_or_insert(0) += padded as u64;
                }
                let (x, y) = batcher.to_device::<B>(b.value, &device);
                sync();
                rec.h2d_ms += ms(t);
                let t = Instant::now();
                let loss = loss_fn.forward(model.forward(x), y);
                let l = acc.add(&model, loss);
                loss_sum = Some(match loss_sum {
                    Some(s) => s + l,
                    None => l,
                });
                sync();
                rec.forward_backward_ms += ms(t);
            }
            let t = Instant::now();
            let mut grads = acc.grads();
            if let Some(max_norm) = plan.optim.clip_grad_norm {
                grads = clip_grad_norm(&model, grads, max_norm);
            }
            model = optim.step(rec.lr, model, grads);
            sync();
            rec.optimizer_ms = ms(t);
            step += 1;

            let mut actions = policy.decide(Point::AfterStep { step }).to_vec();
            let epoch_done = left == 0 || step == total;
            if epoch_done {
                actions.extend_from_slice(policy.decide(Point::EpochEnd));
            }
            if !actions.is_empty() {
                rec.cleanup_mem_before_bytes = cleanup_mem();
                let t = Instant::now();
                run_cleanup::<B>(&actions, &device);
                sync();
                rec.cleanup_ms = ms(t);
                rec.cleanup_mem_after_bytes = cleanup_mem();
            }
            if let Some((in_use, reserved)) = mem(&device) {
                rec.mem_in_use_bytes = Some(in_use);
                rec.mem_reserved_bytes = Some(reserved);
            }
            rec.rss_bytes = rss_bytes();
            if step == first_step {
                // The first step ends when the device has run it: on a GPU that is when
                // its kernels are compiled and tuned, which is the start-up users wait for.
                let _ = B::sync(&device);
                sink.first_step(ms(started));
            }
            // A checkpoint inside the epoch; one due at its last step is written at its
            // end, after the evaluation (resuming then starts the next epoch).
            let checkpoint_now = persist.is_some()
                && left > 0
                && step < total
                && policy::due(plan.checkpoint.every, Point::AfterStep { step });
            if checkpoint_now {
                // The lines before this step are written first; this step's line is the
                // checkpoint's last (written right after it).
                if let Err(stop) = flush(&mut pending, sink, plan, &mut diverged) {
                    stopped = Some(stop);
                    break;
                }
                let state = checkpoint::State {
                    step,
                    epoch,
                    batch: consumed,
                    epochs_completed,
                    metrics_lines: sink.lines_written() + 1,
                    recipe_sha256: String::new(),
                    reason: format!("every {}", every_words(plan.checkpoint.every)),
                    written_at: crate::clock::utc_now(),
                    best: watching.best,
                    since_best: watching.since_best,
                };
                match checkpoint_at(sink, &model, &optim, state) {
                    Ok(took) => rec.checkpoint_ms = took,
                    Err(stop) => {
                        stopped = Some(stop);
                        break;
                    }
                }
            }
            rec.iter_ms = ms(started);
            rec.t_ms = t0.elapsed().as_secs_f64() * 1e3;
            let loss = loss_sum.expect("a step has micro-batches") / group as f32;
            pending.push((rec, loss));
            if pending.len() as u64 >= plan.log.every || epoch_done || checkpoint_now {
                if let Err(stop) = flush(&mut pending, sink, plan, &mut diverged) {
                    stopped = Some(stop);
                    break;
                }
            }
            // Validation every N steps (inside the epoch; at its end it follows the epoch).
            if left > 0 && policy::due(plan.run.validate, Point::AfterStep { step }) {
                if let Some(v) = &validation {
                    let ctx = (plan, &batcher, &device, persist);
                    match validate(ctx, &model, v, epoch, step, &mut watching, sink) {
                        Ok(true) => {
                            early = true;
                            break;
                        }
                        Ok(false) => {}
                        Err(stop) => {
                            stopped = Some(stop);
                            break;
                        }
                    }
                }
            }
        }
        drop(batches);
        if stopped.is_some() {
            break;
        }
        // `max_steps` can end the run inside an epoch; that epoch is not complete.
        let cut_short = left > 0;
        if !cut_short {
            epochs_completed = epoch + 1;
            sink.epoch_end(epoch);
        }
        if !cut_short && !early && policy::due(plan.run.validate, Point::EpochEnd) {
            if let Some(v) = &validation {
                let ctx = (plan, &batcher, &device, persist);
                match validate(ctx, &model, v, epoch, step, &mut watching, sink) {
                    Ok(stop_now) => early = stop_now,
                    Err(stop) => {
                        stopped = Some(stop);
                        break;
                    }
                }
            }
        }
        if early {
            // Flush what is pending before the run's last evaluation.
            if let Err(stop) = flush(&mut pending, sink, plan, &mut diverged) {
                stopped = Some(stop);
                break;
            }
            sink.early_stopped(step);
        }
        let last = epoch + 1 == plan.run.epochs || step >= total || early;
        let due = match plan.run.eval {
            Eval::Epoch => !cut_short || last,
            Eval::End => last,
            Eval::Never => false,
        };
        if due {
            let all: Vec<usize> = (0..test.len()).collect();
            let e = evaluate(&model.valid(), &test, &all, &batcher, plan, &device);
            sink.eval(&EvalRecord { epoch, step, ..e });
        }
        if step >= total || early {
            break;
        }
        let every = plan.checkpoint.every;
        let step_due = step > 0 && policy::due(every, Point::AfterStep { step });
        if !cut_short && (step_due || policy::due(every, Point::EpochEnd)) && persist.is_some() {
            let state = checkpoint::State {
                step,
                epoch: epoch + 1,
                batch: 0,
                epochs_completed,
                metrics_lines: sink.lines_written(),
                recipe_sha256: String::new(),
                reason: "epoch end".into(),
                written_at: crate::clock::utc_now(),
                best: watching.best,
                since_best: watching.since_best,
            };
            if let Err(stop) = checkpoint_at(sink, &model, &optim, state) {
                stopped = Some(stop);
                break;
            }
        }
    }
    // What is still pending was computed: its lines are written whatever stopped the loop.
    if let Err(stop) = flush(&mut pending, sink, plan, &mut diverged) {
        stopped.get_or_insert(stop);
    }
    if let (None, Some(p), true) = (&stopped, persist, plan.checkpoint.save_final) {
        sink.phase("saving the weights");
        if let Err(e) = checkpoint::save_weights(&model.valid(), &p.run_dir.join(WEIGHTS)) {
            stopped = Some(Stop::Failed(e));
        }
    }
    Outcome {
        parameters,
        loader_workers_started: loader
            .stats
            .workers_started
            .load(std::sync::atomic::Ordering::Relaxed),
        epochs_completed,
        stopped,
        diverged,
    }
}

/// Reads the pending steps' losses back in one transfer and hands the records on. The
/// read waits for the device; it and the writing of the earlier lines are the last
/// record's `log_ms` (and part of its `iter_ms`). Every pending record is handed on; a
/// loss that diverged (`run.max_loss`) is then an error when the plan stops on it, and a
/// failed read-back always is.
fn flush<B: Backend>(
    pending: &mut Vec<(StepRecord, Tensor<B, 1>)>,
    sink: &mut dyn Sink,
    plan: &Plan,
    diverged: &mut Option<(u64, f64)>,
) -> Result<(), Stop> {
    if pending.is_empty() {
        return Ok(());
    }
    let t = Instant::now();
    let (mut recs, losses): (Vec<StepRecord>, Vec<Tensor<B, 1>>) = pending.drain(..).unzip();
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
    for (i, (r, v)) in recs.iter_mut().zip(values).enumerate() {
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
        sink.step(r);
        if diverged.is_none() && !(r.loss.is_finite() && r.loss <= plan.run.max_loss) {
            *diverged = Some((r.step, r.loss));
        }
    }
    match *diverged {
        Some((step, loss)) if plan.run.stop_on_divergence => Err(Stop::Diverged {
            step,
            loss,
            max_loss: plan.run.max_loss,
        }),
        _ => Ok(()),
    }
}

/// Evaluates saved weights (`checkpoint::save_weights`) on all of `test`, without
/// autodiff: what `runner eval` reports.
pub fn evaluate_weights<B: AutodiffBackend>(
    plan: &Plan,
    batcher: &Batcher,
    test: &Dataset,
    weights: &std::path::Path,
    device: &B::Device,
) -> Result<EvalRecord, String> {
    let fresh: Net<B::InnerBackend> = Net::new(&plan.model, batcher.shape, plan.seed, device);
    let model = checkpoint::load_weights(fresh, weights)?;
    let all: Vec<usize> = (0..test.len()).collect();
    Ok(evaluate(&model, test, &all, batcher, plan, device))
}

/// Evaluates on the validation set, reports it, and updates the watched metric: a new
/// best saves `model-best.safetensors`; `Ok(true)` when patience has run out.
fn validate<B: AutodiffBackend>(
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
        if let Some(p) = persist {
            checkpoint::save_weights(&valid, &p.run_dir.join(BEST_WEIGHTS))
                .map_err(Stop::Failed)?;
        }
        sink.best(step, value);
    } else {
        watching.since_best += 1;
    }
    Ok(w.patience.is_some_and(|p| watching.since_best >= p))
}

/// What `warm_up` ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Warmed {
    /// Distinct training batch shapes, each run as one full optimizer step.
    pub train_shapes: usize,
    /// Distinct evaluation batch shapes (0 when the plan never evaluates).
    pub eval_shapes: usize,
    pub micro_batches: usize,
}

/// One representative batch of each distinct shape among `batches`, in first-seen order.
fn distinct_shapes(batcher: &Batcher, data: &Dataset, batches: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut seen = std::collections::HashSet::new();
    batches
        .iter()
        .filter(|b| seen.insert(batcher.shape_of(data, b)))
        .cloned()
        .collect()
}

/// Runs once each computation a run of `plan` will run, so that its kernels are compiled
/// and tuned (and cached) before a real run: for every distinct training batch shape of
/// the first epoch a full optimizer step of `accumulation_steps` micro-batches (and a
/// step of the epoch's last, shorter group where its code path differs), the cleanup
/// actions, and evaluation of each distinct test batch shape. Records nothing.
pub fn warm_up<B: AutodiffBackend>(
    plan: &Plan,
    batcher: &Batcher,
    train: &Dataset,
    test: &Dataset,
    device: &B::Device,
) -> Warmed {
    let mut model: Net<B> = Net::new(&plan.model, batcher.shape, plan.seed, device);
    let mut optim = Optim::<B>::new(&plan.optim);
    let loss_fn: CrossEntropyLoss<B> = loss_config(plan).init(device);
    let batches = crate::loader::epoch_batches(train.len(), &loader_config(plan, train), 0);
    let shapes = distinct_shapes(batcher, train, &batches);
    let accum = plan.optim.accumulation_steps.max(1);
    let mut groups: Vec<(usize, &Vec<usize>)> = shapes.iter().map(|b| (accum, b)).collect();
    // The epoch's last group is shorter when the batches do not divide; a group of one
    // takes another path (no accumulator).
    let rest = batches.len() % accum;
    if accum > 1 && rest == 1 {
        if let Some(first) = shapes.first() {
            groups.push((1, first));
        }
    }
    let mut warmed = Warmed {
        train_shapes: shapes.len(),
        ..Default::default()
    };
    for (group, idx) in groups {
        let mut acc = Accumulation::<B>::new(group);
        for _ in 0..group {
            let (x, y) = batcher.to_device::<B>(batcher.host(train, idx, 0, true), device);
            let loss = loss_fn.forward(model.forward(x), y);
            let _ = acc.add(&model, loss);
            warmed.micro_batches += 1;
        }
        model = optim.step(plan.optim.lr, model, acc.grads());
        let _ = B::sync(device);
    }
    if !plan.cleanup.actions.is_empty() {
        run_cleanup::<B>(&plan.cleanup.actions, device);
    }
    if plan.run.eval != Eval::Never && !test.is_empty() {
        let all: Vec<usize> = (0..test.len()).collect();
        let chunks: Vec<Vec<usize>> = all
            .chunks(plan.loader.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        // Full batches first, a shorter last one last: `evaluate` chunks them back the same.
        let (mut full, partial): (Vec<Vec<usize>>, Vec<Vec<usize>>) =
            distinct_shapes(batcher, test, &chunks)
                .into_iter()
                .partition(|c| c.len() == plan.loader.batch_size);
        warmed.eval_shapes = full.len() + partial.len();
        full.extend(partial);
        let idx: Vec<usize> = full.concat();
        let _ = evaluate(&model.valid(), test, &idx, batcher, plan, device);
    }
    let _ = B::sync(device);
    warmed
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

/// Accuracy and mean loss on the test set, in order, without augmentation or autodiff.
fn evaluate<B: Backend>(
    model: &Net<B>,
    test: &Dataset,
    idx: &[usize],
    batcher: &Batcher,
    plan: &Plan,
    device: &B::Device,
) -> EvalRecord {
    let t = Instant::now();
    let loss_fn: CrossEntropyLoss<B> = CrossEntropyLossConfig::new().init(device);
    let bs = plan.loader.batch_size;
    let n = idx.len();
    let mut correct: Option<Tensor<B, 1, Int>> = None;
    let mut loss_total: Option<Tensor<B, 1>> = None;
    for chunk in idx.chunks(bs) {
        let (x, y) = batcher.to_device::<B>(batcher.host(test, chunk, 0, false), device);
        let logits = model.forward(x);
        let loss = loss_fn.forward(logits.clone(), y.clone()) * chunk.len() as f32;
        let hits = logits.argmax(1).flatten::<1>(0, 1).equal(y).int().sum();
        correct = Some(match correct {
            Some(c) => c + hits,
            None => hits,
        });
        loss_total = Some(match loss_total {
            Some(l) => l + loss,
            None => loss,
        });
    }
    let read_i = |t: Option<Tensor<B, 1, Int>>| {
        t.map_or(0.0, |t| {
            t.into_data()
                .convert::<i64>()
                .into_vec::<i64>()
                .map_or(0.0, |v| v[0] as f64)
        })
    };
    let read_f = |t: Option<Tensor<B, 1>>| {
        t.map_or(0.0, |t| {
            t.into_data()
                .convert::<f64>()
                .into_vec::<f64>()
                .map_or(0.0, |v| v[0])
        })
    };
    let hits = read_i(correct);
    let loss = read_f(loss_total);
    EvalRecord {
        epoch: 0,
        step: 0,
        samples: n,
        accuracy: if n > 0 { hits / n as f64 } else { 0.0 },
        loss: if n > 0 { loss / n as f64 } else { 0.0 },
        ms: ms(t),
    }
}
