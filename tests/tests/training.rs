//! What a training step computes: parameter counts, accumulation, determinism, normalisation, losses, clipping, early stopping.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use runner::backend::CpuBackend;
use runner::model::{Input, Net, Shape};
use runner::plan::{self, Machine};
use runner::recipe;
use runner::run::{self, RunOptions};
use runner::train::Accumulation;

use runner::metrics::RunStatus;

use crate::common::{
    check, expect_exit, long_recipe, only_run, plan_from, records, root, runner_cmd, summary,
    tempdir, tiny_recipe, FASHION,
};

// ---------------------------------------------------------------- models

#[test]
fn parameter_counts_equal_torchvision() {
    let d = runner::backend::cpu_device();
    let count = |arch: &str, stem: &str, classes: usize| {
        let src = format!("[model]\narch = \"{arch}\"\nstem = \"{stem}\"\nnum_classes = {classes}\n[data]\nformat = \"synthetic\"\n");
        let p = plan::validate(
            &recipe::parse(Path::new("m.toml"), src).unwrap(),
            &Machine::cpu_only(),
        )
        .unwrap();
        Net::<burn::backend::Flex>::new(
            &p.model,
            Shape::Image {
                channels: 3,
                side: 32,
            },
            0,
            &d,
        )
        .parameters()
    };
    assert_eq!(count("resnet18", "cifar", 10), 11_173_962);
    assert_eq!(count("resnet34", "cifar", 10), 21_282_122);
    assert_eq!(count("resnet50", "cifar", 10), 23_520_842);
    // torchvision.models.resnet50() as published: ImageNet stem, 1000 classes.
    assert_eq!(count("resnet50", "imagenet", 1000), 25_557_032);
    assert_eq!(count("resnet18", "imagenet", 1000), 11_689_512);
}

/// Visits every parameter's gradient in two gradient sets and returns the largest difference.
struct GradDiff<'a, B: AutodiffBackend> {
    a: &'a burn::optim::GradientsParams,
    b: &'a burn::optim::GradientsParams,
    max: f32,
    params: usize,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradDiff<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let ga = self
            .a
            .get::<B::InnerBackend, D>(param.id)
            .expect("gradient in a");
        let gb = self
            .b
            .get::<B::InnerBackend, D>(param.id)
            .expect("gradient in b");
        let d: f32 = (ga - gb)
            .abs()
            .max()
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap()[0];
        self.max = self.max.max(d);
        self.params += 1;
    }
}

#[test]
fn accumulation_of_4_micro_batches_of_2_equals_one_batch_of_8() {
    type B = CpuBackend;
    let d = runner::backend::cpu_device();
    let src = "[model]\narch = \"mlp\"\nhidden = [32, 16]\n[data]\nformat = \"synthetic\"\nsynthetic = { image_size = 8, channels = 1 }\n";
    let p = plan::validate(
        &recipe::parse(Path::new("a.toml"), src.into()).unwrap(),
        &Machine::cpu_only(),
    )
    .unwrap();
    let model: Net<B> = Net::new(
        &p.model,
        Shape::Image {
            channels: 1,
            side: 8,
        },
        1,
        &d,
    );
    let loss_fn = CrossEntropyLossConfig::new().init::<B>(&d);
    let x: Vec<f32> = (0..8 * 64)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y: Vec<i32> = (0..8).map(|i: i32| i * 3 % 10).collect();
    let batch = |from: usize, n: usize| {
        let xs = Tensor::<B, 4>::from_data(
            TensorData::new(x[from * 64..(from + n) * 64].to_vec(), [n, 1, 8, 8]),
            &d,
        );
        let ys =
            Tensor::<B, 1, Int>::from_data(TensorData::new(y[from..from + n].to_vec(), [n]), &d);
        (xs, ys)
    };
    // A step of micro-batches of these sizes, in order over the 8 samples.
    let step = |sizes: &[usize]| {
        let mut acc = Accumulation::<B>::new(sizes.len(), sizes.iter().sum());
        let mut from = 0;
        for &n in sizes {
            let (xs, ys) = batch(from, n);
            acc.micro_batch(&model, &loss_fn, (Input::Images(xs), ys), n);
            from += n;
        }
        let loss = acc.mean_loss().into_scalar();
        (loss, acc.grads())
    };
    let (loss8, g1) = step(&[8]);
    // Alike, and unequal: an epoch's short last micro-batch weighs by its samples (at 1/k
    // each, 7 + 1 gave the one sample as much weight as the seven).
    let mut g4 = None;
    for sizes in [&[2, 2, 2, 2][..], &[5, 3], &[7, 1]] {
        let (loss, g) = step(sizes);
        let mut v = GradDiff::<B> {
            a: &g1,
            b: &g,
            max: 0.0,
            params: 0,
            _b: Default::default(),
        };
        model.visit(&mut v);
        assert_eq!(v.params, 6, "3 linear layers, weight and bias each");
        assert!(v.max < 1e-5, "{sizes:?}: gradients differ by {}", v.max);
        assert!((loss8 - loss).abs() < 1e-5, "{sizes:?}: {loss8} vs {loss}");
        g4.get_or_insert((loss, g));
    }
    let (loss4, g4) = g4.unwrap();
    // And the comparison can fail: the first micro-batch's gradient alone is not the mean.
    let (first_loss, g) = step(&[2]);
    assert!((first_loss - loss4).abs() > 1e-4);
    let mut v = GradDiff::<B> {
        a: &g,
        b: &g4,
        max: 0.0,
        params: 0,
        _b: Default::default(),
    };
    model.visit(&mut v);
    assert!(v.max > 1e-3, "a wrong gradient went unnoticed");
}

/// Through the binary, over epochs whose sample count no batch divides: batch_size × 1
/// and the same samples in micro-batches take the same steps, with the same losses. A
/// short micro-batch (250 = 41 × 6 + 4: an epoch's last step is 3 + 1) weighs by its
/// samples (at 1/2 each, its loss read 1.93 against 1.45); with drop_last, the
/// micro-batches too few for a whole step are dropped with the short batch, as the large
/// batch drops them (a short step was taken at full learning rate: 32 steps an epoch
/// against 31).
#[test]
fn micro_batches_take_the_steps_one_large_batch_would() {
    let dir = tempdir("accumulation-cli");
    let losses = |name: &str, batch: usize, accumulation: usize, drop_last: bool| {
        let recipe = tiny_recipe(
            &dir,
            name,
            &format!("[optim]\naccumulation_steps = {accumulation}\n"),
        );
        let text = std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("samples = 100,", "samples = 250,")
            .replace(
                "batch_size = 32",
                &format!("batch_size = {batch}\ndrop_last = {drop_last}"),
            )
            .replace("epochs = 1", "epochs = 2");
        std::fs::write(&recipe, text).unwrap();
        expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
        let steps = records(&only_run(&dir.join("runs").join(name)));
        steps
            .iter()
            .map(|r| (r.epoch, r.samples, r.loss))
            .collect::<Vec<_>>()
    };
    for (large, small, drop_last, per_epoch) in
        [((6, 1), (3, 2), false, 42), ((8, 1), (2, 4), true, 31)]
    {
        let a = losses(&format!("a{drop_last}"), large.0, large.1, drop_last);
        let b = losses(&format!("b{drop_last}"), small.0, small.1, drop_last);
        assert_eq!(a.len(), 2 * per_epoch, "drop_last = {drop_last}");
        assert_eq!(a.len(), b.len(), "drop_last = {drop_last}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.0, x.1), (y.0, y.1), "drop_last = {drop_last}");
            assert!(
                (x.2 - y.2).abs() < 1e-4,
                "drop_last = {drop_last}: {a:?}\n{b:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_short_real_run_learns_and_writes_its_files() {
    let p = plan_from(
        "learn",
        &format!("{FASHION}\n[loader]\nbatch_size = 32\nworkers = 2\n[optim]\nlr = 0.05\nmomentum = 0.9\n[run]\nepochs = 2\nwarmup_steps = 3\neval = \"epoch\"\n"),
    );
    let out = run::execute(
        &p,
        &RunOptions {
            quiet: true,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let recs = records(&out.dir);
    assert_eq!(
        recs.len() as u64,
        p.run.total_steps,
        "one metrics line per optimizer step"
    );
    assert_eq!(recs.len(), 2 * 2000usize.div_ceil(32));
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.step, i as u64 + 1);
        assert!(r.loss.is_finite() && r.iter_ms > 0.0 && r.samples_per_s > 0.0);
        assert!(
            r.data_wait_ms + r.h2d_ms + r.forward_backward_ms + r.optimizer_ms + r.cleanup_ms
                <= r.iter_ms + 1e-6
        );
        assert!(
            r.rss_bytes.unwrap_or(0) > 0 && r.mem_in_use_bytes.is_none(),
            "CPU: RSS, no device pool"
        );
    }
    let first: f64 = recs[..10].iter().map(|r| r.loss).sum::<f64>() / 10.0;
    let last: f64 = recs[recs.len() - 10..].iter().map(|r| r.loss).sum::<f64>() / 10.0;
    assert!(
        last < 0.6 * first,
        "loss did not fall: {first:.3} → {last:.3}"
    );
    let s = summary(&out.dir);
    assert_eq!(s.status, RunStatus::Completed);
    assert_eq!(s.steps, recs.len() as u64);
    assert_eq!(
        s.evals.len(),
        2,
        "eval = \"epoch\" evaluates after each epoch"
    );
    let acc = s.test_accuracy.unwrap();
    assert!(
        acc > 0.6,
        "test accuracy {acc} is not far above chance (0.1)"
    );
    assert_eq!(
        s.iter_ms.count,
        recs.len() - 3,
        "warm-up steps are left out of timing"
    );
    assert_eq!(
        s.loader_workers_started,
        2 * 2,
        "non-persistent workers start every epoch"
    );
    // The run directory holds a resolved recipe that validates on its own.
    let resolved = out.dir.join("recipe.toml");
    check(&resolved, &Machine::cpu_only()).unwrap_or_else(|r| panic!("{r}"));
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.dir.join("env.json")).unwrap()).unwrap();
    assert_eq!(env["burn_version"], "0.21.0");
    assert_eq!(env["backend"], "flex (cpu)");
    assert!(env["threads"].as_u64().unwrap() >= 1);
}

#[test]
fn cleanup_every_step_is_timed_and_only_when_due() {
    let p = plan_from(
        "cleanup",
        "seed = 1\n[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\nsynthetic = { samples = 256, test_samples = 0 }\n[loader]\nbatch_size = 16\n[cleanup]\nevery = 3\nactions = [\"trim_host\"]\n[run]\nepochs = 1\n",
    );
    let out = run::execute(
        &p,
        &RunOptions {
            quiet: true,
            ..Default::default()
        },
    )
    .unwrap();
    let recs = records(&out.dir);
    assert_eq!(recs.len(), 16);
    for r in &recs {
        if r.step % 3 == 0 {
            assert!(
                r.cleanup_ms > 0.0,
                "step {}: cleanup due but not timed",
                r.step
            );
        } else {
            assert_eq!(
                r.cleanup_ms, 0.0,
                "step {}: cleanup ran when not due",
                r.step
            );
        }
    }
    let s = summary(&out.dir);
    assert!(s.cleanup_ms_total > 0.0 && s.cleanup_pct > 0.0);
}

#[test]
fn same_seed_same_losses_for_any_worker_count() {
    let losses = |tag: &str, workers: usize, persistent: bool, seed: u64| -> Vec<f64> {
        let loader = if workers == 0 {
            "[loader]\nbatch_size = 32\nworkers = 0\n".to_string()
        } else {
            format!("[loader]\nbatch_size = 32\nworkers = {workers}\npersistent_workers = {persistent}\n")
        };
        // `limit` keeps epochs short so a second epoch (new shuffle, new crops) is covered.
        let body = FASHION.replace("seed = 3", &format!("seed = {seed}")).replace("normalize =", "limit = 1024\nnormalize =")
            + &format!("{loader}\n[data.augment]\ncrop_padding = 2\nhflip = true\n[optim]\nlr = 0.05\nmomentum = 0.9\n[run]\nepochs = 2\nmax_steps = 70\neval = \"never\"\n");
        let p = plan_from(tag, &body);
        let out = run::execute(
            &p,
            &RunOptions {
                quiet: true,
                ..Default::default()
            },
        )
        .unwrap();
        records(&out.dir).iter().map(|r| r.loss).collect()
    };
    let a = losses("det-w0a", 0, false, 3);
    assert_eq!(a.len(), 64, "two epochs of 32 steps");
    assert_eq!(a, losses("det-w0b", 0, false, 3), "workers = 0, run twice");
    assert_eq!(a, losses("det-w4a", 4, false, 3), "workers = 4");
    assert_eq!(a, losses("det-w4b", 4, true, 3), "workers = 4, persistent");
    assert_ne!(
        a,
        losses("det-seed", 2, false, 4),
        "the seed changes the run"
    );
}

#[test]
fn device_normalisation_equals_host_normalisation() {
    let run_with = |tag: &str, on: &str| -> Vec<f64> {
        let body = FASHION.replace("std = [0.3330] }", &format!("std = [0.3330], on = \"{on}\" }}"))
            + "\n[data.augment]\nhflip = true\n[loader]\nbatch_size = 16\n[run]\nmax_steps = 8\neval = \"never\"\n";
        let p = plan_from(tag, &body);
        let out = run::execute(
            &p,
            &RunOptions {
                quiet: true,
                ..Default::default()
            },
        )
        .unwrap();
        records(&out.dir).iter().map(|r| r.loss).collect()
    };
    let host = run_with("norm-host", "host");
    let device = run_with("norm-device", "device");
    assert_eq!(host.len(), 8);
    for (h, d) in host.iter().zip(&device) {
        assert!((h - d).abs() < 1e-4, "host {h} vs device {d}");
    }
}

/// A `[data.normalize]` table that names only `on` (the README's host/device A/B) keeps the
/// pixels as they are without the table, scaled to 0..1: its defaults are the absent
/// table's, so the A/B changes where the arithmetic runs, not its result.
#[test]
fn naming_only_where_to_normalise_changes_nothing_else() {
    let dir = tempdir("norm-defaults");
    let recipe = tiny_recipe(&dir, "n", "");
    let losses = |set: Option<&str>| -> Vec<f64> {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        if let Some(s) = set {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        expect_exit(&out, 0);
        let dir = String::from_utf8_lossy(&out.stdout);
        let run = dir.trim().rsplit(", ").next().unwrap().to_string();
        records(Path::new(&run)).iter().map(|r| r.loss).collect()
    };
    let plain = losses(None);
    assert_eq!(plain, losses(Some("data.normalize.on=host")));
    assert_eq!(plain, losses(Some("data.normalize.on=device")));
    let out = runner_cmd().args(["show"]).arg(&recipe).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("[data.normalize]\nmean = [0.0]\nstd = [1.0]\non = \"host\""),
        "the resolved recipe writes the defaults out: {shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn label_smoothing_is_pytorchs() {
    let p = plan_from(
        "smooth",
        "[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n[optim]\nlabel_smoothing = 0.1\n",
    );
    let d = runner::backend::cpu_device();
    let logits = Tensor::<CpuBackend, 2>::from_data(
        TensorData::new(vec![2.0f32, 0.0, -1.0, 0.5, 0.5, 0.0], [2, 3]),
        &d,
    );
    let y = Tensor::<CpuBackend, 1, Int>::from_data(TensorData::new(vec![0i64, 2], [2]), &d);
    let got: f32 = runner::train::loss_config(&p)
        .init(&d)
        .forward(logits, y)
        .into_scalar();
    // torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1), by hand.
    let rows = [([2.0f64, 0.0, -1.0], 0), ([0.5, 0.5, 0.0], 2)];
    let want: f64 = rows
        .iter()
        .map(|(z, t)| {
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            let logp: Vec<f64> = z.iter().map(|v| v - lse).collect();
            let eps = 0.1;
            -(1.0 - eps) * logp[*t] - eps / 3.0 * logp.iter().sum::<f64>()
        })
        .sum::<f64>()
        / 2.0;
    assert!((got as f64 - want).abs() < 1e-5, "{got} vs {want}");
}

/// The global L2 norm of a model's gradients.
fn grad_norm<B: runner::ops::TrainBackend>(
    model: &Net<B>,
    grads: &burn::optim::GradientsParams,
) -> f64 {
    struct V<'a>(&'a burn::optim::GradientsParams, f64);
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if let Some(g) = self.0.get::<B::InnerBackend, D>(p.id) {
                let v: Vec<f32> = g.into_data().convert::<f32>().into_vec().unwrap();
                self.1 += v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>();
            }
        }
    }
    let mut v = V(grads, 0.0);
    model.visit(&mut v);
    v.1.sqrt()
}

#[test]
fn clip_grad_norm_bounds_the_global_norm_like_pytorch() {
    let p = plan_from(
        "clip",
        "[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n",
    );
    let d = runner::backend::cpu_device();
    let model: Net<CpuBackend> = Net::new(
        &p.model,
        Shape::Image {
            channels: 3,
            side: 32,
        },
        1,
        &d,
    );
    let grads = || {
        let x = Tensor::<CpuBackend, 4>::ones([4, 3, 32, 32], &d);
        let y =
            Tensor::<CpuBackend, 1, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3], [4]), &d);
        let loss = CrossEntropyLossConfig::new()
            .init(&d)
            .forward(model.forward(Input::Images(x)), y);
        burn::optim::GradientsParams::from_grads(loss.backward(), &model)
    };
    let n = grad_norm(&model, &grads());
    assert!(n > 0.0);
    let clipped = runner::train::clip_grad_norm(&model, grads(), n / 4.0);
    let c = grad_norm(&model, &clipped);
    assert!(
        (c - n / 4.0).abs() < 1e-4 * n,
        "clipped to {c}, wanted {}",
        n / 4.0
    );
    // Under the bound nothing changes (the coefficient is clamped to 1).
    let kept = runner::train::clip_grad_norm(&model, grads(), 10.0 * n);
    assert!((grad_norm(&model, &kept) - n).abs() < 1e-6 * n);
    // Through the binary, both knobs in a real run.
    let dir = tempdir("clip-cli");
    let recipe = tiny_recipe(
        &dir,
        "c",
        "[optim]\nclip_grad_norm = 0.5\nlabel_smoothing = 0.1\n",
    );
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let text = std::fs::read_to_string(only_run(&dir.join("runs/c")).join("recipe.toml")).unwrap();
    assert!(text.contains("clip_grad_norm = 0.5") && text.contains("label_smoothing = 0.1"));
}

#[test]
fn early_stopping_watches_a_held_out_split_and_keeps_the_best_weights() {
    let dir = tempdir("early");
    // lr = 1e-12 (next to nothing): the validation loss never improves after the first
    // evaluation, so with patience 2 the run stops after epoch 3 of 50.
    let recipe = tiny_recipe(
        &dir,
        "es",
        "[optim]\nlr = 1e-12\n[run.early_stop]\npatience = 2\n",
    );
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("epochs = 1", "epochs = 50")
        .replace(
            "synthetic = { samples = 100, test_samples = 50 }",
            "synthetic = { samples = 100, test_samples = 50 }\nvalidation = 0.2",
        );
    std::fs::write(&recipe, text).unwrap();
    let out = runner_cmd().arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/es"));
    let s = summary(&run);
    // 100 samples: 20 held out, 80 trained on in batches of 32 → 3 steps an epoch.
    assert_eq!(s.status, RunStatus::Completed);
    assert_eq!(s.validations.len(), 3, "{:?}", s.validations);
    assert!(s.validations.iter().all(|v| v.samples == 20));
    assert_eq!(s.early_stopped_at_step, Some(9));
    assert_eq!((s.steps, s.samples), (9, 3 * 80));
    assert_eq!(s.best_step, Some(3));
    assert!(
        s.test_accuracy.is_some(),
        "the test set is scored at the end"
    );
    assert!(
        run.join("model-best.safetensors").is_file() && run.join("model.safetensors").is_file()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("early stop after step 9"));
    let out = runner_cmd()
        .arg("eval")
        .arg(&run)
        .arg("--best")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    // early_stop without a validation set is an error that says what to add.
    let bad = tiny_recipe(&dir, "bad", "[run.early_stop]\npatience = 2\n");
    let out = runner_cmd().arg("validate").arg(&bad).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("set data.validation = 0.1"));
}

#[test]
fn a_validation_file_is_read_like_the_test_set() {
    let dir = tempdir("valfile");
    let recipe = long_recipe(&dir, "vf", "");
    let text = std::fs::read_to_string(&recipe).unwrap().replace(
        "limit = 640",
        &format!(
            "limit = 640\nvalidation_file = \"{}\"",
            root()
                .join("datasets/cifar10_sample/test_batch.bin")
                .display()
        ),
    );
    std::fs::write(&recipe, text).unwrap();
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "run.epochs=2"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let s = summary(&only_run(&dir.join("runs/vf")));
    // The 20 CIFAR-10 images, after each epoch; the 640 training samples all trained on.
    assert_eq!(
        s.validations.iter().map(|v| v.samples).collect::<Vec<_>>(),
        [20, 20]
    );
    assert_eq!(s.samples, 2 * 640);
    // Both ways at once is an error naming the key.
    let out = runner_cmd()
        .arg("validate")
        .arg(&recipe)
        .args(["--set", "data.validation=0.1"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("data.validation_file: given with data.validation"));
}
