//! Deterministic synthetic images: each class is a fixed random pattern (low-frequency
//! blobs), each sample that pattern plus per-pixel noise, so a model can learn it and
//! throughput runs need no files. The same (seed, split, index) always gives the same sample.

use super::spec::ImagePlan;
use super::Images;
use crate::rng::SplitMix64;

/// `n` samples of split `split` (0 train, 1 test); labels cycle through the classes.
pub fn generate(image: &ImagePlan, k: usize, n: usize, seed: u64, split: u64) -> Images {
    let (c, h, w) = (image.channels, image.height, image.width);
    let per = c * h * w;
    let root = SplitMix64::new(seed ^ 0x5EED_DA7A);
    // Class patterns: a coarse 4×4 grid per channel, upsampled, values in 40..215.
    let patterns: Vec<Vec<f32>> = (0..k)
        .map(|class| {
            let mut r = root.fork(class as u64);
            let grid: Vec<f32> = (0..c * 16).map(|_| 40.0 + 175.0 * r.unit()).collect();
            let mut p = vec![0f32; per];
            for ch in 0..c {
                for y in 0..h {
                    for x in 0..w {
                        let (gy, gx) = (y * 4 / h, x * 4 / w);
                        p[ch * h * w + y * w + x] = grid[ch * 16 + gy * 4 + gx];
                    }
                }
            }
            p
        })
        .collect();
    let mut pixels = Vec::with_capacity(n * per);
    let mut labels = Vec::with_capacity(n);
    let split_rng = root.fork(1_000_003 + split);
    for i in 0..n {
        let label = i % k;
        let mut r = split_rng.fork(i as u64);
        for &v in &patterns[label] {
            let noise = (r.unit() - 0.5) * 120.0;
            pixels.push((v + noise).clamp(0.0, 255.0) as u8);
        }
        labels.push(label as u32);
    }
    Images {
        channels: c,
        height: h,
        width: w,
        pixels,
        labels,
    }
}
