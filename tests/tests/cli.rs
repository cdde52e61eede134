//! The binary as a user meets it: exit codes, messages, what is written and what is not.

use std::path::Path;

use runner::metrics::RunStatus;

use crate::common::{
    expect_exit, json, only_run, refuses, resume_grid_quietly, root, runner_cmd, statuses, summary,
    tempdir, tiny_recipe, with_sets,
};

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

    // A named pipe that nothing writes to is said at once (it waited for ever); a pipe
    // with a writer, as a shell's `<(...)` makes, is read.
    let fifo = logs.join("fifo.toml");
    let made = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(made.as_ptr(), 0o600) }, 0);
    let out = runner_cmd().arg("validate").arg(&fifo).output().unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("fifo.toml: cannot read recipe: a named pipe that nothing writes to"));
    let quickstart = root().join("recipes/quickstart.toml");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "\"$0\" validate <(sed 's#\\.\\./datasets#{}/datasets#' {})",
            root().display(),
            quickstart.display()
        ))
        .arg(env!("CARGO_BIN_EXE_runner"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
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

/// Every bad data file is said at once, each with its own count of bad records: the
/// second training file's and a truncated test file's findings waited for the first
/// file's to be fixed, and the count covered only the first file.
#[test]
fn every_bad_data_file_is_said_at_once_with_its_own_count() {
    let dir = tempdir("bad-files");
    let sample = std::fs::read(root().join("datasets/cifar10_sample/test_batch.bin")).unwrap();
    let record = 3073;
    std::fs::create_dir_all(dir.join("train")).unwrap();
    for (file, bad) in [
        ("data_batch_1.bin", &[3][..]),
        ("data_batch_2.bin", &[1, 4][..]),
    ] {
        let mut bytes = sample.clone();
        for &r in bad {
            bytes[r * record] = 200;
        }
        std::fs::write(dir.join("train").join(file), bytes).unwrap();
    }
    std::fs::write(dir.join("test.bin"), &sample[..record * 2 + 10]).unwrap();
    let recipe = dir.join("r.toml");
    std::fs::write(
        &recipe,
        "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"train\"\ntest = \"test.bin\"\n",
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("data_batch_1.bin record 3 (byte offset 9219) has label 200, but there are 10 classes\n")
            && err.contains("data_batch_2.bin record 1 (byte offset 3073) has label 200, but there are 10 classes (and 1 more bad record: 4)")
            && err.contains("test.bin is truncated")
            && err.contains("3 errors in"),
        "{err}"
    );
    // JSON Lines too: a test file that is not there leaves the training file's bad lines
    // to be said with it.
    std::fs::write(
        dir.join("train.jsonl"),
        "{\"text\": \"a\", \"label\": 0}\n{\"text\": 1, \"label\": 0}\n{\"text\": \"b\", \"label\": 1}\n",
    )
    .unwrap();
    std::fs::write(
        &recipe,
        "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"train.jsonl\"\ntest = \"missing.jsonl\"\n",
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("train.jsonl line 2: field \"text\" is 1, not a string")
            && err.contains("data.test: ")
            && err.contains("2 errors in"),
        "{err}"
    );
}

/// `--set '~KEY'` removes a key the recipe sets: switching the quickstart's CNN to an MLP
/// was refused for the CNN's `width`, and no flag could take it out.
#[test]
fn set_tilde_removes_a_key_the_recipe_sets() {
    let quickstart = root().join("recipes/quickstart.toml");
    let run = |cmd: &str, sets: &[&str]| with_sets(cmd, &quickstart, sets);
    let out = run("validate", &["model.arch=mlp"]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model.width: only applies") && err.contains("--set '~model.width'"),
        "{err}"
    );
    let out = run("validate", &["model.arch=mlp", "~model.width"]);
    expect_exit(&out, 0);
    let out = run("show", &["model.arch=mlp", "~model.width"]);
    expect_exit(&out, 0);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("arch = \"mlp\"") && !shown.contains("width ="),
        "{shown}"
    );
    // Its header: the file and its id; no cell, for a recipe that is not a grid.
    let header = shown.lines().next().unwrap_or_default();
    assert!(
        header.starts_with(&format!("# {} (id ", quickstart.display())) && !header.contains("cell"),
        "{header}"
    );
    // A whole table goes back to its defaults; a key the recipe does not set is a mistake.
    let out = run("show", &["~optim"]);
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\nlr = 0.01\n"));
    let out = run("validate", &["~model.widht"]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--set: `model.widht` is not set by the recipe, so there is nothing to remove"
        ) && err.contains("help: did you mean `model.width`?"),
        "{err}"
    );
    // A grid axis is removed as one, and said so where its key alone is given.
    let grid = root().join("recipes/article_grid.toml");
    let refused = |set: &str| {
        let out = runner_cmd()
            .args(["validate", "--set", set])
            .arg(&grid)
            .output()
            .unwrap();
        expect_exit(&out, 2);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused("~cleanup.every");
    assert!(
        err.contains("it is a grid axis: remove the axis with --set '~sweep.\"cleanup.every\"'"),
        "{err}"
    );
    // `extends` is followed as the file is read: not removable, and not "not set".
    let err = refused("~extends");
    assert!(
        err.contains("`extends` cannot be removed with --set") && !err.contains("not set"),
        "{err}"
    );
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
    // `validate`'s "ok" lines are its result too: a check whose answer was lost is not
    // passed.
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full");
    if full().is_ok() {
        for args in [&["schema"][..], &["validate", "recipes/quickstart.toml"]] {
            let out = runner_cmd()
                .args(args)
                .stdout(full().unwrap())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert_eq!(
                stderr
                    .matches("error: cannot write to standard output: No space left on device")
                    .count(),
                1,
                "{args:?}: {stderr}"
            );
        }
        // A run goes on to its end, its results in its files, and then fails too (it
        // exited 0 after saying the error).
        let one = tiny_recipe(&dir, "one", "");
        let out = runner_cmd()
            .arg(&one)
            .arg("-q")
            .stdout(full().unwrap())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("error: cannot write to standard output"),
            "{stderr}"
        );
        let run = only_run(&dir.join("runs/one"));
        let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
        assert!(summary.contains("\"status\": \"completed\""), "{summary}");
        let eval = runner_cmd()
            .arg("eval")
            .arg(&run)
            .stdout(full().unwrap())
            .output()
            .unwrap();
        assert_eq!(eval.status.code(), Some(1));
    }
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
    // `show --cell` of a recipe that is no grid is refused, as `run --cell` is (it printed
    // the recipe as if it were cell 0); past a grid's last cell, the cells are counted.
    refuses(
        &["show", "--cell", "0", "recipes/quickstart.toml"],
        "has no [sweep] table, so no cells",
    );
    refuses(
        &["show", "--cell", "8", "recipes/article_grid.toml"],
        "has 8 cells, 0 to 7",
    );
    // --max-cells 0 says what it means.
    let out = runner_cmd()
        .args(["validate", "recipes/quickstart.toml", "--max-cells", "0"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-cells 0 allows no cell"));
    // A cap past what can be held is refused; a grid past 2^64 cells says so (it said
    // 18446744073709551615 cells, and that cap let it take all the memory there was).
    // (Ten axes of 100 values: 10^20 cells.)
    let out = runner_cmd()
        .args(["validate", "recipes/quickstart.toml", "--max-cells"])
        .arg(usize::MAX.to_string())
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains(": at most 10000 (every cell"));
    let values = format!("{:?}", (1..=100).collect::<Vec<u32>>());
    let keys = [
        "seed",
        "loader.batch_size",
        "run.max_steps",
        "run.warmup_steps",
        "log.every",
        "loader.prefetch",
        "optim.accumulation_steps",
        "run.epochs",
        "checkpoint.keep",
        "model.width",
    ];
    let sweep: String = keys
        .iter()
        .map(|k| format!("\"{k}\" = {values}\n"))
        .collect();
    let huge = tiny_recipe(&dir, "huge", &format!("[sweep]\n{sweep}"));
    let out = runner_cmd().arg("validate").arg(&huge).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the grid has more than 2^64 cells (100 × 100 × 100"),
        "{stderr}"
    );
    // A manifest cut by a crash is written again when the grid runs.
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    expect_exit(&runner_cmd().arg(&grid).arg("-q").output().unwrap(), 0);
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    std::fs::write(sweep.join("manifest.json"), "{\"grid_id\": ").unwrap();
    expect_exit(&resume_grid_quietly(&grid), 0);
    let m = json(&sweep.join("manifest.json"));
    assert_eq!(m["cells"].as_array().map(Vec::len), Some(2));
    // Something in the way of the sweep directory's own files is named (it said only
    // "Is a directory").
    std::fs::remove_file(sweep.join("manifest.json")).unwrap();
    std::fs::create_dir(sweep.join("manifest.json")).unwrap();
    let out = resume_grid_quietly(&grid);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: Is a directory",
            sweep.join("manifest.json").display()
        )),
        "{stderr}"
    );
    std::fs::remove_dir(sweep.join("manifest.json")).unwrap();
    // A log.dir a run here would refuse is said by validate too, as a warning: the recipe
    // may be meant for another machine.
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let out = runner_cmd()
        .args(["validate", "recipes/quickstart.toml", "--set"])
        .arg(format!("log.dir=\"{}\"", dangling.display()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: recipes/quickstart.toml: log.dir: ")
            && err.contains("is a symbolic link to a folder that does not exist"),
        "{err}"
    );
    // A convolution kernel named, or the weight gradients' split set, beside autotune,
    // which would use neither: a warning at the key's line and column, and the recipe is
    // still valid.
    let kernel = dir.join("kernel.toml");
    for (line, key, column) in [
        ("conv_kernel = \"specialized_tma\"", "conv_kernel", 15),
        ("conv_split = \"off\"", "conv_split", 14),
    ] {
        std::fs::write(
            &kernel,
            format!("[backend]\nconv = \"autotune\"\n{line}\n\n[model]\narch = \"small_cnn\"\n\n[data]\nformat = \"synthetic\"\n"),
        )
        .unwrap();
        let out = runner_cmd()
            .args(["validate"])
            .arg(&kernel)
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "warning: {}:3:{column}: backend.{key}: is used only with backend.conv = \"implicit_gemm\"",
                kernel.display()
            )),
            "{err}"
        );
    }
    // A validation fraction that leaves nothing to train on is one finding: the batch check
    // no longer speaks of 1 training sample beside its 0.
    let out = runner_cmd()
        .args([
            "validate",
            "recipes/quickstart.toml",
            "--set",
            "data.validation=0.99999",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("leaves 2000 for validation and 0 to train on")
            && !err.contains("training samples: each batch"),
        "{err}"
    );
}

/// A recipe whose path is not UTF-8 (a Latin-1 folder name) runs: `env.json` records the
/// command line with the bytes replaced (it panicked, leaving a run with no summary);
/// a Slurm script, which names the recipe as text, is refused before anything is written.
#[test]
fn a_recipe_path_that_is_not_utf8_runs_and_slurm_says_why_not() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempdir("latin1");
    let odd = dir.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir_all(&odd).unwrap();
    // Runs under the working directory (`tiny_recipe` names its log folder as text).
    let at = |name: &str, extra: &str| {
        let r = tiny_recipe(&odd, name, extra);
        let text = std::fs::read_to_string(&r).unwrap();
        let log = text
            .lines()
            .find(|l| l.starts_with("dir = "))
            .unwrap()
            .to_string();
        std::fs::write(&r, text.replace(&log, "dir = \"runs\"")).unwrap();
        r
    };
    let recipe = at("l", "");
    let out = runner_cmd()
        .current_dir(&dir)
        .arg(&recipe)
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/l"));
    assert_eq!(summary(&run).status, RunStatus::Completed);
    let env = json(&run.join("env.json"));
    let command = env["command"].as_array().unwrap();
    assert!(command
        .iter()
        .any(|a| a.as_str().unwrap().contains("caf\u{fffd}")));
    let grid = at("g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let out = runner_cmd()
        .current_dir(&dir)
        .args(["sweep", "--slurm"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not valid UTF-8"), "{err}");
    assert!(!dir.join("runs/g").exists(), "written before the error");
}

/// `runner schema -o FILE` writes a new file, or replaces an earlier schema; a file there
/// that is not a JSON Schema (a recipe, a dataset: a slip of the name) is kept, exit 2.
/// Before, `schema -o recipes/quickstart.toml` replaced the recipe with exit 0.
#[test]
fn schema_output_keeps_a_file_that_is_not_a_schema() {
    let dir = tempdir("schema-o");
    let schema = |to: &std::path::Path| {
        runner_cmd()
            .arg("schema")
            .arg("-o")
            .arg(to)
            .output()
            .unwrap()
    };
    let fresh = dir.join("recipe.schema.json");
    expect_exit(&schema(&fresh), 0);
    let written = std::fs::read(&fresh).unwrap();
    assert_eq!(
        written,
        std::fs::read(root().join("recipe.schema.json")).unwrap()
    );
    // Again over it: an earlier schema is replaced.
    std::fs::write(
        &fresh,
        b"{\n  \"$schema\": \"old\",\n  \"title\": \"runner recipe\"\n}\n",
    )
    .unwrap();
    expect_exit(&schema(&fresh), 0);
    assert_eq!(std::fs::read(&fresh).unwrap(), written);
    // However it was reformatted (minified here).
    let minified: serde_json::Value = serde_json::from_slice(&written).unwrap();
    std::fs::write(&fresh, serde_json::to_vec(&minified).unwrap()).unwrap();
    expect_exit(&schema(&fresh), 0);
    assert_eq!(std::fs::read(&fresh).unwrap(), written);
    // A device is written as it is.
    expect_exit(&schema(std::path::Path::new("/dev/null")), 0);
    // Another tool's file naming its schema is kept (a renovate.json was replaced).
    let other = dir.join("renovate.json");
    let theirs = b"{\n  \"$schema\": \"https://docs.renovatebot.com/renovate-schema.json\"\n}\n";
    std::fs::write(&other, theirs).unwrap();
    let out = schema(&other);
    expect_exit(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not runner's recipe schema"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&other).unwrap(), theirs);
    // A pipe is refused, not opened (the check's read blocked).
    let fifo = dir.join("pipe");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let out = schema(&fifo);
        expect_exit(&out, 2);
        assert!(String::from_utf8_lossy(&out.stderr).contains("is not a regular file"));
    }
    let recipe = dir.join("r.toml");
    std::fs::copy(root().join("recipes/quickstart.toml"), &recipe).unwrap();
    let before = std::fs::read(&recipe).unwrap();
    let out = schema(&recipe);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: {}: exists and is not runner's recipe schema: not overwritten",
            recipe.display()
        )),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&recipe).unwrap(), before);
    let out = schema(&dir);
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
}

/// A path key that starts with `~` is under `$HOME`, as in git's settings: `log.dir =
/// "~/runs"` made a folder named `~` in the working directory (so `ls ~/runs` showed
/// nothing, and the obvious `rm -rf ~` to clean up was the home). `~user` is refused.
#[test]
fn a_leading_tilde_in_a_path_key_is_the_home() {
    let dir = tempdir("cli-tilde");
    let home = dir.join("home");
    std::fs::create_dir_all(home.join("data")).unwrap();
    std::fs::copy(
        root().join("datasets/rotten_tomatoes/train.jsonl"),
        home.join("data/train.jsonl"),
    )
    .unwrap();
    let recipe = dir.join("t.toml");
    std::fs::write(
        &recipe,
        "name = \"t\"\n[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"~/data/train.jsonl\"\nlimit = 64\n[loader]\nbatch_size = 32\n[run]\nmax_steps = 2\nwarmup_steps = 0\neval = \"never\"\n[log]\ndir = \"~/runs\"\n[backend]\ncache_dir = \"~/kc\"\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        runner_cmd()
            .current_dir(&dir)
            .arg(&recipe)
            .arg("-q")
            .args(extra)
            .env("HOME", &home)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    expect_exit(&out, 0);
    let run_dir = only_run(&home.join("runs/t"));
    assert!(!dir.join("~").exists(), "a folder named ~ was made");
    let env = json(&run_dir.join("env.json"));
    assert_eq!(env["kernels"]["dir"], home.join("kc").display().to_string());
    let resolved = std::fs::read_to_string(run_dir.join("recipe.toml")).unwrap();
    assert!(
        resolved.contains(&format!(
            "train = \"{}\"",
            home.join("data/train.jsonl").display()
        )),
        "{resolved}"
    );

    // Another user's home is not guessed at; nothing is written.
    let out = run(&["--set", "log.dir=\"~nobody/runs\""]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("log.dir") && err.contains("only `~` and `~/...`"),
        "{err}"
    );
    assert!(!dir.join("~nobody").exists());
    let out = run(&["--set", "data.train=\"~nobody/t.jsonl\""]);
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("data.train"));
}

/// A cadence set past the run's last step makes its knob do nothing: said for cleanup,
/// checkpoints and the learning-rate warm-up (as it was for validation), not for a cadence
/// the run reaches.
#[test]
fn knobs_whose_cadence_the_run_never_reaches_are_warned() {
    let quick = root().join("recipes/quickstart.toml");
    // `runner validate` of the quickstart with `sets`: it passes; its stderr.
    let validate = |sets: &[&str]| {
        let out = with_sets("validate", &quick, sets);
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = validate(&[
        "run.max_steps=40",
        "cleanup.every=100000",
        "cleanup.actions=[\"trim_host\"]",
        "checkpoint.every=100000",
        "optim.lr_warmup_steps=100000",
    ]);
    for want in [
        "cleanup.every: every 100000 steps, but the run has 40: no cleanup ever runs",
        "checkpoint.every: every 100000 steps, but the run has 40: no checkpoint is written on the way",
        "optim.lr_warmup_steps: 100000 warm-up steps, but the run has 40: the learning rate never reaches optim.lr",
    ] {
        assert!(err.contains(want), "{want}\n{err}");
    }
    let err = validate(&[
        "run.max_steps=40",
        "cleanup.every=40",
        "cleanup.actions=[\"trim_host\"]",
        "checkpoint.every=40",
        "optim.lr_warmup_steps=40",
    ]);
    assert!(!err.contains("warning"), "{err}");
    // A step schedule whose first decay is past the end, and early stopping with fewer
    // validations than its patience: said, as the cadences above (both were silent).
    let step_and_stop = |step_size: &str, patience: &str| {
        validate(&[
            "run.max_steps=40",
            "optim.schedule=\"step\"",
            "optim.lr_warmup_steps=10",
            &format!("optim.step_size={step_size}"),
            "data.validation=0.1",
            "run.validate=10",
            &format!("run.early_stop={{patience={patience}}}"),
        ])
    };
    let err = step_and_stop("30", "4");
    for want in [
        "optim.step_size: the first decay would come after 40 optimizer steps, but the run has 40",
        "run.early_stop: patience is 4 validations, but run.validate = 10 gives 4: the run never stops early",
    ] {
        assert!(err.contains(want), "{want}\n{err}");
    }
    // 4 validations: the best, 2 without improvement, a stop before the last: possible.
    let err = step_and_stop("29", "2");
    assert!(!err.contains("warning"), "{err}");
    // With patience + 1, the stop would fall on the last validation: never early.
    let err = step_and_stop("29", "3");
    assert!(
        err.contains(
            "patience is 3 validations, but run.validate = 10 gives 4: the run never stops early"
        ),
        "{err}"
    );
    // Said at the patience where it is set (a --set of another run.early_stop key was
    // pointed at).
    let err = validate(&[
        "run.max_steps=40",
        "data.validation=0.1",
        "run.validate=10",
        "run.early_stop.patience=4",
        "run.early_stop.min_delta=0.5",
    ]);
    assert!(
        err.contains("run.early_stop.patience: patience is 4 validations")
            && err.contains("| run.early_stop.patience=4\n"),
        "{err}"
    );
    // Every epoch, the default, counts too: the quickstart's 8 epochs give 8 (it was
    // never said), and a run cut short by run.max_steps validates where it stops.
    let err = validate(&["data.validation=0.1", "run.early_stop.patience=7"]);
    assert!(
        err.contains("patience is 7 validations, but run.validate = \"epoch\" gives 8: the run never stops early"),
        "{err}"
    );
    let err = validate(&["data.validation=0.1", "run.early_stop.patience=6"]);
    assert!(!err.contains("never stops early"), "{err}");
    let err = validate(&[
        "data.validation=0.1",
        "run.early_stop.patience=3",
        "run.max_steps=100",
    ]);
    assert!(err.contains("run.validate = \"epoch\" gives 2"), "{err}");
    // An accuracy minimised keeps the worst weights as the best.
    let err = validate(&[
        "data.validation=0.1",
        "run.early_stop.metric=\"val_accuracy\"",
        "run.early_stop.mode=\"min\"",
    ]);
    assert!(
        err.contains("run.early_stop.mode: \"min\" with metric = \"val_accuracy\": the best validation is the one of the lowest accuracy"),
        "{err}"
    );
    let err = validate(&["data.validation=0.1", "run.early_stop.mode=\"min\""]);
    assert!(!err.contains("run.early_stop.mode"), "{err}");
}

/// The keys that choose CubeCL's kernels do nothing on the CPU backend, nor the
/// convolution and batch norm ones for a model without either: said, as
/// `loader.pin_memory` on the CPU is (a grid over `backend.autotune` on the CPU compared
/// one run with itself, in silence).
#[test]
fn kernel_keys_that_choose_nothing_are_said() {
    let said = |recipe: &str, sets: &[&str]| {
        let out = with_sets("validate", &root().join(recipe), sets);
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = said(
        "recipes/quickstart.toml",
        &["backend.autotune=\"full\"", "backend.fusion=true"],
    );
    assert!(
        err.contains("backend.autotune: does nothing here, nor do backend.fusion: the CPU backend, which this run uses, compiles no kernels"),
        "{err}"
    );
    assert!(!said("recipes/quickstart.toml", &[]).contains("does nothing"));
    // A key written with its default (as every run's recipe.toml writes it) sets nothing.
    let err = said(
        "recipes/quickstart.toml",
        &["backend.autotune=\"balanced\"", "backend.fusion=\"auto\""],
    );
    assert!(!err.contains("does nothing"), "{err}");
    let cuda_mlp = [
        "backend.kind=\"cuda\"",
        "model.arch=\"mlp\"",
        "~model.width",
        "backend.norm_sums=\"reduce\"",
    ];
    let err = said("recipes/quickstart.toml", &cuda_mlp);
    assert!(
        err.contains("backend.norm_sums: does nothing here: model.arch = \"mlp\" has no convolution or batch norm"),
        "{err}"
    );
    let err = said(
        "recipes/quickstart.toml",
        &["backend.kind=\"cuda\"", "backend.norm_sums=\"reduce\""],
    );
    assert!(!err.contains("does nothing"), "{err}");
}

/// A synthetic size out of range is said once, at its key (0 samples was also said as
/// "data.train: holds no training samples", of a recipe that has no data.train).
#[test]
fn a_synthetic_value_out_of_range_is_said_once() {
    let dir = tempdir("synthetic-range");
    let recipe = tiny_recipe(&dir, "s", "");
    for (set, key) in [
        ("data.synthetic.samples=0", "data.synthetic.samples"),
        ("data.synthetic.classes=1", "data.synthetic.classes"),
    ] {
        let out = with_sets("validate", &recipe, &[set]);
        expect_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{key}: ")) && err.matches("error:").count() == 1,
            "{err}"
        );
    }
    // A key set wrong beside it is still said.
    let out = with_sets(
        "validate",
        &recipe,
        &["data.synthetic.samples=0", "model.num_classes=1"],
    );
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.num_classes: 1 class: too few"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run with no timed step (all within warm-up, or one that failed first) writes its
/// speed figures as `null`, not as 0 ms/iter, which any other tool read as a real time.
#[test]
fn a_run_without_a_timed_step_writes_null_speeds() {
    let dir = tempdir("cli-untimed");
    let recipe = tiny_recipe(&dir, "u", "");
    let out = runner_cmd()
        .arg(&recipe)
        .args(["-q", "--set", "run.max_steps=1"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    // (One step is "1 step": it said "1 steps".)
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("u: 1 step, none timed"), "{stdout}");
    let run = only_run(&dir.join("runs/u"));
    let s = json(&run.join("summary.json"));
    assert_eq!(s["iter_ms"]["count"], 0, "{s}");
    for key in ["median", "mean", "p95", "min", "max", "std"] {
        assert!(s["iter_ms"][key].is_null(), "{key}: {s}");
    }
    for key in ["samples_per_s", "cleanup_pct", "data_wait_pct"] {
        assert!(s[key].is_null(), "{key}: {s}");
    }
    // And it reads back: report lists it untimed.
    let out = runner_cmd()
        .arg("report")
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 (0 timed)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The paths a run records are absolute: typed relative, they named nothing once read from
/// another directory (the working directory is not recorded).
#[test]
fn recorded_paths_are_absolute() {
    let dir = tempdir("cli-abs");
    tiny_recipe(&dir, "a", "");
    let out = runner_cmd()
        .current_dir(&dir)
        .args(["a.toml", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("runs/a"));
    let env = json(&run.join("env.json"));
    assert_eq!(env["recipe"], dir.join("a.toml").display().to_string());
    // The working directory, which the command line's relative paths are relative to.
    assert_eq!(env["cwd"], dir.display().to_string());
    assert_eq!(
        env["sources"][0]["path"],
        dir.join("a.toml").display().to_string()
    );
    let rel = run.strip_prefix(&dir).unwrap();
    let out = runner_cmd()
        .current_dir(&dir)
        .arg("eval")
        .arg(rel)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let e = json(&crate::common::eval_reports(&run)[0]);
    assert_eq!(e["run_dir"], run.display().to_string());
    assert!(e["weights"].as_str().unwrap().starts_with('/'), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A working directory removed under the shell: a run is refused before anything is
/// written (CubeCL, looking for its settings from there, panicked at the first step, after
/// the run directory was made), and commands that only read what they are given go on.
#[test]
fn a_removed_working_directory_is_said_before_a_run() {
    let dir = tempdir("cli-gone-cwd");
    let recipe = tiny_recipe(&dir, "gone", "");
    let gone = dir.join("gone-cwd");
    std::fs::create_dir_all(&gone).unwrap();
    let in_gone = |args: &[&str]| {
        // `cd` into it, remove it, then exec the runner there.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("cd \"$1\" && rmdir \"$1\" && shift && exec \"$@\"")
            .arg("sh")
            .arg(&gone)
            .arg(env!("CARGO_BIN_EXE_runner"))
            .args(args)
            .output()
            .unwrap();
        std::fs::create_dir_all(&gone).unwrap();
        out
    };
    let recipe_arg = recipe.to_str().unwrap();
    let out = in_gone(&[recipe_arg, "-q"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the working directory cannot be read")
            && stderr.contains("cd to a folder"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists(), "a run directory was made");
    let out = in_gone(&["validate", recipe_arg]);
    expect_exit(&out, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of CIFAR batches is read in natural order (`data_batch_2` before
/// `data_batch_10`: by bytes it came after, and `data.limit` took the wrong file's samples),
/// a name that is not UTF-8 included (it was left out in silence); a label past a single
/// class says "1 class"; a directory where a `.jsonl` goes is said to be one.
#[test]
fn a_folder_of_batches_is_read_in_natural_order() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempdir("cli-batches");
    let data = dir.join("batches");
    std::fs::create_dir_all(&data).unwrap();
    let sample = std::fs::read(root().join("datasets/cifar10_sample/test_batch.bin")).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"data_batch_3\xff.bin");
    for name in ["data_batch_1.bin", "data_batch_10.bin", "data_batch_2.bin"]
        .map(std::ffi::OsStr::new)
        .into_iter()
        .chain([odd])
    {
        std::fs::write(data.join(name), &sample).unwrap();
    }
    let recipe = dir.join("b.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"b\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"batches\"\ntest = \"{}\"\nlimit = 30\n[loader]\nbatch_size = 10\n[run]\nmax_steps = 1\nwarmup_steps = 0\n[log]\ndir = \"{}\"\n",
            root().join("datasets/cifar10_sample/test_batch.bin").display(),
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    let env = json(&only_run(&dir.join("runs/b")).join("env.json"));
    let names: Vec<String> = env["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["path"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "data_batch_1.bin",
            "data_batch_2.bin",
            "data_batch_3\u{fffd}.bin",
            "data_batch_10.bin",
            "test_batch.bin"
        ]
    );
    // One class named: said in the singular.
    std::fs::write(data.join("batches.meta.txt"), "airplane\n").unwrap();
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    std::fs::remove_file(data.join("batches.meta.txt")).unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("but there is 1 class"), "{stderr}");
    // A folder where a .jsonl goes.
    let out = runner_cmd()
        .arg(&recipe)
        .args([
            "-q",
            "--set",
            "data.format=\"jsonl\"",
            "--set",
            "model.arch=\"bag\"",
        ])
        .args(["--set", "data.test=\"batches\""])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("batches is a directory, not a .jsonl file"),
        "{stderr}"
    );
    // Data in a folder whose name is not UTF-8: refused before the run, which could not
    // name it in its recipe.toml (it was written with U+FFFD, and resume failed).
    let odd_dir = dir.join(std::ffi::OsStr::from_bytes(b"odd\xfe"));
    std::fs::create_dir_all(&odd_dir).unwrap();
    std::fs::write(odd_dir.join("data_batch_1.bin"), &sample).unwrap();
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        odd_dir.join("b.toml"),
        text.replace("train = \"batches\"", "train = \".\""),
    )
    .unwrap();
    let out = runner_cmd()
        .arg(odd_dir.join("b.toml"))
        .arg("-q")
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.train: ")
            && stderr.contains("is not valid UTF-8")
            && stderr.contains("rename the folder"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.join("runs/b")).unwrap().count(),
        1,
        "a run was made"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A log.dir whose run directory fits Linux's 4,095-byte path limit but leaves its files
/// no room is refused before anything is made (the directory was made, and the run failed
/// at its first file: exit 1, a run marked failed).
#[test]
fn a_log_dir_that_leaves_the_run_s_files_no_room_is_refused() {
    let dir = tempdir("cli-long-path");
    let recipe = tiny_recipe(&dir, "long", "");
    let mut long = dir.join("logs");
    while long.as_os_str().len() < 3_950 {
        long.push("d".repeat(200));
    }
    let out = runner_cmd()
        .arg(&recipe)
        .arg("-q")
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", long.display()))
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("past the 4,095 bytes a path may have")
            && stderr.contains("at a shorter path"),
        "{stderr}"
    );
    assert!(!dir.join("logs").exists(), "folders were made");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner ls` marks a recipe that does not validate as `runner validate` would (it marked
/// only a file that was not TOML), and lists a link to nothing instead of leaving it out.
#[test]
fn ls_marks_what_does_not_validate() {
    let dir = tempdir("cli-ls");
    let recipes = dir.join("recipes");
    std::fs::create_dir_all(&recipes).unwrap();
    let good = tiny_recipe(&recipes, "good", "");
    let text = std::fs::read_to_string(&good).unwrap();
    // An ESC in it is shown escaped, not sent to the terminal.
    std::fs::write(&good, format!("description = \"fine\\u001b[2J\"\n{text}")).unwrap();
    std::fs::write(
        recipes.join("bad.toml"),
        "description = \"no model\"\n[data]\nformat = \"synthetic\"\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere.toml"), recipes.join("gone.toml")).unwrap();
    // A name of wide chars: the descriptions after it start at the others' column.
    let wide = tiny_recipe(&recipes, "ベースライン", "");
    let text = std::fs::read_to_string(&wide).unwrap();
    std::fs::write(&wide, format!("description = \"wide\"\n{text}")).unwrap();
    // A description of many lines, or a long one: its first line, cut to a line's room.
    let long = tiny_recipe(&recipes, "long", "");
    let text = std::fs::read_to_string(&long).unwrap();
    let lines = format!("first line\n{}", "more ".repeat(40_000));
    std::fs::write(&long, format!("description = '''\n{lines}'''\n{text}")).unwrap();
    let one = tiny_recipe(&recipes, "single", "");
    let text = std::fs::read_to_string(&one).unwrap();
    let words = "word ".repeat(40_000);
    std::fs::write(&one, format!("description = \"{words}\"\n{text}")).unwrap();
    let out = runner_cmd().current_dir(&dir).arg("ls").output().unwrap();
    expect_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{text}"))
            .to_string()
    };
    assert!(line("good.toml").ends_with("fine\\u{1b}[2J"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(
        line("bad.toml").ends_with("no model (does not validate: runner validate says why)"),
        "{text}"
    );
    assert!(line("gone.toml").ends_with("(a link to nothing)"), "{text}");
    assert!(line("long.toml").ends_with("first line …"), "{text}");
    assert!(!text.contains("more"), "{text}");
    let one = line("single.toml");
    assert!(one.ends_with("word…") && one.len() < 200, "{one}");
    let at = |name: &str, about: &str| {
        let l = line(name);
        runner::columns::width(&l[..l.find(about).unwrap()])
    };
    assert_eq!(
        at("ベースライン.toml", "wide"),
        at("good.toml", "fine"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--set` is what a user asked of the run: one that a grid axis would override in every
/// cell, a value that opens as TOML but does not parse, and a key in the wrong table are
/// each refused with what to write instead (the first two ran, silently other than asked).
#[test]
fn a_set_the_run_would_not_honour_is_refused_with_the_fix() {
    let grid = root().join("recipes/article_grid.toml");
    let quick = root().join("recipes/quickstart.toml");
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    // A key the grid sweeps: the --set would change no cell (it ran each cell's own value).
    let out = with_sets("show", &grid, &["loader.workers=4"]);
    expect_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("loader.workers: set to 4, but it is an axis of the recipe's grid")
            && err.contains(r#"--set 'sweep."loader.workers"=[4]'"#),
        "{err}"
    );
    // As a table's leaf too, and for one cell; with the axis removed, it is the key's value.
    expect_exit(&with_sets("show", &grid, &["loader={workers=4}"]), 2);
    let mut one = runner_cmd();
    one.args(["show", "--cell", "0"])
        .arg(&grid)
        .args(["--set", "loader.workers=4"]);
    expect_exit(&one.output().unwrap(), 2);
    // An axis written half as a table, half quoted (`[sweep.data]` `"normalize.on"`).
    let dir = tempdir("set-axis-mixed");
    let mixed = dir.join("mixed.toml");
    std::fs::write(
        &mixed,
        format!(
            "extends = {:?}\n[sweep.data]\n\"normalize.on\" = [\"host\", \"device\"]\n",
            quick.display().to_string()
        ),
    )
    .unwrap();
    expect_exit(
        &with_sets("validate", &mixed, &["data.normalize.on=\"device\""]),
        2,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let out = with_sets(
        "show",
        &grid,
        &["loader.workers=4", "~sweep.\"loader.workers\""],
    );
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("a grid of 4 cells"));
    // A value that opens as an array, a table or a string but does not close.
    for (set, said) in [
        ("optim.betas=[0.9, 0.99", "unclosed array"),
        ("run={max_steps=3", "run: {max_steps=3 is not a TOML value"),
        (
            "loader.workers=[1",
            "loader.workers: [1 is not a TOML value",
        ),
    ] {
        let out = with_sets("validate", &quick, &[set]);
        expect_exit(&out, 2);
        assert!(stderr(&out).contains(said), "{set}: {}", stderr(&out));
    }
    // A bare word is still a string, and so is any value of a text key (a name, a
    // description, a path), as it always was.
    for set in ["name=my-run", "description=[wip] adam", "name=[exp1]"] {
        expect_exit(&with_sets("validate", &quick, &[set]), 0);
    }
    // A quote that does not close is a typo whatever the key (`log.dir="/x` made a folder
    // named `"`).
    let out = with_sets("validate", &quick, &["log.dir=\"/tmp/x"]);
    expect_exit(&out, 2);
    assert!(stderr(&out).contains("is not a TOML value: invalid basic string"));
    // A key of the same name in another table is named beside the near key of this one,
    // not in its place (`run.warmup_steps` times nothing that lr_warmup_steps warms up).
    for (set, said) in [
        (
            "optim.warmup_steps=10",
            "did you mean `lr_warmup_steps`? (there is a key `warmup_steps` in [run], too)",
        ),
        ("optim.wd=0.1", "did you mean `weight_decay`?"),
        ("run.seed=3", "`seed` belongs at the top level"),
        // A guess by spelling alone (`eps`) does not hide where the key is.
        ("optim.epochs=3", "`epochs` belongs in [run]"),
        (
            "run.lr_warmup_steps=3",
            "`lr_warmup_steps` belongs in [optim]",
        ),
        ("loader.model=3", "`model` is a table of its own, [model]"),
        ("loader.lr=0.1", "`lr` belongs in [optim]"),
        // Other tools' names: the key they qualify, not the nearest spelling
        // (`test_samples`, `max_steps`).
        ("data.synthetic.train_samples=3", "did you mean `samples`?"),
        ("run.max_epochs=3", "did you mean `epochs`?"),
    ] {
        let out = with_sets("validate", &quick, &[set]);
        expect_exit(&out, 2);
        assert!(stderr(&out).contains(said), "{set}: {}", stderr(&out));
    }
}

/// With several recipes, a --set error says which recipe refused it, and does not tell the
/// user to take the --set back with '~KEY'.
#[test]
fn a_set_refused_by_one_of_several_recipes_names_it() {
    let out = runner_cmd()
        .arg("validate")
        .arg(root().join("recipes/quickstart.toml"))
        .arg(root().join("recipes/text/rotten_tomatoes.toml"))
        .args(["--set", "model.width=16"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 error in --set, applied to ")
            && err.contains("recipes/text/rotten_tomatoes.toml")
            && err.contains("leave this --set out, or give it only with the recipes it applies to")
            && !err.contains("'~model.width'"),
        "{err}"
    );
}

/// A grid's bad name is said once, as written (it was said for each cell, with the cell's
/// name); `validate` lists a big grid's first cells, not a line of every one.
#[test]
fn a_grid_says_its_mistakes_and_its_cells_in_proportion() {
    let grid = root().join("recipes/article_grid.toml");
    let out = with_sets("validate", &grid, &["name=\"exp/\""]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("cannot name a run directory").count(),
        1,
        "{err}"
    );
    assert!(err.contains("name: \"exp/\" cannot name"), "{err}");
    let out = with_sets(
        "validate",
        &grid,
        &["sweep.seed=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"],
    );
    expect_exit(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("(grid of 80 cells: ")
            && said.contains(" | 72 more: runner show lists them)")
            && said.matches(" | ").count() == 8,
        "{said}"
    );
}

/// A recipe that is a symbolic link to one in another folder resolves its relative paths
/// from its target's folder, the file that wrote them: they resolved from the link's, and
/// the files it extends and its data were "no such file".
#[test]
fn a_linked_recipe_resolves_its_paths_from_its_target() {
    let dir = tempdir("linked-recipe");
    let team = dir.join("team");
    std::fs::create_dir_all(team.join("data")).unwrap();
    std::fs::create_dir_all(dir.join("proj/recipes")).unwrap();
    std::fs::copy(
        root().join("datasets/cifar10_sample/test_batch.bin"),
        team.join("data/batch.bin"),
    )
    .unwrap();
    std::fs::write(
        team.join("base.toml"),
        "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data/batch.bin\"\ntest = \"data/batch.bin\"\n[loader]\nbatch_size = 4\n",
    )
    .unwrap();
    std::fs::write(
        team.join("mine.toml"),
        "extends = \"base.toml\"\nname = \"mine\"\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("../../team/mine.toml", dir.join("proj/recipes/mine.toml")).unwrap();
    let out = runner_cmd()
        .current_dir(dir.join("proj"))
        .args(["show", "recipes/mine.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let shown = String::from_utf8_lossy(&out.stdout);
    let data = std::fs::canonicalize(team.join("data/batch.bin")).unwrap();
    assert!(
        shown.contains(&format!("train = \"{}\"", data.display())),
        "{shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `validate` of several files: each valid one still says `ok:`, a count names those that
/// do not (a call with one bad file printed no `ok:` at all), and a recipe that meets the
/// errors of a file it extends says so, where the base's errors were printed again as if
/// they were all.
#[test]
fn validate_of_several_files_says_each_verdict() {
    let dir = tempdir("validate-several");
    std::fs::write(
        dir.join("two.toml"),
        "name = \"two\"\n[model]\narch = \"mlpp\"\n[data]\nformat = \"synthetic\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("ext.toml"),
        "extends = \"two.toml\"\nname = \"e\"\n",
    )
    .unwrap();
    let quickstart = root().join("recipes/quickstart.toml");
    let out = runner_cmd()
        .arg("validate")
        .args([
            dir.join("two.toml"),
            dir.join("ext.toml"),
            quickstart.clone(),
        ])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("ok: {} (quickstart: ", quickstart.display())),
        "{stdout}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("unknown value `mlpp`").count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "error: {}: does not validate: the errors said above, in {} (which it extends)",
            dir.join("ext.toml").display(),
            dir.join("two.toml").display()
        )) && err.contains(&format!(
            "2 of 3 recipes do not validate: {}, {}",
            dir.join("two.toml").display(),
            dir.join("ext.toml").display()
        )),
        "{err}"
    );
    // Alone, the recipe that extends it is named beside the base's errors.
    let out = runner_cmd()
        .arg("validate")
        .arg(dir.join("ext.toml"))
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "1 error in {}, met by {} (it extends the file)",
            dir.join("two.toml").display(),
            dir.join("ext.toml").display()
        )),
        "{err}"
    );
}

/// `backend.threads = 0` takes `RAYON_NUM_THREADS`: past the cap of 1,024 it is refused as
/// the key is (100000 spun for minutes making threads, then aborted).
#[test]
fn rayon_num_threads_past_the_cap_is_refused() {
    let out = runner_cmd()
        .env("RAYON_NUM_THREADS", "100000")
        .args(["validate", "recipes/quickstart.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("backend.threads: 0 takes RAYON_NUM_THREADS from the environment: 100000 threads, over the cap of 1024"),
        "{err}"
    );
    let out = runner_cmd()
        .env("RAYON_NUM_THREADS", "2")
        .args(["validate", "recipes/quickstart.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
}

/// `extends = "."` of a recipe named from its own folder names that folder: the message
/// said "extends : is a directory", with no path at all.
#[test]
fn extends_of_the_recipe_s_own_folder_names_it() {
    let dir = tempdir("extends-dot");
    std::fs::write(dir.join("x.toml"), "extends = \".\"\n").unwrap();
    let out = runner_cmd()
        .current_dir(&dir)
        .args(["validate", "x.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("x.toml:1:11: extends: extends .: is a directory, not a recipe file"),
        "{err}"
    );
}

/// `extends = "../../x.toml"` from a folder reached through a symbolic link goes where the
/// OS takes `..`: to the link's target's parents (it said "no such file" of a file there).
#[test]
fn extends_through_a_linked_folder_follows_the_link() {
    let dir = tempdir("extends-link");
    let real = dir.join("proj/exps");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(dir.join("proj/recipes")).unwrap();
    std::fs::copy(
        root().join("recipes/quickstart.toml"),
        dir.join("proj/recipes/base.toml"),
    )
    .unwrap();
    let text = std::fs::read_to_string(dir.join("proj/recipes/base.toml")).unwrap();
    // The base's data path, absolute: its own folder is a copy's.
    let data = root().join("datasets").display().to_string();
    std::fs::write(
        dir.join("proj/recipes/base.toml"),
        text.replace("../datasets", &data),
    )
    .unwrap();
    std::fs::write(
        real.join("e1.toml"),
        "extends = \"../recipes/base.toml\"\nname = \"e1\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("z/deep")).unwrap();
    std::os::unix::fs::symlink(&real, dir.join("z/deep/exps")).unwrap();
    for path in [real.join("e1.toml"), dir.join("z/deep/exps/e1.toml")] {
        let out = runner_cmd().arg("validate").arg(&path).output().unwrap();
        expect_exit(&out, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A batch_size past the training set is the set, for the memory check as for the run
/// (20,000 of 2,000 samples was refused as 29 GiB); the run takes one batch of it all.
#[test]
fn a_batch_larger_than_the_data_is_sized_as_the_data() {
    let dir = tempdir("big-batch");
    let mut c = runner_cmd();
    c.arg(root().join("recipes/quickstart.toml")).arg("-q");
    for s in [
        "loader.batch_size=2000000".to_string(),
        "run.max_steps=1".to_string(),
        format!("log.dir={:?}", dir.display().to_string()),
    ] {
        c.args(["--set", &s]);
    }
    let out = c.output().unwrap();
    expect_exit(&out, 0);
    let run = only_run(&dir.join("quickstart"));
    let s = summary(&run);
    assert_eq!((s.steps, s.samples), (1, 2000), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file where the runs' folder `<log.dir>/<name>` goes is refused before anything runs,
/// named (it said "cannot create a run directory under <log.dir>: File exists", after the
/// data had loaded).
#[test]
fn a_file_where_the_runs_folder_goes_is_named_before_the_run() {
    let dir = tempdir("runs-folder-file");
    let recipe = tiny_recipe(&dir, "clash", "");
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    std::fs::write(dir.join("runs/clash"), "not a folder").unwrap();
    for command in ["run", "validate"] {
        let out = runner_cmd().arg(command).arg(&recipe).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "{} is not a folder",
                dir.join("runs/clash").display()
            )),
            "{command}: {err}"
        );
        expect_exit(&out, if command == "run" { 2 } else { 0 });
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("runs/clash")).unwrap(),
        "not a folder"
    );
    // A grid's cells go under <log.dir>/<grid>: the file there is named (it said the
    // log.dir "cannot be reached: Not a directory"), and said once, not once per cell.
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2, 0.3]\n");
    std::fs::write(dir.join("runs/g"), "not a folder").unwrap();
    let out = runner_cmd().arg("validate").arg(&grid).output().unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    let said = format!("{} is not a folder", dir.join("runs/g").display());
    assert_eq!(err.matches(&said).count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// env.json's git record is of the recipe's own repository and true of the file: a recipe
/// in a git-ignored folder is not "clean" (the commit does not hold it), a GIT_DIR in the
/// environment does not name another repository, and the recorded diff applies.
#[test]
fn the_git_record_is_true_of_the_recipe() {
    let dir = tempdir("git-record");
    let git = |repo: &Path, args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(repo)
            .args(args)
            .env_remove("GIT_DIR")
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        String::from_utf8_lossy(&ok.stdout).trim().to_string()
    };
    let (repo, other) = (dir.join("repo"), dir.join("other"));
    for r in [&repo, &other] {
        std::fs::create_dir_all(r).unwrap();
        git(r, &["init", "-q"]);
        std::fs::write(r.join("README"), "x\n").unwrap();
        git(r, &["add", "README"]);
        git(r, &["commit", "-qm", "x"]);
    }
    std::fs::write(repo.join(".gitignore"), "scratch/\n").unwrap();
    std::fs::create_dir_all(repo.join("scratch")).unwrap();
    let tracked = tiny_recipe(&repo, "t", "");
    git(&repo, &["add", ".gitignore", "t.toml"]);
    git(&repo, &["commit", "-qm", "t"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let ignored = tiny_recipe(&repo.join("scratch"), "s", "");
    // The tracked file edited: its diff applies to the commit.
    let text = std::fs::read_to_string(&tracked).unwrap();
    std::fs::write(&tracked, format!("{text}# edited\n")).unwrap();
    let env_of = |recipe: &Path, name: &str, logs: &Path| {
        let out = runner_cmd()
            .arg(recipe)
            .args(["-q", "--set"])
            .arg(format!("log.dir={:?}", logs.display().to_string()))
            .env("GIT_DIR", other.join(".git"))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        json(&only_run(&logs.join(name)).join("env.json"))
    };
    let env = env_of(&ignored, "s", &dir.join("runs-s"));
    let g = &env["sources"][0]["git"];
    assert_eq!(
        g["commit"], head,
        "the recipe's repository, not GIT_DIR's: {env}"
    );
    assert_eq!(
        g["dirty"], true,
        "an ignored file is not in the commit: {env}"
    );
    let env = env_of(&tracked, "t", &dir.join("runs-t"));
    let g = &env["sources"][0]["git"];
    assert_eq!(
        (g["commit"].as_str(), g["dirty"].as_bool()),
        (Some(head.as_str()), Some(true))
    );
    // Through a symbolic link from outside the repository: the target's record.
    let outside = dir.join("mine");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&tracked, outside.join("t.toml")).unwrap();
    let env = env_of(&outside.join("t.toml"), "t", &dir.join("runs-link"));
    assert_eq!(env["sources"][0]["git"]["commit"], head, "{env}");
    let patch = dir.join("p.diff");
    std::fs::write(&patch, g["diff"].as_str().unwrap()).unwrap();
    git(&repo, &["stash", "-q"]);
    git(&repo, &["apply", patch.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(&tracked).unwrap(),
        format!("{text}# edited\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner ls` follows a linked folder of recipes (a team's, linked in: run and validate
/// took them, ls left them out), each folder once (a link back up is no loop).
#[test]
fn ls_lists_a_linked_folder_of_recipes_once() {
    let dir = tempdir("ls-linked");
    let team = dir.join("team");
    std::fs::create_dir_all(&team).unwrap();
    std::fs::create_dir_all(dir.join("recipes")).unwrap();
    tiny_recipe(&dir.join("recipes"), "own", "");
    tiny_recipe(&team, "theirs", "");
    std::os::unix::fs::symlink(&team, dir.join("recipes/team")).unwrap();
    std::os::unix::fs::symlink("..", dir.join("recipes/up")).unwrap();
    let out = runner_cmd().arg("ls").current_dir(&dir).output().unwrap();
    expect_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("own.toml").count(), 1, "{text}");
    assert_eq!(text.matches("theirs.toml").count(), 1, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mistyped command (`runner valdiate r.toml`) is said as one: it read as a recipe file
/// that does not exist. A missing recipe is still a missing recipe.
#[test]
fn a_mistyped_command_is_said_as_one() {
    let out = runner_cmd()
        .args(["valdiate", "recipes/quickstart.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`valdiate` is neither a recipe file nor a command")
            && err.contains("did you mean `runner validate`?"),
        "{err}"
    );
    let out = runner_cmd().arg("nothere.toml").output().unwrap();
    expect_exit(&out, 2);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("did you mean `runner"));
}

/// `runner` alone shows what it can do (its commands and options), exit 2; it said only
/// that a recipe was required.
#[test]
fn runner_alone_shows_its_help() {
    let out = runner_cmd().output().unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["Usage: runner", "Commands:", "validate", "report", "--set"] {
        assert!(err.contains(want), "{want}: {err}");
    }
}
