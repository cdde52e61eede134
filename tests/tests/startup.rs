//! Start-up: the kernel cache, `startup_s`, and `runner warmup`.

use std::path::{Path, PathBuf};

use crate::common::{
    expect_exit, json, only_run, records, refuses, root, runner_cmd, summary, tempdir, tiny_recipe,
};

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
    assert_eq!(env["kernels"]["conv"], "implicit_gemm");
    assert_eq!(env["kernels"]["norm_sums"], "one_pass");
    assert_eq!(env["kernels"]["matmul"], "fixed");

    // The recipe key wins over the variable, relative to the directory it was given in;
    // -q silences the start-up line.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "backend.cache_dir=\"from-key\""])
        .args(["--set", "backend.autotune=\"minimal\""])
        .args(["--set", "backend.conv=\"autotune\""])
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
    assert_eq!(env["kernels"]["conv"], "autotune");
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

    // A named convolution kernel is recorded with its tile, the weight gradients left
    // unsplit, the batch norm's sums by Burn's reductions and the fully connected layers
    // autotuned, as the run would use them on CUDA, and kept in the resolved recipe.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "backend.conv_kernel=\"simple_async_tma\""])
        .args(["--set", "backend.conv_tile=\"mma\""])
        .args(["--set", "backend.conv_split=\"off\""])
        .args(["--set", "backend.norm_sums=\"reduce\""])
        .args(["--set", "backend.matmul=\"autotune\""])
        .env("RUNNER_CACHE_DIR", dir.join("kc"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let latest = std::fs::read_dir(dir.join("runs/startup"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let env = json(&latest.join("env.json"));
    assert_eq!(
        env["kernels"]["conv"],
        "implicit_gemm simple_async_tma_mma, conv_split off"
    );
    assert_eq!(env["kernels"]["norm_sums"], "reduce");
    assert_eq!(env["kernels"]["matmul"], "autotune");
    let resolved = std::fs::read_to_string(latest.join("recipe.toml")).unwrap();
    assert!(
        resolved.contains("conv_kernel = \"simple_async_tma\"")
            && resolved.contains("conv_tile = \"mma\"")
            && resolved.contains("conv_split = \"off\"")
            && resolved.contains("norm_sums = \"reduce\"")
            && resolved.contains("matmul = \"autotune\""),
        "{resolved}"
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
    // With --jobs the families (here the two batch sizes; the learning rates share their
    // kernels) warm in processes side by side: the same lines, each whole, one per
    // family, in whatever order they end; the processes said on stderr.
    // The recipe's warning (none timed: all warm-up) is said once, by the process that
    // started the others (each said it again).
    let out = runner_cmd()
        .args(["warmup", "--jobs", "3", "--set", "run.warmup_steps=50"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let said = String::from_utf8_lossy(&out.stderr);
    for steps in [4, 7] {
        let warning = format!("run.warmup_steps: the run has only {steps} optimizer steps");
        assert_eq!(said.matches(&warning).count(), 1, "{said}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("grid/optim.lr=0.1,batch_size=16: warmed up on flex (cpu)")
            && lines[1].starts_with("grid/optim.lr=0.1,batch_size=32: warmed up on flex (cpu)"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: 2 kernel families (model, data and batch size; the plans of one share most kernels) in 2 processes, up to 3 at a time"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "warmup --jobs created a run");
    // The warm-up job of a Slurm array is given its grid's id: another grid (the recipe
    // edited while the job waited) is refused, as the array's tasks refuse it.
    refuses(
        &[
            "warmup",
            "--grid",
            "0123456789ab",
            "recipes/article_grid.toml",
        ],
        "so no cell is run or warmed",
    );
    // --jobs 0 is a usage error.
    let out = runner_cmd()
        .args(["warmup", "--jobs", "0"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
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
    // A run that `run.max_steps` ends inside its second epoch: the shapes of the steps it
    // takes, not of both epochs (each shape more is a compile and a tuning on a GPU).
    let steps = recs.iter().filter(|r| r.epoch == 0).count() + 2;
    let taken = recs[..steps]
        .iter()
        .map(|r| (r.samples, r.padded_tokens.unwrap() / r.samples as u64))
        .collect::<std::collections::HashSet<_>>()
        .len();
    let out = warm
        .args(["--set", &format!("run.max_steps={steps}")])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{taken} training and 0 evaluation batch shape(s)")),
        "{stdout} (the first {steps} steps had {taken} shapes)"
    );
}

/// `cmd` with its stderr on a pseudo-terminal of 80 columns (`TERM` as given, or unset):
/// its exit and what the terminal received.
#[cfg(target_os = "linux")]
fn on_a_terminal(mut cmd: std::process::Command, term: Option<&str>) -> (i32, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: two out-pointers to ints, no name, default settings, an 80 × 24 window.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(opened, 0, "openpty");
    // SAFETY: both descriptors were just opened for this test, each owned once.
    let (mut master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    };
    match term {
        Some(t) => cmd.env("TERM", t),
        None => cmd.env_remove("TERM"),
    };
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(slave));
    let mut child = cmd.spawn().unwrap();
    // The terminal's other end is the child's alone now: its exit ends the reading.
    drop(cmd);
    let mut seen = vec![];
    let mut buf = [0u8; 4096];
    // Linux says EIO once no process holds the terminal.
    while let Ok(n @ 1..) = master.read(&mut buf) {
        seen.extend_from_slice(&buf[..n]);
    }
    let status = child.wait().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&seen).into_owned(),
    )
}

/// On a terminal the start-up, epoch and test lines are printed, whatever the terminal:
/// on a dumb one (`TERM=dumb` or unset: Emacs' shell, some CI terminals), where no bar is
/// drawn, every line went into the hidden bar and was lost. The bar keeps to the
/// terminal's width, with its loss and ms/iter, whatever the run's name (it wrapped at 80
/// columns, a line more each redraw; then a long name left the message no room).
#[cfg(target_os = "linux")]
#[test]
fn progress_lines_reach_any_terminal() {
    let dir = tempdir("pty");
    let name = "a_grid_with_a_long_name/cleanup.every=never,loader.workers=2";
    let recipe = tiny_recipe(&dir, "pty", "");
    for term in [Some("xterm-256color"), Some("dumb"), None] {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe)
            .args(["--set", "run.epochs=40", "--set", "run.max_steps=150"])
            .args(["--set", &format!("name=\"{name}\"")]);
        let (code, seen) = on_a_terminal(cmd, term);
        assert_eq!(code, 0, "TERM={term:?}: {seen}");
        for line in [
            &format!("{name}: first step done"),
            "epoch 1/38: 4 steps",
            "test: accuracy",
        ] {
            assert!(
                seen.contains(line),
                "TERM={term:?}: no {line:?} in {seen:?}"
            );
        }
        // What the terminal shows between cursor moves and line ends: the bar's draws.
        let mut plain = String::new();
        let mut chars = seen.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                // CSI: ESC [ parameters, then a letter.
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
                plain.push('\n');
            } else {
                plain.push(c);
            }
        }
        // A line indicatif prints is padded to the width, the bar drawn after it: each
        // draw from its `[====>   ]` on (at 80 columns a long name leaves no room).
        let bar_at = |l: &str| {
            let b = l.as_bytes();
            (0..b.len()).find(|&i| {
                b.get(i + 13) == Some(&b']')
                    && b[i] == b'['
                    && b[i + 1..i + 13].iter().all(|c| b"=> ".contains(c))
            })
        };
        let bars: Vec<&str> = plain
            .split(['\r', '\n'])
            .filter_map(|l| bar_at(l).map(|at| l[at..].trim_end()))
            .filter(|l| l.contains(" eta "))
            .collect();
        if term == Some("xterm-256color") {
            assert!(!bars.is_empty(), "no bar drawn: {seen:?}");
        }
        for b in &bars {
            assert!(
                b.chars().count() <= 80,
                "{} columns: {b:?}",
                b.chars().count()
            );
        }
        // With the loss and the time per step in it, once a step is done.
        assert!(
            term != Some("xterm-256color")
                || bars
                    .iter()
                    .any(|b| b.contains(" loss ") && b.ends_with(" ms/iter")),
            "{bars:?}"
        );
    }
}

/// A `$RUNNER_CACHE_DIR` (or a `$HOME`) that is not UTF-8 is written into env.json as
/// best it can be: every run failed, exit 1, after its run directory was made ("env.json:
/// path contains invalid UTF-8 characters"), CPU runs too, which use no kernel cache.
#[test]
fn a_cache_folder_named_in_other_bytes_than_utf8_fails_no_run() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempdir("non-utf8-cache");
    let recipe = tiny_recipe(&dir, "t", "");
    let odd = std::ffi::OsStr::from_bytes(b"/tmp/runner-test-\xff-cache");
    let out = runner_cmd()
        .arg(&recipe)
        .arg("-q")
        .env("RUNNER_CACHE_DIR", odd)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let env = json(&only_run(&dir.join("runs/t")).join("env.json"));
    assert_eq!(
        env["kernels"]["dir"].as_str(),
        Some("/tmp/runner-test-\u{fffd}-cache"),
        "{env}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
