//! What the runner costs per step, against a bare Burn loop of the same model and data.
//!
//!     cargo bench --bench overhead            (about 3 minutes on 2 cores)
//!
//! The bare loop is what one would write by hand: our loader (the same batches), forward,
//! cross-entropy, backward, optimizer step, and the loss read back every step (as any loop
//! that prints its loss does). The runner adds step records, phase timings, memory and RSS
//! reads, the sampler thread, metrics lines written and flushed every step, and progress.
//! Two measures:
//! 1. A/B: the median step time of alternating bare and runner trials (subject to the
//!    machine's noise, which the spread shows);
//! 2. accounting inside the runner's own runs: the part of each step outside the measured
//!    phases (the runner's bookkeeping) plus all of `log_ms` (writing the metrics line, and
//!    the loss read-back that the bare loop pays too): an upper bound on the runner's cost.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use runner::backend::{cpu_device, CpuBackend};
use runner::data;
use runner::loader::Loader;
use runner::metrics::{Stats, StepRecord};
use runner::model::Net;
use runner::plan::{self, Machine, Plan};
use runner::recipe;
use runner::run::{self, RunOptions};
use runner::train::{loader_config, Accumulation, Batcher, Optim};

const STEPS: u64 = 120;
const TRIALS: usize = 5;

fn plan(log_dir: &Path) -> Plan {
    let src = format!(
        r#"
seed = 1
[backend]
kind = "cpu"
[model]
arch = "small_cnn"
width = 32
[data]
format = "cifar10-bin"
train = "datasets/fashion_mnist/data_batch.bin"
normalize = {{ mean = [0.2193], std = [0.3330] }}
[loader]
batch_size = 32
workers = 1
[optim]
lr = 0.05
momentum = 0.9
[run]
epochs = 2
max_steps = {STEPS}
warmup_steps = 10
eval = "never"
[log]
dir = "{}"
progress = false
"#,
        log_dir.display()
    );
    let l = recipe::parse(Path::new("overhead.toml"), src).expect("recipe");
    plan::validate(&l, &Machine::cpu_only()).expect("plan")
}

/// The hand-written loop: per-step times in milliseconds.
fn bare(p: &Plan) -> Vec<f64> {
    type B = CpuBackend;
    let device = cpu_device();
    let sets = data::load(&p.data, p.model.num_classes, p.seed).unwrap();
    let train = Arc::new(sets.train);
    let batcher = Batcher::new(p, 0);
    let (d, b2) = (Arc::clone(&train), batcher.clone());
    let make = Arc::new(move |idx: &[usize], epoch: usize| b2.host(&d, idx, epoch, true));
    let cfg = loader_config(p, &train);
    let mut loader = Loader::new(cfg, train.len(), make);
    let mut model: Net<B> = Net::new(&p.model, batcher.shape, p.seed, &device);
    let mut optim = Optim::<B>::new(&p.optim);
    let loss_fn = CrossEntropyLossConfig::new().init::<B>(&device);
    let mut times = vec![];
    'run: for epoch in 0..p.run.epochs {
        let mut it = loader.epoch(epoch).expect("the loader's workers start");
        loop {
            let t = Instant::now();
            let Some(b) = it.next() else { break };
            let samples = b.samples;
            let xy = batcher.to_device::<B>(b.value, &device);
            let mut acc = Accumulation::<B>::new(1, samples);
            acc.micro_batch(&model, &loss_fn, xy, samples);
            let loss = acc.mean_loss();
            model = optim.update(&p.optim, p.optim.lr, model, acc);
            let _: f32 = loss.into_scalar();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            if times.len() as u64 == STEPS {
                break 'run;
            }
        }
    }
    times
}

/// The runner's own loop on the same plan: its step records.
fn runner(p: &Plan) -> Vec<StepRecord> {
    let out = run::execute(
        p,
        &RunOptions {
            quiet: true,
            ..Default::default()
        },
    )
    .expect("run");
    std::fs::read_to_string(out.dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn main() {
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
    let logs = std::env::temp_dir().join(format!("runner-overhead-{}", std::process::id()));
    let p = plan(&logs);
    let warm = p.run.warmup_steps as usize;
    let (mut bare_medians, mut runner_medians, mut bookkeeping) = (vec![], vec![], vec![]);
    for trial in 0..TRIALS {
        let b = bare(&p);
        let r = runner(&p);
        let bm = Stats::of(&b[warm..]).median;
        let timed: Vec<&StepRecord> = r.iter().filter(|s| s.step as usize > warm).collect();
        let rm = Stats::of(&timed.iter().map(|s| s.iter_ms).collect::<Vec<_>>()).median;
        // The runner's own cost inside its steps (an upper bound): time outside the measured
        // phases, plus log_ms (the metrics line, and the loss read-back the bare loop pays too).
        let own: Vec<f64> = timed
            .iter()
            .map(|s| {
                let other = s.iter_ms
                    - s.data_wait_ms
                    - s.h2d_ms
                    - s.forward_backward_ms
                    - s.optimizer_ms
                    - s.cleanup_ms
                    - s.log_ms;
                100.0 * (other + s.log_ms) / s.iter_ms
            })
            .collect();
        let own = Stats::of(&own).median;
        eprintln!("trial {}: bare {bm:.2} ms/step, runner {rm:.2} ms/step, runner bookkeeping {own:.3}% of a step", trial + 1);
        bare_medians.push(bm);
        runner_medians.push(rm);
        bookkeeping.push(own);
    }
    let (b, r) = (Stats::of(&bare_medians), Stats::of(&runner_medians));
    let spread = 100.0 * (b.std / b.mean).hypot(r.std / r.mean);
    println!("| measure | bare Burn loop | runner | overhead |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| A/B: median ms per step, mean of {TRIALS} alternating trials of {STEPS} steps (spread) | {:.2} ± {:.2} | {:.2} ± {:.2} | {:+.2}% (± {spread:.2}%) |",
        b.mean,
        b.std,
        r.mean,
        r.std,
        100.0 * (r.mean - b.mean) / b.mean
    );
    println!(
        "| accounting: runner's time outside the measured phases + metrics writing, median per step | - | - | {:.3}% (max of trials {:.3}%) |",
        Stats::of(&bookkeeping).mean,
        Stats::of(&bookkeeping).max
    );
    let _ = std::fs::remove_dir_all(&logs);
}
