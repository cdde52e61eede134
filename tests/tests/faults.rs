//! Faults: signals, permissions, links and pipes, full disks.

use std::path::{Path, PathBuf};
use std::process::Command;

use runner::metrics::{RunStatus, StepRecord, Summary};

use crate::common::{
    as_other, copy_dir, expect_exit, has_a_line, long_recipe, only_run, resume_grid_quietly,
    resume_quietly, root, runner_cmd, says_running, send, spawn_until, summary, tempdir,
    tiny_recipe, whole_lines, writable_by_other, SLOW_FIRST_STEP,
};

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
    let (child, _) = started(cmd, &dir.join("runs"));
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

/// Starts `cmd` (a run whose runs go under `runs`) with its output piped, and waits for
/// its first metrics line; returns it and its run directory.
fn started(cmd: Command, runs: &Path) -> (std::process::Child, PathBuf) {
    let (child, metrics) = spawn_until(cmd, runs, has_a_line);
    (child, metrics.parent().unwrap().to_path_buf())
}

/// The runner, its recipe a long synthetic run in `dir` (`extra` appended), `sets` after.
fn long_synthetic(dir: &Path, name: &str, extra: &str, sets: &[&str]) -> Command {
    let recipe = tiny_recipe(dir, name, extra);
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).args([
        "-q",
        "--set",
        "run.epochs=30",
        "--set",
        "data.synthetic.samples=4000",
    ]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd
}

/// SIGTERM (Slurm, `kill`), SIGHUP (the terminal or ssh session that started the run
/// closed) and SIGUSR1 (a job's own warning before its time limit, `--signal=USR1@120`)
/// stop the run at a step boundary with a checkpoint to resume from. SIGHUP and SIGUSR1
/// killed the run where it stood, its summary left `running`.
#[test]
fn sigterm_and_sighup_stop_at_a_step_boundary_and_say_interrupted() {
    for (signal, code, name) in [
        ("-TERM", 143, "SIGTERM"),
        ("-HUP", 129, "SIGHUP"),
        ("-USR1", 138, "SIGUSR1"),
    ] {
        let tag = name.to_lowercase();
        let (out, dir) = interrupt(&tag, "", signal);
        expect_exit(&out, code);
        let run = only_run(&dir.join(format!("runs/{tag}")));
        let s = summary(&run);
        assert_eq!(s.status, RunStatus::Interrupted);
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
        // The notice comes first, then the run's last line. (Before, with steps this
        // short, the run acted on the signal before the signals thread woke to say it:
        // the notice came after that line, or not at all, 2 times in 5.)
        let notice = stderr.find(&format!(
            "{name}: stopping at the next step boundary (metrics are kept, a checkpoint is written)"
        ));
        let last = stderr.find(&format!(
            "{tag}: interrupted by {name}; what was recorded is in"
        ));
        assert!(
            matches!((notice, last), (Some(n), Some(l)) if n < l),
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
        RunStatus::Completed
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
    assert_eq!(s.status, RunStatus::Interrupted);
    assert_eq!(s.steps as usize, whole_lines(&run).len());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("interrupted by SIGINT; what was recorded is in"),
        "{stderr}"
    );
}

/// Before a run's first step is done there is no step boundary near (on CUDA the first
/// step compiles and tunes the run's kernels, minutes on a cold cache) and nothing to keep:
/// a first Ctrl-C ends the process at once, the summary `interrupted` with no step. Before,
/// it said "stopping at the next step boundary" and went on compiling to the end of that
/// step. Here the first step (ResNet-50 at batch 32 on 64-pixel images) takes seconds on
/// the CPU, and the signal comes 1.5 s after the run's summary says `running`.
#[test]
fn a_signal_before_the_first_step_is_done_exits_at_once() {
    let dir = tempdir("sigint-start");
    let recipe = tiny_recipe(&dir, "sigint-start", "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q").args(SLOW_FIRST_STEP);
    let (child, summary_path) = spawn_until(cmd, &dir.join("runs"), says_running);
    let run = summary_path.parent().unwrap().to_path_buf();
    // Past the model's initialisation (a signal there stopped the run before its loop
    // began, which the runner has always done), well inside a first step of seconds.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Interrupted);
    assert_eq!(s.steps, 0, "it went on to a step boundary: {s:?}");
    assert_eq!(
        s.error.as_deref(),
        Some("interrupted by SIGINT before its first step was done")
    );
    assert!(whole_lines(&run).is_empty());
    assert!(runner::checkpoint::list(&run).is_empty());
    // Exiting without unwinding, it lets go of its lock itself.
    assert!(!run.join("run.lock").exists(), "run.lock left behind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIGINT: exiting now, before the first step was done;")
            && stderr.contains("is marked interrupted, nothing to keep: run the recipe again"),
        "{stderr}"
    );
}

/// A run whose last step is done and which is evaluating, for a signal to land in its
/// final evaluation (2.5-10 s: 30,000 test samples through a 4096-wide MLP), its last
/// step's line already written. (2048 wide, it took 0.7 s on a fast machine: the second of
/// two signals 0.7 s apart came after the run had completed.) Returns the child and its run directory.
fn in_final_evaluation(tag: &str, sets: &[&str]) -> (std::process::Child, PathBuf) {
    let dir = tempdir(tag);
    let recipe = tiny_recipe(&dir, tag, "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q");
    for set in [
        "model.hidden=[4096, 4096]",
        "data.synthetic={ samples = 512, test_samples = 30000, image_size = 8 }",
        "loader.batch_size=512",
        "run.max_steps=1",
    ]
    .iter()
    .chain(sets)
    {
        cmd.args(["--set", set]);
    }
    let (child, metrics) = spawn_until(cmd, &dir.join("runs"), has_a_line);
    (child, metrics.parent().unwrap().to_path_buf())
}

/// Polls `ready` every 10 ms until it holds, for two minutes at most (the assertions after
/// it then say what did not happen).
fn wait_until(mut ready: impl FnMut() -> bool) {
    let since = std::time::Instant::now();
    while !ready() && since.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SIGINT twice, later than the half second within which a second one is the first
/// delivered twice; the process's output once it has exited.
fn interrupt_twice(child: std::process::Child) -> std::process::Output {
    send("-INT", &child);
    std::thread::sleep(std::time::Duration::from_millis(700));
    send("-INT", &child);
    child.wait_with_output().unwrap()
}

/// A signal after the last step, during the final evaluation, finds no step boundary
/// left: the run finishes, `completed` with its test accuracy, and the message says so.
/// Before, it said "stopping at the next step boundary" and then completed anyway.
#[test]
fn a_signal_during_the_final_evaluation_lets_the_run_finish_and_says_so() {
    let (child, run) = in_final_evaluation("sigint-final", &[]);
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 0);
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Completed);
    assert!(s.test_accuracy.is_some(), "{s:?}");
    assert!(run.join("model.safetensors").is_file());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIGINT: the last step is done: the run finishes its final evaluation"),
        "{stderr}"
    );
}

/// A signal during a grid cell's final evaluation lets that cell finish and stops the grid
/// there, saying how to go on. The next cell was started, marked running, and left so
/// with its lock by an exit that said "before the run started: nothing was written", with
/// no command to continue. `--resume` then runs the rest.
#[test]
fn a_signal_during_a_cell_s_final_evaluation_stops_the_grid_after_it() {
    let dir = tempdir("sigint-final-cell");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    // A recipe after it: not started, and said so with the command that runs it (it was
    // left out of the message, and never ran).
    let after = tiny_recipe(&dir, "after", "");
    let heavy = [
        "model.hidden=[4096, 4096]",
        "data.synthetic={ samples = 512, test_samples = 30000, image_size = 8 }",
        "loader.batch_size=512",
        "run.max_steps=1",
    ];
    let command = |recipes: &[&Path]| {
        let mut cmd = runner_cmd();
        cmd.args(recipes).arg("-q");
        for set in heavy {
            cmd.args(["--set", set]);
        }
        cmd
    };
    let (child, _) = spawn_until(command(&[&grid, &after]), &dir.join("runs"), has_a_line);
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIGINT: stopped before cell 1 (g/optim.lr=0.2); continue the grid with: ")
            && stderr.contains("--resume"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "note: 1 recipe(s) after it not started; run them with: {} {} --set 'model.hidden=[4096, 4096]'",
            env!("CARGO_BIN_EXE_runner"),
            after.display()
        )),
        "{stderr}"
    );
    assert!(!dir.join("runs/after").exists());
    assert!(!stderr.contains("nothing was written"), "{stderr}");
    let cell0 = only_run(&dir.join("runs/g/optim.lr=0.1"));
    assert_eq!(summary(&cell0).status, RunStatus::Completed);
    assert!(!dir.join("runs/g/optim.lr=0.2").exists());
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let cells: Vec<String> = std::fs::read_dir(sweep.join("cells"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(cells.len(), 1, "{cells:?}");
    assert!(cells[0].contains("\"done\""), "{cells:?}");
    let locks = std::fs::read_dir(sweep.join("locks")).map_or(0, |d| d.count());
    assert_eq!(locks, 0);
    let mut resume = command(&[&grid]);
    resume.arg("--resume");
    let out = resume.output().unwrap();
    expect_exit(&out, 0);
    let cell1 = only_run(&dir.join("runs/g/optim.lr=0.2"));
    assert_eq!(summary(&cell1).status, RunStatus::Completed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cmd` started, and sent SIGINT once it is making a 500,000-image synthetic test set (its
/// memory grows past 300 MB only while that 1.5 GB set is being made); its output once it
/// has exited.
fn interrupt_while_loading(mut cmd: Command) -> std::process::Output {
    let child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let rss_mb = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
        status.ok().and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("VmRSS:"))?.to_string();
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb / 1024)
        })
    };
    wait_until(|| rss_mb().unwrap_or(0) >= 300);
    send("-INT", &child);
    child.wait_with_output().unwrap()
}

/// A signal while a grid cell's data loads ends the process at once, the cell marked
/// interrupted with its lock let go of, and the message says how to go on: the cell was
/// left running and locked, and the message said only "nothing was written".
#[test]
fn a_signal_while_a_cell_s_data_loads_marks_it_and_says_how_to_go_on() {
    let dir = tempdir("cell-loading");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1]\n");
    let mut cmd = runner_cmd();
    cmd.arg(&grid).args([
        "-q",
        "--set",
        "data.synthetic.test_samples=500000",
        "--set",
        "data.synthetic.image_size=32",
    ]);
    let out = interrupt_while_loading(cmd);
    expect_exit(&out, 130);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nothing was written; continue the grid with: ")
            && stderr.contains("--resume"),
        "{stderr}"
    );
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let cell = only_run(&sweep.join("cells"));
    let status = std::fs::read_to_string(&cell).unwrap();
    assert!(status.contains("\"interrupted\""), "{status}");
    let locks = std::fs::read_dir(sweep.join("locks")).map_or(0, |d| d.count());
    assert_eq!(locks, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second signal ends the process at once and still leaves a true summary:
/// `interrupted`, with the steps `metrics.jsonl` holds, and the message says what is kept
/// to go on from (here the trained weights, saved before the final evaluation; with
/// `checkpoint.every = "never"` there is no checkpoint). Before, the weights were saved
/// after it, and a second signal during it lost every trained step; earlier still, the
/// summary was left `running`, as after kill -9.
#[test]
fn a_second_signal_exits_at_once_with_the_summary_marked_interrupted() {
    let (child, run) = in_final_evaluation("sigint-second", &[]);
    // The weights are saved before the final evaluation: the second signal keeps them.
    let weights = run.join("model.safetensors");
    let since = std::time::Instant::now();
    while !weights.is_file() && since.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = interrupt_twice(child);
    expect_exit(&out, 130);
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Interrupted, "{s:?}");
    assert_eq!(s.steps, 1);
    assert_eq!(whole_lines(&run).len(), 1);
    assert_eq!(s.samples, 512, "the steps' figures are in it: {s:?}");
    // The model's size, as a completed run's summary has it (it said 0), and the saved
    // weights' sum, which `runner eval` checks the file by (it said none).
    assert!(s.parameters > 0, "{s:?}");
    assert_eq!(
        s.weights_sha256,
        Some(runner::checkpoint::sha256_of(&weights).unwrap())
    );
    assert_eq!(
        s.error.as_deref(),
        Some("interrupted by SIGINT after step 1, then at once by a second signal")
    );
    assert!(!run.join("run.lock").exists(), "run.lock left behind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "SIGINT again: exiting now, after step 1; {} is marked interrupted, its trained weights are in {}: score them with: {} eval {}",
            run.display(),
            weights.display(),
            // The program as started (no `runner` need be on PATH).
            env!("CARGO_BIN_EXE_runner"),
            run.display()
        )),
        "{stderr}"
    );
    // What it says works: the weights are whole and score on the test set.
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("on 30000 samples"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The summary a second signal leaves holds what the run's latest checkpoint recorded
/// besides the steps: the checkpoints written (here the one at step 1, with its time) and
/// the evaluations; it said 0 checkpoints (the summary as at the run's start), and a
/// resume kept that count. And what this process did after that checkpoint: its
/// validations and the best it saved.
#[test]
fn a_second_signal_keeps_the_checkpoints_and_evaluations_in_the_summary() {
    let (child, run) = in_final_evaluation(
        "sigint-second-ckpt",
        &[
            "run.max_steps=2",
            "run.epochs=2",
            "checkpoint.every=1",
            "run.eval=\"epoch\"",
            // A final evaluation of seconds, for both signals to land in it.
            "data.synthetic={ samples = 640, test_samples = 150000, image_size = 8 }",
            // A best at each step, likely: watched, with the best weights saved.
            "data.validation=0.2",
            "run.validate=1",
            "run.early_stop.patience=100",
        ],
    );
    // Step 2's line and the weights: the final evaluation is under way.
    let weights = run.join("model.safetensors");
    wait_until(|| weights.is_file() && whole_lines(&run).len() == 2);
    let out = interrupt_twice(child);
    expect_exit(&out, 130);
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Interrupted, "{s:?}");
    let (_, state) = runner::checkpoint::latest(&run).expect("the checkpoint of step 1");
    assert_eq!(state.step, 1);
    assert_eq!(s.checkpoints, 1, "{s:?}");
    // The start-up and the epochs done, from the checkpoint: they said null and 0.
    let recorded = state.recorded.clone().unwrap();
    assert!(
        s.startup_s.is_some() && s.startup_s == recorded.startup_s,
        "{s:?}"
    );
    assert_eq!(s.epochs_completed, state.epochs_completed, "{s:?}");
    let own = whole_lines(&run)[0].checkpoint_ms;
    assert!(own > 0.0 && s.checkpoint_ms_total == own, "{s:?}");
    // The evaluation of epoch 1, before the checkpoint (the last epoch's was cut short).
    assert_eq!(
        s.evals.iter().map(|e| e.step).collect::<Vec<_>>(),
        [1],
        "{s:?}"
    );
    // The validations: the checkpoint's, and step 2's, which this process made after it
    // (it was lost).
    assert_eq!(
        s.validations.iter().map(|e| e.step).collect::<Vec<_>>(),
        [1, 2],
        "{s:?}"
    );
    // The best saved after the checkpoint is the file on disk: the summary names it, its
    // step and sum (it gave the checkpoint's step 1, beside step 2's file, and `eval
    // --best` then called the run's own file not the one it saved).
    let at_1 = recorded.best_weights_sha256.clone();
    assert!(at_1.is_some(), "{state:?}");
    let on_disk = runner::checkpoint::sha256_of(&run.join("model-best.safetensors")).ok();
    assert!(
        on_disk.is_some() && on_disk != at_1,
        "no best after the checkpoint: the test shows nothing"
    );
    assert_eq!(s.best_step, Some(2), "{s:?}");
    assert_eq!(s.best_weights_sha256, on_disk, "{s:?}");
}

/// Without a checkpoint, a second signal's summary gives the best validation this process
/// saved, its step, value and weights' SHA-256: it said none, beside the
/// `model-best.safetensors` on disk.
#[test]
fn a_second_signal_without_a_checkpoint_keeps_the_best() {
    let (child, run) = in_final_evaluation(
        "sigint-second-best",
        &[
            "data.synthetic={ samples = 640, test_samples = 150000, image_size = 8 }",
            "data.validation=0.2",
            "run.validate=1",
        ],
    );
    let weights = run.join("model.safetensors");
    wait_until(|| weights.is_file());
    let out = interrupt_twice(child);
    expect_exit(&out, 130);
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Interrupted, "{s:?}");
    assert!(runner::checkpoint::latest(&run).is_none());
    assert_eq!(s.best_step, Some(1), "{s:?}");
    assert!(s.best_value.is_some_and(f64::is_finite), "{s:?}");
    let best = runner::checkpoint::sha256_of(&run.join("model-best.safetensors")).ok();
    assert!(best.is_some() && s.best_weights_sha256 == best, "{s:?}");
}

/// Without saved weights (`checkpoint.save_final = false`) and without a checkpoint, a
/// second signal during the final evaluation keeps nothing to go on from, and says so.
#[test]
fn a_second_signal_with_nothing_kept_says_to_run_the_recipe_again() {
    let (child, run) = in_final_evaluation("sigint-nothing", &["checkpoint.save_final=false"]);
    let out = interrupt_twice(child);
    expect_exit(&out, 130);
    assert_eq!(summary(&run).status, RunStatus::Interrupted);
    assert!(!run.join("model.safetensors").exists());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "SIGINT again: exiting now, after step 1; {} is marked interrupted, it has no checkpoint: run the recipe again",
            run.display()
        )),
        "{stderr}"
    );
}

/// `runner resume` changes nothing while it loads the data (seconds here, for a test set of
/// 500,000 images; minutes for a large one): a signal then ends the process at once, the
/// run left as it was, to resume again. Before, it said "stopping at the next step
/// boundary", loaded on to the end, rewrote the summary and only then exited.
#[test]
fn a_signal_while_a_resume_loads_its_data_exits_at_once_leaving_the_run_as_it_was() {
    let sets = [
        "data.synthetic.test_samples=500000",
        "data.synthetic.image_size=32",
    ];
    let (out, dir) = interrupt_n("resume-loading", "", &sets, "-INT", 1);
    expect_exit(&out, 130);
    let run = only_run(&dir.join("runs/resume-loading"));
    let before = std::fs::read(run.join("summary.json")).unwrap();
    let checkpoints = runner::checkpoint::list(&run).len();
    let mut cmd = runner_cmd();
    cmd.arg("resume").arg(&run).arg("-q");
    let out = interrupt_while_loading(cmd);
    expect_exit(&out, 130);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "SIGINT: exiting now, before the resume started: the run is as it was, to resume again"
        ),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&std::fs::read(run.join("summary.json")).unwrap()),
        String::from_utf8_lossy(&before),
        "the summary was rewritten"
    );
    assert_eq!(runner::checkpoint::list(&run).len(), checkpoints);
    // As it was: no `run.lock` of the process that is gone (from another node it refused
    // a resume for a minute).
    assert!(!run.join("run.lock").exists());
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
        let mut c = as_other(&dir);
        c.arg("resume").arg(&run).arg("-q");
        c
    };
    for blocked in ["checkpoints", "samples.jsonl"] {
        writable_by_other(&run.join(blocked), false, false);
        let out = resume().output().unwrap();
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
    // An immutable summary.json (chattr +i) is refused at once too (the resume trained,
    // then failed at its first write), where the file system can mark one.
    let summary_path = run.join("summary.json");
    let marked = Command::new("chattr")
        .arg("+i")
        .arg(&summary_path)
        .output()
        .is_ok_and(|o| o.status.success());
    if marked {
        let out = resume().output().unwrap();
        let _ = Command::new("chattr").arg("-i").arg(&summary_path).status();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("summary.json: it is immutable or append-only"),
            "{stderr}"
        );
    }
    // A read-only summary.json, env.json and weights (an archived run's) are replaced as
    // they always were (written to a new name, renamed over): no refusal.
    for f in ["summary.json", "env.json"] {
        let p = run.join(f);
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o444);
        std::fs::set_permissions(&p, perm).unwrap();
    }
    // (The run is long: it is stopped once it trains again.)
    let lines =
        || std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count());
    let at_start = lines();
    let child = resume()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while lines() <= at_start + 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
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

/// A file of a run directory that the runner reads back, replaced by a named pipe,
/// blocks nothing: env.json hung `runner resume` and `runner eval`, recipe.toml hung
/// `runner report`, a checkpoint's state.json hung `runner resume`, each waiting for a
/// writer for good.
#[test]
fn a_named_pipe_in_a_run_directory_hangs_nothing() {
    let dir = tempdir("pipe-in-run");
    let recipe = long_recipe(&dir, "p", "[checkpoint]\nevery = 5\n");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q");
    let (child, _) = spawn_until(cmd, &dir.join("runs"), |p| {
        p.ends_with("metrics.jsonl")
            && std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() >= 12)
    });
    send("-INT", &child);
    expect_exit(&child.wait_with_output().unwrap(), 130);
    let run = only_run(&dir.join("runs/p"));
    let copy = |to: &str| {
        let to = dir.join(to);
        copy_dir(&run, &to);
        to
    };
    let pipe = |p: &Path| {
        std::fs::remove_file(p).unwrap();
        assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
    };
    // With `timeout`, so a regression fails instead of hanging the suite.
    let runner = |args: &[&std::ffi::OsStr]| {
        Command::new("timeout")
            .arg("30")
            .arg(env!("CARGO_BIN_EXE_runner"))
            .args(args)
            .output()
            .unwrap()
    };
    let (env, state) = (copy("env-pipe"), copy("state-pipe"));
    pipe(&env.join("env.json"));
    let out = runner(&["resume".as_ref(), env.as_os_str(), "-q".as_ref()]);
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unreadable (is a named pipe, not a file)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pipe(&env.join("env.json"));
    expect_exit(&runner(&["eval".as_ref(), env.as_os_str()]), 0);
    pipe(&env.join("recipe.toml"));
    expect_exit(&runner(&["report".as_ref(), env.as_os_str()]), 0);
    let latest = std::fs::read_dir(state.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    pipe(&latest.join("state.json"));
    let out = runner(&["resume".as_ref(), state.as_os_str(), "-q".as_ref()]);
    expect_exit(&out, 0);
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

/// A resume on a full disk says so, and leaves no empty `run.lock` behind: one read as
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
    let out = resume_quietly(&run);
    let lock_left = run.join("run.lock").exists();
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(copied.success());
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot take run.lock") && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert!(!lock_left, "an empty run.lock was left behind");
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
    // The summary says so (rewritten in place where no new file fits).
    let s: Summary = serde_json::from_str(&summary_text).unwrap();
    assert_eq!(s.status, RunStatus::Failed, "{s:?}");
}

/// A disk that fills up during a run: the run stops, and its summary still says so (it
/// said `running`, steps 0, read by `report` as killed: a new `summary.json.tmp` did not
/// fit, and nothing else was tried; the summary is now rewritten in the room kept for it).
#[test]
fn a_disk_that_fills_during_a_run_still_gets_its_summary() {
    let dir = tempdir("fills-up");
    let Some(mnt) = small_fs(&dir, "2m") else {
        return;
    };
    let cmd = long_synthetic(
        &dir,
        "fills",
        "",
        &[&format!("log.dir=\"{}\"", mnt.display())],
    );
    let (child, run) = started(cmd, &mnt);
    {
        use std::io::Write as _;
        let mut filler = std::fs::File::create(mnt.join("filler")).unwrap();
        let block = vec![0u8; 1 << 16];
        while filler.write_all(&block).is_ok() {}
        let small = [0u8; 512];
        while filler.write_all(&small).is_ok() {}
    }
    let out = child.wait_with_output().unwrap();
    let s = std::fs::read_to_string(run.join("summary.json")).unwrap_or_default();
    let lines = whole_lines(&run).len();
    let _ = Command::new("umount").arg(&mnt).status();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("No space left on device") && stderr.contains("= help: free space"),
        "{stderr}"
    );
    let s: Summary = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"));
    assert_eq!(s.status, RunStatus::Failed, "{s:?}");
    assert!(s
        .error
        .unwrap_or_default()
        .contains("No space left on device"));
    assert_eq!(
        s.steps as usize, lines,
        "the summary covers the lines written"
    );
    assert!(s.steps > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TensorBoard event cut by a full disk is undone, as a metrics line is: TensorBoard stops
/// reading a file at a record that fails its checksum, so one half-written record hid every
/// event after it (a resumed run's included). Written through the library: which of a
/// run's files meets the full disk first is down to the page each has left.
#[test]
fn a_full_disk_leaves_no_half_tensorboard_event() {
    let dir = tempdir("tb-full");
    let Some(mnt) = small_fs(&dir, "64k") else {
        return;
    };
    let mut events = runner::tensorboard::EventWriter::create(&mnt).unwrap();
    let filler = mnt.join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&[0u8; 512]).is_ok() {}
    }
    // A long tag, so that a record spans the end of the file's last page.
    let tag = "t".repeat(300);
    let mut written = 1; // the file version
    let mut failed = None;
    for step in 0..100 {
        match events.scalars(step, &[(tag.as_str(), step as f64)]) {
            Ok(()) => written += 1,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let path = events.path().to_path_buf();
    let after_failure = crate::common::read_events(&path).len();
    // With room again, the next event follows the last whole one.
    std::fs::remove_file(&filler).unwrap();
    events.scalars(1000, &[("after", 1.0)]).unwrap();
    let read = crate::common::read_events(&path);
    drop(events); // a file open in it keeps the tmpfs mounted
    let _ = Command::new("umount").arg(&mnt).status();
    let e = failed.expect("the disk never filled");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(after_failure, written);
    assert_eq!(read.len(), written + 1);
    assert_eq!(read.last().unwrap().step, 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A resume that fails before its first step (out of file descriptors) leaves the run as
/// its checkpoint had it, `interrupted`, its resumes uncounted, and says to resume again
/// (it was marked failed, and a grid started the cell over); once the limit is raised, the
/// resume goes on.
#[test]
fn a_resume_that_fails_before_its_first_step_leaves_the_run_to_resume_again() {
    let (out, dir) = interrupt("resume-fds", "", "-TERM");
    expect_exit(&out, 143);
    let run = only_run(&dir.join("runs/resume-fds"));
    let before = summary(&run);
    let mut cmd = runner_cmd();
    cmd.arg("resume").arg(&run).arg("-q");
    limited(&mut cmd, libc::RLIMIT_NOFILE, 10);
    let out = cmd.output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Too many open files")
            && stderr.contains("`ulimit -n")
            && stderr.contains("resume it again once that is put right"),
        "{stderr}"
    );
    let after = summary(&run);
    assert_eq!(after.status, RunStatus::Interrupted, "{after:?}");
    assert_eq!(after.resumes, before.resumes);
    assert!(after
        .error
        .unwrap_or_default()
        .contains("a resume failed before its first step"));
    // With the limit as it was, the resume goes on (stopped again once it has).
    let lines = whole_lines(&run).len();
    let mut again = runner_cmd();
    again.arg("resume").arg(&run).arg("-q");
    let (child, _) = spawn_until(again, &run, |p| {
        p.ends_with("metrics.jsonl") && whole_lines(&run).len() > lines + 2
    });
    send("-TERM", &child);
    expect_exit(&child.wait_with_output().unwrap(), 143);
    assert_eq!(summary(&run).resumes, before.resumes + 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write limit that cuts the run's first file: the file is not left cut (a recipe.toml of
/// 1 KiB looked runnable), and the run directory, left with nothing in it, is removed, not
/// pointed at as the run's record.
#[test]
fn a_file_cut_by_a_write_limit_before_the_run_starts_is_removed() {
    let dir = tempdir("fsize-start");
    let recipe = tiny_recipe(&dir, "cut", "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q");
    limited(&mut cmd, libc::RLIMIT_FSIZE, 1024);
    let out = cmd.output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("recipe.toml: File too large")
            && stderr.contains("= note: nothing was kept: the run directory")
            && stderr.contains("held nothing, and was removed")
            && stderr.contains("`ulimit -f`"),
        "{stderr}"
    );
    assert!(
        !dir.join("runs/cut").exists(),
        "the empty run directory was left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The utilisation samples are extra: a run that trained and saved its weights is not
/// failed because `samples.jsonl` cannot be written at its end (it was, and `report` then
/// left it out and `resume` had no checkpoint to go on from).
#[test]
fn a_run_whose_samples_cannot_be_written_still_completes() {
    let dir = tempdir("samples-unwritable");
    let recipe = tiny_recipe(&dir, "nosamples", "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).args([
        "-q",
        "--set",
        "run.epochs=10",
        "--set",
        "data.synthetic.samples=4000",
    ]);
    let (child, run) = started(cmd, &dir.join("runs"));
    // A folder where the file goes: appending to it fails (EISDIR).
    std::fs::create_dir(run.join("samples.jsonl")).unwrap();
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: cannot write {}",
            run.join("samples.jsonl").display()
        )) && stderr.contains("not kept"),
        "{stderr}"
    );
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Completed, "{s:?}");
    assert!(run.join("model.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run that cannot open what it needs before its first step (here: out of file
/// descriptors under `ulimit -n`) says so in its summary, with the help to raise the limit;
/// its summary was left `running`, read by `report` as a process killed outright.
#[test]
fn a_run_out_of_file_descriptors_fails_in_its_summary() {
    let dir = tempdir("few-fds");
    let recipe = tiny_recipe(&dir, "fewfds", "");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q");
    limited(&mut cmd, libc::RLIMIT_NOFILE, 10);
    let out = cmd.output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Too many open files") && stderr.contains("`ulimit -n"),
        "{stderr}"
    );
    let s = summary(&only_run(&dir.join("runs/fewfds")));
    assert_eq!(s.status, RunStatus::Failed, "{s:?}");
    assert!(s.error.unwrap_or_default().contains("Too many open files"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ulimit -f`: the run stops with the file named and the limit said (SIGXFSZ killed it
/// where it stood: exit 153, a line cut, its summary left `running`).
#[test]
fn a_file_size_limit_stops_the_run_as_a_full_disk_does() {
    let dir = tempdir("fsize");
    let mut cmd = long_synthetic(&dir, "fsize", "", &[]);
    limited(&mut cmd, libc::RLIMIT_FSIZE, 40 << 10);
    let out = cmd.output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics.jsonl: File too large") && stderr.contains("`ulimit -f`"),
        "{stderr}"
    );
    let run = only_run(&dir.join("runs/fsize"));
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Failed);
    assert_eq!(s.steps as usize, whole_lines(&run).len());
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(text.ends_with('\n'), "a cut metrics line");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A summary that cannot be written at all (here `summary.json` became a directory): the
/// error still gives what it would have said, test accuracy included.
#[test]
fn a_summary_that_cannot_be_written_is_said_on_stderr() {
    let dir = tempdir("no-summary");
    let cmd = long_synthetic(&dir, "nosum", "", &["run.epochs=6"]);
    let (child, run) = started(cmd, &dir.join("runs"));
    std::fs::remove_file(run.join("summary.json")).unwrap();
    std::fs::create_dir(run.join("summary.json")).unwrap();
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("summary.json: Is a directory")
            && stderr.contains("the run completed: 750 steps, median")
            && stderr.contains("test accuracy"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run directory moved while its run runs: the run goes on where it now is, says so,
/// and nothing reappears at the old path, nor is its lock left behind. Removed: the run stops and says so (a
/// checkpoint rebuilt the directory as a skeleton, and the run said `completed`).
#[test]
fn a_run_directory_moved_mid_run_is_followed_and_one_removed_stops_the_run() {
    let dir = tempdir("moved");
    let ckpt = "[checkpoint]\nevery = 100\n";
    // The sampler's first reading comes after the move: its file goes with the run too
    // (it was opened at the old path, and every reading was lost).
    let sampled = format!("{ckpt}[profile]\nsample_ms = 250\n");
    let cmd = long_synthetic(&dir, "mv", &sampled, &["run.epochs=8"]);
    let (child, run) = started(cmd, &dir.join("runs"));
    let to = dir.join("elsewhere");
    std::fs::rename(&run, &to).unwrap();
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stderr.contains(&format!("moved to {}", to.display())),
        "{stderr}"
    );
    assert!(stdout.contains(&to.display().to_string()), "{stdout}");
    assert!(!run.exists(), "the old path came back");
    assert!(!stderr.contains("cannot write"), "{stderr}");
    let samples = std::fs::read_to_string(to.join("samples.jsonl")).unwrap_or_default();
    assert!(samples.lines().count() >= 1, "no samples kept: {stderr}");
    let s = summary(&to);
    assert_eq!((s.status, s.steps), (RunStatus::Completed, 1000));
    assert_eq!(whole_lines(&to).len(), 1000);
    assert!(to.join("model.safetensors").is_file());
    assert_eq!(
        runner::checkpoint::list(&to).last().map(|(_, st)| st.step),
        Some(900)
    );
    // Its lock went with it and was let go of there (it was left behind, and a
    // `runner resume` of the moved run waited for it to go stale).
    assert!(!to.join("run.lock").exists(), "run.lock left behind");

    let cmd = long_synthetic(&dir, "rm", ckpt, &["run.epochs=8"]);
    let (child, run) = started(cmd, &dir.join("runs"));
    // Retried: the run may create a file in it while it is being emptied.
    for _ in 0..50 {
        if std::fs::remove_dir_all(&run).is_ok() {
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the run directory {} was removed", run.display())),
        "{stderr}"
    );
    assert!(!run.exists(), "the removed run directory came back");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ulimit -v` below what a recipe needs: refused before anything is written, with the
/// limit named (it was checked against the machine's memory only, and the run aborted).
#[test]
fn a_recipe_beyond_the_address_space_limit_is_refused_before_it_starts() {
    let dir = tempdir("ulimit-v");
    let mut cmd = long_synthetic(&dir, "big", "", &["data.synthetic.samples=2000000"]);
    limit_address_space(&mut cmd, 3 << 30);
    let out = cmd.output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.synthetic.samples")
            && stderr.contains("more than the address space left under `ulimit -v`"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run directory was created");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A JSONL file is read whole, its texts held beside it: one too large for the memory this
/// process may use is refused at its key (a 64 GiB file aborted the process allocating it),
/// and a list of class names beside a file is short (a huge one was read whole too).
#[test]
fn text_too_large_to_hold_is_refused_at_its_key() {
    let dir = tempdir("text-too-large");
    let big = dir.join("big.jsonl");
    // Sparse: 1 GB that takes no disk, after a line of text (a file of zeros only is
    // refused from its first bytes, before its size).
    let mut file = std::fs::File::create(&big).unwrap();
    std::io::Write::write_all(&mut file, b"{\"text\": \"a\", \"label\": 0}\n").unwrap();
    file.set_len(1 << 30).unwrap();
    let command = |first: &[&str], sets: &[String]| {
        let mut cmd = runner_cmd();
        cmd.args(first).arg("recipes/text/rotten_tomatoes.toml");
        for s in sets {
            cmd.args(["--set", s]);
        }
        cmd.args([
            "--set",
            &format!("log.dir={:?}", dir.join("runs").display().to_string()),
        ]);
        limit_address_space(&mut cmd, 600 << 20);
        cmd.output().unwrap()
    };
    let run = |sets: &[String]| command(&["-q"], sets);
    let out = run(&[format!("data.test={:?}", big.display().to_string())]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.test: ")
            && stderr.contains("big.jsonl is 1.0 GiB: read whole, with its texts beside it, it needs about 2.0 GiB, more than the address space left under `ulimit -v`"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run directory was created");
    // `validate` checks for any machine, not this one's memory: reading it fails, said.
    let out = command(
        &["validate"],
        &[format!("data.test={:?}", big.display().to_string())],
    );
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("big.jsonl cannot be held in memory (1073741824 bytes, read whole)"),
        "{stderr}"
    );
    // Class names: a file far larger than any list of them is refused, not read.
    let names = dir.join("labels.txt");
    std::fs::File::create(&names)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let train = dir.join("train.jsonl");
    std::fs::write(
        &train,
        "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\", \"label\": 1}\n",
    )
    .unwrap();
    let out = run(&[format!("data.train={:?}", train.display().to_string())]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("labels.txt is 1073741824 bytes, too large for a list of class names"),
        "{stderr}"
    );
    // Lines ended by a carriage return alone are said as such (not as "a control char").
    std::fs::write(&names, b"neg\rpos\r").unwrap();
    let out = run(&[format!("data.train={:?}", train.display().to_string())]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has lines ended by a carriage return alone"),
        "{stderr}"
    );
    // A binary one (NUL bytes) is not a class name.
    std::fs::write(&names, b"\0\0\0\n").unwrap();
    let out = run(&[format!("data.train={:?}", train.display().to_string())]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 1 holds a control character"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Image data that cannot be held is refused at once, by its size: its labels are not read
/// first (a 100 GB file was read to its end, minutes, before the memory check refused it).
/// Cut with `data.limit` to what fits, it is read, and a bad label in what is used found.
#[test]
fn image_data_too_large_to_hold_is_refused_before_its_labels_are_read() {
    use std::os::unix::fs::FileExt;
    let dir = tempdir("data-too-large");
    let records = 400_000u64;
    let record = 3073u64;
    let file = std::fs::File::create(dir.join("data_batch_1.bin")).unwrap();
    // Sparse: 1.2 GB of labels 0 and black pixels that take no disk.
    file.set_len(records * record).unwrap();
    file.write_at(&[200], 7 * record).unwrap();
    let recipe = dir.join("big.toml");
    std::fs::write(
        &recipe,
        format!(
            "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data_batch_1.bin\"\n[run]\nmax_steps = 1\neval = \"never\"\n[log]\ndir = \"{}\"\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let run = |sets: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        for s in sets {
            cmd.args(["--set", s]);
        }
        limit_address_space(&mut cmd, 600 << 20);
        cmd.output().unwrap()
    };
    let out = run(&[]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.train: the data takes 1.1 GiB in memory (400000 images")
            && stderr.contains("more than the address space left under `ulimit -v`")
            && stderr.contains("set data.limit to at most")
            && !stderr.contains("label"),
        "{stderr}"
    );
    let out = run(&["data.limit=1000"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("label 200"), "{stderr}");
    assert!(!dir.join("runs").exists(), "a run directory was created");
    // A validation file is held too: one that cannot be is refused at its key.
    let clean = dir.join("clean.bin");
    // Sparse, but for a pixel (a file of zeros only is refused as unwritten).
    let mut file = std::fs::File::create(&clean).unwrap();
    std::io::Write::write_all(&mut file, &[0, 9]).unwrap();
    file.set_len(records * record).unwrap();
    let out = run(&[
        "data.limit=1000",
        &format!("data.train={:?}", clean.display().to_string()),
        &format!(
            "data.validation_file={:?}",
            dir.join("data_batch_1.bin").display().to_string()
        ),
    ]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.validation_file: the data takes 1.1 GiB in memory")
            && !stderr.contains("label 200"),
        "{stderr}"
    );
    // data.limit bounds what is held: the file is read record by record (read whole,
    // the process aborted allocating it).
    let out = run(&[
        "data.limit=64",
        &format!("data.train={:?}", clean.display().to_string()),
    ]);
    expect_exit(&out, 0);
    // Evaluation holds the weights and the test set, not the training data: a run on all
    // of it (made without the limit) is scored under the limit (it was refused, with a
    // --set eval takes none of as the help).
    let test = root().join("datasets/fashion_mnist/test_batch.bin");
    let out = runner_cmd()
        .arg(&recipe)
        .arg("-q")
        .args([
            "--set",
            &format!("data.train={:?}", clean.display().to_string()),
        ])
        .args([
            "--set",
            &format!("data.test={:?}", test.display().to_string()),
        ])
        .args(["--set", "log.dir=\"big-runs\""])
        .current_dir(&dir)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let mut eval = runner_cmd();
    eval.arg("eval").arg(only_run(&dir.join("big-runs/big")));
    limit_address_space(&mut eval, 600 << 20);
    expect_exit(&eval.output().unwrap(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Transformer's attention scores (batch × heads × L² per layer) count in the memory
/// check: rows of 8,192 tokens need 32 GiB a score matrix, and such a run passed the check
/// and aborted at its first allocation (exit 134, a backtrace, its summary left
/// `running`). Now it is refused before anything is written; at 65,536 tokens even
/// `runner validate`, which knows no machine, refuses it.
#[test]
fn a_transformer_whose_attention_cannot_fit_is_refused_before_it_starts() {
    let dir = tempdir("attention");
    let sets = |len: usize| {
        [
            "padding.strategy=\"max_length\"".to_string(),
            format!("padding.max_length={len}"),
            "run.max_steps=1".into(),
            "run.eval=\"never\"".into(),
            format!("log.dir=\"{}\"", dir.join("runs").display()),
        ]
    };
    let mut cmd = runner_cmd();
    cmd.arg("recipes/text/rotten_tomatoes_transformer.toml")
        .arg("-q");
    for s in sets(8192) {
        cmd.args(["--set", &s]);
    }
    limit_address_space(&mut cmd, 16 << 30);
    let out = cmd.output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the run needs at least 129.5 GiB")
            && stderr.contains("more than the address space left under `ulimit -v`"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run directory was created");
    let mut cmd = runner_cmd();
    cmd.args(["validate", "recipes/text/rotten_tomatoes_transformer.toml"]);
    for s in sets(65536) {
        cmd.args(["--set", &s]);
    }
    let out = cmd.output().unwrap();
    expect_exit(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("more than the cap of any machine"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under `ulimit -v` the threads' stacks count in the pre-flight check (a run it let
/// through aborted at its first allocation, exit 134, its summary left `running`), and
/// the process keeps one malloc arena: a 300 MB limit aborted a run that a 100 MB one ran
/// (glibc reserved 64 MiB of address space for each thread's arena).
#[test]
fn a_run_under_ulimit_v_is_refused_or_runs_never_aborts() {
    let dir = tempdir("ulimit-v-stacks");
    let recipe = tiny_recipe(&dir, "as", "");
    let mut tight = runner_cmd();
    tight.arg(&recipe).arg("-q");
    limit_address_space(&mut tight, 30 << 20);
    let out = tight.output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the threads' stacks") && stderr.contains("under `ulimit -v`"),
        "{stderr}"
    );
    for limit in [100u64 << 20, 300 << 20] {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        limit_address_space(&mut cmd, limit);
        let out = cmd.output().unwrap();
        expect_exit(&out, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `cmd` under `ulimit -v` of `bytes`.
fn limit_address_space(cmd: &mut Command, bytes: u64) {
    limited(cmd, libc::RLIMIT_AS, bytes);
}

/// Runs `cmd` with the limit `resource` (`libc::RLIMIT_*`) set to `value`, as `ulimit`.
fn limited(cmd: &mut Command, resource: libc::__rlimit_resource_t, value: u64) {
    // SAFETY: `setrlimit` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            libc::setrlimit(resource, &limit);
            Ok(())
        });
    }
}

/// `metrics.jsonl` and `metrics.csv` removed while the run writes them (a temp-folder
/// cleaner, an `rm` of the wrong run) are written again from the copies the run holds
/// open, and said: the lines went to files no name led to, and the run said it completed.
#[test]
fn metrics_removed_mid_run_are_written_again() {
    let dir = tempdir("metrics-removed");
    let cmd = long_synthetic(&dir, "gone", "", &["run.epochs=4", "log.csv=true"]);
    let (child, run) = started(cmd, &dir.join("runs"));
    std::fs::remove_file(run.join("metrics.jsonl")).unwrap();
    let _ = std::fs::remove_file(run.join("metrics.csv"));
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics.jsonl was removed while the run wrote it: written again"),
        "{stderr}"
    );
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Completed);
    let lines = whole_lines(&run);
    assert_eq!(
        lines.len() as u64,
        s.steps,
        "every step's line, the first ones too"
    );
    assert_eq!(lines[0].step, 1);
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count() as u64, s.steps + 1, "{csv}");
    let report = runner_cmd().arg("report").arg(&run).output().unwrap();
    expect_exit(&report, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A class-names file of one name is blamed on the data it names, not on
/// `model.num_classes`, a key the recipe never set.
#[test]
fn one_class_named_beside_the_data_is_blamed_on_the_data() {
    let dir = tempdir("one-class");
    // Label 0, grey pixels (a file of zeros only is refused as unwritten).
    let record: Vec<u8> = std::iter::once(0).chain([7u8; 3072]).collect();
    std::fs::write(dir.join("data_batch.bin"), record.repeat(4)).unwrap();
    std::fs::write(dir.join("batches.meta.txt"), "only\n").unwrap();
    let recipe = dir.join("r.toml");
    std::fs::write(
        &recipe,
        "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data_batch.bin\"\n[run]\neval = \"never\"\n",
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "r.toml:5:9: data.train: its class names (batches.meta.txt beside it) name 1 class"
        ) && !stderr.contains("model.num_classes"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner eval` of a run killed before its first checkpoint says it cannot be resumed
/// and how to run it again (it said "resume it", and the resume said there was nothing to
/// resume from); its commands are this program as it was started.
#[test]
fn eval_of_a_run_killed_before_any_checkpoint_says_to_run_it_again() {
    let dir = tempdir("eval-killed-early");
    let recipe = long_recipe(&dir, "early", "[checkpoint]\nevery = \"never\"\n");
    let mut cmd = runner_cmd();
    cmd.arg(&recipe).arg("-q");
    let (child, metrics) = spawn_until(cmd, &dir.join("runs"), has_a_line);
    send("-KILL", &child);
    let _ = child.wait_with_output().unwrap();
    let run = metrics.parent().unwrap().to_path_buf();
    let out = runner_cmd().arg("eval").arg(&run).output().unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    let again = format!(
        "run its recipe again: {} {}",
        env!("CARGO_BIN_EXE_runner"),
        run.join("recipe.toml").display()
    );
    assert!(
        err.contains("the run stopped before its first checkpoint, so it saved no weights and cannot be resumed")
            && err.contains(&again),
        "{err}"
    );
    // What it says to run is a recipe that runs.
    let check = runner_cmd()
        .arg("validate")
        .arg(run.join("recipe.toml"))
        .output()
        .unwrap();
    expect_exit(&check, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run of a `--repeat` call interrupted: what was not started is said with the commands
/// that run it, the rest of this round and then the rounds left (`--repeat` less the ones
/// begun), and no comparison is printed.
#[test]
fn an_interrupted_repeat_says_the_rounds_left() {
    let dir = tempdir("repeat-interrupted");
    let a = long_recipe(&dir, "a", "");
    let b = tiny_recipe(&dir, "b", "");
    let mut cmd = runner_cmd();
    cmd.args([&a, &b]).args(["--repeat", "3", "-q"]);
    let (child, _) = spawn_until(cmd, &dir.join("runs"), has_a_line);
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let runner = env!("CARGO_BIN_EXE_runner");
    let (a, b) = (a.display(), b.display());
    assert!(
        stderr.contains(&format!(
            "note: 5 run(s) after it not started; run them with: {runner} {b} -q; {runner} {a} {b} -q --repeat 2"
        )),
        "{stderr}"
    );
    // What was completed before the signal: none here, said so.
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("3 rounds of 2 recipe(s): 0 run(s) completed\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!dir.join("runs/b").exists());
}

/// A grid's round after the first takes its cells as not done as it starts, so that
/// the `--resume` an interruption in it says runs the rest of that round: the cells after
/// the interrupted one were still marked done by the first round, and were skipped.
#[test]
fn a_grid_interrupted_in_a_later_round_goes_on_with_that_round() {
    let dir = tempdir("repeat-grid-round");
    let grid = long_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.05, 0.1]\n");
    let mut cmd = runner_cmd();
    cmd.arg(&grid).args(["--repeat", "2", "-q"]);
    // Round 2's first cell under way: a third run with a line.
    let third = |_: &Path| {
        crate::common::walk_files(&dir.join("runs/g"))
            .iter()
            .filter(|p| has_a_line(p))
            .count()
            >= 3
    };
    let (child, _) = spawn_until(cmd, &dir.join("runs"), third);
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("continue the grid with: "), "{stderr}");
    // The round's table of what was completed: the first round's two cells.
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("2 rounds of 1 recipe(s): 2 run(s) completed:"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = resume_grid_quietly(&grid);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("already done were skipped"), "{stderr}");
    for cell in ["optim.lr=0.05", "optim.lr=0.1"] {
        let runs = std::fs::read_dir(dir.join("runs/g").join(cell))
            .unwrap()
            .count();
        assert_eq!(runs, 2, "{cell}: {stderr}");
    }
}

/// The batches the loader holds ahead are counted up to an epoch's: the workers are given
/// an epoch's batches at its start. A prefetch of 100 over 4 batches an epoch was counted
/// as 404 batches (1.6 GiB) and refused a run that holds a few MiB; past an epoch's
/// batches, a large batch still counts whole.
#[test]
fn batches_ahead_are_counted_up_to_an_epoch_s() {
    let dir = tempdir("prefetch-epoch");
    let recipe = tiny_recipe(&dir, "pf", "");
    let run = |sets: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        let data = "data.synthetic={ samples = 64, test_samples = 4, classes = 4, image_size = 128, channels = 16 }";
        let loader = [
            "loader.batch_size=16",
            "loader.workers=4",
            "loader.prefetch=100",
        ];
        for s in [data, "run.max_steps=2"].iter().chain(&loader).chain(sets) {
            cmd.args(["--set", s]);
        }
        limit_address_space(&mut cmd, 1_000_000 << 10);
        cmd.output().unwrap()
    };
    let out = run(&[]);
    expect_exit(&out, 0);
    // An epoch of 64 batches: all 64 (of the 404 the workers could hold) are counted.
    let out = run(&["data.synthetic.samples=1024"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the run needs at least")
            && stderr.contains("batches loaded ahead 0.2 GiB"),
        "{stderr}"
    );
}

/// The summary's step figures are read back from `metrics.jsonl` at the run's end (the
/// run keeps no step's times meanwhile): where that file cannot be read then (here a
/// folder took its name; the run goes on writing to the file it opened), the summary
/// still counts the run's steps and says its times are missing, with a warning; the run
/// completes.
#[test]
fn a_summary_whose_lines_cannot_be_read_back_keeps_the_counts() {
    let dir = tempdir("lines-gone");
    let cmd = long_synthetic(&dir, "linesgone", "", &[]);
    let (child, run) = started(cmd, &dir.join("runs"));
    let metrics = run.join("metrics.jsonl");
    std::fs::rename(&metrics, run.join("moved.jsonl")).unwrap();
    std::fs::create_dir(&metrics).unwrap();
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("warning: cannot read back {}", metrics.display()))
            && stderr.contains("without its step times"),
        "{stderr}"
    );
    let s = summary(&run);
    let lines = std::fs::read_to_string(run.join("moved.jsonl"))
        .unwrap()
        .lines()
        .count() as u64;
    assert_eq!(s.status, RunStatus::Completed, "{s:?}");
    assert_eq!((s.steps, s.iter_ms.count), (lines, 0), "{s:?}");
    assert!(s.samples > 0 && s.final_loss.is_some(), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `metrics.csv` row that is not UTF-8 text (a disk error, an edit) is not continued
/// after, as a CSV reader would refuse the file: the resume writes it again whole from
/// `metrics.jsonl`, as it does where rows are missing.
#[test]
fn a_resume_writes_metrics_csv_again_where_a_row_is_not_text() {
    let (out, dir) = interrupt_n("csv-not-text", "", &["run.epochs=3"], "-TERM", 1);
    expect_exit(&out, 143);
    let run = only_run(&dir.join("runs/csv-not-text"));
    let path = run.join("metrics.csv");
    let mut bytes = std::fs::read(&path).unwrap();
    let row = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    assert!(row < bytes.len(), "a row after the header");
    bytes[row] = 0xff;
    std::fs::write(&path, &bytes).unwrap();
    expect_exit(&resume_quietly(&run), 0);
    let csv = String::from_utf8(std::fs::read(&path).unwrap())
        .map_err(|e| e.utf8_error())
        .expect("UTF-8 text again");
    let steps: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(steps, (1..=summary(&run).steps).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}
