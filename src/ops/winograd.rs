//! Winograd's minimal filtering F(2×2, 3×3) for the CPU convolution's 3×3 stride-1 layers:
//! the forward pass, the input gradient and the weight gradient (most of a ResNet's
//! convolution time). Each 2×2 block of
//! output ("tile") is computed from the 4×4 input patch under it with 16 products per input
//! channel instead of 36: input patches and filters are taken into a 16-point transformed
//! space (`Bᵀ d B`, `G g Gᵀ`), where the convolution is one elementwise product per point
//! summed over the channels, that is 16 gemms `M[k] (co × tiles) = U[k] (co × c) · V[k]
//! (c × tiles)`, and the sums are taken back (`Aᵀ m A`). 2.25× fewer multiplications than
//! im2col + gemm, and a transformed input of 4× the image where im2col's is 9×.
//!
//! The transforms are Lavin and Gray's (2015); their coefficients are 0, ±1 and ½, so the
//! float32 result is within a few units in the last place of the direct sum (the tests
//! compare both with Burn's convolution). The input gradient of a stride-1 convolution is
//! the stride-1 convolution of the output gradient, padded by `2 − padding`, with the
//! filters turned 180° and their channel axes swapped, so it takes the same path.
//!
//! Work is split as in [`super::conv_cpu`]: a group of images per task, taken a band of
//! whole images at a time so that a band's transformed input and products stay in cache.
//! The transforms run along rows of tiles: the tiles of a row are two columns apart, so a
//! tile's four input columns are two of the row's even columns and two of its odd ones,
//! and with each input plane split into its even and odd columns once, every transform is
//! a pass of vector code over a row of tiles. Every sum is in an order fixed by the shapes
//! and the thread count.

use super::conv_cpu::{gemm, run_tasks, with_scratch, Geometry};

/// Points of a transformed tile (4×4).
const POINTS: usize = 16;

/// The size of a band's transformed input (or of its products, whichever has more
/// channels), in floats: 1 MiB, half of L2 on the development machines. Measured with
/// `cargo bench --bench conv` on ResNet-18's layers.
const BAND_FLOATS: usize = 1 << 18;

/// The fewest tiles per image for which this path is taken: on smaller maps (4×4 in
/// ResNet's last stage) a transformed filter is used by too few tiles to pay for its
/// transform.
const MIN_TILES: usize = 16;

/// Whether the convolution `g` takes this path: a 3×3 kernel, stride 1, no dilation,
/// padding at most 2 (so that its input gradient, padded by `2 − padding`, does too), and
/// channels enough on both sides for the vector code (a network's first layer, from 3
/// colour channels, is faster by im2col).
pub(super) fn suits(g: &Geometry) -> bool {
    g.kh == 3
        && g.kw == 3
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && g.padding.iter().all(|&p| p <= 2)
        && g.c.min(g.co) >= MIN_CHANNELS
        && g.ho.div_ceil(2) * g.wo.div_ceil(2) >= MIN_TILES
}

/// The fewest input or output channels for which this path is taken.
const MIN_CHANNELS: usize = 16;

/// `conv2d(x, weight)` for a convolution that [`suits`] this path.
pub fn forward(g: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let shape = Shape::of(g);
    convolve(&shape, x, &transform_filters(weight, g.co, g.c))
}

/// The input gradient of a convolution that [`suits`] this path, from the output's
/// gradient `dy`.
pub fn backward_x(g: &Geometry, weight: &[f32], dy: &[f32]) -> Vec<f32> {
    // w'[ci][o][i][j] = w[o][ci][2 − i][2 − j]
    let mut turned = vec![0.0; weight.len()];
    for o in 0..g.co {
        for ci in 0..g.c {
            let src = &weight[(o * g.c + ci) * 9..][..9];
            let dst = &mut turned[(ci * g.co + o) * 9..][..9];
            for (d, s) in dst.iter_mut().zip(src.iter().rev()) {
                *d = *s;
            }
        }
    }
    let shape = Shape {
        n: g.n,
        c: g.co,
        h: g.ho,
        w: g.wo,
        co: g.c,
        pad: [2 - g.padding[0], 2 - g.padding[1]],
        ho: g.h,
        wo: g.w,
    };
    convolve(&shape, dy, &transform_filters(&turned, g.c, g.co))
}

/// The weight gradient (`[co, c, 3, 3]`) of a convolution that [`suits`] this path, from
/// its input `x` and the output's gradient `dy`. With `Y = Aᵀ [U ⊙ V] A` for each tile,
/// `U = G g Gᵀ` and `V = Bᵀ d B`, the gradient of the 16 transformed products is
/// `A dY Aᵀ`, that of `U` their product with `V` summed over the tiles (16 gemms
/// `dU[k] (co × c) += dM[k] (co × tiles) · V[k]ᵀ (tiles × c)`, the tiles the long side),
/// and that of `g` is `Gᵀ dU G`. Tiles past the output's edge have a zero gradient, so
/// they add nothing.
pub fn backward_weight(g: &Geometry, x: &[f32], dy: &[f32]) -> Vec<f32> {
    let s = Shape::of(g);
    let (image_in, image_out) = (s.c * s.h * s.w, s.co * s.ho * s.wo);
    let per_image = s.tiles_per_image();
    let threads = rayon::current_num_threads();
    let size = s.group(threads);
    let groups = s.n.div_ceil(size);
    // Each worker sums its own run of groups into its own partial; the partials are then
    // added in worker order. Both orders are fixed, so the sum is the same on every run.
    let workers = threads.min(groups).max(1);
    let per_worker = groups.div_ceil(workers);
    let partial = |w: usize, par: ::gemm::Parallelism| -> Vec<f32> {
        let mut du = vec![0.0; POINTS * s.co * s.c];
        let first = w * per_worker;
        for group in first..(first + per_worker).min(groups) {
            let n0 = group * size;
            let gn = size.min(s.n - n0);
            let band = s.band().min(gn);
            let t_max = band * per_image;
            with_scratch(|scratch| {
                let (v, m, mut work) = buffers(&s, scratch, t_max);
                for j0 in (0..gn).step_by(band) {
                    let bn = band.min(gn - j0);
                    let t = bn * per_image;
                    let v = &mut v[..POINTS * s.c * t];
                    let images = &x[(n0 + j0) * image_in..][..bn * image_in];
                    transform_input(&s, images, v, &mut work);
                    let m = &mut m[..POINTS * s.co * t];
                    let grads = &dy[(n0 + j0) * image_out..][..bn * image_out];
                    transform_gradient(&s, grads, m, &mut work);
                    for k in 0..POINTS {
                        gemm(
                            &mut du[k * s.co * s.c..],
                            s.c,
                            true,
                            (s.co, s.c, t),
                            &m[k * s.co * t..],
                            (t, 1),
                            &v[k * s.c * t..],
                            (1, t),
                            par,
                        );
                    }
                }
            });
        }
        du
    };
    let mut partials: Vec<Vec<f32>> = if workers > 1 {
        use rayon::prelude::*;
        (0..workers)
            .into_par_iter()
            .map(|w| partial(w, ::gemm::Parallelism::None))
            .collect()
    } else {
        let par = match threads {
            1 => ::gemm::Parallelism::None,
            t => ::gemm::Parallelism::Rayon(t),
        };
        vec![partial(0, par)]
    };
    let mut total = partials.remove(0);
    for other in partials {
        total.iter_mut().zip(other).for_each(|(a, b)| *a += b);
    }
    filter_gradient(&total, s.co, s.c)
}

/// `Gᵀ dU G` for each filter: `dU` is `[16][co][c]`, the result `[co, c, 3, 3]`.
fn filter_gradient(du: &[f32], co: usize, c: usize) -> Vec<f32> {
    let plane = co * c;
    let mut dw = vec![0.0; plane * 9];
    for (f, out) in dw.chunks_exact_mut(9).enumerate() {
        let x = |r: usize, j: usize| du[(r * 4 + j) * plane + f];
        // Gᵀ X: three rows of four.
        let rows: [[f32; 4]; 3] = std::array::from_fn(|i| {
            std::array::from_fn(|j| match i {
                0 => x(0, j) + 0.5 * (x(1, j) + x(2, j)),
                1 => 0.5 * (x(1, j) - x(2, j)),
                _ => 0.5 * (x(1, j) + x(2, j)) + x(3, j),
            })
        });
        // · G: three columns.
        for (i, [a, b, c, d]) in rows.into_iter().enumerate() {
            out[i * 3] = a + 0.5 * (b + c);
            out[i * 3 + 1] = 0.5 * (b - c);
            out[i * 3 + 2] = 0.5 * (b + c) + d;
        }
    }
    dw
}

/// `dM[k][o][t] = (A dY Aᵀ)[k]` for the 2×2 output-gradient block `dY` of each tile `t`
/// of the band's images (`dy` is `[bn, co, ho, wo]`) and each output channel `o`; blocks
/// cut by the bottom or right edge, and the tile past it, are zero there.
#[inline(always)]
fn transform_gradient_body(s: &Shape, dy: &[f32], m: &mut [f32], work: &mut Work) {
    let (across, span) = (s.across(), s.span());
    let n = s.tiles_per_image();
    let bn = dy.len() / (s.co * s.ho * s.wo);
    let t_len = bn * n;
    let plane = s.co * t_len;
    const NEG: fn(f32, f32) -> f32 = |a, _| -a;
    for (j, image) in dy.chunks_exact(s.co * s.ho * s.wo).enumerate() {
        for (o, src) in image.chunks_exact(s.ho * s.wo).enumerate() {
            // Each tile's block as four runs over the tiles: top row's even and odd
            // columns, bottom row's.
            let [te, to, be, bo] = split4(work.combo, n);
            for q in [&mut *te, &mut *to, &mut *be, &mut *bo] {
                q.fill(0.0);
            }
            let line = &mut *work.line;
            for ty in 0..s.down() {
                for (r, (e, od)) in [(&mut *te, &mut *to), (&mut *be, &mut *bo)]
                    .into_iter()
                    .enumerate()
                {
                    let y = 2 * ty + r;
                    if y >= s.ho {
                        break;
                    }
                    line[..s.wo].copy_from_slice(&src[y * s.wo..][..s.wo]);
                    line[s.wo..2 * across].fill(0.0);
                    let (e, od) = (
                        &mut e[ty * span..][..across],
                        &mut od[ty * span..][..across],
                    );
                    for (pair, (a, b)) in line.chunks_exact(2).zip(e.iter_mut().zip(od)) {
                        *a = pair[0];
                        *b = pair[1];
                    }
                }
            }
            // A along the rows (top, top + bottom, top − bottom, −bottom), then Aᵀ along
            // each, (a, a + b, a − b, −b) for its even and odd columns a and b.
            let base = o * t_len + j * n;
            let [p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15] =
                points(m, plane, base, n);
            let (te, to, be, bo) = (&*te, &*to, &*be, &*bo);
            p0.copy_from_slice(te);
            map2(p1, te, to, ADD);
            map2(p2, te, to, SUB);
            map2(p3, to, to, NEG);
            map2(p4, te, be, ADD);
            map2(p7, to, bo, ADD);
            map2(p5, p4, p7, ADD);
            map2(p6, p4, p7, SUB);
            p7.iter_mut().for_each(|b| *b = -*b);
            map2(p8, te, be, SUB);
            map2(p11, to, bo, SUB);
            map2(p9, p8, p11, ADD);
            map2(p10, p8, p11, SUB);
            p11.iter_mut().for_each(|b| *b = -*b);
            map2(p12, be, be, NEG);
            map2(p13, p12, bo, SUB);
            map2(p14, bo, be, SUB);
            p15.copy_from_slice(bo);
        }
    }
}

/// A stride-1 3×3 convolution: input `[n, c, h, w]` padded by `pad`, output `[n, co, ho,
/// wo]` (`ho = h + 2·pad − 2`).
struct Shape {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    co: usize,
    pad: [usize; 2],
    ho: usize,
    wo: usize,
}

impl Shape {
    /// The convolution `g` itself (its input gradient is another).
    fn of(g: &Geometry) -> Self {
        Shape {
            n: g.n,
            c: g.c,
            h: g.h,
            w: g.w,
            co: g.co,
            pad: g.padding,
            ho: g.ho,
            wo: g.wo,
        }
    }

    /// Tiles in a row of tiles.
    fn across(&self) -> usize {
        self.wo.div_ceil(2)
    }

    /// Rows of tiles.
    fn down(&self) -> usize {
        self.ho.div_ceil(2)
    }

    /// Tiles of an image as laid out: each row of tiles has one more, past the right edge
    /// (computed and dropped), so that a transform is one loop over the whole image.
    fn tiles_per_image(&self) -> usize {
        self.down() * self.span()
    }

    /// Images per band.
    fn band(&self) -> usize {
        let tiles = BAND_FLOATS / (POINTS * self.c.max(self.co));
        (tiles / self.tiles_per_image()).max(1)
    }

    /// Images per task: a band, or fewer so that every thread gets a task.
    fn group(&self, threads: usize) -> usize {
        let fair = self.n.div_ceil(threads.max(1)).max(1);
        self.band().min(fair)
    }

    /// Columns of the even (and of the odd) half of a padded input row.
    fn span(&self) -> usize {
        self.across() + 1
    }

    /// One quarter of a padded input plane (its even or odd rows, even or odd columns),
    /// with one float to spare (the last tile's dropped neighbour reads it).
    fn quarter(&self) -> usize {
        (self.down() + 1) * self.span() + 1
    }
}

/// `U[k][o][ci] = (G g Gᵀ)[k]` for each filter `g = weight[o][ci]` (`[co, c, 3, 3]`).
fn transform_filters(weight: &[f32], co: usize, c: usize) -> Vec<f32> {
    let plane = co * c;
    let mut u = vec![0.0; POINTS * plane];
    for (f, g) in weight.chunks_exact(9).enumerate() {
        // G g: 4 rows of 3, then each row times Gᵀ: 4 columns.
        let rows = [
            [g[0], g[1], g[2]],
            [
                0.5 * (g[0] + g[3] + g[6]),
                0.5 * (g[1] + g[4] + g[7]),
                0.5 * (g[2] + g[5] + g[8]),
            ],
            [
                0.5 * (g[0] - g[3] + g[6]),
                0.5 * (g[1] - g[4] + g[7]),
                0.5 * (g[2] - g[5] + g[8]),
            ],
            [g[6], g[7], g[8]],
        ];
        for (r, [a, b, c]) in rows.into_iter().enumerate() {
            let out = [a, 0.5 * (a + b + c), 0.5 * (a - b + c), c];
            for (j, v) in out.into_iter().enumerate() {
                u[(r * 4 + j) * plane + f] = v;
            }
        }
    }
    u
}

/// The convolution of `x` by the transformed filters `u` (`[16][co][c]`).
fn convolve(s: &Shape, x: &[f32], u: &[f32]) -> Vec<f32> {
    let image_in = s.c * s.h * s.w;
    let image_out = s.co * s.ho * s.wo;
    let mut out = vec![0.0; s.n * image_out];
    let threads = rayon::current_num_threads();
    let size = s.group(threads);
    let per_image = s.tiles_per_image();
    let task = |(i, chunk): (usize, &mut [f32]), par| {
        let n0 = i * size;
        let gn = chunk.len() / image_out;
        let band = s.band().min(gn);
        let t_max = band * per_image;
        with_scratch(|scratch| {
            let (v, m, mut work) = buffers(s, scratch, t_max);
            for j0 in (0..gn).step_by(band) {
                let bn = band.min(gn - j0);
                let t = bn * per_image;
                let images = &x[(n0 + j0) * image_in..][..bn * image_in];
                let v = &mut v[..POINTS * s.c * t];
                transform_input(s, images, v, &mut work);
                let m = &mut m[..POINTS * s.co * t];
                for k in 0..POINTS {
                    gemm(
                        &mut m[k * s.co * t..],
                        t,
                        false,
                        (s.co, t, s.c),
                        &u[k * s.co * s.c..],
                        (s.c, 1),
                        &v[k * s.c * t..],
                        (t, 1),
                        par,
                    );
                }
                let dst = &mut chunk[j0 * image_out..][..bn * image_out];
                transform_output(s, m, dst, &mut work);
            }
        });
    };
    run_tasks(&mut out, size * image_out, threads, task);
    out
}

/// A band's buffers, from the thread's scratch: the transformed input (`[16][c][t]`) and
/// products (`[16][co][t]`) of up to `t_max` tiles, and the transforms' rows.
fn buffers<'a>(
    s: &Shape,
    scratch: &'a mut super::conv_cpu::Scratch,
    t_max: usize,
) -> (&'a mut [f32], &'a mut [f32], Work<'a>) {
    let [v, m, quarters, line, combo] = scratch.split([
        POINTS * s.c * t_max,
        POINTS * s.co * t_max,
        4 * s.quarter(),
        2 * s.span(),
        12 * (s.tiles_per_image() + 1),
    ]);
    let work = Work {
        quarters,
        line,
        combo,
    };
    (v, m, work)
}

/// Scratch rows: a padded input plane split into its even and odd columns
/// (`rows × span` each), and one padded line.
struct Work<'a> {
    /// A padded input plane in quarters: even rows' even columns, even rows' odd columns,
    /// odd rows' even columns, odd rows' odd columns.
    quarters: &'a mut [f32],
    /// One padded input line.
    line: &'a mut [f32],
    /// Twelve rows of an image's tiles (and one float): the input's combined rows, or the
    /// output's columns and rows.
    combo: &'a mut [f32],
}

/// `V[k][ci][t] = (Bᵀ d B)[k]` for the 4×4 input patch `d` of each tile `t` of the band's
/// images (`[bn, c, h, w]`, tiles numbered image by image, row by row) and each channel
/// `ci`; zeros where a patch reaches into the padding or past the edge.
#[inline(always)]
fn transform_input_body(s: &Shape, images: &[f32], v: &mut [f32], work: &mut Work) {
    let span = s.span();
    let per_image = s.tiles_per_image();
    let bn = images.len() / (s.c * s.h * s.w);
    let t_len = bn * per_image;
    let plane = s.c * t_len;
    let (pad_y, pad_x) = (s.pad[0], s.pad[1]);
    let quarter = s.quarter();
    for (j, image) in images.chunks_exact(s.c * s.h * s.w).enumerate() {
        for (ci, src) in image.chunks_exact(s.h * s.w).enumerate() {
            // The padded plane in quarters: padded row y is row y / 2 of the even-row or the
            // odd-row quarters.
            let line = &mut *work.line;
            line.fill(0.0);
            work.quarters.fill(0.0);
            let [ee, eo, oe, oo] = split4(work.quarters, quarter);
            for y in 0..2 * s.down() + 2 {
                let Some(r) = y.checked_sub(pad_y).filter(|&r| r < s.h) else {
                    continue;
                };
                let end = (pad_x + s.w).min(line.len());
                line[pad_x..end].copy_from_slice(&src[r * s.w..][..end - pad_x]);
                let (e, o) = if y % 2 == 0 {
                    (&mut *ee, &mut *eo)
                } else {
                    (&mut *oe, &mut *oo)
                };
                let at = (y / 2) * span;
                let (e, o) = (&mut e[at..][..span], &mut o[at..][..span]);
                for ((e, o), pair) in e.iter_mut().zip(o).zip(line.chunks_exact(2)) {
                    *e = pair[0];
                    *o = pair[1];
                }
            }
            // Bᵀ over all rows of tiles at once: tile row ty's input rows are even row ty,
            // odd row ty, even row ty + 1, odd row ty + 1, so its combined rows
            // (d0 − d2, d1 + d2, d2 − d1, d1 − d3) are whole-quarter loops, `span` apart.
            let n = per_image;
            let (ce, co) = work.combo.split_at_mut(4 * (n + 1));
            for ((even_rows, odd_rows), combined) in
                [(&*ee, &*oe), (&*eo, &*oo)].into_iter().zip([ce, co])
            {
                let mut rows = combined.chunks_exact_mut(n + 1);
                let (d0, d1) = (&even_rows[..n], &odd_rows[..n]);
                let (d2, d3) = (&even_rows[span..][..n], &odd_rows[span..][..n]);
                for (a, b, f) in [(d0, d2, SUB), (d1, d2, ADD), (d2, d1, SUB), (d1, d3, SUB)] {
                    let out = rows.next().expect("four rows");
                    map2(&mut out[..n], a, b, f);
                    out[n] = 0.0;
                }
            }
            // B along each combined row, all tiles at once: for columns (e0, o0, e1, o1),
            // (e0 − e1, o0 + e1, e1 − o0, o0 − o1).
            let base = ci * t_len + j * per_image;
            let mut dst = points(v, plane, base, n).into_iter();
            let (ce, co) = work.combo.split_at(4 * (n + 1));
            for (e, o) in ce.chunks_exact(n + 1).zip(co.chunks_exact(n + 1)) {
                let mut next = || dst.next().expect("16 points");
                let (v0, v1, v2, v3) = (next(), next(), next(), next());
                let (e0, e1, o0, o1) = (&e[..n], &e[1..], &o[..n], &o[1..]);
                map2(v0, e0, e1, SUB);
                map2(v1, o0, e1, ADD);
                map2(v2, e1, o0, SUB);
                map2(v3, o0, o1, SUB);
            }
        }
    }
}

/// `buf`'s first four runs of `len`.
fn split4(buf: &mut [f32], len: usize) -> [&mut [f32]; 4] {
    let (a, rest) = buf.split_at_mut(len);
    let (b, rest) = rest.split_at_mut(len);
    let (c, d) = rest.split_at_mut(len);
    [a, b, c, &mut d[..len]]
}

const ADD: fn(f32, f32) -> f32 = |a, b| a + b;
const SUB: fn(f32, f32) -> f32 = |a, b| a - b;

/// `out[i] = f(a[i], b[i])` over `out`'s length (a loop the compiler vectorizes).
#[inline(always)]
fn map2(out: &mut [f32], a: &[f32], b: &[f32], f: fn(f32, f32) -> f32) {
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = f(*x, *y);
    }
}

/// `out[i] = f(a[i], b[i], c[i])`.
#[inline(always)]
fn map3(out: &mut [f32], a: &[f32], b: &[f32], c: &[f32], f: fn(f32, f32, f32) -> f32) {
    for (o, (x, (y, z))) in out.iter_mut().zip(a.iter().zip(b.iter().zip(c))) {
        *o = f(*x, *y, *z);
    }
}

/// The 16 rows of `v` `plane` apart, each `len` long from `offset`.
fn points(v: &mut [f32], plane: usize, offset: usize, len: usize) -> [&mut [f32]; POINTS] {
    let mut rest = &mut v[offset..];
    std::array::from_fn(|k| {
        let taken = std::mem::take(&mut rest);
        let (row, tail) = taken.split_at_mut(if k + 1 < POINTS { plane } else { len });
        rest = tail;
        &mut row[..len]
    })
}

/// The output blocks `Aᵀ m A` of each tile from its products `m` (`[16][co][t]`), written
/// into the band's output `[bn, co, ho, wo]` (cut at the bottom and right edges).
#[inline(always)]
fn transform_output_body(s: &Shape, m: &[f32], out: &mut [f32], work: &mut Work) {
    let (across, span) = (s.across(), s.span());
    let n = s.tiles_per_image();
    let bn = out.len() / (s.co * s.ho * s.wo);
    let t_len = bn * n;
    let plane = s.co * t_len;
    const TOP: fn(f32, f32, f32) -> f32 = |a, b, c| a + b + c;
    const BOTTOM: fn(f32, f32, f32) -> f32 = |a, b, c| a - b - c;
    let (cols, rest) = work.combo.split_at_mut(8 * n);
    let line = &mut *work.line;
    for (j, image) in out.chunks_exact_mut(s.co * s.ho * s.wo).enumerate() {
        for (o, dst) in image.chunks_exact_mut(s.ho * s.wo).enumerate() {
            let base = o * t_len + j * n;
            let p = |k: usize| &m[k * plane + base..][..n];
            // Aᵀ m: for each of a tile's four columns c, its top row p_c + p_4+c + p_8+c and
            // its bottom row p_4+c − p_8+c − p_12+c, over every tile at once.
            for (i, q) in cols.chunks_exact_mut(n).enumerate() {
                let c = i % 4;
                if i < 4 {
                    map3(q, p(c), p(4 + c), p(8 + c), TOP);
                } else {
                    map3(q, p(4 + c), p(8 + c), p(12 + c), BOTTOM);
                }
            }
            // · A along each: the block's even and odd output columns, (q0 + q1 + q2,
            // q1 − q2 − q3), for its top and its bottom row.
            let [top_e, top_o, bot_e, bot_o] = split4(rest, n);
            let q = |i: usize| &cols[i * n..][..n];
            map3(top_e, q(0), q(1), q(2), TOP);
            map3(top_o, q(1), q(2), q(3), BOTTOM);
            map3(bot_e, q(4), q(5), q(6), TOP);
            map3(bot_o, q(5), q(6), q(7), BOTTOM);
            // Interleaved into the output rows, the tile past the right edge dropped.
            for ty in 0..s.down() {
                for (r, (e, od)) in [(&*top_e, &*top_o), (&*bot_e, &*bot_o)]
                    .into_iter()
                    .enumerate()
                {
                    let y = 2 * ty + r;
                    if y >= s.ho {
                        break;
                    }
                    let (e, od) = (&e[ty * span..][..across], &od[ty * span..][..across]);
                    for (pair, (a, b)) in line.chunks_exact_mut(2).zip(e.iter().zip(od)) {
                        pair[0] = *a;
                        pair[1] = *b;
                    }
                    dst[y * s.wo..][..s.wo].copy_from_slice(&line[..s.wo]);
                }
            }
        }
    }
}

/// Runs `$body` compiled for the widest vector instructions this CPU has (AVX-512, else
/// AVX2, else the build's baseline, SSE2 on x86-64), chosen at run time as the gemm crate
/// chooses its kernels: the transforms are loops the compiler vectorizes, 16 floats at a
/// time with AVX-512 against 4 with the baseline. They add and subtract only, so every
/// choice gives the same bits.
macro_rules! widest {
    ($name:ident => $body:ident($($arg:ident: $ty:ty),*)) => {
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked just above).
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked just above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

widest!(transform_input => transform_input_body(s: &Shape, images: &[f32], v: &mut [f32], work: &mut Work));
widest!(transform_output => transform_output_body(s: &Shape, m: &[f32], out: &mut [f32], work: &mut Work));
widest!(transform_gradient => transform_gradient_body(s: &Shape, dy: &[f32], m: &mut [f32], work: &mut Work));
