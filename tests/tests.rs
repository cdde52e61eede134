//! The integration tests, in one binary (Burn links slowly). They run real training steps on
//! the CPU backend with the shipped data, and the `runner` binary itself for exit codes and
//! files. `UPDATE_EXPECT=1 cargo test --release` rewrites the `.expected` snapshots.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::module::{Module, ModuleVisitor, Param};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use runner::backend::CpuBackend;
use runner::metrics::{StepRecord, Summary};
use runner::model::{Input, Net, Shape};
use runner::plan::{self, Machine, Plan};
use runner::recipe::{self, schema, Diagnostics};
use runner::run::{self, RunOptions};
use runner::train::Accumulation;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Recipe files under `dir`, recursively, in name order.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Relative to the crate root, as a user in the checkout would type it.
fn rel(p: &Path) -> PathBuf {
    p.strip_prefix(root()).unwrap_or(p).to_path_buf()
}

/// What the binary checks: the recipe, every cell of its grid (the first cell's plan).
fn check(path: &Path, machine: &Machine) -> Result<Plan, Diagnostics> {
    runner::sweep::check(path, &[], machine, runner::sweep::DEFAULT_MAX_CELLS)
        .map(|c| c.plans.into_iter().next().expect("a recipe has a cell"))
}

fn any_machine() -> Machine {
    Machine {
        cuda_compiled: true,
        cuda_devices: Ok(8),
        host_memory: None,
        gpu_memory: vec![],
        wgpu_compiled: true,
        wgpu_adapters: None,
    }
}

fn expect(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let want =
        std::fs::read_to_string(path).unwrap_or_else(|_| panic!("missing {}", path.display()));
    assert_eq!(
        actual,
        want,
        "{} differs (UPDATE_EXPECT=1 rewrites it)",
        path.display()
    );
}

// ---------------------------------------------------------------- recipes and errors

#[test]
fn every_shipped_recipe_validates() {
    std::env::set_current_dir(root()).unwrap();
    let files = toml_files(&root().join("recipes"));
    assert!(files.len() >= 7, "recipes/ walk found only {files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(root().join("recipes/article"))),
        "no recursion"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            text.starts_with("# "),
            "{} must open with a comment saying what it measures",
            f.display()
        );
        if let Err(r) = check(&rel(&f), &any_machine()) {
            panic!("{} does not validate:\n{r}", f.display());
        }
    }
}

#[test]
fn bad_recipes_give_their_expected_errors() {
    std::env::set_current_dir(root()).unwrap();
    let files = toml_files(&root().join("tests/fixtures/invalid"));
    assert!(
        files.len() >= 60,
        "only {} bad-recipe fixtures",
        files.len()
    );
    for f in files {
        let report = match check(&rel(&f), &Machine::cpu_only()) {
            Ok(_) => panic!("{} validated but must not", f.display()),
            Err(r) => r,
        };
        assert!(report.has_errors());
        for e in report.errors() {
            let placed = e.line.is_some() || e.message.contains("cannot read");
            assert!(
                placed || e.key.is_some(),
                "{}: finding without a place: {e}",
                f.display()
            );
        }
        expect(&f.with_extension("expected"), &format!("{report}\n"));
    }
}

/// A pre-flight finding's figures depend on the machine (its memory; device or host
/// memory): keep the finding, cut the figures.
fn without_limit(text: &str) -> String {
    text.lines()
        .map(|l| match l.find(" the run needs at least ") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The error findings of a report's text, and its closing count, without its warnings.
fn errors_only(text: &str) -> Vec<String> {
    let text = text.trim_end();
    let (body, last) = text.rsplit_once('\n').unwrap_or(("", text));
    let mut out: Vec<String> = body
        .split("\n\n")
        .filter(|b| b.starts_with("error"))
        .map(str::to_string)
        .collect();
    out.push(last.to_string());
    out
}

/// What users meet: every fixture through the binary, `runner FILE` (checked against this
/// machine) and `runner validate FILE` (against any machine, so a CUDA recipe is valid on a
/// laptop: the `cuda_*` fixtures are errors only for `run`). Exit 2, the expected text on
/// stderr, every finding at once, nothing written.
#[test]
fn bad_recipes_fail_through_the_binary_with_every_finding() {
    let logs = tempdir("fixtures-cli");
    for f in toml_files(&root().join("tests/fixtures/invalid")) {
        let file = rel(&f);
        // A binary built with the backend it names runs that recipe.
        let stem = f.file_stem().unwrap().to_string_lossy();
        if (cfg!(feature = "wgpu") && stem.starts_with("wgpu_"))
            || (cfg!(feature = "cuda") && stem.starts_with("cuda_"))
        {
            continue;
        }
        let want = std::fs::read_to_string(f.with_extension("expected")).unwrap();
        let run = runner_cmd().arg(&file).env("HOME", &logs).output().unwrap();
        expect_exit(&run, 2);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            without_limit(stderr.trim_end()),
            without_limit(want.trim_end()),
            "`runner {}` printed other findings than its .expected",
            file.display()
        );
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            !root().join("runs").join(&name).exists(),
            "{name}: a bad recipe wrote a run directory"
        );
        let validate = runner_cmd().arg("validate").arg(&file).output().unwrap();
        // `validate` checks against any machine (a CUDA or WebGPU recipe is valid on a
        // laptop).
        if name.starts_with("cuda_") || name.starts_with("wgpu_") {
            continue;
        }
        expect_exit(&validate, 2);
        // Warnings may depend on the machine (a CPU-only warning under `run`): the errors
        // must be the same.
        assert_eq!(
            errors_only(&without_limit(&String::from_utf8_lossy(&validate.stderr))),
            errors_only(&without_limit(&want)),
            "`runner validate {}` differs from `runner {}`",
            file.display(),
            file.display()
        );
    }
}

#[test]
fn warnings_do_not_stop_a_recipe() {
    let src = r#"
[model]
arch = "mlp"
[data]
format = "synthetic"
[loader]
pin_memory = true
[cleanup]
every = "step"
"#;
    let l = recipe::parse(Path::new("w.toml"), src.into()).unwrap();
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap();
    let w: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(
        w[0].contains("loader.pin_memory: does nothing on the CPU backend"),
        "{}",
        w[0]
    );
    assert!(
        w[1].contains("cleanup.actions: \"sync\" and \"empty_cache\" cost next to nothing"),
        "{}",
        w[1]
    );
}

#[test]
fn readme_documents_every_recipe_key() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for (table, fields) in schema::tables() {
        for f in fields {
            let key = if table.is_empty() {
                f.to_string()
            } else {
                format!("{table}.{f}")
            };
            // Sub-tables are documented by their own keys.
            if schema::tables().iter().any(|(t, _)| *t == key) {
                continue;
            }
            assert!(
                readme.contains(&format!("`{key}`")),
                "README.md does not document `{key}`"
            );
        }
    }
}

/// A run directory's `recipe.toml` (the resolved recipe) validates on its own and
/// resolves to itself, for every cell of every shipped recipe: it is what `runner eval`,
/// `runner resume` and a colleague's rerun read. (The text recipes' wrote the
/// `data.augment` and `padding.buckets` defaults that validation then refused, so no text
/// run could be resumed or evaluated.)
#[test]
fn the_resolved_recipe_runs_on_its_own() {
    std::env::set_current_dir(root()).unwrap();
    let dir = tempdir("resolved");
    let mut checked = 0;
    for f in toml_files(&root().join("recipes")) {
        let c = runner::sweep::check(&rel(&f), &[], &any_machine(), 256)
            .unwrap_or_else(|r| panic!("{}: {r}", f.display()));
        for (i, p) in c.plans.iter().enumerate() {
            let text = toml::to_string(&p.resolved).unwrap();
            let path = dir.join(format!("{checked}.toml"));
            std::fs::write(&path, &text).unwrap();
            let again = runner::sweep::check(&path, &[], &any_machine(), 1)
                .map(|mut c| c.plans.remove(0))
                .unwrap_or_else(|r| panic!("{} (cell {i}) resolved:\n{r}\n{text}", f.display()));
            assert_eq!(again.resolved, p.resolved, "{} (cell {i})", f.display());
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} resolved recipes");
    let quickstart = check(Path::new("recipes/quickstart.toml"), &Machine::cpu_only()).unwrap();
    let text = toml::to_string(&quickstart.resolved).unwrap();
    assert!(
        text.contains("weight_decay = 0.0005")
            && text.contains("num_classes = 10")
            && text.contains("[data.augment]"),
        "{text}"
    );
}

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
    let mut one = Accumulation::<B>::new(1);
    let (xs, ys) = batch(0, 8);
    let loss8 = one.add(
        &model,
        loss_fn.forward(model.forward(Input::Images(xs)), ys),
    );
    let g1 = one.grads();
    let mut four = Accumulation::<B>::new(4);
    let mut loss2 = 0.0;
    for k in 0..4 {
        let (xs, ys) = batch(2 * k, 2);
        loss2 += four
            .add(
                &model,
                loss_fn.forward(model.forward(Input::Images(xs)), ys),
            )
            .into_scalar()
            / 4.0;
    }
    let g4 = four.grads();
    let mut v = GradDiff::<B> {
        a: &g1,
        b: &g4,
        max: 0.0,
        params: 0,
        _b: Default::default(),
    };
    model.visit(&mut v);
    assert_eq!(v.params, 6, "3 linear layers, weight and bias each");
    assert!(v.max < 1e-5, "gradients differ by {}", v.max);
    assert!((loss8.into_scalar() - loss2).abs() < 1e-5);
    // And the comparison can fail: without the 1/4 scaling the sum is 4 times the mean.
    let mut unscaled = Accumulation::<B>::new(1);
    let (xs, ys) = batch(0, 8);
    unscaled.add(
        &model,
        loss_fn.forward(model.forward(Input::Images(xs)), ys) * 4.0,
    );
    let g = unscaled.grads();
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

// ---------------------------------------------------------------- real runs

/// A fresh directory for one test, named by the test and this process. The first call
/// also removes what earlier test processes left (their pid is no longer running), so
/// repeated test runs do not fill the temporary directory.
fn tempdir(tag: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_test_dirs);
    let d = std::env::temp_dir().join(format!("runner-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `runner-test-*-PID`, `runner-cifar-PID` and `runner-text-PID` of processes gone.
fn remove_stale_test_dirs() {
    // Whether a pid runs is read from /proc; without it (not Linux) nothing is removed.
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = ["runner-test-", "runner-cifar-", "runner-text-"]
            .iter()
            .any(|p| name.starts_with(p));
        let pid = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        if let (true, Some(pid)) = (ours, pid) {
            let gone = !Path::new(&format!("/proc/{pid}")).exists();
            if gone && pid != std::process::id() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A plan from recipe text placed in `tests/fixtures/` (so shipped-data paths resolve),
/// logging under a fresh temporary directory.
fn plan_from(tag: &str, body: &str) -> Plan {
    let logs = tempdir(tag);
    let log = format!("[log]\ndir = \"{}\"\nprogress = false\n", logs.display());
    let src = if body.contains("[log]\n") {
        body.replace("[log]\n", &log)
    } else {
        format!("{body}\n{log}")
    };
    let path = root().join(format!("tests/fixtures/{tag}.toml"));
    let l = recipe::parse(&path, src).unwrap_or_else(|r| panic!("{r}"));
    plan::validate(&l, &Machine::cpu_only()).unwrap_or_else(|r| panic!("{r}"))
}

fn records(dir: &Path) -> Vec<StepRecord> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad metrics line {l}: {e}")))
        .collect()
}

fn summary(dir: &Path) -> Summary {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

const FASHION: &str = r#"
seed = 3
[model]
arch = "small_cnn"
width = 16
[data]
format = "cifar10-bin"
train = "../../datasets/fashion_mnist/data_batch.bin"
test = "../../datasets/fashion_mnist/test_batch.bin"
normalize = { mean = [0.2193], std = [0.3330] }
"#;

#[test]
fn a_short_real_run_learns_and_writes_its_files() {
    let p = plan_from(
        "learn",
        &format!("{FASHION}\n[loader]\nbatch_size = 32\nworkers = 2\n[optim]\nlr = 0.05\nmomentum = 0.9\n[run]\nepochs = 2\nwarmup_steps = 3\neval = \"epoch\"\n"),
    );
    let out = run::execute(&p, &RunOptions { quiet: true }).unwrap_or_else(|e| panic!("{e:?}"));
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
    assert_eq!(s.status, "completed");
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
    let out = run::execute(&p, &RunOptions { quiet: true }).unwrap();
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
        let out = run::execute(&p, &RunOptions { quiet: true }).unwrap();
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
        let out = run::execute(&p, &RunOptions { quiet: true }).unwrap();
        records(&out.dir).iter().map(|r| r.loss).collect()
    };
    let host = run_with("norm-host", "host");
    let device = run_with("norm-device", "device");
    assert_eq!(host.len(), 8);
    for (h, d) in host.iter().zip(&device) {
        assert!((h - d).abs() < 1e-4, "host {h} vs device {d}");
    }
}

// ---------------------------------------------------------------- the binary

/// Runs `runner` with `args`, then `--set log.dir=<logs>`, then `extra`.
fn runner_logged(logs: &Path, args: &[&str], extra: &[&str]) -> std::process::Output {
    runner_cmd()
        .args(args)
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", logs.display()))
        .args(extra)
        .output()
        .unwrap()
}

/// Asserts `runner`'s exit code, showing what it printed when the code differs.
fn expect_exit(out: &std::process::Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The one run directory under `dir`.
fn only_run(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

fn runner_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
    c.current_dir(root());
    // The runner leaves SIGHUP ignored where it was started so (`nohup`): a suite run
    // under nohup would then see a SIGHUP test run on for ever.
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    c
}

#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let logs = tempdir("cli-bad");
    for fixture in ["unknown_key", "truncated_dataset", "cuda_not_compiled"] {
        let out = runner_cmd()
            .arg(format!("tests/fixtures/invalid/{fixture}.toml"))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{fixture}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("tests/fixtures/invalid/{fixture}.toml:")),
            "{err}"
        );
    }
    assert!(
        !root().join("runs/unknown_key").exists()
            && !root().join("runs/truncated_dataset").exists()
    );

    // A label out of range is found when the data is read: still exit 2, still nothing written.
    let bad = logs.join("bad_label.bin");
    let mut bytes = std::fs::read(root().join("datasets/cifar10_sample/test_batch.bin")).unwrap();
    bytes[3073 * 5] = 42;
    std::fs::write(&bad, bytes).unwrap();
    let recipe = logs.join("bad_label.toml");
    std::fs::write(
        &recipe,
        format!("[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"bad_label.bin\"\n[log]\ndir = \"{}\"\n", logs.join("runs").display()),
    )
    .unwrap();
    let out = runner_cmd().arg(&recipe).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "bad_label.bin record 5 (byte offset 15365) has label 42, but there are 10 classes"
        ),
        "{err}"
    );
    assert!(
        !logs.join("runs").exists(),
        "a run directory was created for bad data"
    );
}

#[test]
fn validate_command_checks_every_recipe() {
    let ok = runner_cmd()
        .args([
            "validate",
            "recipes/quickstart.toml",
            "recipes/article/default.toml",
        ])
        .output()
        .unwrap();
    expect_exit(&ok, 0);
    assert!(String::from_utf8_lossy(&ok.stdout).contains("ok: recipes/quickstart.toml"));
    let bad = runner_cmd()
        .args([
            "validate",
            "recipes/quickstart.toml",
            "tests/fixtures/invalid/many_errors.toml",
            "tests/fixtures/invalid/unknown_key.toml",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("errors in tests/fixtures/invalid/many_errors.toml")
            && err.contains("loader.wokers"),
        "{err}"
    );
    let usage = runner_cmd().arg("--no-such-flag").output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn a_run_prints_a_one_line_summary() {
    let logs = tempdir("cli-run");
    let recipe = logs.join("tiny.toml");
    std::fs::write(
        &recipe,
        format!("[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\nsynthetic = {{ samples = 128, test_samples = 64 }}\n[run]\nepochs = 2\nwarmup_steps = 1\n[log]\ndir = \"{}\"\n", logs.join("runs").display()),
    )
    .unwrap();
    let out = runner_cmd().arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("tiny: 4 steps, median ")
            && stdout.contains("samples/s, test accuracy "),
        "{stdout}"
    );
    assert!(
        stdout.contains(&logs.join("runs/tiny/").display().to_string()),
        "{stdout}"
    );
    // With every step inside run.warmup_steps there is no speed to print, not a zero one.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["--set", "run.warmup_steps=10"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .starts_with("tiny: 4 steps, none timed (all within run.warmup_steps), test accuracy"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------- measurement and report

#[test]
fn report_recomputes_the_table_from_metrics_files() {
    use runner::report::{self, Format};
    let dirs = report::find_runs(&[root().join("tests/fixtures/report")]).unwrap();
    assert_eq!(dirs.len(), 4);
    let runs: Vec<_> = dirs.iter().map(|d| report::load_run(d).unwrap()).collect();
    let rows = report::rows(&runs, Some("default")).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.recipe.as_str()).collect();
    assert_eq!(names, ["default", "gc_every_step", "tuned"]);
    // default: medians of the timed steps (after 2 warm-up steps) 58.0 and 58.5.
    assert_eq!(rows[0].runs, 2);
    assert!((rows[0].ms_median - 58.25).abs() < 1e-12);
    assert!((rows[1].ms_median - 112.5).abs() < 1e-12);
    assert!((rows[1].ratio - 112.5 / 58.25).abs() < 1e-12 && !rows[1].within_noise);
    assert!(rows[2].within_noise, "58.45 vs 58.25 is noise");
    // Cleanup share: 50 ms of each ~112.7 ms timed step.
    let cleanup = 100.0 * 50.0 * 6.0 / (112.0 + 113.0 + 112.0 + 114.0 + 112.0 + 113.0);
    assert!((rows[1].cleanup_pct - cleanup).abs() < 1e-9);
    assert_eq!(rows[0].gpu_util_pct, Some(92.5));
    // Start-up (CUDA runs record their kernel counts): a cold and a warm run of default,
    // a warm one of tuned; gc_every_step's summary predates start-up records.
    assert_eq!(rows[0].startup_s, Some((8.5, 181.5)));
    assert_eq!(
        (rows[1].startup_s, rows[2].startup_s),
        (None, Some((9.25, 9.25)))
    );
    let dir = root().join("tests/fixtures/report");
    expect(
        &dir.join("expected.txt"),
        &report::render(&rows, Format::Table),
    );
    expect(&dir.join("expected.md"), &report::render(&rows, Format::Md));
    expect(
        &dir.join("expected.csv"),
        &report::render(&rows, Format::Csv),
    );
}

#[test]
fn report_command_prints_markdown_and_draws_a_plot() {
    let out_dir = tempdir("report-cli");
    let svg = out_dir.join("cmp.svg");
    let out = runner_cmd()
        .args([
            "report",
            "tests/fixtures/report",
            "--baseline",
            "default",
            "--format",
            "md",
            "--plot",
        ])
        .arg(&svg)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let want = std::fs::read_to_string(root().join("tests/fixtures/report/expected.md")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg")
            && picture.contains("gc_every_step")
            && picture.contains("optimizer step")
    );
    // Drawn again over its own earlier plot; never over another file, nor to a name
    // that is not .svg (a run's metrics.jsonl was replaced by a picture).
    let again = runner_cmd()
        .args(["report", "tests/fixtures/report", "--plot"])
        .arg(&svg)
        .output()
        .unwrap();
    expect_exit(&again, 0);
    let records = out_dir.join("metrics.jsonl");
    std::fs::write(&records, "{\"step\": 1}\n").unwrap();
    let kept = out_dir.join("notes.svg");
    std::fs::write(&kept, "my notes\n").unwrap();
    // A folder that is not there is found before the table is printed, not after it.
    let nowhere = out_dir.join("no-such-folder/plot.svg");
    for (target, want) in [
        (&records, "give a name ending in .svg".to_string()),
        (&kept, "exists and is not an SVG file".to_string()),
        (
            &nowhere,
            format!(
                "its folder {} does not exist",
                out_dir.join("no-such-folder").display()
            ),
        ),
    ] {
        let refused = runner_cmd()
            .args(["report", "tests/fixtures/report", "--plot"])
            .arg(target)
            .output()
            .unwrap();
        expect_exit(&refused, 2);
        assert!(String::from_utf8_lossy(&refused.stderr).contains(&want));
        assert!(
            refused.stdout.is_empty(),
            "{target:?}: the table was printed"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&records).unwrap(),
        "{\"step\": 1}\n"
    );
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "my notes\n");
    let bad = runner_cmd()
        .args(["report", "tests/fixtures/report", "--baseline", "nope"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("the recipes here are: default, gc_every_step, tuned"));
    let none = runner_cmd()
        .args(["report", "tests/fixtures/invalid"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
}

#[test]
fn a_cpu_run_records_every_phase_and_its_profile_window() {
    let p = plan_from(
        "phases",
        &format!("{FASHION}\n[loader]\nbatch_size = 32\nworkers = 1\n[cleanup]\nevery = 4\nactions = [\"trim_host\"]\n[run]\nmax_steps = 24\nwarmup_steps = 2\neval = \"never\"\n[log]\nevery = 3\n[profile]\nsteps = \"10..15\"\nsample_ms = 10\n"),
    );
    let out = run::execute(&p, &RunOptions { quiet: true }).unwrap();
    let text = std::fs::read_to_string(out.dir.join("metrics.jsonl")).unwrap();
    let recs = records(&out.dir);
    assert_eq!(recs.len(), 24);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for field in [
            "data_wait_ms",
            "h2d_ms",
            "forward_backward_ms",
            "optimizer_ms",
            "cleanup_ms",
            "log_ms",
            "mem_query_ms",
            "iter_ms",
            "synced",
            "t_ms",
            "cpu_util_pct",
        ] {
            assert!(v.get(field).is_some(), "{field} missing from {line}");
        }
    }
    for r in &recs {
        let phases = r.data_wait_ms
            + r.h2d_ms
            + r.forward_backward_ms
            + r.optimizer_ms
            + r.cleanup_ms
            + r.log_ms
            + r.mem_query_ms;
        assert!(
            phases <= r.iter_ms + 1e-6,
            "step {}: phases {phases} > step {}",
            r.step,
            r.iter_ms
        );
        assert!(r.forward_backward_ms > 0.0 && r.optimizer_ms > 0.0);
        assert_eq!(r.synced, (10..15).contains(&r.step), "step {}", r.step);
        assert_eq!(
            r.log_ms > 0.0,
            r.step % 3 == 0,
            "losses are read every 3 steps (step {})",
            r.step
        );
        assert_eq!(r.cleanup_mem_before_bytes.is_some(), r.step % 4 == 0);
        let u = r.cpu_util_pct.expect("the /proc sampler covers every step");
        assert!((0.0..=100.0).contains(&u));
    }
    assert!(recs.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
    let s = summary(&out.dir);
    assert_eq!(s.util_source, "proc");
    assert!(
        s.cpu_util_pct.unwrap() > 5.0,
        "a training process uses the CPU"
    );
    assert_eq!(s.synced_phases.as_ref().unwrap().steps, 5);
    assert_eq!(s.phases.as_ref().unwrap().steps, 24 - 2 - 5);
    assert!(s.cleanup_freed_bytes.is_some());
    let samples = std::fs::read_to_string(out.dir.join("samples.jsonl")).unwrap();
    assert!(samples.lines().count() >= 3);
}

#[test]
fn a_bad_profile_window_is_an_error() {
    let l = recipe::parse(
        Path::new("p.toml"),
        "[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n[profile]\nsteps = \"30..20\"\n"
            .into(),
    )
    .unwrap();
    let r = plan::validate(&l, &Machine::cpu_only())
        .unwrap_err()
        .to_string();
    assert!(
        r.contains("p.toml:6:9: profile.steps: \"30..20\" is not a window of steps"),
        "{r}"
    );
    assert_eq!(plan::parse_steps("20..30"), Some(20..=29));
    assert_eq!(plan::parse_steps("20..=30"), Some(20..=30));
    assert_eq!(plan::parse_steps("0..3"), None);
}

// ---------------------------------------------------------------- sweeps and sharing

fn grid_cells(src: &str) -> Vec<runner::sweep::Cell> {
    let dir = root().join("tests/fixtures/sweep");
    let l =
        recipe::parse(&dir.join("inline_grid.toml"), src.into()).unwrap_or_else(|r| panic!("{r}"));
    runner::sweep::cells(&l, 256).unwrap_or_else(|r| panic!("{r}"))
}

#[test]
fn a_three_key_grid_expands_in_the_documented_order() {
    let cells = grid_cells(
        "extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"loader.workers\" = [0, 2]\n\"cleanup.every\" = [\"never\", \"step\"]\noptim.lr = [0.1, 0.01]\n",
    );
    let names: Vec<&str> = cells.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "g/workers=0,cleanup.every=never,optim.lr=0.1",
            "g/workers=0,cleanup.every=never,optim.lr=0.01",
            "g/workers=0,cleanup.every=step,optim.lr=0.1",
            "g/workers=0,cleanup.every=step,optim.lr=0.01",
            "g/workers=2,cleanup.every=never,optim.lr=0.1",
            "g/workers=2,cleanup.every=never,optim.lr=0.01",
            "g/workers=2,cleanup.every=step,optim.lr=0.1",
            "g/workers=2,cleanup.every=step,optim.lr=0.01",
        ]
    );
    assert_eq!(
        cells.iter().map(|c| c.index).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    let c = &cells[6];
    assert_eq!(c.loaded.recipe.loader.workers, 2);
    assert_eq!(c.loaded.recipe.cleanup.every, runner::recipe::Every::Step);
    assert_eq!(c.loaded.recipe.optim.lr, 0.1);
    assert_eq!(
        c.loaded.recipe.model.hidden,
        Some(vec![32]),
        "the rest comes from base.toml"
    );
}

/// Values a directory name cannot tell apart (`x/y` and `x_y`) do not give two cells one
/// name, which would share a runs directory and a report row.
#[test]
fn cells_whose_values_name_alike_are_told_apart() {
    let cells = grid_cells(
        "extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"backend.cache_dir\" = [\"x/y\", \"x_y\", \"z\"]\n",
    );
    let names: Vec<&str> = cells.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "g/cache_dir=x_y,cell=0",
            "g/cache_dir=x_y,cell=1",
            "g/cache_dir=z"
        ]
    );
    assert_eq!(
        cells[1].loaded.recipe.name.as_deref(),
        Some("g/cache_dir=x_y,cell=1")
    );
}

#[test]
fn cell_ids_are_stable_and_follow_the_resolved_recipe() {
    let a =
        grid_cells("extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"loader.workers\" = [0, 2]\n");
    let b =
        grid_cells("extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"loader.workers\" = [0, 2]\n");
    assert_eq!(
        a.iter().map(|c| &c.id).collect::<Vec<_>>(),
        b.iter().map(|c| &c.id).collect::<Vec<_>>()
    );
    assert_ne!(a[0].id, a[1].id);
    assert_eq!(a[0].id.len(), 12);
    // The same cell written out by hand, without extends or a grid, has the same id...
    let inline = std::fs::read_to_string(root().join("tests/fixtures/sweep/base.toml"))
        .unwrap()
        .replace("name = \"tiny\"", "name = \"g/workers=2\"")
        .replace("batch_size = 32", "batch_size = 32\nworkers = 2");
    let l = recipe::parse(&root().join("tests/fixtures/sweep/x.toml"), inline).unwrap();
    assert_eq!(runner::sweep::cell_id(&l.recipe), a[1].id);
    // ...and where the logs go does not change what runs.
    let logged = grid_cells("extends = \"base.toml\"\nname = \"g\"\n[log]\ndir = \"elsewhere\"\n[sweep]\n\"loader.workers\" = [0, 2]\n");
    assert_eq!(logged[1].id, a[1].id);
}

#[test]
fn bad_grids_point_into_the_file() {
    let dir = root().join("tests/fixtures/sweep");
    let err = |src: &str| {
        let l = recipe::parse(&dir.join("bad.toml"), src.into()).unwrap();
        runner::sweep::cells(&l, 4)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = err("extends = \"base.toml\"\n[sweep]\n\"loader.wokers\" = [0, 2]\n");
    assert!(
        e.contains("bad.toml:3:19: sweep.loader.wokers: `loader.wokers` is not a recipe key")
            && e.contains("did you mean `loader.workers`?"),
        "{e}"
    );
    let e = err("extends = \"base.toml\"\n[sweep]\n\"loader.workers\" = [0, \"two\"]\n");
    assert!(
        e.contains("bad.toml:3:24: loader.workers: invalid type: string \"two\""),
        "{e}"
    );
    let e = err("extends = \"base.toml\"\n[sweep]\n\"loader.workers\" = 2\n");
    assert!(e.contains("a sweep value must be a list"), "{e}");
    let e =
        err("extends = \"base.toml\"\n[sweep]\n\"loader.workers\" = [0]\nloader.workers = [1]\n");
    assert!(e.contains("the same key is swept twice"), "{e}");
    let e = err("extends = \"base.toml\"\n[sweep]\n\"loader.workers\" = [0, 1, 2]\n\"optim.lr\" = [0.1, 0.2]\n");
    assert!(
        e.contains("bad.toml:2:1: sweep: the grid has 6 cells (3 × 2), over the cap of 4"),
        "{e}"
    );
}

#[test]
fn extends_chains_merge_by_table_and_refuse_cycles() {
    let dir = tempdir("extends");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a.toml"), "seed = 1\n[model]\narch = \"mlp\"\nhidden = [8]\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data.bin\"\n[loader]\nbatch_size = 8\nworkers = 1\n").unwrap();
    std::fs::copy(
        root().join("datasets/cifar10_sample/test_batch.bin"),
        dir.join("data.bin"),
    )
    .unwrap();
    std::fs::write(
        dir.join("sub/b.toml"),
        "extends = \"../a.toml\"\nseed = 2\n[loader]\nbatch_size = 4\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("sub/c.toml"),
        "extends = \"b.toml\"\n[loader]\nworkers = \"x\"\n[optim]\nlr = 0.5\n",
    )
    .unwrap();
    let l = recipe::load(&dir.join("sub/c.toml")).unwrap();
    let r = &l.recipe;
    assert_eq!(
        (r.seed, r.loader.batch_size, r.optim.lr),
        (2, 4, 0.5),
        "each file's tables over its parent's, key by key"
    );
    let e = l.findings.to_string();
    assert!(
        e.contains("sub/c.toml:3:11: loader.workers: invalid type: string \"x\""),
        "{e}"
    );
    // A parent's relative data path is the parent's, and its keys point into the parent.
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap_err();
    assert!(!p.to_string().contains("does not exist"), "{p}");
    let bad = recipe::load_with(&dir.join("sub/b.toml"), &["model.hidden=[0]".into()]).unwrap();
    let p = plan::validate(&bad, &Machine::cpu_only())
        .unwrap_err()
        .to_string();
    assert!(
        p.contains("--set:1:14: model.hidden: a hidden layer of size 0"),
        "{p}"
    );
    let ok = plan::validate(
        &recipe::load(&dir.join("sub/b.toml")).unwrap(),
        &Machine::cpu_only(),
    )
    .unwrap();
    assert_eq!(
        ok.resolved.data.train.as_deref(),
        Some(
            std::fs::canonicalize(dir.join("data.bin"))
                .unwrap()
                .to_str()
                .unwrap()
        )
    );
    let l = recipe::load(&dir.join("sub/b.toml")).unwrap();
    let w = l.error("model.arch", "x").to_string();
    assert!(w.contains("a.toml:3:8: model.arch"), "{w}");
    // Cycles.
    std::fs::write(dir.join("x.toml"), "extends = \"y.toml\"\n").unwrap();
    std::fs::write(dir.join("y.toml"), "extends = \"x.toml\"\n").unwrap();
    let e = recipe::load(&dir.join("x.toml")).unwrap_err().to_string();
    assert!(
        e.contains("extends forms a cycle: x.toml → y.toml → x.toml"),
        "{e}"
    );
    let e = recipe::load(&dir.join("sub/missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read recipe"), "{e}");
}

#[test]
fn overrides_on_the_command_line_are_typed() {
    let out = runner_cmd()
        .args([
            "validate",
            "recipes/quickstart.toml",
            "--set",
            "loader.workers=four",
            "--set",
            "loader.wokers=2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: --set:1:16: loader.workers: invalid type: string \"four\", expected a non-negative integer"), "{err}");
    assert!(
        err.contains("error: --set:1:1: loader.wokers: unknown key in [loader]"),
        "{err}"
    );
    let show = runner_cmd()
        .args([
            "show",
            "recipes/quickstart.toml",
            "--set",
            "loader.workers=2",
            "--set",
            "cleanup.every=\"step\"",
        ])
        .output()
        .unwrap();
    expect_exit(&show, 0);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("workers = 2") && text.contains("every = \"step\""),
        "{text}"
    );
}

fn sweep_dir(logs: &Path) -> PathBuf {
    let sweeps = logs.join("tiny_grid/sweeps");
    only_run(&sweeps)
}

fn statuses(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir.join("cells"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn shards_split_a_grid_and_their_union_is_the_whole() {
    let logs = tempdir("shards");
    let run = |extra: &[&str]| {
        let out = runner_logged(
            &logs,
            &["tests/fixtures/sweep/tiny_grid.toml", "--quiet"],
            extra,
        );
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = run(&["--shard", "1/2"]);
    assert!(first.contains("2 of 4 cells done"), "{first}");
    let ran1: Vec<&str> = first
        .lines()
        .filter(|l| l.contains(" steps, median "))
        .collect();
    assert_eq!(ran1.len(), 2);
    assert!(
        ran1[0].starts_with("tiny_grid/workers=0,optim.lr=0.1:")
            && ran1[1].starts_with("tiny_grid/workers=1,optim.lr=0.1:"),
        "{ran1:?}"
    );
    let second = run(&["--shard", "2/2"]);
    assert!(second.contains("4 of 4 cells done"), "{second}");
    let dir = sweep_dir(&logs);
    assert!(statuses(&dir).iter().all(|(_, s)| s == "done"));
    // The report over the union has every cell, once.
    let rep = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(&logs)
        .output()
        .unwrap();
    let csv = String::from_utf8_lossy(&rep.stdout);
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    // And the Slurm script runs one array task per cell, resuming.
    let out = runner_logged(
        &logs,
        &["sweep", "--slurm", "tests/fixtures/sweep/tiny_grid.toml"],
        &[],
    );
    expect_exit(&out, 0);
    let script = std::fs::read_to_string(dir.join("slurm.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --array=0-3")
            && script.contains("--cell $SLURM_ARRAY_TASK_ID")
            && script.contains("--resume")
            && !script.contains("--max-cells"),
        "{script}"
    );
    // A cap given here is the tasks' cap too (a grid over the default one failed in every
    // task), and the warm-up job's.
    let out = runner_logged(
        &logs,
        &[
            "sweep",
            "--slurm",
            "tests/fixtures/sweep/tiny_grid.toml",
            "--max-cells",
            "4",
            "--set",
            "slurm.warmup=true",
        ],
        &[],
    );
    expect_exit(&out, 0);
    // `<recipe>: 4 array task(s) in <sweep dir>/slurm.sbatch`
    let stdout = String::from_utf8_lossy(&out.stdout);
    let array = stdout
        .lines()
        .find_map(|l| l.split_once(" array task(s) in "))
        .map(|(_, p)| PathBuf::from(p))
        .unwrap_or_else(|| panic!("{stdout}"));
    for script in [array.clone(), array.with_file_name("warmup.sbatch")] {
        let text = std::fs::read_to_string(&script).unwrap();
        assert!(
            text.contains(" --max-cells 4"),
            "{}:\n{text}",
            script.display()
        );
    }
}

#[test]
fn a_gpu_grid_gets_a_warmup_job_and_its_array_starts_after_it() {
    // A stand-in sbatch on PATH: it logs its arguments and answers as sbatch does.
    let logs = tempdir("slurm-warmup");
    let bin = logs.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = logs.join("calls.txt");
    let fake = bin.join("sbatch");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$1\" in --parsable) echo '4242;cluster' ;; *) echo 'Submitted batch job 4243' ;; esac\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let submit = |sets: &[&str]| {
        let _ = std::fs::remove_file(&calls);
        let mut cmd = runner_cmd();
        cmd.args([
            "sweep",
            "--slurm",
            "--submit",
            "tests/fixtures/sweep/tiny_grid.toml",
        ]);
        cmd.args(["--set", &format!("log.dir=\"{}\"", logs.display())]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.env("PATH", &path).output().unwrap();
        expect_exit(&out, 0);
        let calls = std::fs::read_to_string(&calls).unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), calls)
    };
    let dir = |calls: &str| {
        let first = calls.lines().next().unwrap();
        PathBuf::from(first.rsplit(' ').next().unwrap())
            .parent()
            .unwrap()
            .to_path_buf()
    };

    // Tasks with a GPU: the warm-up job first, then the array depending on it.
    let (stdout, calls) = submit(&["slurm.gpus_per_task=1"]);
    let lines: Vec<&str> = calls.lines().collect();
    let sweep = dir(&calls);
    assert_eq!(
        lines,
        [
            format!("--parsable {}", sweep.join("warmup.sbatch").display()),
            format!(
                "--dependency=afterany:4242 {}",
                sweep.join("slurm.sbatch").display()
            ),
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains("warm-up job 4242: the array starts when it ends"),
        "{stdout}"
    );
    assert!(stdout.contains("Submitted batch job 4243"), "{stdout}");
    // Slurm 23.11 refuses --gpus-per-task without a task count.
    let array = std::fs::read_to_string(sweep.join("slurm.sbatch")).unwrap();
    assert!(array.contains("#SBATCH --ntasks=1\n"), "{array}");
    let warmup = std::fs::read_to_string(sweep.join("warmup.sbatch")).unwrap();
    assert!(
        warmup.contains("#SBATCH --gpus-per-task=1")
            && warmup.contains("#SBATCH --ntasks=1")
            && !warmup.contains("--array")
            && warmup.contains(" warmup ")
            && warmup.contains("tiny_grid.toml --set ")
            && warmup.contains(" --set slurm.gpus_per_task=1"),
        "{warmup}"
    );

    // On the CPU (no GPU asked for) there is nothing to compile: the array alone, unless
    // slurm.warmup asks for it.
    let (_, calls) = submit(&[]);
    assert_eq!(calls.lines().count(), 1, "{calls}");
    assert!(!calls.contains("--dependency"), "{calls}");
    let (_, calls) = submit(&["slurm.gpus_per_task=1", "slurm.warmup=false"]);
    assert_eq!(calls.lines().count(), 1, "{calls}");
    let (_, calls) = submit(&["slurm.warmup=true"]);
    assert_eq!(calls.lines().count(), 2, "{calls}");
}

#[test]
fn resume_reruns_only_what_was_not_done() {
    let logs = tempdir("resume");
    let run = |extra: &[&str]| {
        runner_logged(
            &logs,
            &["tests/fixtures/sweep/tiny_grid.toml", "--quiet"],
            extra,
        )
    };
    assert_eq!(run(&[]).status.code(), Some(0));
    let dir = sweep_dir(&logs);
    let files: Vec<String> = statuses(&dir).into_iter().map(|(f, _)| f).collect();
    // Simulate a kill during cell 2: its status says running; cell 3 never started.
    let p2 = dir.join("cells").join(&files[2]);
    let text = std::fs::read_to_string(&p2)
        .unwrap()
        .replace("\"done\"", "\"running\"");
    std::fs::write(&p2, text).unwrap();
    std::fs::remove_file(dir.join("cells").join(&files[3])).unwrap();
    let out = run(&["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ran: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" steps, median "))
        .collect();
    assert_eq!(
        ran.len(),
        2,
        "only the interrupted and the missing cell run again: {stdout}"
    );
    assert!(
        ran[0].starts_with("tiny_grid/workers=1,optim.lr=0.1:")
            && ran[1].starts_with("tiny_grid/workers=1,optim.lr=0.01:"),
        "{ran:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 cell(s) already done were skipped"));
    assert!(statuses(&dir).iter().all(|(_, s)| s == "done"));
}

#[test]
fn a_cell_is_never_marked_done_before_its_run_completes() {
    let l = recipe::load(&root().join("tests/fixtures/sweep/tiny_grid.toml")).unwrap();
    let cells = runner::sweep::cells(&l, 256).unwrap();
    let logs = tempdir("killed");
    let dir =
        runner::sweep::SweepDir::open(&logs, "tiny_grid", Path::new("tiny_grid.toml"), &cells)
            .unwrap();
    let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runner::sweep::execute(&dir, &cells, Default::default(), |c, _| {
            if c.index == 1 {
                panic!("killed while running cell 1");
            }
            Err(runner::sweep::CellEnd {
                dir: None,
                message: "failed on purpose".into(),
                state: runner::sweep::State::Failed,
                stop_sweep: false,
            })
        })
    }));
    assert!(killed.is_err());
    let s: Vec<String> = statuses(&dir.dir).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        s,
        ["failed", "running"],
        "cell 0 failed, cell 1 was running when killed, 2 and 3 never started"
    );
    assert!(!dir.is_done(&cells[1]));
}

#[test]
fn the_schema_accepts_every_shipped_recipe_and_rejects_a_wrong_one() {
    let schema = runner::recipe::schema::json_schema();
    let shipped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("recipe.schema.json")).unwrap())
            .unwrap();
    assert_eq!(
        shipped, schema,
        "recipe.schema.json is stale: cargo run --release -- schema -o recipe.schema.json"
    );
    let validator = jsonschema::validator_for(&schema).unwrap();
    let as_json = |path: &Path| -> serde_json::Value {
        let t: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        serde_json::to_value(t).unwrap()
    };
    for f in toml_files(&root().join("recipes"))
        .into_iter()
        .chain(toml_files(&root().join("tests/fixtures/sweep")))
    {
        let v = as_json(&f);
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", f.display());
    }
    for bad in [
        "unknown_key",
        "wrong_type",
        "unknown_arch",
        "cleanup_every_zero",
    ] {
        let v = as_json(&root().join(format!("tests/fixtures/invalid/{bad}.toml")));
        assert!(
            !validator.is_valid(&v),
            "the schema accepts tests/fixtures/invalid/{bad}.toml"
        );
    }
}

#[test]
fn a_cells_run_directory_reruns_on_its_own() {
    let logs = tempdir("rerun");
    let out = runner_logged(
        &logs,
        &[
            "tests/fixtures/sweep/tiny_grid.toml",
            "--quiet",
            "--cell",
            "3",
        ],
        &[],
    );
    expect_exit(&out, 0);
    let run_dir = only_run(&logs.join("tiny_grid/workers=1,optim.lr=0.01"));
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("env.json")).unwrap()).unwrap();
    let sources = env["sources"].as_array().unwrap();
    assert_eq!(
        sources.len(),
        2,
        "tiny_grid.toml and the base.toml it extends: {env}"
    );
    assert!(sources[0]["sha256"].as_str().unwrap().len() == 64);
    assert_eq!(
        env["overrides"][0].as_str().unwrap(),
        format!("log.dir=\"{}\"", logs.display())
    );
    let again = runner_cmd()
        .arg(run_dir.join("recipe.toml"))
        .arg("--quiet")
        .output()
        .unwrap();
    expect_exit(&again, 0);
    let a = records(&run_dir);
    let newest = std::fs::read_dir(logs.join("tiny_grid/workers=1,optim.lr=0.01"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    assert_ne!(newest, run_dir);
    assert_eq!(
        records(&newest).iter().map(|r| r.loss).collect::<Vec<_>>(),
        a.iter().map(|r| r.loss).collect::<Vec<_>>(),
        "the same run again"
    );
}

// ---------------------------------------------------------------- variable-length text

/// Logits of each text model for two sequences (the first ending in token `last`), with
/// the batch padded to `len` positions.
fn text_logits(arch: &str, extra: &str, len: usize, pad_id: i32, last: i32) -> Vec<f32> {
    use burn::tensor::{Bool, Int, TensorData};
    type B = burn::backend::Flex;
    let src = format!("[model]\narch = \"{arch}\"\n{extra}\n[data]\nformat = \"jsonl\"\ntrain = \"../datasets/rotten_tomatoes/train.jsonl\"\n[padding]\nmax_length = 64\npad_id = {}\n", pad_id.max(0));
    let l = recipe::parse(&root().join("recipes/m.toml"), src).unwrap();
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap_or_else(|r| panic!("{r}"));
    let d = runner::backend::cpu_device();
    let net: Net<B> = Net::new(
        &p.model,
        Shape::Text {
            vocab: 50,
            max_len: 64,
        },
        5,
        &d,
    );
    let seqs: [&[i32]; 2] = [&[5, 9, 2, last], &[3, 3, 8, 1, 4, 6, 2]];
    let mut ids = vec![];
    let mut pad = vec![];
    for s in seqs {
        for j in 0..len {
            ids.push(if j < s.len() { s[j] } else { pad_id });
            pad.push(j >= s.len());
        }
    }
    let input = Input::Tokens {
        ids: Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [2, len]), &d),
        pad: Tensor::<B, 2, Bool>::from_data(TensorData::new(pad, [2, len]), &d),
        lengths: Tensor::<B, 1, Int>::from_data(TensorData::new(vec![4i32, 7], [2]), &d),
    };
    net.forward(input)
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn padding_never_changes_a_sequences_logits() {
    for (arch, extra) in [
        ("bag", "embed_dim = 16\nhidden = [8]"),
        ("lstm", "embed_dim = 16\nhidden_size = 12\nlayers = 2"),
        (
            "transformer",
            "embed_dim = 16\nheads = 2\nlayers = 2\nff_dim = 32\ndropout = 0.0",
        ),
    ] {
        let tight = text_logits(arch, extra, 7, 0, 7);
        for (len, pad_id) in [(16, 0), (40, 0), (16, 11)] {
            let loose = text_logits(arch, extra, len, pad_id, 7);
            for (a, b) in tight.iter().zip(&loose) {
                assert!((a - b).abs() < 1e-5, "{arch}: padding to {len} with id {pad_id} changed the logits: {tight:?} vs {loose:?}");
            }
        }
        // And the comparison can fail: a different last real token changes them.
        let other = text_logits(arch, extra, 7, 0, 8);
        let moved = tight
            .iter()
            .zip(&other)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            moved > 1e-4,
            "{arch}: changing a real token left the logits alone"
        );
    }
}

#[test]
fn a_short_run_on_rotten_tomatoes_beats_chance_and_counts_padding() {
    let body =
        std::fs::read_to_string(root().join("recipes/text/rotten_tomatoes_bucket.toml")).unwrap();
    assert!(body.contains("extends"));
    let logs = tempdir("rt");
    let out = runner_logged(
        &logs,
        &[
            "recipes/text/rotten_tomatoes.toml",
            "--quiet",
            "--set",
            "run.epochs=4",
        ],
        &[],
    );
    expect_exit(&out, 0);
    let dir = only_run(&logs.join("rotten_tomatoes"));
    let s = summary(&dir);
    let acc = s.test_accuracy.unwrap();
    // The test split is 61% positive: beat always-positive, not just a coin.
    assert!(acc > 0.65, "test accuracy {acc}");
    let recs = records(&dir);
    for r in &recs {
        let (real, padded) = (r.real_tokens.unwrap(), r.padded_tokens.unwrap());
        assert!(real <= padded && real > 0);
        let waste = 100.0 * (padded - real) as f64 / padded as f64;
        assert!((r.pad_waste_pct.unwrap() - waste).abs() < 1e-9);
    }
    let total: u64 = recs.iter().map(|r| r.padded_tokens.unwrap()).sum();
    assert_eq!(s.padded_tokens, Some(total));
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    assert_eq!(tok["vocab"][0], "<pad>");
    assert_eq!(tok["vocab"][1], "<unk>");
    // What the run wrote is what `runner eval` reads back.
    let out = runner_cmd().arg("eval").arg(&dir).output().unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("accuracy {:.2}%", 100.0 * acc)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bucketed_batches_pad_less_than_dynamic_on_the_same_data() {
    let logs = tempdir("buckets");
    let run = |recipe: &str| {
        let out = runner_cmd()
            .args([
                recipe,
                "--quiet",
                "--set",
                "run.epochs=1",
                "--set",
                "run.eval=\"never\"",
                "--set",
            ])
            .arg(format!("log.dir=\"{}\"", logs.display()))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let name = std::path::Path::new(recipe)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let dir = only_run(&logs.join(name));
        summary(&dir)
    };
    let dynamic = run("recipes/text/spamassassin.toml");
    let bucket = run("recipes/text/spamassassin_bucket.toml");
    let fixed = run("recipes/text/spamassassin_max_length.toml");
    assert_eq!(
        dynamic.real_tokens, bucket.real_tokens,
        "the same tokens, batched differently"
    );
    let pads = |s: &Summary| s.padded_tokens.unwrap() - s.real_tokens.unwrap();
    assert!(
        pads(&bucket) * 10 < pads(&dynamic) * 6,
        "bucket pads {} tokens, dynamic {}",
        pads(&bucket),
        pads(&dynamic)
    );
    assert!(pads(&dynamic) <= pads(&fixed));
    assert_eq!(
        fixed.padded_tokens.unwrap() % 1024,
        0,
        "max_length pads every row to 1024"
    );
}

#[test]
fn text_recipes_are_checked_like_any_other() {
    let bad = |src: &str| {
        let l = recipe::parse(&root().join("recipes/text/x.toml"), src.into()).unwrap();
        plan::validate(&l, &Machine::cpu_only())
            .unwrap_err()
            .to_string()
    };
    let e = bad("[model]\narch = \"small_cnn\"\n[data]\nformat = \"synthetic\"\n[padding]\nstrategy = \"bucket\"\n");
    assert!(
        e.contains("x.toml:5:1: padding: applies to text data (format = \"jsonl\")"),
        "{e}"
    );
    let e = bad("[model]\narch = \"lstm\"\n[data]\nformat = \"synthetic\"\n");
    assert!(
        e.contains("model.arch: lstm reads token sequences, but the data are images"),
        "{e}"
    );
    let e = bad("[model]\narch = \"transformer\"\nembed_dim = 30\nheads = 4\n[data]\nformat = \"jsonl\"\ntrain = \"../../datasets/rotten_tomatoes/train.jsonl\"\n");
    assert!(
        e.contains("model.heads: 4 heads do not divide embed_dim = 30"),
        "{e}"
    );
    let e = bad("[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"../../datasets/rotten_tomatoes/train.jsonl\"\n[padding]\nstrategy = \"dynamic\"\nbuckets = 4\nmultiple_of = 0\n");
    assert!(
        e.contains("padding.buckets: only applies to strategy = \"bucket\"")
            && e.contains("padding.multiple_of: 0 cannot be a multiple"),
        "{e}"
    );
    // A bad line in the data is found when the recipe is checked, with its file and line.
    let dir = tempdir("badjsonl");
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"label\": 0, \"text\": \"fine\"}\n{\"label\": 1, \"txt\": \"typo\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("r.toml"),
        "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"t.jsonl\"\n",
    )
    .unwrap();
    let out = runner_cmd()
        .arg("validate")
        .arg(dir.join("r.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.jsonl line 2: no field \"text\" (the line has \"label\", \"txt\")"),
        "{err}"
    );
}

// ---------------------------------------------------------------- start-up, kernel cache, warm-up

/// A synthetic-data recipe in `dir` (100 training samples, 50 test samples, batch 32).
fn tiny_recipe(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let recipe = dir.join(format!("{name}.toml"));
    std::fs::write(
        &recipe,
        format!("name = \"{name}\"\n[backend]\nkind = \"auto\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\nsynthetic = {{ samples = 100, test_samples = 50 }}\n[loader]\nbatch_size = 32\n[run]\nepochs = 1\nwarmup_steps = 1\neval = \"end\"\n[log]\ndir = \"{}\"\n{extra}", dir.join("runs").display()),
    )
    .unwrap();
    recipe
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_run_records_its_startup_and_where_kernels_are_cached() {
    let dir = tempdir("startup");
    let recipe = tiny_recipe(&dir, "startup", "");
    let out = runner_cmd()
        .arg(&recipe)
        .env("RUNNER_CACHE_DIR", dir.join("kc"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("startup: first step done ") && err.contains(" s after start"),
        "{err}"
    );
    let run = only_run(&dir.join("runs/startup"));
    let s = summary(&run);
    let startup = s.startup_s.expect("startup_s is written");
    assert!(startup > 0.0 && startup < 60.0, "{startup}");
    assert!(s.first_step_ms.is_some_and(|ms| ms > 0.0), "{s:?}");
    // The CPU compiles nothing: no kernel counts, and the cache is recorded as unused.
    assert!(s.kernels.is_none());
    let env = json(&run.join("env.json"));
    assert_eq!(env["kernels"]["dir"], dir.join("kc").display().to_string());
    assert_eq!(env["kernels"]["chosen_by"], "$RUNNER_CACHE_DIR");
    assert_eq!(env["kernels"]["used"], false);
    assert_eq!(env["kernels"]["autotune"], "balanced");
    assert_eq!(env["kernels"]["conv"], "autotune");

    // The recipe key wins over the variable, relative to the directory it was given in;
    // -q silences the start-up line.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "backend.cache_dir=\"from-key\""])
        .args(["--set", "backend.autotune=\"minimal\""])
        .args(["--set", "backend.conv=\"implicit_gemm\""])
        .args(["--set", "profile.memory=false"])
        .env("RUNNER_CACHE_DIR", dir.join("kc"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("first step done"));
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs/startup"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &run)
        .collect();
    let env = json(&runs[0].join("env.json"));
    assert_eq!(env["kernels"]["chosen_by"], "backend.cache_dir");
    assert_eq!(env["kernels"]["autotune"], "minimal");
    assert_eq!(env["kernels"]["conv"], "implicit_gemm");
    // profile.memory = false: the pool is never asked, so no step spends time asking it.
    let asked = |run: &Path| records(run).iter().map(|r| r.mem_query_ms).sum::<f64>();
    assert_eq!(asked(&runs[0]), 0.0);
    assert_eq!(
        env["kernels"]["dir"],
        root().join("from-key").display().to_string()
    );
    assert!(
        std::fs::read_to_string(runs[0].join("recipe.toml"))
            .unwrap()
            .contains(&format!(
                "cache_dir = \"{}\"",
                root().join("from-key").display()
            )),
        "the resolved recipe keeps the cache directory, absolute"
    );
    assert!(
        !root().join("from-key").exists(),
        "a CPU run creates no cache"
    );
}

#[test]
fn warmup_runs_every_shape_once_and_creates_no_run() {
    let dir = tempdir("warmup");
    let recipe = tiny_recipe(&dir, "warm", "[optim]\naccumulation_steps = 2\n");
    let out = runner_cmd().arg("warmup").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // 100 samples in batches of 32: 32 and a last 4 (two shapes), each a step of 2
    // micro-batches; 50 test samples: 32 and 18, filled up to 32 (one shape).
    assert!(
        stdout.starts_with("warm: warmed up on flex (cpu)")
            && stdout.contains("2 training and 1 evaluation batch shape(s), 4 micro-batches"),
        "{stdout}"
    );
    assert!(!dir.join("runs").exists(), "warmup created a run directory");

    // A grid warms up once per distinct set of kernels: the learning rate changes none,
    // the batch size does.
    let grid = tiny_recipe(
        &dir,
        "grid",
        "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n\"loader.batch_size\" = [16, 32]\n",
    );
    let out = runner_cmd().arg("warmup").arg(&grid).output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        !dir.join("runs").exists(),
        "warmup of a grid wrote sweep state"
    );
    // Label smoothing on or off, clipping on or off run different kernels; the clipping
    // norm itself does not.
    for (sweep, lines) in [
        ("\"optim.label_smoothing\" = [0.0, 0.1]", 2),
        ("\"optim.clip_grad_norm\" = [1.0, 2.0]", 1),
        // On CUDA the two convolution strategies compile different kernels.
        ("\"backend.conv\" = [\"autotune\", \"implicit_gemm\"]", 2),
    ] {
        let grid = tiny_recipe(&dir, "grid2", &format!("[sweep]\n{sweep}\n"));
        let out = runner_cmd().arg("warmup").arg(&grid).output().unwrap();
        expect_exit(&out, 0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().count(), lines, "{sweep}: {stdout}");
    }

    // Bad input: exit 2, as for a run.
    let out = runner_cmd()
        .args(["warmup", "tests/fixtures/invalid/unknown_key.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    // A validation set's shapes are warmed up too: 20 held-out samples, one batch filled
    // up to 32, the test set's shape (run once). In batches of 16: 80 training samples
    // make one shape, and the validation set's 16 + 4 and the test set's 3 × 16 + 2, short
    // batches filled up, one more.
    let warm = |sets: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.arg("warmup").arg(&recipe);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stdout = warm(&["data.validation=0.2"]);
    assert!(
        stdout.contains("2 training and 1 evaluation batch shape(s)"),
        "{stdout}"
    );
    let stdout = warm(&["data.validation=0.2", "loader.batch_size=16"]);
    assert!(
        stdout.contains("1 training and 1 evaluation batch shape(s)"),
        "{stdout}"
    );
}

#[test]
fn warmup_covers_the_shapes_of_every_epoch_a_text_run_reaches() {
    // Batches padded to their longest review take new lengths as the shuffle changes
    // from epoch to epoch: warm-up must run each shape the whole run will see, which the
    // run's own metrics give (rows, padded tokens / rows) step by step.
    let dir = tempdir("warmup-text");
    let sets = ["data.limit=400", "run.epochs=3", "run.eval=\"never\""];
    let mut run = runner_cmd();
    run.arg("recipes/text/rotten_tomatoes.toml").arg("-q");
    run.args(["--set", &format!("log.dir=\"{}\"", dir.display())]);
    let mut warm = runner_cmd();
    warm.args(["warmup", "recipes/text/rotten_tomatoes.toml"]);
    for s in sets {
        run.args(["--set", s]);
        warm.args(["--set", s]);
    }
    expect_exit(&run.output().unwrap(), 0);
    let recs = records(&only_run(&dir.join("rotten_tomatoes")));
    let shapes = |epochs: usize| {
        recs.iter()
            .filter(|r| r.epoch < epochs)
            .map(|r| (r.samples, r.padded_tokens.unwrap() / r.samples as u64))
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    assert!(shapes(3) > shapes(1), "later epochs bring new shapes");
    let out = warm.output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{} training and 0 evaluation batch shape(s)",
            shapes(3)
        )),
        "{stdout} (the run had {} shapes)",
        shapes(3)
    );
}

// ---------------------------------------------------------------- when things go wrong

/// Every line of a metrics file parses (none was cut).
fn whole_lines(run: &Path) -> Vec<StepRecord> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "a cut last line");
    records(run)
}

#[test]
fn a_diverged_run_fails_at_that_step_and_report_keeps_it_apart() {
    let dir = tempdir("diverge");
    let recipe = tiny_recipe(&dir, "div", "[optim]\nlr = 1e6\n");
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    expect_exit(&out, 1);
    let run = only_run(&dir.join("runs/div"));
    let s = summary(&run);
    assert_eq!(s.status, "failed");
    let err = s.error.clone().unwrap_or_default();
    assert!(
        err.starts_with("diverged at step ") && err.contains("run.max_loss"),
        "{err}"
    );
    let recs = whole_lines(&run);
    let last = recs.last().unwrap();
    assert!(err.starts_with(&format!("diverged at step {}:", last.step)));
    assert!(!(last.loss.is_finite() && last.loss <= 1e4), "{last:?}");
    assert!(
        recs.len() < 4,
        "the run went on after diverging: {}",
        recs.len()
    );

    // Allowed to go on: completed, with the step recorded, and a NaN loss reads back.
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "run.stop_on_divergence=false",
            "--set",
            "optim.lr=1e30",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    // report: only the completed one is in the table; the failed one is listed apart.
    let out = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "header and one row: {stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not in the table (1 run(s) did not complete or cannot be read)")
            && stderr.contains(&format!("{}: failed: diverged at step", run.display())),
        "{stderr}"
    );
    // Only failed runs: nothing to compare is exit 1, not "bad input".
    let out = runner_cmd().arg("report").arg(&run).output().unwrap();
    expect_exit(&out, 1);
    // A run whose summary cannot be read is listed, and the others still compared.
    let broken = dir.join("runs/broken/20260101T000000");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("summary.json"), "{ not json").unwrap();
    std::fs::write(broken.join("metrics.jsonl"), "").unwrap();
    let out = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(2 run(s) did not complete or cannot be read)")
            && stderr.contains(&format!("{}: unreadable: ", broken.display()))
            && stderr.contains("not a summary"),
        "{stderr}"
    );
}

#[test]
fn report_tells_a_killed_run_from_a_running_one() {
    let dir = tempdir("killed-report");
    let recipe = tiny_recipe(&dir, "k", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/k"));
    let mut s = json(&run.join("summary.json"));
    // As kill -9 leaves it: still "running", its process gone.
    s["status"] = "running".into();
    s["pid"] = 4_000_000u32.into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let out = runner_cmd().arg("report").arg(&run).output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("killed: its process (pid 4000000) is gone"),
        "{stderr}"
    );
}

/// Starts `runner` on a long synthetic run, waits for its first metrics line, sends
/// `signal`, and returns its output and run directory.
fn interrupt(tag: &str, extra: &str, signal: &str) -> (std::process::Output, PathBuf) {
    interrupt_n(tag, extra, &[], signal, 1)
}

/// `interrupt`, with more `--set` overrides and the signal sent `times` times, 20 ms apart.
fn interrupt_n(
    tag: &str,
    extra: &str,
    sets: &[&str],
    signal: &str,
    times: usize,
) -> (std::process::Output, PathBuf) {
    signalled(runner_cmd(), tag, extra, sets, signal, times)
}

/// `interrupt_n` of the runner started by `cmd` (the runner, or a wrapper such as `nohup`
/// with the runner's path as its first argument); `sets` come last, so they win.
fn signalled(
    mut cmd: Command,
    tag: &str,
    extra: &str,
    sets: &[&str],
    signal: &str,
    times: usize,
) -> (std::process::Output, PathBuf) {
    let dir = tempdir(tag);
    let recipe = tiny_recipe(&dir, tag, extra);
    cmd.arg(&recipe).args([
        "-q",
        "--set",
        "run.epochs=100000",
        "--set",
        "data.synthetic.samples=4000",
    ]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let runs = dir.join("runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let started = walk_files(&runs).iter().any(|p| {
            p.ends_with("metrics.jsonl") && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        });
        if started {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for i in 0..times {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = child.wait_with_output().unwrap();
    (out, dir)
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// SIGTERM (Slurm, `kill`) and SIGHUP (the terminal or ssh session that started the run
/// closed; it used to kill the run where it stood, its summary left `running`) stop the
/// run at a step boundary with a checkpoint to resume from.
#[test]
fn sigterm_and_sighup_stop_at_a_step_boundary_and_say_interrupted() {
    for (signal, code, name) in [("-TERM", 143, "SIGTERM"), ("-HUP", 129, "SIGHUP")] {
        let tag = name.to_lowercase();
        let (out, dir) = interrupt(&tag, "", signal);
        expect_exit(&out, code);
        let run = only_run(&dir.join(format!("runs/{tag}")));
        let s = summary(&run);
        assert_eq!(s.status, "interrupted");
        let recs = whole_lines(&run);
        assert_eq!(
            s.steps as usize,
            recs.len(),
            "the summary covers what was written"
        );
        assert!(
            s.error
                .as_deref()
                .unwrap_or_default()
                .starts_with(&format!("interrupted by {name} after step")),
            "{s:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{tag}: interrupted by {name}; what was recorded is in"
            )),
            "{stderr}"
        );
        let latest = runner::checkpoint::list(&run).pop().map(|(_, st)| st.step);
        assert_eq!(
            latest,
            Some(s.steps),
            "{name}: no checkpoint at the last step"
        );
    }
}

/// Under `nohup` (which starts the runner with SIGHUP ignored) the terminal closing is
/// left ignored, as the user asked: the run goes on to its end.
#[test]
fn under_nohup_a_sighup_is_left_ignored() {
    let mut nohup = Command::new("nohup");
    nohup.current_dir(root()).arg(env!("CARGO_BIN_EXE_runner"));
    let (out, dir) = signalled(nohup, "nohup", "", &["run.epochs=4"], "-HUP", 1);
    expect_exit(&out, 0);
    assert_eq!(
        summary(&only_run(&dir.join("runs/nohup"))).status,
        "completed"
    );
}

/// One signal delivered twice (`timeout -s INT` signals the command, then its process
/// group) is one request to stop, not the "again" that exits at once: the run still ends
/// `interrupted` with its summary and says so. (Before, the second copy, 20 ms later here,
/// ended the process with nothing written, its summary left `running`: steps of about
/// 100 ms make sure the first has not finished the run by then.)
#[test]
fn a_signal_delivered_twice_still_stops_at_a_step_boundary() {
    let long_steps = ["model.hidden=[2048, 2048]", "loader.batch_size=512"];
    let (out, dir) = interrupt_n("sigint-twice", "", &long_steps, "-INT", 2);
    expect_exit(&out, 130);
    let run = only_run(&dir.join("runs/sigint-twice"));
    let s = summary(&run);
    assert_eq!(s.status, "interrupted");
    assert_eq!(s.steps as usize, whole_lines(&run).len());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("interrupted by SIGINT; what was recorded is in"),
        "{stderr}"
    );
}

fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn is_root() -> bool {
    my_uid() == 0
}

/// `chown -R` (as root) or `chmod -R` (otherwise) so that `path` is, or is not, writable by
/// the user `as_other` runs commands as (`nobody` under root, else this user).
fn writable_by_other(path: &Path, yes: bool, recursive: bool) {
    let mut cmd = if is_root() {
        let mut c = Command::new("chown");
        c.arg(if yes { "65534" } else { "0" });
        c
    } else {
        let mut c = Command::new("chmod");
        c.arg(if yes { "u+w" } else { "a-w" });
        c
    };
    if recursive {
        cmd.arg("-R");
    }
    assert!(cmd.arg(path).status().unwrap().success());
}

/// The runner binary run as another user where the suite runs as root (`nobody`, through
/// util-linux's `setpriv`, from a copy of the binary under `dir` that user can reach), else
/// as this user.
fn as_other(dir: &Path) -> Command {
    let bin = dir.join("runner-bin");
    if !bin.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_runner"), &bin).unwrap();
    }
    let home = dir.join("other-home");
    std::fs::create_dir_all(&home).unwrap();
    if is_root() {
        std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .env("HOME", &home);
        c
    } else {
        let mut c = Command::new(&bin);
        c.env("HOME", &home);
        c
    }
}

/// `runner resume` checks every file and folder it will write before it trains: a
/// `checkpoints/` or `samples.jsonl` it cannot write is refused at once (exit 2, the path
/// named, the run untouched). Before, the resume trained to its end and then failed,
/// turning an interrupted run into a failed one.
#[test]
fn resume_refuses_at_once_what_it_could_not_write_later() {
    let (out, dir) = interrupt("resume-perm", "", "-TERM");
    expect_exit(&out, 143);
    let run = only_run(&dir.join("runs/resume-perm"));
    assert!(run.join("checkpoints").is_dir());
    // The sampler's lines of the first stretch (none if it was stopped within one interval).
    if !run.join("samples.jsonl").exists() {
        std::fs::write(run.join("samples.jsonl"), "").unwrap();
    }
    writable_by_other(&run, true, true);
    let before = std::fs::read_to_string(run.join("summary.json")).unwrap();
    let resume = || {
        as_other(&dir)
            .arg("resume")
            .arg(&run)
            .arg("-q")
            .output()
            .unwrap()
    };
    for blocked in ["checkpoints", "samples.jsonl"] {
        writable_by_other(&run.join(blocked), false, false);
        let out = resume();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "error: cannot write {}",
                run.join(blocked).display()
            )),
            "{blocked}: {stderr}"
        );
        let after = std::fs::read_to_string(run.join("summary.json")).unwrap();
        assert_eq!(after, before, "{blocked}: the summary changed");
        writable_by_other(&run.join(blocked), true, false);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run whose name puts it inside another run's directory (`a/<a run id of a>`) is in the
/// report: the walk stopped at the outer run, and the inner one was never listed.
#[test]
fn report_finds_a_run_inside_another_runs_directory() {
    let dir = tempdir("report-nested");
    let recipe = tiny_recipe(&dir, "n", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let outer = only_run(&dir.join("runs/n"));
    let id = outer.file_name().unwrap().to_string_lossy().into_owned();
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", &format!("name=\"n/{id}\"")])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let out = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(
        csv.lines().any(|l| l.starts_with("n,1,"))
            && csv.lines().any(|l| l.starts_with(&format!("n/{id},1,"))),
        "{csv}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner report` counts each run once, however it is reached: a `runs/latest` link
/// to a run counted it twice (and halved its spread), and a link up the tree without
/// end; and a run it cannot enter (another user's, `drwx------`) is listed as unreadable
/// instead of vanishing from an exit-0 report.
#[test]
fn report_counts_linked_runs_once_and_names_unreadable_ones() {
    let dir = tempdir("report-links");
    let recipe = tiny_recipe(&dir, "rl", "");
    for _ in 0..2 {
        expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    }
    let runs = dir.join("runs");
    let mut both: Vec<PathBuf> = std::fs::read_dir(runs.join("rl"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    both.sort();
    assert_eq!(both.len(), 2);
    std::os::unix::fs::symlink(&both[0], runs.join("latest")).unwrap();
    std::os::unix::fs::symlink("..", runs.join("rl").join("up")).unwrap();
    let csv = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with("rl,"))
            .unwrap_or("")
            .to_string();
        (text, line)
    };
    let out = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(&runs)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let (text, line) = csv(&out);
    assert!(line.starts_with("rl,2,"), "{text}");

    // The second run, closed to the user who reports.
    writable_by_other(&runs, true, true);
    let hidden = &both[1];
    let mode = if is_root() { "700" } else { "000" };
    assert!(Command::new("chmod")
        .args([mode])
        .arg(hidden)
        .status()
        .unwrap()
        .success());
    if is_root() {
        std::os::unix::fs::chown(hidden, Some(0), Some(0)).unwrap();
    }
    let out = as_other(&dir)
        .args(["report", "--format", "csv"])
        .arg(&runs)
        .output()
        .unwrap();
    let _ = Command::new("chmod").arg("755").arg(hidden).status();
    let (text, line) = csv(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(line.starts_with("rl,1,"), "{text}");
    assert!(
        stderr.contains(&hidden.display().to_string()) && stderr.contains("Permission denied"),
        "{stderr}"
    );

    // A run whose summary.json is a named pipe is listed as not readable; the report
    // neither blocks on it nor leaves it out in silence.
    let piped = hidden.join("summary.json");
    std::fs::remove_file(&piped).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&piped)
        .status()
        .unwrap()
        .success());
    let out = runner_cmd()
        .args(["report", "--format", "csv"])
        .arg(&runs)
        .output()
        .unwrap();
    let (text, line) = csv(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(line.starts_with("rl,1,"), "{text}");
    assert!(
        stderr.contains(&format!("{}: not a regular file", piped.display())),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Paths that are there but cannot be read as files get an error that says what they are,
/// at once: a dangling link is not "does not exist", a pipe named `batches.meta.txt`
/// beside the data does not block `validate`, and `runner ls` neither blocks on a pipe
/// named `*.toml` nor follows a link up the tree.
#[test]
fn paths_that_are_links_or_pipes_are_named_as_such_and_block_nothing() {
    let dir = tempdir("links-pipes");
    let data = root().join("datasets/fashion_mnist");
    let mkfifo = |p: &Path| assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
    // With `timeout`, so a regression fails instead of hanging the suite.
    let validate = |recipe: &Path| {
        Command::new("timeout")
            .arg("20")
            .arg(env!("CARGO_BIN_EXE_runner"))
            .arg("validate")
            .arg(recipe)
            .output()
            .unwrap()
    };
    let recipe = |name: &str, train: &Path| {
        let r = dir.join(name);
        std::fs::write(
            &r,
            format!(
                "[model]\narch = \"small_cnn\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"{}\"\n",
                train.display()
            ),
        )
        .unwrap();
        r
    };
    std::os::unix::fs::symlink(dir.join("gone.bin"), dir.join("dangling.bin")).unwrap();
    let out = validate(&recipe("dangling.toml", &dir.join("dangling.bin")));
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "is a symbolic link to {}, which does not exist",
            dir.join("gone.bin").display()
        )),
        "{stderr}"
    );

    let beside = dir.join("fifo-meta");
    std::fs::create_dir_all(&beside).unwrap();
    std::fs::copy(data.join("data_batch.bin"), beside.join("data_batch.bin")).unwrap();
    mkfifo(&beside.join("batches.meta.txt"));
    let out = validate(&recipe("fifo.toml", &beside.join("data_batch.bin")));
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("batches.meta.txt") && stderr.contains("is not a regular file"),
        "{stderr}"
    );

    let listing = dir.join("ls");
    std::fs::create_dir_all(listing.join("recipes")).unwrap();
    std::fs::copy(
        root().join("recipes/quickstart.toml"),
        listing.join("recipes/q.toml"),
    )
    .unwrap();
    mkfifo(&listing.join("recipes/zz.toml"));
    std::os::unix::fs::symlink("..", listing.join("recipes/up")).unwrap();
    let out = Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_runner"))
        .arg("ls")
        .current_dir(&listing)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("q.toml").count(), 1, "{stdout}");
    assert!(!stdout.contains("zz.toml"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With several recipes, every log.dir is checked before the first one trains: one that
/// is a link to nowhere is an error naming its recipe and the key, and the
/// recipes before it have not run. (Before, the first trained, then the second failed
/// with "File exists" and no recipe named.)
#[test]
fn every_log_dir_is_checked_before_any_recipe_runs() {
    let dir = tempdir("log-dirs");
    let one = tiny_recipe(&dir, "one", "");
    std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
    // (A log.dir that is a file, or below one, is a validation error, with its line.)
    let two = tiny_recipe(&dir, "two", "");
    let text = std::fs::read_to_string(&two).unwrap().replace(
        &format!("dir = \"{}\"", dir.join("runs").display()),
        &format!("dir = \"{}\"", dir.join("dangling").display()),
    );
    std::fs::write(&two, text).unwrap();
    let out = runner_cmd().arg(&one).arg(&two).arg("-q").output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("error: {}: log.dir:", two.display()))
            && stderr.contains("is a symbolic link to a folder that does not exist"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "the first recipe ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that left (`runner grid.toml | head -1`, a `tee` that died) stops neither a
/// grid nor a listing: output to a closed pipe is dropped, not a panic.
#[test]
fn a_closed_stdout_or_stderr_stops_nothing() {
    let dir = tempdir("closed-pipe");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        writer
    };
    let out = runner_cmd()
        .arg(&grid)
        .stdout(closed())
        .stderr(closed())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "the grid ran to its end");
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        states,
        ["done", "done"],
        "both cells, after the first one's lines were lost"
    );
    for args in [&["ls"][..], &["show", grid.to_str().unwrap()], &["schema"]] {
        let out = runner_cmd()
            .args(args)
            .stdout(closed())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // Output that is the command's result and could not be written (a full disk) is a
    // failure, said once.
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let out = runner_cmd().arg("schema").stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(
            stderr
                .matches("error: cannot write to standard output: No space left on device")
                .count(),
            1,
            "{stderr}"
        );
    }
}

#[test]
fn an_interrupted_grid_cell_is_rerun_by_resume() {
    let dir = tempdir("sigint-grid");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    // Long enough to interrupt, short enough to finish on resume (a few seconds a cell).
    let long = [
        "-q",
        "--set",
        "run.epochs=20",
        "--set",
        "data.synthetic.samples=4000",
    ];
    let child = runner_cmd()
        .arg(&grid)
        .args(long)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !walk_files(&dir.join("runs"))
        .iter()
        .any(|p| p.ends_with("metrics.jsonl") && std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the grid never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        states,
        ["interrupted"],
        "cell 0 interrupted, cell 1 never started"
    );
    assert!(
        !walk_files(&sweep)
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "lock")),
        "a lock outlived its process"
    );
    // --resume runs the interrupted cell again, and the one never started.
    let out = runner_cmd()
        .arg(&grid)
        .args(long)
        .arg("--resume")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["done", "done"]);
}

#[test]
fn a_locked_cell_is_left_to_its_owner_and_a_stale_lock_is_taken_over() {
    let dir = tempdir("locks");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    // Validate once to learn the cells' ids, then lock cell 0 as a live process would.
    let cells = runner::sweep::check(&grid, &[], &Machine::cpu_only(), 256)
        .unwrap()
        .cells;
    let sweep = runner::sweep::SweepDir::open(&dir.join("runs"), "g", &grid, &cells).unwrap();
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let lock = sweep.dir.join(format!("locks/0000-{}.lock", cells[0].id));
    // This test process is alive: the lock is live.
    std::fs::write(&lock, format!("{} {}\n", host.trim(), std::process::id())).unwrap();
    let out = runner_cmd().arg(&grid).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cell 0: left to process"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let states: Vec<(String, String)> = statuses(&sweep.dir);
    assert_eq!(states.len(), 1, "only cell 1 ran: {states:?}");
    assert!(states[0].0.starts_with("0001-"));
    // A lock whose process is gone is stale: --resume takes it over and runs cell 0.
    std::fs::write(&lock, format!("{} 4000000\n", host.trim())).unwrap();
    let out = runner_cmd()
        .arg(&grid)
        .args(["-q", "--resume"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let states: Vec<String> = statuses(&sweep.dir).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["done", "done"]);
    assert!(!lock.exists());
}

/// A stale lock this user may not remove (another user's, in a `locks/` it cannot write)
/// is an error naming it: before, each try read it as held, and `--cell N --resume` (a
/// Slurm task) exited 0 having run nothing, every time.
#[test]
fn a_stale_lock_that_cannot_be_removed_is_named_not_taken_for_a_live_one() {
    let dir = tempdir("stale-lock");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let cells = runner::sweep::check(&grid, &[], &Machine::cpu_only(), 256)
        .unwrap()
        .cells;
    let sweep = runner::sweep::SweepDir::open(&dir.join("runs"), "g", &grid, &cells).unwrap();
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let lock = sweep.dir.join(format!("locks/0000-{}.lock", cells[0].id));
    std::fs::write(&lock, format!("{} 4000000\n", host.trim())).unwrap();
    writable_by_other(&dir, true, true);
    writable_by_other(&sweep.dir.join("locks"), false, false);
    let out = as_other(&dir)
        .arg(&grid)
        .args(["-q", "--resume", "--cell", "0"])
        .output()
        .unwrap();
    writable_by_other(&sweep.dir.join("locks"), true, false);
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the lock {} is stale", lock.display()))
            && stderr.contains("pid 4000000")
            && stderr.contains("cannot be removed"),
        "{stderr}"
    );
    assert!(lock.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tmpfs of `size` mounted at `dir/small` (root can mount one; CI runs as root), or
/// `None` (said on stderr: the test is skipped) where this user cannot.
fn small_fs(dir: &Path, size: &str) -> Option<PathBuf> {
    let mnt = dir.join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a small tmpfs here (not root?)");
    }
    mounted.then_some(mnt)
}

/// `runner RECIPE -q --set run.epochs=EPOCHS` with its runs under `log_dir`.
fn run_epochs_in(recipe: &Path, epochs: u32, log_dir: &Path) -> std::process::Output {
    runner_cmd()
        .arg(recipe)
        .args(["-q", "--set", &format!("run.epochs={epochs}"), "--set"])
        .arg(format!("log.dir=\"{}\"", log_dir.display()))
        .output()
        .unwrap()
}

/// A resume on a full disk says so, and leaves no empty `resume.lock` behind: one read as
/// "a process that is starting is resuming it" for a minute, refusing every retry.
#[test]
fn a_resume_on_a_full_disk_leaves_no_lock_behind() {
    let (out, dir) = interrupt("resume-full", "", "-TERM");
    expect_exit(&out, 143);
    let Some(mnt) = small_fs(&dir, "64m") else {
        return;
    };
    let run = mnt.join("run");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(only_run(&dir.join("runs/resume-full")))
        .arg(&run)
        .status()
        .unwrap();
    // Fill what is left, so that the next write fails.
    {
        use std::io::Write as _;
        let mut filler = std::fs::File::create(mnt.join("filler")).unwrap();
        let block = vec![0u8; 1 << 16];
        while filler.write_all(&block).is_ok() {}
    }
    let out = runner_cmd()
        .arg("resume")
        .arg(&run)
        .arg("-q")
        .output()
        .unwrap();
    let lock_left = run.join("resume.lock").exists();
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(copied.success());
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot take resume.lock") && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert!(!lock_left, "an empty resume.lock was left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint that does not fit says so in words, names the file, and leaves no
/// half-written checkpoint behind (it was Burn's `Unknown("Io { inner: Os { code: 28 ..")`).
#[test]
fn a_checkpoint_on_a_full_disk_says_so_and_leaves_nothing_half_written() {
    let dir = tempdir("ckpt-full");
    // Room for the run's files, not for a checkpoint of the MLP (3 MB).
    let Some(mnt) = small_fs(&dir, "300k") else {
        return;
    };
    let recipe = tiny_recipe(&dir, "ckfull", "[checkpoint]\nevery = 2\n");
    let out = run_epochs_in(&recipe, 3, &mnt);
    let run = only_run(&mnt.join("ckfull"));
    let left: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap_or_default();
    let _ = Command::new("umount").arg(&mnt).status();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("model.bin: No space left on device") && !stderr.contains("Unknown("),
        "{stderr}"
    );
    assert!(left.is_empty(), "left in checkpoints/: {left:?}");
    assert!(summary.contains("\"failed\""), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_stops_the_run_without_cutting_a_line() {
    let dir = tempdir("full-disk");
    // A 64 KiB file system for the run directory.
    let Some(mnt) = small_fs(&dir, "64k") else {
        return;
    };
    let recipe = tiny_recipe(&dir, "full", "");
    let out = run_epochs_in(&recipe, 200, &mnt);
    let run = only_run(&mnt.join("full"));
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    let summary_text = std::fs::read_to_string(run.join("summary.json")).unwrap_or_default();
    let _ = Command::new("umount").arg(&mnt).status();
    expect_exit(&out, 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No space left on device"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "a cut metrics line"
    );
    for l in text.lines() {
        serde_json::from_str::<StepRecord>(l).unwrap();
    }
    // Fewer lines than 200 epochs of 4 steps: the run stopped instead of going on.
    assert!(text.lines().count() < 800);
    // The summary is either the last whole one written, or says failed.
    if let Ok(s) = serde_json::from_str::<Summary>(&summary_text) {
        assert_ne!(s.status, "completed");
    }
}

/// A recipe that is not UTF-8 says where; a --set value that is TOML for several keys is
/// refused instead of the keys after the first being dropped.
#[test]
fn a_non_utf8_recipe_and_a_multi_key_set_are_refused_with_where() {
    let dir = tempdir("non-utf8");
    let recipe = tiny_recipe(&dir, "u", "");
    let mut bytes = std::fs::read(&recipe).unwrap();
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.splice(second_line..second_line, b"# caf\xe9\n".iter().copied());
    let latin1 = dir.join("latin1.toml");
    std::fs::write(&latin1, bytes).unwrap();
    // `runner validate FILE [--set KV]`: refused (exit 2), with this on stderr.
    let refused = |file: &Path, set: &[&str], want: &str| {
        let out = runner_cmd()
            .arg("validate")
            .arg(file)
            .args(set)
            .output()
            .unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{stderr}");
    };
    refused(
        &latin1,
        &[],
        "line 2, column 6 is not UTF-8 text (byte 0xe9)",
    );
    // A path that is not a recipe at all is not read without end (`/dev/zero` grew the
    // process to 6.8 GB before), nor is a file past the size a recipe could have.
    let big = dir.join("big.toml");
    std::fs::write(&big, "#".repeat(5 << 20)).unwrap();
    for file in [Path::new("/dev/zero"), &big] {
        refused(file, &[], "cannot read recipe: more than 4 MiB");
    }
    refused(
        &recipe,
        &["--set", "name=\"a\"\nseed=5"],
        "the value of `name` holds more keys after it",
    );
    // A wrong value given on the command line is shown there, not at the recipe's first
    // line or a table header of the file (as a swept list, and as a key below a value).
    refused(
        &recipe,
        &["--set", "sweep.optim.lr=[0.1, \"x\"]"],
        "error: --set:1:16: optim.lr: invalid type: string \"x\"",
    );
    refused(
        &recipe,
        &["--set", "loader.workers.x=1"],
        "error: --set:1:1: loader.workers: invalid type: table",
    );
    // A number past TOML's range is said to be one, not "a string, write it without quotes".
    refused(
        &recipe,
        &["--set", "seed=18446744073709551615"],
        "seed: 18446744073709551615 is not a TOML integer",
    );
}

#[test]
fn a_set_key_may_be_quoted_as_in_a_recipe_file() {
    let dir = tempdir("quoted-set");
    let recipe = tiny_recipe(&dir, "q", "");
    // The [sweep] table's keys are written quoted in files; --set takes them both ways.
    for key in [
        "sweep.\"loader.workers\"",
        "sweep.loader.workers",
        "\"loader\".workers",
    ] {
        let set = if key.starts_with("sweep") {
            format!("{key}=[0, 1]")
        } else {
            format!("{key}=1")
        };
        let out = runner_cmd()
            .arg("validate")
            .arg(&recipe)
            .args(["--set", &set])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let want = if key.starts_with("sweep") {
            "grid of 2 cells: q/workers=0 | q/workers=1"
        } else {
            "ok: "
        };
        assert!(stdout.contains(want), "{set}: {stdout}");
    }
}

#[test]
fn validate_says_what_a_step_holds() {
    let dir = tempdir("step-holds");
    let recipe = tiny_recipe(&dir, "s", "");
    // 100 samples: 4 batches of 32 an epoch; steps do not span epochs.
    let out = runner_cmd()
        .arg("validate")
        .arg(&recipe)
        .args(["--set", "optim.accumulation_steps=1000"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("(s: 1 optimizer steps of 32 × 4 samples)"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "optim.accumulation_steps: 1000 is more than the 4 micro-batches of an epoch"
        ),
        "{stderr}"
    );
    let out = runner_cmd()
        .arg("validate")
        .arg(&recipe)
        .args(["--set", "loader.batch_size=500"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 optimizer steps of 100 × 1 samples"));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("loader.batch_size: 500 is more than the 100 training samples"));
}

#[test]
fn a_label_only_the_test_file_has_is_warned_of() {
    let dir = tempdir("stray-test-label");
    let line = |label: u32, text: &str| format!("{{\"label\": {label}, \"text\": \"{text}\"}}\n");
    std::fs::write(dir.join("train.jsonl"), line(0, "bad") + &line(1, "good")).unwrap();
    std::fs::write(dir.join("test.jsonl"), line(1, "fine") + &line(5, "odd")).unwrap();
    let recipe = dir.join("t.toml");
    std::fs::write(
        &recipe,
        "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"train.jsonl\"\ntest = \"test.jsonl\"\n",
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.test: label 5 occurs in the test set, but training labels run up to 1: the model gets 6 classes"),
        "{stderr}"
    );
    // A test file within the training labels: nothing to warn of.
    std::fs::write(dir.join("test.jsonl"), line(1, "fine")).unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("occurs in the test set"));
}

#[test]
fn a_set_table_merges_into_the_recipes_table() {
    // As a recipe's table over the one it extends: the keys it does not name stay.
    let out = runner_cmd()
        .current_dir(root())
        .args([
            "show",
            "recipes/quickstart.toml",
            "--set",
            "run={max_steps=3}",
        ])
        .args(["--set", "data.normalize={on=\"device\"}"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let shown = String::from_utf8_lossy(&out.stdout);
    for line in [
        "epochs = 8",
        "max_steps = 3",
        "mean = [0.2193]",
        "on = \"device\"",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line}: {shown}");
    }
}

#[test]
fn slurm_refuses_a_plain_recipe_and_zero_shards_before_writing() {
    let dir = tempdir("slurm-refuse");
    let plain = tiny_recipe(&dir, "plain", "");
    let out = runner_cmd()
        .args(["sweep", "--slurm"])
        .arg(&plain)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no [sweep] table"));
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let out = runner_cmd()
        .args(["sweep", "--slurm", "--shards", "0"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    // More shards than cells: array tasks with nothing to do.
    let out = runner_cmd()
        .args(["sweep", "--slurm", "--shards", "3"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shards 3: "));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has 2 cells, so at most 2 shards"));
    // --cell and --shard choose cells two ways: refused, not an empty selection.
    let out = runner_cmd()
        .arg(&grid)
        .args(["--cell", "1", "--shard", "1/2"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    assert!(!dir.join("runs").exists(), "state written before the error");
}

#[test]
fn huge_sweep_values_make_short_cell_names() {
    let dir = tempdir("long-names");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.01, 1e300]\n");
    let out = runner_cmd().arg("validate").arg(&grid).output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("g/optim.lr=1e300"), "{stdout}");
    let long = format!(
        "[sweep]\n\"data.text_field\" = [\"{}\"]\n\"optim.lr\" = [0.1]\n",
        "t".repeat(300)
    );
    let l = recipe::parse(
        &dir.join("g.toml"),
        format!("[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n{long}"),
    )
    .unwrap();
    let cells = runner::sweep::expand(&l, 4).unwrap();
    assert_eq!(cells[0].name, "g/cell-0000");
}

/// The fuzz test: thousands of mutated recipes (from every shipped recipe and bad-input
/// fixture: lines deleted, duplicated or swapped, values swapped between lines, huge and
/// odd numbers, random bytes, cut files) through `runner validate`, 100 files a process.
/// Never a panic; always exit 0 (valid) or 2 (findings). A failing batch is re-run file
/// by file to name the culprit.
#[test]
fn mutated_recipes_never_crash_validation() {
    use runner::rng::SplitMix64;
    const MUTANTS: usize = 10_000;
    let work = tempdir("fuzz");
    // Mirror the layout so relative data paths still resolve to the shipped data.
    for d in ["datasets", "tests/fixtures/data", "tests/fixtures/sweep"] {
        let link = work.join(d);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(root().join(d), &link).unwrap();
    }
    let mut seeds: Vec<(PathBuf, String)> = vec![];
    for dir in ["recipes", "tests/fixtures/invalid"] {
        for f in toml_files(&root().join(dir)) {
            seeds.push((rel(&f), std::fs::read_to_string(&f).unwrap()));
        }
    }
    let odd = [
        "1e308",
        "-1",
        "0",
        "9223372036854775807",
        "18446744073709551616",
        "nan",
        "inf",
        "-inf",
        "\"\"",
        "[]",
        "{}",
        "true",
        "\"\\u0000\"",
        "4000000000",
        "1e-320",
        "[0, 1e300]",
    ];
    let mut rng = SplitMix64::new(7);
    let mut files = vec![];
    for i in 0..MUTANTS {
        let (path, text) = &seeds[rng.below(seeds.len() as u64) as usize];
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let pick = |rng: &mut SplitMix64, n: usize| rng.below(n.max(1) as u64) as usize;
        for _ in 0..=pick(&mut rng, 3) {
            let n = lines.len();
            match pick(&mut rng, 7) {
                0 if n > 0 => {
                    lines.remove(pick(&mut rng, n));
                }
                1 if n > 0 => {
                    let l = lines[pick(&mut rng, n)].clone();
                    lines.insert(pick(&mut rng, n), l);
                }
                2 if n > 1 => {
                    let (a, b) = (pick(&mut rng, n), pick(&mut rng, n));
                    lines.swap(a, b);
                }
                3 if n > 1 => {
                    // A value from one line onto another key.
                    let (a, b) = (pick(&mut rng, n), pick(&mut rng, n));
                    if let (Some((ka, _)), Some((_, vb))) =
                        (lines[a].split_once('='), lines[b].clone().split_once('='))
                    {
                        lines[a] = format!("{ka}={vb}");
                    }
                }
                4 if n > 0 => {
                    let a = pick(&mut rng, n);
                    if let Some((k, _)) = lines[a].clone().split_once('=') {
                        lines[a] = format!("{k}= {}", odd[pick(&mut rng, odd.len())]);
                    }
                }
                5 => {
                    let junk: String = (0..1 + pick(&mut rng, 12))
                        .map(|_| char::from_u32(rng.below(0x250) as u32).unwrap_or('?'))
                        .collect();
                    let at = pick(&mut rng, n + 1);
                    lines.insert(at, junk);
                }
                _ if n > 0 => {
                    lines.truncate(pick(&mut rng, n));
                }
                _ => {}
            }
        }
        let out = work.join(path).with_file_name(format!(
            "m{i:04}-{}",
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        std::fs::write(&out, lines.join("\n")).unwrap();
        files.push(out);
    }
    let validate = |batch: &[PathBuf]| {
        runner_cmd()
            .current_dir(&work)
            .arg("validate")
            .args(batch)
            .output()
            .unwrap()
    };
    let bad = |o: &std::process::Output| {
        !matches!(o.status.code(), Some(0 | 2))
            || String::from_utf8_lossy(&o.stderr).contains("panicked")
    };
    let mut invalid = 0;
    for batch in files.chunks(100) {
        let out = validate(batch);
        if bad(&out) {
            for f in batch {
                let one = validate(std::slice::from_ref(f));
                assert!(
                    !bad(&one),
                    "validate crashed ({:?}) on {}:\n{}\n--- stderr:\n{}",
                    one.status.code(),
                    f.display(),
                    std::fs::read_to_string(f).unwrap_or_default(),
                    String::from_utf8_lossy(&one.stderr)
                );
            }
        }
        invalid += String::from_utf8_lossy(&out.stderr)
            .matches("\nerror")
            .count();
    }
    // The mutations do reach validation's errors (not only syntax errors).
    assert!(
        invalid > MUTANTS / 10,
        "only {invalid} findings from {MUTANTS} mutants"
    );
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn ls_lists_every_model_and_data_format_the_format_allows() {
    let out = runner_cmd().arg("ls").output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // And the devices each backend.kind would use here, or why there are none.
    let devices = stdout
        .split_once("devices (backend.kind, backend.device):\n")
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no devices section:\n{stdout}"));
    assert!(devices.starts_with("  cpu "), "{devices}");
    if !cfg!(feature = "cuda") {
        assert!(
            devices.contains("cuda         this binary was built without the `cuda` feature"),
            "{devices}"
        );
    }
    if !cfg!(feature = "wgpu") {
        assert!(
            devices.contains("wgpu         this binary was built without the `wgpu` feature"),
            "{devices}"
        );
    }
    let schema = runner::recipe::schema::json_schema();
    let text = serde_json::to_string(&schema).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Every word the schema allows for model.arch and data.format is listed.
    let defs = &schema["$defs"];
    for def in ["Arch", "DataFormat"] {
        let words: Vec<String> = defs[def]["enum"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .or_else(|| {
                defs[def]["oneOf"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|v| v["const"].as_str().map(String::from))
                        .collect()
                })
            })
            .unwrap_or_default();
        assert!(!words.is_empty(), "no {def} in the schema: {}", defs[def]);
        for w in words {
            assert!(
                stdout.contains(&format!("  {w} ")),
                "ls omits {w}:\n{stdout}"
            );
        }
    }
}

// ---------------------------------------------------------------- long runs

/// A Fashion-MNIST recipe long enough to interrupt (80 optimizer steps, ~2 s).
fn long_recipe(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let recipe = dir.join(format!("{name}.toml"));
    let data = root().join("datasets/fashion_mnist");
    std::fs::write(
        &recipe,
        format!(
            "name = \"{name}\"\nseed = 5\n[model]\narch = \"small_cnn\"\nwidth = 8\n[data]\nformat = \"cifar10-bin\"\ntrain = \"{}\"\ntest = \"{}\"\nlimit = 640\naugment = {{ crop_padding = 2, hflip = true }}\n[loader]\nbatch_size = 32\n[optim]\nlr = 0.05\nmomentum = 0.9\nschedule = \"cosine\"\naccumulation_steps = 2\n[run]\nepochs = 8\nwarmup_steps = 1\neval = \"epoch\"\n[log]\ndir = \"{}\"\n{extra}",
            data.join("data_batch.bin").display(),
            data.join("test_batch.bin").display(),
            dir.join("runs").display()
        ),
    )
    .unwrap();
    recipe
}

/// Starts `runner args`, waits until a metrics file under `runs` has `lines` lines, sends
/// `signal`, and returns the output.
fn kill_after(
    args: &[&std::ffi::OsStr],
    runs: &Path,
    lines: usize,
    signal: &str,
) -> std::process::Output {
    let child = runner_cmd()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let n = walk_files(runs)
            .iter()
            .filter(|p| p.ends_with("metrics.jsonl"))
            .map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .count()
            })
            .max()
            .unwrap_or(0);
        if n >= lines {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run never got to {lines} steps"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A safetensors file's tensors by name, as raw bytes (the header's order may differ).
fn tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let o = &v["data_offsets"];
            let (a, b) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            (k.clone(), data[a..b].to_vec())
        })
        .collect()
}

/// Names of the tensors whose bytes differ between two weight files.
fn differing(a: &Path, b: &Path) -> Vec<String> {
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "different tensors"
    );
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Each step's loss, bit for bit, from a run's metrics.
fn losses(run: &Path) -> Vec<(u64, u64)> {
    records(run)
        .iter()
        .map(|r| (r.step, r.loss.to_bits()))
        .collect()
}

#[test]
fn a_resumed_run_ends_bitwise_where_the_uninterrupted_one_does() {
    for workers in [0, 4] {
        let dir = tempdir(&format!("resume-w{workers}"));
        let recipe = long_recipe(&dir, "r", "[checkpoint]\nevery = 5\n");
        let set = format!("loader.workers={workers}");
        // The reference: uninterrupted.
        let out = runner_cmd()
            .arg(&recipe)
            .args(["-q", "--set", &set, "--set"])
            .arg(format!("log.dir=\"{}\"", dir.join("ref").display()))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let reference = only_run(&dir.join("ref/r"));
        // SIGTERM mid-run: a checkpoint at the next step boundary, status interrupted.
        let out = kill_after(
            &[
                recipe.as_os_str(),
                "-q".as_ref(),
                "--set".as_ref(),
                set.as_ref(),
            ],
            &dir.join("runs"),
            13,
            "-TERM",
        );
        expect_exit(&out, 143);
        let run = only_run(&dir.join("runs/r"));
        assert_eq!(summary(&run).status, "interrupted");
        let (_, state) = runner::checkpoint::latest(&run).expect("a checkpoint on SIGTERM");
        assert!(state.reason.contains("SIGTERM"), "{state:?}");
        let out = runner_cmd()
            .arg("resume")
            .arg(&run)
            .arg("-q")
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let s = summary(&run);
        assert_eq!((s.status.as_str(), s.resumes), ("completed", 1));
        assert_eq!(s.steps, summary(&reference).steps);
        // Every step once, in order, with the reference's loss to the bit.
        assert_eq!(losses(&run), losses(&reference), "workers = {workers}");
        let diff = differing(
            &run.join("model.safetensors"),
            &reference.join("model.safetensors"),
        );
        assert!(
            diff.is_empty(),
            "final weights differ (workers = {workers}): {diff:?}"
        );
        assert_eq!(s.test_accuracy, summary(&reference).test_accuracy);
        // TensorBoard sees each step once (the redone ones replace the first process's),
        // and metrics.csv continues like metrics.jsonl.
        let want: Vec<(u64, f32)> = losses(&reference)
            .iter()
            .map(|(st, l)| (*st, f64::from_bits(*l) as f32))
            .collect();
        assert_eq!(tb_losses(&run), want);
        let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
        assert_eq!(csv.lines().count(), want.len() + 1);

        // kill -9 (no chance to write anything): resumed from the periodic checkpoint.
        let killed_dir = dir.join("killed");
        let out = kill_after(
            &[
                recipe.as_os_str(),
                "-q".as_ref(),
                "--set".as_ref(),
                set.as_ref(),
                "--set".as_ref(),
                format!("log.dir=\"{}\"", killed_dir.display()).as_ref(),
            ],
            &killed_dir,
            23,
            "-KILL",
        );
        assert_eq!(out.status.code(), None, "killed by a signal");
        let run = only_run(&killed_dir.join("r"));
        assert_eq!(summary(&run).status, "running");
        // As if an older runner had started the run: its metrics.csv lacks a column.
        let csv_path = run.join("metrics.csv");
        let old = std::fs::read_to_string(&csv_path).unwrap();
        let header = old.lines().next().unwrap().to_string();
        std::fs::write(&csv_path, old.replacen(",mem_query_ms", "", 1)).unwrap();
        let out = runner_cmd()
            .arg("resume")
            .arg(&run)
            .arg("-q")
            .output()
            .unwrap();
        expect_exit(&out, 0);
        assert_eq!(
            losses(&run),
            losses(&reference),
            "after kill -9, workers = {workers}"
        );
        let diff = differing(
            &run.join("model.safetensors"),
            &reference.join("model.safetensors"),
        );
        assert!(diff.is_empty(), "after kill -9: {diff:?}");
        // That metrics.csv is written again whole, in this version's columns.
        let csv = std::fs::read_to_string(&csv_path).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], header);
        assert_eq!(lines.len(), want.len() + 1);
        let columns = header.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == columns));
    }
}

/// A checkpoint damaged on disk (cut short, or changed in place) is found by the sizes
/// and hashes its state.json keeps, and resume takes the one before it, ending where the
/// uninterrupted run ends; with none left it refuses and changes nothing. One process at
/// a time continues a run.
#[test]
fn resume_skips_a_damaged_checkpoint_and_runs_once() {
    let dir = tempdir("resume-damaged");
    let recipe = long_recipe(&dir, "r", "[checkpoint]\nevery = 5\n");
    let out = runner_cmd()
        .arg(&recipe)
        .arg("-q")
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", dir.join("ref").display()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let reference = only_run(&dir.join("ref/r"));
    let out = kill_after(
        &[recipe.as_os_str(), "-q".as_ref()],
        &dir.join("runs"),
        23,
        "-KILL",
    );
    assert_eq!(out.status.code(), None, "killed by a signal");
    let run = only_run(&dir.join("runs/r"));
    let kept: Vec<u64> = runner::checkpoint::list(&run)
        .iter()
        .map(|(_, s)| s.step)
        .collect();
    assert_eq!(kept, [15, 20]);
    let copy = |to: &str| {
        let to = dir.join(to);
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&run)
            .arg(&to)
            .status()
            .unwrap();
        assert!(ok.success());
        to
    };
    let (flipped, none_left, twice, torn) = (
        copy("flipped"),
        copy("none-left"),
        copy("twice"),
        copy("torn"),
    );
    let latest_model = |run: &Path| run.join("checkpoints/step-000000020/model.bin");

    // Cut short: the one before it, and the run ends bitwise where the reference does.
    let m = latest_model(&run);
    let len = std::fs::metadata(&m).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = runner_cmd()
        .arg("resume")
        .arg(&run)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("step-000000020: model.bin has")
            && stderr.contains("resuming from the one before it (step 15)"),
        "{stderr}"
    );
    assert_eq!(losses(&run), losses(&reference));
    assert!(differing(
        &run.join("model.safetensors"),
        &reference.join("model.safetensors")
    )
    .is_empty());

    // Changed in place, same size: the hash tells.
    let m = latest_model(&flipped);
    let mut bytes = std::fs::read(&m).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b = !*b;
    }
    std::fs::write(&m, bytes).unwrap();
    let out = runner_cmd()
        .arg("resume")
        .arg(&flipped)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("its CRC-32 differs"));
    assert_eq!(losses(&flipped), losses(&reference));

    // The latest checkpoint's own metrics line cut short (a crash, or a copy cut off, in
    // the middle of writing it): the one before it, as for a line missing altogether.
    let metrics = torn.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let line_20: usize = text.split_inclusive('\n').take(20).map(str::len).sum();
    std::fs::write(&metrics, &text[..line_20 - 30]).unwrap();
    let out = runner_cmd()
        .arg("resume")
        .arg(&torn)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics.jsonl has 19 whole lines, it follows line 20")
            && stderr.contains("resuming from the one before it (step 15)"),
        "{stderr}"
    );
    assert_eq!(losses(&torn), losses(&reference));

    // Nothing usable: exit 2, each checkpoint's trouble named, the run left as it was.
    std::fs::write(
        none_left.join("checkpoints/step-000000015/state.json"),
        "{ garbage",
    )
    .unwrap();
    std::fs::remove_file(latest_model(&none_left)).unwrap();
    let before = std::fs::read(none_left.join("summary.json")).unwrap();
    let out = runner_cmd().arg("resume").arg(&none_left).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has no checkpoint to resume from")
            && stderr.contains("step-000000015: state.json:1:")
            && stderr.contains("step-000000020: model.bin is missing"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(none_left.join("summary.json")).unwrap(),
        before
    );

    // A live process resuming it, or still running it on this host: refused, untouched.
    let me = format!(
        "{} {}\n",
        runner::clock::hostname().unwrap_or_default(),
        std::process::id()
    );
    std::fs::write(twice.join("resume.lock"), &me).unwrap();
    let out = runner_cmd().arg("resume").arg(&twice).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is resuming it already"));
    std::fs::remove_file(twice.join("resume.lock")).unwrap();
    let mut s = json(&twice.join("summary.json"));
    s["pid"] = std::process::id().into();
    std::fs::write(twice.join("summary.json"), s.to_string()).unwrap();
    let out = runner_cmd().arg("resume").arg(&twice).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the run is still going"));
    assert_eq!(json(&twice.join("summary.json")), s);
}

/// A resume continues only on the data the run started on: a training file changed in
/// between (regenerated, cut short) is refused, naming it; put back, the run resumes.
/// (Before, the checkpoint's epoch and batch were applied to the other data in silence.)
#[test]
fn resume_refuses_data_that_changed_since_the_run_started() {
    let dir = tempdir("resume-data");
    let data = std::fs::read(root().join("datasets/fashion_mnist/data_batch.bin")).unwrap();
    let train = dir.join("train.bin");
    std::fs::write(&train, &data[..3073 * 200]).unwrap();
    let recipe = dir.join("d.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"d\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"train.bin\"\n[loader]\nbatch_size = 50\n[run]\nepochs = 2\nwarmup_steps = 1\neval = \"never\"\n[checkpoint]\nevery = 2\n[log]\ndir = \"{}\"\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    // Started by a relative path (the data's path in the run's recipe.toml is absolute).
    let out = runner_cmd()
        .current_dir(&dir)
        .args(["d.toml", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/d"));
    let mut s = json(&run.join("summary.json"));
    s["status"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    std::fs::write(&train, &data[..3073 * 60]).unwrap();
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: {}: changed since the run started (614600 bytes",
            train.display()
        )) && stderr.contains("184380 bytes"),
        "{stderr}"
    );
    assert_eq!(json(&run.join("summary.json")), s, "the run was changed");
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
    std::fs::write(&train, &data[..3073 * 200]).unwrap();
    let out = runner_cmd()
        .arg("resume")
        .arg(&run)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint that would not load into the recipe's model (another layout under the
/// same recipe hash, as another version of the runner could write) is refused before the
/// run is touched: before, its metrics were cut back to the checkpoint and it was marked
/// failed, and only then did loading fail.
#[test]
fn resume_refuses_a_checkpoint_of_another_model_before_changing_the_run() {
    let dir = tempdir("resume-fit");
    let recipe = tiny_recipe(&dir, "f", "[checkpoint]\nevery = 1\n");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/f"));
    let other = tiny_recipe(&dir, "o", "[checkpoint]\nevery = 1\n");
    let out = runner_cmd()
        .arg(&other)
        .args(["-q", "--set", "model.hidden=[16]"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let (ours, _) = runner::checkpoint::list(&run).pop().unwrap();
    let (theirs, _) = runner::checkpoint::list(&only_run(&dir.join("runs/o")))
        .pop()
        .unwrap();
    let state = json(&ours.join("state.json"));
    for f in ["model.bin", "optimizer.bin", "state.json"] {
        std::fs::copy(theirs.join(f), ours.join(f)).unwrap();
    }
    let mut forged = json(&ours.join("state.json"));
    forged["recipe_sha256"] = state["recipe_sha256"].clone();
    std::fs::write(ours.join("state.json"), forged.to_string()).unwrap();
    let mut s = json(&run.join("summary.json"));
    s["status"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: checkpoint {}: does not fit",
            ours.display()
        )),
        "{stderr}"
    );
    assert_eq!(json(&run.join("summary.json")), s, "the summary changed");
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_refuses_what_it_cannot_continue() {
    let dir = tempdir("resume-refuse");
    let recipe = tiny_recipe(&dir, "t", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/t"));
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already completed"));
    let out = runner_cmd().arg("resume").arg(&dir).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a run directory"));
    // A run without any checkpoint.
    let mut s = json(&run.join("summary.json"));
    s["status"] = "failed".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no checkpoint to resume from"));

    // A file the run goes on writing is not a file (here metrics.csv is a directory, and
    // metrics.jsonl a named pipe, which blocked the resume for good): refused before the
    // run is marked running again, and put back, the resume goes on.
    let recipe = tiny_recipe(&dir, "w", "[checkpoint]\nevery = 1\n");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/w"));
    let mut s = json(&run.join("summary.json"));
    s["status"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    for (file, what) in [
        ("metrics.csv", "is a folder, not a file"),
        ("metrics.jsonl", "is a named pipe, not a file"),
    ] {
        let path = run.join(file);
        let kept = dir.join(format!("{file}.kept"));
        std::fs::rename(&path, &kept).unwrap();
        if file == "metrics.csv" {
            std::fs::create_dir(&path).unwrap();
        } else {
            assert!(Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap()
                .success());
        }
        let out = runner_cmd()
            .arg("resume")
            .arg(&run)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("error: {}: {what}", path.display())),
            "{stderr}"
        );
        let after = json(&run.join("summary.json"));
        assert_eq!(after["status"], "interrupted");
        assert_eq!(after["resumes"], s["resumes"]);
        let _ = std::fs::remove_dir(&path);
        let _ = std::fs::remove_file(&path);
        std::fs::rename(&kept, &path).unwrap();
    }
    let out = runner_cmd()
        .arg("resume")
        .arg(&run)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert_eq!(json(&run.join("summary.json"))["status"], "completed");
}

#[test]
fn eval_scores_saved_weights_like_the_run_did_and_on_another_file() {
    let dir = tempdir("eval");
    let recipe = long_recipe(&dir, "e", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "run.epochs=2"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/e"));
    let s = summary(&run);
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "accuracy {:.2}% on 500 samples",
            100.0 * s.test_accuracy.unwrap()
        )),
        "{stdout} vs {:?}",
        s.test_accuracy
    );
    let written: Vec<PathBuf> = walk_files(&run)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("eval-")
        })
        .collect();
    assert_eq!(written.len(), 1);
    // Another file: the 20 real CIFAR-10 images.
    let other = root().join("datasets/cifar10_sample/test_batch.bin");
    let out = runner_cmd()
        .arg("eval")
        .arg(&run)
        .arg("--data")
        .arg(&other)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains(" on 20 samples"));
    // A bad --data file is said of --data, with the format it must have, not of the
    // `--set data.test` the runner checks it through.
    let text = root().join("datasets/rotten_tomatoes/test.jsonl");
    let out = runner_cmd()
        .arg("eval")
        .arg(&run)
        .arg("--data")
        .arg(&text)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("error: --data: {} is truncated", text.display()))
            && stderr.contains("data.format is \"cifar10-bin\"")
            && !stderr.contains("--set"),
        "{stderr}"
    );
    // Damaged weights: bad input (exit 2, as a folder in their place is), said so, no panic.
    let damaged = dir.join("damaged");
    std::fs::create_dir_all(&damaged).unwrap();
    for f in ["recipe.toml", "summary.json", "env.json"] {
        std::fs::copy(run.join(f), damaged.join(f)).unwrap();
    }
    let weights = std::fs::read(run.join("model.safetensors")).unwrap();
    std::fs::write(damaged.join("model.safetensors"), &weights[..1000]).unwrap();
    let out = runner_cmd().arg("eval").arg(&damaged).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: cannot evaluate")
            && stderr.contains("= help: a damaged or replaced weights file")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    // A short last batch is filled up to the batch size and scored by its own rows alone:
    // batches of 32 leave 20 of the 500 (filled with 12 copies), 7 leave 3, 500 none. The
    // same weights score the same hits whatever the batch size, and the same loss up to
    // the order of float sums.
    let scores = |batch: usize| {
        let copy = dir.join(format!("batch{batch}"));
        std::fs::create_dir_all(&copy).unwrap();
        for f in [
            "recipe.toml",
            "model.safetensors",
            "summary.json",
            "env.json",
        ] {
            std::fs::copy(run.join(f), copy.join(f)).unwrap();
        }
        let r = std::fs::read_to_string(copy.join("recipe.toml")).unwrap();
        assert!(r.contains("batch_size = 32\n"));
        let r = r.replace("batch_size = 32\n", &format!("batch_size = {batch}\n"));
        std::fs::write(copy.join("recipe.toml"), r).unwrap();
        let out = runner_cmd().arg("eval").arg(&copy).output().unwrap();
        expect_exit(&out, 0);
        let written = walk_files(&copy)
            .into_iter()
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("eval-")
            })
            .expect("eval-*.json");
        let e = json(&written);
        (e["accuracy"].as_f64().unwrap(), e["loss"].as_f64().unwrap())
    };
    let (acc, loss) = scores(500);
    assert_eq!(acc, s.test_accuracy.unwrap());
    for batch in [7, 32] {
        let (a, l) = scores(batch);
        assert_eq!(a, acc, "batch {batch}");
        assert!(
            (l - loss).abs() <= 1e-5 * loss.abs(),
            "batch {batch}: {l} vs {loss}"
        );
    }
    // A bad file is checked as data.test would be.
    let out = runner_cmd()
        .arg("eval")
        .arg(&run)
        .arg("--data")
        .arg(root().join("tests/fixtures/data/truncated.bin"))
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is truncated"));
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

/// A decoded TensorBoard event: its step, scalars, and whether it is a `SessionLog START`.
#[derive(Debug, Default)]
struct TbEvent {
    step: u64,
    scalars: Vec<(String, f32)>,
    restart: bool,
}

fn read_varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Protocol-buffer fields of a message: (field number, wire type, payload).
fn pb_fields(b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let key = read_varint(b, &mut i);
        let (field, wire) = (key >> 3, key & 7);
        let payload = match wire {
            0 => read_varint(b, &mut i).to_le_bytes().to_vec(),
            1 => {
                i += 8;
                b[i - 8..i].to_vec()
            }
            2 => {
                let n = read_varint(b, &mut i) as usize;
                i += n;
                b[i - n..i].to_vec()
            }
            5 => {
                i += 4;
                b[i - 4..i].to_vec()
            }
            w => panic!("wire type {w}"),
        };
        out.push((field, wire, payload));
    }
    out
}

/// Every event of a TFRecord event file, checking both CRCs of each record.
fn read_events(path: &Path) -> Vec<TbEvent> {
    let bytes = std::fs::read(path).unwrap();
    let mut i = 0;
    let mut out = vec![];
    while i < bytes.len() {
        let len_bytes = &bytes[i..i + 8];
        let n = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap());
        assert_eq!(
            crc,
            runner::tensorboard::masked_crc(len_bytes),
            "length CRC"
        );
        let data = &bytes[i + 12..i + 12 + n];
        let crc = u32::from_le_bytes(bytes[i + 12 + n..i + 16 + n].try_into().unwrap());
        assert_eq!(crc, runner::tensorboard::masked_crc(data), "data CRC");
        i += 16 + n;
        let mut e = TbEvent::default();
        for (field, _, payload) in pb_fields(data) {
            match field {
                2 => e.step = u64::from_le_bytes(payload.try_into().unwrap()),
                5 => {
                    for (_, _, value) in pb_fields(&payload) {
                        let (mut tag, mut v) = (String::new(), 0f32);
                        for (f, _, p) in pb_fields(&value) {
                            match f {
                                1 => tag = String::from_utf8(p).unwrap(),
                                2 => v = f32::from_le_bytes(p.try_into().unwrap()),
                                _ => {}
                            }
                        }
                        e.scalars.push((tag, v));
                    }
                }
                6 => e.restart = true,
                _ => {}
            }
        }
        out.push(e);
    }
    out
}

/// `train/loss` by step across a run's event files, as TensorBoard reads them: a
/// `SessionLog START` at step s drops what earlier files said past s.
fn tb_losses(run: &Path) -> Vec<(u64, f32)> {
    let mut files: Vec<PathBuf> = walk_files(run)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    files.sort();
    let mut out: Vec<(u64, f32)> = vec![];
    for f in files {
        for e in read_events(&f) {
            if e.restart {
                out.retain(|(s, _)| *s <= e.step);
            }
            for (tag, v) in e.scalars {
                if tag == "train/loss" {
                    out.push((e.step, v));
                }
            }
        }
    }
    out
}

#[test]
fn tensorboard_events_and_csv_carry_the_metrics() {
    let dir = tempdir("tb");
    let recipe = tiny_recipe(&dir, "tb", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/tb"));
    let recs = records(&run);
    let want: Vec<(u64, f32)> = recs.iter().map(|r| (r.step, r.loss as f32)).collect();
    assert_eq!(tb_losses(&run), want);
    let events: Vec<TbEvent> = walk_files(&run)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out")
        })
        .flat_map(|p| read_events(&p))
        .collect();
    let tags: std::collections::BTreeSet<String> = events
        .iter()
        .flat_map(|e| e.scalars.iter().map(|(t, _)| t.clone()))
        .collect();
    for t in [
        "train/lr",
        "time/iter_ms",
        "time/data_wait_pct",
        "eval/accuracy",
    ] {
        assert!(tags.contains(t), "no {t} in {tags:?}");
    }
    // metrics.csv: the header and one row per metrics line, the same fields.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next().unwrap(), StepRecord::csv_header());
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), recs.len());
    assert_eq!(rows[0], recs[0].csv_row());
    // Both can be turned off.
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "log.csv=false",
            "--set",
            "log.tensorboard=false",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let newest = walk_files(&dir.join("runs/tb"))
        .into_iter()
        .filter(|p| !p.starts_with(&run))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert!(
        !newest
            .iter()
            .any(|n| n == "metrics.csv" || n.starts_with("events.out")),
        "{newest:?}"
    );
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
    assert_eq!(s.status, "completed");
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
fn small_input_mistakes_get_plain_answers() {
    let dir = tempdir("small-mistakes");
    // A JSONL file saved with a byte-order mark reads like one without.
    let text =
        std::fs::read_to_string(root().join("datasets/rotten_tomatoes/train.jsonl")).unwrap();
    let bom = dir.join("bom.jsonl");
    std::fs::write(&bom, format!("\u{feff}{text}")).unwrap();
    let recipe = dir.join("bom.toml");
    std::fs::write(
        &recipe,
        format!(
            "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"{}\"\n",
            bom.display()
        ),
    )
    .unwrap();
    expect_exit(
        &runner_cmd().arg("validate").arg(&recipe).output().unwrap(),
        0,
    );
    // --max-cells 0 says what it means.
    let out = runner_cmd()
        .args(["validate", "recipes/quickstart.toml", "--max-cells", "0"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-cells 0 allows no cell"));
    // A manifest cut by a crash is written again when the grid runs.
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    expect_exit(&runner_cmd().arg(&grid).arg("-q").output().unwrap(), 0);
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    std::fs::write(sweep.join("manifest.json"), "{\"grid_id\": ").unwrap();
    expect_exit(
        &runner_cmd()
            .arg(&grid)
            .args(["-q", "--resume"])
            .output()
            .unwrap(),
        0,
    );
    let m = json(&sweep.join("manifest.json"));
    assert_eq!(m["cells"].as_array().map(Vec::len), Some(2));
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

/// The CubeCL path CUDA takes, run for real on a machine without a GPU: Burn's WebGPU
/// backend over Mesa's software Vulkan (lavapipe), with `cargo test --release --features
/// wgpu` (`.ci/run` installs Mesa's Vulkan driver). A cold run compiles and tunes, says so
/// while it does and learns; a second run with the same cache tunes nothing (the results
/// are loaded); `runner warmup` leaves a run nothing to tune, evaluation included; and
/// `backend.conv = "implicit_gemm"` runs, its refusals (no tensor cores here) said and
/// taken by autotune, to the same numbers.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_cubecl_caches_warmup_and_implicit_gemm_on_software_vulkan() {
    let dir = tempdir("wgpu");
    let run = |cache: &str, extra: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.arg("recipes/quickstart.toml")
            .args(["--set", "backend.kind=\"wgpu\"", "--set", "run.max_steps=8"])
            .args(["--set", "run.warmup_steps=2", "--set", "run.eval=\"end\""])
            .arg("--set")
            .arg(format!("log.dir=\"{}\"", dir.join(cache).display()))
            .env("RUNNER_CACHE_DIR", dir.join(cache).join("kc"));
        for s in extra {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        expect_exit(&out, 0);
        let runs = dir.join(cache).join("quickstart");
        let mut all: Vec<PathBuf> = std::fs::read_dir(&runs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        all.sort();
        let latest = all.pop().unwrap();
        (
            json(&latest.join("summary.json")),
            json(&latest.join("env.json")),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let count = |s: &serde_json::Value, k: &str| s["kernels"][k].as_u64().unwrap();

    // Cold: everything compiled and tuned, the start-up said, the kernels cached.
    let (cold, env, stderr) = run("a", &[]);
    assert_eq!(env["kernels"]["used"], true, "{env}");
    // The adapter by name (lavapipe is Mesa's software one).
    let device = env["device"].as_str().unwrap();
    assert!(device.ends_with("(software, on the CPU)"), "{device}");
    assert!(
        count(&cold, "compiled") > 0 && count(&cold, "tuned") > 0,
        "{cold}"
    );
    // The tuning's time, from CubeCL's start and end of each (the evaluation's shapes
    // included): part of the run's wall time, counted once where tunings overlap.
    let tune_ms = count(&cold, "tune_ms");
    assert!(
        tune_ms > 0 && (tune_ms as f64) < cold["wall_s"].as_f64().unwrap() * 1e3,
        "{cold}"
    );
    assert!(stderr.contains("first step done"), "{stderr}");
    let accuracy = cold["test_accuracy"].as_f64().unwrap();
    assert!(
        accuracy > 0.2,
        "8 steps of small_cnn reached only {accuracy}"
    );
    assert!(
        std::fs::read_dir(dir.join("a/kc/autotune")).is_ok(),
        "no autotune results under the cache directory"
    );

    // Warm: the same recipe loads every tuning result and tunes nothing.
    let (warm, ..) = run("a", &[]);
    assert_eq!(count(&warm, "tuned"), 0, "{warm}");
    assert_eq!(count(&warm, "tune_ms"), 0, "{warm}");
    assert!(count(&warm, "tune_results_loaded") > 0, "{warm}");
    eprintln!(
        "wgpu start-up: cold {} s, warm {} s",
        cold["startup_s"], warm["startup_s"]
    );

    // The fallback of every refused implicit-GEMM shape is autotune's kernel: with the
    // tuning results of the runs above, the same numbers.
    let (igemm, env, stderr) = run("a", &["backend.conv=\"implicit_gemm\""]);
    assert_eq!(env["kernels"]["conv"], "implicit_gemm");
    assert!(
        stderr.contains("backend.conv = \"implicit_gemm\" cannot take"),
        "{stderr}"
    );
    assert_eq!(igemm["final_loss"], warm["final_loss"]);
    assert_eq!(igemm["test_accuracy"], warm["test_accuracy"]);
    // The pool's figures come from CubeCL after every step, unless profile.memory is off.
    assert!(
        warm["peak_mem_in_use_bytes"].as_u64().unwrap() > 0,
        "{warm}"
    );
    let (off, ..) = run("a", &["profile.memory=false"]);
    assert!(off["peak_mem_in_use_bytes"].is_null(), "{off}");

    // Warm-up into an empty cache, then a run: nothing left to tune, evaluation included.
    let out = runner_cmd()
        .args(["warmup", "recipes/quickstart.toml"])
        .args(["--set", "backend.kind=\"wgpu\"", "--set", "run.max_steps=8"])
        .args(["--set", "run.eval=\"end\""])
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", dir.join("b").display()))
        .env("RUNNER_CACHE_DIR", dir.join("b").join("kc"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(!dir.join("b/quickstart").exists(), "warmup created a run");
    let (after, ..) = run("b", &[]);
    assert_eq!(count(&after, "tuned"), 0, "warm-up missed a shape: {after}");
}

/// `backend.kind = "wgpu"` picks the adapter `backend.device` names among those found, in
/// the order the runner lists them, and refuses what CubeCL cannot start before a run
/// directory exists: no adapter, an index past the list, a second software adapter.
#[test]
fn webgpu_adapter_is_the_one_backend_device_names_or_a_clear_error() {
    use runner::plan::{AdapterKind, Device, WgpuAdapter, WgpuTarget};
    fn adapter(index: usize, name: &str, kind: AdapterKind, nth: usize) -> WgpuAdapter {
        WgpuAdapter {
            name: name.into(),
            target: WgpuTarget { index, kind, nth },
        }
    }
    let machine = |adapters: fn() -> Vec<WgpuAdapter>| Machine {
        wgpu_adapters: Some(adapters),
        ..any_machine()
    };
    let two = machine(|| {
        vec![
            adapter(0, "NVIDIA H200", AdapterKind::DiscreteGpu, 0),
            adapter(1, "llvmpipe", AdapterKind::Cpu, 0),
            adapter(2, "SwiftShader", AdapterKind::Cpu, 1),
        ]
    });
    let check_with = |sets: &[&str], m: &Machine| {
        let mut all = vec!["backend.kind=\"wgpu\"".to_string()];
        all.extend(sets.iter().map(|s| s.to_string()));
        runner::sweep::check(Path::new("recipes/quickstart.toml"), &all, m, 16)
            .map(|c| c.plans.into_iter().next().unwrap())
    };
    std::env::set_current_dir(root()).unwrap();

    let p = check_with(&["backend.device=1"], &two).expect("adapter 1 exists");
    assert_eq!(
        p.device,
        Device::Wgpu(WgpuTarget {
            index: 1,
            kind: AdapterKind::Cpu,
            nth: 0
        })
    );
    assert!(
        p.device_reason.contains("adapter 1 of 3, llvmpipe"),
        "{}",
        p.device_reason
    );
    let p = check_with(&[], &two).expect("adapter 0 exists");
    assert!(matches!(p.device, Device::Wgpu(t) if t.kind == AdapterKind::DiscreteGpu));

    let err = |sets: &[&str], m: &Machine| check_with(sets, m).unwrap_err().to_string();
    let e = err(&["backend.device=3"], &two);
    assert!(
        e.contains("backend.device")
            && e.contains("WebGPU adapter 3 does not exist: 3 found")
            && e.contains("1: llvmpipe (software, on the CPU)"),
        "{e}"
    );
    let e = err(&["backend.device=2"], &two);
    assert!(
        e.contains("CubeCL selects only the first") && e.contains("use device 1"),
        "{e}"
    );
    let other = machine(|| vec![adapter(0, "mystery", AdapterKind::Other, 0)]);
    let e = err(&[], &other);
    assert!(
        e.contains("backend.device") && e.contains("cannot select reliably"),
        "{e}"
    );
    let e = err(&[], &machine(Vec::new));
    assert!(
        e.contains("backend.kind")
            && e.contains("no adapter was found")
            && e.contains("mesa-vulkan-drivers"),
        "{e}"
    );
    // A software adapter computes in host memory: the model and activations are checked
    // against it, as on the CPU; a GPU adapter's are not (its memory is its own).
    // (Room for the data and the batches the loader holds ahead, 77 MB here, not more.)
    let small_host = |adapters: fn() -> Vec<WgpuAdapter>| Machine {
        host_memory: Some(256 << 20),
        ..machine(adapters)
    };
    let batch = ["loader.batch_size=8192", "data.limit=256"];
    let e = err(
        &[&batch[..], &["backend.device=1"]].concat(),
        &small_host(two.wgpu_adapters.unwrap()),
    );
    assert!(
        e.contains("loader.batch_size") && e.contains("more than this machine's memory"),
        "{e}"
    );
    check_with(&batch, &small_host(two.wgpu_adapters.unwrap()))
        .expect("a GPU adapter's activations are not in host memory");
    // pin_memory has no staging memory to use there: a warning, not an error.
    let p = check_with(&["loader.pin_memory=true"], &two).unwrap();
    let warnings: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("loader.pin_memory") && w.contains("WebGPU")),
        "{warnings:?}"
    );
}

/// With no Vulkan driver a WebGPU recipe is refused as bad input (exit 2) naming
/// `backend.kind` and what to install, before a run directory exists, and nothing panics;
/// an adapter index past those found names `backend.device` and lists them.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_without_an_adapter_is_an_error_before_the_run_starts() {
    let dir = tempdir("wgpu-none");
    let run = |icd: Option<&str>, device: usize| {
        let mut cmd = runner_cmd();
        cmd.arg("recipes/quickstart.toml")
            .args(["--set", "backend.kind=\"wgpu\""])
            .arg("--set")
            .arg(format!("backend.device={device}"))
            .arg("--set")
            .arg(format!("log.dir=\"{}\"", dir.join("runs").display()))
            .env("RUNNER_CACHE_DIR", dir.join("kc"));
        if let Some(icd) = icd {
            // The Vulkan loader reads the newer name first.
            cmd.env("VK_ICD_FILENAMES", icd).env("VK_DRIVER_FILES", icd);
        }
        cmd.output().unwrap()
    };
    let out = run(Some("/nonexistent/icd.json"), 0);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("backend.kind")
            && stderr.contains("no adapter was found")
            && stderr.contains("mesa-vulkan-drivers"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("runs").exists(), "a run directory was created");

    // `runner ls` says the same.
    let ls = runner_cmd()
        .arg("ls")
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ls.stdout);
    assert!(
        stdout.contains("wgpu         no adapter found (no Vulkan driver answers)"),
        "{stdout}"
    );
    let ls = runner_cmd().arg("ls").output().unwrap();
    let stdout = String::from_utf8_lossy(&ls.stdout);
    assert!(
        stdout.contains("wgpu         0: llvmpipe") && stdout.contains("(software, on the CPU)"),
        "{stdout}"
    );

    let out = run(None, 99);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("backend.device")
            && stderr.contains("WebGPU adapter 99 does not exist")
            && stderr.contains("0: llvmpipe"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run directory was created");
}

/// A kernel cache this user cannot write (another user's, shared read-only: here made by
/// root and read as `nobody`, or made read-only where the suite does not run as root) is
/// not handed to CubeCL, which would wait 30 s on each of its files and then neither read
/// nor keep them: the run says so, caches in a directory of its own under `$TMPDIR` with
/// the shared files copied in, and so still tunes nothing the cache holds; the shared
/// cache is left as it was.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_cache_another_user_owns_is_read_through_a_private_copy() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("wgpu-shared-cache");
    let (kc, home) = (dir.join("kc"), dir.join("home"));
    std::fs::create_dir_all(home.join("tmp")).unwrap();
    // The second run's user must reach the binary: a copy beside the cache.
    let bin = dir.join("runner");
    std::fs::copy(env!("CARGO_BIN_EXE_runner"), &bin).unwrap();
    let recipe = dir.join("mlp.toml");
    std::fs::write(
        &recipe,
        "name = \"mlp\"\nseed = 1\n[backend]\nkind = \"wgpu\"\n[model]\narch = \"mlp\"\nhidden = [32]\n[data]\nformat = \"synthetic\"\nsynthetic = { image_size = 8, channels = 1, samples = 64, test_samples = 0 }\n[loader]\nbatch_size = 16\n[run]\nmax_steps = 3\nwarmup_steps = 1\neval = \"never\"\n",
    )
    .unwrap();
    let run = |as_other: bool, logs: &str| {
        let mut cmd = if as_other && is_root() {
            // Root reads and writes everything: the second run is another user's.
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        cmd.arg(&recipe)
            .arg("--set")
            .arg(format!("log.dir=\"{}\"", home.join(logs).display()))
            .env("RUNNER_CACHE_DIR", &kc)
            .env("HOME", &home)
            .env("TMPDIR", home.join("tmp"))
            .env("XDG_RUNTIME_DIR", home.join("xdg"));
        let out = cmd
            .output()
            .expect("setpriv (util-linux) runs the second user's run");
        expect_exit(&out, 0);
        let runs = home.join(logs).join("mlp");
        let latest = std::fs::read_dir(&runs)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        (
            json(&latest.join("summary.json")),
            json(&latest.join("env.json")),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (first, _, stderr) = run(false, "first");
    assert!(first["kernels"]["tuned"].as_u64().unwrap() > 0, "{first}");
    assert!(!stderr.contains("not writable"), "{stderr}");
    let files = |d: &Path| {
        let out = Command::new("find")
            .arg(d)
            .arg("-type")
            .arg("f")
            .output()
            .unwrap();
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    let shared = files(&kc);
    assert!(!shared.is_empty());

    // The second user: the home and temporary directory are theirs, the cache is not.
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    std::fs::create_dir_all(home.join("xdg")).unwrap();
    chmod(&home.join("xdg"), 0o700);
    if is_root() {
        for d in ["", "tmp", "xdg"] {
            std::os::unix::fs::chown(home.join(d), Some(65534), Some(65534)).unwrap();
        }
        chmod(&bin, 0o755);
    }
    // Whatever the umask made of it: writable by its owner at most.
    let mode = if is_root() { "go-w" } else { "a-w" };
    let status = Command::new("chmod")
        .args(["-R", mode])
        .arg(&kc)
        .status()
        .unwrap();
    assert!(status.success());
    let (second, env, stderr) = run(true, "second");
    if !is_root() {
        Command::new("chmod")
            .arg("-R")
            .arg("u+w")
            .arg(&kc)
            .status()
            .unwrap();
    }
    let uid = if is_root() { 65534 } else { my_uid() };
    let own = home.join("tmp").join(format!("runner-kernels-{uid}"));
    assert!(
        stderr.contains(&format!(
            "warning: the kernel cache {} (chosen by $RUNNER_CACHE_DIR) is not writable by this process",
            kc.display()
        )) && stderr.contains(&format!("This run caches in {} instead", own.display())),
        "{stderr}"
    );
    // CubeCL never met the unwritable files (it logs each lock it gives up on).
    assert!(!stderr.contains("cubecl cache"), "{stderr}");
    assert_eq!(env["kernels"]["dir"], own.display().to_string(), "{env}");
    assert_eq!(
        env["kernels"]["instead_of"],
        kc.display().to_string(),
        "{env}"
    );
    // What the shared cache held was used: nothing tuned again.
    assert_eq!(second["kernels"]["tuned"], 0, "{second}");
    assert!(
        second["kernels"]["tune_results_loaded"].as_u64().unwrap() > 0,
        "{second}"
    );
    assert_eq!(second["final_loss"], first["final_loss"]);
    assert_eq!(files(&kc), shared, "the shared cache changed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The runner lists WebGPU adapters discrete first and software last, and names each by
/// its position among those of its kind in the driver's order, which is how CubeCL's
/// `WgpuDevice::DiscreteGpu(n)` and the others count.
#[test]
fn webgpu_adapters_are_listed_by_kind_and_counted_as_cubecl_counts_them() {
    use runner::plan::AdapterKind::*;
    let found = [
        ("lavapipe", Cpu),
        ("A100", DiscreteGpu),
        ("mystery", Other),
        ("Iris", IntegratedGpu),
        ("H200", DiscreteGpu),
    ];
    let listed = runner::backend::order_adapters(found.map(|(n, k)| (n.to_string(), k)));
    let got: Vec<(usize, &str, _, usize)> = listed
        .iter()
        .map(|a| (a.target.index, a.name.as_str(), a.target.kind, a.target.nth))
        .collect();
    assert_eq!(
        got,
        [
            (0, "A100", DiscreteGpu, 0),
            (1, "H200", DiscreteGpu, 1),
            (2, "Iris", IntegratedGpu, 0),
            (3, "lavapipe", Cpu, 0),
            (4, "mystery", Other, 0),
        ]
    );
}
