//! The patch matrix of a split weight gradient on CubeCL's backends (CUDA; WebGPU in the
//! tests): the input's patches gathered into `[n·oh·ow, kh·kw·c]` by one kernel of the
//! runner's own, zeros where a tap falls in the padding; and its adjoint, which sums each
//! input pixel's taps back into an image ([`gather_taps`], for a strided convolution's
//! input gradient).
//!
//! Why: `conv_cube`'s weight gradient split over the batch (`backend.conv_split`) needs
//! the patches as a matrix. Composed from Burn's ops they took three launches and three
//! passes over memory: a tensor of zeros the size of the padded input, the input assigned
//! into it, then the gather of its unfolded view (a copy of a view with overlapping
//! strides). ResNet-50 at batch 64 splits about 16 such weight gradients a step. Here one
//! launch reads the input through its strides, whatever its layout, and writes each patch
//! value once; the padding is a bounds test, not memory. It does not choose when to split
//! or run the matmul (`conv_cube` does).

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::server::CubeCountSelection;

/// Units in a cube.
const UNITS: usize = 256;

/// `out[row, (i, j, ch)]` for `row = (b, oy, ox)`: `x[b, ch, oy·sh + i − ph, ox·sw + j − pw]`,
/// 0 where that falls outside the input. A cube takes `CUBE_DIM_Y` consecutive `(row, tap)`
/// pairs, one per `y` unit, whose `CUBE_DIM_X` units step over the channels: the index
/// arithmetic is done once per pair, not per value, and consecutive units read consecutive
/// channels of a channels-last input and write consecutive values of `out` (`[rows,
/// patch]`, contiguous). `x` is `[n, c, h, w]`, read through its strides.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn patches_kernel<F: Float>(
    x: &Tensor<F>,
    out: &mut Tensor<F>,
    pairs: usize,
    taps: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
) {
    let pair = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    if pair >= pairs {
        terminate!();
    }
    let row = pair / taps;
    let tap = pair % taps;
    let i = tap / kw;
    let j = tap % kw;
    let ox = row % ow;
    let rest = row / ow;
    let oy = rest % oh;
    let b = rest / oh;
    // In the padded input's coordinates, so that nothing here goes below zero.
    let y = oy * sh + i;
    let xx = ox * sw + j;
    let inside = y >= ph && y < h + ph && xx >= pw && xx < w + pw;
    let to = pair * c;
    if inside {
        let from = b * x.stride(0) + (y - ph) * x.stride(2) + (xx - pw) * x.stride(3);
        let step = x.stride(1);
        for ch in range_stepped(UNIT_POS_X as usize, c, CUBE_DIM_X as usize) {
            out[to + ch] = x[from + ch * step];
        }
    } else {
        for ch in range_stepped(UNIT_POS_X as usize, c, CUBE_DIM_X as usize) {
            out[to + ch] = F::new(0.0);
        }
    }
}

/// The patches of `x` (`[n, c, h, w]`, any layout) for a `kh × kw` kernel with these
/// strides and paddings, as a contiguous `[n·oh·ow, kh·kw·c]` matrix (taps outer, input
/// channels inner: the column order of a channels-last weight `[o, kh, kw, c]`).
pub fn patches<R: CubeRuntime>(
    x: &CubeTensor<R>,
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [ph, pw]: [usize; 2],
    [oh, ow]: [usize; 2],
) -> CubeTensor<R> {
    let [n, c, h, w] = x.shape().dims();
    let (rows, patch) = (n * oh * ow, kh * kw * c);
    let out = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([rows, patch]),
        DType::F32,
    );
    // One pair per `y` unit, `(row, tap)` pairs in the order of `out`'s rows and taps; up to
    // 32 units over the channels, fewer for fewer channels (the stem's 3 take 4), the rest
    // of the cube's 256 over pairs.
    let pairs = rows * kh * kw;
    let lanes = c.next_power_of_two().clamp(1, 32);
    let per_cube = UNITS / lanes;
    let count = CubeCountSelection::new(&x.client, pairs.div_ceil(per_cube) as u32).cube_count();
    // Safety: a unit with `pair < pairs = rows·kh·kw` writes `out[pair·c + ch]` for
    // `ch < c`, inside `out` (`rows·kh·kw·c` values), and the others return at once; it
    // reads `x` at `b < n`, `ch < c`, a row in `[0, h)` and a column in `[0, w)` (the bounds
    // test), through `x`'s own strides.
    unsafe {
        patches_kernel::launch_unchecked::<f32, R>(
            &x.client,
            count,
            CubeDim::new_2d(lanes as u32, per_cube as u32),
            x.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            pairs,
            kh * kw,
            c,
            h,
            w,
            oh,
            ow,
            kw,
            sh,
            sw,
            ph,
            pw,
        );
    }
    out
}

/// The adjoint of [`patches_kernel`]: `out[b, y, x, ch]` (channels-last, contiguous) is
/// the sum of `cols[(b, oy, ox), (i, j, ch)]` over the taps `(i, j)` that read input pixel
/// `(y, x)`: `y + ph = oy·sh + i` with `0 ≤ oy < oh`, and the same across. One unit per
/// output value, channels innermost, so that consecutive units read consecutive values of
/// `cols` (`[rows, kh·kw·c]`, contiguous) and write consecutive values of `out`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn gather_taps_kernel<F: Float>(
    cols: &Tensor<F>,
    out: &mut Tensor<F>,
    len: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
) {
    let at = CUBE_POS * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if at >= len {
        terminate!();
    }
    let ch = at % c;
    let rest = at / c;
    let xx = rest % w + pw;
    let rest = rest / w;
    let y = rest % h + ph;
    let b = rest / h;
    let patch = kh * kw * c;
    let mut sum = F::new(0.0);
    // In the padded input's coordinates, so that nothing here goes below zero.
    for i in 0..kh {
        if y >= i {
            let ty = y - i;
            let oy = ty / sh;
            if oy * sh == ty && oy < oh {
                for j in 0..kw {
                    if xx >= j {
                        let tx = xx - j;
                        let ox = tx / sw;
                        if ox * sw == tx && ox < ow {
                            let row = (b * oh + oy) * ow + ox;
                            sum += cols[row * patch + (i * kw + j) * c + ch];
                        }
                    }
                }
            }
        }
    }
    out[at] = sum;
}

/// The input image `[n, h, w, c]` (a contiguous channels-last tensor) whose pixels sum the
/// taps of `cols` (`[n·oh·ow, kh·kw·c]`, contiguous, taps outer and channels inner as
/// [`patches`] lays them out) that read them, for a `kh × kw` kernel with these strides
/// and paddings: col2im, the adjoint of [`patches`]. A strided convolution's input
/// gradient is this of `dy_rows · weight` (`conv_cube`).
#[allow(clippy::too_many_arguments)]
pub fn gather_taps<R: CubeRuntime>(
    cols: &CubeTensor<R>,
    [n, c, h, w]: [usize; 4],
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [ph, pw]: [usize; 2],
    [oh, ow]: [usize; 2],
) -> CubeTensor<R> {
    let out = empty_device_contiguous_dtype(
        cols.client.clone(),
        cols.device.clone(),
        Shape::new([n, h, w, c]),
        DType::F32,
    );
    let len = n * h * w * c;
    if len == 0 {
        return out;
    }
    let count = CubeCountSelection::new(&cols.client, len.div_ceil(UNITS) as u32).cube_count();
    // Safety: a unit with `at < len` writes `out[at]`, inside `out` (`len` values), and
    // the others return at once; it reads `cols[row·patch + tap·c + ch]` with `b < n`,
    // `oy < oh`, `ox < ow` (so `row < n·oh·ow`), `tap < kh·kw` and `ch < c`, inside `cols`
    // (`[n·oh·ow, kh·kw·c]` contiguous, which the caller passes).
    unsafe {
        gather_taps_kernel::launch_unchecked::<f32, R>(
            &cols.client,
            count,
            CubeDim::new_1d(UNITS as u32),
            cols.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            len,
            c,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            ph,
            pw,
        );
    }
    out
}
