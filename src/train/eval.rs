//! Evaluation without autodiff: accuracy and mean loss over a set, and over saved weights.

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
/// whose outputs are dropped before scoring: every evaluation batch then has the training
/// batch's shape (a copied row is no longer than the batch's longest, so text keeps its
/// padded length), and on CUDA evaluation compiles and tunes no kernels of its own; a
/// batch size that rounds to another autotune key (at `balanced`, 24 rounds to 32, not
/// 64) would cost a new round of convolution and matmul autotuning. The price is at most
/// `batch_size - 1` extra rows per evaluation.
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
    let loss_fn: CrossEntropyLoss<B> = CrossEntropyLossConfig::new().init(device);
    let n = idx.len();
    let mut correct: Option<Tensor<B, 1, Int>> = None;
    let mut loss_total: Option<Tensor<B, 1>> = None;
    for (batch, real) in eval_batches(idx, plan.loader.batch_size) {
        let (x, y) = batcher.to_device::<B>(batcher.host(test, &batch, 0, false), device);
        let mut logits = model.forward(x);
        let mut y = y;
        if real < batch.len() {
            logits = logits.narrow(0, 0, real);
            y = y.narrow(0, 0, real);
        }
        let loss = loss_fn.forward(logits.clone(), y.clone()) * real as f32;
        let hits = logits.argmax(1).flatten::<1>(0, 1).equal(y).int().sum();
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
