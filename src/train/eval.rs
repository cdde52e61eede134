//! Evaluation without autodiff: accuracy and mean loss over a set, and over saved weights.

use burn::tensor::activation::log_softmax;

use super::*;

/// Evaluates saved weights (`checkpoint::save_weights`) on all of `test`, without
/// autodiff: what `runner eval` reports.
pub fn evaluate_weights<B: TrainBackend>(
    plan: &Plan,
    batcher: &Batcher,
    test: &Dataset,
    weights: &std::path::Path,
    device: &B::Device,
) -> Result<EvalRecord, String> {
    let fresh: Net<B::InnerBackend> = Net::new(&plan.model, batcher.shape, plan.seed, device);
    let model = checkpoint::load_weights(fresh, weights)?;
    let all: Vec<usize> = (0..test.len()).collect();
    Ok(evaluate(&model, test, &all, batcher, plan, device))
}

/// `idx` in evaluation batches of `batch_size`, each with how many of its rows are its own.
/// A last, shorter batch is filled up to `batch_size` with copies of its first sample,
/// which scoring masks out: every evaluation batch then has the training batch's shape (a
/// copied row is no longer than the batch's longest, so text keeps its padded length),
/// down to the loss and accuracy reductions, and on CUDA evaluation compiles and tunes no
/// kernels of its own; a batch size that rounds to another autotune key (at `balanced`, 24
/// rounds to 32, not 64) would cost a new round of convolution, matmul and reduction
/// autotuning. The price is at most `batch_size - 1` extra rows per evaluation.
pub(crate) fn eval_batches(idx: &[usize], batch_size: usize) -> Vec<(Vec<usize>, usize)> {
    idx.chunks(batch_size.max(1))
        .map(|c| {
            let mut b = c.to_vec();
            b.resize(batch_size.max(c.len()), c[0]);
            (b, c.len())
        })
        .collect()
}

/// Accuracy and mean loss on the test set, in order, without augmentation or autodiff.
pub(crate) fn evaluate<B: crate::ops::ModelBackend>(
    model: &Net<B>,
    test: &Dataset,
    idx: &[usize],
    batcher: &Batcher,
    plan: &Plan,
    device: &B::Device,
) -> EvalRecord {
    let t = Instant::now();
    let n = idx.len();
    let mut correct: Option<Tensor<B, 1, Int>> = None;
    let mut loss_total: Option<Tensor<B, 1>> = None;
    for (batch, real) in eval_batches(idx, plan.batch_rows()) {
        let rows = batch.len();
        let (x, y) = batcher.to_device::<B>(batcher.host(test, &batch, 0, false), device);
        let logits = model.forward(x);
        // The batch's own rows; every batch has one such mask, so the same kernels.
        let own: Vec<bool> = (0..rows).map(|i| i < real).collect();
        let own = Tensor::<B, 1, Bool>::from_data(TensorData::new(own, [rows]), device);
        // Cross-entropy as Burn's `CrossEntropyLoss` has it, summed over the own rows.
        let picked = log_softmax(logits.clone(), 1).gather(1, y.clone().reshape([rows, 1]));
        let loss = picked
            .reshape([rows])
            .mask_fill(own.clone().bool_not(), 0.0)
            .sum()
            .neg();
        let hits = logits
            .argmax(1)
            .reshape([rows])
            .equal(y)
            .bool_and(own)
            .int()
            .sum();
        correct = Some(match correct {
            Some(c) => c + hits,
            None => hits,
        });
        loss_total = Some(match loss_total {
            Some(l) => l + loss,
            None => loss,
        });
    }
    let read_i = |t: Option<Tensor<B, 1, Int>>| {
        t.map_or(0.0, |t| {
            t.into_data()
                .convert::<i64>()
                .into_vec::<i64>()
                .map_or(0.0, |v| v[0] as f64)
        })
    };
    let read_f = |t: Option<Tensor<B, 1>>| {
        t.map_or(0.0, |t| {
            t.into_data()
                .convert::<f64>()
                .into_vec::<f64>()
                .map_or(0.0, |v| v[0])
        })
    };
    let hits = read_i(correct);
    let loss = read_f(loss_total);
    EvalRecord {
        epoch: 0,
        step: 0,
        samples: n,
        accuracy: if n > 0 { hits / n as f64 } else { 0.0 },
        loss: if n > 0 { loss / n as f64 } else { 0.0 },
        ms: ms(t),
    }
}
