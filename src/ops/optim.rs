//! The optimizers' per-parameter updates as backend ops, and the optimizers that call them
//! ([`FusedSgd`], [`FusedAdamW`]; PyTorch's semantics as `train::optim` configures them).
//! The defaults compose Burn's tensor ops in the order Burn's own `Sgd` and `AdamW` do
//! (what CUDA runs with fusion, fused by Burn; without fusion each is one kernel of the
//! runner's own, `optim_cube`); Flex overrides them with one parallel pass that updates
//! the parameter and its state in place. Burn's `Sgd` makes up to seven whole-tensor passes
//! per parameter (weight decay, momentum, Nesterov, the learning-rate scale, the
//! subtraction) and `AdamW` about fourteen, most into a new buffer, and Flex runs elementwise
//! ops on one thread: 44 ms of a 960 ms ResNet-18 step on 2 cores, half of a Rotten
//! Tomatoes step, where one pass reads each of parameter, gradient and state once.
//!
//! The arithmetic is Burn's, rounded step by step in the same order, so a run is the same
//! to the bit with either; the states are records of the same shape as Burn's (`AdamW`'s
//! is Burn's own type), so checkpoints written with Burn's optimizers load (tests check
//! both).

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn::optim::{AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::record::Record;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

/// SGD's settings, as PyTorch names them; `momentum` 0 is plain SGD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdSettings {
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
}

/// The scalars of one update, in `f32` as Burn's scalar ops convert them.
#[derive(Debug, Clone, Copy)]
pub struct SgdScalars {
    pub lr: f32,
    /// `None`: no momentum (no velocity is kept).
    pub momentum: Option<f32>,
    /// `1 − dampening`.
    pub keep: f32,
    pub nesterov: bool,
    /// `None`: no weight decay.
    pub decay: Option<f32>,
}

impl SgdSettings {
    fn scalars(&self, lr: LearningRate) -> SgdScalars {
        SgdScalars {
            lr: lr as f32,
            momentum: (self.momentum > 0.0).then_some(self.momentum as f32),
            keep: (1.0 - self.dampening) as f32,
            nesterov: self.nesterov,
            decay: (self.weight_decay > 0.0).then_some(self.weight_decay as f32),
        }
    }
}

/// A backend the optimizers can update parameters on. The defaults compose Burn's ops.
pub trait OptimBackend: Backend {
    /// The parameter after one step, and its velocity (`Some` where `s.momentum` is):
    /// `g ← g + decay·p`; `v ← keep·g + momentum·v` (`v ← g` on the first step);
    /// `g ← g + momentum·v` with Nesterov, else `v`; `p ← p − lr·g`.
    fn sgd_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        velocity: Option<Tensor<Self, D>>,
        s: SgdScalars,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        composed(param, grad, velocity, s)
    }

    /// AdamW's step: the parameter and its first and second moments, from the moments of
    /// the step before (`None` on the first): `m ← β₁·m + (1−β₁)·g`, `v ← β₂·v + (1−β₂)·g²`
    /// (`m ← (1−β₁)·g`, `v ← (1−β₂)·g²` on the first step); `p ← keep·p − lr·m̂/(√v̂ + ε)`
    /// with `m̂ = m/c₁`, `v̂ = v/c₂`.
    #[allow(clippy::type_complexity)]
    fn adamw_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        moments: Option<(Tensor<Self, D>, Tensor<Self, D>)>,
        s: AdamWScalars,
    ) -> (Tensor<Self, D>, Tensor<Self, D>, Tensor<Self, D>) {
        composed_adamw(param, grad, moments, s)
    }
}

/// Burn 0.21's `Sgd::step` (with `WeightDecay` and `Momentum`), op for op.
fn composed<B: Backend, const D: usize>(
    param: Tensor<B, D>,
    mut grad: Tensor<B, D>,
    velocity: Option<Tensor<B, D>>,
    s: SgdScalars,
) -> (Tensor<B, D>, Option<Tensor<B, D>>) {
    if let Some(decay) = s.decay {
        grad = param.clone().mul_scalar(decay).add(grad);
    }
    let mut kept = None;
    if let Some(momentum) = s.momentum {
        let v = match velocity {
            Some(v) => grad.clone().mul_scalar(s.keep).add(v.mul_scalar(momentum)),
            None => grad.clone(),
        };
        grad = if s.nesterov {
            v.clone().mul_scalar(momentum).add(grad)
        } else {
            v.clone()
        };
        kept = Some(v);
    }
    (param - grad.mul_scalar(s.lr), kept)
}

/// AdamW's settings; `weight_decay` is decoupled (`p ← (1 − lr·decay)·p` before the step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
}

/// The scalars of one AdamW step, as Burn's `AdamW` computes and rounds them.
#[derive(Debug, Clone, Copy)]
pub struct AdamWScalars {
    pub lr: f32,
    pub beta_1: f32,
    pub beta_2: f32,
    /// `1 − β₁`, `1 − β₂`.
    pub factor_1: f32,
    pub factor_2: f32,
    /// The bias corrections `1 − β₁ᵗ`, `1 − β₂ᵗ` at this step `t` (from 1).
    pub correction_1: f32,
    pub correction_2: f32,
    pub epsilon: f32,
    /// `1 − lr·decay`; `None` where that product is 0 (the parameter is not scaled).
    pub keep: Option<f32>,
}

impl AdamWSettings {
    fn scalars(&self, lr: LearningRate, time: i32) -> AdamWScalars {
        let decay_rate = lr * f64::from(self.weight_decay);
        AdamWScalars {
            lr: lr as f32,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            factor_1: 1.0 - self.beta_1,
            factor_2: 1.0 - self.beta_2,
            correction_1: 1.0 - self.beta_1.powi(time),
            correction_2: 1.0 - self.beta_2.powi(time),
            epsilon: self.epsilon,
            keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
        }
    }
}

/// Burn 0.21's `AdamW::step` (without AMSGrad or cautious decay), op for op.
#[allow(clippy::type_complexity)]
fn composed_adamw<B: Backend, const D: usize>(
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
    s: AdamWScalars,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    let (m, v) = match moments {
        Some((m, v)) => (
            m.mul_scalar(s.beta_1)
                .add(grad.clone().mul_scalar(s.factor_1)),
            v.mul_scalar(s.beta_2)
                .add(grad.square().mul_scalar(s.factor_2)),
        ),
        None => (
            grad.clone().mul_scalar(s.factor_1),
            grad.square().mul_scalar(s.factor_2),
        ),
    };
    let m_hat = m.clone().div_scalar(s.correction_1);
    let v_hat = v.clone().div_scalar(s.correction_2);
    let delta = m_hat.div(v_hat.sqrt().add_scalar(s.epsilon));
    let decayed = match s.keep {
        Some(keep) => param.mul_scalar(keep),
        None => param,
    };
    (decayed - delta.mul_scalar(s.lr), m, v)
}

impl OptimBackend for Flex {
    fn sgd_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        velocity: Option<Tensor<Self, D>>,
        s: SgdScalars,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        // The one pass zips the buffers: each must be an `f32` tensor of the parameter's shape.
        let fits = |t: &Tensor<Self, D>| t.dtype() == DType::F32 && t.shape() == param.shape();
        let momentum_kept = s.momentum.is_some() || velocity.is_none();
        if !(fits(&param) && fits(&grad) && velocity.as_ref().is_none_or(fits) && momentum_kept) {
            return composed(param, grad, velocity, s);
        }
        let mut p = owned(param);
        let g = owned(grad);
        let grad = super::values(&g);
        match (s.momentum, velocity.map(owned)) {
            (None, _) => {
                update(p.storage_mut::<f32>(), grad, None, s);
                (back(p), None)
            }
            (Some(_), Some(mut v)) => {
                update(
                    p.storage_mut::<f32>(),
                    grad,
                    Some(v.storage_mut::<f32>()),
                    s,
                );
                (back(p), Some(back(v)))
            }
            (Some(_), None) => {
                // The first step: the velocity starts as the (decayed) gradient.
                let mut first = FlexTensor::zeros(p.shape(), DType::F32);
                update_first(p.storage_mut::<f32>(), grad, first.storage_mut::<f32>(), s);
                (back(p), Some(back(first)))
            }
        }
    }

    fn adamw_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        moments: Option<(Tensor<Self, D>, Tensor<Self, D>)>,
        s: AdamWScalars,
    ) -> (Tensor<Self, D>, Tensor<Self, D>, Tensor<Self, D>) {
        let fits = |t: &Tensor<Self, D>| t.dtype() == DType::F32 && t.shape() == param.shape();
        let moments_fit = moments.as_ref().is_none_or(|(m, v)| fits(m) && fits(v));
        if !(fits(&param) && fits(&grad) && moments_fit) {
            return composed_adamw(param, grad, moments, s);
        }
        let (mut p, g) = (owned(param), owned(grad));
        let grad = super::values(&g);
        let first = moments.is_none();
        let (mut m, mut v) = match moments {
            Some((m, v)) => (owned(m), owned(v)),
            None => (
                FlexTensor::zeros(p.shape(), DType::F32),
                FlexTensor::zeros(p.shape(), DType::F32),
            ),
        };
        let (ps, ms, vs) = (
            p.storage_mut::<f32>(),
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
        );
        ps.par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .zip(ms.par_chunks_mut(CHUNK).zip(vs.par_chunks_mut(CHUNK)))
            .for_each(|((p, g), (m, v))| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                    adamw_element(p, g, (m, v), first, s);
                }
            });
        (back(p), back(m), back(v))
    }
}

/// A Flex tensor's contiguous buffer, unshared where nothing else holds it: the copy
/// shares the buffer where it already was contiguous, and dropping the original leaves it
/// the only owner, so `storage_mut` writes in place (it copies only what is still shared).
fn owned<const D: usize>(t: Tensor<Flex, D>) -> FlexTensor {
    let t = t.into_primitive().tensor();
    let contiguous = t.to_contiguous();
    drop(t);
    contiguous
}

fn back<const D: usize>(t: FlexTensor) -> Tensor<Flex, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Elements per parallel task: large enough that a task costs more than handing it out.
const CHUNK: usize = 1 << 14;

/// One element's step, rounded as Burn's ops round: `v` is `None` without momentum, and
/// `first` says the velocity starts here (its old value is not read).
#[inline(always)]
fn element(p: &mut f32, g: f32, v: Option<&mut f32>, first: bool, s: SgdScalars) {
    let g = match s.decay {
        Some(decay) => *p * decay + g,
        None => g,
    };
    let step = match (s.momentum, v) {
        (Some(m), Some(v)) => {
            *v = if first { g } else { g * s.keep + *v * m };
            if s.nesterov {
                *v * m + g
            } else {
                *v
            }
        }
        _ => g,
    };
    *p -= step * s.lr;
}

/// One element's AdamW step, rounded as Burn's ops round; `first` says the moments start
/// here (their old values are not read).
#[inline(always)]
fn adamw_element(p: &mut f32, g: f32, (m, v): (&mut f32, &mut f32), first: bool, s: AdamWScalars) {
    let g2 = g * g;
    if first {
        *m = g * s.factor_1;
        *v = g2 * s.factor_2;
    } else {
        *m = *m * s.beta_1 + g * s.factor_1;
        *v = *v * s.beta_2 + g2 * s.factor_2;
    }
    let delta = (*m / s.correction_1) / ((*v / s.correction_2).sqrt() + s.epsilon);
    let decayed = match s.keep {
        Some(keep) => *p * keep,
        None => *p,
    };
    *p = decayed - delta * s.lr;
}

fn update(p: &mut [f32], g: &[f32], v: Option<&mut [f32]>, s: SgdScalars) {
    match v {
        Some(v) => p
            .par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(v.par_chunks_mut(CHUNK)))
            .for_each(|(p, (g, v))| {
                for ((p, &g), v) in p.iter_mut().zip(g).zip(v) {
                    element(p, g, Some(v), false, s);
                }
            }),
        None => p
            .par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(p, g)| {
                for (p, &g) in p.iter_mut().zip(g) {
                    element(p, g, None, false, s);
                }
            }),
    }
}

fn update_first(p: &mut [f32], g: &[f32], v: &mut [f32], s: SgdScalars) {
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|(p, (g, v))| {
            for ((p, &g), v) in p.iter_mut().zip(g).zip(v) {
                element(p, g, Some(v), true, s);
            }
        });
}

/// CubeCL's backends: SGD and AdamW in one kernel per parameter (`optim_cube`), which
/// writes the new parameter (and its state) in the parameter's own layout, so that a
/// convolution weight held channels-last stays so (`Net::in_device_layouts`). On the
/// fused backend a 4-D parameter's step (a convolution weight's) is a custom operation
/// of fusion's stream that runs the same ([`queue_step`]): fusion's own kernel for the
/// composed ops wrote a channels-last weight back in another layout. The others' steps
/// (biases, the batch norms' scales and shifts, linear layers) stay Burn's ops, which
/// fusion joins, several parameters to a kernel.
#[cfg(feature = "cube")]
impl<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement> OptimBackend
    for burn_cubecl::CubeBackend<R, f32, i32, BT>
{
    fn sgd_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        velocity: Option<Tensor<Self, D>>,
        s: SgdScalars,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        let prim = |t: &Tensor<Self, D>| t.clone().into_primitive().tensor();
        let (p, g, v) = (prim(&param), prim(&grad), velocity.as_ref().map(prim));
        match super::optim_cube::sgd_step(&p, &g, v.as_ref(), s) {
            Some((p, v)) => {
                let back = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
                (back(p), v.map(back))
            }
            None => composed(param, grad, velocity, s),
        }
    }

    fn adamw_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        moments: Option<(Tensor<Self, D>, Tensor<Self, D>)>,
        s: AdamWScalars,
    ) -> (Tensor<Self, D>, Tensor<Self, D>, Tensor<Self, D>) {
        let prim = |t: &Tensor<Self, D>| t.clone().into_primitive().tensor();
        let (p, g) = (prim(&param), prim(&grad));
        let mv = moments.as_ref().map(|(m, v)| (prim(m), prim(v)));
        let kernel = super::optim_cube::adamw_step(&p, &g, mv.as_ref().map(|(m, v)| (m, v)), s);
        match kernel {
            Some((p, m, v)) => {
                let back = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
                (back(p), back(m), back(v))
            }
            None => composed_adamw(param, grad, moments, s),
        }
    }
}

/// The float32 backend the runner builds on a CubeCL runtime.
#[cfg(feature = "cube")]
type Cube<R, BT> = burn_cubecl::CubeBackend<R, f32, i32, BT>;

/// Which step [`queue_step`] queues, with its scalars.
#[cfg(feature = "cube")]
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Inputs the parameter, its gradient and (after the first step) the velocity;
    /// outputs the parameter and, with momentum, the velocity.
    Sgd(SgdScalars),
    /// Inputs the parameter, its gradient and (after the first step) the two moments;
    /// outputs the parameter and the two moments.
    AdamW(AdamWScalars),
}

/// An optimizer step of a `D`-dimensional parameter queued on the fused backend as
/// `name`, on `inputs` (the parameter first), with `outputs` tensors of the parameter's
/// shape and type: when fusion runs it, the plain backend's step ([`OptimBackend`] above:
/// the kernel, or Burn's ops where the kernel does not take the operands).
#[cfg(feature = "cube")]
fn queue_step<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement, const D: usize>(
    name: &'static str,
    step: Step,
    inputs: Vec<Tensor<burn_fusion::Fusion<Cube<R, BT>>, D>>,
    outputs: usize,
) -> Vec<Tensor<burn_fusion::Fusion<Cube<R, BT>>, D>> {
    type Plain<R, BT, const D: usize> = Tensor<Cube<R, BT>, D>;
    let run = move |t: Vec<burn_cubecl::tensor::CubeTensor<R>>| {
        let mut t =
            (t.into_iter()).map(|t| Plain::<R, BT, D>::from_primitive(TensorPrimitive::Float(t)));
        let (Some(param), Some(grad)) = (t.next(), t.next()) else {
            return vec![];
        };
        let outputs: Vec<Plain<R, BT, D>> = match step {
            Step::Sgd(s) => {
                let (p, v) = Cube::<R, BT>::sgd_step(param, grad, t.next(), s);
                std::iter::once(p).chain(v).collect()
            }
            Step::AdamW(s) => {
                let moments = t.next().zip(t.next());
                let (p, m, v) = Cube::<R, BT>::adamw_step(param, grad, moments, s);
                vec![p, m, v]
            }
        };
        outputs
            .into_iter()
            .map(|t| t.into_primitive().tensor())
            .collect()
    };
    let inputs: Vec<_> = (inputs.into_iter())
        .map(|t| t.into_primitive().tensor())
        .collect();
    let out = (inputs[0].shape.clone(), inputs[0].dtype);
    super::queued::queue::<R, BT, _>(name, inputs, &vec![out; outputs], run)
        .into_iter()
        .map(|t| Tensor::from_primitive(TensorPrimitive::Float(t)))
        .collect()
}

#[cfg(feature = "cube")]
impl<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement> OptimBackend
    for burn_fusion::Fusion<Cube<R, BT>>
{
    fn sgd_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        velocity: Option<Tensor<Self, D>>,
        s: SgdScalars,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        if D != 4 {
            return composed(param, grad, velocity, s);
        }
        let name = match (s.momentum.is_some(), velocity.is_some()) {
            (false, _) => "runner_sgd",
            (true, false) => "runner_sgd_momentum_first",
            (true, true) => "runner_sgd_momentum",
        };
        let outputs = 1 + usize::from(s.momentum.is_some());
        let mut inputs = vec![param, grad];
        inputs.extend(velocity);
        let mut out = queue_step::<R, BT, D>(name, Step::Sgd(s), inputs, outputs).into_iter();
        match out.next() {
            Some(p) => (p, out.next()),
            None => unreachable!("queue_step returns one tensor per output, here at least one"),
        }
    }

    fn adamw_step<const D: usize>(
        param: Tensor<Self, D>,
        grad: Tensor<Self, D>,
        moments: Option<(Tensor<Self, D>, Tensor<Self, D>)>,
        s: AdamWScalars,
    ) -> (Tensor<Self, D>, Tensor<Self, D>, Tensor<Self, D>) {
        if D != 4 {
            return composed_adamw(param, grad, moments, s);
        }
        let name = match moments.is_some() {
            false => "runner_adamw_first",
            true => "runner_adamw",
        };
        let mut inputs = vec![param, grad];
        if let Some((m, v)) = moments {
            inputs.extend([m, v]);
        }
        let out = queue_step::<R, BT, D>(name, Step::AdamW(s), inputs, 3);
        match <[_; 3]>::try_from(out) {
            Ok([p, m, v]) => (p, m, v),
            Err(_) => unreachable!("queue_step returns one tensor per output, here three"),
        }
    }
}

/// SGD with PyTorch's semantics through [`OptimBackend::sgd_step`]: one op per parameter.
#[derive(Debug, Clone)]
pub struct FusedSgd {
    settings: SgdSettings,
}

impl FusedSgd {
    pub fn new(settings: SgdSettings) -> Self {
        Self { settings }
    }

    /// The optimizer over a module's parameters.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(
        self,
    ) -> burn::optim::adaptor::OptimizerAdaptor<Self, M, B>
    where
        B::InnerBackend: OptimBackend,
    {
        self.into()
    }
}

/// A parameter's state: Burn's `SgdState`, field for field, so the records agree.
#[derive(Record, Clone)]
pub struct SgdState<B: Backend, const D: usize> {
    pub momentum: Option<MomentumState<B, D>>,
}

/// Burn's `MomentumState`, field for field.
#[derive(Record, Clone)]
pub struct MomentumState<B: Backend, const D: usize> {
    pub velocity: Tensor<B, D>,
}

impl<B: OptimBackend> SimpleOptimizer<B> for FusedSgd {
    type State<const D: usize> = SgdState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let s = self.settings.scalars(lr);
        let kept = state.and_then(|s| s.momentum);
        if s.momentum.is_none() {
            // As Burn's: without momentum a velocity already in the state is kept as it is.
            let (param, _) = B::sgd_step(tensor, grad, None, s);
            return (param, Some(SgdState { momentum: kept }));
        }
        let (param, velocity) = B::sgd_step(tensor, grad, kept.map(|m| m.velocity), s);
        let momentum = velocity.map(|velocity| MomentumState { velocity });
        (param, Some(SgdState { momentum }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.map(|m| MomentumState {
            velocity: m.velocity.to_device(device),
        });
        state
    }
}

/// AdamW with decoupled weight decay through [`OptimBackend::adamw_step`]; its state is
/// Burn's `AdamWState`.
#[derive(Debug, Clone)]
pub struct FusedAdamW {
    settings: AdamWSettings,
}

impl FusedAdamW {
    pub fn new(settings: AdamWSettings) -> Self {
        Self { settings }
    }

    /// The optimizer over a module's parameters.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(
        self,
    ) -> burn::optim::adaptor::OptimizerAdaptor<Self, M, B>
    where
        B::InnerBackend: OptimBackend,
    {
        self.into()
    }
}

impl<B: OptimBackend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let (time, moments) = match state {
            Some(s) => (
                s.momentum.time + 1,
                Some((s.momentum.moment_1, s.momentum.moment_2)),
            ),
            None => (1, None),
        };
        let s = self.settings.scalars(lr, time as i32);
        let (param, moment_1, moment_2) = B::adamw_step(tensor, grad, moments, s);
        let momentum = AdaptiveMomentumState {
            time,
            moment_1,
            moment_2,
            max_moment_2: None,
        };
        (param, Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::decay::WeightDecayConfig;
    use burn::optim::momentum::MomentumConfig;
    use burn::optim::{AdamWConfig, GradientsParams, Optimizer, SgdConfig};
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    fn bits(t: &Tensor<Flex, 2>) -> Vec<u32> {
        let v = t.to_data().to_vec::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn burns(s: &SgdSettings) -> SgdConfig {
        SgdConfig::new()
            .with_momentum((s.momentum > 0.0).then_some(MomentumConfig {
                momentum: s.momentum,
                dampening: s.dampening,
                nesterov: s.nesterov,
            }))
            .with_weight_decay((s.weight_decay > 0.0).then_some(WeightDecayConfig {
                penalty: s.weight_decay as f32,
            }))
    }

    fn every_setting() -> Vec<SgdSettings> {
        let mut all = vec![];
        for momentum in [0.0, 0.9] {
            for nesterov in [false, true] {
                for dampening in [0.0, 0.1] {
                    for weight_decay in [0.0, 5e-4] {
                        if momentum == 0.0 && (nesterov || dampening > 0.0) {
                            continue;
                        }
                        all.push(SgdSettings {
                            momentum,
                            dampening,
                            nesterov,
                            weight_decay,
                        });
                    }
                }
            }
        }
        all
    }

    /// Flex's one pass and the composed ops CUDA runs both give Burn's own `Sgd`, to the
    /// bit, over three steps (the first makes the velocity), for every combination of
    /// settings; and a parameter whose buffer is shared is not written through.
    #[test]
    fn flex_pass_and_composed_ops_equal_burns_sgd_to_the_bit() {
        let d = Default::default();
        // 40 000 values: more than one parallel chunk, and a ragged last one.
        let shape = [200, 200];
        let random = || Tensor::<Flex, 2>::random(shape, Distribution::Normal(0.0, 1.0), &d);
        let (p0, grads) = (random(), [random(), random(), random()]);
        for s in every_setting() {
            let theirs = burns(&s).build::<Flex>();
            let ours = FusedSgd::new(s);
            let (mut pt, mut po) = (p0.clone(), p0.clone());
            let (mut st, mut so) = (None, None);
            let mut pc = p0.clone();
            let mut vc: Option<Tensor<Flex, 2>> = None;
            for (i, g) in grads.iter().enumerate() {
                let lr = 0.1 / (i + 1) as f64;
                (pt, st) = theirs.step(lr, pt, g.clone(), st);
                let (shared, before) = (po.clone(), bits(&po));
                (po, so) = ours.step(lr, po, g.clone(), so);
                assert_eq!(
                    bits(&shared),
                    before,
                    "{s:?} step {i}: a shared buffer changed"
                );
                (pc, vc) = composed(pc, g.clone(), vc, s.scalars(lr));
                assert_eq!(bits(&po), bits(&pt), "{s:?} step {i}: Flex's pass");
                assert_eq!(bits(&pc), bits(&pt), "{s:?} step {i}: composed");
                let ours_v = so.as_ref().and_then(|s| s.momentum.as_ref());
                assert_eq!(ours_v.is_some(), s.momentum > 0.0);
                if let (Some(v), Some(vc)) = (ours_v, &vc) {
                    assert_eq!(bits(&v.velocity), bits(vc), "{s:?} step {i}: velocity");
                }
            }
        }
    }

    /// An optimizer record written with Burn's `Sgd` (checkpoints of earlier versions)
    /// loads into [`FusedSgd`] and continues as Burn's would.
    #[test]
    fn checkpoints_of_burns_sgd_load() {
        type B = Autodiff<Flex>;
        let d = Default::default();
        let s = SgdSettings {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 5e-4,
        };
        let model = LinearConfig::new(6, 4).init::<B>(&d);
        let x = Tensor::<B, 2>::random([5, 6], Distribution::Default, &d);
        let grads_of =
            |m: &Linear<B>| GradientsParams::from_grads(m.forward(x.clone()).sum().backward(), m);
        let mut theirs = burns(&s).init::<B, Linear<B>>();
        let model = theirs.step(0.1, model.clone(), grads_of(&model));
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = Recorder::<B>::record(&recorder, theirs.to_record(), ()).unwrap();
        let loaded = Recorder::<B>::load(&recorder, bytes, &d).unwrap();
        let mut ours = FusedSgd::new(s).init::<B, Linear<B>>().load_record(loaded);
        let next_theirs = theirs.step(0.05, model.clone(), grads_of(&model));
        let next_ours = ours.step(0.05, model.clone(), grads_of(&model));
        let weight = |m: &Linear<B>| m.weight.val().inner().into_data();
        let w = |t: TensorData| t.to_vec::<f32>().unwrap();
        assert_eq!(w(weight(&next_ours)), w(weight(&next_theirs)));
        assert_ne!(
            w(weight(&next_ours)),
            w(weight(&model)),
            "the step changed nothing"
        );
    }

    fn burns_adamw(s: &AdamWSettings) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(s.beta_1)
            .with_beta_2(s.beta_2)
            .with_epsilon(s.epsilon)
            .with_weight_decay(s.weight_decay)
    }

    /// Flex's AdamW pass and the composed ops both give Burn's own `AdamW`, to the bit,
    /// over three steps (the first makes the moments), with and without weight decay; and
    /// a parameter whose buffer is shared is not written through.
    #[test]
    fn adamw_pass_and_composed_ops_equal_burns_adamw_to_the_bit() {
        let d = Default::default();
        let shape = [200, 200];
        let random = || Tensor::<Flex, 2>::random(shape, Distribution::Normal(0.0, 1.0), &d);
        let (p0, grads) = (random(), [random(), random(), random()]);
        for weight_decay in [0.0, 0.01] {
            let s = AdamWSettings {
                beta_1: 0.9,
                beta_2: 0.999,
                epsilon: 1e-8,
                weight_decay,
            };
            let theirs = burns_adamw(&s).build();
            let ours = FusedAdamW::new(s);
            let (mut pt, mut po, mut pc) = (p0.clone(), p0.clone(), p0.clone());
            let (mut st, mut so) = (None, None);
            let mut mc: Option<(Tensor<Flex, 2>, Tensor<Flex, 2>)> = None;
            for (i, g) in grads.iter().enumerate() {
                let lr = 1e-3 / (i + 1) as f64;
                (pt, st) = SimpleOptimizer::<Flex>::step(&theirs, lr, pt, g.clone(), st);
                let (shared, before) = (po.clone(), bits(&po));
                (po, so) = ours.step(lr, po, g.clone(), so);
                assert_eq!(
                    bits(&shared),
                    before,
                    "decay {weight_decay} step {i}: shared"
                );
                let (p, m, v) = composed_adamw(pc, g.clone(), mc, s.scalars(lr, i as i32 + 1));
                (pc, mc) = (p, Some((m, v)));
                let what = format!("decay {weight_decay} step {i}");
                assert_eq!(bits(&po), bits(&pt), "{what}: Flex's pass");
                assert_eq!(bits(&pc), bits(&pt), "{what}: composed");
                let (t, o) = (st.as_ref().unwrap(), so.as_ref().unwrap());
                assert_eq!(o.momentum.time, t.momentum.time, "{what}: time");
                assert_eq!(
                    bits(&o.momentum.moment_1),
                    bits(&t.momentum.moment_1),
                    "{what}: m"
                );
                assert_eq!(
                    bits(&o.momentum.moment_2),
                    bits(&t.momentum.moment_2),
                    "{what}: v"
                );
            }
        }
    }

    /// A record written with Burn's `AdamW` loads into [`FusedAdamW`] and continues as
    /// Burn's would (its step count included: the bias correction depends on it).
    #[test]
    fn checkpoints_of_burns_adamw_load() {
        type B = Autodiff<Flex>;
        let d = Default::default();
        let s = AdamWSettings {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.01,
        };
        let model = LinearConfig::new(6, 4).init::<B>(&d);
        let x = Tensor::<B, 2>::random([5, 6], Distribution::Default, &d);
        let grads_of =
            |m: &Linear<B>| GradientsParams::from_grads(m.forward(x.clone()).sum().backward(), m);
        let mut theirs = burns_adamw(&s).init::<B, Linear<B>>();
        let mut model = model;
        for _ in 0..2 {
            model = theirs.step(1e-2, model.clone(), grads_of(&model));
        }
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = Recorder::<B>::record(&recorder, theirs.to_record(), ()).unwrap();
        let loaded = Recorder::<B>::load(&recorder, bytes, &d).unwrap();
        let mut ours = FusedAdamW::new(s)
            .init::<B, Linear<B>>()
            .load_record(loaded);
        let next_theirs = theirs.step(1e-2, model.clone(), grads_of(&model));
        let next_ours = ours.step(1e-2, model.clone(), grads_of(&model));
        let weight = |m: &Linear<B>| m.weight.val().inner().into_data().to_vec::<f32>().unwrap();
        assert_eq!(weight(&next_ours), weight(&next_theirs));
        assert_ne!(
            weight(&next_ours),
            weight(&model),
            "the step changed nothing"
        );
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests {
    use burn::tensor::{Distribution, Tensor};

    use super::*;

    type Plain = burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;
    type CubeTensor = burn_cubecl::tensor::CubeTensor<cubecl::wgpu::WgpuRuntime>;
    use cubecl::zspace::metadata::Metadata;

    /// The unfused CubeCL backend's SGD (one kernel of the runner's own a parameter) takes
    /// the steps Burn's ops take, on software Vulkan: every combination of weight decay,
    /// momentum (first step or not), dampening and Nesterov, over several cubes of
    /// elements, to a few ulps (a GPU may contract `a·b + c` into one rounding). A
    /// parameter the kernel cannot take (not contiguous) gets Burn's ops, exactly; a
    /// gradient that is a view (permuted, transposed) is read through its strides.
    #[test]
    fn wgpu_sgd_in_one_kernel_takes_burns_steps() {
        let d = Default::default();
        let random = |dims: [usize; 2]| Tensor::<Plain, 2>::random(dims, Distribution::Default, &d);
        let values = |t: Tensor<Plain, 2>| t.into_data().to_vec::<f32>().unwrap();
        let close = |ours: Vec<f32>, theirs: Vec<f32>, what: &str| {
            assert_eq!(ours.len(), theirs.len());
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                let tol = 4.0 * f32::EPSILON * b.abs().max(1.0);
                assert!((a - b).abs() <= tol, "{what}: element {i}: {a} against {b}");
            }
        };
        let (p, g, v) = (random([3, 700]), random([3, 700]), random([3, 700]));
        let mut checked = 0;
        for decay in [None, Some(5e-4)] {
            for momentum in [None, Some(0.9)] {
                for nesterov in [false, true] {
                    for keep in [1.0, 0.75] {
                        for first in [true, false] {
                            if momentum.is_none() && (nesterov || keep != 1.0 || !first) {
                                continue;
                            }
                            let s = SgdScalars {
                                lr: 0.1,
                                momentum,
                                keep,
                                nesterov,
                                decay,
                            };
                            let vel = (!first).then(|| v.clone());
                            let what = format!("{s:?}, first {first}");
                            let (kp, kv) = Plain::sgd_step(p.clone(), g.clone(), vel.clone(), s);
                            let (cp, cv) = composed(p.clone(), g.clone(), vel, s);
                            assert_eq!(kv.is_some(), cv.is_some(), "{what}");
                            close(values(kp), values(cp), &what);
                            if let (Some(kv), Some(cv)) = (kv, cv) {
                                close(values(kv), values(cv), &what);
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 18);
        // The kernel took those (the comparison above would hold for Burn's ops too), and
        // refuses a parameter whose elements overlap (a broadcast view).
        let prim = |t: &Tensor<Plain, 2>| t.clone().into_primitive().tensor();
        let s = SgdScalars {
            lr: 0.1,
            momentum: Some(0.9),
            keep: 1.0,
            nesterov: false,
            decay: Some(5e-4),
        };
        let kernel = super::super::optim_cube::sgd_step(&prim(&p), &prim(&g), Some(&prim(&v)), s);
        assert!(kernel.is_some_and(|(_, v)| v.is_some()));
        let row = Tensor::<Plain, 2>::random([1, 700], Distribution::Default, &d);
        let broadcast = row.expand([3, 700]);
        let refused =
            super::super::optim_cube::sgd_step(&prim(&broadcast), &prim(&g), Some(&prim(&v)), s);
        assert!(refused.is_none());
        let (kp, _) = Plain::sgd_step(broadcast.clone(), g.clone(), Some(v.clone()), s);
        let (cp, _) = composed(broadcast, g.clone(), Some(v.clone()), s);
        assert_eq!(values(kp), values(cp));
        // Layouts as training has them: a 3×3 weight with its rows padded to 4 (CubeCL's
        // allocation of `[.., 3, 3]`), its gradient permuted from channels-last (CubeCL's
        // convolution), a transposed parameter: each read through its strides, the new
        // parameter and velocity written in the parameter's layout.
        let rand4 = |dims: [usize; 4]| Tensor::<Plain, 4>::random(dims, Distribution::Default, &d);
        let padded = |t: Tensor<Plain, 4>| {
            // A view of the first 3 of every 4 elements: Burn's slice copies here.
            let mut c = t.into_primitive().tensor();
            c.meta = Box::new(Metadata::new([4, 5, 3, 3], [60, 12, 4, 1]));
            Tensor::<Plain, 4>::from_primitive(TensorPrimitive::Float(c))
        };
        let (p4, v4) = (padded(rand4([4, 5, 3, 4])), padded(rand4([4, 5, 3, 4])));
        let g4 = rand4([4, 3, 3, 5]).permute([0, 3, 1, 2]);
        let prim4 = |t: &Tensor<Plain, 4>| t.clone().into_primitive().tensor();
        let strides = |t: &CubeTensor| t.meta.strides().iter().copied().collect::<Vec<usize>>();
        assert_eq!(strides(&prim4(&p4)), [60, 12, 4, 1]);
        assert!(!prim4(&g4).is_contiguous());
        for vel in [None, Some(v4.clone())] {
            let (kp, kv) = super::super::optim_cube::sgd_step(
                &prim4(&p4),
                &prim4(&g4),
                vel.as_ref().map(prim4).as_ref(),
                s,
            )
            .expect("taken by the kernel");
            assert_eq!(strides(&kp), [60, 12, 4, 1]);
            assert_eq!(strides(kv.as_ref().unwrap()), [60, 12, 4, 1]);
            let back = |t| Tensor::<Plain, 4>::from_primitive(TensorPrimitive::Float(t));
            let (cp, cv) = composed(p4.clone(), g4.clone(), vel, s);
            let flat = |t: Tensor<Plain, 4>| t.into_data().to_vec::<f32>().unwrap();
            close(flat(back(kp)), flat(cp), "padded parameter");
            close(
                flat(back(kv.unwrap())),
                flat(cv.unwrap()),
                "padded parameter, velocity",
            );
        }
        let (pt, gt) = (random([700, 3]).transpose(), random([700, 3]).transpose());
        let (kp, kv) =
            super::super::optim_cube::sgd_step(&prim(&pt), &prim(&gt), Some(&prim(&v)), s)
                .expect("taken by the kernel");
        assert_eq!(strides(&kp), strides(&prim(&pt)));
        let back = |t| Tensor::<Plain, 2>::from_primitive(TensorPrimitive::Float(t));
        let (cp, cv) = composed(pt, gt, Some(v), s);
        close(values(back(kp)), values(cp), "transposed parameter");
        close(
            values(back(kv.unwrap())),
            values(cv.unwrap()),
            "transposed parameter, velocity",
        );
    }

    /// The unfused CubeCL backend's AdamW (one kernel a parameter) takes the steps Burn's
    /// ops take, on software Vulkan: first step or not, with decoupled decay or without, at
    /// a later step's bias corrections, to a few ulps of 1 (the values are below 1). A parameter the kernel
    /// cannot take (not contiguous) gets Burn's ops, exactly; a transposed gradient is read
    /// through its strides.
    #[test]
    fn wgpu_adamw_in_one_kernel_takes_burns_steps() {
        let d = Default::default();
        let random = |dims: [usize; 2]| Tensor::<Plain, 2>::random(dims, Distribution::Default, &d);
        let values = |t: Tensor<Plain, 2>| t.into_data().to_vec::<f32>().unwrap();
        let close = |ours: Vec<f32>, theirs: Vec<f32>, what: &str| {
            assert_eq!(ours.len(), theirs.len());
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                let tol = 8.0 * f32::EPSILON * b.abs().max(1.0);
                assert!((a - b).abs() <= tol, "{what}: element {i}: {a} against {b}");
            }
        };
        let (p, g) = (random([3, 700]), random([3, 700]) - 0.5);
        // Moments as a run holds them: the first nonnegative, the second a square's.
        let (m, v) = (
            random([3, 700]).mul_scalar(0.1),
            random([3, 700]).mul_scalar(0.01),
        );
        let settings = |weight_decay| AdamWSettings {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay,
        };
        let mut checked = 0;
        for weight_decay in [0.0, 0.01] {
            for time in [1, 7] {
                let s = settings(weight_decay).scalars(3e-4, time);
                let moments = (time > 1).then(|| (m.clone(), v.clone()));
                let what = format!("{s:?}");
                let (kp, km, kv) = Plain::adamw_step(p.clone(), g.clone(), moments.clone(), s);
                let (cp, cm, cv) = composed_adamw(p.clone(), g.clone(), moments, s);
                close(values(km), values(cm), &format!("m, {what}"));
                close(values(kv), values(cv), &format!("v, {what}"));
                close(values(kp), values(cp), &format!("p, {what}"));
                checked += 1;
            }
        }
        assert_eq!(checked, 4);
        // The kernel took those, and refuses a parameter whose elements overlap.
        let prim = |t: &Tensor<Plain, 2>| t.clone().into_primitive().tensor();
        let s = settings(0.01).scalars(3e-4, 7);
        let (pm, pv) = (prim(&m), prim(&v));
        let kernel =
            super::super::optim_cube::adamw_step(&prim(&p), &prim(&g), Some((&pm, &pv)), s);
        assert!(kernel.is_some());
        let broadcast =
            Tensor::<Plain, 2>::random([1, 700], Distribution::Default, &d).expand([3, 700]);
        let refused =
            super::super::optim_cube::adamw_step(&prim(&broadcast), &prim(&g), Some((&pm, &pv)), s);
        assert!(refused.is_none());
        let moments = Some((m.clone(), v.clone()));
        let (kp, km, _) = Plain::adamw_step(broadcast.clone(), g.clone(), moments.clone(), s);
        let (cp, cm, _) = composed_adamw(broadcast, g, moments, s);
        assert_eq!(values(kp), values(cp));
        assert_eq!(values(km), values(cm));
        // A transposed parameter, gradient and moments (a linear layer's weight's gradient
        // is a transpose), and a padded one (CubeCL's allocation of `[.., 10]`): each read
        // through its strides, the outputs written in the parameter's layout.
        let t = |t: Tensor<Plain, 2>| t.transpose();
        let pad = |t: Tensor<Plain, 2>| {
            let mut c = t.into_primitive().tensor();
            c.meta = Box::new(Metadata::new([700, 3], [4, 1]));
            Tensor::<Plain, 2>::from_primitive(TensorPrimitive::Float(c))
        };
        let cases = [
            (
                "transposed",
                t(random([700, 3])),
                t(random([700, 3]) - 0.5),
                t(random([700, 3]).mul_scalar(0.1)),
                t(random([700, 3]).mul_scalar(0.01)),
            ),
            (
                "padded",
                pad(random([700, 4])),
                t(random([3, 700]) - 0.5),
                pad(random([700, 4]).mul_scalar(0.1)),
                pad(random([700, 4]).mul_scalar(0.01)),
            ),
        ];
        let strides = |t: &CubeTensor| t.meta.strides().iter().copied().collect::<Vec<usize>>();
        for (name, pl, gl, ml, vl) in cases {
            assert!(
                !prim(&pl).is_contiguous() && !prim(&gl).is_contiguous(),
                "{name}"
            );
            let (kp, km, kv) = super::super::optim_cube::adamw_step(
                &prim(&pl),
                &prim(&gl),
                Some((&prim(&ml), &prim(&vl))),
                s,
            )
            .expect("taken by the kernel");
            assert_eq!(strides(&kp), strides(&prim(&pl)), "{name}");
            assert_eq!(strides(&km), strides(&prim(&pl)), "{name}");
            let back = |t| Tensor::<Plain, 2>::from_primitive(TensorPrimitive::Float(t));
            let (cp, cm, cv) = composed_adamw(pl, gl, Some((ml, vl)), s);
            close(values(back(km)), values(cm), &format!("{name}, m"));
            close(values(back(kv)), values(cv), &format!("{name}, v"));
            close(values(back(kp)), values(cp), &format!("{name}, p"));
        }
    }
}
