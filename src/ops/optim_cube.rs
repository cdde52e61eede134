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
//! The arithmetic is `optim::element`'s and `optim::adamw_element`'s, Burn's ops in
//! Burn's order, each rounded to `f32`; a GPU may contract a product and a sum into one
//! rounding, so the tests compare it with the composed ops to a few ulps, not to the bit.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::CubeCountSelection;

use super::optim::{AdamWScalars, SgdScalars};

/// Units in a cube.
const UNITS: u32 = 256;

/// `p_out = p − lr·step` and, with momentum, `v_out = v` updated, for element `i < len`
/// of contiguous tensors of one shape: `g ← p·decay + g` (`has_decay`); `v ← g` on the
/// `first` step, else `g·keep + v·momentum`; `step = v·momentum + g` (`nesterov`) or `v`,
/// or `g` without momentum.
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
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let pi = p[i];
    let mut gi = g[i];
    if comptime![has_decay] {
        gi = pi * F::cast_from(decay) + gi;
    }
    let mut step = gi;
    if comptime![has_momentum] {
        let mut vi = gi;
        if comptime![!first] {
            vi = gi * F::cast_from(keep) + v[i] * F::cast_from(momentum);
        }
        v_out[i] = vi;
        step = vi;
        if comptime![nesterov] {
            step = vi * F::cast_from(momentum) + gi;
        }
    }
    p_out[i] = pi - step * F::cast_from(lr);
}

/// One SGD step of `param` from `grad` (and `velocity`, the step before's, with momentum):
/// the new parameter and velocity, or `None` where the kernel does not apply (a tensor not
/// `f32`, not contiguous, or of another shape than the parameter; momentum off with a
/// velocity kept), for the caller to compose Burn's ops instead.
pub fn sgd_step<R: CubeRuntime>(
    param: &CubeTensor<R>,
    grad: &CubeTensor<R>,
    velocity: Option<&CubeTensor<R>>,
    s: SgdScalars,
) -> Option<(CubeTensor<R>, Option<CubeTensor<R>>)> {
    let fits = |t: &CubeTensor<R>| {
        t.dtype == DType::F32 && t.shape() == param.shape() && t.is_contiguous()
    };
    if !(fits(param) && fits(grad) && velocity.is_none_or(fits))
        || (s.momentum.is_none() && velocity.is_some())
    {
        return None;
    }
    let len = param.shape().num_elements();
    let empty = || {
        empty_device_contiguous_dtype(
            param.client.clone(),
            param.device.clone(),
            param.shape(),
            DType::F32,
        )
    };
    let p_out = empty();
    let v_out = s.momentum.map(|_| empty());
    // Read only with momentum after the first step; otherwise any tensor will do.
    let v_in = velocity.unwrap_or(grad).clone();
    let v_arg = v_out.clone().unwrap_or_else(|| p_out.clone());
    let count = CubeCountSelection::new(&param.client, (len as u32).div_ceil(UNITS)).cube_count();
    // Safety: a unit with `i < len` reads element `i` of `param`, `grad` and the velocity
    // and writes element `i` of the outputs, all contiguous `f32` tensors of `len`
    // elements (checked above); the others return at once. Without momentum nothing is
    // written through `v_arg`.
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
        );
    }
    Some((p_out, v_out))
}

/// AdamW's step for element `i < len` of contiguous tensors of one shape: the moments
/// `m ← β₁·m + (1−β₁)·g`, `v ← β₂·v + (1−β₂)·g²` (from `(1−β₁)·g` and `(1−β₂)·g²` on
/// the `first` step), and `p ← keep·p − lr·(m/c₁)/(√(v/c₂) + ε)` (`p` unscaled without
/// `has_keep`).
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
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let gi = g[i];
    let g2 = gi * gi;
    let mut mi = gi * F::cast_from(s.factor_1);
    let mut vi = g2 * F::cast_from(s.factor_2);
    if comptime![!first] {
        mi = m[i] * F::cast_from(s.beta_1) + mi;
        vi = v[i] * F::cast_from(s.beta_2) + vi;
    }
    m_out[i] = mi;
    v_out[i] = vi;
    let m_hat = mi / F::cast_from(s.correction_1);
    let v_hat = vi / F::cast_from(s.correction_2);
    let delta = m_hat / (F::sqrt(v_hat) + F::cast_from(s.epsilon));
    let mut pi = p[i];
    if comptime![has_keep] {
        pi = pi * F::cast_from(s.keep);
    }
    p_out[i] = pi - delta * F::cast_from(s.lr);
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
/// first): the new parameter and moments, or `None` where the kernel does not apply (a
/// tensor not `f32`, not contiguous, or of another shape than the parameter), for the
/// caller to compose Burn's ops instead.
pub fn adamw_step<R: CubeRuntime>(
    param: &CubeTensor<R>,
    grad: &CubeTensor<R>,
    moments: Option<(&CubeTensor<R>, &CubeTensor<R>)>,
    s: AdamWScalars,
) -> Option<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    let fits = |t: &CubeTensor<R>| {
        t.dtype == DType::F32 && t.shape() == param.shape() && t.is_contiguous()
    };
    if !(fits(param) && fits(grad) && moments.is_none_or(|(m, v)| fits(m) && fits(v))) {
        return None;
    }
    let len = param.shape().num_elements();
    let empty = || {
        empty_device_contiguous_dtype(
            param.client.clone(),
            param.device.clone(),
            param.shape(),
            DType::F32,
        )
    };
    let (p_out, m_out, v_out) = (empty(), empty(), empty());
    // Read only after the first step; otherwise any tensor will do.
    let (m_in, v_in) = moments.unwrap_or((grad, grad));
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
    // Safety: a unit with `i < len` reads element `i` of `param`, `grad` and the moments
    // and writes element `i` of the three outputs, all contiguous `f32` tensors of `len`
    // elements (checked above); the others return at once.
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
        );
    }
    Some((p_out, m_out, v_out))
}
