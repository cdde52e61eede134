//! CubeCL without a GPU: WebGPU over Mesa's software Vulkan (`--features wgpu` only).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{expect_exit, is_root, json, my_uid, runner_cmd, tempdir};

/// The CubeCL path CUDA takes, run for real on a machine without a GPU: Burn's WebGPU
/// backend over Mesa's software Vulkan (lavapipe), with `cargo test --release --features
/// wgpu` (`.ci/run` installs Mesa's Vulkan driver). A cold run compiles and tunes, says so
/// while it does and learns; a second run with the same cache tunes nothing (the results
/// are loaded); `runner warmup` leaves a run nothing to tune, evaluation included; and
/// `backend.conv = "implicit_gemm"` with a named `conv_kernel` runs, its refusals (no
/// tensor cores here) said and taken by Burn's implicit GEMM, then autotune, to the same
/// numbers.
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
    let tuned = ["backend.conv=\"autotune\""];
    let (cold, env, stderr) = run("a", &tuned);
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
    let (warm, ..) = run("a", &tuned);
    assert_eq!(count(&warm, "tuned"), 0, "{warm}");
    assert_eq!(count(&warm, "tune_ms"), 0, "{warm}");
    assert!(count(&warm, "tune_results_loaded") > 0, "{warm}");
    eprintln!(
        "wgpu start-up: cold {} s, warm {} s",
        cold["startup_s"], warm["startup_s"]
    );

    // A named implicit-GEMM kernel, refused here (no tensor cores), falls back to Burn's,
    // refused too, and that to autotune's kernel: with the tuning results of the runs
    // above, the same numbers (the weight gradients unsplit, as autotune's); each refusal
    // said, the kernel recorded.
    let named = [
        "backend.conv=\"implicit_gemm\"",
        "backend.conv_kernel=\"specialized_tma\"",
        "backend.conv_split=\"off\"",
    ];
    let (igemm, env, stderr) = run("a", &named);
    assert_eq!(
        env["kernels"]["conv"],
        "implicit_gemm specialized_tma_cmma, conv_split off"
    );
    assert!(
        stderr
            .contains("backend.conv_kernel = \"specialized_tma\" (conv_tile \"cmma\") cannot take"),
        "{stderr}"
    );
    assert!(
        stderr.contains("backend.conv = \"implicit_gemm\" cannot take"),
        "{stderr}"
    );
    assert_eq!(igemm["final_loss"], warm["final_loss"]);
    assert_eq!(igemm["test_accuracy"], warm["test_accuracy"]);
    // With the weight gradients split over the batch (the default): the same training to
    // the sums' order (8 steps: the final loss within 0.1%).
    let (split, env, _) = run("a", &named[..2]);
    assert_eq!(env["kernels"]["conv"], "implicit_gemm specialized_tma_cmma");
    let loss = |s: &serde_json::Value| s["final_loss"].as_f64().unwrap();
    assert!(
        (loss(&split) - loss(&warm)).abs() <= 1e-3 * loss(&warm).abs(),
        "split {} against {}",
        loss(&split),
        loss(&warm)
    );
    // The pool's figures come from CubeCL after every step, unless profile.memory is off.
    assert!(
        warm["peak_mem_in_use_bytes"].as_u64().unwrap() > 0,
        "{warm}"
    );
    let (off, ..) = run("a", &["profile.memory=false", tuned[0]]);
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

/// With no Vulkan driver a WebGPU recipe is refused as bad input (exit 2) naming
/// `backend.kind` and what to install, before a run directory exists, and nothing panics;
/// an adapter index past those found names `backend.device` and lists them.
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

/// CubeCL takes its autotune level once per process: a grid over `backend.autotune` run in
/// one process is refused before anything runs (every cell ran with the first cell's level
/// and was recorded with its own), and `runner warmup` warms each level in a process of
/// its own.
#[test]
fn wgpu_a_grid_over_autotune_levels_is_one_process_per_level() {
    let dir = tempdir("wgpu-autotune-grid");
    let grid = crate::common::tiny_recipe(
        &dir,
        "levels",
        "[sweep]\n\"backend.autotune\" = [\"minimal\", \"balanced\"]\n",
    );
    let cmd = |args: &[&str]| {
        let mut c = runner_cmd();
        c.arg(&grid)
            .args(args)
            .args(["--set", "backend.kind=\"wgpu\"", "--set", "run.max_steps=2"])
            .env("RUNNER_CACHE_DIR", dir.join("kc"));
        c.output().unwrap()
    };
    let out = cmd(&["-q"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cell 0 asks for backend.autotune = \"minimal\" and")
            && stderr.contains(
                "cell 1 for \"balanced\": CubeCL takes its autotune level once per process"
            ),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run started");

    // As a Slurm array, a task per cell is one process per level; a task of several cells
    // (--shards) is not, and is refused before a script is written (each task failed).
    let slurm = |shards: &[&str]| {
        let mut c = runner_cmd();
        c.args(["sweep", "--slurm"]).args(shards).arg(&grid);
        c.args(["--set", "backend.kind=\"wgpu\""]);
        c.output().unwrap()
    };
    let out = slurm(&["--shards", "1"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("CubeCL takes its autotune level once per process")
            && stderr.contains("with --shards 1, each array task runs several cells"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a script was written");
    expect_exit(&slurm(&[]), 0);

    let out = runner_cmd()
        .arg("warmup")
        .arg(&grid)
        .args(["--set", "backend.kind=\"wgpu\"", "--set", "run.max_steps=2"])
        .env("RUNNER_CACHE_DIR", dir.join("kc"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout.matches(": warmed up on ").count(),
        2,
        "{stdout}{stderr}"
    );
    assert!(stderr.contains("2 different CubeCL settings"), "{stderr}");
    assert!(
        !stderr.contains("CubeCL was already configured"),
        "{stderr}"
    );
}

/// A resume on a CubeCL backend leaves env.json as the run's start wrote it (its command,
/// its time, its kernel counts) and puts its own in `resumes`: the end of the resume wrote
/// its whole environment over the start's.
#[test]
fn wgpu_a_resume_keeps_the_start_s_env_json() {
    let dir = tempdir("wgpu-resume-env");
    let recipe = crate::common::tiny_recipe(&dir, "r", "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe)
        .args(["-q", "--set", "backend.kind=\"wgpu\""])
        .args(["--set", "run.epochs=100", "--set", "run.max_steps=200"])
        .env("RUNNER_CACHE_DIR", dir.join("kc"));
    let (child, metrics) = crate::common::spawn_until(cmd, &dir.join("runs"), |p| {
        p.ends_with("metrics.jsonl")
            && std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() >= 3)
    });
    crate::common::signal_pid("-TERM", child.id());
    expect_exit(&child.wait_with_output().unwrap(), 143);
    let run = metrics.parent().unwrap();
    // As if the run had started where `backend.fusion = "auto"` chose otherwise (4 CPUs
    // or more against fewer here, or the other way): the resume keeps the start's choice.
    let mut start = json(&run.join("env.json"));
    let started_with = !start["kernels"]["fusion"].as_bool().unwrap();
    start["kernels"]["fusion"] = started_with.into();
    std::fs::write(run.join("env.json"), start.to_string()).unwrap();
    assert!(
        start["kernel_counts"]["compiled"].as_u64().unwrap() > 0,
        "{start}"
    );
    let out = crate::common::resume_quietly(run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let with = if started_with { "with" } else { "without" };
    assert!(
        stderr.contains(&format!(
            "the run started {with} fusion; this resume keeps to that"
        )),
        "{stderr}"
    );
    let env = json(&run.join("env.json"));
    for key in ["command", "started_at", "kernel_counts", "sources"] {
        assert_eq!(env[key], start[key], "{key}: {env}");
    }
    let resumes = env["resumes"].as_array().unwrap();
    assert_eq!(resumes.len(), 1, "{env}");
    assert_eq!(resumes[0]["command"][1], "resume", "{env}");
    assert!(resumes[0]["kernel_counts"].is_object(), "{env}");
    let label = if started_with {
        "wgpu (fusion, "
    } else {
        "wgpu (autotune "
    };
    let backend = resumes[0]["backend"].as_str().unwrap();
    assert!(backend.starts_with(label), "{env}");
}

/// `backend.fusion = "auto"` seen where it acts: a run on 1 CPU (`taskset`) is warned that
/// CubeCL's threads take turns, goes without fusion, says so on its backend line, and
/// records why in env.json; `backend.fusion = true` on 2 CPUs runs with fusion, warned.
#[test]
fn wgpu_fusion_auto_goes_by_the_cpus_the_run_may_use() {
    let dir = tempdir("wgpu-fusion-cpus");
    let recipe = crate::common::tiny_recipe(&dir, "r", "");
    let run = |cpus: &str, name: &str, sets: &[&str]| {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", cpus]).arg(env!("CARGO_BIN_EXE_runner"));
        cmd.arg(&recipe)
            .args(["--set", "backend.kind=\"wgpu\"", "--set", "run.max_steps=2"])
            .args(["--set", &format!("name=\"{name}\"")])
            .env("RUNNER_CACHE_DIR", dir.join("kc"));
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("taskset (util-linux) runs the binary");
        expect_exit(&out, 0);
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let env = json(&crate::common::only_run(&dir.join("runs").join(name)).join("env.json"));
        (said, env)
    };
    let (said, env) = run("0", "one", &[]);
    assert!(
        said.contains("backend.kind")
            && said.contains("this process may use 1 CPU")
            && said.contains("wgpu (no fusion: 1 CPU, autotune"),
        "{said}"
    );
    assert_eq!(env["kernels"]["fusion"], false, "{env}");
    let why = env["kernels"]["fusion_reason"].as_str().unwrap();
    assert!(
        why.starts_with("auto: 1 CPU for this process, fusion from 4"),
        "{why}"
    );

    let (said, env) = run("0,1", "two", &["backend.fusion=true"]);
    assert!(
        said.contains("backend.fusion")
            && said.contains("fusion with 2 CPUs for this process")
            && said.contains("wgpu (fusion, autotune")
            && !said.contains("may use 1 CPU"),
        "{said}"
    );
    assert_eq!(env["kernels"]["fusion"], true, "{env}");
    assert_eq!(
        env["kernels"]["fusion_reason"], "backend.fusion = true",
        "{env}"
    );
}
