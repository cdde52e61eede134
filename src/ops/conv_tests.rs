//! The CPU convolution against Burn's own (Flex's forward, Burn's generic gradients), in the
//! output and both gradients, on random inputs of many shapes: odd sizes, strides 1–3, 1×1,
//! 5×3 and 7×7 kernels, padding 0 and more than the kernel's half, dilation, batches of one
//! and of 33 small images, and thread pools of 1, 2 and 3, so every path runs (per image in
//! bands, grouped images, parallel gemm, im2col and im2row, the contiguous-run fast path,
//! and Winograd's for the 3×3 stride-1 ones with channels and tiles enough).
//!
//! Tolerance: |ours − Burn's| ≤ 1e-5 · max(1, max |Burn's|) per tensor. Both sum the same
//! products in float32 in different orders; the largest error seen over these cases is
//! printed by the test (up to about 2e-6 relative).

use burn::backend::{Autodiff, Flex};
use burn::tensor::module::conv2d as burn_conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::Tensor;

use super::conv2d;

type B = Autodiff<Flex>;

/// (input `[n, c, h, w]`, output channels, kernel `[kh, kw]`, stride, padding, dilation)
type Case = (
    [usize; 4],
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 2],
);

const CASES: &[Case] = &[
    ([2, 3, 9, 7], 5, [3, 3], [1, 1], [1, 1], [1, 1]),
    ([3, 4, 11, 13], 6, [3, 3], [2, 2], [1, 1], [1, 1]),
    ([2, 8, 10, 10], 4, [1, 1], [1, 1], [0, 0], [1, 1]),
    ([5, 6, 9, 9], 7, [1, 1], [2, 2], [0, 0], [1, 1]),
    // A strided 1×1 whose taps miss the last row and column (ResNet's downsampling
    // shortcut on an even map): their input gradient is zero.
    ([2, 4, 6, 6], 8, [1, 1], [2, 2], [0, 0], [1, 1]),
    ([1, 3, 17, 15], 8, [7, 7], [2, 2], [3, 3], [1, 1]),
    ([2, 5, 8, 12], 3, [3, 5], [1, 3], [0, 2], [1, 1]),
    ([3, 2, 12, 12], 4, [3, 3], [1, 1], [2, 2], [2, 2]),
    ([4, 3, 6, 6], 2, [3, 3], [3, 2], [4, 1], [1, 2]),
    ([1, 1, 5, 5], 1, [5, 5], [1, 1], [0, 0], [1, 1]),
    ([33, 4, 4, 4], 8, [3, 3], [1, 1], [1, 1], [1, 1]),
    ([7, 16, 2, 2], 9, [3, 3], [1, 1], [1, 1], [1, 1]),
    // As wide as the input but shorter, and dilated along the width only.
    ([2, 3, 7, 6], 4, [3, 3], [1, 1], [0, 1], [1, 1]),
    ([2, 3, 5, 9], 2, [1, 3], [1, 1], [0, 2], [1, 2]),
    ([2, 2, 6, 5], 3, [5, 3], [1, 1], [1, 1], [1, 1]),
    // Maps of more than one band of output rows (`BAND_COLUMNS`), the last one shorter.
    ([2, 2, 40, 30], 3, [3, 3], [1, 1], [1, 1], [1, 1]),
    ([1, 2, 70, 50], 2, [3, 3], [2, 2], [1, 1], [1, 1]),
    ([1, 3, 33, 33], 4, [1, 1], [1, 1], [0, 0], [1, 1]),
    // A last band of one row, bands wholly in the top or bottom padding, and kernel
    // columns that read only padding.
    ([1, 2, 33, 32], 3, [3, 3], [1, 1], [1, 1], [1, 1]),
    ([1, 1, 3, 600], 2, [5, 5], [1, 1], [2, 2], [1, 1]),
    ([1, 1, 3, 1], 2, [1, 5], [2, 1], [0, 2], [1, 1]),
    ([1, 1, 1, 1], 2, [1, 6], [1, 1], [0, 3], [1, 1]),
    // Winograd's (3×3, stride 1, 16 channels or more, 16 tiles or more): odd sizes (a
    // last row and column of tiles half outside), padding 0, 1 and 2 and a different one
    // per axis, and a batch in bands of several images.
    ([2, 16, 9, 7], 17, [3, 3], [1, 1], [1, 1], [1, 1]),
    ([3, 16, 10, 10], 16, [3, 3], [1, 1], [0, 0], [1, 1]),
    ([1, 20, 11, 13], 18, [3, 3], [1, 1], [2, 2], [1, 1]),
    ([2, 16, 12, 9], 24, [3, 3], [1, 1], [0, 2], [1, 1]),
    ([33, 16, 8, 8], 16, [3, 3], [1, 1], [1, 1], [1, 1]),
];

/// Largest |a − b| over max(1, max |b|).
fn relative_error(a: Tensor<Flex, 4>, b: Tensor<Flex, 4>) -> f32 {
    let scale = b.clone().abs().max().into_scalar().max(1.0);
    (a - b).abs().max().into_scalar() / scale
}

fn check(case: &Case) -> f32 {
    let (dims, co, kernel, stride, padding, dilation) = *case;
    let options = ConvOptions::new(stride, padding, dilation, 1);
    let x0 = uniform(dims, 1);
    let w0 = uniform([co, dims[1], kernel[0], kernel[1]], 2);
    // The runner's kernels, not Burn's, must be what runs here.
    let (xp, wp) = (
        x0.clone().into_primitive().tensor(),
        w0.clone().into_primitive().tensor(),
    );
    assert!(
        super::conv::cpu_geometry(&xp, &wp, &options).is_some(),
        "{case:?} falls back to Burn's kernels"
    );

    let run = |ours: bool| {
        let x = Tensor::<B, 4>::from_inner(x0.clone()).require_grad();
        let w = Tensor::<B, 4>::from_inner(w0.clone()).require_grad();
        let y = if ours {
            conv2d(x.clone(), w.clone(), options.clone())
        } else {
            burn_conv2d(x.clone(), w.clone(), None, options.clone())
        };
        // A weighted sum, so every output element gets its own gradient.
        let r = Tensor::<B, 4>::from_inner(pattern(y.dims()));
        let grads = (y.clone() * r).sum().backward();
        let dx = x.grad(&grads).expect("x is tracked");
        let dw = w.grad(&grads).expect("w is tracked");
        (y.inner(), dx, dw)
    };
    let (y, dx, dw) = run(true);
    let (y_ref, dx_ref, dw_ref) = run(false);
    assert_eq!(y.dims(), y_ref.dims(), "{case:?}: output shape");
    [
        relative_error(y, y_ref),
        relative_error(dx, dx_ref),
        relative_error(dw, dw_ref),
    ]
    .into_iter()
    .fold(0.0, f32::max)
}

/// A fixed pattern in ±1 shaped `dims`.
fn pattern(dims: [usize; 4]) -> Tensor<Flex, 4> {
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
        .collect();
    Tensor::from_data(
        burn::tensor::TensorData::new(values, dims),
        &Default::default(),
    )
}

/// Values in ±1 from a fixed seed (Burn's generator is process-wide, shared by the tests
/// running in parallel, so it would not repeat).
fn uniform(dims: [usize; 4], seed: u64) -> Tensor<Flex, 4> {
    let mut rng = crate::rng::SplitMix64::new(seed ^ dims.iter().product::<usize>() as u64);
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect();
    Tensor::from_data(
        burn::tensor::TensorData::new(values, dims),
        &Default::default(),
    )
}

#[test]
fn matches_burn_in_output_and_both_gradients() {
    let winograd = CASES
        .iter()
        .filter(|(x, co, k, stride, padding, dilation)| {
            let g = super::conv_cpu::Geometry::new(
                *x,
                [*co, x[1], k[0], k[1]],
                *stride,
                *padding,
                *dilation,
            );
            g.is_some_and(|g| super::winograd::suits(&g))
        })
        .count();
    assert_eq!(winograd, 5, "the cases that take Winograd's path");
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let worst = pool.install(|| {
            CASES
                .iter()
                .map(|case| {
                    let err = check(case);
                    assert!(
                        err <= 1e-5,
                        "{case:?} on {threads} threads: relative error {err}"
                    );
                    err
                })
                .fold(0.0, f32::max)
        });
        eprintln!("{threads} threads: largest relative error {worst:e}");
    }
}

#[test]
fn grouped_convolutions_fall_back_to_burn() {
    // Two groups are Burn's kernels; they must equal each group convolved on its own
    // (which runs the runner's kernels).
    let x = uniform([2, 4, 6, 6], 3);
    let w = uniform([6, 2, 3, 3], 4);
    let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
    let (xp, wp) = (
        x.clone().into_primitive().tensor(),
        w.clone().into_primitive().tensor(),
    );
    assert!(super::conv::cpu_geometry(&xp, &wp, &grouped).is_none());
    let ours = conv2d(x.clone(), w.clone(), grouped);
    let single = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let per_group = |g: usize| {
        let xg = x.clone().narrow(1, 2 * g, 2);
        let wg = w.clone().narrow(0, 3 * g, 3);
        conv2d(xg, wg, single.clone())
    };
    let expected = Tensor::cat(vec![per_group(0), per_group(1)], 1);
    let err = relative_error(ours, expected);
    assert!(
        err <= 1e-5,
        "grouped against per-group: relative error {err}"
    );
}
