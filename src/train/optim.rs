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
/// `GradientsAccumulator` sums, so each micro-batch's loss is first weighted by its share
/// of the step's samples (1/k where the k micro-batches are alike): the step then sees the
/// mean gradient over its samples, as one batch of them all would give, also where a
/// micro-batch is short (an epoch's last, a bucket's last). The training loop and `runner
/// warmup` both run a step through this, so warm-up compiles what a run runs.
pub struct Accumulation<B: TrainBackend> {
    group: usize,
    /// The samples of the step's micro-batches together.
    samples: usize,
    acc: GradientsAccumulator<Net<B>>,
    single: Option<GradientsParams>,
    /// The micro-batches' losses so far, each weighted by its share, detached, on the
    /// device: their sum is the step's loss.
    loss_sum: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: TrainBackend> Accumulation<B> {
    /// For a step of `group` micro-batches holding `samples` samples in all.
    pub fn new(group: usize, samples: usize) -> Self {
        Self {
            group,
            samples: samples.max(1),
            acc: GradientsAccumulator::new(),
            single: None,
            loss_sum: None,
        }
    }

    /// One micro-batch of `samples` samples: the forward pass, the training loss, and its
    /// backward pass into the step's gradients.
    pub fn micro_batch(
        &mut self,
        model: &Net<B>,
        loss_fn: &CrossEntropyLoss<B>,
        (x, y): (Input<B>, Tensor<B, 1, Int>),
        samples: usize,
    ) {
        let loss = loss_fn.forward(model.forward(x), y);
        // Divided by the step's samples over its own: k, exactly, for k micro-batches
        // alike (as 1/k was), so a run whose micro-batches are all alike is unchanged.
        let parts = self.samples as f32 / samples.max(1) as f32;
        let value = loss.clone().inner();
        let value = if self.group == 1 {
            self.single = Some(GradientsParams::from_grads(loss.backward(), model));
            value
        } else {
            let scaled = loss / parts;
            self.acc
                .accumulate(model, GradientsParams::from_grads(scaled.backward(), model));
            value / parts
        };
        self.loss_sum = Some(match self.loss_sum.take() {
            Some(s) => s + value,
            None => value,
        });
    }

    /// The step's loss: the mean over its samples (its micro-batches' losses, each
    /// weighted by its share), on the device (read back with other steps' later, so the
    /// step does not wait on it).
    pub fn mean_loss(&self) -> Tensor<B::InnerBackend, 1> {
        self.loss_sum.clone().expect("a step has micro-batches")
    }

    pub fn grads(mut self) -> GradientsParams {
        self.single.take().unwrap_or_else(|| self.acc.grads())
    }
}

/// The convolution weights on CubeCL (WebGPU over software Vulkan in CI; CUDA in the GPU
/// check's self-test), fused and not: built channels-last (`Net::in_device_layouts`), and
/// kept so by every optimizer step, which writes a parameter in its own layout. A weight
/// that changed layout after its first step would make CubeCL's convolution autotune a
/// second key for it (its key holds the weight's stride alignment), and `runner warmup`,
/// one step a shape, would miss it.
#[cfg(all(test, feature = "cube"))]
mod cube_tests {
    use burn::backend::Autodiff;
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::ops::FloatTensor;

    use super::*;
    use crate::plan::{ModelPlan, NetPlan, OptimPlan};
    use crate::recipe::{Schedule, Stem};

    use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
    use burn_fusion::Fusion;

    type Plain<R, BT> = CubeBackend<R, f32, i32, BT>;

    /// The strides a tensor of the inner backend has in memory (the fused one's, once
    /// fusion has run what it waits on).
    trait Strides: TrainBackend {
        fn strides(t: FloatTensor<Self::InnerBackend>) -> Vec<usize>;
    }

    impl<R: CubeRuntime, BT: BoolElement> Strides for Autodiff<Plain<R, BT>> {
        fn strides(t: FloatTensor<Plain<R, BT>>) -> Vec<usize> {
            t.meta.strides().to_vec()
        }
    }

    impl<R: CubeRuntime, BT: BoolElement> Strides for Autodiff<Fusion<Plain<R, BT>>> {
        fn strides(t: FloatTensor<Fusion<Plain<R, BT>>>) -> Vec<usize> {
            let client = t.client.clone();
            Autodiff::<Plain<R, BT>>::strides(client.resolve_tensor_float::<Plain<R, BT>>(t))
        }
    }

    /// Each 4-D weight's shape and whether its channels are its contiguous axis, in
    /// module order.
    fn layouts<B: Strides>(model: &Net<B>) -> Vec<([usize; 4], bool)> {
        struct Seen<B: Strides>(Vec<([usize; 4], bool)>, std::marker::PhantomData<B>);
        impl<B: Strides> ModuleVisitor<B> for Seen<B> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if D == 4 {
                    let t = param.val().inner();
                    let dims: [usize; 4] = t.dims().to_vec().try_into().unwrap();
                    let s = B::strides(t.into_primitive().tensor());
                    self.0.push((dims, s[1] == 1));
                }
            }
        }
        let mut seen = Seen::<B>(vec![], std::marker::PhantomData);
        model.visit(&mut seen);
        seen.0
    }

    fn optim_plan(optimizer: OptimizerKind) -> OptimPlan {
        OptimPlan {
            optimizer,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 5e-4,
            nesterov: false,
            betas: [0.9, 0.999],
            eps: 1e-8,
            accumulation_steps: 1,
            schedule: crate::schedule::LrSchedule {
                kind: Schedule::Constant,
                lr: 0.05,
                warmup_steps: 0,
                min_lr: 0.0,
                step_size: 1,
                gamma: 1.0,
                total_steps: 3,
            },
            clip_grad_norm: None,
            label_smoothing: 0.0,
        }
    }

    /// Every parameter's values, in module order.
    fn values<B: Strides>(model: &Net<B>) -> Vec<f32> {
        struct All(Vec<f32>);
        impl<B: Backend> ModuleVisitor<B> for All {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0
                    .extend(param.val().into_data().to_vec::<f32>().unwrap());
            }
        }
        let mut all = All(vec![]);
        model.visit(&mut all);
        all.0
    }

    /// The weights' layouts when built, then after each of three optimizer steps; and the
    /// parameters' values then.
    #[allow(clippy::type_complexity)]
    fn train<B: Strides>(
        net: &NetPlan,
        optimizer: OptimizerKind,
    ) -> (Vec<Vec<([usize; 4], bool)>>, Vec<f32>) {
        let device = Default::default();
        let plan = ModelPlan {
            num_classes: 3,
            net: net.clone(),
        };
        let shape = Shape::Image {
            channels: 3,
            side: 8,
        };
        let mut model = Net::<B>::new(&plan, shape, 7, &device);
        let mut optim = Optim::<B>::new(&optim_plan(optimizer));
        let mut seen = vec![layouts(&model)];
        for step in 0..3 {
            let x: Vec<f32> = (0..2 * 3 * 8 * 8)
                .map(|i| ((i * 7 + step * 13) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let x = Tensor::<B, 4>::from_data(TensorData::new(x, [2, 3, 8, 8]), &device);
            let loss = model.forward(Input::Images(x)).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(0.05, model, grads);
            seen.push(layouts(&model));
        }
        (seen, values(&model))
    }

    /// The check, on a runtime's fused and plain backends.
    fn built_channels_last_and_stay_so<R: CubeRuntime, BT: BoolElement>()
    where
        Autodiff<Fusion<Plain<R, BT>>>: TrainBackend,
        Autodiff<Plain<R, BT>>: TrainBackend,
    {
        // ResNet-18 (1×1 weights, strided convolutions) with SGD only: on software Vulkan
        // its steps take a minute.
        let runs = [
            (NetPlan::SmallCnn { width: 4 }, OptimizerKind::Sgd),
            (NetPlan::SmallCnn { width: 4 }, OptimizerKind::Adamw),
            (NetPlan::Resnet18 { stem: Stem::Cifar }, OptimizerKind::Sgd),
        ];
        for (net, optimizer) in &runs {
            let (net, optimizer) = (net, *optimizer);
            {
                let runs = [
                    (
                        "fused",
                        train::<Autodiff<Fusion<Plain<R, BT>>>>(net, optimizer),
                    ),
                    ("plain", train::<Autodiff<Plain<R, BT>>>(net, optimizer)),
                ];
                // The same model (one seed), the same batches and the same kernels: the
                // fused steps, queued as custom operations, take the plain ones'.
                let (fused, plain) = (&runs[0].1 .1, &runs[1].1 .1);
                assert_eq!(fused.len(), plain.len());
                let worst = (fused.iter().zip(plain))
                    .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                    .fold(0.0f32, f32::max);
                assert!(
                    worst < 1e-4,
                    "{net:?} {optimizer:?}: fused against plain, off by {worst}"
                );
                for (backend, (seen, _)) in runs {
                    let weights = seen[0].len();
                    assert!(weights > 0, "{backend} {net:?}: no convolution weights");
                    for (step, layouts) in seen.iter().enumerate() {
                        assert_eq!(layouts.len(), weights);
                        for (dims, last) in layouts {
                            assert!(
                                *last,
                                "{backend} {net:?} {optimizer:?}, after {step} steps: weight {dims:?} is not channels-last"
                            );
                        }
                    }
                }
            }
        }
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn wgpu_conv_weights_are_built_channels_last_and_stay_so() {
        built_channels_last_and_stay_so::<cubecl::wgpu::WgpuRuntime, u32>();
    }

    /// On CUDA, where the GPU check's self-test (`cuda_named`) runs it. Without a CUDA
    /// device it says so and passes.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_named_conv_weights_are_built_channels_last_and_stay_so() {
        if !crate::backend::cuda_devices().is_ok_and(|d| !d.is_empty()) {
            eprintln!("no CUDA device here: the weights' layouts are not checked");
            return;
        }
        built_channels_last_and_stay_so::<cubecl::cuda::CudaRuntime, u8>();
        eprintln!(
            "conv weights on CUDA: channels-last when built and after three steps, fused and plain"
        );
    }
}
