//! The CPU convolution: im2col + the `gemm` crate on contiguous NCHW `f32` buffers, forward
//! and both gradients, the way PyTorch's CPU backend lowers it. Burn 0.21's Flex backend
//! implements only the forward (through an NHWC copy) and leaves the two gradients to Burn's
//! generic defaults: a serial `conv_transpose2d` for the input gradient and
//! `swap_dims` + `conv2d` + `swap_dims` for the weight gradient, whose strided views Flex
//! copies element by element and whose gemm is only `kh·kw` columns wide. Here each gradient
//! is one gemm per group of images over buffers laid out for it.
//!
//! Work is split over images: a group of images is one task (im2col, gemm, scatter) on one
//! thread, so the gemm runs single-threaded on a cache-sized problem; small feature maps are
//! grouped so a gemm is at least [`MIN_COLUMNS`] wide. With fewer groups than threads (a
//! batch of one) the gemm itself is parallel instead. Every sum is taken in an order fixed
//! by the shapes and the thread count, so results are the same from run to run. The column
//! matrices themselves are built in [`super::patches`]. 3×3 stride-1 convolutions with
//! channels and tiles enough (most of a ResNet's) take [`super::winograd`] instead, all
//! three passes: 2.25× fewer multiplications.

use std::cell::RefCell;
use std::ops::Range;

use gemm::Parallelism;
use rayon::prelude::*;

use super::patches::{col2im, im2col, im2row, transpose};
use super::winograd;

/// The narrowest gemm worth running alone: feature maps smaller than this are grouped.
const MIN_COLUMNS: usize = 256;

/// Columns per band of output rows (see [`Geometry::bands`]). Measured on a ResNet-18 step
/// (2 cores, 2 MiB L2 each): 512 beat 256 by 2% and whole 32×32 images (1024) by 2.5%.
const BAND_COLUMNS: usize = 512;

/// One convolution's shapes: input `[n, c, h, w]`, weight `[co, c, kh, kw]`, output
/// `[n, co, ho, wo]`; strides, paddings and dilations per axis. Groups are 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub co: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ho: usize,
    pub wo: usize,
}

impl Geometry {
    /// `None` where the output would be empty (Burn's own kernels then report it).
    pub fn new(
        x: [usize; 4],
        weight: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Option<Self> {
        let [n, c, h, w] = x;
        let [co, cw, kh, kw] = weight;
        let out = |size: usize, k: usize, axis: usize| {
            let span = dilation[axis] * (k - 1) + 1;
            (size + 2 * padding[axis])
                .checked_sub(span)
                .map(|d| d / stride[axis] + 1)
        };
        if c != cw || kh == 0 || kw == 0 || stride.contains(&0) || dilation.contains(&0) {
            return None;
        }
        let (ho, wo) = (out(h, kh, 0)?, out(w, kw, 1)?);
        let sizes = [n, c, h, w, co, ho, wo];
        sizes.iter().all(|&v| v > 0).then_some(Self {
            n,
            c,
            h,
            w,
            co,
            kh,
            kw,
            stride,
            padding,
            dilation,
            ho,
            wo,
        })
    }

    /// Rows of the column matrix: one per input channel and kernel tap.
    pub(super) fn k(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// Output positions per image.
    pub(super) fn p(&self) -> usize {
        self.ho * self.wo
    }

    /// A 1×1 convolution with stride 1 and no padding: an image *is* its column matrix.
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Images per task: enough for a [`MIN_COLUMNS`]-wide gemm, few enough that every thread
    /// gets a task.
    fn group(&self, threads: usize) -> usize {
        let wide = MIN_COLUMNS.div_ceil(self.p()).max(1);
        let fair = self.n.div_ceil(threads.max(1)).max(1);
        wide.min(fair)
    }

    /// Output rows per band: a single image's columns are built and consumed a band at a
    /// time, so a band's column matrix stays in cache (about [`BAND_COLUMNS`] columns).
    fn band_rows(&self) -> usize {
        BAND_COLUMNS.div_ceil(self.wo).clamp(1, self.ho)
    }

    /// Columns in the widest band.
    pub(super) fn band(&self) -> usize {
        self.band_rows() * self.wo
    }

    /// The bands of output rows, in order.
    fn bands(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let step = self.band_rows();
        (0..self.ho)
            .step_by(step)
            .map(move |r| r..(r + step).min(self.ho))
    }

    pub fn out_len(&self) -> usize {
        self.n * self.co * self.p()
    }
}

/// `out = conv2d(x, weight)`, without bias: `x` is `[n, c, h, w]`, `weight` `[co, c, kh, kw]`,
/// both contiguous; the result is `[n, co, ho, wo]`. 3×3 stride-1 convolutions go through
/// [`super::winograd`], the others through im2col + gemm.
pub fn forward(g: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    if winograd::suits(g) {
        winograd::forward(g, x, weight)
    } else {
        forward_im2col(g, x, weight)
    }
}

/// [`forward`] by im2col + gemm, whatever the shape.
pub fn forward_im2col(g: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.co);
    let mut out = vec![0.0; g.out_len()];
    let threads = rayon::current_num_threads();
    let size = g.group(threads);
    let task = |(i, chunk): (usize, &mut [f32]), par: Parallelism| {
        let n0 = i * size;
        let gn = chunk.len() / (co * p);
        let image = |j: usize| &x[(n0 + j) * g.c * g.h * g.w..][..g.c * g.h * g.w];
        with_scratch(|scratch| {
            if gn == 1 {
                // One image, a band of output rows at a time (its columns stay in cache).
                let [col] = scratch.split([if g.pointwise() { 0 } else { k * g.band() }]);
                for rows in g.bands() {
                    let (q0, cols) = (rows.start * g.wo, rows.len() * g.wo);
                    // The band's columns: the image itself (1×1, stride 1), or im2col.
                    let (src, ld): (&[f32], usize) = if g.pointwise() {
                        (&image(0)[q0..], p)
                    } else {
                        im2col(g, image(0), rows, col, cols, 0);
                        (col, cols)
                    };
                    let dst = &mut chunk[q0..];
                    gemm(
                        dst,
                        p,
                        false,
                        (co, cols, k),
                        weight,
                        (k, 1),
                        src,
                        (ld, 1),
                        par,
                    );
                }
                return;
            }
            // Several small images side by side in one gemm, then scattered back.
            let cols = gn * p;
            let [col, tmp] = scratch.split([k * cols, co * cols]);
            for j in 0..gn {
                im2col(g, image(j), 0..g.ho, col, cols, j * p);
            }
            gemm(
                tmp,
                cols,
                false,
                (co, cols, k),
                weight,
                (k, 1),
                col,
                (cols, 1),
                par,
            );
            for j in 0..gn {
                for o in 0..co {
                    chunk[(j * co + o) * p..][..p].copy_from_slice(&tmp[o * cols + j * p..][..p]);
                }
            }
        });
    };
    run_tasks(&mut out, size * co * p, threads, task);
    out
}

/// The gradient of the loss with respect to `x`, from the output's gradient `dy`
/// (`[n, co, ho, wo]`, contiguous); through [`super::winograd`] where [`forward`] is.
pub fn backward_x(g: &Geometry, weight: &[f32], dy: &[f32]) -> Vec<f32> {
    if winograd::suits(g) {
        winograd::backward_x(g, weight, dy)
    } else {
        backward_x_im2col(g, weight, dy)
    }
}

/// [`backward_x`] by gemm + col2im, whatever the shape.
pub fn backward_x_im2col(g: &Geometry, weight: &[f32], dy: &[f32]) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.co);
    let image_len = g.c * g.h * g.w;
    let mut dx = vec![0.0; g.n * image_len];
    let threads = rayon::current_num_threads();
    let size = g.group(threads);
    let task = |(i, chunk): (usize, &mut [f32]), par: Parallelism| {
        let n0 = i * size;
        let gn = chunk.len() / image_len;
        with_scratch(|scratch| {
            // dcol (k × cols) = weightᵀ (k × co) · dy (co × cols), then added back onto
            // the pixels the columns were read from.
            if gn == 1 {
                let dy_n = &dy[n0 * co * p..][..co * p];
                let [dcol] = scratch.split([if g.pointwise() { 0 } else { k * g.band() }]);
                for rows in g.bands() {
                    let (q0, cols) = (rows.start * g.wo, rows.len() * g.wo);
                    let src = &dy_n[q0..];
                    // 1×1, stride 1: the columns are the input gradient itself.
                    let (dst, ld): (&mut [f32], usize) = if g.pointwise() {
                        (&mut chunk[q0..], p)
                    } else {
                        (&mut *dcol, cols)
                    };
                    gemm(
                        dst,
                        ld,
                        false,
                        (k, cols, co),
                        weight,
                        (1, k),
                        src,
                        (p, 1),
                        par,
                    );
                    if !g.pointwise() {
                        col2im(g, dcol, rows, cols, 0, chunk);
                    }
                }
                return;
            }
            let cols = gn * p;
            let [dcol, gathered] = scratch.split([k * cols, co * cols]);
            let dy_g = gather(dy, n0, gn, co, p, gathered);
            gemm(
                dcol,
                cols,
                false,
                (k, cols, co),
                weight,
                (1, k),
                dy_g,
                (cols, 1),
                par,
            );
            for j in 0..gn {
                let dx_j = &mut chunk[j * image_len..][..image_len];
                col2im(g, dcol, 0..g.ho, cols, j * p, dx_j);
            }
        });
    };
    run_tasks(&mut dx, size * image_len, threads, task);
    dx
}

/// The gradient of the loss with respect to the weight (`[co, c, kh, kw]`); through
/// [`super::winograd`] where [`forward`] is.
pub fn backward_weight(g: &Geometry, x: &[f32], dy: &[f32]) -> Vec<f32> {
    if winograd::suits(g) {
        winograd::backward_weight(g, x, dy)
    } else {
        backward_weight_im2col(g, x, dy)
    }
}

/// [`backward_weight`] through im2col (or im2row) + gemm whatever the layer.
pub fn backward_weight_im2col(g: &Geometry, x: &[f32], dy: &[f32]) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.co);
    let threads = rayon::current_num_threads();
    let size = g.group(threads);
    let groups = g.n.div_ceil(size);
    // Each worker sums its own run of groups into its own partial; the partials are then
    // added in worker order. Both orders are fixed, so the sum is the same on every run.
    let workers = threads.min(groups).max(1);
    let per_worker = groups.div_ceil(workers);
    // The gemm packs its big operand, the column matrix, by reading across its rows; when
    // rows are long (32×32 maps) that costs more than the product itself (3× the forward
    // on ResNet's first stage). There the patches are laid out one output position per row
    // instead ("im2row", read from a channels-last copy of the image), in (kh, kw, c)
    // order, and the weight gradient is put back in (c, kh, kw) order once at the end.
    // Measured per layer with `cargo bench --bench conv`: worth it when a group's output
    // positions are at least as many as the column count k, a loss below that.
    let by_rows = size * p >= k;
    let partial = |w: usize, par: Parallelism| -> Vec<f32> {
        let mut dw = vec![0.0; co * k];
        let first = w * per_worker;
        for group in first..(first + per_worker).min(groups) {
            let n0 = group * size;
            let gn = size.min(g.n - n0);
            with_scratch(|scratch| {
                let add = Group { x, dy, n0, gn };
                if by_rows {
                    add.by_rows(g, scratch, &mut dw, par);
                } else {
                    add.by_columns(g, scratch, &mut dw, par);
                }
            });
        }
        dw
    };
    let mut partials: Vec<Vec<f32>> = if workers > 1 {
        (0..workers)
            .into_par_iter()
            .map(|w| partial(w, Parallelism::None))
            .collect()
    } else {
        vec![partial(0, gemm_parallelism(threads))]
    };
    let mut total = partials.remove(0);
    for other in partials {
        total.iter_mut().zip(other).for_each(|(a, b)| *a += b);
    }
    if !by_rows {
        return total;
    }
    // (co, kh, kw, c) → (co, c, kh, kw)
    let taps = g.kh * g.kw;
    let mut dw = vec![0.0; co * k];
    for o in 0..co {
        transpose(&total[o * k..][..k], taps, g.c, &mut dw[o * k..][..k]);
    }
    dw
}

/// A group of images' share of the weight gradient: images `n0..n0 + gn` of `x`, with
/// their output gradients in `dy`.
struct Group<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    n0: usize,
    gn: usize,
}

impl Group<'_> {
    fn image(&self, g: &Geometry, j: usize) -> &[f32] {
        let len = g.c * g.h * g.w;
        &self.x[(self.n0 + j) * len..][..len]
    }

    /// dw (co × k, taps in (kh, kw, c) order) += dy (co × cols) · rows (cols × k), a band
    /// of output rows at a time, from a channels-last copy of each image.
    fn by_rows(&self, g: &Geometry, scratch: &mut Scratch, dw: &mut [f32], par: Parallelism) {
        let (k, p, co) = (g.k(), g.p(), g.co);
        let [image_t, rows_buf] = scratch.split([g.h * g.w * g.c, k * g.band()]);
        for j in 0..self.gn {
            transpose(self.image(g, j), g.c, g.h * g.w, image_t);
            let dy_j = &self.dy[(self.n0 + j) * co * p..][..co * p];
            for rows in g.bands() {
                let (q0, cols) = (rows.start * g.wo, rows.len() * g.wo);
                im2row(g, image_t, rows, rows_buf);
                let (a, b) = (&dy_j[q0..], &rows_buf[..]);
                gemm(dw, k, true, (co, k, cols), a, (p, 1), b, (k, 1), par);
            }
        }
    }

    /// dw (co × k) += dy_g (co × cols) · colᵀ (cols × k), the group's images side by side.
    fn by_columns(&self, g: &Geometry, scratch: &mut Scratch, dw: &mut [f32], par: Parallelism) {
        let (k, p, co, gn) = (g.k(), g.p(), g.co, self.gn);
        let cols = gn * p;
        let direct = gn == 1 && g.pointwise();
        let col_len = if direct { 0 } else { k * cols };
        let gathered_len = if gn == 1 { 0 } else { co * cols };
        let [col_buf, gathered] = scratch.split([col_len, gathered_len]);
        let dy_g = gather(self.dy, self.n0, gn, co, p, gathered);
        let col: &[f32] = if direct {
            self.image(g, 0)
        } else {
            for j in 0..gn {
                im2col(g, self.image(g, j), 0..g.ho, col_buf, cols, j * p);
            }
            col_buf
        };
        gemm(
            dw,
            k,
            true,
            (co, k, cols),
            dy_g,
            (cols, 1),
            col,
            (1, cols),
            par,
        );
    }
}

/// Runs `task` on each `chunk_len` piece of `out` with its index: in parallel, one piece
/// per task, when there are pieces for every thread; otherwise one after another with a
/// parallel gemm inside.
pub(super) fn run_tasks<F>(out: &mut [f32], chunk_len: usize, threads: usize, task: F)
where
    F: Fn((usize, &mut [f32]), Parallelism) + Sync,
{
    let pieces = out.len().div_ceil(chunk_len);
    if threads > 1 && pieces >= threads {
        out.par_chunks_mut(chunk_len)
            .enumerate()
            .for_each(|piece| task(piece, Parallelism::None));
    } else {
        let par = gemm_parallelism(threads);
        out.chunks_mut(chunk_len)
            .enumerate()
            .for_each(|piece| task(piece, par));
    }
}

fn gemm_parallelism(threads: usize) -> Parallelism {
    if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// `dy` of images `n0..n0 + gn` as one `co × gn·p` matrix: the images' own memory when
/// `gn` is 1, else copied into `buf`.
fn gather<'a>(
    dy: &'a [f32],
    n0: usize,
    gn: usize,
    co: usize,
    p: usize,
    buf: &'a mut [f32],
) -> &'a [f32] {
    if gn == 1 {
        return &dy[n0 * co * p..][..co * p];
    }
    let cols = gn * p;
    for j in 0..gn {
        for o in 0..co {
            buf[o * cols + j * p..][..p].copy_from_slice(&dy[((n0 + j) * co + o) * p..][..p]);
        }
    }
    buf
}

/// `dst (m × n, row stride ldd) = a (m × k) · b (k × n)`, plus `dst` when `accumulate`.
/// `a` and `b` are given with their (row, column) strides, so transposes cost nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    dst: &mut [f32],
    ldd: usize,
    accumulate: bool,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    par: Parallelism,
) {
    // The largest index a `rows × cols` matrix with these strides touches.
    let last = |rows: usize, rs: usize, cols: usize, cs: usize| {
        (rows - 1)
            .checked_mul(rs)
            .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
            .unwrap_or(usize::MAX)
    };
    // The bounds the raw call relies on, checked once per call; `dst`'s rows must not
    // overlap (a parallel gemm writes them from several threads).
    assert!(m > 0 && n > 0 && k > 0, "empty gemm");
    assert!(m == 1 || ldd >= n, "gemm: dst rows overlap");
    assert!(last(m, ldd, n, 1) < dst.len(), "gemm: dst too short");
    assert!(last(m, a_rs, k, a_cs) < a.len(), "gemm: lhs too short");
    assert!(last(k, b_rs, n, b_cs) < b.len(), "gemm: rhs too short");
    // SAFETY: every index the call reads or writes is within the slices (asserted above),
    // `dst` is borrowed mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ldd as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// A per-thread buffer reused across calls and steps: column matrices are megabytes, and
/// allocating them afresh every call costs page faults on every step.
pub(super) struct Scratch(Vec<f32>);

impl Scratch {
    /// Disjoint buffers of the given lengths (contents unspecified).
    pub(super) fn split<const N: usize>(&mut self, lens: [usize; N]) -> [&mut [f32]; N] {
        let total: usize = lens.iter().sum();
        if self.0.len() < total {
            self.0.resize(total, 0.0);
        }
        let mut rest = &mut self.0[..];
        lens.map(|len| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            head
        })
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch(Vec::new())) };
}

pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| {
        // Taken out while in use, so a nested call (none today) would get its own buffer.
        let mut scratch = std::mem::replace(&mut *s.borrow_mut(), Scratch(Vec::new()));
        let result = f(&mut scratch);
        *s.borrow_mut() = scratch;
        result
    })
}
