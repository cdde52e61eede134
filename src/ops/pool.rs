//! Pooling the models call, done the way each backend handles best ([`PoolBackend`]):
//! the text models' mean over a sequence's real tokens ([`masked_mean`]) and the image
//! models' max pooling ([`max_pool2d`]).
//!
//! On Flex the masked sum is a batched matrix product: as a broadcast multiply and a sum,
//! its backward multiplies two broadcast views, which Flex walks element by element (three
//! quarters of a SpamAssassin step). Max pooling is the runner's own loop over each
//! image's channel planes, branch-free, with the 2×2 stride-2 case on its own: Flex's goes
//! through its generic 3-D pooling with a branch per value, and its backward is serial
//! (about a third of the quickstart's step). Measured with `scripts/ab-cpu.sh`
//! (BENCHMARKS.md): SpamAssassin 35.2 → 4.0 ms per step, the quickstart 28.3 → 18.9.
//! Elsewhere (CubeCL) both stay Burn's ops: the broadcast multiply and sum, which fusion
//! joins and which add no matrix product to autotune for every padded length, and Burn's
//! pooling.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::nn::pool::MaxPool2d;
use burn::nn::PaddingConfig2d;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor, ModuleOps};
use burn::tensor::{Bool, DType, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

use super::{flex_f32, to_flex, values};

/// How a backend pools. The defaults are Burn's ops.
pub trait PoolBackend: Backend {
    /// Whether [`masked_mean`]'s sum is a batched matrix product here (else a broadcast
    /// multiply and a sum).
    const SUM_BY_MATMUL: bool = false;

    /// Whether [`max_pool2d`] is the runner's own op here: the autodiff backend then
    /// records one node whose backward is [`PoolBackend::max_pool2d_argmax_backward`];
    /// otherwise Burn's max pooling and its node.
    const OWN_MAX_POOL: bool = false;

    /// Max pooling of `x` `[n, c, h, w]` over `w`'s windows.
    fn max_pool2d_window(x: FloatTensor<Self>, w: PoolWindow) -> FloatTensor<Self> {
        Self::max_pool2d(x, w.kernel, w.stride, w.padding, [1, 1], false)
    }

    /// Max pooling with each window's argmax: its index in the input's `h·w` plane (the
    /// first maximum in the window's row-major order, as Burn's).
    fn max_pool2d_argmax(
        x: FloatTensor<Self>,
        w: PoolWindow,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        let r = Self::max_pool2d_with_indices(x, w.kernel, w.stride, w.padding, [1, 1], false);
        (r.output, r.indices)
    }

    /// The gradient of `x` (the forward's input) from the output's and the argmaxes: each
    /// output's gradient added to the input it came from, in output order.
    fn max_pool2d_argmax_backward(
        x: FloatTensor<Self>,
        w: PoolWindow,
        grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let (k, s, p) = (w.kernel, w.stride, w.padding);
        Self::max_pool2d_with_indices_backward(x, k, s, p, [1, 1], false, grad, indices).x_grad
    }
}

/// A max pooling's windows: kernel, stride and (symmetric) padding per axis; dilation 1,
/// output sizes rounded down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolWindow {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl PoolWindow {
    /// Output size along `axis` for an input of `size` (0 where no window fits).
    fn out(&self, size: usize, axis: usize) -> usize {
        (size + 2 * self.padding[axis])
            .checked_sub(self.kernel[axis])
            .map_or(0, |d| d / self.stride[axis] + 1)
    }

    /// The windows of a Burn `MaxPool2d` module, where the runner's op computes what the
    /// module does: no padding or the same explicit padding on both sides of each axis,
    /// dilation 1, no ceil mode (the models' pools; others are left to the module).
    fn of(pool: &MaxPool2d) -> Option<Self> {
        let padding = match pool.padding {
            PaddingConfig2d::Valid => [0, 0],
            PaddingConfig2d::Explicit(top, left, bottom, right)
                if top == bottom && left == right =>
            {
                [top, left]
            }
            _ => return None,
        };
        let plain = pool.dilation == [1, 1] && !pool.ceil_mode;
        plain.then_some(Self {
            kernel: pool.kernel_size,
            stride: pool.stride,
            padding,
        })
    }
}

impl PoolBackend for Flex {
    const SUM_BY_MATMUL: bool = true;
    const OWN_MAX_POOL: bool = true;

    fn max_pool2d_window(x: FlexTensor, w: PoolWindow) -> FlexTensor {
        match flex_f32::<4>(&x) {
            Some((xc, dims)) => cpu::max_pool(&xc, dims, w, false).0,
            None => Self::max_pool2d(x, w.kernel, w.stride, w.padding, [1, 1], false),
        }
    }

    fn max_pool2d_argmax(x: FlexTensor, w: PoolWindow) -> (FlexTensor, FlexTensor) {
        match flex_f32::<4>(&x) {
            Some((xc, dims)) => {
                let (out, argmax) = cpu::max_pool(&xc, dims, w, true);
                (out, argmax.expect("asked for"))
            }
            None => {
                let r =
                    Self::max_pool2d_with_indices(x, w.kernel, w.stride, w.padding, [1, 1], false);
                (r.output, r.indices)
            }
        }
    }

    fn max_pool2d_argmax_backward(
        x: FlexTensor,
        w: PoolWindow,
        grad: FlexTensor,
        indices: FlexTensor,
    ) -> FlexTensor {
        let dims: Option<[usize; 4]> = x.shape().as_slice().try_into().ok();
        let fits = indices.dtype() == DType::I64 && grad.dtype() == DType::F32;
        match (dims, flex_f32::<4>(&grad), fits) {
            (Some(dims), Some((g, g_dims)), true) if g_dims == indices.shape().as_slice() => {
                cpu::max_pool_backward(dims, values(&g), g_dims, &indices.to_contiguous())
            }
            _ => {
                let (k, s, p) = (w.kernel, w.stride, w.padding);
                Self::max_pool2d_with_indices_backward(x, k, s, p, [1, 1], false, grad, indices)
                    .x_grad
            }
        }
    }
}

impl<B: PoolBackend, C: CheckpointStrategy> PoolBackend for Autodiff<B, C> {
    const SUM_BY_MATMUL: bool = B::SUM_BY_MATMUL;
    const OWN_MAX_POOL: bool = B::OWN_MAX_POOL;

    fn max_pool2d_window(x: FloatTensor<Self>, w: PoolWindow) -> FloatTensor<Self> {
        if !B::OWN_MAX_POOL {
            return Self::max_pool2d(x, w.kernel, w.stride, w.padding, [1, 1], false);
        }
        match MaxPoolBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, argmax) = B::max_pool2d_argmax(x.primitive.clone(), w);
                prep.finish((x.primitive, w, argmax), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::max_pool2d_window(x.primitive, w)),
        }
    }
}

/// The autodiff node of [`max_pool2d`] where the backend pools itself: the input (for its
/// shape), the windows and the argmaxes.
#[derive(Debug)]
struct MaxPoolBackward;

impl<B: PoolBackend> Backward<B, 1> for MaxPoolBackward {
    type State = (FloatTensor<B>, PoolWindow, IntTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x, w, argmax) = ops.state;
        if let Some(node) = node {
            grads.register::<B>(node.id, B::max_pool2d_argmax_backward(x, w, grad, argmax));
        }
    }
}

#[cfg(feature = "cube")]
impl<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement> PoolBackend
    for burn_cubecl::CubeBackend<R, f32, i32, BT>
{
}

#[cfg(feature = "cube")]
impl<B: burn_fusion::FusionBackend + PoolBackend> PoolBackend for burn_fusion::Fusion<B> {}

/// Mean of `x` `[batch, len, dim]` over the positions that are not padding (`pad` true) →
/// `[batch, dim]`; a row of padding alone gives zeros.
pub fn masked_mean<B: PoolBackend>(x: Tensor<B, 3>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 2> {
    mean_of_kept(x, pad, B::SUM_BY_MATMUL)
}

fn mean_of_kept<B: Backend>(
    x: Tensor<B, 3>,
    pad: Tensor<B, 2, Bool>,
    by_matmul: bool,
) -> Tensor<B, 2> {
    let [b, _, d] = x.dims();
    let keep = pad.bool_not().float();
    let count = keep.clone().sum_dim(1).clamp_min(1.0);
    let sum = if by_matmul {
        // `[b, 1, len] · [b, len, d]`: the backward is another product per row.
        keep.unsqueeze_dim::<3>(1).matmul(x).reshape([b, d])
    } else {
        (x * keep.unsqueeze_dim::<3>(2)).sum_dim(1).reshape([b, d])
    };
    sum / count
}

/// `pool` applied to `x` in training or evaluation: the backend's own max pooling where
/// it has one and the module's settings allow it, else the module's.
pub fn max_pool2d<B: PoolBackend>(pool: &MaxPool2d, x: Tensor<B, 4>) -> Tensor<B, 4> {
    match PoolWindow::of(pool) {
        Some(window) if B::OWN_MAX_POOL => {
            let out = B::max_pool2d_window(x.into_primitive().tensor(), window);
            Tensor::from_primitive(TensorPrimitive::Float(out))
        }
        _ => pool.forward(x),
    }
}

/// The Flex kernels: a task per image and channel plane.
mod cpu {
    use super::*;

    /// (output, argmaxes as `i64` where `with_argmax`) of `x` `[n, c, h, w]` (contiguous).
    /// The first in-bounds value of a window starts its maximum and a later one replaces
    /// it only where greater, as Flex's pooling: a NaN there stays, a NaN later is passed.
    pub(super) fn max_pool(
        x: &FlexTensor,
        [n, c, h, w]: [usize; 4],
        win: PoolWindow,
        with_argmax: bool,
    ) -> (FlexTensor, Option<FlexTensor>) {
        let (ho, wo) = (win.out(h, 0), win.out(w, 1));
        let (plane_in, plane_out) = (h * w, ho * wo);
        let x = values(x);
        let mut out = vec![f32::NEG_INFINITY; n * c * plane_out];
        let mut argmax = vec![-1i64; if with_argmax { n * c * plane_out } else { 0 }];
        let [kh, kw] = win.kernel;
        let [sh, sw] = win.stride;
        let [ph, pw] = win.padding;
        let halving = win.kernel == [2, 2] && win.stride == [2, 2] && win.padding == [0, 0];
        let plane = |(i, (out, arg)): (usize, (&mut [f32], &mut [i64]))| {
            let src = &x[i * plane_in..][..plane_in];
            if halving {
                halve(src, w, (ho, wo), out, arg);
                return;
            }
            for oy in 0..ho {
                // In-bounds rows and columns of the window: padding is skipped, not read.
                let y0 = (oy * sh).saturating_sub(ph);
                let y1 = (oy * sh + kh).saturating_sub(ph).min(h);
                for ox in 0..wo {
                    let x0 = (ox * sw).saturating_sub(pw);
                    let x1 = (ox * sw + kw).saturating_sub(pw).min(w);
                    let (mut best, mut at) = (f32::NEG_INFINITY, -1i64);
                    if y0 < y1 && x0 < x1 {
                        (best, at) = (src[y0 * w + x0], (y0 * w + x0) as i64);
                        for y in y0..y1 {
                            let row = &src[y * w..][..x1];
                            for (col, &v) in row.iter().enumerate().skip(x0) {
                                // Branch-free: on random activations a branch here
                                // mispredicts about every other value.
                                let greater = v > best;
                                best = if greater { v } else { best };
                                at = if greater { (y * w + col) as i64 } else { at };
                            }
                        }
                    }
                    out[oy * wo + ox] = best;
                    if let Some(a) = arg.get_mut(oy * wo + ox) {
                        *a = at;
                    }
                }
            }
        };
        let arg_chunk = if with_argmax { plane_out } else { 1 };
        if with_argmax {
            out.par_chunks_mut(plane_out.max(1))
                .zip(argmax.par_chunks_mut(arg_chunk.max(1)))
                .enumerate()
                .for_each(plane);
        } else {
            out.par_chunks_mut(plane_out.max(1))
                .enumerate()
                .for_each(|(i, out)| plane((i, (out, &mut []))));
        }
        let shape = [n, c, ho, wo];
        let argmax = with_argmax.then(|| FlexTensor::from_data(TensorData::new(argmax, shape)));
        (to_flex(out, shape), argmax)
    }

    /// The 2×2, stride-2 case (the small CNN's pools) of [`max_pool`] on one plane, the
    /// same comparisons in the same order without the general case's window arithmetic.
    fn halve(src: &[f32], w: usize, (ho, wo): (usize, usize), out: &mut [f32], arg: &mut [i64]) {
        for oy in 0..ho {
            let (top, bottom) = (
                &src[2 * oy * w..][..2 * wo],
                &src[(2 * oy + 1) * w..][..2 * wo],
            );
            let row = &mut out[oy * wo..][..wo];
            let pairs = top.chunks_exact(2).zip(bottom.chunks_exact(2));
            for (ox, (o, (t, b))) in row.iter_mut().zip(pairs).enumerate() {
                let (mut best, mut at) = (t[0], 0);
                for (k, v) in [(1, t[1]), (2, b[0]), (3, b[1])] {
                    let greater = v > best;
                    best = if greater { v } else { best };
                    at = if greater { k } else { at };
                }
                *o = best;
                if let Some(a) = arg.get_mut(oy * wo + ox) {
                    *a = ((2 * oy + at / 2) * w + 2 * ox + at % 2) as i64;
                }
            }
        }
    }

    /// The input's gradient: each output's gradient added, in output order within its
    /// plane, onto a zero plane at its argmax (as Flex's backward; planes in parallel).
    pub(super) fn max_pool_backward(
        [n, c, h, w]: [usize; 4],
        grad: &[f32],
        [_, _, ho, wo]: [usize; 4],
        argmax: &FlexTensor,
    ) -> FlexTensor {
        let (plane_in, plane_out) = (h * w, ho * wo);
        let argmax: &[i64] = argmax.storage();
        let mut dx = vec![0.0f32; n * c * plane_in];
        if plane_in > 0 {
            dx.par_chunks_mut(plane_in).enumerate().for_each(|(i, dx)| {
                let g = &grad[i * plane_out..][..plane_out];
                let at = &argmax[i * plane_out..][..plane_out];
                for (&g, &at) in g.iter().zip(at) {
                    if at >= 0 {
                        dx[at as usize] += g;
                    }
                }
            });
        }
        to_flex(dx, [n, c, h, w])
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    /// Both ways of summing give the same mean and the same gradient (to rounding), with
    /// padding at the ends of rows and a row of padding alone.
    #[test]
    fn the_product_and_the_broadcast_sum_agree() {
        type A = Autodiff<Flex>;
        let d = Default::default();
        let x = Tensor::<A, 3>::random([3, 5, 4], Distribution::Normal(0.0, 1.0), &d);
        let mask = [
            [false, false, false, true, true],
            [false, false, false, false, false],
            [true, true, true, true, true],
        ];
        let pad = Tensor::<A, 2, Bool>::from_data(TensorData::from(mask), &d);
        let w = Tensor::<A, 2>::random([3, 4], Distribution::Normal(0.0, 1.0), &d);
        let run = |by_matmul: bool| {
            let x = x.clone().detach().require_grad();
            let mean = mean_of_kept(x.clone(), pad.clone(), by_matmul);
            let grads = (mean.clone() * w.clone()).sum().backward();
            let v = |t: TensorData| t.to_vec::<f32>().unwrap();
            (v(mean.into_data()), v(x.grad(&grads).unwrap().into_data()))
        };
        let (product, broadcast) = (run(true), run(false));
        for (name, a, b) in [
            ("mean", &product.0, &broadcast.0),
            ("gradient", &product.1, &broadcast.1),
        ] {
            let worst = a
                .iter()
                .zip(b)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-6, "{name} differs by {worst}");
        }
        // The padding-only row is zeros, and padded positions get no gradient.
        assert!(product.0[8..].iter().all(|&v| v == 0.0));
        assert!(product.1[3 * 4..5 * 4].iter().all(|&v| v == 0.0));
        assert!(product.1[2 * 20..].iter().all(|&v| v == 0.0));
        const { assert!(<A as PoolBackend>::SUM_BY_MATMUL) };
    }

    fn pseudo(n: usize, seed: u64) -> Vec<f32> {
        // A fixed sequence with repeated values (ties) and both signs.
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) % 17) as f32 - 8.0
            })
            .collect()
    }

    /// The runner's max pooling equals Burn's (Flex's) to the bit: output, argmaxes (ties
    /// go to the first, a NaN first in its window stays, a later NaN is passed) and, through
    /// autodiff, the input's gradient, for the halving pools of the small CNN, the ResNet
    /// stem's padded 3×3 stride 2, overlapping windows and sizes that do not divide.
    #[test]
    fn own_max_pool_equals_burns_to_the_bit() {
        use burn::nn::pool::MaxPool2dConfig;
        type A = Autodiff<Flex>;
        let d = Default::default();
        let pools = [
            MaxPool2dConfig::new([2, 2]).init(),
            MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            MaxPool2dConfig::new([3, 3])
                .with_strides([1, 1])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            MaxPool2dConfig::new([2, 3]).with_strides([1, 2]).init(),
        ];
        let bits = |t: TensorData| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for (p, pool) in pools.iter().enumerate() {
            for dims in [[2, 3, 8, 8], [1, 2, 7, 9], [2, 1, 5, 4]] {
                let mut values = pseudo(dims.iter().product(), 7 + p as u64);
                values[0] = f32::NAN;
                values[5] = f32::NAN;
                let data = TensorData::new(values, dims);
                let what = format!("pool {p}, {dims:?}");
                let window = PoolWindow::of(pool).unwrap();
                // The inner op against Flex's, argmaxes included.
                let x = FlexTensor::from_data(data.clone());
                let (ours, ours_at) = Flex::max_pool2d_argmax(x.clone(), window);
                let (k, st, pad) = (window.kernel, window.stride, window.padding);
                let theirs = Flex::max_pool2d_with_indices(x, k, st, pad, [1, 1], false);
                let flex =
                    |t: FlexTensor| Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t));
                let int = |t: FlexTensor| {
                    Tensor::<Flex, 4, burn::tensor::Int>::from_primitive(t)
                        .into_data()
                        .to_vec::<i64>()
                        .unwrap()
                };
                assert_eq!(
                    bits(flex(ours).into_data()),
                    bits(flex(theirs.output).into_data()),
                    "{what}: output"
                );
                assert_eq!(int(ours_at), int(theirs.indices), "{what}: argmax");
                // Through autodiff: the output and the input's gradient.
                let run = |own: bool| {
                    let x = Tensor::<A, 4>::from_data(data.clone(), &d).require_grad();
                    let y = if own {
                        max_pool2d(pool, x.clone())
                    } else {
                        pool.forward(x.clone())
                    };
                    let [n, c, h, w] = y.dims();
                    let weights = pseudo(n * c * h * w, 99);
                    let wt = Tensor::<A, 4>::from_data(TensorData::new(weights, [n, c, h, w]), &d);
                    let g = (y.clone() * wt).sum().backward();
                    (bits(y.into_data()), bits(x.grad(&g).unwrap().into_data()))
                };
                let (ours, theirs) = (run(true), run(false));
                assert_eq!(ours.0, theirs.0, "{what}: autodiff output");
                assert_eq!(ours.1, theirs.1, "{what}: input gradient");
                // Evaluation (no autodiff) takes the same pooling.
                let plain = Tensor::<Flex, 4>::from_data(data.clone(), &d);
                let (a, b) = (max_pool2d(pool, plain.clone()), pool.forward(plain));
                assert_eq!(
                    bits(a.into_data()),
                    bits(b.into_data()),
                    "{what}: evaluation"
                );
            }
        }
        // A pool the op does not take (same padding) is left to the module.
        let same = MaxPool2dConfig::new([2, 2])
            .with_padding(PaddingConfig2d::Same)
            .init();
        assert_eq!(PoolWindow::of(&same), None);
    }
}
