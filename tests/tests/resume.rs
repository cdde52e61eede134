//! Long runs: checkpoints, `runner resume` and `runner eval`.

use std::path::{Path, PathBuf};
use std::process::Command;

use runner::metrics::RunStatus;

use crate::common::{
    copy_dir, cut_records, eval_reports, expect_exit, json, long_recipe, losses, mlp_over_a_copy,
    only_run, records, resume_quietly, root, runner_cmd, signal_pid, spawn_until, summary,
    tb_losses, tempdir, tiny_recipe, walk_files,
};

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
    signal_pid(signal, child.id());
    child.wait_with_output().unwrap()
}

/// Runs `recipe` (named `name`) uninterrupted, its runs under `dir/ref`; returns its run
/// directory.
fn reference_run(recipe: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = runner_cmd()
        .arg(recipe)
        .args(["-q", "--set"])
        .arg(format!("log.dir=\"{}\"", dir.join("ref").display()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    only_run(&dir.join("ref").join(name))
}

/// Runs `recipe` (named `name`, its runs under `dir/runs`) to a SIGTERM after 23 steps;
/// returns the run directory.
fn stopped(recipe: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = kill_after(
        &[recipe.as_os_str(), "-q".as_ref()],
        &dir.join("runs"),
        23,
        "-TERM",
    );
    expect_exit(&out, 143);
    only_run(&dir.join("runs").join(name))
}

/// Runs `recipe` (named `name`) to a SIGTERM after 23 steps, then changes one number of
/// its latest checkpoint's `state.json`: `edit` gives the key, its value and the new one.
/// Returns the run directory.
fn stopped_and_edited(
    recipe: &Path,
    dir: &Path,
    name: &str,
    edit: impl Fn(&runner::checkpoint::State) -> (&'static str, u64, u64),
) -> PathBuf {
    let run = stopped(recipe, dir, name);
    let (latest, state) = runner::checkpoint::latest(&run).unwrap();
    let path = latest.join("state.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let (key, from, to) = edit(&state);
    let edited = text.replace(&format!("\"{key}\": {from}"), &format!("\"{key}\": {to}"));
    assert_ne!(edited, text);
    std::fs::write(&path, edited).unwrap();
    run
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
        assert_eq!(summary(&run).status, RunStatus::Interrupted);
        let (_, state) = runner::checkpoint::latest(&run).expect("a checkpoint on SIGTERM");
        // At the step it stopped at: the signal's own, or, where that step had one due
        // (every 5), that one, which the signal does not write twice.
        let stopped = summary(&run).steps;
        assert!(
            state.step == stopped
                && (state.reason.contains("SIGTERM")
                    || (state.reason == "every 5 steps" && stopped.is_multiple_of(5))),
            "stopped after step {stopped}: {state:?}"
        );
        // metrics.csv two rows short of metrics.jsonl (a write to it failed, the other
        // did not): the resume writes it again whole, not on after the gap.
        let csv_path = run.join("metrics.csv");
        let csv = std::fs::read_to_string(&csv_path).unwrap();
        let rows: Vec<&str> = csv.lines().collect();
        std::fs::write(&csv_path, rows[..rows.len() - 2].join("\n") + "\n").unwrap();
        let stopped = summary(&run);
        let out = resume_quietly(&run);
        expect_exit(&out, 0);
        let s = summary(&run);
        assert_eq!((s.status, s.resumes), (RunStatus::Completed, 1));
        // The resume's first step (run.warmup_steps = 1) is a warm-up of its own, left out
        // of the timing as the run's first step is.
        let lines = records(&run);
        let rewarmed: Vec<u64> = lines.iter().filter(|r| r.rewarm).map(|r| r.step).collect();
        assert_eq!(rewarmed, [state.step + 1]);
        assert_eq!(s.iter_ms.count as u64, s.steps - 2);
        // env.json stays the start's (its command, its time), the resume in `resumes`.
        let env = json(&run.join("env.json"));
        assert_eq!(env["command"][1], recipe.display().to_string(), "{env}");
        let resumes = env["resumes"].as_array().unwrap();
        assert_eq!(resumes.len(), 1, "{env}");
        assert_eq!(resumes[0]["from_step"], state.step, "{env}");
        assert_eq!(resumes[0]["command"][1], "resume", "{env}");
        assert_eq!(resumes[0]["threads"], env["threads"], "{env}");
        assert!(
            resumes[0]["started_at"].as_str().unwrap() >= env["started_at"].as_str().unwrap(),
            "{env}"
        );
        // The run's start-up is its first process's (it was the resume's first step), and
        // the loader's workers are counted over both processes (the resume's alone).
        assert!(stopped.startup_s.is_some(), "{stopped:?}");
        assert_eq!(
            (s.startup_s, s.first_step_ms),
            (stopped.startup_s, stopped.first_step_ms)
        );
        assert!(
            s.loader_workers_started > stopped.loader_workers_started || workers == 0,
            "{} then {}",
            stopped.loader_workers_started,
            s.loader_workers_started
        );
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
        // The files too, byte for byte (a checksum says so): their metadata was written
        // in a random order.
        assert!(
            std::fs::read(run.join("model.safetensors")).unwrap()
                == std::fs::read(reference.join("model.safetensors")).unwrap(),
            "model.safetensors differs in its bytes"
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
        let steps: Vec<u64> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(steps, want.iter().map(|w| w.0).collect::<Vec<_>>());

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
        assert_eq!(summary(&run).status, RunStatus::Running);
        // The dead process never said its start-up; its checkpoints did, and the resumed
        // run's is that one (it was the resume's own). Nor its speed: null, not 0.
        assert_eq!(summary(&run).startup_s, None);
        let at_start = json(&run.join("summary.json"));
        assert!(
            at_start["iter_ms"]["median"].is_null() && at_start["samples_per_s"].is_null(),
            "{at_start}"
        );
        let (_, latest) = runner::checkpoint::list(&run).pop().unwrap();
        let recorded = latest.recorded.clone().unwrap();
        assert!(recorded.startup_s.is_some() && recorded.first_step_ms.is_some());
        // As if an older runner had started the run: its metrics.csv lacks a column.
        let csv_path = run.join("metrics.csv");
        let old = std::fs::read_to_string(&csv_path).unwrap();
        let header = old.lines().next().unwrap().to_string();
        std::fs::write(&csv_path, old.replacen(",mem_query_ms", "", 1)).unwrap();
        let out = resume_quietly(&run);
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
        // The summary covers the whole run, the part before the kill too (it covered
        // only the resumed part: the dead process never wrote its own).
        let (s, r) = (summary(&run), summary(&reference));
        assert_eq!(s.checkpoints, r.checkpoints, "after kill -9");
        assert_eq!(
            (s.startup_s, s.first_step_ms),
            (recorded.startup_s, recorded.first_step_ms),
            "after kill -9"
        );
        // The killed process's loader workers count too (its epoch in progress is started
        // again by the resume, so there may be more than uninterrupted).
        assert!(
            s.loader_workers_started >= r.loader_workers_started,
            "{} < {}, workers = {workers}",
            s.loader_workers_started,
            r.loader_workers_started
        );
        // The test evaluations of the killed process too: they are on no metrics line,
        // and its summary was never written (they were lost).
        let evals = |s: &runner::metrics::Summary| -> Vec<(u64, u64)> {
            s.evals
                .iter()
                .map(|e| (e.step, e.accuracy.to_bits()))
                .collect()
        };
        assert_eq!(evals(&s), evals(&r), "after kill -9");
        let timed = records(&run)
            .iter()
            .filter(|r| r.checkpoint_ms > 0.0)
            .count();
        assert_eq!(s.checkpoints, timed);
        let trained_s = records(&run).last().unwrap().t_ms / 1e3;
        assert!(s.wall_s >= trained_s, "{} < {trained_s}", s.wall_s);
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
    // Killed after step 21 or later: on a loaded machine the kill lands steps later (it
    // was after step 30 once), so the test takes the two checkpoints it finds.
    let out = kill_after(
        &[recipe.as_os_str(), "-q".as_ref()],
        &dir.join("runs"),
        21,
        "-KILL",
    );
    assert_eq!(out.status.code(), None, "killed by a signal");
    let run = only_run(&dir.join("runs/r"));
    let kept: Vec<u64> = runner::checkpoint::list(&run)
        .iter()
        .map(|(_, s)| s.step)
        .collect();
    let [earlier, latest] = kept[..] else {
        panic!("two checkpoints kept: {kept:?}")
    };
    assert!(earlier >= 15 && latest == earlier + 5, "{kept:?}");
    let step_dir = |step: u64| format!("step-{step:09}");
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
    let latest_model = |run: &Path| {
        run.join("checkpoints")
            .join(step_dir(latest))
            .join("model.bin")
    };
    let resumed_before = format!("resuming from the one before it (step {earlier})");

    // Cut short: the one before it, and the run ends bitwise where the reference does.
    let m = latest_model(&run);
    let len = std::fs::metadata(&m).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}: model.bin has", step_dir(latest)))
            && stderr.contains(&resumed_before),
        "{stderr}"
    );
    // Set aside, so that pruning does not count it as a checkpoint (it kept it and removed
    // the good one the resume started from).
    let aside = run
        .join("checkpoints")
        .join(format!("damaged-{}", step_dir(latest)));
    assert!(
        aside.join("model.bin").is_file() && stderr.contains("set aside as"),
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
    let out = resume_quietly(&flipped);
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("its CRC-32 differs"));
    assert_eq!(losses(&flipped), losses(&reference));

    // The latest checkpoint's own metrics line cut short (a crash, or a copy cut off, in
    // the middle of writing it): the one before it, as for a line missing altogether.
    let metrics = torn.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let upto_latest: usize = text
        .split_inclusive('\n')
        .take(latest as usize)
        .map(str::len)
        .sum();
    std::fs::write(&metrics, &text[..upto_latest - 30]).unwrap();
    let out = resume_quietly(&torn);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "metrics.jsonl has {} whole lines, it follows line {latest}",
            latest - 1
        )) && stderr.contains(&resumed_before),
        "{stderr}"
    );
    assert_eq!(losses(&torn), losses(&reference));

    // Nothing usable: exit 2, each checkpoint's trouble named, the run left as it was.
    std::fs::write(
        none_left
            .join("checkpoints")
            .join(step_dir(earlier))
            .join("state.json"),
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
            && stderr.contains(&format!("{}: state.json:1:", step_dir(earlier)))
            && stderr.contains(&format!("{}: model.bin is missing", step_dir(latest))),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(none_left.join("summary.json")).unwrap(),
        before
    );

    // A live process resuming it, or still running it on this host: refused, untouched.
    let host = runner::clock::hostname().unwrap_or_default();
    let lock = twice.join("run.lock");
    std::fs::write(&lock, format!("{host} {}\n", std::process::id())).unwrap();
    let out = runner_cmd().arg("resume").arg(&twice).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{host} pid {} is running or resuming it (run.lock",
            std::process::id()
        )),
        "{stderr}"
    );
    // One on another node, or in a container (another pid namespace, where this host's
    // pids mean nothing; pid 4194304 is past Linux's largest): judged by its heartbeat,
    // fresh, so refused. Before, a pid not alive here was taken as a dead owner.
    for owner in ["node17 4194304 4026531836", &format!("{host} 4194304 1")] {
        std::fs::write(&lock, format!("{owner}\n")).unwrap();
        let out = runner_cmd().arg("resume").arg(&twice).output().unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(
                "pid 4194304 is running or resuming it (run.lock, its heartbeat 0 s ago)"
            ) && stderr.contains("its lock goes stale 60 s after the last heartbeat"),
            "{owner}: {stderr}"
        );
    }
    // Its heartbeat two minutes old: its owner is gone, and the run is resumed below.
    let two_minutes_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::options()
        .append(true)
        .open(&lock)
        .unwrap()
        .set_modified(two_minutes_ago)
        .unwrap();
    let mut s = json(&twice.join("summary.json"));
    let me = std::process::id();
    s["pid"] = me.into();
    s["pid_started"] = runner::clock::process_started(me).unwrap().into();
    std::fs::write(twice.join("summary.json"), s.to_string()).unwrap();
    let out = runner_cmd().arg("resume").arg(&twice).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the run is still going"));
    assert_eq!(json(&twice.join("summary.json")), s);
    // The same pid, another process's now (pids are reused; a runner that ran as pid 1
    // in a container is init seen from the host): gone, and resumed.
    let reused = runner::clock::process_started(me).unwrap() + 1;
    s["pid_started"] = reused.into();
    std::fs::write(twice.join("summary.json"), s.to_string()).unwrap();
    let out = runner_cmd().arg("report").arg(&twice).output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("its process (pid {me}) is gone")),
        "{said}"
    );
    let out = resume_quietly(&twice);
    expect_exit(&out, 0);
    assert_eq!(losses(&twice), losses(&reference));
    assert!(!lock.exists(), "the resume leaves its run.lock behind");
}

/// A run being written by a process that resume's pid check cannot see (one on another
/// node of a shared file system, or in a container, whose summary names another host or
/// a pid of its own namespace) is not resumed: the running process holds `run.lock`.
/// Before, both processes wrote the run's files, and `metrics.jsonl` got lines of NUL
/// bytes and half records.
#[test]
fn resume_refuses_a_run_that_a_process_elsewhere_is_writing() {
    let dir = tempdir("resume-elsewhere");
    let recipe = long_recipe(&dir, "r", "[checkpoint]\nevery = 5\n");
    let mut cmd = runner_cmd();
    // Seconds of steps left after its first checkpoint, which a resume would take.
    cmd.arg(&recipe).args(["-q", "--set", "run.epochs=100"]);
    let (mut child, state) = spawn_until(cmd, &dir.join("runs"), |p| {
        p.ends_with("state.json") && p.to_string_lossy().contains("/checkpoints/step-")
    });
    let run = state.ancestors().nth(3).unwrap().to_path_buf();
    let summary_path = run.join("summary.json");
    let mut s = json(&summary_path);
    s["host"] = "node17".into();
    std::fs::write(&summary_path, s.to_string()).unwrap();
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(still_running, "the run ended before the resume was tried");
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "pid {} is running or resuming it (run.lock",
            child.id()
        )),
        "{stderr}"
    );
}

/// A resume continues only on the data the run started on: a training file changed in
/// between (regenerated, cut short) is refused, naming it, and so is a file added to the
/// training directory since (it was read, and the run trained its epochs on more data in
/// silence); put back as it was, the run resumes. (Before, the checkpoint's epoch and batch
/// were applied to the other data in silence.)
#[test]
fn resume_refuses_data_that_changed_since_the_run_started() {
    let dir = tempdir("resume-data");
    let data = std::fs::read(root().join("datasets/fashion_mnist/data_batch.bin")).unwrap();
    let train_dir = dir.join("train");
    std::fs::create_dir(&train_dir).unwrap();
    let train = train_dir.join("data_batch_1.bin");
    std::fs::write(&train, &data[..3073 * 200]).unwrap();
    let recipe = dir.join("d.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"d\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"train\"\n[loader]\nbatch_size = 50\n[run]\nepochs = 2\nwarmup_steps = 1\neval = \"never\"\n[checkpoint]\nevery = 2\n[log]\ndir = \"{}\"\n",
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
    let refused = |what: &str| {
        let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
        expect_exit(&out, 2);
        assert_eq!(json(&run.join("summary.json")), s, "the run was changed");
        assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(what), "{stderr}");
        stderr
    };
    std::fs::write(&train, &data[..3073 * 60]).unwrap();
    let stderr = refused(&format!(
        "error: {}: changed since the run started (614600 bytes",
        train.display()
    ));
    assert!(stderr.contains("184380 bytes"), "{stderr}");
    std::fs::write(&train, &data[..3073 * 200]).unwrap();
    let added = train_dir.join("data_batch_2.bin");
    std::fs::write(&added, &data[3073 * 200..3073 * 300]).unwrap();
    refused(&format!(
        "error: {}: the recipe reads it now (added to a data directory?), and the run did not start on it",
        added.display()
    ));
    std::fs::remove_file(&added).unwrap();
    // An env.json of junk cannot say what the run started on: said, and written again
    // (the data went unchecked in silence).
    std::fs::write(run.join("env.json"), "junk\n").unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {}: unreadable (not a JSON object), so the data could not be checked",
            run.join("env.json").display()
        )),
        "{stderr}"
    );
    assert!(json(&run.join("env.json"))["data"].is_array());
    // A `data` entry that is there but not a list of files (a size of -1) was taken as
    // none, as in runs of earlier versions: said, and written again.
    let mut s = json(&run.join("summary.json"));
    s["status"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let mut env = json(&run.join("env.json"));
    env["data"][0]["bytes"] = (-1).into();
    std::fs::write(run.join("env.json"), env.to_string()).unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {}: `data` is unreadable (",
            run.join("env.json").display()
        )),
        "{stderr}"
    );
    assert!(json(&run.join("env.json"))["data"][0]["bytes"].as_u64() > Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// env.json's `data` holds each file as it is: the size and CRC-32 a reader of the file
/// gets, for files the run read whole (a test file, the first training file), one it
/// stopped short of (`data.limit` reached in the first) and a JSONL file. The sums are
/// taken as the checks and the load read the files, not by a pass of their own (a file
/// changed since is summed again: `data::sums`' tests).
#[test]
fn env_json_sums_each_data_file_as_it_is() {
    let dir = tempdir("env-sums");
    let data = std::fs::read(root().join("datasets/fashion_mnist/data_batch.bin")).unwrap();
    let train = dir.join("train");
    std::fs::create_dir_all(&train).unwrap();
    std::fs::write(train.join("data_batch_1.bin"), &data[..3073 * 100]).unwrap();
    std::fs::write(
        train.join("data_batch_2.bin"),
        &data[3073 * 100..3073 * 150],
    )
    .unwrap();
    std::fs::write(dir.join("test.bin"), &data[3073 * 150..3073 * 190]).unwrap();
    let sum = |p: &Path| {
        let b = std::fs::read(p).unwrap();
        (b.len() as u64, format!("{:08x}", crc32fast::hash(&b)))
    };
    let recorded = |run: &Path| -> Vec<(String, u64, String)> {
        json(&run.join("env.json"))["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["path"].as_str().unwrap().to_string(),
                    f["bytes"].as_u64().unwrap(),
                    f["crc32"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let expected = |files: &[PathBuf]| -> Vec<(String, u64, String)> {
        files
            .iter()
            .map(|p| {
                let (bytes, crc) = sum(p);
                let path = std::fs::canonicalize(p).unwrap().display().to_string();
                (path, bytes, crc)
            })
            .collect()
    };
    let files = [
        train.join("data_batch_1.bin"),
        train.join("data_batch_2.bin"),
        dir.join("test.bin"),
    ];
    // `data.limit = 60`: the load stops in the first file and never reads the second.
    let recipe = dir.join("d.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"d\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"train\"\ntest = \"test.bin\"\nlimit = 60\n[loader]\nbatch_size = 30\n[run]\nepochs = 1\nwarmup_steps = 1\neval = \"end\"\n[log]\ndir = \"{}\"\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/d"));
    assert_eq!(recorded(&run), expected(&files));

    // JSONL: the check's scan and the load read it.
    let text = root().join("datasets/rotten_tomatoes/train.jsonl");
    let jsonl = dir.join("t.jsonl");
    std::fs::copy(&text, &jsonl).unwrap();
    let recipe = dir.join("t.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"t\"\n[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"t.jsonl\"\nlimit = 64\n[loader]\nbatch_size = 32\n[run]\nmax_steps = 1\nwarmup_steps = 0\neval = \"never\"\n[log]\ndir = \"{}\"\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/t"));
    assert_eq!(recorded(&run), expected(std::slice::from_ref(&jsonl)));

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
    // As an earlier version wrote it: without the state's own checksum (which the edit
    // above would fail).
    forged.as_object_mut().unwrap().remove("state_crc32");
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
    // What is there instead is said (each said "it has no recipe.toml").
    for (path, want) in [
        (dir.join("nowhere"), "nowhere does not exist".to_string()),
        (
            recipe.clone(),
            "t.toml is a file, not a run directory".into(),
        ),
    ] {
        let out = runner_cmd().arg("eval").arg(&path).output().unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&want), "{stderr}");
    }
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
        // (It said "none was written".)
        ("checkpoints", "is a file, not a folder"),
    ] {
        let path = run.join(file);
        let kept = dir.join(format!("{file}.kept"));
        std::fs::rename(&path, &kept).unwrap();
        if file == "metrics.csv" {
            std::fs::create_dir(&path).unwrap();
        } else if file == "checkpoints" {
            std::fs::write(&path, "").unwrap();
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
    let out = resume_quietly(&run);
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
    assert_eq!(eval_reports(&run).len(), 1);
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
    // They are CIFAR-10's classes, not the Fashion-MNIST ones the model learnt: said.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: --data: its classes are not the training data's: label 0 is \"airplane\" beside the test file"),
        "{stderr}"
    );
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
        stderr.starts_with(&format!(
            "error: --data: {} is text (JSON Lines, it seems), not CIFAR-10 binary records",
            text.display()
        )) && stderr.contains("data.format is \"cifar10-bin\"")
            && !stderr.contains("--set")
            && !stderr.contains("cut it to"),
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
        let e = json(&eval_reports(&copy)[0]);
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

/// `runner eval --data FILE` scores all of FILE: the run's `data.test_limit` was about the
/// run's own test set (37 of another file's 500 records were scored, nothing said).
#[test]
fn eval_on_another_file_scores_all_of_it() {
    let dir = tempdir("eval-limit");
    let recipe = root().join("recipes/quickstart.toml");
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "run.max_steps=2",
            "--set",
            "run.warmup_steps=0",
        ])
        .args(["--set", "data.test_limit=37", "--set"])
        .arg(format!("log.dir=\"{}\"", dir.join("runs").display()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/quickstart"));
    let score = |extra: &[&str]| {
        let out = runner_cmd()
            .arg("eval")
            .arg(&run)
            .args(extra)
            .output()
            .unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(
        score(&[]).contains(" on 37 samples"),
        "the run's own test set, limited"
    );
    let other = root().join("datasets/fashion_mnist/test_batch.bin");
    let other = other.to_str().unwrap();
    assert!(score(&["--data", other]).contains(" on 500 samples"));
}

/// With `checkpoint.keep = 1`, a process killed between a checkpoint and its step's
/// metrics line can still be resumed: the checkpoint before it is kept until that line is
/// written (it was removed first, and the run could not be resumed at all). What a killed
/// process left (a checkpoint's temporary directory) is removed, and `keep` holds at the
/// end.
#[test]
fn keep_one_survives_a_kill_between_a_checkpoint_and_its_line() {
    let dir = tempdir("keep-one");
    let recipe = long_recipe(&dir, "k", "[checkpoint]\nevery = 5\nkeep = 1\n");
    let reference = reference_run(&recipe, &dir, "k");
    let out = kill_after(
        &[recipe.as_os_str(), "-q".as_ref()],
        &dir.join("runs"),
        23,
        "-KILL",
    );
    assert_eq!(out.status.code(), None, "killed by a signal");
    let run = only_run(&dir.join("runs/k"));
    let (latest, state) = runner::checkpoint::latest(&run).unwrap();
    // As if killed right after that checkpoint, before its line: the line cut off.
    let metrics = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .take(state.metrics_lines as usize - 1)
        .collect();
    std::fs::write(&metrics, kept.join("\n") + "\n").unwrap();
    let before: Vec<u64> = runner::checkpoint::list(&run)
        .iter()
        .map(|(_, s)| s.step)
        .collect();
    assert_eq!(
        before,
        [state.step - 5, state.step],
        "the one before it is kept"
    );
    let leftover = run.join("checkpoints/.tmp-step-000000099-4000000");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("model.bin"), b"half").unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("checkpoint {}", latest.display()))
            && stderr.contains(&format!(
                "resuming from the one before it (step {})",
                state.step - 5
            )),
        "{stderr}"
    );
    assert_eq!(losses(&run), losses(&reference));
    let left: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 1, "keep = 1 at the end: {left:?}");
    assert!(left[0].starts_with("step-"), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint whose state does not match metrics.jsonl (a line lost before it, or its
/// `metrics_lines` edited) is not resumed from: steps came out duplicated or skipped.
#[test]
fn a_checkpoint_out_of_line_with_the_metrics_is_not_resumed_from() {
    let dir = tempdir("out-of-line");
    let recipe = long_recipe(&dir, "o", "[checkpoint]\nevery = 5\n");
    let run = stopped_and_edited(&recipe, &dir, "o", |s| {
        ("metrics_lines", s.metrics_lines, s.metrics_lines - 3)
    });
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics.jsonl lost or gained a line, or state.json was changed"),
        "{stderr}"
    );
    let steps: Vec<u64> = records(&run).iter().map(|r| r.step).collect();
    assert_eq!(
        steps,
        (1..=80).collect::<Vec<u64>>(),
        "no step twice or missing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The line each epoch prints counts all its steps where a checkpoint falls on its last
/// step (that step's metrics line waits for the checkpoint, and was left out: every epoch
/// one short with `checkpoint.every = "epoch"`).
#[test]
fn an_epoch_line_counts_the_step_its_checkpoint_waits_on() {
    let dir = tempdir("epoch-line");
    let recipe = long_recipe(&dir, "e", "[checkpoint]\nevery = \"epoch\"\n");
    // 600 samples: each epoch's last step is one micro-batch of 24, the others 64.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["--set", "run.epochs=3", "--set", "data.limit=600"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/e"));
    let recs = records(&run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for epoch in 0..3 {
        // Each step's loss weighted by its samples (a short last batch counts as little).
        let this: Vec<(f64, f64)> = recs
            .iter()
            .filter(|r| r.epoch == epoch)
            .map(|r| (r.loss, r.samples as f64))
            .collect();
        assert!(this.iter().any(|&(_, s)| s == 24.0), "{this:?}");
        let n: f64 = this.iter().map(|(_, s)| s).sum();
        let mean = this.iter().map(|(l, s)| l * s).sum::<f64>() / n;
        let want = format!(
            "epoch {}/3: {} steps, mean loss {mean:.4},",
            epoch + 1,
            this.len()
        );
        assert!(stderr.contains(&want), "{want}\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `state.json` edited by hand (here the micro-batch to start from) is found by its
/// checksum and the checkpoint before it is used (it resumed into other training without
/// a word); a missing `env.json` is said and written again (the run ended without one).
#[test]
fn an_edited_state_is_not_resumed_from_and_a_missing_env_is_written_again() {
    let dir = tempdir("edited-state");
    let recipe = long_recipe(&dir, "s", "[checkpoint]\nevery = 5\n");
    let reference = reference_run(&recipe, &dir, "s");
    let run = stopped_and_edited(&recipe, &dir, "s", |s| {
        ("batch", s.batch as u64, s.batch as u64 + 1)
    });
    std::fs::remove_file(run.join("env.json")).unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("state.json was changed after it was written")
            && stderr.contains("env.json: missing"),
        "{stderr}"
    );
    assert_eq!(losses(&run), losses(&reference));
    // Written again from the resume, and marked so: its top level is not the run's start.
    let env = json(&run.join("env.json"));
    assert!(env["data"].is_array());
    let (_, state) = runner::checkpoint::latest(&run).unwrap();
    assert!(
        env["written_again_at_resume"]
            .as_u64()
            .is_some_and(|s| s <= state.step),
        "{env}"
    );
    assert_eq!(env["resumes"].as_array().map(Vec::len), Some(1), "{env}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A text run's `tokenizer.json` changed (or removed) before a resume is written again
/// from the vocabulary the resume makes, the run's: the resume went on in silence, and
/// `runner eval` of the finished run then scored with another vocabulary (or had none).
#[test]
fn a_resume_writes_back_a_changed_tokenizer() {
    let dir = tempdir("tokenizer-changed");
    let recipe = dir.join("t.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"t\"\n[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"{}\"\ntest = \"{}\"\n[run]\nepochs = 200\nmax_steps = 4000\n[checkpoint]\nevery = 5\n[log]\ndir = \"{}\"\n",
            root().join("datasets/rotten_tomatoes/train.jsonl").display(),
            root().join("datasets/rotten_tomatoes/test.jsonl").display(),
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let run = stopped(&recipe, &dir, "t");
    let path = run.join("tokenizer.json");
    let wrote = std::fs::read_to_string(&path).unwrap();
    let mut t: serde_json::Value = serde_json::from_str(&wrote).unwrap();
    t["vocab"].as_array_mut().unwrap().swap(2, 3);
    std::fs::write(&path, serde_json::to_string_pretty(&t).unwrap()).unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("tokenizer.json: not the file the run wrote; written again"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), wrote);
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Data that moved (its paths edited in the run's recipe.toml) is the same recipe when
/// the files are the same by content: the run resumes on them, bit for bit (it could
/// never be resumed again: the edit was refused as a changed recipe).
#[test]
fn a_run_whose_data_moved_resumes_on_the_same_files_at_their_new_path() {
    let dir = tempdir("data-moved");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for f in std::fs::read_dir(root().join("datasets/fashion_mnist")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), data.join(f.file_name())).unwrap();
    }
    let recipe = long_recipe(&dir, "m", "[checkpoint]\nevery = 5\n");
    let shipped = root().join("datasets/fashion_mnist");
    let text = std::fs::read_to_string(&recipe).unwrap();
    let text = text.replace(shipped.to_str().unwrap(), data.to_str().unwrap());
    std::fs::write(&recipe, text).unwrap();
    let reference = reference_run(&recipe, &dir, "m");
    let run = stopped(&recipe, &dir, "m");
    let moved = dir.join("moved");
    std::fs::rename(&data, &moved).unwrap();
    let resume = || resume_quietly(&run);
    let out = resume();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("if the data moved, edit the path in"),
        "{stderr}"
    );
    let recipe_toml = run.join("recipe.toml");
    let text = std::fs::read_to_string(&recipe_toml).unwrap();
    std::fs::write(
        &recipe_toml,
        text.replace(data.to_str().unwrap(), moved.to_str().unwrap()),
    )
    .unwrap();
    let out = resume();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "note: {} is now {} (the same size and CRC-32)",
            data.join("data_batch.bin").display(),
            moved.join("data_batch.bin").display()
        )),
        "{stderr}"
    );
    assert_eq!(losses(&run), losses(&reference));
    // Resumed to its end.
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already completed"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Data that moved after the run: `resume` and `eval` name the missing file and say what to
/// do (found from the findings' keys, not from their rendered text).
#[test]
fn moved_data_is_named_by_resume_and_eval_with_what_to_do() {
    let dir = tempdir("moved-data");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let sample = root().join("datasets/cifar10_sample/test_batch.bin");
    std::fs::copy(&sample, data.join("train.bin")).unwrap();
    std::fs::copy(&sample, data.join("test.bin")).unwrap();
    let recipe = dir.join("moved.toml");
    std::fs::write(
        &recipe,
        format!(
            "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data/train.bin\"\ntest = \"data/test.bin\"\n[loader]\nbatch_size = 8\n[checkpoint]\nevery = 1\n[log]\ndir = \"{}\"\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/moved"));
    // As an interrupted run would be.
    let path = run.join("summary.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"completed\"", "\"interrupted\"")).unwrap();
    std::fs::rename(&data, dir.join("elsewhere")).unwrap();

    let out = resume_quietly(&run);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("train.bin")
            && stderr.contains("does not exist")
            && stderr.contains("= note: a run's recipe.toml names its data by absolute path"),
        "{stderr}"
    );
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("test.bin")
            && stderr.contains("= help: if the test data moved, give it with runner eval"),
        "{stderr}"
    );
}

/// `runner eval` of a text run encodes the text with the run's own `tokenizer.json`, and
/// reads no training data. Before, it built the vocabulary again from the training file
/// as it was now: reordered, the same weights scored 60.8% instead of 63.2% (saved, exit
/// 0, nothing said); one line added, it failed saying the weights were damaged; the
/// training file gone, it refused even with --data. And weights of another model are
/// said in words, not in burn-store's report for programmers.
#[test]
fn eval_of_a_text_run_uses_its_tokenizer_and_needs_no_training_data() {
    let dir = tempdir("eval-text");
    let data = root().join("datasets/rotten_tomatoes");
    for f in ["train.jsonl", "test.jsonl", "labels.txt"] {
        std::fs::copy(data.join(f), dir.join(f)).unwrap();
    }
    let recipe = |name: &str, embed: usize| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"{name}\"\nseed = 1\n[model]\narch = \"bag\"\nembed_dim = {embed}\n[data]\nformat = \"jsonl\"\ntrain = \"train.jsonl\"\ntest = \"test.jsonl\"\n[loader]\nbatch_size = 32\n[optim]\noptimizer = \"adamw\"\nlr = 0.005\n[run]\nepochs = 1\nwarmup_steps = 0\n[log]\ndir = \"{}\"\n",
                dir.join("runs").display()
            ),
        )
        .unwrap();
        let out = runner_cmd().arg(&path).arg("-q").output().unwrap();
        expect_exit(&out, 0);
        only_run(&dir.join("runs").join(name))
    };
    let run = recipe("t", 64);
    let eval = |extra: &[&std::ffi::OsStr]| {
        runner_cmd()
            .arg("eval")
            .arg(&run)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = eval(&[]);
    expect_exit(&out, 0);
    let scored = String::from_utf8_lossy(&out.stdout).to_string();
    let accuracy = summary(&run).test_accuracy.unwrap();
    assert!(
        scored.starts_with(&format!("accuracy {:.2}% on 500 samples", 100.0 * accuracy)),
        "{scored}"
    );
    let score = |out: &std::process::Output| score_of(&String::from_utf8_lossy(&out.stdout));
    let train = dir.join("train.jsonl");
    let lines = std::fs::read_to_string(&train).unwrap();
    // The training file reordered, then one line longer: the same score.
    let reversed: Vec<&str> = lines.lines().rev().collect();
    std::fs::write(&train, reversed.join("\n") + "\n").unwrap();
    let out = eval(&[]);
    expect_exit(&out, 0);
    assert_eq!(score(&out), score_of(&scored));
    std::fs::write(
        &train,
        lines.clone() + "{\"label\": 0, \"text\": \"zzqx\"}\n",
    )
    .unwrap();
    let out = eval(&[]);
    expect_exit(&out, 0);
    assert_eq!(score(&out), score_of(&scored));
    // Gone: said, and scored all the same, on the recipe's test file and on --data.
    std::fs::remove_file(&train).unwrap();
    let test = dir.join("test.jsonl");
    for extra in [vec![], vec!["--data".as_ref(), test.as_os_str()]] {
        let out = eval(&extra);
        expect_exit(&out, 0);
        assert_eq!(score(&out), score_of(&scored));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "note: {} (data.train) is not there; evaluation does not need the training data",
                train.display()
            )) && !stderr.contains("warning"),
            "{stderr}"
        );
    }
    std::fs::write(&train, &lines).unwrap();
    // A --data label past the run's classes: the fix is in the file, not in the recipe.
    let other = dir.join("other.jsonl");
    std::fs::write(&other, "{\"label\": 5, \"text\": \"a fine film\"}\n").unwrap();
    let out = eval(&["--data".as_ref(), other.as_os_str()]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("label 5 is out of range")
            && stderr.contains("a trained model's classes are fixed")
            && !stderr.contains("raise model.num_classes"),
        "{stderr}"
    );
    // Lines without the label or the text: the fields the run reads, not a key to set
    // (eval takes no --set).
    for (line, help) in [
        (
            "{\"text\": \"a fine film\"}",
            "the run reads each line's label from the field \"label\" (its data.label_field)",
        ),
        (
            "{\"label\": 1}",
            "the run reads each line's text from the field \"text\" (its data.text_field)",
        ),
    ] {
        std::fs::write(&other, format!("{line}\n")).unwrap();
        let out = eval(&["--data".as_ref(), other.as_os_str()]);
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(help) && !stderr.contains("set data."),
            "{stderr}"
        );
    }
    // The tokenizer cut short: exit 2, naming it, nothing scored.
    let tokenizer = run.join("tokenizer.json");
    let saved = std::fs::read(&tokenizer).unwrap();
    std::fs::write(&tokenizer, &saved[..100]).unwrap();
    let out = eval(&[]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: {}: EOF while parsing",
            tokenizer.display()
        )) && stderr.contains("restore it from a copy of the run"),
        "{stderr}"
    );
    // One that loads but is not the file the run wrote (its case folding turned off):
    // scored, and said (the score moved in silence).
    let mut edited: serde_json::Value = serde_json::from_slice(&saved).unwrap();
    assert_eq!(edited["lowercase"], true);
    edited["lowercase"] = false.into();
    std::fs::write(&tokenizer, edited.to_string()).unwrap();
    let out = eval(&[]);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {} is not the file the run wrote (SHA-256 ",
            tokenizer.display()
        )),
        "{stderr}"
    );
    // Its vocabulary cut: the weights no longer fit, and the tokenizer is named as why
    // (the weights were blamed, and training again was the advice).
    let mut cut: serde_json::Value = serde_json::from_slice(&saved).unwrap();
    let vocab = cut["vocab"].as_array_mut().expect("a vocab array");
    vocab.truncate(10);
    std::fs::write(&tokenizer, cut.to_string()).unwrap();
    let out = eval(&[]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tokenizer.json is not the run's (said above)")
            && stderr.contains("restore tokenizer.json")
            && !stderr.contains("writes new weights"),
        "{stderr}"
    );
    std::fs::write(&tokenizer, &saved).unwrap();
    let out = eval(&[]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("is not the file"));
    // Another model's weights: which tensor differs, in words.
    let other = recipe("t16", 16);
    std::fs::copy(
        other.join("model.safetensors"),
        run.join("model.safetensors"),
    )
    .unwrap();
    let out = eval(&[]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "does not fit this recipe's model (2 tensor(s) differ, e.g. Bag.embed.weight is ["
        ) && stderr.contains(", 16] in the file, [")
            && !stderr.contains("Solution")
            && !stderr.contains("ShapeMismatch"),
        "{stderr}"
    );
}

/// "accuracy A% on N samples, loss L" of eval's line (without the weights and time).
fn score_of(line: &str) -> String {
    line.split(" (").next().unwrap().to_string()
}

/// A `summary.json` cut short (a crash while it was rewritten in place on a full disk) or
/// gone does not block a resume: it is said, written again from the checkpoint and the
/// metrics lines (as after kill -9), and the run ends where the uninterrupted one does.
/// Before, the resume refused ("missing or unreadable") though the checkpoint holds what
/// it needs.
#[test]
fn a_damaged_or_missing_summary_is_written_again_by_resume() {
    let dir = tempdir("resume-summary");
    let recipe = long_recipe(&dir, "s", "[checkpoint]\nevery = 5\n");
    let reference = reference_run(&recipe, &dir, "s");
    let run = stopped(&recipe, &dir, "s");
    let copy = |to: &str| {
        let to = dir.join(to);
        copy_dir(&run, &to);
        to
    };
    let (gone, binary, empty) = (copy("gone"), copy("binary"), copy("empty"));
    // Every field has a default: `{}` was read as a summary of a run with no name.
    std::fs::write(empty.join("summary.json"), "{}").unwrap();
    let text = std::fs::read(run.join("summary.json")).unwrap();
    std::fs::write(run.join("summary.json"), &text[..text.len() / 2]).unwrap();
    std::fs::remove_file(gone.join("summary.json")).unwrap();
    // Not text at all (it was said to "exist").
    std::fs::write(binary.join("summary.json"), [0xff, 0xfe, 0x00, 0x81]).unwrap();
    for (copy, why) in [
        (&run, "unreadable (EOF while parsing"),
        (&gone, "does not exist"),
        (&binary, "unreadable (stream did not contain valid UTF-8"),
        (&empty, "unreadable (it names no run"),
    ] {
        let out = resume_quietly(copy);
        expect_exit(&out, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "warning: {}: {why}",
                copy.join("summary.json").display()
            )) && stderr.contains("written again from the checkpoint and metrics.jsonl"),
            "{stderr}"
        );
        assert_eq!(losses(copy), losses(&reference));
        let s = summary(copy);
        assert_eq!(s.status, RunStatus::Completed);
        assert_eq!(s.steps, summary(&reference).steps);
        assert_eq!(s.name, "s");
        // What ran it, as the first process wrote it (they were left empty).
        let first = summary(&reference);
        assert_eq!((s.backend, s.device), (first.backend, first.device));
        assert_eq!(s.run_id, copy.file_name().unwrap().to_string_lossy());
    }
}

/// A checkpoint written at a step that also validates carries that validation: the run's
/// best value, the evaluations since, and the validation itself among those recorded. One
/// written before it (as the loop once did) had the run resume past a validation it never
/// made: it stopped early elsewhere and kept other best weights than the uninterrupted run.
#[test]
fn a_checkpoint_at_a_validation_step_carries_that_validation() {
    let dir = tempdir("checkpoint-validates");
    let out = runner_cmd()
        .arg("recipes/quickstart.toml")
        .arg("-q")
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", dir.display()))
        .args([
            "--set",
            "data.validation=0.1",
            "--set",
            "run.validate=15",
            "--set",
            "run.early_stop={ metric = \"val_accuracy\", patience = 1000 }",
            "--set",
            "checkpoint.every=15",
            "--set",
            "checkpoint.keep=10",
            "--set",
            "run.max_steps=62",
            "--set",
            "run.eval=\"never\"",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("quickstart"));
    let states = runner::checkpoint::list(&run);
    let steps: Vec<u64> = states.iter().map(|(_, s)| s.step).collect();
    assert_eq!(steps, [15, 30, 45, 60], "{steps:?}");
    for (path, s) in &states {
        let validations = &s.recorded.as_ref().expect("recorded").validations;
        let at: Vec<u64> = validations.iter().map(|v| v.step).collect();
        let want: Vec<u64> = (1..=s.step / 15).map(|k| k * 15).collect();
        assert_eq!(at, want, "{}", path.display());
        // The best is the best of those validations (the first of equals), and the count
        // since it is the validations after it.
        let (k, best) =
            validations
                .iter()
                .enumerate()
                .fold((0, &validations[0]), |(i, b), (j, v)| {
                    if v.accuracy > b.accuracy {
                        (j, v)
                    } else {
                        (i, b)
                    }
                });
        assert_eq!(
            s.best.map(|(step, _)| step),
            Some(best.step),
            "{}",
            path.display()
        );
        assert_eq!(
            s.since_best,
            (validations.len() - 1 - k) as u64,
            "{}",
            path.display()
        );
    }
}

/// A step whose loss diverged is never checkpointed: the run stops on it with its last
/// good checkpoint kept (one was written at the diverged step, before its loss was read,
/// and `keep = 1` let go of the good one for it; resumed, the run went on from the
/// diverged weights). Allowed to go on (`stop_on_divergence = false`), a resumed run's
/// summary still names the first diverged step (it said `null`, or a step of the resume).
#[test]
fn a_diverged_step_is_never_checkpointed_and_a_resume_keeps_the_divergence() {
    let dir = tempdir("diverged-ckpt");
    let recipe = tiny_recipe(
        &dir,
        "div",
        "[optim]\nlr = 1e6\n[checkpoint]\nevery = 1\nkeep = 1\n",
    );
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "run.epochs=3"])
        .output()
        .unwrap();
    expect_exit(&out, 1);
    let run = only_run(&dir.join("runs/div"));
    let diverged = records(&run).last().unwrap().step;
    assert!(
        summary(&run)
            .error
            .is_some_and(|e| e.starts_with(&format!("diverged at step {diverged}:"))),
        "{:?}",
        summary(&run)
    );
    let kept: Vec<u64> = runner::checkpoint::list(&run)
        .iter()
        .map(|(_, s)| s.step)
        .collect();
    assert!(
        kept.iter().all(|&s| s < diverged),
        "diverged at {diverged}, checkpoints {kept:?}"
    );
    // Resumed, it would diverge again where it did: refused, saying so.
    let out = runner_cmd().arg("resume").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the run diverged at step {diverged}: the loss is"))
            && stderr.contains(
                "resumed, it would take the same steps from its last checkpoint and diverge again"
            ),
        "{stderr}"
    );

    let on = format!("log.dir=\"{}\"", dir.join("on").display());
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "run.epochs=3",
            "--set",
            "run.stop_on_divergence=false",
            "--set",
            "optim.lr=1e30",
            "--set",
            "checkpoint.every=5",
            "--set",
            &on,
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("on/div"));
    let s = summary(&run);
    let first = s.diverged_at_step.filter(|&d| d < 10);
    assert!(s.steps == 12 && first.is_some(), "{s:?}");
    // As if stopped after its checkpoint of step 10: resumed from there.
    let mut j = json(&run.join("summary.json"));
    j["status"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), j.to_string()).unwrap();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let s = summary(&run);
    assert_eq!((s.resumes, s.steps), (1, 12), "{s:?}");
    assert_eq!(s.diverged_at_step, first, "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `eval` of a run without weights says why from the run's summary: one that diverged
/// saved none (resuming it, which the message advised, is refused: it would diverge
/// again), and a synthetic-data run has no file `--data` could name.
#[test]
fn eval_says_why_a_run_has_no_weights_and_what_data_it_takes() {
    let dir = tempdir("eval-why");
    let diverged = tiny_recipe(&dir, "d", "[optim]\nlr = 1e9\n");
    expect_exit(&runner_cmd().arg(&diverged).arg("-q").output().unwrap(), 1);
    let run = only_run(&dir.join("runs/d"));
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not exist: the run diverged at step")
            && err.contains("so it saved no weights")
            && err.contains("lower optim.lr")
            && !err.contains("resume it"),
        "{err}"
    );

    let fine = tiny_recipe(&dir, "s", "");
    expect_exit(&runner_cmd().arg(&fine).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/s"));
    let out = runner_cmd()
        .arg("eval")
        .arg(&run)
        .arg("--data")
        .arg(root().join("datasets/cifar10_sample/test_batch.bin"))
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the run trained on generated data")
            && err.contains("help: leave --data out")
            && !err.contains("--set"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CPU run's sums follow its thread count (the convolutions' weight gradients add a
/// partial sum per thread): a resume takes the count the run started with, so a run begun
/// on one thread and resumed where two are the default ends bitwise where its
/// uninterrupted one-thread twin ends (it drifted in silence from the step after the
/// checkpoint).
#[test]
fn a_cpu_resume_takes_the_thread_count_the_run_started_with() {
    let dir = tempdir("resume-threads");
    let recipe = long_recipe(&dir, "t", "");
    let run_on = |threads: Option<&str>, logs: &str| {
        let mut c = runner_cmd();
        c.arg(&recipe)
            .args(["-q", "--set"])
            .arg(format!("log.dir=\"{}\"", dir.join(logs).display()));
        if let Some(n) = threads {
            c.env("RAYON_NUM_THREADS", n);
        }
        c
    };
    let one = run_on(Some("1"), "one").output().unwrap();
    expect_exit(&one, 0);
    let one = only_run(&dir.join("one/t"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        let many = run_on(None, "many").output().unwrap();
        expect_exit(&many, 0);
        assert_ne!(
            losses(&one),
            losses(&only_run(&dir.join("many/t"))),
            "the thread count changes nothing here: this test shows nothing"
        );
    }
    // Begun on one thread, stopped, resumed with the default count.
    let (child, _) = spawn_until(run_on(Some("1"), "runs"), &dir.join("runs"), |p| {
        p.ends_with("metrics.jsonl")
            && std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() >= 20)
    });
    signal_pid("-INT", child.id());
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let run = only_run(&dir.join("runs/t"));
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("CPU threads"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(losses(&run), losses(&one));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner eval RUN` of a run whose test file changed since it ran (cut short, replaced
/// at its path) says so: the score is of other data, and it said nothing.
#[test]
fn eval_says_when_the_test_data_is_not_what_the_run_read() {
    let dir = tempdir("eval-test-changed");
    let (recipe, test) = mlp_over_a_copy(&dir, "e", "test", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/e"));
    let eval = || runner_cmd().arg("eval").arg(&run).output().unwrap();
    let out = eval();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("is not a file the run read"));
    cut_records(&test, 100);
    let out = eval();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a file the run read")
            && stderr.contains("this score is not on the data"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The summary keeps the saved weights' SHA-256, and `runner eval` of a file that is no
/// longer the one saved (a flipped byte in a tensor: it still loads) says so and scores it.
#[test]
fn eval_says_when_the_weights_are_not_those_the_run_saved() {
    let dir = tempdir("eval-sha");
    let recipe = tiny_recipe(&dir, "w", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/w"));
    let weights = run.join("model.safetensors");
    let saved = summary(&run).weights_sha256.expect("weights_sha256");
    assert_eq!(saved, runner::checkpoint::sha256_of(&weights).unwrap());
    // The evaluation's report says which file it scored, and that it was the run's (each
    // report read is removed, so that the one there is the latest).
    let report = |run: &Path| {
        let all = eval_reports(run);
        assert_eq!(all.len(), 1, "{all:?}");
        let e = json(&all[0]);
        std::fs::remove_file(&all[0]).unwrap();
        e
    };
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("not the file the run saved"), "{stderr}");
    let e = report(&run);
    assert_eq!(
        (e["weights_sha256"].as_str(), &e["weights_as_saved"]),
        (Some(saved.as_str()), &serde_json::Value::Bool(true))
    );
    flip_a_tensor_byte(&weights);
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {} is not the file the run saved (SHA-256 ",
            weights.display()
        )) && stderr.contains(&format!("the run's {}…)", &saved[..12])),
        "{stderr}"
    );
    assert_eq!(report(&run)["weights_as_saved"], false);
    // A summary edited by hand (not hex) is told apart, without a panic.
    let path = run.join("summary.json");
    let mut s = json(&path);
    s["weights_sha256"] = "aéééééééééééé".into();
    std::fs::write(&path, s.to_string()).unwrap();
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the run's aééééééééééé…)"), "{stderr}");
}

/// Weights of another float type (a file converted to F16 by another tool) or of an integer
/// type are refused by name, exit 2: burn-store took the file's type, and the first
/// product panicked (exit 101), or an integer tensor ended in a double free (exit 134).
#[test]
fn eval_refuses_weights_that_are_not_f32() {
    let dir = tempdir("eval-dtype");
    let recipe = tiny_recipe(&dir, "d", "");
    expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    let run = only_run(&dir.join("runs/d"));
    let weights = run.join("model.safetensors");
    let saved = std::fs::read(&weights).unwrap();
    for (dtype, bytes) in [("F16", 2), ("BF16", 2), ("F64", 8), ("I32", 4)] {
        std::fs::write(&weights, retyped(&saved, dtype, bytes)).unwrap();
        let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{}: tensor Mlp.layers.0.bias is {dtype} in the file, F32 in the model",
                weights.display()
            )) && stderr.contains("convert the file's tensors to F32"),
            "{dtype}: {stderr}"
        );
        assert!(eval_reports(&run).is_empty());
    }
    std::fs::write(&weights, &saved).unwrap();
    expect_exit(&runner_cmd().arg("eval").arg(&run).output().unwrap(), 0);
}

/// A safetensors file's tensors as `dtype` (`bytes` a value): each F32 value's leading
/// bytes, cut or padded (the values do not matter, the types do), the offsets made anew.
fn retyped(file: &[u8], dtype: &str, bytes: usize) -> Vec<u8> {
    let len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&file[8..8 + len]).unwrap();
    let data = &file[8 + len..];
    let mut names: Vec<String> = header
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    names.sort_by_key(|n| header[n]["data_offsets"][0].as_u64().unwrap());
    let mut out = vec![];
    for name in names {
        let t = header.get_mut(&name).unwrap();
        let (a, b) = (
            t["data_offsets"][0].as_u64().unwrap() as usize,
            t["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let start = out.len();
        for v in data[a..b].chunks(4) {
            let mut x = [0u8; 8];
            x[..4].copy_from_slice(v);
            // Two bytes: the upper half (the value as BF16); eight: zeros after it.
            out.extend_from_slice(if bytes == 2 { &x[2..4] } else { &x[..bytes] });
        }
        t["dtype"] = dtype.into();
        t["data_offsets"] = serde_json::json!([start, out.len()]);
    }
    let mut text = serde_json::to_string(&header).unwrap().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend(text);
    file.extend(out);
    file
}

/// The best weights too: the summary keeps their SHA-256 as last saved, and `runner eval
/// --best` of a file that is no longer that one says so.
#[test]
fn eval_best_says_when_the_best_weights_are_not_those_saved() {
    let dir = tempdir("eval-best-sha");
    let recipe = tiny_recipe(&dir, "b", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "data.validation=0.2",
            "--set",
            "run.validate=1",
        ])
        .args(["--set", "run.epochs=3"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/b"));
    let best = run.join("model-best.safetensors");
    let s = summary(&run);
    assert_eq!(
        s.best_weights_sha256,
        Some(runner::checkpoint::sha256_of(&best).unwrap())
    );
    let eval = || {
        runner_cmd()
            .arg("eval")
            .arg(&run)
            .arg("--best")
            .output()
            .unwrap()
    };
    let out = eval();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not the file the run saved"));
    flip_a_tensor_byte(&best);
    let out = eval();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {} is not the file the run saved",
            best.display()
        )),
        "{stderr}"
    );
    // Removed after the run saved them: said so (it said the run saved none, of a run
    // with a validation set and a best).
    std::fs::remove_file(&best).unwrap();
    let out = eval();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let step = s.best_step.unwrap();
    assert!(
        stderr.contains(&format!(
            "error: {} does not exist, though the run saved it (its best validation, step {step}): it was removed or moved since",
            best.display()
        )),
        "{stderr}"
    );
    // The trained weights too (it said the completed run had not completed).
    let weights = run.join("model.safetensors");
    std::fs::remove_file(&weights).unwrap();
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: {} does not exist, though the run saved it (after its last step)",
            weights.display()
        )),
        "{stderr}"
    );
    // A run that saved none says why.
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "checkpoint.save_final=false"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = std::fs::read_dir(dir.join("runs/b"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir() && *p != run)
        .unwrap();
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "the run completed with [checkpoint] save_final = false, so it saved no weights"
        ),
        "{stderr}"
    );
}

/// A run stopped by SIGTERM after 190 steps, a checkpoint every 5 steps, all kept, its best
/// weights saved (validation every 2 steps, no better value by 0.5 after the first ones).
fn stopped_with_a_best(dir: &Path) -> PathBuf {
    let recipe = tiny_recipe(dir, "k", "[checkpoint]\nevery = 5\nkeep = 1000\n");
    let sets: Vec<std::ffi::OsString> = [
        "-q",
        "--set",
        "run.epochs=2000",
        "--set",
        "run.max_steps=1000",
        "--set",
        "data.validation=0.2",
        "--set",
        "run.validate=2",
        "--set",
        "run.early_stop.min_delta=0.5",
        "--set",
        "run.early_stop.patience=100000",
    ]
    .iter()
    .map(Into::into)
    .collect();
    let mut args: Vec<&std::ffi::OsStr> = vec![recipe.as_os_str()];
    args.extend(sets.iter().map(|s| s.as_os_str()));
    let out = kill_after(&args, &dir.join("runs"), 190, "-TERM");
    expect_exit(&out, 143);
    only_run(&dir.join("runs/k"))
}

fn eval_best(run: &Path) -> String {
    let out = runner_cmd()
        .arg("eval")
        .arg(run)
        .arg("--best")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A resume checks `model-best.safetensors` against the SHA-256 its checkpoint recorded:
/// a damaged file is said, and the summary keeps the sum of the weights the run saved, so
/// that `runner eval --best` says so too (a resume took the sum of whatever file it found,
/// and vouched for the damaged one).
#[test]
fn a_resume_says_when_the_best_weights_are_damaged() {
    let dir = tempdir("best-damaged");
    let run = stopped_with_a_best(&dir);
    let best = run.join("model-best.safetensors");
    let saved = runner::checkpoint::sha256_of(&best).unwrap();
    let before = summary(&run).best_step;
    assert!(
        before.is_some(),
        "no best was saved: the test shows nothing"
    );
    assert_eq!(summary(&run).best_weights_sha256.as_deref(), Some(&*saved));
    flip_a_tensor_byte(&best);
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {} is not the best weights (step {}) that the checkpoint of step",
            best.display(),
            before.unwrap()
        )),
        "{stderr}"
    );
    let s = summary(&run);
    assert_eq!(
        s.best_step, before,
        "a new best was saved: the test shows nothing"
    );
    assert_eq!(s.best_weights_sha256.as_deref(), Some(&*saved));
    let stderr = eval_best(&run);
    assert!(
        stderr.contains(&format!(
            "warning: {} is not the file the run saved",
            best.display()
        )),
        "{stderr}"
    );
}

/// A process killed outright (`kill -9`) after saving a new best, and before its next
/// checkpoint, leaves a best file later than the checkpoint a resume starts from: the
/// resume says it is not the checkpoint's, and saves it again, the same bytes, when it gets
/// to that best's step; `runner eval --best` then finds the file the run saved. (Made here
/// by removing the checkpoints written after that best's step.)
#[test]
fn a_resume_saves_again_a_best_saved_after_its_checkpoint() {
    let dir = tempdir("best-after-kill");
    let run = stopped_with_a_best(&dir);
    let best = run.join("model-best.safetensors");
    let saved = runner::checkpoint::sha256_of(&best).unwrap();
    let best_step = summary(&run).best_step.unwrap();
    let checkpoints = runner::checkpoint::list(&run);
    let at = checkpoints
        .iter()
        .rposition(|(_, s)| s.best.is_some_and(|b| b.0 < best_step))
        .expect("no checkpoint before the last best: the test shows nothing");
    for (dir, _) in &checkpoints[at + 1..] {
        std::fs::remove_dir_all(dir).unwrap();
    }
    let from = checkpoints[at].1.step;
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "is not the best weights (step {}) that the checkpoint of step {from} recorded",
            checkpoints[at].1.best.unwrap().0
        )),
        "{stderr}"
    );
    let s = summary(&run);
    assert_eq!(s.best_step, Some(best_step));
    assert_eq!(s.best_weights_sha256.as_deref(), Some(&*saved));
    assert_eq!(runner::checkpoint::sha256_of(&best).unwrap(), saved);
    let stderr = eval_best(&run);
    assert!(!stderr.contains("not the file the run saved"), "{stderr}");
}

/// One byte of a safetensors file's last tensor changed (the header, at its start, is left
/// whole, so the file still loads).
fn flip_a_tensor_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x40;
    std::fs::write(path, &bytes).unwrap();
}

/// The utilisation samples are written as they are taken: a run killed outright (kill -9)
/// keeps those up to its end (it lost them all: they were written at the run's end). And
/// they are on the run's clock, as its metrics lines: a resume cuts those after its
/// checkpoint's step and goes on from that step's time (a resumed process's samples
/// started from 0 again, so that no resumed step's window held any, and each took the
/// latest sample instead of the mean of those taken while it ran).
#[test]
fn samples_are_kept_as_taken_and_a_resume_goes_on_with_the_run_s_clock() {
    let dir = tempdir("samples-resume");
    let recipe = long_recipe(
        &dir,
        "r",
        "[checkpoint]\nevery = 5\n[profile]\nsample_ms = 5\n",
    );
    let out = kill_after(
        &[recipe.as_os_str(), "-q".as_ref()],
        &dir.join("runs"),
        12,
        "-KILL",
    );
    assert_eq!(out.status.code(), None, "killed by a signal");
    let run = only_run(&dir.join("runs/r"));
    let times = |run: &Path| -> Vec<runner::sampler::Sample> {
        std::fs::read_to_string(run.join("samples.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let before = times(&run);
    let lines = records(&run);
    assert!(
        before.len() >= 10 && before[0].t_ms < lines[0].t_ms,
        "{} samples before the kill",
        before.len()
    );
    let (_, state) = runner::checkpoint::latest(&run).expect("a checkpoint every 5 steps");
    let at = lines[state.step as usize - 1].t_ms;
    let kept = before.iter().take_while(|s| s.t_ms <= at).count();
    let out = resume_quietly(&run);
    expect_exit(&out, 0);
    let after = times(&run);
    assert_eq!(
        after[..kept],
        before[..kept],
        "the samples up to the checkpoint's step"
    );
    assert!(after[kept].t_ms > at, "{} after {at}", after[kept].t_ms);
    assert!(after.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
    // Each resumed step that samples were taken during has their mean (of those taken
    // before its line was written: the last may come as it is written).
    let mut checked = 0;
    for r in records(&run).iter().filter(|r| r.step > state.step) {
        let inside: Vec<f64> = after
            .iter()
            .filter(|s| s.t_ms > r.t_ms - r.iter_ms && s.t_ms <= r.t_ms)
            .filter_map(|s| s.cpu_util_pct)
            .collect();
        if inside.is_empty() {
            continue;
        }
        let got = r.cpu_util_pct.expect("a reading");
        let means: Vec<f64> = (1..=inside.len())
            .map(|k| inside[..k].iter().sum::<f64>() / k as f64)
            .collect();
        assert!(
            means
                .iter()
                .any(|m| (got - m).abs() <= 1e-9 * m.abs().max(1.0)),
            "step {}: {got}, not a mean of the samples taken while it ran: {inside:?}",
            r.step
        );
        checked += 1;
    }
    assert!(checked >= 20, "{checked} steps checked");
    let _ = std::fs::remove_dir_all(&dir);
}
