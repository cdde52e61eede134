//! `backend.norm_sums = "one_pass"` on CubeCL's backends (CUDA; WebGPU in the tests): the
//! per-channel sums a training batch norm needs, by a kernel of the runner's own, in one
//! pass over the activation each way. (The normalisation itself is
//! [`super::norm_apply_cube`]'s; on the fused backend all of them are custom operations.)
//!
//! Why: composed from Burn's ops ([`super::norm`]), the forward pass sums the activation
//! (the mean), then the squares of its deviations (the variance): two reductions, each a
//! pass over the activation; the backward pass sums the output gradient (`dβ`) and its
//! product with the normalised input (`dγ`): two more. Each Burn reduction over a
//! channels-last `[n, h·w, c]` activation is two launches (over `h·w`, then over `n`), and
//! its kernel gives each output one unit that loops over the reduced axis. ResNet-50 has
//! 53 batch norms: on the H200 the reductions were 427 launches a step (BENCHMARKS.md,
//! "GPU (CUDA)"). Here each pass's two sums are one kernel that reads its operands once,
//! then one small launch that adds the partial sums and finishes the statistics (the mean
//! and variance; `dβ` and `dγ`) into two `[c]` tensors: 2 launches where Burn's are 4 and
//! the element-wise ops that finish, and one read of the activation where Burn's are two.
//!
//! The kernel works on `[rows, c]` matrices (`rows = n·h·w`, the channels-last view the
//! batch norm already uses, [`super::norm`]'s `Layout::Last`), through their strides. A
//! cube is 32 channels by 8 lanes; it sums a chunk of rows, each lane every eighth row,
//! then adds its lanes in shared memory and writes one partial row. The cubes tile the
//! channels and the chunks, about [`TARGET_CUBES`] of them; a second launch of the same
//! kernel adds the partial rows and finishes (the first does, where the rows fit one
//! chunk). The forward pass sums `x − x₀` and its square, `x₀`
//! being the channel's first value (a shift, so that the variance `E[(x−x₀)²] −
//! E[x−x₀]²` does not lose the digits a large mean would take); the backward pass sums
//! `dy` and `dy·(x − mean)`, `dy` masked where the forward's ReLU output is 0.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::Fusion;
use burn_ir::OperationOutput;
use cubecl::prelude::*;

use super::queued::queue;

use crate::plan::KernelPlan;
use crate::recipe::NormSums;

/// The float32 backends the runner builds on a CubeCL runtime.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// The two statistics of a pass.
type Two<T> = (T, T);

/// What [`channel_sums_kernel`] sums: the partial rows `[chunks, 2c]` of a first launch,
/// column `c'` and column `c + c'` for channel `c'`.
const PAIRS: u32 = 0;
/// `x − x₀` and `(x − x₀)²`.
const STATS: u32 = 1;
/// `dy` and `dy·(x − mean)`.
const GRADS: u32 = 2;
/// As [`GRADS`], `dy` masked where the ReLU's output is not positive.
const GRADS_RELU: u32 = 3;

/// Channels a cube takes (its units along x) and lanes it sums them in (along y).
const COLS: usize = 32;
const LANES: usize = 8;
/// About how many cubes the first launch is spread over: 512 × 256 units, a few per
/// multiprocessor on a large GPU.
const TARGET_CUBES: usize = 512;
/// Fewest rows a lane sums, most chunks one launch leaves (the second adds them), and
/// most rows one chunk takes alone.
const MIN_LANE_ROWS: usize = 32;
const MAX_CHUNKS: usize = 512;

static ONE_PASS: AtomicBool = AtomicBool::new(true);

thread_local! {
    /// A test's own choice on its thread (tests run side by side in one process).
    static ONE_PASS_HERE: Cell<Option<bool>> = const { Cell::new(None) };
    /// Sums this thread gave the kernel (ran at once on the plain backend, queued on the
    /// fused one, which runs it when it executes the stream): the tests' proof.
    #[cfg(test)]
    static RAN: Cell<usize> = const { Cell::new(0) };
    /// Normalisations (forward or backward) this thread gave
    /// [`super::norm_apply_cube`]'s kernels.
    #[cfg(test)]
    static APPLIED: Cell<usize> = const { Cell::new(0) };
}

/// Takes `backend.norm_sums` of the run that queues batch norms now.
pub fn set(kernels: &KernelPlan) {
    ONE_PASS.store(kernels.norm_sums == NormSums::OnePass, Ordering::Relaxed);
}

/// Whether the batch norm's sums go through [`channel_sums`] (`one_pass`).
fn one_pass() -> bool {
    ONE_PASS_HERE
        .with(Cell::get)
        .unwrap_or_else(|| ONE_PASS.load(Ordering::Relaxed))
}

/// Runs `f` with `norm_sums` as `one_pass` says, on this thread only; with the number of
/// times the sums kernel ran meanwhile, and the normalisation kernels.
#[cfg(test)]
pub(crate) fn on_this_thread<T>(one_pass: bool, f: impl FnOnce() -> T) -> (T, [usize; 2]) {
    let before = [RAN.with(Cell::get), APPLIED.with(Cell::get)];
    ONE_PASS_HERE.with(|c| c.set(Some(one_pass)));
    let out = f();
    ONE_PASS_HERE.with(|c| c.set(None));
    let after = [RAN.with(Cell::get), APPLIED.with(Cell::get)];
    (out, [after[0] - before[0], after[1] - before[1]])
}

/// Whether the normalisation kernels run (`one_pass`), given that they took the operands
/// (`Some`); counted where they do.
fn normalised<T>(run: impl FnOnce() -> Option<T>) -> Option<T> {
    let out = one_pass().then(run).flatten();
    #[cfg(test)]
    if out.is_some() {
        APPLIED.with(|r| r.set(r.get() + 1));
    }
    out
}

/// Whether the kernel takes a `[rows, c]` operand of this shape and type (counted where
/// it does).
fn applies(shape: &Shape, dtype: DType) -> bool {
    let yes = one_pass() && shape.num_dims() == 2 && dtype == DType::F32;
    #[cfg(test)]
    if yes {
        RAN.with(|r| r.set(r.get() + 1));
    }
    yes
}

/// The batch norm's kernels on a backend (see `norm::OwnKernels`): its per-channel
/// statistics, its normalisation each way and its running statistics; each `None` where
/// `norm_sums` is `reduce` or the kernel does not take the operands, and Burn's ops take
/// them. On the fused backend each is a custom operation, queued with the stream.
pub trait NormKernels: Backend {
    /// `x` (`[rows, c]`) → its mean and biased variance per channel (`[c]` each).
    fn stats_sums(x: FloatTensor<Self>) -> Option<(FloatTensor<Self>, FloatTensor<Self>)>;
    /// `dy`, `x` (`[rows, c]`), `mean`, `var` (`[c]`), the ReLU's output (`[rows, c]`) →
    /// `dβ = Σ dy` and `dγ = Σ dy·(x − mean) / √(var + eps)` (`[c]` each), `dy` masked
    /// where that output is not positive.
    #[allow(clippy::type_complexity)]
    fn grad_sums(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        relu_output: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)>;

    /// `relu?((x − mean)·γ/√(var + eps) + β + residual?)` of `x` (`[rows, c]`) by
    /// [`super::norm_apply_cube::normalise`]: a contiguous `[rows, c]` tensor.
    #[allow(clippy::type_complexity)]
    fn normalise(
        x: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        affine: (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        residual: Option<FloatTensor<Self>>,
        relu: bool,
    ) -> Option<FloatTensor<Self>>;

    /// The input gradient (and the residual's, where `residual`) by
    /// [`super::norm_apply_cube::normalise_backward`], from `dy` and `x` (`[rows, c]`),
    /// the statistics, `gamma`, the sums `dβ` and `dγ`, and the ReLU's output.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn normalise_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        stats: (FloatTensor<Self>, FloatTensor<Self>),
        gamma: FloatTensor<Self>,
        sums: (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        relu_output: Option<FloatTensor<Self>>,
        residual: bool,
    ) -> Option<(FloatTensor<Self>, Option<FloatTensor<Self>>)>;

    /// The running mean and variance after a batch (see `norm::batch_norm_running`) by
    /// [`super::norm_apply_cube::running`].
    #[allow(clippy::type_complexity)]
    fn running_stats(
        running: (FloatTensor<Self>, FloatTensor<Self>),
        batch: (FloatTensor<Self>, FloatTensor<Self>),
        m: usize,
        momentum: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)>;
}

impl<R: CubeRuntime, BT: BoolElement> NormKernels for Cube<R, BT> {
    fn stats_sums(x: FloatTensor<Self>) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        applies(&x.shape(), x.dtype).then(|| channel_sums(Sums::Stats { x }))
    }

    fn grad_sums(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        relu_output: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        applies(&dy.shape(), dy.dtype).then(|| {
            channel_sums(Sums::Grads {
                dy,
                x,
                mean,
                var,
                relu_output,
                eps: eps as f32,
            })
        })
    }

    fn normalise(
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        (gamma, beta): (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        residual: Option<FloatTensor<Self>>,
        relu: bool,
    ) -> Option<FloatTensor<Self>> {
        normalised(|| {
            let (stats, affine) = ((&mean, &var), (&gamma, &beta));
            let residual = residual.as_ref();
            super::norm_apply_cube::normalise(&x, stats, affine, eps as f32, residual, relu)
        })
    }

    fn normalise_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        gamma: FloatTensor<Self>,
        (d_beta, d_gamma): (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        relu_output: Option<FloatTensor<Self>>,
        residual: bool,
    ) -> Option<(FloatTensor<Self>, Option<FloatTensor<Self>>)> {
        normalised(|| {
            super::norm_apply_cube::normalise_backward(
                &dy,
                &x,
                (&mean, &var),
                &gamma,
                (&d_beta, &d_gamma),
                eps as f32,
                relu_output.as_ref(),
                residual,
            )
        })
    }

    fn running_stats(
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        (batch_mean, batch_var): (FloatTensor<Self>, FloatTensor<Self>),
        m: usize,
        momentum: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        normalised(|| {
            let (running, batch) = ((&mean, &var), (&batch_mean, &batch_var));
            super::norm_apply_cube::running(running, batch, m, momentum)
        })
    }
}

/// [`channel_sums`] queued on the fused backend as `name`: a custom operation, as the
/// fused convolution is (`conv_cube`); the element-wise work around it stays fusion's.
/// Inputs `[x]` forward, `[dy, x, mean, var]` and the ReLU's output backward; two `[c]`
/// outputs.
fn fused<R: CubeRuntime, BT: BoolElement>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<Cube<R, BT>>>>,
    eps: f32,
) -> Two<FloatTensor<Fusion<Cube<R, BT>>>> {
    let out = (Shape::new([inputs[0].shape[1]]), inputs[0].dtype);
    let run = move |t: Vec<CubeTensor<R>>| {
        let sums = match &t[..] {
            [x] => Sums::Stats { x: x.clone() },
            [dy, x, mean, var, rest @ ..] => Sums::Grads {
                dy: dy.clone(),
                x: x.clone(),
                mean: mean.clone(),
                var: var.clone(),
                relu_output: rest.first().cloned(),
                eps,
            },
            _ => return vec![],
        };
        let (first, second) = channel_sums(sums);
        vec![first, second]
    };
    let [first, second] = queue::<R, BT, _>(name, inputs, &[out.clone(), out], run).outputs();
    (first, second)
}

/// Which of [`super::norm_apply_cube`]'s kernels [`fused_apply`] runs, with its
/// settings.
#[derive(Debug, Clone, Copy)]
enum Apply {
    /// `normalise`: inputs `x`, `mean`, `var`, `gamma`, `beta` and the residual; one
    /// output.
    Forward { eps: f32, relu: bool },
    /// `normalise_backward`: inputs `dy`, `x`, `mean`, `var`, `gamma`, `dβ`, `dγ` and the
    /// ReLU's output; `dx`, and the residual's gradient where `residual`.
    Backward { eps: f32, residual: bool },
    /// `running`: inputs the running mean and variance, the batch's; two outputs.
    Running { m: usize, momentum: f64 },
}

/// A normalisation kernel queued on the fused backend as `name`, a custom operation as
/// the sums are ([`fused`]), on `inputs`, with `f32` outputs of these shapes. Fusion's
/// own kernels for the composed ops leave part of the forward op by op: the ops after a
/// custom operation (the convolution's, the sums') fall into an un-fused block,
/// `x − mean` over the whole activation and the scale's `+ eps`, square root and
/// reciprocal (four launches a batch norm, one a full pass; BENCHMARKS.md, "The host side
/// of a warm step"). The kernel is one launch and one pass each way. The operands' shapes
/// and types are checked before this is called (the `*_takes` functions the kernels check
/// with), so the kernel takes them.
fn fused_apply<R: CubeRuntime, BT: BoolElement>(
    name: &'static str,
    apply: Apply,
    inputs: Vec<FloatTensor<Fusion<Cube<R, BT>>>>,
    outputs: &[Shape],
) -> Vec<FloatTensor<Fusion<Cube<R, BT>>>> {
    use super::norm_apply_cube as kernels;
    const TAKEN: &str = "checked when queued";
    let run = move |t: Vec<CubeTensor<R>>| -> Vec<CubeTensor<R>> {
        let i = |k: usize| &t[k];
        match apply {
            Apply::Forward { eps, relu } => {
                let (stats, affine) = ((i(1), i(2)), (i(3), i(4)));
                let out = kernels::normalise(i(0), stats, affine, eps, t.get(5), relu);
                vec![out.expect(TAKEN)]
            }
            Apply::Backward { eps, residual } => {
                let (stats, sums, output) = ((i(2), i(3)), (i(5), i(6)), t.get(7));
                let out = kernels::normalise_backward(
                    i(0),
                    i(1),
                    stats,
                    i(4),
                    sums,
                    eps,
                    output,
                    residual,
                );
                let (dx, d_residual) = out.expect(TAKEN);
                std::iter::once(dx).chain(d_residual).collect()
            }
            Apply::Running { m, momentum } => {
                let out = kernels::running((i(0), i(1)), (i(2), i(3)), m, momentum);
                let (mean, var) = out.expect(TAKEN);
                vec![mean, var]
            }
        }
    };
    let outputs: Vec<(Shape, DType)> = outputs.iter().map(|s| (s.clone(), DType::F32)).collect();
    queue::<R, BT, _>(name, inputs, &outputs, run)
}

impl<R: CubeRuntime, BT: BoolElement> NormKernels for Fusion<Cube<R, BT>> {
    fn normalise(
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        (gamma, beta): (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        residual: Option<FloatTensor<Self>>,
        relu: bool,
    ) -> Option<FloatTensor<Self>> {
        use super::norm_apply_cube::normalise_takes;
        normalised(|| {
            let takes = normalise_takes(&x, [&mean, &var, &gamma, &beta], residual.as_ref());
            takes.then(|| {
                let shape = x.shape();
                let name = match (residual.is_some(), relu) {
                    (false, false) => "runner_normalise",
                    (false, true) => "runner_normalise_relu",
                    (true, false) => "runner_normalise_add",
                    (true, true) => "runner_normalise_add_relu",
                };
                let mut inputs = vec![x, mean, var, gamma, beta];
                inputs.extend(residual);
                let eps = eps as f32;
                let apply = Apply::Forward { eps, relu };
                let mut out = fused_apply::<R, BT>(name, apply, inputs, &[shape]);
                out.remove(0)
            })
        })
    }

    fn normalise_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        gamma: FloatTensor<Self>,
        (d_beta, d_gamma): (FloatTensor<Self>, FloatTensor<Self>),
        eps: f64,
        relu_output: Option<FloatTensor<Self>>,
        residual: bool,
    ) -> Option<(FloatTensor<Self>, Option<FloatTensor<Self>>)> {
        use super::norm_apply_cube::normalise_backward_takes;
        normalised(|| {
            let vectors = [&mean, &var, &gamma, &d_beta, &d_gamma];
            let takes = normalise_backward_takes(&dy, &x, vectors, relu_output.as_ref());
            takes.then(|| {
                let shape = dy.shape();
                let name = match (relu_output.is_some(), residual) {
                    (false, false) => "runner_normalise_backward",
                    (true, false) => "runner_normalise_backward_relu",
                    (false, true) => "runner_normalise_backward_add",
                    (true, true) => "runner_normalise_backward_add_relu",
                };
                let mut inputs = vec![dy, x, mean, var, gamma, d_beta, d_gamma];
                inputs.extend(relu_output);
                let shapes = vec![shape; 1 + usize::from(residual)];
                let apply = Apply::Backward {
                    eps: eps as f32,
                    residual,
                };
                let mut out = fused_apply::<R, BT>(name, apply, inputs, &shapes).into_iter();
                let dx = out.next()?;
                Some((dx, out.next()))
            })?
        })
    }

    fn running_stats(
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        (batch_mean, batch_var): (FloatTensor<Self>, FloatTensor<Self>),
        m: usize,
        momentum: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        use super::norm_apply_cube::running_takes;
        normalised(|| {
            running_takes([&mean, &var, &batch_mean, &batch_var]).then(|| {
                let shape = mean.shape();
                let inputs = vec![mean, var, batch_mean, batch_var];
                let apply = Apply::Running { m, momentum };
                let shapes = [shape.clone(), shape];
                let mut out =
                    fused_apply::<R, BT>("runner_norm_running", apply, inputs, &shapes).into_iter();
                Some((out.next()?, out.next()?))
            })?
        })
    }

    fn stats_sums(x: FloatTensor<Self>) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        applies(&x.shape, x.dtype)
            .then(|| fused::<R, BT>("runner_norm_stats_forward", vec![x], 0.0))
    }

    fn grad_sums(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        (mean, var): (FloatTensor<Self>, FloatTensor<Self>),
        relu_output: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        applies(&dy.shape, dy.dtype).then(|| {
            let mut inputs = vec![dy, x, mean, var];
            inputs.extend(relu_output);
            fused::<R, BT>("runner_norm_sums_backward", inputs, eps as f32)
        })
    }
}

/// The kernel: sums of `a` (and `b`, `mask`, `shift` as `mode` says) over a chunk of rows
/// per cube, 32 channels by 8 lanes, into a partial row of `out` (`[chunks, 2·cols]`:
/// the first sums, then the second); or, with `finish`, the statistics themselves into
/// `out` and `out2` (`[cols]` each) from the whole sums (one chunk, or `PAIRS` over the
/// partial rows): `stats`, the mean (`x₀ + Σ/m`, `x₀` the first row of `a` in `STATS`
/// mode, of `b` in `PAIRS` mode) and the variance; otherwise `dβ` and `dγ` (the second
/// sum over `√(var + eps)`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn channel_sums_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    mask: &Tensor<F>,
    shift: &Tensor<F>,
    var: &Tensor<F>,
    out: &mut Tensor<F>,
    out2: &mut Tensor<F>,
    rows: usize,
    cols: usize,
    per: usize,
    m: f32,
    eps: f32,
    #[comptime] mode: u32,
    #[comptime] finish: bool,
    #[comptime] stats: bool,
) {
    let x = UNIT_POS_X as usize;
    let lane = UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * 32 + x;
    let chunk = CUBE_POS_Y as usize;
    let mut s = F::new(0.0);
    let mut t = F::new(0.0);
    if col < cols {
        let start = chunk * per;
        let end = if start + per < rows {
            start + per
        } else {
            rows
        };
        let (ra, ca) = (a.stride(0), a.stride(1));
        let k = if comptime![mode == 1] {
            a[col * ca]
        } else if comptime![mode >= 2] {
            shift[col * shift.stride(0)]
        } else {
            F::new(0.0)
        };
        for r in range_stepped(start + lane, end, 8usize) {
            let v = a[r * ra + col * ca];
            if comptime![mode == 0] {
                s += v;
                t += a[r * ra + (cols + col) * ca];
            } else if comptime![mode == 1] {
                let d = v - k;
                s += d;
                t += d * d;
            } else {
                let mut g = v;
                if comptime![mode == 3] {
                    if mask[r * mask.stride(0) + col * mask.stride(1)] <= F::new(0.0) {
                        g = F::new(0.0);
                    }
                }
                s += g;
                t += g * (b[r * b.stride(0) + col * b.stride(1)] - k);
            }
        }
    }
    // 32 channels × 8 lanes, two sums each.
    let mut lanes = SharedMemory::<F>::new(512usize);
    let at = lane * 32 + x;
    lanes[at] = s;
    lanes[256 + at] = t;
    sync_cube();
    if lane == 0 && col < cols {
        let mut s = F::new(0.0);
        let mut t = F::new(0.0);
        for l in 0..8usize {
            s += lanes[l * 32 + x];
            t += lanes[256 + l * 32 + x];
        }
        if comptime![finish] {
            if comptime![stats] {
                let x0 = if comptime![mode == 1] {
                    a[col * a.stride(1)]
                } else {
                    b[col * b.stride(1)]
                };
                let m = F::cast_from(m);
                let d = s / m;
                let v = t / m - d * d;
                out[col * out.stride(0)] = x0 + d;
                out2[col * out2.stride(0)] = if v > F::new(0.0) { v } else { F::new(0.0) };
            } else {
                out[col * out.stride(0)] = s;
                let e = F::cast_from(eps);
                out2[col * out2.stride(0)] = t / F::sqrt(var[col * var.stride(0)] + e);
            }
        } else {
            let (ro, co) = (out.stride(0), out.stride(1));
            out[chunk * ro + col * co] = s;
            out[chunk * ro + (cols + col) * co] = t;
        }
    }
}

/// How many chunks of rows the first launch cuts `rows` into for `cols` channels.
fn chunk_count(rows: usize, cols: usize) -> usize {
    let blocks = cols.div_ceil(COLS);
    let most_by_rows = (rows / (LANES * MIN_LANE_ROWS)).max(1);
    TARGET_CUBES
        .div_ceil(blocks)
        .min(most_by_rows)
        .clamp(1, MAX_CHUNKS)
}

/// What a pass sums (see the module's doc).
#[allow(clippy::large_enum_variant)]
enum Sums<R: CubeRuntime> {
    /// The forward pass's, of `x` (`[rows, c]`).
    Stats { x: CubeTensor<R> },
    /// The backward pass's, of the output gradient `dy` and `x` (`[rows, c]`), with the
    /// forward's `mean` and `var` (`[c]`), and the ReLU's output where it ended in one.
    Grads {
        dy: CubeTensor<R>,
        x: CubeTensor<R>,
        mean: CubeTensor<R>,
        var: CubeTensor<R>,
        relu_output: Option<CubeTensor<R>>,
        eps: f32,
    },
}

/// The statistics of `sums` (`[c]` each): the mean and the biased variance forward, `dβ`
/// and `dγ` backward, for `[rows, c]` `f32` operands (what [`applies`] checks). One
/// launch where the rows fit one chunk, else two: the partial rows, then their sums and
/// the statistics.
fn channel_sums<R: CubeRuntime>(sums: Sums<R>) -> (CubeTensor<R>, CubeTensor<R>) {
    let (mode, a, b, mask, shift, var, eps) = match sums {
        Sums::Stats { x } => (STATS, x.clone(), x.clone(), x.clone(), x.clone(), x, 0.0),
        Sums::Grads {
            dy,
            x,
            mean,
            var,
            relu_output,
            eps,
        } => match relu_output {
            Some(o) => (GRADS_RELU, dy, x, o, mean, var, eps),
            None => (GRADS, dy.clone(), x, dy, mean, var, eps),
        },
    };
    let stats = mode == STATS;
    let dims = a.shape();
    let [rows, cols] = [dims[0], dims[1]];
    let m = rows as f32;
    let chunks = chunk_count(rows, cols);
    let x = b.clone();
    let operands = [a, b, mask, shift, var.clone()];
    if chunks == 1 {
        return launch(mode, true, stats, operands, rows, cols, 1, m, eps);
    }
    let (partial, _) = launch(mode, false, stats, operands, rows, cols, chunks, m, eps);
    let p = partial.clone();
    let operands = [p.clone(), x, p.clone(), p, var];
    launch(PAIRS, true, stats, operands, chunks, cols, 1, m, eps)
}

/// One launch of [`channel_sums_kernel`] over `chunks` chunks of `rows` rows: the partial
/// rows (`[chunks, 2·cols]`, and a placeholder), or with `finish` the two `[cols]`
/// statistics.
#[allow(clippy::too_many_arguments)]
fn launch<R: CubeRuntime>(
    mode: u32,
    finish: bool,
    stats: bool,
    [a, b, mask, shift, var]: [CubeTensor<R>; 5],
    rows: usize,
    cols: usize,
    chunks: usize,
    m: f32,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), shape, DType::F32)
    };
    let (out, out2) = if finish {
        (empty(Shape::new([cols])), empty(Shape::new([cols])))
    } else {
        // `out2` is not written: a placeholder.
        (
            empty(Shape::new([chunks, 2 * cols])),
            empty(Shape::new([1])),
        )
    };
    let per = rows.div_ceil(chunks);
    let client = a.client.clone();
    let count = CubeCount::Static(cols.div_ceil(COLS) as u32, chunks as u32, 1);
    // Safety: every index the kernel reads is below `rows` and `cols` (`2·cols` in
    // `PAIRS`) through the operands' own strides (`a`, `b`, `mask` are `[rows, cols]`,
    // `shift` and `var` `[cols]`, row 0 of `b` is read in `PAIRS`), and it writes `out[chunk,
    // col]` and `out[chunk, cols + col]` for `chunk < chunks`, or `out[col]` and
    // `out2[col]`, `col < cols`.
    unsafe {
        channel_sums_kernel::launch_unchecked::<f32, R>(
            &client,
            count,
            CubeDim::new_2d(COLS as u32, LANES as u32),
            a.into_tensor_arg(),
            b.into_tensor_arg(),
            mask.into_tensor_arg(),
            shift.into_tensor_arg(),
            var.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            out2.clone().into_tensor_arg(),
            rows,
            cols,
            per,
            m,
            eps,
            mode,
            finish,
            stats,
        );
    }
    (out, out2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first launch spreads a ResNet-50 batch norm's activation over a few hundred
    /// cubes, never more partial rows than the second launch adds in one chunk, and one
    /// chunk for a small one.
    #[test]
    fn chunks_spread_large_activations_and_leave_small_ones_whole() {
        // Layer 1 at batch 64 (32×32): 65,536 rows of 64 channels, 2 blocks of 32.
        assert_eq!(chunk_count(65_536, 64), 256);
        // Layer 4 (4×4): 1,024 rows of 2,048 channels.
        assert_eq!(chunk_count(1_024, 2_048), 4);
        assert_eq!(chunk_count(120, 3), 1);
        assert_eq!(chunk_count(1 << 24, 1), MAX_CHUNKS);
        for (rows, cols) in [(65_536, 64), (1_024, 2_048), (300, 7), (1 << 24, 1)] {
            let c = chunk_count(rows, cols);
            assert!(
                c <= MAX_CHUNKS && rows.div_ceil(c) >= 1,
                "{rows}×{cols}: {c}"
            );
        }
    }
}
