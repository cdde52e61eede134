//! Training-mode batch normalisation over `[N, C, H, W]` as a backend extension:
//! [`NormBackend`] normalises by the batch's statistics and returns them (for the running
//! statistics), and gives the three gradients. The default composes Burn tensor ops (what
//! CUDA runs, fused by Burn); Flex overrides both with two passes over memory each way
//! (statistics, then normalise; reductions, then the input gradient) where the composed
//! form makes about a dozen, forward and backward; the autodiff backend records one op.
//! What follows a ResNet's batch norm, a residual added and a ReLU, is part of the op
//! ([`batch_norm_train_act`]) on Flex: Flex runs elementwise ops on one thread, so on two
//! cores each separate pass (the add, the ReLU, its backward mask) cost twice its time in a
//! parallel loop. On CubeCL's backends it is part of the op too, so that the whole of it,
//! forward and backward, is composed channels-last, as CubeCL's convolutions want their
//! operands ([`Layout::Last`]). Elsewhere the epilogue stays Burn's own add and ReLU.
//! On CubeCL's backends with `backend.norm_sums = "one_pass"` the per-channel sums are a
//! kernel of the runner's ([`super::norm_cube`]), and so are the normalisation each way
//! and the running statistics' update ([`super::norm_apply_cube`]), fused or not (custom
//! operations in fusion's stream); `"reduce"` leaves all of it to Burn's ops.
//!
//! Gradients, with `x̂ = (x − mean)·invstd`, `m = N·H·W` values per channel:
//! `dβ = Σ dy`, `dγ = Σ dy·x̂`, `dx = γ·invstd/m · (m·dy − dβ − x̂·dγ)` (PyTorch's).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{ActivationOps, FloatTensor};
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

use super::{flex_f32, to_flex, values};

/// A backend the models can batch-normalise on. The defaults compose Burn's tensor ops.
pub trait NormBackend: Backend {
    /// Whether [`NormBackend::batch_norm_train_act`] is one op on this backend: the autodiff
    /// backend then records it as one node whose backward is
    /// [`NormBackend::batch_norm_train_act_backward`]; otherwise as the nodes of its parts
    /// (the batch norm, Burn's add and Burn's ReLU), as they were before it existed.
    const FUSES_EPILOGUE: bool = false;

    /// `x` `[n, c, h, w]` normalised per channel by its batch mean and biased variance, then
    /// scaled by `gamma` and shifted by `beta` (`[c]`): (output, mean, variance).
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed_forward::<Self>(Layout::Channels, x, gamma, beta, eps)
    }

    /// The gradients of `x`, `gamma` and `beta` from the output's gradient `dy`, given the
    /// forward's input and statistics.
    fn batch_norm_train_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed_backward::<Self>(Layout::Channels, x, gamma, stats, eps, dy)
    }

    /// `relu?(batch_norm(x) + residual?)`, the residual of `x`'s shape: (output, mean,
    /// variance). The default composes the batch norm with Burn's add and ReLU.
    fn batch_norm_train_act(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed_act::<Self>(x, gamma, beta, eps, epilogue)
    }

    /// The gradients of [`NormBackend::batch_norm_train_act`]: of `x`, `gamma`, `beta`
    /// and, where it had one (`residual`), the residual, from the output's gradient `dy`;
    /// `relu_output` is the op's output where it ended in a ReLU (whose mask it gives).
    #[allow(clippy::type_complexity)]
    fn batch_norm_train_act_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        (residual, relu_output): (bool, Option<FloatTensor<Self>>),
        dy: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let dy = match relu_output {
            Some(output) => Self::relu_backward(output, dy),
            None => dy,
        };
        finish_act_backward::<Self>(x, gamma, stats, eps, residual, dy)
    }

    /// See [`batch_norm_running`]: the new running mean and variance.
    fn batch_norm_running(
        running: (FloatTensor<Self>, FloatTensor<Self>),
        batch: (FloatTensor<Self>, FloatTensor<Self>),
        m: usize,
        momentum: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed_running::<Self>(running, batch, m, momentum)
    }

    /// See [`batch_norm_eval`].
    fn batch_norm_eval(
        x: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        affine: (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        rows_eval::<Self>(x, stats, affine, eps, epilogue)
    }
}

/// Evaluation-mode batch norm with its epilogue: `relu?((x − mean)·γ/√(var + eps) + β +
/// residual?)` by the running statistics; no gradient. The default works on
/// `[n·c, h·w]` rows with per-row values (a view of a contiguous tensor, which Flex's is);
/// CubeCL's backends on the channels-last view ([`Layout::Last`]), as in training.
pub fn batch_norm_eval<B: NormBackend>(
    x: Tensor<B, 4>,
    (mean, var): (Tensor<B, 1>, Tensor<B, 1>),
    (gamma, beta): (Tensor<B, 1>, Tensor<B, 1>),
    eps: f64,
    residual: Option<Tensor<B, 4>>,
    relu: bool,
) -> Tensor<B, 4> {
    let p = |t: Tensor<B, 1>| t.into_primitive().tensor();
    tensor(B::batch_norm_eval(
        x.into_primitive().tensor(),
        (p(mean), p(var)),
        (p(gamma), p(beta)),
        eps,
        Epilogue {
            residual: residual.map(|r| r.into_primitive().tensor()),
            relu,
        },
    ))
}

/// The running statistics after a training batch, as `torch.nn.BatchNorm2d` keeps them:
/// `running ← (1 − momentum)·running + momentum·batch`, the batch's variance unbiased
/// (`× m/(m − 1)`, `m` the values per channel). No gradient. On the unfused CubeCL backend
/// one kernel ([`super::norm_apply_cube`]) where Burn's ops take seven launches a batch
/// norm (five scaled, two added; about 370 of a ResNet-50 step's).
pub fn batch_norm_running<B: NormBackend>(
    (mean, var): (Tensor<B, 1>, Tensor<B, 1>),
    (batch_mean, batch_var): (Tensor<B, 1>, Tensor<B, 1>),
    m: usize,
    momentum: f64,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let p = |t: Tensor<B, 1>| t.into_primitive().tensor();
    let (mean, var) = B::batch_norm_running(
        (p(mean), p(var)),
        (p(batch_mean), p(batch_var)),
        m,
        momentum,
    );
    (tensor(mean), tensor(var))
}

/// The default [`NormBackend::batch_norm_running`], Burn's ops (the order the kernel
/// keeps).
fn composed_running<B: Backend>(
    (mean, var): (FloatTensor<B>, FloatTensor<B>),
    (batch_mean, batch_var): (FloatTensor<B>, FloatTensor<B>),
    m: usize,
    k: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let m = m as f64;
    let unbiased = tensor::<B, 1>(batch_var) * (m / (m - 1.0).max(1.0));
    let mean = tensor::<B, 1>(mean) * (1.0 - k) + tensor::<B, 1>(batch_mean) * k;
    let var = tensor::<B, 1>(var) * (1.0 - k) + unbiased * k;
    (
        mean.into_primitive().tensor(),
        var.into_primitive().tensor(),
    )
}

/// The default [`NormBackend::batch_norm_eval`]: `[n·c, h·w]` rows, per-row values.
fn rows_eval<B: Backend>(
    x: FloatTensor<B>,
    (mean, var): (FloatTensor<B>, FloatTensor<B>),
    (gamma, beta): (FloatTensor<B>, FloatTensor<B>),
    eps: f64,
    epilogue: Epilogue<FloatTensor<B>>,
) -> FloatTensor<B> {
    let [n, c, h, w] = x.shape().dims();
    let rows = |t: FloatTensor<B>| {
        tensor::<B, 1>(t)
            .reshape([1, c])
            .repeat_dim(0, n)
            .reshape([n * c, 1])
    };
    let x2 = tensor::<B, 4>(x).reshape([n * c, h * w]);
    let scale = (tensor::<B, 1>(var) + eps).sqrt().recip();
    let centered = x2 - rows(mean);
    let gamma = tensor::<B, 1>(gamma) * scale;
    let out = centered * rows(gamma.into_primitive().tensor()) + rows(beta);
    let out = out.reshape([n, c, h, w]);
    then::<B, 4>(out, epilogue, tensor)
        .into_primitive()
        .tensor()
}

/// What follows a batch norm in [`batch_norm_train_act`]: a residual added, then a ReLU.
#[derive(Debug, Clone)]
pub struct Epilogue<T> {
    pub residual: Option<T>,
    pub relu: bool,
}

/// `out` with `epilogue` applied as Burn's add and ReLU; `seen` puts the residual in
/// `out`'s shape (the composed forms' views).
fn then<B: Backend, const D: usize>(
    mut out: Tensor<B, D>,
    epilogue: Epilogue<FloatTensor<B>>,
    seen: impl FnOnce(FloatTensor<B>) -> Tensor<B, D>,
) -> Tensor<B, D> {
    if let Some(residual) = epilogue.residual {
        out = out + seen(residual);
    }
    if epilogue.relu {
        out = burn::tensor::activation::relu(out);
    }
    out
}

/// Training-mode batch norm on any [`NormBackend`]: (output, batch mean, biased batch
/// variance). The statistics carry no gradient.
pub fn batch_norm_train<B: NormBackend>(
    x: Tensor<B, 4>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let prim = |t: FloatTensor<B>| TensorPrimitive::Float(t);
    let (out, mean, var) = B::batch_norm_train(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
        eps,
    );
    (
        Tensor::from_primitive(prim(out)),
        Tensor::from_primitive(prim(mean)),
        Tensor::from_primitive(prim(var)),
    )
}

/// `relu?(batch_norm(x) + residual?)` in training mode on any [`NormBackend`]: (output,
/// batch mean, biased batch variance), as [`batch_norm_train`] followed by Burn's add and
/// ReLU, to the bit.
pub fn batch_norm_train_act<B: NormBackend>(
    x: Tensor<B, 4>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
    residual: Option<Tensor<B, 4>>,
    relu: bool,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let (out, mean, var) = B::batch_norm_train_act(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
        eps,
        Epilogue {
            residual: residual.map(|r| r.into_primitive().tensor()),
            relu,
        },
    );
    (tensor(out), tensor(mean), tensor(var))
}

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// How the composed forms see the activation `[n, c, h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `[n, c, h·w]`: a view whether the tensor is contiguous or channels-last in memory,
    /// where the rows form `[n·c, h·w]` this replaced had to copy a channels-last one.
    /// Per-channel values are `[1, c, 1]` tensors that broadcast, which Burn's fusion takes
    /// into its element-wise kernels, instead of `repeat_dim` copies (the rows form
    /// launched about 24 kernels per batch norm on an H200, most of them outside fusion:
    /// BENCHMARKS.md, "GPU (CUDA)"). What fusion writes in this view is NCHW.
    Channels,
    /// `[n, h·w, c]`, channels last, what CubeCL's backends use. A CubeCL convolution
    /// leaves its output channels-last in memory (an `[n, c, h, w]` view of `[n, h, w,
    /// c]`), so this view of it is contiguous; and since fusion writes each new tensor
    /// contiguous in its logical shape, the batch norm's output and gradients computed in
    /// this view come out channels-last too: what the next convolution (forward) and the
    /// previous one (both gradients) take without a copy. In the `[n, c, h·w]` view
    /// CubeCL's implicit GEMM copied each of them to channels-last before use, about 205
    /// copies a step in ResNet-50 (BENCHMARKS.md, "The batch norm channels-last").
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    Last,
}

/// Per-channel helpers on the activation seen as `layout` says. Per-channel values are
/// `[c]` vectors to the callers, `[1, c, 1]` or `[1, 1, c]` tensors that broadcast here.
struct View {
    layout: Layout,
    dims: [usize; 4],
    /// Values per channel: `n·h·w`.
    m: f64,
}

impl View {
    fn of<B: Backend>(layout: Layout, x: &FloatTensor<B>) -> Self {
        let dims: [usize; 4] = x.shape().dims();
        let [n, _, h, w] = dims;
        View {
            layout,
            dims,
            m: (n * h * w) as f64,
        }
    }

    /// `[n, c, h, w]` as the layout's 3-D view.
    fn view<B: Backend>(&self, t: FloatTensor<B>) -> Tensor<B, 3> {
        let [n, c, h, w] = self.dims;
        let t = tensor::<B, 4>(t);
        match self.layout {
            Layout::Channels => t.reshape([n, c, h * w]),
            Layout::Last => t.permute([0, 2, 3, 1]).reshape([n, h * w, c]),
        }
    }

    /// Back to `[n, c, h, w]` (a view of the result: channels-last for `Last`).
    fn unview<B: Backend>(&self, t: Tensor<B, 3>) -> FloatTensor<B> {
        let [n, c, h, w] = self.dims;
        let t = match self.layout {
            Layout::Channels => t.reshape(self.dims),
            Layout::Last => t.reshape([n, h, w, c]).permute([0, 3, 1, 2]),
        };
        t.into_primitive().tensor()
    }

    /// Σ over batch and space, a per-channel value.
    fn sum<B: Backend>(&self, t: Tensor<B, 3>) -> Tensor<B, 3> {
        match self.layout {
            Layout::Channels => t.sum_dim(2).sum_dim(0),
            Layout::Last => t.sum_dim(1).sum_dim(0),
        }
    }

    /// A `[c]` vector as a per-channel value, to broadcast.
    fn wide<B: Backend>(&self, t: FloatTensor<B>) -> Tensor<B, 3> {
        let c = self.dims[1];
        let shape = match self.layout {
            Layout::Channels => [1, c, 1],
            Layout::Last => [1, 1, c],
        };
        tensor::<B, 1>(t).reshape(shape)
    }

    /// A `[n·h·w, c]` result of the backend's kernels as the `Last` view, `[n, h·w, c]`.
    fn unrows<B: Backend>(&self, t: FloatTensor<B>) -> Tensor<B, 3> {
        let [n, c, h, w] = self.dims;
        tensor::<B, 2>(t).reshape([n, h * w, c])
    }

    /// A per-channel value as the `[c]` vector the callers keep.
    fn narrow<B: Backend>(&self, t: Tensor<B, 3>) -> FloatTensor<B> {
        t.reshape([self.dims[1]]).into_primitive().tensor()
    }
}

/// The default [`NormBackend::batch_norm_train_act`]: the batch norm, then Burn's add and
/// ReLU (on the autodiff backend, each its own node).
fn composed_act<B: NormBackend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
    epilogue: Epilogue<FloatTensor<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (out, mean, var) = B::batch_norm_train(x, gamma, beta, eps);
    let out = then::<B, 4>(tensor(out), epilogue, tensor);
    (out.into_primitive().tensor(), mean, var)
}

/// The rest of [`NormBackend::batch_norm_train_act_backward`] once `dy` is the batch
/// norm's own output gradient (the ReLU's mask applied): the residual's gradient is that
/// same tensor.
#[allow(clippy::type_complexity)]
fn finish_act_backward<B: NormBackend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    stats: (FloatTensor<B>, FloatTensor<B>),
    eps: f64,
    residual: bool,
    dy: FloatTensor<B>,
) -> (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
) {
    let d_residual = residual.then(|| dy.clone());
    let (dx, d_gamma, d_beta) = B::batch_norm_train_backward(x, gamma, stats, eps, dy);
    (dx, d_gamma, d_beta, d_residual)
}

/// The batch norm composed in `layout`'s view, without an epilogue.
fn composed_forward<B: Backend>(
    layout: Layout,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let plain = Epilogue {
        residual: None,
        relu: false,
    };
    forward_in::<B>(layout, x, gamma, beta, eps, plain, None)
}

/// The batch norm's three gradients composed in `layout`'s view.
fn composed_backward<B: Backend>(
    layout: Layout,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    stats: (FloatTensor<B>, FloatTensor<B>),
    eps: f64,
    dy: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (dx, d_gamma, d_beta, _) =
        backward_in::<B>(layout, x, gamma, stats, eps, (false, None), dy, None);
    (dx, d_gamma, d_beta)
}

/// Where [`forward_in`] and [`backward_in`] get the batch norm's per-channel sums, and its
/// normalisation each way: from a backend's kernels (`backend.norm_sums = "one_pass"`,
/// CubeCL's backends: the sums [`super::norm_cube`], the normalisation
/// [`super::norm_apply_cube`]) where `Some` and they take them, else from Burn's ops. The
/// kernels see the activation as `[n·h·w, c]` (the `Last` view).
struct OwnKernels<B: Backend> {
    /// `x` → its mean and biased variance per channel (`[c]` each).
    #[allow(clippy::type_complexity)]
    stats: fn(FloatTensor<B>) -> Option<(FloatTensor<B>, FloatTensor<B>)>,
    /// `dy`, `x`, (`mean`, `var`), the ReLU's output, `eps` → `dβ`, `dγ` (`[c]` each),
    /// `dy` masked where that output is not positive.
    #[allow(clippy::type_complexity)]
    grads: fn(
        FloatTensor<B>,
        FloatTensor<B>,
        (FloatTensor<B>, FloatTensor<B>),
        Option<FloatTensor<B>>,
        f64,
    ) -> Option<(FloatTensor<B>, FloatTensor<B>)>,
    /// The forward's normalisation and epilogue: `x`, (`mean`, `var`), (`gamma`,
    /// `beta`), `eps`, the residual (`[n·h·w, c]`), the ReLU → the output `[n·h·w, c]`.
    #[allow(clippy::type_complexity)]
    normalise: fn(
        FloatTensor<B>,
        (FloatTensor<B>, FloatTensor<B>),
        (FloatTensor<B>, FloatTensor<B>),
        f64,
        Option<FloatTensor<B>>,
        bool,
    ) -> Option<FloatTensor<B>>,
    /// The input gradient, and the residual's: `dy`, `x`, (`mean`, `var`), `gamma`,
    /// (`dβ`, `dγ`), `eps`, the ReLU's output, whether there was a residual → `dx` and
    /// the residual's gradient (`[n·h·w, c]`).
    #[allow(clippy::type_complexity)]
    normalise_backward: fn(
        FloatTensor<B>,
        FloatTensor<B>,
        (FloatTensor<B>, FloatTensor<B>),
        FloatTensor<B>,
        (FloatTensor<B>, FloatTensor<B>),
        f64,
        Option<FloatTensor<B>>,
        bool,
    ) -> Option<(FloatTensor<B>, Option<FloatTensor<B>>)>,
}

/// `[n, h·w, c]` as the `[n·h·w, c]` matrix the one-pass kernel sums.
fn rows<B: Backend>(t: &Tensor<B, 3>) -> FloatTensor<B> {
    let [n, hw, c] = t.dims();
    t.clone().reshape([n * hw, c]).into_primitive().tensor()
}

/// `relu?(batch_norm(x) + residual?)` composed from Burn's tensor ops in `layout`'s view:
/// (output, batch mean, biased batch variance). The sums, and then the normalisation,
/// from `by` where it gives them.
fn forward_in<B: Backend>(
    layout: Layout,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
    epilogue: Epilogue<FloatTensor<B>>,
    by: Option<OwnKernels<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let v = View::of::<B>(layout, &x);
    let x = v.view::<B>(x);
    let mut stats = None;
    if let Some(by) = by.filter(|_| layout == Layout::Last) {
        let x_rows = rows(&x);
        stats = (by.stats)(x_rows.clone());
        if let Some((mean, var)) = &stats {
            let normalise = by.normalise;
            let residual = epilogue.residual.clone().map(|r| rows(&v.view::<B>(r)));
            let (stats, affine) = ((mean.clone(), var.clone()), (gamma.clone(), beta.clone()));
            if let Some(out) = normalise(x_rows, stats, affine, eps, residual, epilogue.relu) {
                return (v.unview(v.unrows::<B>(out)), mean.clone(), var.clone());
            }
        }
    }
    let (mean, var, centered) = match stats {
        Some((mean, var)) => {
            let mean = v.wide::<B>(mean);
            (mean.clone(), v.wide::<B>(var), x - mean)
        }
        None => {
            let mean = v.sum(x.clone()) / v.m;
            let centered = x - mean.clone();
            let var = v.sum(centered.clone().square()) / v.m;
            (mean, var, centered)
        }
    };
    let scale = v.wide::<B>(gamma) * (var.clone() + eps).sqrt().recip();
    let out = centered * scale + v.wide::<B>(beta);
    let out = then::<B, 3>(out, epilogue, |r| v.view::<B>(r));
    (v.unview(out), v.narrow(mean), v.narrow(var))
}

/// The gradients of [`forward_in`] in `layout`'s view: of `x`, `gamma`, `beta` and, where
/// it had one (`residual`), the residual, after the ReLU's mask where the forward ended in
/// one (`relu_output`, as Burn's `relu_backward`: `dy` where the output is positive, else
/// 0).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn backward_in<B: Backend>(
    layout: Layout,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    (mean, var): (FloatTensor<B>, FloatTensor<B>),
    eps: f64,
    (residual, relu_output): (bool, Option<FloatTensor<B>>),
    dy: FloatTensor<B>,
    by: Option<OwnKernels<B>>,
) -> (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
) {
    let v = View::of::<B>(layout, &x);
    let (x, mut dy) = (v.view::<B>(x), v.view::<B>(dy));
    let output = relu_output.map(|o| v.view::<B>(o));
    let mut sums = None;
    if let Some(by) = by.filter(|_| layout == Layout::Last) {
        let (dy_rows, x_rows) = (rows(&dy), rows(&x));
        let output = output.as_ref().map(rows);
        let stats = (mean.clone(), var.clone());
        sums = (by.grads)(
            dy_rows.clone(),
            x_rows.clone(),
            stats.clone(),
            output.clone(),
            eps,
        );
        if let Some((d_beta, d_gamma)) = &sums {
            let backward = by.normalise_backward;
            let sums = (d_beta.clone(), d_gamma.clone());
            let gamma = gamma.clone();
            let done = backward(dy_rows, x_rows, stats, gamma, sums, eps, output, residual);
            if let Some((dx, d_residual)) = done {
                let unrows = |t: FloatTensor<B>| v.unview(v.unrows::<B>(t));
                let d_residual = d_residual.map(unrows);
                return (unrows(dx), d_gamma.clone(), d_beta.clone(), d_residual);
            }
        }
    }
    if let Some(output) = output {
        dy = dy.mask_fill(output.lower_equal_elem(0.0), 0.0);
    }
    let d_residual = residual.then(|| v.unview(dy.clone()));
    let invstd = (v.wide::<B>(var) + eps).sqrt().recip();
    let x_hat = (x - v.wide::<B>(mean)) * invstd.clone();
    let (d_beta, d_gamma) = match sums {
        Some((d_beta, d_gamma)) => (v.wide::<B>(d_beta), v.wide::<B>(d_gamma)),
        None => (v.sum(dy.clone()), v.sum(dy.clone() * x_hat.clone())),
    };
    let k = v.wide::<B>(gamma) * invstd / v.m;
    let dx = k * (dy * v.m - d_beta.clone() - x_hat * d_gamma.clone());
    (
        v.unview(dx),
        v.narrow(d_gamma),
        v.narrow(d_beta),
        d_residual,
    )
}

impl NormBackend for Flex {
    const FUSES_EPILOGUE: bool = true;

    fn batch_norm_train(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f64,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let plain = Epilogue {
            residual: None,
            relu: false,
        };
        flex_forward(&x, &gamma, &beta, eps, &plain)
            .unwrap_or_else(|| composed_forward::<Self>(Layout::Channels, x, gamma, beta, eps))
    }

    fn batch_norm_train_act(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f64,
        epilogue: Epilogue<FlexTensor>,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        flex_forward(&x, &gamma, &beta, eps, &epilogue)
            .unwrap_or_else(|| composed_act::<Self>(x, gamma, beta, eps, epilogue))
    }

    fn batch_norm_train_act_backward(
        x: FlexTensor,
        gamma: FlexTensor,
        stats: (FlexTensor, FlexTensor),
        eps: f64,
        (residual, relu_output): (bool, Option<FlexTensor>),
        dy: FlexTensor,
    ) -> (FlexTensor, FlexTensor, FlexTensor, Option<FlexTensor>) {
        let dy = match relu_output {
            Some(output) => relu_mask(output, dy),
            None => dy,
        };
        finish_act_backward::<Self>(x, gamma, stats, eps, residual, dy)
    }

    fn batch_norm_train_backward(
        x: FlexTensor,
        gamma: FlexTensor,
        (mean, var): (FlexTensor, FlexTensor),
        eps: f64,
        dy: FlexTensor,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let operands = (
            flex_f32::<4>(&x),
            flex_f32::<1>(&gamma),
            flex_f32::<1>(&mean),
            flex_f32::<1>(&var),
            flex_f32::<4>(&dy),
        );
        let (Some((xc, dims)), Some((g, _)), Some((mu, _)), Some((v, _)), Some((dyc, _))) =
            operands
        else {
            return composed_backward::<Self>(Layout::Channels, x, gamma, (mean, var), eps, dy);
        };
        if dims.contains(&0) {
            return composed_backward::<Self>(Layout::Channels, x, gamma, (mean, var), eps, dy);
        }
        let [n, c, h, w] = dims;
        let shape = Shape { n, c, hw: h * w };
        let stats = (values(&mu), values(&v));
        let (dx, d_gamma, d_beta) =
            cpu::backward(&shape, values(&xc), values(&g), stats, eps, values(&dyc));
        (
            to_flex(dx, dims),
            to_flex(d_gamma, [c]),
            to_flex(d_beta, [c]),
        )
    }
}

/// The Flex forward, with its epilogue; `None` where an operand is not a non-empty `f32`
/// tensor of the expected shape (the composed ops take those).
fn flex_forward(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f64,
    epilogue: &Epilogue<FlexTensor>,
) -> Option<(FlexTensor, FlexTensor, FlexTensor)> {
    let (xc, dims) = flex_f32::<4>(x)?;
    let (g, b) = (flex_f32::<1>(gamma)?.0, flex_f32::<1>(beta)?.0);
    let residual = match &epilogue.residual {
        Some(r) => Some(flex_f32::<4>(r).filter(|(_, d)| *d == dims)?.0),
        None => None,
    };
    if dims.contains(&0) {
        return None;
    }
    let [n, c, h, w] = dims;
    let shape = Shape { n, c, hw: h * w };
    let (out, mean, var) = cpu::forward(
        &shape,
        (values(&xc), values(&g), values(&b)),
        eps,
        residual.as_ref().map(values),
        epilogue.relu,
    );
    Some((to_flex(out, dims), to_flex(mean, [c]), to_flex(var, [c])))
}

/// Flex's `relu_backward` (`dy` where the ReLU's output is positive, else 0) as a parallel
/// pass, in place where `dy` is not shared: Flex's own is a serial pass into a new buffer.
fn relu_mask(output: FlexTensor, dy: FlexTensor) -> FlexTensor {
    const CHUNK: usize = 1 << 14;
    let (Some((out, dims)), Some((mut g, g_dims))) = (flex_f32::<4>(&output), flex_f32::<4>(&dy))
    else {
        return <Flex as ActivationOps<Flex>>::relu_backward(output, dy);
    };
    if dims != g_dims {
        return <Flex as ActivationOps<Flex>>::relu_backward(output, dy);
    }
    // `g` shares `dy`'s buffer where that was contiguous: dropping `dy` may make it unique.
    drop(dy);
    let out = values(&out);
    let keep = |o: f32, g: f32| if o > 0.0 { g } else { 0.0 };
    if let Some(gs) = g.try_storage_mut::<f32>() {
        gs.par_chunks_mut(CHUNK)
            .zip(out.par_chunks(CHUNK))
            .for_each(|(g, o)| g.iter_mut().zip(o).for_each(|(g, &o)| *g = keep(o, *g)));
        return g;
    }
    let mut masked = vec![0.0; out.len()];
    masked
        .par_chunks_mut(CHUNK)
        .zip(out.par_chunks(CHUNK).zip(values(&g).par_chunks(CHUNK)))
        .for_each(|(m, (o, g))| {
            for ((m, &o), &g) in m.iter_mut().zip(o).zip(g) {
                *m = keep(o, g);
            }
        });
    to_flex(masked, dims)
}

/// One autodiff node per batch norm; its backward asks the inner backend for all three
/// gradients at once.
impl<B: NormBackend, C: CheckpointStrategy> NormBackend for Autodiff<B, C> {
    fn batch_norm_running(
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        (batch_mean, batch_var): (FloatTensor<Self>, FloatTensor<Self>),
        m: usize,
        momentum: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let inner = |t: FloatTensor<Self>| t.primitive;
        let (mean, var) = B::batch_norm_running(
            (inner(mean), inner(var)),
            (inner(batch_mean), inner(batch_var)),
            m,
            momentum,
        );
        (Self::from_inner(mean), Self::from_inner(var))
    }

    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct BatchNormBackward;

        impl<B: NormBackend> Backward<B, 3> for BatchNormBackward {
            /// x, γ (checkpointed), the batch mean and variance, eps.
            type State = (NodeId, NodeId, FloatTensor<B>, FloatTensor<B>, f64);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_gamma, node_beta] = ops.parents;
                let dy = grads.consume::<B>(&ops.node);
                let (x_state, gamma_state, mean, var, eps) = ops.state;
                let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(x_state);
                let gamma = checkpointer.retrieve_node_output::<FloatTensor<B>>(gamma_state);
                let (dx, d_gamma, d_beta) =
                    B::batch_norm_train_backward(x, gamma, (mean, var), eps, dy);
                for (node, grad) in [(node_x, dx), (node_gamma, d_gamma), (node_beta, d_beta)] {
                    if let Some(node) = node {
                        grads.register::<B>(node.id, grad);
                    }
                }
            }
        }

        let (out, mean, var) = B::batch_norm_train(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive.clone(),
            eps,
        );
        let parents = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
        let out = match BatchNormBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let gamma_state = prep.checkpoint(&gamma);
                let state = (x_state, gamma_state, mean.clone(), var.clone(), eps);
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (out, Self::from_inner(mean), Self::from_inner(var))
    }

    fn batch_norm_train_act(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // A residual of another shape (broadcast) takes Burn's add, whose backward reduces
        // its gradient to that shape; the fused node's would be `x`'s.
        let same_shape = epilogue
            .residual
            .as_ref()
            .is_none_or(|r| r.primitive.shape() == x.primitive.shape());
        if !B::FUSES_EPILOGUE || !same_shape {
            return composed_act::<Self>(x, gamma, beta, eps, epilogue);
        }
        let Epilogue { residual, relu, .. } = epilogue;
        let (out, mean, var) = B::batch_norm_train_act(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive.clone(),
            eps,
            Epilogue {
                residual: residual.as_ref().map(|r| r.primitive.clone()),
                relu,
            },
        );
        // One node with the residual as a fourth parent where there is one (the node's
        // parent count is its type's, so the two cases are two instantiations).
        macro_rules! record {
            ($parents:expr) => {
                match BatchNormActBackward
                    .prepare::<C>($parents)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(mut prep) => {
                        let x_state = prep.checkpoint(&x);
                        let gamma_state = prep.checkpoint(&gamma);
                        let output = relu.then(|| out.clone());
                        let state = (x_state, gamma_state, mean.clone(), var.clone(), eps, output);
                        prep.finish(state, out)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(out),
                }
            };
        }
        let (xn, gn, bn) = (x.node.clone(), gamma.node.clone(), beta.node.clone());
        let out = match residual {
            Some(r) => record!([xn, gn, bn, r.node]),
            None => record!([xn, gn, bn]),
        };
        (out, Self::from_inner(mean), Self::from_inner(var))
    }
}

/// The autodiff node of a fused batch norm and epilogue: parents x, γ, β and, where `N` is
/// 4, the residual; its backward asks the inner backend for all the gradients at once.
#[derive(Debug)]
struct BatchNormActBackward;

impl<B: NormBackend, const N: usize> Backward<B, N> for BatchNormActBackward {
    /// x, γ (checkpointed), the batch mean and variance, eps, the output where the op ends
    /// in a ReLU.
    type State = (
        NodeId,
        NodeId,
        FloatTensor<B>,
        FloatTensor<B>,
        f64,
        Option<FloatTensor<B>>,
    );

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<B>(&ops.node);
        let (x_state, gamma_state, mean, var, eps, output) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(x_state);
        let gamma = checkpointer.retrieve_node_output::<FloatTensor<B>>(gamma_state);
        let epilogue = (N == 4, output);
        let (dx, d_gamma, d_beta, d_residual) =
            B::batch_norm_train_act_backward(x, gamma, (mean, var), eps, epilogue, dy);
        let mut parents = ops.parents.into_iter();
        for grad in [Some(dx), Some(d_gamma), Some(d_beta), d_residual] {
            if let (Some(node), Some(grad)) = (parents.next().flatten(), grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// [`rows_eval`] in the channels-last view: the output channels-last, as in training.
#[cfg(feature = "cube")]
fn last_eval<B: Backend>(
    x: FloatTensor<B>,
    (mean, var): (FloatTensor<B>, FloatTensor<B>),
    (gamma, beta): (FloatTensor<B>, FloatTensor<B>),
    eps: f64,
    epilogue: Epilogue<FloatTensor<B>>,
    by: Option<OwnKernels<B>>,
) -> FloatTensor<B> {
    let v = View::of::<B>(Layout::Last, &x);
    if let Some(normalise) = by.map(|by| by.normalise) {
        let x_rows = rows(&v.view::<B>(x.clone()));
        let residual = epilogue.residual.clone().map(|r| rows(&v.view::<B>(r)));
        let (stats, affine) = ((mean.clone(), var.clone()), (gamma.clone(), beta.clone()));
        if let Some(out) = normalise(x_rows, stats, affine, eps, residual, epilogue.relu) {
            return v.unview(v.unrows::<B>(out));
        }
    }
    let scale = v.wide::<B>(gamma) * (v.wide::<B>(var) + eps).sqrt().recip();
    let out = (v.view::<B>(x) - v.wide::<B>(mean)) * scale + v.wide::<B>(beta);
    v.unview(then::<B, 3>(out, epilogue, |r| v.view::<B>(r)))
}

/// CubeCL's backends (CUDA; WebGPU in the tests): batch norm and its epilogue by the
/// runner's kernels (`norm_sums = "one_pass"`) or composed from Burn's tensor ops
/// (`"reduce"`, which fusion joins into few kernels), in the channels-last view
/// ([`Layout::Last`]); one autodiff node, so the backward is in that view too.
#[cfg(feature = "cube")]
macro_rules! cube_norm {
    () => {
        const FUSES_EPILOGUE: bool = true;

        fn batch_norm_train(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            eps: f64,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let plain = Epilogue {
                residual: None,
                relu: false,
            };
            forward_in::<Self>(Layout::Last, x, gamma, beta, eps, plain, one_pass::<Self>())
        }

        fn batch_norm_train_backward(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            stats: (FloatTensor<Self>, FloatTensor<Self>),
            eps: f64,
            dy: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let by = one_pass::<Self>();
            let (dx, d_gamma, d_beta, _) =
                backward_in::<Self>(Layout::Last, x, gamma, stats, eps, (false, None), dy, by);
            (dx, d_gamma, d_beta)
        }

        fn batch_norm_train_act(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            eps: f64,
            epilogue: Epilogue<FloatTensor<Self>>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            forward_in::<Self>(
                Layout::Last,
                x,
                gamma,
                beta,
                eps,
                epilogue,
                one_pass::<Self>(),
            )
        }

        fn batch_norm_train_act_backward(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            stats: (FloatTensor<Self>, FloatTensor<Self>),
            eps: f64,
            epilogue: (bool, Option<FloatTensor<Self>>),
            dy: FloatTensor<Self>,
        ) -> (
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
            Option<FloatTensor<Self>>,
        ) {
            let by = one_pass::<Self>();
            backward_in::<Self>(Layout::Last, x, gamma, stats, eps, epilogue, dy, by)
        }

        fn batch_norm_eval(
            x: FloatTensor<Self>,
            stats: (FloatTensor<Self>, FloatTensor<Self>),
            affine: (FloatTensor<Self>, FloatTensor<Self>),
            eps: f64,
            epilogue: Epilogue<FloatTensor<Self>>,
        ) -> FloatTensor<Self> {
            last_eval::<Self>(x, stats, affine, eps, epilogue, one_pass::<Self>())
        }

        fn batch_norm_running(
            running: (FloatTensor<Self>, FloatTensor<Self>),
            batch: (FloatTensor<Self>, FloatTensor<Self>),
            m: usize,
            momentum: f64,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            use super::norm_cube::NormKernels;
            let (r, b) = (running.clone(), batch.clone());
            Self::running_stats(r, b, m, momentum)
                .unwrap_or_else(|| composed_running::<Self>(running, batch, m, momentum))
        }
    };
}

#[cfg(feature = "cube")]
impl<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement> NormBackend
    for burn_cubecl::CubeBackend<R, f32, i32, BT>
{
    cube_norm!();
}

#[cfg(feature = "cube")]
impl<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement> NormBackend
    for burn_fusion::Fusion<burn_cubecl::CubeBackend<R, f32, i32, BT>>
{
    cube_norm!();
}

/// The one-pass kernel's sums on a CubeCL backend ([`super::norm_cube`]), and the
/// normalisation's kernels where the backend has them ([`super::norm_apply_cube`]).
#[cfg(feature = "cube")]
fn one_pass<B: super::norm_cube::NormKernels>() -> Option<OwnKernels<B>> {
    Some(OwnKernels {
        stats: B::stats_sums,
        grads: B::grad_sums,
        normalise: B::normalise,
        normalise_backward: B::normalise_backward,
    })
}

/// `[n, c, hw]`: channel `ch` of image `i` is the row `(i·c + ch)·hw ..`.
struct Shape {
    n: usize,
    c: usize,
    hw: usize,
}

impl Shape {
    fn row<'a>(&self, t: &'a [f32], image: usize, channel: usize) -> &'a [f32] {
        &t[(image * self.c + channel) * self.hw..][..self.hw]
    }

    /// Σ over a channel's rows of `f(image)`, each row summed in `f32` lanes and the
    /// rows in `f64`: the same order on every run.
    fn channel_sum(&self, f: impl Fn(usize) -> f32) -> f64 {
        (0..self.n).map(|i| f64::from(f(i))).sum()
    }
}

/// The Flex kernels: plain loops over contiguous rows that the compiler vectorises,
/// parallel over channels (reductions) or rows (elementwise passes).
mod cpu {
    use super::*;

    /// Σ a·(b − shift) over two rows, in 16 independent lanes.
    pub(super) fn dot_centered(a: &[f32], b: &[f32], shift: f32) -> f32 {
        let mut lanes = [0.0f32; 16];
        let (a_chunks, b_chunks) = (a.chunks_exact(16), b.chunks_exact(16));
        let tail: f32 = a_chunks
            .remainder()
            .iter()
            .zip(b_chunks.remainder())
            .map(|(x, y)| x * (y - shift))
            .sum();
        for (ca, cb) in a_chunks.zip(b_chunks) {
            for l in 0..16 {
                lanes[l] += ca[l] * (cb[l] - shift);
            }
        }
        lanes.iter().sum::<f32>() + tail
    }

    /// Σ (b − shift) over a row.
    pub(super) fn sum_centered(b: &[f32], shift: f32) -> f32 {
        let mut lanes = [0.0f32; 16];
        let chunks = b.chunks_exact(16);
        let tail: f32 = chunks.remainder().iter().map(|y| y - shift).sum();
        for cb in chunks {
            for l in 0..16 {
                lanes[l] += cb[l] - shift;
            }
        }
        lanes.iter().sum::<f32>() + tail
    }

    /// (output, mean, biased variance); the output is `relu?(x̂·γ + β + residual?)`,
    /// rounded after each step as the separate ops would.
    pub(super) fn forward(
        s: &Shape,
        (x, gamma, beta): (&[f32], &[f32], &[f32]),
        eps: f64,
        residual: Option<&[f32]>,
        relu: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let m = (s.n * s.hw) as f64;
        // Two passes per channel (mean, then the variance around it): the channel's rows
        // are still in cache for the second.
        let stats: Vec<(f32, f32)> = (0..s.c)
            .into_par_iter()
            .map(|ch| {
                let mean = s.channel_sum(|i| sum_centered(s.row(x, i, ch), 0.0)) / m;
                let mean = mean as f32;
                let sq = |i| {
                    let row = s.row(x, i, ch);
                    dot_centered_sq(row, mean)
                };
                (mean, (s.channel_sum(sq) / m) as f32)
            })
            .collect();
        // y = x·a + b per channel, a = γ·invstd, b = β − mean·a.
        let affine: Vec<(f32, f32)> = stats
            .iter()
            .zip(gamma.iter().zip(beta))
            .map(|(&(mean, var), (&g, &b))| {
                let a = g * inv_std(var, eps);
                (a, b - mean * a)
            })
            .collect();
        let mut out = vec![0.0; x.len()];
        out.par_chunks_mut(s.hw)
            .zip(x.par_chunks(s.hw))
            .enumerate()
            .for_each(|(row, (y, x))| {
                let (a, b) = affine[row % s.c];
                y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * a + b);
                if let Some(r) = residual {
                    let r = &r[row * s.hw..][..s.hw];
                    y.iter_mut().zip(r).for_each(|(y, &r)| *y += r);
                }
                if relu {
                    y.iter_mut().for_each(|y| *y = y.max(0.0));
                }
            });
        let (mean, var) = stats.into_iter().unzip();
        (out, mean, var)
    }

    /// Σ (b − shift)² over a row.
    fn dot_centered_sq(b: &[f32], shift: f32) -> f32 {
        let mut lanes = [0.0f32; 16];
        let chunks = b.chunks_exact(16);
        let tail: f32 = chunks
            .remainder()
            .iter()
            .map(|y| (y - shift) * (y - shift))
            .sum();
        for cb in chunks {
            for l in 0..16 {
                let d = cb[l] - shift;
                lanes[l] += d * d;
            }
        }
        lanes.iter().sum::<f32>() + tail
    }

    fn inv_std(var: f32, eps: f64) -> f32 {
        (1.0 / (f64::from(var) + eps).sqrt()) as f32
    }

    /// (dx, dγ, dβ).
    pub(super) fn backward(
        s: &Shape,
        x: &[f32],
        gamma: &[f32],
        (mean, var): (&[f32], &[f32]),
        eps: f64,
        dy: &[f32],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let m = (s.n * s.hw) as f64;
        // Per channel: dβ = Σ dy, Σ dy·(x − mean); then dx = A·dy + B·(x − mean) + C
        // (centred, so a mean far from 0 costs no precision).
        let sums: Vec<(f32, f32, [f32; 4])> = (0..s.c)
            .into_par_iter()
            .map(|ch| {
                let mu = mean[ch];
                let d_beta = s.channel_sum(|i| sum_centered(s.row(dy, i, ch), 0.0));
                let dot = s.channel_sum(|i| dot_centered(s.row(dy, i, ch), s.row(x, i, ch), mu));
                let invstd = f64::from(inv_std(var[ch], eps));
                let d_gamma = dot * invstd;
                let k = f64::from(gamma[ch]) * invstd;
                let b = -k * invstd * d_gamma / m;
                let c = -k * d_beta / m;
                let coefficients = [k as f32, b as f32, c as f32, mu];
                (d_gamma as f32, d_beta as f32, coefficients)
            })
            .collect();
        let mut dx = vec![0.0; x.len()];
        dx.par_chunks_mut(s.hw)
            .zip(x.par_chunks(s.hw).zip(dy.par_chunks(s.hw)))
            .enumerate()
            .for_each(|(row, (dx, (x, dy)))| {
                let [a, b, c, mu] = sums[row % s.c].2;
                for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
                    *dx = a * dy + b * (x - mu) + c;
                }
            });
        let d_gamma = sums.iter().map(|s| s.0).collect();
        let d_beta = sums.iter().map(|s| s.1).collect();
        (dx, d_gamma, d_beta)
    }
}

/// What the batch norm's tests compare, in the order their runs return it.
#[cfg(test)]
const OUTPUTS: [&str; 7] = [
    "output",
    "mean",
    "variance",
    "dx",
    "dgamma",
    "dbeta",
    "d residual",
];

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    fn flex(dims: &[usize], dist: Distribution) -> FlexTensor {
        let t =
            Tensor::<Flex, 1>::random([dims.iter().product::<usize>()], dist, &Default::default());
        let values = t.into_data().to_vec::<f32>().unwrap();
        FlexTensor::from_data(TensorData::new(values, dims.to_vec()))
    }

    fn worst(a: &FlexTensor, b: &FlexTensor) -> f32 {
        let (a, b) = (
            values(&a.to_contiguous()).to_vec(),
            values(&b.to_contiguous()).to_vec(),
        );
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The default (composed, what CUDA runs) and Flex's kernels agree: output, statistics
    /// and all three gradients, to 1e-4 absolute on values of order 1. (The autodiff op,
    /// which routes the three gradients, is checked against Burn's `BatchNorm` in
    /// `model::tests`.)
    #[test]
    fn composed_default_and_cpu_kernels_agree() {
        for dims in [[4, 3, 5, 6], [2, 5, 8, 8], [3, 2, 1, 1]] {
            let c = dims[1];
            let x = flex(&dims, Distribution::Normal(1.0, 2.0));
            let gamma = flex(&[c], Distribution::Uniform(0.5, 1.5));
            let beta = flex(&[c], Distribution::Default);
            let dy = flex(&dims, Distribution::Default);
            let eps = 1e-5;
            let ours = Flex::batch_norm_train(x.clone(), gamma.clone(), beta.clone(), eps);
            let reference =
                composed_forward::<Flex>(Layout::Channels, x.clone(), gamma.clone(), beta, eps);
            assert!(worst(&ours.0, &reference.0) < 1e-4, "{dims:?}: output");
            assert!(worst(&ours.1, &reference.1) < 1e-5, "{dims:?}: mean");
            assert!(worst(&ours.2, &reference.2) < 1e-4, "{dims:?}: variance");
            let stats = (ours.1, ours.2);
            let grads = Flex::batch_norm_train_backward(
                x.clone(),
                gamma.clone(),
                stats.clone(),
                eps,
                dy.clone(),
            );
            let expected = composed_backward::<Flex>(Layout::Channels, x, gamma, stats, eps, dy);
            assert!(worst(&grads.0, &expected.0) < 1e-4, "{dims:?}: dx");
            assert!(worst(&grads.1, &expected.1) < 1e-4, "{dims:?}: dgamma");
            assert!(worst(&grads.2, &expected.2) < 1e-4, "{dims:?}: dbeta");
        }
    }

    /// The composed form reads a channels-last activation (a `[n, h, w, c]` buffer seen as
    /// `[n, c, h, w]`, as CubeCL's convolutions leave it) as it reads a contiguous one.
    #[test]
    fn composed_form_takes_a_channels_last_activation() {
        let dims = [3, 4, 5, 6];
        let x = flex(&dims, Distribution::Normal(1.0, 2.0));
        let gamma = flex(&[4], Distribution::Uniform(0.5, 1.5));
        let beta = flex(&[4], Distribution::Default);
        let dy = flex(&dims, Distribution::Default);
        let nchw: Tensor<Flex, 4> = tensor(x.clone());
        let nhwc = Tensor::<Flex, 4>::from_data(
            nchw.permute([0, 2, 3, 1]).into_data(),
            &Default::default(),
        );
        let strided = nhwc.permute([0, 3, 1, 2]).into_primitive().tensor();
        let a = composed_forward::<Flex>(
            Layout::Channels,
            x.clone(),
            gamma.clone(),
            beta.clone(),
            1e-5,
        );
        let b =
            composed_forward::<Flex>(Layout::Channels, strided.clone(), gamma.clone(), beta, 1e-5);
        for (i, name) in ["output", "mean", "variance"].iter().enumerate() {
            let (p, q) = [(&a.0, &b.0), (&a.1, &b.1), (&a.2, &b.2)][i];
            assert!(worst(p, q) < 1e-5, "{name}");
        }
        let ga = composed_backward::<Flex>(
            Layout::Channels,
            x,
            gamma.clone(),
            (a.1.clone(), a.2.clone()),
            1e-5,
            dy.clone(),
        );
        let gb = composed_backward::<Flex>(Layout::Channels, strided, gamma, (a.1, a.2), 1e-5, dy);
        assert!(worst(&ga.0, &gb.0) < 1e-5, "dx");
        assert!(worst(&ga.1, &gb.1) < 1e-4, "dgamma");
        assert!(worst(&ga.2, &gb.2) < 1e-4, "dbeta");
    }
}

#[cfg(test)]
mod epilogue_tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Tensor, TensorData};

    use super::*;

    type A = Autodiff<Flex>;

    fn bits(t: TensorData) -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// On Flex the batch norm with its epilogue is one node; it gives what the batch norm
    /// followed by Burn's add and ReLU (three nodes, as on CUDA) gives, to the bit: the
    /// output, the statistics, and the gradients of x, γ, β and the residual.
    #[test]
    fn fused_epilogue_equals_burns_add_and_relu_to_the_bit() {
        const { assert!(<Flex as NormBackend>::FUSES_EPILOGUE) };
        let d = Default::default();
        // Fixed values (Burn's random tensors are seeded from the system): `offset + scale·u`
        // with `u` uniform in [-1, 1) from a seeded LCG.
        let fixed = |dims: Vec<usize>, seed: u64, offset: f32, scale: f32| {
            let mut state = seed;
            let n = dims.iter().product::<usize>();
            let v = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    offset + scale * ((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
                })
                .collect::<Vec<f32>>();
            TensorData::new(v, dims)
        };
        for dims in [[4, 3, 5, 6], [2, 5, 8, 8], [3, 2, 1, 1]] {
            let c = dims[1];
            let x = fixed(dims.to_vec(), 1, 1.0, 3.0);
            let r = fixed(dims.to_vec(), 2, 0.0, 1.5);
            let dy = fixed(dims.to_vec(), 3, 0.0, 1.5);
            let gamma = fixed(vec![c], 4, 1.0, 0.5);
            let beta = fixed(vec![c], 5, 0.0, 0.5);
            for (residual, relu) in [(false, true), (true, true), (true, false), (false, false)] {
                let what = format!("{dims:?}, residual {residual}, relu {relu}");
                // Each graph its own leaves: (output, mean, var, dx, dγ, dβ, d residual).
                let run = |fused: bool| {
                    let leaf4 =
                        |t: &TensorData| Tensor::<A, 4>::from_data(t.clone(), &d).require_grad();
                    let leaf1 =
                        |t: &TensorData| Tensor::<A, 1>::from_data(t.clone(), &d).require_grad();
                    let (xl, rl, gl, bl) = (leaf4(&x), leaf4(&r), leaf1(&gamma), leaf1(&beta));
                    let res = residual.then(|| rl.clone());
                    let (out, mean, var) = if fused {
                        batch_norm_train_act(xl.clone(), gl.clone(), bl.clone(), 1e-5, res, relu)
                    } else {
                        let (mut out, mean, var) =
                            batch_norm_train(xl.clone(), gl.clone(), bl.clone(), 1e-5);
                        if let Some(res) = res {
                            out = out + res;
                        }
                        if relu {
                            out = burn::tensor::activation::relu(out);
                        }
                        (out, mean, var)
                    };
                    let g = (out.clone() * Tensor::<A, 4>::from_data(dy.clone(), &d))
                        .sum()
                        .backward();
                    let b = |t: Option<TensorData>| t.map(bits);
                    [
                        b(Some(out.into_data())),
                        b(Some(mean.into_data())),
                        b(Some(var.into_data())),
                        b(xl.grad(&g).map(|t| t.into_data())),
                        b(gl.grad(&g).map(|t| t.into_data())),
                        b(bl.grad(&g).map(|t| t.into_data())),
                        b(rl.grad(&g).map(|t| t.into_data())),
                    ]
                };
                let (ours, burns) = (run(true), run(false));
                for (name, (a, b)) in OUTPUTS.iter().zip(ours.iter().zip(&burns)) {
                    assert_eq!(a, b, "{what}: {name}");
                }
                assert_eq!(ours[6].is_some(), residual, "{what}: d residual present");
                // The ReLU clipped some outputs (so its mask was exercised), and not all.
                let out = ours[0].as_ref().unwrap();
                let clipped = out.iter().filter(|&&b| b == 0).count();
                if relu {
                    assert!(
                        clipped > 0 && clipped < out.len(),
                        "{what}: {clipped} clipped"
                    );
                }
            }
        }
    }

    /// The ReLU mask on a gradient whose buffer is shared: Flex's `relu_backward`'s values,
    /// and the other holder's values untouched (the unshared case runs in place, above).
    #[test]
    fn relu_mask_of_a_shared_gradient_copies() {
        let out: Vec<f32> = (0..40_000).map(|i| (i % 7) as f32 - 3.0).collect();
        let dy: Vec<f32> = (0..40_000).map(|i| (i % 5) as f32 + 0.5).collect();
        let t = |v: &Vec<f32>| FlexTensor::from_data(TensorData::new(v.clone(), [2, 4, 50, 100]));
        let (output, grad) = (t(&out), t(&dy));
        let holder = grad.clone();
        let masked = relu_mask(output.clone(), grad);
        let expected = <Flex as ActivationOps<Flex>>::relu_backward(output, t(&dy));
        assert_eq!(values(&masked), values(&expected.to_contiguous()));
        assert_eq!(values(&holder), &dy[..], "the shared buffer was written");
        assert!(values(&masked).contains(&0.0) && values(&masked).contains(&0.5));
    }
}

/// What the batch norm's tests on a CubeCL runtime share (WebGPU here, CUDA on a GPU).
#[cfg(all(test, feature = "cube"))]
mod cube_checks {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::*;
    use crate::ops::TrainBackend;

    /// `x` on `B` as `dims` (`[n, c, h, w]`), held in memory as `[n, h, w, c]` and
    /// permuted where `channels_last` (as a CubeCL convolution's output is): the leaf to
    /// take gradients of, and the `[n, c, h, w]` tensor.
    pub(super) fn input<B: AutodiffBackend>(
        x: &TensorData,
        channels_last: bool,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let device = Default::default();
        if channels_last {
            let nchw = Tensor::<B, 4>::from_data(x.clone(), &device);
            let nhwc = Tensor::<B, 4>::from_data(nchw.permute([0, 2, 3, 1]).into_data(), &device);
            let leaf = nhwc.require_grad();
            (leaf.clone(), leaf.permute([0, 3, 1, 2]))
        } else {
            let leaf = Tensor::<B, 4>::from_data(x.clone(), &device).require_grad();
            (leaf.clone(), leaf)
        }
    }

    /// The leaf's gradient as `[n, c, h, w]`.
    pub(super) fn grad_nchw<B: AutodiffBackend>(
        leaf: &Tensor<B, 4>,
        grads: &B::Gradients,
        channels_last: bool,
    ) -> Tensor<B::InnerBackend, 4> {
        let g = leaf.grad(grads).unwrap();
        if channels_last {
            g.permute([0, 3, 1, 2])
        } else {
            g
        }
    }

    /// out, mean, var, dx, dγ, dβ (and d residual where there is one) of
    /// `sum(relu?(batch_norm(x) + residual?) * dy)`; `act` is `None` for
    /// [`batch_norm_train`], else the residual (held as `x` is) and whether a ReLU ends it.
    pub(super) fn run<B: TrainBackend>(
        x: &TensorData,
        g: &TensorData,
        dy: &TensorData,
        channels_last: bool,
        act: Option<(Option<&TensorData>, bool)>,
    ) -> Vec<Vec<f32>> {
        let device = Default::default();
        let (leaf, x) = input::<B>(x, channels_last);
        let gamma = Tensor::<B, 1>::from_data(g.clone(), &device).require_grad();
        let beta = Tensor::<B, 1>::zeros([g.shape[0]], &device).require_grad();
        let dy = Tensor::<B, 4>::from_data(dy.clone(), &device);
        let residual = act.and_then(|(r, _)| r.map(|r| input::<B>(r, channels_last)));
        let (out, mean, var) = match act {
            None => batch_norm_train(x, gamma.clone(), beta.clone(), 1e-5),
            Some((_, relu)) => batch_norm_train_act(
                x,
                gamma.clone(),
                beta.clone(),
                1e-5,
                residual.as_ref().map(|(_, r)| r.clone()),
                relu,
            ),
        };
        let grads = (out.clone() * dy).sum().backward();
        let v = |d: TensorData| d.to_vec::<f32>().unwrap();
        let mut got = vec![
            v(out.into_data()),
            v(mean.into_data()),
            v(var.into_data()),
            v(grad_nchw(&leaf, &grads, channels_last).into_data()),
            v(gamma.grad(&grads).unwrap().into_data()),
            v(beta.grad(&grads).unwrap().into_data()),
        ];
        if let Some((r, _)) = &residual {
            got.push(v(grad_nchw(r, &grads, channels_last).into_data()));
        }
        got
    }

    /// Training on a CubeCL runtime (forward, the running statistics, all gradients)
    /// matches the CPU's kernels, fused and not, from either layout, with each epilogue,
    /// with the sums by the one-pass kernel (`norm_sums = "one_pass"`, which must run:
    /// forward and backward, two calls) and the normalisation by the runner's kernels (two
    /// calls, fused or not), and by Burn's ops (`reduce`, where neither must run). The
    /// larger shape has more rows than one chunk (the kernel's second launch adds the partial rows), 40
    /// channels (two blocks of 32, the second partial), and a mean of 500 where the spread
    /// is 2: unshifted, `E[x²] − E[x]²` in `f32` loses the variance's digits (with the
    /// shift taken out of the kernel and of the mean, the output is off by 0.7-0.9%).
    pub(super) fn matches_the_cpu<Fused: NormBackend, Plain: NormBackend>()
    where
        Autodiff<Fused>: TrainBackend,
        Autodiff<Plain>: TrainBackend,
    {
        use crate::ops::norm_cube::on_this_thread;
        let random = |dims: Vec<usize>, d| {
            Tensor::<Flex, 1>::random([dims.iter().product::<usize>()], d, &Default::default())
                .into_data()
                .to_vec::<f32>()
                .map(|v| TensorData::new(v, dims))
                .unwrap()
        };
        // The output gradient of the larger shape sums to 0 in each channel: `dγ =
        // Σ dy·(x − mean)·invstd` moves by `Σ dy·invstd` times the mean's rounding (one
        // f32 step of 500 is 3e-5), and the CPU's mean and CubeCL's may differ by that
        // step, whichever sums them (with `dy` in [0, 1), `dγ` was off by up to 0.2% in
        // one run of five, by Burn's reductions as by the kernel).
        // It runs no ReLU either: of its 40,960 outputs, some fall within a rounding of 0,
        // where the CPU's and CubeCL's masks may differ, and a masked element moves `dx`
        // by its whole `dy` (the small shapes check the masked sums, in one chunk; the
        // second launch only adds chunks, whatever was summed).
        let shapes = [
            (vec![4, 3, 5, 6], 1.0, false, true),
            (vec![2, 8, 4, 4], 1.0, false, true),
            (vec![4, 40, 16, 16], 500.0, true, false),
        ];
        for (dims, mean, centred_dy, relu_too) in shapes {
            let x = random(dims.clone(), Distribution::Normal(mean, 2.0));
            let g = random(vec![dims[1]], Distribution::Uniform(0.5, 1.5));
            let mut dy = random(dims.clone(), Distribution::Default);
            if centred_dy {
                let [n, c, h, w] = [dims[0], dims[1], dims[2], dims[3]];
                let mut v = dy.to_vec::<f32>().unwrap();
                for ch in 0..c {
                    let at = |i: usize, p: usize| (i * c + ch) * h * w + p;
                    let all = || (0..n).flat_map(|i| (0..h * w).map(move |p| (i, p)));
                    let mean = all().map(|(i, p)| f64::from(v[at(i, p)])).sum::<f64>()
                        / (n * h * w) as f64;
                    for (i, p) in all() {
                        v[at(i, p)] = (f64::from(v[at(i, p)]) - mean) as f32;
                    }
                }
                dy = TensorData::new(v, dims.clone());
            }
            let r = random(dims.clone(), Distribution::Normal(0.0, 1.0));
            // The batch norm alone, then with its epilogues: a ReLU (half the outputs
            // masked), a residual, both.
            let acts = [
                None,
                Some((None, true)),
                Some((Some(&r), false)),
                Some((Some(&r), true)),
            ];
            for act in acts
                .into_iter()
                .filter(|a| relu_too || !a.is_some_and(|a| a.1))
            {
                let want = run::<Autodiff<Flex>>(&x, &g, &dy, false, act);
                for one_pass in [true, false] {
                    let sums = if one_pass { "one_pass" } else { "reduce" };
                    let mut got = vec![];
                    for channels_last in [false, true] {
                        let layout = if channels_last { ", channels-last" } else { "" };
                        let fused = on_this_thread(one_pass, || {
                            run::<Autodiff<Fused>>(&x, &g, &dy, channels_last, act)
                        });
                        let plain = on_this_thread(one_pass, || {
                            run::<Autodiff<Plain>>(&x, &g, &dy, channels_last, act)
                        });
                        got.push((format!("fused{layout}, {sums}"), fused));
                        got.push((format!("plain{layout}, {sums}"), plain));
                    }
                    let case = act.map(|(r, relu)| (r.is_some(), relu));
                    for (backend, (got, ran)) in got {
                        // Sums forward and backward and the normalisation each way, fused
                        // (custom operations in the stream) or not; none with `reduce`.
                        let calls = if one_pass { [2, 2] } else { [0, 0] };
                        assert_eq!(
                            ran, calls,
                            "{backend} {dims:?} {case:?}: [sums, normalisation] kernel calls"
                        );
                        assert_eq!(got.len(), want.len(), "{backend} {dims:?} {case:?}");
                        // Off by at most 1e-3 of the value, or of 1 where it is smaller:
                        // `dgamma` and `dbeta` are sums of 1,024 products on the larger
                        // shape, added up in another order than the CPU's.
                        for (i, name) in OUTPUTS.iter().enumerate().take(want.len()) {
                            let worst = got[i]
                                .iter()
                                .zip(&want[i])
                                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                                .fold(0.0f32, f32::max);
                            assert!(
                                worst < 1e-3,
                                "{backend} {dims:?}, (residual, relu) {case:?}: {name} off by {worst} (relative)"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The one-pass sums and the composed form on CUDA against the CPU (the GPU check's
/// self-test, `scripts/gpu-check.sh`, runs it with the convolution kernels' check). Without
/// a CUDA device it says so and passes.
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    #[test]
    fn cuda_named_batch_norm_sums_match_the_cpu() {
        if !crate::backend::cuda_devices().is_ok_and(|d| !d.is_empty()) {
            eprintln!("no CUDA device here: the batch norm is not checked");
            return;
        }
        super::cube_checks::matches_the_cpu::<
            burn::backend::Cuda,
            burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
        >();
        eprintln!("batch norm on CUDA: one_pass and reduce, fused and plain, match the CPU");
    }
}

/// Batch norm on a real CubeCL runtime (WebGPU over Mesa's software Vulkan, fused and not):
/// the composed ops CUDA runs, forward and all three gradients, against the CPU kernels
/// (which `tests` above and `model::tests` tie to Burn's `BatchNorm`).
#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::cube_checks::input;
    use super::*;
    use crate::ops::norm_cube::on_this_thread;

    type Plain = burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

    /// The strides a CubeCL backend holds a float tensor with.
    trait Strides: NormBackend {
        fn strides(t: FloatTensor<Self>) -> Vec<usize>;
    }

    impl Strides for Plain {
        fn strides(t: FloatTensor<Self>) -> Vec<usize> {
            t.meta.strides().to_vec()
        }
    }

    impl Strides for burn::backend::Wgpu {
        fn strides(t: FloatTensor<Self>) -> Vec<usize> {
            let client = t.client.clone();
            Plain::strides(client.resolve_tensor_float::<Plain>(t))
        }
    }

    /// Whether `t` (`[n, c, h, w]`) is channels-last in memory: what CubeCL's implicit GEMM
    /// takes without a copy.
    fn channels_last<B: Strides>(t: Tensor<Autodiff<B>, 4>) -> bool {
        let s = B::strides(t.inner().into_primitive().tensor());
        s[1] == 1
    }

    /// Which of the batch norm's output, its input gradient and its residual's gradient are
    /// channels-last, with the epilogue (residual and ReLU) or without, from an input held
    /// as `channels_last` says.
    fn layouts<B: Strides>(dims: [usize; 4], channels_last_input: bool, act: bool) -> [bool; 3] {
        let device = Default::default();
        let data =
            Tensor::<Autodiff<B>, 4>::random(dims, Distribution::Default, &device).into_data();
        let (leaf, x) = input::<Autodiff<B>>(&data, channels_last_input);
        let (rleaf, r) = input::<Autodiff<B>>(&data, channels_last_input);
        let gamma = Tensor::<Autodiff<B>, 1>::ones([dims[1]], &device).require_grad();
        let beta = Tensor::<Autodiff<B>, 1>::zeros([dims[1]], &device).require_grad();
        let (out, _, _) = if act {
            batch_norm_train_act(x, gamma, beta, 1e-5, Some(r), true)
        } else {
            batch_norm_train(x, gamma, beta, 1e-5)
        };
        let dy = Tensor::<Autodiff<B>, 4>::random(dims, Distribution::Default, &device);
        let grads = (out.clone() * dy).sum().backward();
        let dx = leaf.grad(&grads).unwrap();
        let dx = if channels_last_input {
            dx.permute([0, 3, 1, 2])
        } else {
            dx
        };
        let dr = match rleaf.grad(&grads) {
            Some(g) if channels_last_input => g.permute([0, 3, 1, 2]),
            Some(g) => g,
            None => dx.clone(),
        };
        let inner = |t: Tensor<B, 4>| B::strides(t.into_primitive().tensor())[1] == 1;
        [channels_last(out), inner(dx), act && inner(dr)]
    }

    /// Evaluation (`batch_norm_eval`) on `B`'s inner backend: its output as `[n, c, h, w]`
    /// values, and whether it is channels-last in memory (`None` on the CPU).
    fn eval<B: NormBackend>(
        data: [&TensorData; 5],
        channels_last: bool,
        residual: bool,
        relu: bool,
        strides: impl Fn(FloatTensor<B>) -> Option<Vec<usize>>,
    ) -> (Vec<f32>, Option<bool>) {
        let [x, mean, var, gamma, r] = data;
        let device = Default::default();
        let held = |d: &TensorData| {
            let t = Tensor::<B, 4>::from_data(d.clone(), &device);
            if channels_last {
                let nhwc = Tensor::<B, 4>::from_data(t.permute([0, 2, 3, 1]).into_data(), &device);
                nhwc.permute([0, 3, 1, 2])
            } else {
                t
            }
        };
        let v = |d: &TensorData| Tensor::<B, 1>::from_data(d.clone(), &device);
        let beta = v(mean) * 0.5;
        let out = batch_norm_eval(
            held(x),
            (v(mean), v(var)),
            (v(gamma), beta),
            1e-5,
            residual.then(|| held(r)),
            relu,
        );
        let last = strides(out.clone().into_primitive().tensor()).map(|s| s[1] == 1);
        (out.into_data().to_vec::<f32>().unwrap(), last)
    }

    /// Evaluation on CubeCL matches the CPU's, epilogues included, from either layout,
    /// and leaves its output channels-last for the next convolution.
    #[test]
    fn wgpu_batch_norm_evaluation_matches_the_cpu_and_is_channels_last() {
        let device = Default::default();
        let random = |dims: Vec<usize>, d| {
            Tensor::<Flex, 1>::random([dims.iter().product::<usize>()], d, &device)
                .into_data()
                .to_vec::<f32>()
                .map(|v| TensorData::new(v, dims))
                .unwrap()
        };
        // One cube of 256 units, and 13 of them over 40 channels (the kernel's index).
        for dims in [vec![2, 8, 4, 3], vec![2, 40, 8, 5]] {
            let c = dims[1];
            let x = random(dims.clone(), Distribution::Normal(1.0, 2.0));
            let r = random(dims.clone(), Distribution::Normal(0.0, 1.0));
            let mean = random(vec![c], Distribution::Normal(1.0, 0.5));
            let var = random(vec![c], Distribution::Uniform(0.5, 4.0));
            let gamma = random(vec![c], Distribution::Uniform(0.5, 1.5));
            let data = [&x, &mean, &var, &gamma, &r];
            for (residual, relu) in [(false, false), (false, true), (true, false), (true, true)] {
                let (want, _) = eval::<Flex>(data, false, residual, relu, |_| None);
                // `one_pass` gives the normalisation to the runner's kernel (one call,
                // fused or not); `reduce` leaves it to Burn's ops.
                for (one_pass, channels_last) in [(true, false), (true, true), (false, true)] {
                    let fused = on_this_thread(one_pass, || {
                        eval::<burn::backend::Wgpu>(data, channels_last, residual, relu, |t| {
                            Some(<burn::backend::Wgpu as Strides>::strides(t))
                        })
                    });
                    let plain = on_this_thread(one_pass, || {
                        eval::<Plain>(data, channels_last, residual, relu, |t| {
                            Some(Plain::strides(t))
                        })
                    });
                    let runs = [("fused", fused), ("plain", plain)];
                    for (backend, ((got, last), calls)) in runs {
                        let normalised = usize::from(one_pass);
                        let case = format!(
                            "{backend} {dims:?}, one_pass {one_pass}, input channels-last {channels_last}, residual {residual}, relu {relu}"
                        );
                        assert_eq!(
                            calls,
                            [0, normalised],
                            "{case}: [sums, normalisation] kernel calls"
                        );
                        let worst = got
                            .iter()
                            .zip(&want)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0f32, f32::max);
                        assert!(worst < 1e-4, "{case}: off by {worst}");
                        assert_eq!(last, Some(true), "{case}: output channels-last?");
                    }
                }
            }
        }
    }

    /// The running statistics' update on CubeCL matches the CPU's (Burn's ops there), on
    /// the autodiff backend as the model calls it: by one kernel with `one_pass`, fused or
    /// not, by Burn's ops with `reduce`. 300 channels: two cubes.
    #[test]
    fn wgpu_running_statistics_match_the_cpu() {
        fn update<B: NormBackend>(data: &[TensorData; 4], m: usize) -> Vec<Vec<f32>> {
            let v = |i: usize| Tensor::<B, 1>::from_data(data[i].clone(), &Default::default());
            let (mean, var) = batch_norm_running((v(0), v(1)), (v(2), v(3)), m, 0.1);
            let values = |t: Tensor<B, 1>| t.into_data().to_vec::<f32>().unwrap();
            vec![values(mean), values(var)]
        }
        let random = |d| Tensor::<Flex, 1>::random([300], d, &Default::default()).into_data();
        let data = [
            random(Distribution::Normal(0.5, 1.0)),
            random(Distribution::Uniform(0.5, 2.0)),
            random(Distribution::Normal(0.5, 1.0)),
            random(Distribution::Uniform(0.5, 2.0)),
        ];
        for m in [1, 2, 4096] {
            let want = update::<Flex>(&data, m);
            for one_pass in [true, false] {
                let plain = on_this_thread(one_pass, || update::<Autodiff<Plain>>(&data, m));
                let fused = on_this_thread(one_pass, || {
                    update::<Autodiff<burn::backend::Wgpu>>(&data, m)
                });
                for (backend, (got, calls)) in [("plain", plain), ("fused", fused)] {
                    let case = format!("{backend}, m {m}, one_pass {one_pass}");
                    let kernel = usize::from(one_pass);
                    assert_eq!(
                        calls,
                        [0, kernel],
                        "{case}: [sums, normalisation] kernel calls"
                    );
                    for (name, (got, want)) in
                        ["mean", "variance"].iter().zip(got.iter().zip(&want))
                    {
                        for (i, (a, b)) in got.iter().zip(want).enumerate() {
                            let tol = 4.0 * f32::EPSILON * b.abs().max(1.0);
                            assert!(
                                (a - b).abs() <= tol,
                                "{case}: running {name}[{i}]: {a} against {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The batch norm on CubeCL leaves its output, its input gradient and the residual's
    /// gradient channels-last, whatever the input's layout: the next convolution and the
    /// previous one take them without a copy. Checked on both input layouts, with the
    /// epilogue and without, fused and not. (The `[n, c, h·w]` form wrote all three
    /// `[n, c, h, w]`-contiguous.)
    #[test]
    fn wgpu_batch_norm_leaves_its_results_channels_last() {
        for channels_last_input in [true, false] {
            for act in [true, false] {
                let want = [true, true, act];
                let case = format!("input channels-last {channels_last_input}, epilogue {act}");
                let fused = layouts::<burn::backend::Wgpu>([2, 8, 4, 4], channels_last_input, act);
                assert_eq!(fused, want, "fused, {case}: [output, dx, d residual]");
                let plain = layouts::<Plain>([2, 8, 4, 4], channels_last_input, act);
                assert_eq!(plain, want, "plain, {case}: [output, dx, d residual]");
            }
        }
    }

    /// The batch norm on WebGPU (lavapipe) against the CPU: see
    /// [`super::cube_checks::matches_the_cpu`].
    #[test]
    fn wgpu_batch_norm_matches_the_cpu_fused_or_not() {
        super::cube_checks::matches_the_cpu::<burn::backend::Wgpu, Plain>();
    }
}
