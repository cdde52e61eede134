//! The optimizer step's parts: the recipe's optimizer with PyTorch's semantics, gradient
//! accumulation, global-norm clipping, and the training loss.

use super::*;
use crate::ops::optim::{AdamWSettings, FusedAdamW, FusedSgd, SgdSettings};

/// The recipe's optimizer, built with PyTorch's semantics.
pub enum Optim<B: TrainBackend> {
    Sgd(OptimizerAdaptor<FusedSgd, Net<B>, B>),
    AdamW(OptimizerAdaptor<FusedAdamW, Net<B>, B>),
}

impl<B: TrainBackend> Optim<B> {
    /// PyTorch semantics: SGD momentum without dampening (Burn defaults to 0.1), L2 weight
    /// decay on the gradient; AdamW with decoupled decay and the recipe's eps (Burn: 1e-5).
    /// Each one op per parameter (`ops::optim`).
    pub fn new(p: &crate::plan::OptimPlan) -> Self {
        match p.optimizer {
            OptimizerKind::Sgd => Optim::Sgd(
                FusedSgd::new(SgdSettings {
                    momentum: p.momentum,
                    dampening: 0.0,
                    nesterov: p.nesterov,
                    weight_decay: p.weight_decay,
                })
                .init(),
            ),
            OptimizerKind::Adamw => Optim::AdamW(
                FusedAdamW::new(AdamWSettings {
                    beta_1: p.betas[0] as f32,
                    beta_2: p.betas[1] as f32,
                    epsilon: p.eps as f32,
                    weight_decay: p.weight_decay as f32,
                })
                .init(),
            ),
        }
    }

    fn step(&mut self, lr: f64, model: Net<B>, grads: GradientsParams) -> Net<B> {
        match self {
            Optim::Sgd(o) => o.step(lr, model, grads),
            Optim::AdamW(o) => o.step(lr, model, grads),
        }
    }

    /// The update an optimizer step makes: the step's accumulated gradients, clipped to
    /// `optim.clip_grad_norm`, then the optimizer. The training loop and `runner warmup`
    /// both take it, so warm-up runs the same kernels as a run.
    pub fn update(
        &mut self,
        p: &crate::plan::OptimPlan,
        lr: f64,
        model: Net<B>,
        acc: Accumulation<B>,
    ) -> Net<B> {
        let mut grads = acc.grads();
        if let Some(max_norm) = p.clip_grad_norm {
            grads = clip_grad_norm(&model, grads, max_norm);
        }
        self.step(lr, model, grads)
    }
}

/// Scales the gradients so that their global L2 norm (every parameter together) is at most
/// `max_norm`, as `torch.nn.utils.clip_grad_norm_` (coefficient `max_norm / (norm + 1e-6)`,
/// clamped to 1). The norm stays on the device: no read-back, no sync.
pub fn clip_grad_norm<B: TrainBackend>(
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

/// One optimizer step's micro-batches: their gradients, summed, and their losses. Burn's
/// `GradientsAccumulator` sums, so each micro-batch's loss is scaled by 1/k first: the step
/// then sees the mean gradient, as one batch k times larger would give. The training loop
/// and `runner warmup` both run a step through this, so warm-up compiles what a run runs.
pub struct Accumulation<B: TrainBackend> {
    group: usize,
    acc: GradientsAccumulator<Net<B>>,
    single: Option<GradientsParams>,
    /// The sum of the micro-batches' losses so far, detached, on the device.
    loss_sum: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: TrainBackend> Accumulation<B> {
    /// For a step of `group` micro-batches.
    pub fn new(group: usize) -> Self {
        Self {
            group,
            acc: GradientsAccumulator::new(),
            single: None,
            loss_sum: None,
        }
    }

    /// One micro-batch: the forward pass, the training loss, and its backward pass into
    /// the step's gradients.
    pub fn micro_batch(
        &mut self,
        model: &Net<B>,
        loss_fn: &CrossEntropyLoss<B>,
        x: Input<B>,
        y: Tensor<B, 1, Int>,
    ) {
        let loss = loss_fn.forward(model.forward(x), y);
        let value = loss.clone().inner();
        if self.group == 1 {
            self.single = Some(GradientsParams::from_grads(loss.backward(), model));
        } else {
            let scaled = loss / self.group as f32;
            self.acc
                .accumulate(model, GradientsParams::from_grads(scaled.backward(), model));
        }
        self.loss_sum = Some(match self.loss_sum.take() {
            Some(s) => s + value,
            None => value,
        });
    }

    /// The step's loss: the mean of its micro-batches' losses, unscaled, on the device
    /// (read back with other steps' later, so the step does not wait on it).
    pub fn mean_loss(&self) -> Tensor<B::InnerBackend, 1> {
        let sum = self.loss_sum.clone().expect("a step has micro-batches");
        sum / self.group as f32
    }

    pub fn grads(mut self) -> GradientsParams {
        self.single.take().unwrap_or_else(|| self.acc.grads())
    }
}
