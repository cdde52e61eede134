//! `cargo bench --bench conv`: the CPU convolution (src/ops/conv_cpu.rs) layer by layer, on the
//! 20 convolutions of a ResNet-18 with the CIFAR stem at batch 32 (or ResNet-50's 53 with
//! `-- resnet50 16`): milliseconds for the forward, the input gradient and the weight
//! gradient, median of 5 after one warm-up, and their sums. `scripts/torch_conv.py` prints
//! the same table for PyTorch's CPU convolution; BENCHMARKS.md sets them side by side.
//!
//! `im2col` as the last argument sends the 3×3 stride-1 layers through im2col + gemm too
//! (what they took before the Winograd path); `compare` times both paths of the forward
//! pass and both gradients alternately, the fastest of 9 calls each (on a noisy machine
//! the minimum is the steadiest figure), with their ratio.
//!
//!   cargo bench --bench conv [-- resnet18|resnet50 [BATCH [THREADS]]] [im2col|compare]

use std::time::Instant;

use runner::ops::conv_cpu::{self as cpu, Geometry};

/// (input channels, output channels, kernel, stride, input side)
type Layer = (usize, usize, usize, usize, usize);

fn resnet18() -> Vec<Layer> {
    let mut layers = vec![(3, 64, 3, 1, 32)];
    let mut side = 32;
    let mut cin = 64;
    for (i, width) in [64, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let stride = if i > 0 && block == 0 { 2 } else { 1 };
            layers.push((cin, width, 3, stride, side));
            if stride == 2 {
                layers.push((cin, width, 1, 2, side));
                side /= 2;
            }
            layers.push((width, width, 3, 1, side));
            cin = width;
        }
    }
    layers
}

fn resnet50() -> Vec<Layer> {
    let mut layers = vec![(3, 64, 3, 1, 32)];
    let mut side = 32;
    let mut cin = 64;
    for (i, (width, blocks)) in [(64, 3), (128, 4), (256, 6), (512, 3)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let stride = if i > 0 && block == 0 { 2 } else { 1 };
            layers.push((cin, width, 1, 1, side));
            layers.push((width, width, 3, stride, side));
            if block == 0 {
                layers.push((cin, width * 4, 1, stride, side));
            }
            side /= stride;
            layers.push((width, width * 4, 1, 1, side));
            cin = width * 4;
        }
    }
    layers
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[2]
}

/// The layer's geometry and inputs (deterministic patterns).
fn inputs(
    batch: usize,
    (cin, cout, k, s, side): Layer,
) -> (Geometry, Vec<f32>, Vec<f32>, Vec<f32>) {
    let pad = k / 2;
    let g = Geometry::new(
        [batch, cin, side, side],
        [cout, cin, k, k],
        [s, s],
        [pad, pad],
        [1, 1],
    )
    .expect("valid layer");
    let x = (0..batch * cin * side * side)
        .map(|i| (i % 97) as f32 / 97.0)
        .collect();
    let w = (0..cout * cin * k * k)
        .map(|i| (i % 89) as f32 / 89.0)
        .collect();
    let dy = (0..g.out_len()).map(|i| (i % 83) as f32 / 83.0).collect();
    (g, x, w, dy)
}

/// `compare`: im2col + gemm against the runner's path, layer by layer.
fn compare_paths(model: &str, layers: &[Layer], batch: usize, threads: usize) {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    println!("# {model}, batch {batch}, {threads} threads: ms per call, fastest of 9, the two paths alternating");
    println!("| layer | cin→cout | k | s | side | forward im2col | forward runner | ratio | dx im2col | dx runner | ratio | dw im2col | dw runner | ratio |");
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let row = |best: &[f64; 6], prec: usize| {
        (0..3)
            .map(|p| {
                format!(
                    "{:.prec$} | {:.prec$} | {:.2}",
                    best[2 * p],
                    best[2 * p + 1],
                    best[2 * p] / best[2 * p + 1]
                )
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let mut total = [0.0; 6];
    for (i, &layer) in layers.iter().enumerate() {
        let (g, x, w, dy) = inputs(batch, layer);
        let mut best = [f64::MAX; 6];
        for _ in 0..9 {
            let t = [
                time(&mut || drop(cpu::forward_im2col(&g, &x, &w))),
                time(&mut || drop(cpu::forward(&g, &x, &w))),
                time(&mut || drop(cpu::backward_x_im2col(&g, &w, &dy))),
                time(&mut || drop(cpu::backward_x(&g, &w, &dy))),
                time(&mut || drop(cpu::backward_weight_im2col(&g, &x, &dy))),
                time(&mut || drop(cpu::backward_weight(&g, &x, &dy))),
            ];
            for (b, t) in best.iter_mut().zip(t) {
                *b = b.min(t);
            }
        }
        let (cin, cout, k, s, side) = layer;
        println!(
            "| {i} | {cin}→{cout} | {k} | {s} | {side} | {} |",
            row(&best, 2)
        );
        for (sum, b) in total.iter_mut().zip(best) {
            *sum += b;
        }
    }
    println!("| all | | | | | {} |", row(&total, 1));
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let im2col = args.last().is_some_and(|a| a == "im2col");
    let compare = args.last().is_some_and(|a| a == "compare");
    if im2col || compare {
        args.pop();
    }
    let model = args.first().map(String::as_str).unwrap_or("resnet18");
    let batch: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(32);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("the first pool");
    let layers = match model {
        "resnet18" => resnet18(),
        "resnet50" => resnet50(),
        other => panic!("unknown model {other}: resnet18 or resnet50"),
    };
    if compare {
        return compare_paths(model, &layers, batch, threads);
    }
    let path = if im2col {
        "im2col + gemm only"
    } else {
        "as the runner runs"
    };
    println!("# {model}, batch {batch}, {threads} threads, {path}: ms per call (median of 5)");
    println!("| layer | cin→cout | k | s | side | forward | dx | dw |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut total = [0.0; 3];
    for (i, &layer) in layers.iter().enumerate() {
        let (cin, cout, k, s, side) = layer;
        let (g, x, w, dy) = inputs(batch, layer);
        let t = [
            median_ms(|| {
                drop(if im2col {
                    cpu::forward_im2col(&g, &x, &w)
                } else {
                    cpu::forward(&g, &x, &w)
                })
            }),
            median_ms(|| {
                drop(if im2col {
                    cpu::backward_x_im2col(&g, &w, &dy)
                } else {
                    cpu::backward_x(&g, &w, &dy)
                })
            }),
            median_ms(|| {
                drop(if im2col {
                    cpu::backward_weight_im2col(&g, &x, &dy)
                } else {
                    cpu::backward_weight(&g, &x, &dy)
                })
            }),
        ];
        println!(
            "| {i} | {cin}→{cout} | {k} | {s} | {side} | {:.2} | {:.2} | {:.2} |",
            t[0], t[1], t[2]
        );
        for (sum, t) in total.iter_mut().zip(t) {
            *sum += t;
        }
    }
    println!(
        "| all | | | | | {:.1} | {:.1} | {:.1} |\n\ntotal {:.1} ms",
        total[0],
        total[1],
        total[2],
        total.iter().sum::<f64>()
    );
}
