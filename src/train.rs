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
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::backend::MemFn;
use crate::data::{Images, Pixels, Prepare};
use crate::loader::{Loader, LoaderConfig};
use crate::metrics::{rss_bytes, Eval as EvalRecord, StepRecord};
use crate::model::Net;
use crate::plan::Plan;
use crate::policy::{trim_host, CleanupPolicy, Point};
use crate::recipe::{CleanupAction, Eval, NormalizeOn, Optimizer as OptimKind};

/// Where the loop reports what happens.
pub trait Sink {
    /// Called once the model exists, before the first step.
    fn started(&mut self, parameters: usize);
    /// Each optimizer step's record, in order (written when its loss has been read back).
    fn step(&mut self, record: &StepRecord);
    fn eval(&mut self, eval: &EvalRecord);
    fn epoch_end(&mut self, epoch: usize);
}

/// What a finished loop hands back beyond what the sink saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub parameters: usize,
    pub loader_workers_started: usize,
    pub epochs_completed: usize,
}

/// A batch as the loader's workers prepare it: host tensors, staged for the copy if asked.
pub struct HostBatch {
    images: TensorData,
    labels: TensorData,
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

/// The host-side preparation and the device-side normalisation a plan asks for.
pub fn preparation(plan: &Plan) -> (Prepare, Option<Vec<(f32, f32)>>) {
    let n = &plan.data.normalize;
    let affine = Prepare::affine(&n.mean, &n.std);
    let on_host = n.on == NormalizeOn::Host;
    let prep = Prepare {
        crop_padding: plan.data.crop_padding,
        hflip: plan.data.hflip,
        host_affine: on_host.then(|| affine.clone()),
        seed: plan.seed,
    };
    (prep, (!on_host).then_some(affine))
}

pub fn host_batch(pixels: Pixels, labels: Vec<i32>, shape: [usize; 4]) -> HostBatch {
    let images = match pixels {
        Pixels::F32(v) => TensorData::new(v, shape),
        Pixels::U8(v) => TensorData::new(v, shape),
    };
    let n = labels.len();
    HostBatch {
        images,
        labels: TensorData::new(labels, [n]),
    }
}

/// Host batch → device tensors. Bytes are cast and normalised on the device.
pub fn to_device<B: Backend>(
    b: HostBatch,
    device_affine: Option<&[(f32, f32)]>,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let labels = Tensor::<B, 1, Int>::from_data(b.labels, device);
    let images = if b.images.dtype == DType::U8 {
        let c = b.images.shape[1];
        let bytes = Tensor::<B, 4, Int>::from_data(b.images, (device, DType::U8)).float();
        let (scale, shift): (Vec<f32>, Vec<f32>) = match device_affine {
            Some(a) => a.iter().copied().unzip(),
            None => (vec![1.0 / 255.0; c], vec![0.0; c]),
        };
        let scale = Tensor::<B, 4>::from_data(TensorData::new(scale, [1, c, 1, 1]), device);
        let shift = Tensor::<B, 4>::from_data(TensorData::new(shift, [1, c, 1, 1]), device);
        bytes * scale + shift
    } else {
        Tensor::<B, 4>::from_data(b.images, device)
    };
    (images, labels)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Trains the plan's model on `train` and evaluates on `test`, reporting to `sink`.
pub fn train<B: AutodiffBackend>(
    plan: &Plan,
    train: Arc<Images>,
    test: Arc<Images>,
    device: B::Device,
    mem: MemFn<B::Device>,
    t0: Instant,
    sink: &mut dyn Sink,
) -> Outcome {
    B::seed(&device, plan.seed);
    let d = &plan.data;
    let mut model: Net<B> = Net::new(&plan.model, d.channels, d.height, &device);
    let parameters = model.parameters();
    sink.started(parameters);
    let mut optim = Optim::<B>::new(&plan.optim);
    let loss_fn: CrossEntropyLoss<B> = CrossEntropyLossConfig::new().init(&device);
    let schedule = plan.lr_schedule();
    let policy = CleanupPolicy {
        every: plan.cleanup.every,
        actions: plan.cleanup.actions.clone(),
    };
    let (prep, device_affine) = preparation(plan);

    let make = {
        let data = Arc::clone(&train);
        let prep = prep.clone();
        let stage = plan.loader.pin_memory;
        let device = device.clone();
        let shape = [d.channels, d.height, d.width];
        Arc::new(move |idx: &[usize], epoch: usize| {
            let pixels = prep.batch(&data, idx, epoch, true);
            let labels = idx.iter().map(|&i| data.labels[i] as i32).collect();
            let mut b = host_batch(pixels, labels, [idx.len(), shape[0], shape[1], shape[2]]);
            if stage {
                B::staging([&mut b.images, &mut b.labels].into_iter(), &device);
            }
            b
        })
    };
    let l = &plan.loader;
    let mut loader = Loader::new(
        LoaderConfig {
            batch_size: l.batch_size,
            workers: l.workers,
            persistent_workers: l.persistent_workers,
            prefetch: l.prefetch,
            shuffle: l.shuffle,
            drop_last: l.drop_last,
            seed: plan.seed,
        },
        train.len(),
        make,
    );

    let accum = plan.optim.accumulation_steps;
    let total = plan.run.total_steps;
    let mut step: u64 = 0;
    // Records whose loss is still on the device, read back every `log.every` steps.
    let mut pending: Vec<(StepRecord, Tensor<B::InnerBackend, 1>)> = vec![];
    let mut epochs_completed = 0;
    // What a cleanup frees: the pool's reserved bytes on a device with one, else RSS.
    let cleanup_mem = || {
        mem(&device)
            .map(|(_, reserved)| reserved)
            .or_else(rss_bytes)
    };

    for epoch in 0..plan.run.epochs {
        let mut batches = loader.epoch(epoch);
        let mut left = batches.len();
        while left > 0 && step < total {
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
                let (x, y) = to_device::<B>(b.value, device_affine.as_deref(), &device);
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
            let grads = acc.grads();
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
            rec.iter_ms = ms(started);
            rec.t_ms = t0.elapsed().as_secs_f64() * 1e3;
            let loss = loss_sum.expect("a step has micro-batches") / group as f32;
            pending.push((rec, loss));
            if pending.len() as u64 >= plan.log.every || epoch_done {
                flush(&mut pending, sink);
            }
        }
        drop(batches);
        // `max_steps` can end the run inside an epoch; that epoch is not complete.
        let cut_short = left > 0;
        if !cut_short {
            epochs_completed = epoch + 1;
            sink.epoch_end(epoch);
        }
        let last = epoch + 1 == plan.run.epochs || step >= total;
        let due = match plan.run.eval {
            Eval::Epoch => !cut_short || last,
            Eval::End => last,
            Eval::Never => false,
        };
        if due {
            let e = evaluate(
                &model.valid(),
                &test,
                &prep,
                device_affine.as_deref(),
                plan,
                &device,
            );
            sink.eval(&EvalRecord { epoch, step, ..e });
        }
        if step >= total {
            break;
        }
    }
    flush(&mut pending, sink);
    Outcome {
        parameters,
        loader_workers_started: loader
            .stats
            .workers_started
            .load(std::sync::atomic::Ordering::Relaxed),
        epochs_completed,
    }
}

/// Reads the pending steps' losses back in one transfer and hands the records on. The
/// read waits for the device; it and the writing of the earlier lines are the last
/// record's `log_ms` (and part of its `iter_ms`).
fn flush<B: Backend>(pending: &mut Vec<(StepRecord, Tensor<B, 1>)>, sink: &mut dyn Sink) {
    if pending.is_empty() {
        return;
    }
    let t = Instant::now();
    let (mut recs, losses): (Vec<StepRecord>, Vec<Tensor<B, 1>>) = pending.drain(..).unzip();
    let values: Vec<f32> = Tensor::cat(losses, 0)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap_or_default();
    let n = recs.len();
    for (i, (r, v)) in recs.iter_mut().zip(values).enumerate() {
        r.loss = v as f64;
        if i + 1 == n {
            r.log_ms = ms(t);
            r.iter_ms += r.log_ms;
            r.t_ms += r.log_ms;
        }
        r.samples_per_s = if r.iter_ms > 0.0 {
            r.samples as f64 / (r.iter_ms / 1e3)
        } else {
            0.0
        };
        sink.step(r);
    }
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
    test: &Images,
    prep: &Prepare,
    device_affine: Option<&[(f32, f32)]>,
    plan: &Plan,
    device: &B::Device,
) -> EvalRecord {
    let t = Instant::now();
    let loss_fn: CrossEntropyLoss<B> = CrossEntropyLossConfig::new().init(device);
    let bs = plan.loader.batch_size;
    let n = test.len();
    let mut correct: Option<Tensor<B, 1, Int>> = None;
    let mut loss_total: Option<Tensor<B, 1>> = None;
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(bs) {
        let pixels = prep.batch(test, chunk, 0, false);
        let labels = chunk.iter().map(|&i| test.labels[i] as i32).collect();
        let shape = [chunk.len(), test.channels, test.height, test.width];
        let (x, y) = to_device::<B>(host_batch(pixels, labels, shape), device_affine, device);
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
