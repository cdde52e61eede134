//! The element-wise passes of a training batch norm on CubeCL's backends (CUDA, fused or
//! not; WebGPU in the tests), each one kernel of the runner's own where
//! `backend.norm_sums = "one_pass"`:
//! forward, `relu?((x − mean)·γ/√(var + eps) + β + residual?)`; backward, the input
//! gradient `dx = γ·invstd/m · (m·dy − dβ − x̂·dγ)` from the ReLU-masked `dy`, and that
//! masked `dy` as the residual's gradient. Evaluation takes the forward kernel with the
//! running statistics.
//!
//! Why: composed from Burn's ops ([`super::norm`]), the forward pass is about nine
//! launches (centre, the scale's `+ eps`, square root, reciprocal and product, scale,
//! shift, the residual's add, the ReLU) and the backward about fourteen (the ReLU's mask
//! and its comparison, the scale again, `x̂`, `k`, and the four terms of `dx`), each a pass
//! over the activation (or a `[c]` vector) into a new buffer. ResNet-50 holds 53 batch
//! norms: about 1,200 of the 2,390 launches of an unfused step on the stand-in driver
//! (BENCHMARKS.md, "The host side of a warm step"). With fusion on, Burn joins most of
//! them, but leaves the forward's `x − mean` and the `[c]` scale op by op after the
//! convolution's and the sums' custom operations: four launches a batch norm, one of them
//! a full pass. There each kernel here is a custom operation of fusion's stream
//! ([`super::norm_cube`]).
//!
//! The activation is the channels-last `[rows, c]` matrix (`rows = n·h·w`) that the sums
//! take ([`super::norm_cube`]), read through its strides; the outputs are new contiguous
//! `[rows, c]` tensors, channels-last as `[n, c, h, w]`, as the composed form leaves them.
//! The arithmetic is the composed ops' in their order, each rounded to `f32`; a GPU may
//! contract a product and a sum into one rounding, so the tests compare with the CPU to a
//! tolerance, not to the bit.

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::CubeCountSelection;

/// Units in a cube.
const UNITS: u32 = 256;

/// Element `i` of a `[rows, cols]` matrix `t` (row-major count), through its strides.
#[cube]
fn at2<F: Float>(t: &Tensor<F>, row: usize, col: usize) -> usize {
    row * t.stride(0) + col * t.stride(1)
}

/// Element `c` of a `[cols]` vector `t`, through its stride.
#[cube]
fn at1<F: Float>(t: &Tensor<F>, c: usize) -> usize {
    c * t.stride(0)
}

/// `out[i] = relu?((x − mean)·(γ·(1/√(var + eps))) + β + residual?)` for element `i <
/// len` of `[rows, cols]` (`out` contiguous), per-channel values by column.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn normalise_kernel<F: Float>(
    x: &Tensor<F>,
    mean: &Tensor<F>,
    var: &Tensor<F>,
    gamma: &Tensor<F>,
    beta: &Tensor<F>,
    residual: &Tensor<F>,
    out: &mut Tensor<F>,
    cols: usize,
    len: usize,
    eps: f32,
    #[comptime] has_residual: bool,
    #[comptime] relu: bool,
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let (row, col) = (i / cols, i % cols);
    let invstd = F::new(1.0) / F::sqrt(var[at1::<F>(var, col)] + F::cast_from(eps));
    let scale = gamma[at1::<F>(gamma, col)] * invstd;
    let centred = x[at2::<F>(x, row, col)] - mean[at1::<F>(mean, col)];
    let mut y = centred * scale + beta[at1::<F>(beta, col)];
    if comptime![has_residual] {
        y += residual[at2::<F>(residual, row, col)];
    }
    if comptime![relu] {
        if y <= F::new(0.0) {
            y = F::new(0.0);
        }
    }
    out[i] = y;
}

/// For element `i < len` of `[rows, cols]` (`dx` and `d_residual` contiguous): `g = dy`,
/// 0 where the ReLU's output is not positive (`relu`); `d_residual[i] = g`
/// (`has_residual`); `dx[i] = (γ·invstd/m)·((g·m − dβ) − x̂·dγ)`, `x̂ = (x − mean)·invstd`,
/// `invstd = 1/√(var + eps)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn normalise_backward_kernel<F: Float>(
    dy: &Tensor<F>,
    x: &Tensor<F>,
    relu_output: &Tensor<F>,
    mean: &Tensor<F>,
    var: &Tensor<F>,
    gamma: &Tensor<F>,
    d_beta: &Tensor<F>,
    d_gamma: &Tensor<F>,
    dx: &mut Tensor<F>,
    d_residual: &mut Tensor<F>,
    cols: usize,
    len: usize,
    m: f32,
    eps: f32,
    #[comptime] relu: bool,
    #[comptime] has_residual: bool,
) {
    let i = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= len {
        terminate!();
    }
    let (row, col) = (i / cols, i % cols);
    let mut g = dy[at2::<F>(dy, row, col)];
    if comptime![relu] {
        if relu_output[at2::<F>(relu_output, row, col)] <= F::new(0.0) {
            g = F::new(0.0);
        }
    }
    if comptime![has_residual] {
        d_residual[i] = g;
    }
    let invstd = F::new(1.0) / F::sqrt(var[at1::<F>(var, col)] + F::cast_from(eps));
    let x_hat = (x[at2::<F>(x, row, col)] - mean[at1::<F>(mean, col)]) * invstd;
    let m = F::cast_from(m);
    let k = gamma[at1::<F>(gamma, col)] * invstd / m;
    let sum_dy = d_beta[at1::<F>(d_beta, col)];
    let sum_dy_x_hat = d_gamma[at1::<F>(d_gamma, col)];
    dx[i] = k * ((g * m - sum_dy) - x_hat * sum_dy_x_hat);
}

/// Whether `t` is an `f32` matrix of `shape`, or an `f32` vector of `cols` values. On
/// any tensor's metadata: the fused backend checks its operands when it queues a kernel
/// ([`super::norm_cube`]), and the kernel then takes them.
fn is_matrix<T: TensorMetadata>(t: &T, shape: &Shape) -> bool {
    t.dtype() == DType::F32 && &t.shape() == shape
}

fn is_vector<T: TensorMetadata>(t: &T, cols: usize) -> bool {
    // The rank first: `dims::<1>()` would panic on a rank-0 shape.
    t.dtype() == DType::F32 && t.shape().num_dims() == 1 && t.shape().dims::<1>() == [cols]
}

/// Whether [`normalise`] takes these operands: `x` an `f32` `[rows, c]` matrix, the
/// residual one of its shape, `mean`, `var`, `gamma`, `beta` `f32` `[c]` vectors.
pub fn normalise_takes<T: TensorMetadata>(x: &T, vectors: [&T; 4], residual: Option<&T>) -> bool {
    let shape = x.shape();
    shape.num_dims() == 2
        && is_matrix(x, &shape)
        && residual.is_none_or(|r| is_matrix(r, &shape))
        && vectors.iter().all(|t| is_vector(*t, shape[1]))
}

/// Whether [`normalise_backward`] takes these operands: `dy`, `x` and the ReLU's output
/// `f32` `[rows, c]` matrices, `mean`, `var`, `gamma`, `dβ`, `dγ` `f32` `[c]` vectors.
pub fn normalise_backward_takes<T: TensorMetadata>(
    dy: &T,
    x: &T,
    vectors: [&T; 5],
    relu_output: Option<&T>,
) -> bool {
    let shape = dy.shape();
    shape.num_dims() == 2
        && is_matrix(dy, &shape)
        && is_matrix(x, &shape)
        && relu_output.is_none_or(|o| is_matrix(o, &shape))
        && vectors.iter().all(|t| is_vector(*t, shape[1]))
}

/// Whether [`running`] takes these operands: four `f32` vectors of one length.
pub fn running_takes<T: TensorMetadata>(vectors: [&T; 4]) -> bool {
    let shape = vectors[0].shape();
    shape.num_dims() == 1 && vectors.iter().all(|t| is_vector(*t, shape.num_elements()))
}

/// A new contiguous `f32` tensor of `shape` on `like`'s device.
fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, DType::F32)
}

/// The cubes that cover `len` units.
fn cubes<R: CubeRuntime>(like: &CubeTensor<R>, len: usize) -> CubeCount {
    CubeCountSelection::new(&like.client, (len as u32).div_ceil(UNITS)).cube_count()
}

/// `relu?((x − mean)·γ/√(var + eps) + β + residual?)` of `x` (`[rows, c]`, any strides;
/// the residual of its shape), per-channel values `[c]`: a new contiguous `[rows, c]`
/// tensor; `None` where an operand is not `f32` of its shape, for the caller to compose
/// Burn's ops.
pub fn normalise<R: CubeRuntime>(
    x: &CubeTensor<R>,
    (mean, var): (&CubeTensor<R>, &CubeTensor<R>),
    (gamma, beta): (&CubeTensor<R>, &CubeTensor<R>),
    eps: f32,
    residual: Option<&CubeTensor<R>>,
    relu: bool,
) -> Option<CubeTensor<R>> {
    if !normalise_takes(x, [mean, var, gamma, beta], residual) {
        return None;
    }
    let shape = x.shape();
    let (cols, len) = (shape[1], shape.num_elements());
    let out = empty(x, shape);
    if len == 0 {
        return Some(out);
    }
    // Read only with a residual; otherwise any `[rows, c]` tensor will do.
    let residual_arg = residual.unwrap_or(x).clone();
    // Safety: a unit with `i < len` reads element (`i / cols`, `i % cols`) of `x` and of
    // the residual (`[rows, cols]`, checked above) through their strides, element
    // `i % cols` of the four `[cols]` vectors, and writes `out[i]`, a contiguous tensor
    // of `len` elements; the others return at once.
    unsafe {
        normalise_kernel::launch_unchecked::<f32, R>(
            &x.client,
            cubes(x, len),
            CubeDim::new_1d(UNITS),
            x.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            gamma.clone().into_tensor_arg(),
            beta.clone().into_tensor_arg(),
            residual_arg.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            cols,
            len,
            eps,
            residual.is_some(),
            relu,
        );
    }
    Some(out)
}

/// The batch norm's input gradient from the output gradient `dy` and `x` (`[rows, c]`,
/// any strides), the forward's `mean` and `var`, `gamma` and the sums `dβ`, `dγ` (`[c]`,
/// `dγ = Σ dy·x̂`), `dy` masked where the ReLU's output (`[rows, c]`) is not positive:
/// `dx` and, where the forward added a `residual`, that masked `dy` (new contiguous
/// `[rows, c]` tensors); `None` where an operand is not `f32` of its shape.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn normalise_backward<R: CubeRuntime>(
    dy: &CubeTensor<R>,
    x: &CubeTensor<R>,
    (mean, var): (&CubeTensor<R>, &CubeTensor<R>),
    gamma: &CubeTensor<R>,
    (d_beta, d_gamma): (&CubeTensor<R>, &CubeTensor<R>),
    eps: f32,
    relu_output: Option<&CubeTensor<R>>,
    residual: bool,
) -> Option<(CubeTensor<R>, Option<CubeTensor<R>>)> {
    if !normalise_backward_takes(dy, x, [mean, var, gamma, d_beta, d_gamma], relu_output) {
        return None;
    }
    let shape = dy.shape();
    let (rows, cols, len) = (shape[0], shape[1], shape.num_elements());
    let dx = empty(dy, shape.clone());
    let d_residual = residual.then(|| empty(dy, shape));
    if len == 0 {
        return Some((dx, d_residual));
    }
    // Read only with a ReLU, written only with a residual; otherwise any will do.
    let output_arg = relu_output.unwrap_or(dy).clone();
    let d_residual_arg = d_residual.clone().unwrap_or_else(|| dx.clone());
    // Safety: a unit with `i < len` reads element (`i / cols`, `i % cols`) of `dy`, `x`
    // and the ReLU's output (`[rows, cols]`, checked above) through their strides,
    // element `i % cols` of the five `[cols]` vectors, and writes element `i` of `dx` and
    // of the residual's gradient, contiguous tensors of `len` elements (nothing through
    // `d_residual_arg` without a residual); the others return at once.
    unsafe {
        normalise_backward_kernel::launch_unchecked::<f32, R>(
            &dy.client,
            cubes(dy, len),
            CubeDim::new_1d(UNITS),
            dy.clone().into_tensor_arg(),
            x.clone().into_tensor_arg(),
            output_arg.into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            d_residual_arg.into_tensor_arg(),
            cols,
            len,
            rows as f32,
            eps,
            relu_output.is_some(),
            residual,
        );
    }
    Some((dx, d_residual))
}

/// `mean_out[c] = mean·(1 − k) + batch_mean·k`, `var_out[c] = var·(1 − k) + (batch_var·ratio)·k`
/// for channel `c < cols` (outputs contiguous).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn running_kernel<F: Float>(
    mean: &Tensor<F>,
    var: &Tensor<F>,
    batch_mean: &Tensor<F>,
    batch_var: &Tensor<F>,
    mean_out: &mut Tensor<F>,
    var_out: &mut Tensor<F>,
    cols: usize,
    keep: f32,
    k: f32,
    ratio: f32,
) {
    let c = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if c >= cols {
        terminate!();
    }
    let (keep, k) = (F::cast_from(keep), F::cast_from(k));
    let unbiased = batch_var[at1::<F>(batch_var, c)] * F::cast_from(ratio);
    mean_out[c] = mean[at1::<F>(mean, c)] * keep + batch_mean[at1::<F>(batch_mean, c)] * k;
    var_out[c] = var[at1::<F>(var, c)] * keep + unbiased * k;
}

/// The running mean and variance after a batch of `m` values per channel, with `momentum`
/// (`norm::batch_norm_running`): new contiguous `[c]` tensors; `None` where an operand is
/// not an `f32` vector of the running mean's length.
pub fn running<R: CubeRuntime>(
    (mean, var): (&CubeTensor<R>, &CubeTensor<R>),
    (batch_mean, batch_var): (&CubeTensor<R>, &CubeTensor<R>),
    m: usize,
    momentum: f64,
) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
    if !running_takes([mean, var, batch_mean, batch_var]) {
        return None;
    }
    let shape = mean.shape();
    let cols = shape.num_elements();
    let (mean_out, var_out) = (empty(mean, shape.clone()), empty(mean, shape));
    if cols == 0 {
        return Some((mean_out, var_out));
    }
    // The composed form's scalars, rounded to `f32` as Burn's scalar ops round them.
    let m = m as f64;
    let ratio = (m / (m - 1.0).max(1.0)) as f32;
    let (keep, k) = ((1.0 - momentum) as f32, momentum as f32);
    // Safety: a unit with `c < cols` reads element `c` of the four `[cols]` vectors
    // (checked above) through their strides and writes element `c` of the two outputs,
    // contiguous `[cols]` tensors; the others return at once.
    unsafe {
        running_kernel::launch_unchecked::<f32, R>(
            &mean.client,
            cubes(mean, cols),
            CubeDim::new_1d(UNITS),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            batch_mean.clone().into_tensor_arg(),
            batch_var.clone().into_tensor_arg(),
            mean_out.clone().into_tensor_arg(),
            var_out.clone().into_tensor_arg(),
            cols,
            keep,
            k,
            ratio,
        );
    }
    Some((mean_out, var_out))
}
