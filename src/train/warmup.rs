//! `runner warmup`: every distinct computation of a plan run once, so its kernels are
//! compiled and tuned (and cached) before a real run.

use super::*;

/// What `warm_up` ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Warmed {
    /// Distinct training batch shapes, each run as one full optimizer step.
    pub train_shapes: usize,
    /// Distinct evaluation batch shapes (0 when the plan never evaluates).
    pub eval_shapes: usize,
    pub micro_batches: usize,
}

/// One representative batch of each distinct shape among `batches`, in first-seen order.
pub(crate) fn distinct_shapes(
    batcher: &Batcher,
    data: &Dataset,
    batches: &[Vec<usize>],
) -> Vec<Vec<usize>> {
    let mut seen = std::collections::HashSet::new();
    batches
        .iter()
        .filter(|b| seen.insert(batcher.shape_of(data, b)))
        .cloned()
        .collect()
}

/// Runs once each computation a run of `plan` will run, so that its kernels are compiled
/// and tuned (and cached) before a real run: for every distinct training batch shape of
/// the first epoch a full optimizer step of `accumulation_steps` micro-batches (and a
/// step of the epoch's last, shorter group where its code path differs), the cleanup
/// actions, and evaluation of each distinct test and validation batch shape. Records
/// nothing.
pub fn warm_up<B: TrainBackend>(
    plan: &Plan,
    batcher: &Batcher,
    train: &Dataset,
    test: &Dataset,
    validation: Option<&Dataset>,
    device: &B::Device,
) -> Warmed {
    let mut model: Net<B> = Net::new(&plan.model, batcher.shape, plan.seed, device);
    let mut optim = Optim::<B>::new(&plan.optim);
    let loss_fn: CrossEntropyLoss<B> = loss_config(plan).init(device);
    let batches = crate::loader::epoch_batches(train.len(), &loader_config(plan, train), 0);
    let shapes = distinct_shapes(batcher, train, &batches);
    let accum = plan.optim.accumulation_steps.max(1);
    let mut groups: Vec<(usize, &Vec<usize>)> = shapes.iter().map(|b| (accum, b)).collect();
    // The epoch's last group is shorter when the batches do not divide; a group of one
    // takes another path (no accumulator).
    let rest = batches.len() % accum;
    if accum > 1 && rest == 1 {
        if let Some(first) = shapes.first() {
            groups.push((1, first));
        }
    }
    let mut warmed = Warmed {
        train_shapes: shapes.len(),
        ..Default::default()
    };
    for (group, idx) in groups {
        let mut acc = Accumulation::<B>::new(group);
        for _ in 0..group {
            let (x, y) = batcher.to_device::<B>(batcher.host(train, idx, 0, true), device);
            let loss = loss_fn.forward(model.forward(x), y);
            let _ = acc.add(&model, loss);
            warmed.micro_batches += 1;
        }
        model = optim.step(plan.optim.lr, model, acc.grads());
        let _ = B::sync(device);
    }
    if !plan.cleanup.actions.is_empty() {
        run_cleanup::<B>(&plan.cleanup.actions, device);
    }
    // The evaluations a run makes: the test set (run.eval) and the validation set.
    let sets = [
        (plan.run.eval != EvalWhen::Never).then_some(test),
        validation,
    ];
    for data in sets.into_iter().flatten().filter(|d| !d.is_empty()) {
        let all: Vec<usize> = (0..data.len()).collect();
        let chunks: Vec<Vec<usize>> = all
            .chunks(plan.loader.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        // Full batches first, a shorter last one last: `evaluate` chunks them back the same.
        let (mut full, partial): (Vec<Vec<usize>>, Vec<Vec<usize>>) =
            distinct_shapes(batcher, data, &chunks)
                .into_iter()
                .partition(|c| c.len() == plan.loader.batch_size);
        warmed.eval_shapes += full.len() + partial.len();
        full.extend(partial);
        let idx: Vec<usize> = full.concat();
        let _ = evaluate(&model.valid(), data, &idx, batcher, plan, device);
    }
    let _ = B::sync(device);
    warmed
}
