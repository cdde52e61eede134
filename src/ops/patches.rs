//! The column matrices of the CPU convolution ([`super::conv_cpu`]): im2col (one row per
//! input channel and kernel tap, one column per output position), its adjoint col2im,
//! im2row (one row per output position, from a channels-last image) and a tiled transpose;
//! with the fast path for "same" stride-1 convolutions, where a tap's entries for a band of
//! output rows are one shifted run of the input plane.

use std::ops::Range;

use super::conv_cpu::Geometry;

impl Geometry {
    /// Stride 1 with the output as wide as the input (the "same" 3×3 convolutions): tap
    /// (i, ·)'s entries for output rows `rows` are then one contiguous run of the input
    /// plane, shifted by `offset` columns. `None` otherwise. `lines` are the band entries
    /// whose input row exists (whole output lines); `copy` ⊆ `lines` those whose shifted
    /// index falls inside the plane, read from `src..`. Within `lines`, entries outside
    /// [`valid`] columns wrap onto the neighbouring input line, so callers zero those.
    fn run(&self, rows: &Range<usize>, i: usize, offset: isize) -> Option<Run> {
        if self.stride != [1, 1] || self.wo != self.w {
            return None;
        }
        let wo = self.wo as isize;
        let shift = (i * self.dilation[0]) as isize - self.padding[0] as isize;
        // Output rows whose input row exists, within the band (a band can lie wholly in
        // the top or bottom padding: then there are none).
        let (start, end) = (rows.start as isize, rows.end as isize);
        let first = (-shift).clamp(start, end);
        let last = (self.h as isize - shift).clamp(first, end);
        let lines = (first - start) * wo..(last - start) * wo;
        let mut copy = lines.clone();
        let mut src = (first + shift) * wo + offset;
        if src < 0 {
            copy.start -= src;
            src = 0;
        }
        let overflow = src + (copy.end - copy.start) - (self.h * self.w) as isize;
        copy.end -= overflow.max(0);
        let lines = lines.start as usize..lines.end as usize;
        if copy.start >= copy.end {
            // Nothing to copy (all padding): an empty run where the lines start.
            let at = lines.start;
            return Some(Run {
                lines,
                copy: at..at,
                src: 0,
            });
        }
        Some(Run {
            lines,
            copy: copy.start as usize..copy.end as usize,
            src: src as usize,
        })
    }
}

/// See [`Geometry::run`].
struct Run {
    lines: Range<usize>,
    copy: Range<usize>,
    src: usize,
}

/// Output rows `rows` of one image's patches, one output position per row: `out` is
/// `rows.len()·wo × k` row-major, taps in (kh, kw, c) order, read from `image_t`, the
/// image in channels-last layout (`h × w × c`); 0 outside the image.
pub(super) fn im2row(g: &Geometry, image_t: &[f32], rows: Range<usize>, out: &mut [f32]) {
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let (c, k) = (g.c, g.k());
    for (r, oh) in rows.enumerate() {
        for ow in 0..g.wo {
            let row = &mut out[(r * g.wo + ow) * k..][..k];
            for i in 0..g.kh {
                let ih = (oh * sh + i * dh) as isize - ph as isize;
                let taps = &mut row[i * g.kw * c..][..g.kw * c];
                if ih < 0 || ih >= g.h as isize {
                    taps.fill(0.0);
                    continue;
                }
                for (j, tap) in taps.chunks_exact_mut(c).enumerate() {
                    let iw = (ow * sw + j * dw) as isize - pw as isize;
                    if iw < 0 || iw >= g.w as isize {
                        tap.fill(0.0);
                    } else {
                        let at = (ih as usize * g.w + iw as usize) * c;
                        tap.copy_from_slice(&image_t[at..][..c]);
                    }
                }
            }
        }
    }
}

/// The output columns `[lo, hi)` whose input column `ow·stride + offset` lies in `0..size`.
fn valid(out: usize, size: usize, stride: usize, offset: isize) -> (usize, usize) {
    let lo = if offset >= 0 {
        0
    } else {
        (-offset as usize).div_ceil(stride)
    };
    let end = size as isize - offset;
    let hi = if end <= 0 {
        0
    } else {
        (end as usize).div_ceil(stride)
    };
    (lo.min(out), hi.min(out).max(lo.min(out)))
}

/// Zeroes `line[..lo]` and `line[hi..]`: usually one entry each (a 3×3 kernel's padding),
/// stored directly, since a `fill` becomes a call to `memset` per line (a tenth of the
/// column work on 32×32 maps).
#[inline(always)]
fn zero_edges(line: &mut [f32], lo: usize, hi: usize) {
    match lo {
        0 => {}
        1 => line[0] = 0.0,
        _ => line[..lo].fill(0.0),
    }
    let n = line.len();
    match n - hi {
        0 => {}
        1 => line[n - 1] = 0.0,
        _ => line[hi..].fill(0.0),
    }
}

/// Output rows `rows` of one image's patches into `col`, a `k × ld` row-major matrix, at
/// column `off`: row `(c·kh + i)·kw + j`, column `off + (oh − rows.start)·wo + ow` holds
/// `x[c, oh·sh + i·dh − ph, ow·sw + j·dw − pw]`, 0 outside the image.
pub(super) fn im2col(
    g: &Geometry,
    x: &[f32],
    rows: Range<usize>,
    col: &mut [f32],
    ld: usize,
    off: usize,
) {
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let width = rows.len() * g.wo;
    for c in 0..g.c {
        let plane = &x[c * g.h * g.w..][..g.h * g.w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let r = (c * g.kh + i) * g.kw + j;
                let row = &mut col[r * ld + off..][..width];
                let offset = (j * dw) as isize - pw as isize;
                let (lo, hi) = valid(g.wo, g.w, sw, offset);
                if let Some(run) = g.run(&rows, i, offset) {
                    row[..run.lines.start].fill(0.0);
                    row[run.lines.end..].fill(0.0);
                    row[run.copy.clone()].copy_from_slice(&plane[run.src..][..run.copy.len()]);
                    for line in row[run.lines].chunks_exact_mut(g.wo) {
                        zero_edges(line, lo, hi);
                    }
                    continue;
                }
                for (band_row, oh) in rows.clone().enumerate() {
                    let dst = &mut row[band_row * g.wo..][..g.wo];
                    let ih = (oh * sh + i * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        dst.fill(0.0);
                        continue;
                    }
                    let src = &plane[ih as usize * g.w..][..g.w];
                    zero_edges(dst, lo, hi);
                    if lo == hi {
                        continue; // this tap reads only padding on this line
                    }
                    let start = ((lo * sw) as isize + offset) as usize;
                    if sw == 1 {
                        dst[lo..hi].copy_from_slice(&src[start..][..hi - lo]);
                    } else {
                        for (d, s) in dst[lo..hi].iter_mut().zip(src[start..].iter().step_by(sw)) {
                            *d = *s;
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: adds each column entry back onto the pixel it was read from.
pub(super) fn col2im(
    g: &Geometry,
    col: &mut [f32],
    rows: Range<usize>,
    ld: usize,
    off: usize,
    dx: &mut [f32],
) {
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let width = rows.len() * g.wo;
    for c in 0..g.c {
        let plane = &mut dx[c * g.h * g.w..][..g.h * g.w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let r = (c * g.kh + i) * g.kw + j;
                let row = &mut col[r * ld + off..][..width];
                let offset = (j * dw) as isize - pw as isize;
                let (lo, hi) = valid(g.wo, g.w, sw, offset);
                if let Some(run) = g.run(&rows, i, offset) {
                    // Entries read from outside the image would land on a neighbouring
                    // row's pixel in one contiguous add: zero them first (the buffer is
                    // scratch), then add the whole run at once.
                    for line in row[run.lines].chunks_exact_mut(g.wo) {
                        zero_edges(line, lo, hi);
                    }
                    let src = &row[run.copy];
                    let dst = &mut plane[run.src..][..src.len()];
                    dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                    continue;
                }
                for (band_row, oh) in rows.clone().enumerate() {
                    let ih = (oh * sh + i * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        continue;
                    }
                    if lo == hi {
                        continue; // this tap read only padding on this line
                    }
                    let src = &row[band_row * g.wo..][..g.wo];
                    let dst = &mut plane[ih as usize * g.w..][..g.w];
                    let start = ((lo * sw) as isize + offset) as usize;
                    if sw == 1 {
                        dst[start..][..hi - lo]
                            .iter_mut()
                            .zip(&src[lo..hi])
                            .for_each(|(d, s)| *d += s);
                    } else {
                        for (d, s) in dst[start..].iter_mut().step_by(sw).zip(&src[lo..hi]) {
                            *d += s;
                        }
                    }
                }
            }
        }
    }
}

/// `dst` (`cols × rows`, row-major) = `src` (`rows × cols`, row-major) transposed, in
/// tiles that stay in L1.
pub(super) fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const TILE: usize = 32;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
}
