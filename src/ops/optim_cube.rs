//! SGD's update on CubeCL's backends without fusion (CUDA with `backend.fusion` off, which
//! `"auto"` chooses below 4 CPUs; WebGPU in the tests): one kernel of the runner's own
//! per parameter, where Burn's ops take up to seven launches and as many passes over
//! memory (weight decay, momentum, Nesterov, the learning-rate scale, the subtraction),
//! each into a new buffer. ResNet-50 holds 161 parameter tensors: its unfused step went
//! from 3,352 launches to 2,712, and the host side of a warm step on 2 CPUs from 46 to
//! 21 ms (BENCHMARKS.md, "The host side of a warm step"). With fusion, Burn joins those
//! ops itself.
//!
//! The arithmetic is `optim::element`'s, Burn's ops in Burn's order, each rounded to
//! `f32`; a GPU may contract a product and a sum into one rounding, so the tests compare
//! it with the composed ops to a few ulps, not to the bit.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::CubeCountSelection;

use super::optim::SgdScalars;

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
