//! `runner warmup`: every distinct computation of a plan run once, so its kernels are
//! compiled and tuned (and cached) before a real run.

use std::collections::HashSet;

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

/// One representative batch of each shape among `batches` not in `seen` yet, in
/// first-seen order (and now in `seen`).
fn new_shapes(
    batcher: &Batcher,
    data: &Dataset,
    batches: &[Vec<usize>],
    seen: &mut HashSet<(usize, usize)>,
) -> Vec<Vec<usize>> {
    batches
        .iter()
        .filter(|b| seen.insert(batcher.shape_of(data, b)))
        .cloned()
        .collect()
}

/// The training batches of every epoch the run will reach (`run.epochs`, or fewer where
/// `run.max_steps` ends it sooner), in the loader's order: text batches padded to their
/// longest sequence take new shapes in later epochs.
fn run_batches<'a>(plan: &Plan, train: &'a Dataset) -> impl Iterator<Item = Vec<Vec<usize>>> + 'a {
    let cfg = loader_config(plan, train);
    let accum = plan.optim.accumulation_steps.max(1);
    let mut steps_left = plan.run.total_steps;
    (0..epochs_reached(plan)).map(move |epoch| {
        // Only the micro-batches the run takes: `run.max_steps` may end it inside an epoch.
        let mut batches = crate::loader::epoch_batches(train.len(), &cfg, epoch);
        let taken = usize::try_from(steps_left)
            .unwrap_or(usize::MAX)
            .saturating_mul(accum);
        batches.truncate(taken);
        steps_left = steps_left.saturating_sub(batches.len().div_ceil(accum) as u64);
        batches
    })
}

/// Plans that share most of their kernels: the same device and kernel settings, model,
/// data and batch size (they may differ in the optimizer, the cleanup actions,
/// accumulation or evaluation). `runner warmup --jobs` warms a family in one process, so
/// its later plans find the first one's kernels compiled.
pub fn kernel_family(p: &Plan) -> String {
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}",
        p.device, p.kernels, p.model, p.data, p.loader.batch_size
    )
}

/// What decides the kernels a plan compiles and tunes: plans equal in this warm up once.
/// Text batches take their lengths from the order and the epochs the run reaches. It
/// names what `warm_up` (below) reads from the plan: a setting that comes to change the
/// kernels a step compiles belongs in both.
pub fn kernel_signature(p: &Plan) -> String {
    let o = &p.optim;
    let text_order = p
        .data
        .text()
        .map(|_| (p.seed, p.loader.shuffle, epochs_reached(p)));
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{}|{}",
        p.device,
        p.kernels,
        p.model,
        p.data,
        p.loader.batch_size,
        p.loader.drop_last,
        text_order,
        o.momentum > 0.0,
        o.nesterov,
        o.weight_decay > 0.0,
        o.accumulation_steps,
        o.optimizer,
        p.cleanup.actions,
        p.run.eval,
        o.clip_grad_norm.is_some(),
        o.label_smoothing > 0.0,
    )
}

/// The epochs a run of `plan` reaches: `run.epochs`, or fewer where `run.max_steps` ends
/// it sooner (at least one).
pub fn epochs_reached(plan: &Plan) -> usize {
    plan.run.epochs_reached()
}

/// Runs once each computation a run of `plan` will run, so that its kernels are compiled
/// and tuned (and cached) before a real run: for every distinct training batch shape of
/// the run (every epoch's) a full optimizer step of `accumulation_steps` micro-batches
/// (and a step of an epoch's last, shorter group where its code path differs), the
/// cleanup actions, and evaluation of each distinct test and validation batch shape.
/// Records nothing.
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
    let mut seen = HashSet::new();
    let accum = plan.optim.accumulation_steps.max(1);
    // An epoch's last group is shorter when the batches do not divide; a group of one
    // takes another path (no accumulator).
    let mut group_of_one = false;
    let mut shapes = Vec::new();
    for batches in run_batches(plan, train) {
        group_of_one |= batches.len() % accum == 1;
        shapes.extend(new_shapes(batcher, train, &batches, &mut seen));
    }
    let mut groups: Vec<(usize, &Vec<usize>)> = shapes.iter().map(|b| (accum, b)).collect();
    if accum > 1 && group_of_one {
        if let Some(first) = shapes.first() {
            groups.push((1, first));
        }
    }
    let mut warmed = Warmed {
        train_shapes: shapes.len(),
        ..Default::default()
    };
    // As the training loop: the step's mean loss kept on the device, the update, and the
    // losses read back together.
    let mut losses = Vec::new();
    for (group, idx) in groups {
        let mut acc = Accumulation::<B>::new(group, group * idx.len());
        for _ in 0..group {
            let xy = batcher.to_device::<B>(batcher.host(train, idx, 0, true), device);
            acc.micro_batch(&model, &loss_fn, xy, idx.len());
            warmed.micro_batches += 1;
        }
        losses.push(acc.mean_loss());
        model = optim.update(&plan.optim, plan.optim.lr, model, acc);
        let _ = B::sync(device);
    }
    if !losses.is_empty() {
        let _ = Tensor::cat(losses, 0).into_data();
    }
    if !plan.cleanup.actions.is_empty() {
        run_cleanup::<B>(&plan.cleanup.actions, device);
    }
    // The evaluations a run makes: the test set (run.eval) and the validation set; a shape
    // both have is run once.
    let sets = [
        (plan.run.eval != EvalWhen::Never).then_some(test),
        validation,
    ];
    let mut seen = HashSet::new();
    for data in sets.into_iter().flatten().filter(|d| !d.is_empty()) {
        let all: Vec<usize> = (0..data.len()).collect();
        let batches: Vec<Vec<usize>> = eval_batches(&all, plan.batch_rows())
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        // Whole batches (a short last one is filled up), so `evaluate` batches them back
        // the same.
        let shapes = new_shapes(batcher, data, &batches, &mut seen);
        warmed.eval_shapes += shapes.len();
        let _ = evaluate(
            &model.valid(),
            data,
            &shapes.concat(),
            batcher,
            plan,
            device,
        );
    }
    let _ = B::sync(device);
    warmed
}
