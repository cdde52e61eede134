//! What a run logs: phases and their profile window, TensorBoard events and metrics.csv.

use std::path::Path;

use runner::metrics::StepRecord;
use runner::plan::{self, Machine};
use runner::recipe;
use runner::run::{self, RunOptions};

use crate::common::{
    expect_exit, only_run, plan_from, read_events, records, runner_cmd, summary, tb_losses,
    tempdir, tiny_recipe, walk_files, TbEvent, FASHION,
};

#[test]
fn a_cpu_run_records_every_phase_and_its_profile_window() {
    let p = plan_from(
        "phases",
        &format!("{FASHION}\n[loader]\nbatch_size = 32\nworkers = 1\n[cleanup]\nevery = 4\nactions = [\"trim_host\"]\n[run]\nmax_steps = 24\nwarmup_steps = 2\neval = \"never\"\n[log]\nevery = 3\n[profile]\nsteps = \"10..15\"\nsample_ms = 10\n"),
    );
    let out = run::execute(
        &p,
        &RunOptions {
            quiet: true,
            ..Default::default()
        },
    )
    .unwrap();
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
        // A step's memory is read as the step left it, before its cleanup (read after it,
        // a cleanup every step made the run's peak that of the memory between steps).
        if r.cleanup_mem_before_bytes.is_some() {
            assert_eq!(r.rss_bytes, r.cleanup_mem_before_bytes, "step {}", r.step);
        }
        let u = r.cpu_util_pct.expect("the /proc sampler covers every step");
        assert!((0.0..=100.0).contains(&u));
    }
    assert!(recs.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
    let s = summary(&out.dir);
    assert_eq!(s.util_source, "cpu_clock");
    assert!(
        s.cpu_util_pct.unwrap() > 5.0,
        "a training process uses the CPU"
    );
    assert_eq!(s.synced_phases.as_ref().unwrap().steps, 5);
    assert_eq!(s.phases.as_ref().unwrap().steps, 24 - 2 - 5);
    // The window's steps (slower: they sync) are left out of ms/iter, as the warm-up is.
    assert_eq!(s.iter_ms.count, 24 - 2 - 5);
    assert!(s.cleanup_freed_bytes.is_some());
    let most = recs.iter().filter_map(|r| r.cleanup_mem_before_bytes).max();
    assert!(
        s.peak_rss_bytes >= most,
        "{:?} < {most:?}",
        s.peak_rss_bytes
    );
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

/// A diverged run's losses are in its events as they are in metrics.jsonl, NaN included:
/// they were dropped, so the curve ended early and no evaluation loss was shown.
#[test]
fn tensorboard_keeps_a_nan_loss() {
    let dir = tempdir("tb-nan");
    let recipe = tiny_recipe(&dir, "tbn", "[optim]\nlr = 1e9\n");
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "run.stop_on_divergence=false"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/tbn"));
    let recs = records(&run);
    assert!(
        recs.iter().any(|r| r.loss.is_nan()),
        "the run did not diverge"
    );
    let tb = tb_losses(&run);
    assert_eq!(tb.len(), recs.len());
    for ((step, loss), r) in tb.iter().zip(&recs) {
        assert_eq!(*step, r.step);
        // (metrics.jsonl writes NaN and infinities alike, as null.)
        assert!(
            loss.to_bits() == (r.loss as f32).to_bits() || (!loss.is_finite() && r.loss.is_nan()),
            "step {step}: {loss} against {}",
            r.loss
        );
    }
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

/// What is due at a step that ends an epoch happens and is recorded like anywhere else:
/// `run.validate = N` validates at every N-th step (the epoch's last included; those were
/// skipped, so N equal to the steps per epoch never validated), and a checkpoint written
/// at the epoch's end puts its time on that step's line (it read 0).
#[test]
fn what_is_due_at_an_epochs_last_step_is_done_and_timed() {
    let dir = tempdir("epoch-end");
    let recipe = tiny_recipe(&dir, "e", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "data.validation=0.25",
            "--set",
            "run.epochs=3",
        ])
        .args([
            "--set",
            "run.validate=3",
            "--set",
            "checkpoint.every=\"epoch\"",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/e"));
    let recs = records(&run);
    let per_epoch = recs.iter().filter(|r| r.epoch == 0).count() as u64;
    assert_eq!(per_epoch, 3, "75 samples in batches of 32");
    let s = summary(&run);
    let validated: Vec<u64> = s.validations.iter().map(|v| v.step).collect();
    assert_eq!(validated, [3, 6, 9]);
    // Checkpoints after epochs 1 and 2 (none after the run's last step), each timed on
    // its step's line, and the line counts the summary's total.
    let timed: Vec<u64> = recs
        .iter()
        .filter(|r| r.checkpoint_ms > 0.0)
        .map(|r| r.step)
        .collect();
    assert_eq!(timed, [3, 6]);
    let sum: f64 = recs.iter().map(|r| r.checkpoint_ms).sum();
    assert_eq!(s.checkpoints, 2);
    assert!(
        (sum - s.checkpoint_ms_total).abs() < 1e-6,
        "{sum} vs {}",
        s.checkpoint_ms_total
    );
    // Every line once, in order.
    let steps: Vec<u64> = recs.iter().map(|r| r.step).collect();
    assert_eq!(steps, (1..=9).collect::<Vec<_>>());
}

/// `run.max_steps` ending the run inside an epoch: a validation every epoch is done after
/// its last step, as the test set is scored there (a run shorter than an epoch had no
/// validation, no best weights and no early stopping, and said nothing of it).
#[test]
fn a_run_cut_inside_an_epoch_validates_after_its_last_step() {
    let dir = tempdir("cut-validate");
    let recipe = tiny_recipe(&dir, "cut", "");
    let run_with = |max_steps: &str, epochs: &str| {
        let out = runner_cmd()
            .arg(&recipe)
            .args([
                "-q",
                "--set",
                "data.validation=0.25",
                "--set",
                "run.eval=\"epoch\"",
            ])
            .args(["--set", &format!("run.max_steps={max_steps}")])
            .args(["--set", &format!("run.epochs={epochs}")])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let runs = dir.join("runs/cut");
        let latest = std::fs::read_dir(&runs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        summary(&latest)
    };
    // 75 training samples in batches of 32: 3 steps an epoch.
    let s = run_with("2", "1");
    let validated: Vec<u64> = s.validations.iter().map(|v| v.step).collect();
    assert_eq!(validated, [2], "{s:?}");
    assert_eq!(s.best_step, Some(2));
    let evals: Vec<u64> = s.evals.iter().map(|e| e.step).collect();
    assert_eq!(evals, [2]);
    // After a whole epoch and inside the next: at each epoch's end and the cut, once each.
    let s = run_with("5", "2");
    let validated: Vec<u64> = s.validations.iter().map(|v| v.step).collect();
    assert_eq!(validated, [3, 5], "{s:?}");
    // Patience that runs out at the run's last step stops nothing: no early stop is said.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["--set", "data.validation=0.25", "--set", "run.max_steps=5"])
        .args([
            "--set",
            "run.epochs=2",
            "--set",
            "run.early_stop.patience=1",
        ])
        .args(["--set", "run.early_stop.min_delta=100"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let latest = std::fs::read_dir(dir.join("runs/cut"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let s = summary(&latest);
    assert_eq!((s.steps, s.early_stopped_at_step), (5, None), "{s:?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("early stop"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint written inside an epoch is not part of its step's `iter_ms` (it is that
/// line's `checkpoint_ms`), as one at an epoch's end is not: ms/iter does not depend on
/// where checkpoints land. An in-epoch line's `t_ms` is taken after both, so the time
/// since the line before holds the step and its checkpoint.
#[test]
fn a_checkpoint_is_not_part_of_its_steps_time() {
    let dir = tempdir("ckpt-time");
    let recipe = tiny_recipe(&dir, "c", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "model.hidden=[1024, 1024]",
            "--set",
            "run.epochs=2",
        ])
        .args(["--set", "checkpoint.every=2"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let recs = records(&only_run(&dir.join("runs/c")));
    let inside: Vec<u64> = recs
        .iter()
        .filter(|r| r.checkpoint_ms > 0.0 && r.step % 4 != 0)
        .map(|r| r.step)
        .collect();
    assert_eq!(inside, [2, 6], "4 steps an epoch, a checkpoint every 2");
    for w in recs.windows(2) {
        let (before, r) = (&w[0], &w[1]);
        // (One at an epoch's end is written after the line's `t_ms`, past its evaluations.)
        if inside.contains(&r.step) {
            let between = r.t_ms - before.t_ms;
            assert!(
                between >= r.iter_ms + r.checkpoint_ms - 0.01,
                "step {}: {between} ms between the lines, {} ms step + {} ms checkpoint",
                r.step,
                r.iter_ms,
                r.checkpoint_ms
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where `run.max_steps` ends a run inside an epoch, the epoch lines count the epochs the
/// run reaches, and the cut epoch has its line, saying so (it said "epoch 1/3" of a run
/// of 1.5 epochs, and nothing of the half epoch, whose test line then stood alone).
#[test]
fn epoch_lines_count_the_epochs_max_steps_leaves() {
    let dir = tempdir("epoch-lines");
    // 100 samples in batches of 32: 4 steps an epoch; 6 steps end the run in the second.
    let recipe = tiny_recipe(&dir, "cut", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args(["--set", "run.epochs=3", "--set", "run.max_steps=6"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("epoch 1/2: 4 steps, mean loss"), "{err}");
    assert!(
        err.contains("epoch 2/2: 2 steps (cut short by run.max_steps), mean loss"),
        "{err}"
    );
    assert!(!err.contains("epoch 3"), "{err}");
    // Early stopping inside an epoch says so, not max_steps: 100 samples, 20 held out,
    // 80 in batches of 32 (3 steps an epoch), validated every 2 steps: at a step 2, 4, 8,
    // 10 ... it stops inside one (here at 4: the loss fell by less than 0.1).
    let out = runner_cmd()
        .arg(&recipe)
        .args(["--set", "run.epochs=40", "--set", "data.validation=0.2"])
        .args([
            "--set",
            "run.validate=2",
            "--set",
            "run.early_stop.patience=1",
        ])
        .args(["--set", "run.early_stop.min_delta=0.1"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("run.max_steps"), "{err}");
    let at: u64 = err
        .split("early stop after step ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no early stop: {err}"));
    assert_eq!(at, 4, "{err}");
    assert!(
        err.contains("epoch 2/40: 1 step (cut short by early stopping)"),
        "{err}"
    );
}

/// A validation inside the epoch is not part of its step's time, as a checkpoint is not:
/// its own record holds it (a validation every 3 steps made those steps ten times as long,
/// and the run's p95 theirs).
#[test]
fn a_validation_is_timed_apart_from_its_step() {
    let dir = tempdir("validation-time");
    let out = runner_cmd()
        .arg("recipes/quickstart.toml")
        .arg("-q")
        .args(["--set", "data.validation=0.5", "--set", "run.validate=3"])
        .args(["--set", "run.max_steps=9", "--set", "run.eval=\"never\""])
        .arg("--set")
        .arg(format!("log.dir={:?}", dir.display().to_string()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("quickstart"));
    let recs = records(&run);
    let s = summary(&run);
    assert_eq!(s.validations.len(), 3);
    for v in &s.validations {
        // Half the training set scored, against one batch trained: the step is far shorter.
        let step = recs.iter().find(|r| r.step == v.step).unwrap();
        assert!(
            step.iter_ms < v.ms,
            "step {}: {} ms, its validation {} ms",
            v.step,
            step.iter_ms,
            v.ms
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A long run keeps nothing of each step: its summary's figures are read back from its
/// lines at its end. 60,000 steps of a tiny MLP grew the run's own resident memory by
/// 23-35 MB (it kept each step's record, ~500 bytes, and the run's memory column counted
/// them as the run's); now by nothing measurable.
#[test]
fn a_long_run_s_memory_does_not_grow_with_its_records() {
    let dir = tempdir("long-memory");
    let recipe = tiny_recipe(&dir, "long", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "model.hidden=[8]",
            "--set",
            "data.synthetic={ samples = 64, test_samples = 16, image_size = 4, channels = 1 }",
            "--set",
            "loader.batch_size=2",
            "--set",
            "run.epochs=1875",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/long"));
    let lines = records(&run);
    assert_eq!(lines.len(), 60_000);
    let rss = |i: usize| lines[i].rss_bytes.expect("the CPU's resident memory") as f64;
    let grew = rss(lines.len() - 1) - rss(999);
    assert!(
        grew < 6e6,
        "{:.1} MB more resident from step 1,000 to 60,000",
        grew / 1e6
    );
    let _ = std::fs::remove_dir_all(&dir);
}
