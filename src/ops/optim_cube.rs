//! SGD's and AdamW's updates on CubeCL's backends without fusion (CUDA with
//! `backend.fusion` off, which `"auto"` chooses below 4 CPUs; WebGPU in the tests): one
//! kernel of the runner's own per parameter, where Burn's ops take up to seven launches
//! for SGD (weight decay, momentum, Nesterov, the learning-rate scale, the subtraction)
//! and about fourteen for AdamW (both moments, the bias corrections, the square root,
//! the decay), each a pass over memory into a new buffer. ResNet-50 holds 161 parameter
//! tensors: its unfused step went from 3,352 launches to 2,712, and the host side of a
//! warm step on 2 CPUs from 46 to 21 ms (BENCHMARKS.md, "The host side of a warm step").
//! With fusion, Burn joins those ops itself.
//!
//! Each tensor is read through its strides where it is not contiguous, and the new
//! parameter and state are written in the parameter's layout: CubeCL allocates a weight
//! whose last axis is not a multiple of 4 with its rows padded (a 3×3 kernel's `[.., 3,
//! 3]` at strides `[.., 12, 4, 1]`, a classifier's `[2048, 10]` at `[16, 1]`), and returns
//! a convolution's weight gradient as a permutation of its channels-last result. Kernels
//! that took contiguous tensors only left 54 of ResNet-50's 161 parameters to Burn's
//! ops; and a parameter whose layout changed at its first update would change the
//! convolutions' autotune keys (which hold the weight's stride alignment) after the step
//! `runner warmup` tunes.
//!
//! The arithmetic is `optim::element`'s and `optim::adamw_element`'s, Burn's ops in
//! Burn's order, each rounded to `f32`; a GPU may contract a product and a sum into one
//! rounding, so the tests compare it with the composed ops to a few ulps, not to the bit.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::CubeCountSelection;
use cubecl::zspace::metadata::Metadata;

use super::optim::{AdamWScalars, SgdScalars};

/// Units in a cube.
const UNITS: u32 = 256;

/// Where element `i` of `t`, counted in row-major order of its shape, is in its buffer:
/// `i` itself where `strided` is false (contiguous), else through `t`'s strides.
#[cube]
fn at<F: Float>(t: &Tensor<F>, i: usize, #[comptime] strided: bool) -> usize {
    let mut at = i;
    if comptime![strided] {
        let rank = t.rank();
        let mut rest = i;
        at = 0;
        for k in 0..rank {
            let dim = rank - k - 1;
            let extent = t.shape(dim);
            at += (rest % extent) * t.stride(dim);
            rest /= extent;
        }
    }
    at
}

/// Which of a kernel's tensors are not contiguous, each read (and the outputs, in `p`'s
/// layout, written) through its strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Layouts {
    p: bool,
    g: bool,
    /// The velocity (SGD) or the first moment (AdamW).
    s1: bool,
    /// AdamW's second moment.
    s2: bool,
}

/// `p_out = p − lr·step` and, with momentum, `v_out = v` updated, for element `i < len`
/// of tensors of one shape (outputs in `p`'s layout): `g ← p·decay + g` (`has_decay`);
/// `v ← g` on the `first` step, else `g·keep + v·momentum`; `step = v·momentum + g`
/// (`nesterov`) or `v`, or `g` without momentum.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn sgd_kernel<F: Float>(
    p: &Tensor<F>,
    g: &Tensor<F>,
    v: &Tensor<F>,
    p_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    len: usize,
    decay: f32,
    keep: f32,
    momentum: f32,
    lr: f32,
    #[comptime] has_decay: bool,
    #[comptime] has_momentum: bool,
    #[comptime] first: bool,
    #[comptime] nesterov: bool,
    #[comptime] layouts: Layouts,
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let out = at::<F>(p, i, layouts.p);
    let pi = p[out];
    let mut gi = g[at::<F>(g, i, layouts.g)];
    if comptime![has_decay] {
        gi = pi * F::cast_from(decay) + gi;
    }
    let mut step = gi;
    if comptime![has_momentum] {
        let mut vi = gi;
        if comptime![!first] {
            vi = gi * F::cast_from(keep) + v[at::<F>(v, i, layouts.s1)] * F::cast_from(momentum);
        }
        v_out[out] = vi;
        step = vi;
        if comptime![nesterov] {
            step = vi * F::cast_from(momentum) + gi;
        }
    }
    p_out[out] = pi - step * F::cast_from(lr);
}

/// An `f32` tensor of `param`'s shape and layout, uninitialised (its padding never
/// written, as CubeCL's own padded allocations); `None` where two of the parameter's
/// elements share an address (a broadcast view), which an update cannot be written to.
fn like<R: CubeRuntime>(param: &CubeTensor<R>) -> Option<CubeTensor<R>> {
    let shape = param.shape();
    if param.is_contiguous() {
        return Some(empty_device_contiguous_dtype(
            param.client.clone(),
            param.device.clone(),
            shape,
            DType::F32,
        ));
    }
    let strides: Vec<usize> = param.meta.strides().iter().copied().collect();
    // Apart: each axis's stride at least the span of the axes of smaller strides.
    let mut axes: Vec<(usize, usize)> = strides
        .iter()
        .copied()
        .zip(shape.iter().copied())
        .filter(|&(_, n)| n > 1)
        .collect();
    axes.sort_unstable();
    let mut span = 1;
    for &(stride, n) in &axes {
        if stride < span {
            return None;
        }
        span = stride * n;
    }
    let elements = match shape.num_elements() {
        0 => 0,
        _ => {
            1 + axes
                .iter()
                .map(|&(stride, n)| (n - 1) * stride)
                .sum::<usize>()
        }
    };
    let handle = param.client.empty(elements.max(1) * DType::F32.size());
    Some(CubeTensor::new(
        param.client.clone(),
        handle,
        Metadata::new(shape, strides),
        param.device.clone(),
        DType::F32,
    ))
}

/// Whether `t` is an `f32` tensor of `param`'s shape (of any layout).
fn fits<R: CubeRuntime>(t: &CubeTensor<R>, param: &CubeTensor<R>) -> bool {
    t.dtype == DType::F32 && t.shape() == param.shape()
}

/// One SGD step of `param` from `grad` (and `velocity`, the step before's, with momentum):
/// the new parameter and velocity, in the parameter's layout, or `None` where the kernel
/// does not apply (a tensor not `f32` or of another shape than the parameter; a
/// parameter whose elements overlap; momentum off with a velocity kept), for the caller
/// to compose Burn's ops instead.
pub fn sgd_step<R: CubeRuntime>(
    param: &CubeTensor<R>,
    grad: &CubeTensor<R>,
    velocity: Option<&CubeTensor<R>>,
    s: SgdScalars,
) -> Option<(CubeTensor<R>, Option<CubeTensor<R>>)> {
    if !(fits(param, param) && fits(grad, param) && velocity.is_none_or(|v| fits(v, param)))
        || (s.momentum.is_none() && velocity.is_some())
    {
        return None;
    }
    let len = param.shape().num_elements();
    let p_out = like(param)?;
    let v_out = match s.momentum {
        Some(_) => Some(like(param)?),
        None => None,
    };
    // Read only with momentum after the first step; otherwise any tensor will do.
    let v_in = velocity.unwrap_or(grad).clone();
    let layouts = Layouts {
        p: !param.is_contiguous(),
        g: !grad.is_contiguous(),
        s1: !v_in.is_contiguous(),
        s2: false,
    };
    let v_arg = v_out.clone().unwrap_or_else(|| p_out.clone());
    let count = CubeCountSelection::new(&param.client, (len as u32).div_ceil(UNITS)).cube_count();
    // Safety: a unit with `i < len` reads the element of row-major index `i` of `param`,
    // `grad` and the velocity, each through its own strides where it is not contiguous,
    // and writes that element of the outputs, made in `param`'s layout (whose elements
    // do not overlap: checked by `like`), all `f32` tensors of `param`'s shape (checked
    // above); the others return at once. Without momentum nothing is written through
    // `v_arg`.
    unsafe {
        sgd_kernel::launch_unchecked::<f32, R>(
            &param.client,
            count,
            CubeDim::new_1d(UNITS),
            param.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            v_in.into_tensor_arg(),
            p_out.clone().into_tensor_arg(),
            v_arg.into_tensor_arg(),
            len,
            s.decay.unwrap_or(0.0),
            s.keep,
            s.momentum.unwrap_or(0.0),
            s.lr,
            s.decay.is_some(),
            s.momentum.is_some(),
            velocity.is_none(),
            s.nesterov,
            layouts,
        );
    }
    Some((p_out, v_out))
}

/// AdamW's step for element `i < len` of tensors of one shape (outputs in `p`'s layout):
/// the moments `m ← β₁·m + (1−β₁)·g`, `v ← β₂·v + (1−β₂)·g²` (from `(1−β₁)·g` and
/// `(1−β₂)·g²` on the `first` step), and `p ← keep·p − lr·(m/c₁)/(√(v/c₂) + ε)` (`p`
/// unscaled without `has_keep`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel<F: Float>(
    p: &Tensor<F>,
    g: &Tensor<F>,
    m: &Tensor<F>,
    v: &Tensor<F>,
    p_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    len: usize,
    s: AdamWArgs,
    #[comptime] first: bool,
    #[comptime] has_keep: bool,
    #[comptime] layouts: Layouts,
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let out = at::<F>(p, i, layouts.p);
    let gi = g[at::<F>(g, i, layouts.g)];
    let g2 = gi * gi;
    let mut mi = gi * F::cast_from(s.factor_1);
    let mut vi = g2 * F::cast_from(s.factor_2);
    if comptime![!first] {
        mi = m[at::<F>(m, i, layouts.s1)] * F::cast_from(s.beta_1) + mi;
        vi = v[at::<F>(v, i, layouts.s2)] * F::cast_from(s.beta_2) + vi;
    }
    m_out[out] = mi;
    v_out[out] = vi;
    let m_hat = mi / F::cast_from(s.correction_1);
    let v_hat = vi / F::cast_from(s.correction_2);
    let delta = m_hat / (F::sqrt(v_hat) + F::cast_from(s.epsilon));
    let mut pi = p[out];
    if comptime![has_keep] {
        pi *= F::cast_from(s.keep);
    }
    p_out[out] = pi - delta * F::cast_from(s.lr);
}

/// [`AdamWScalars`] as a kernel argument (`keep` 1 where the parameter is not scaled).
#[derive(CubeType, CubeLaunch, Clone, Copy)]
struct AdamWArgs {
    lr: f32,
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    keep: f32,
}

/// One AdamW step of `param` from `grad` and `moments` (the step before's; `None` on the
/// first): the new parameter and moments, in the parameter's layout, or `None` where the
/// kernel does not apply (a tensor not `f32` or of another shape than the parameter; a
/// parameter whose elements overlap), for the caller to compose Burn's ops instead.
pub fn adamw_step<R: CubeRuntime>(
    param: &CubeTensor<R>,
    grad: &CubeTensor<R>,
    moments: Option<(&CubeTensor<R>, &CubeTensor<R>)>,
    s: AdamWScalars,
) -> Option<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    let moments_fit = moments.is_none_or(|(m, v)| fits(m, param) && fits(v, param));
    if !(fits(param, param) && fits(grad, param) && moments_fit) {
        return None;
    }
    let len = param.shape().num_elements();
    let (p_out, m_out, v_out) = (like(param)?, like(param)?, like(param)?);
    // Read only after the first step; otherwise any tensor will do.
    let (m_in, v_in) = moments.unwrap_or((grad, grad));
    let layouts = Layouts {
        p: !param.is_contiguous(),
        g: !grad.is_contiguous(),
        s1: !m_in.is_contiguous(),
        s2: !v_in.is_contiguous(),
    };
    let count = CubeCountSelection::new(&param.client, (len as u32).div_ceil(UNITS)).cube_count();
    let args = AdamWArgsLaunch::new(
        s.lr,
        s.beta_1,
        s.beta_2,
        s.factor_1,
        s.factor_2,
        s.correction_1,
        s.correction_2,
        s.epsilon,
        s.keep.unwrap_or(1.0),
    );
    // Safety: a unit with `i < len` reads the element of row-major index `i` of `param`,
    // `grad` and the moments, each through its own strides where it is not contiguous,
    // and writes that element of the three outputs, made in `param`'s layout (whose
    // elements do not overlap: checked by `like`), all `f32` tensors of `param`'s shape
    // (checked above); the others return at once.
    unsafe {
        adamw_kernel::launch_unchecked::<f32, R>(
            &param.client,
            count,
            CubeDim::new_1d(UNITS),
            param.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            m_in.clone().into_tensor_arg(),
            v_in.clone().into_tensor_arg(),
            p_out.clone().into_tensor_arg(),
            m_out.clone().into_tensor_arg(),
            v_out.clone().into_tensor_arg(),
            len,
            args,
            moments.is_none(),
            s.keep.is_some(),
            layouts,
        );
    }
    Some((p_out, m_out, v_out))
}
