//! `runner report`: the table recomputed from the runs it finds, and the plot.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use runner::metrics::RunStatus;

use crate::common::{
    as_other, expect, expect_exit, is_root, json, only_run, root, runner_cmd, summary, tempdir,
    tiny_recipe, whole_lines, writable_by_other,
};

// ---------------------------------------------------------------- measurement and report

/// `runner report --format csv PATHS`, as run by the tests that read its rows.
fn csv_report<P: AsRef<std::ffi::OsStr>>(paths: impl IntoIterator<Item = P>) -> Output {
    runner_cmd()
        .args(["report", "--format", "csv"])
        .args(paths)
        .output()
        .unwrap()
}

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
    assert!((rows[1].ratio - 112.5 / 58.25).abs() < 1e-12 && rows[1].within_noise == Some(false));
    assert_eq!(rows[2].within_noise, Some(true), "58.45 vs 58.25 is noise");
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

/// Runs that read their losses back at another interval (`log.every`: on a GPU the step
/// that reads waits for those queued before it) are rows of their own, not repeats; a path
/// given that holds no run is refused beside one that does (it was left out in silence);
/// a named baseline without a timed step is said (every ratio read `-`, in silence).
#[test]
fn report_refuses_a_path_without_runs_and_tells_log_intervals_apart() {
    let dir = tempdir("report-paths");
    for (name, extra) in [("a", "every = 2\n"), ("b", ""), ("c", ""), ("d", "")] {
        let recipe = tiny_recipe(&dir, name, extra);
        let text = std::fs::read_to_string(&recipe)
            .unwrap()
            .replace(&format!("name = \"{name}\""), "name = \"same\"")
            .replace(
                "warmup_steps = 1",
                match name {
                    "c" => "warmup_steps = 9",
                    _ => "warmup_steps = 1",
                },
            );
        std::fs::write(&recipe, text).unwrap();
        expect_exit(&runner_cmd().arg(&recipe).arg("-q").output().unwrap(), 0);
    }
    let out = csv_report([dir.join("runs")]);
    expect_exit(&out, 0);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("same [log.every=2]")
            && table.contains("same,2,2,")
            && table.lines().count() == 4,
        "{table}"
    );
    // On fewer cores (`taskset`, a cgroup's quota) the same recipe is another row.
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs/same"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let last = runs.iter().max().unwrap();
    let started = json(&last.join("env.json"));
    // Resumed on fewer cores: its steps on both are no repeat of either.
    let mut env = started.clone();
    env["resumes"] = serde_json::json!([{ "cpus": 77 }]);
    std::fs::write(last.join("env.json"), env.to_string()).unwrap();
    let table = String::from_utf8_lossy(&csv_report([dir.join("runs")]).stdout).into_owned();
    assert!(
        table.contains(&format!("cpus={},77", started["cpus"])) && table.lines().count() == 5,
        "{table}"
    );
    let mut env = started;
    env["cpus"] = serde_json::json!(99);
    std::fs::write(last.join("env.json"), env.to_string()).unwrap();
    let table = String::from_utf8_lossy(&csv_report([dir.join("runs")]).stdout).into_owned();
    assert!(
        table.contains("cpus=99") && table.lines().count() == 5,
        "{table}"
    );
    std::fs::remove_dir_all(last).unwrap();
    // A path whose runs another path given holds already is no path without runs.
    let out = csv_report([dir.join("runs"), dir.join("runs/same")]);
    expect_exit(&out, 0);
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = csv_report([dir.join("runs"), empty.clone(), dir.join("a.toml")]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{} holds no run directory", empty.display()))
            && stderr.contains("a.toml is a file, not a run directory"),
        "{stderr}"
    );
    let untimed = table
        .lines()
        .find(|l| l.contains("warmup_steps=9"))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("{table}"))
        .trim_matches('"')
        .to_string();
    let out = runner_cmd()
        .args(["report", "--baseline", &untimed])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no timed step"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Step times near f64's largest (a hand-edited or damaged metrics.jsonl) made the plot's
/// axis infinite, and `report --plot` looked for its ticks for good, at 100% of a core.
#[test]
fn a_plot_of_step_times_near_the_largest_float_is_drawn() {
    let dir = tempdir("report-huge");
    let run = dir.join("default/run1");
    std::fs::create_dir_all(&run).unwrap();
    let fixture = root().join("tests/fixtures/report/default/run1");
    std::fs::copy(fixture.join("summary.json"), run.join("summary.json")).unwrap();
    let lines: Vec<String> = std::fs::read_to_string(fixture.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["iter_ms"] = serde_json::json!(1.2e308);
            v.to_string()
        })
        .collect();
    std::fs::write(run.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    let svg = dir.join("huge.svg");
    let mut child = runner_cmd()
        .args(["report", "--plot"])
        .arg(&svg)
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("report --plot still drawing after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .starts_with("<!-- runner report --plot -->\n<svg"));
    let _ = std::fs::remove_dir_all(&dir);
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
        picture.starts_with("<!-- runner report --plot -->\n<svg")
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
    // An SVG runner did not draw (a logo) is kept too, and a pipe is refused, not written.
    let logo = out_dir.join("logo.svg");
    std::fs::write(&logo, "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>\n").unwrap();
    let pipe = out_dir.join("pipe.svg");
    let has_pipe = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .is_ok_and(|s| s.success());
    // A link planted at the temporary name is removed, not written through.
    let precious = out_dir.join("precious.txt");
    std::fs::write(&precious, "mine\n").unwrap();
    let fresh = out_dir.join("fresh.svg");
    std::os::unix::fs::symlink(&precious, out_dir.join("fresh.svg.tmp")).unwrap();
    let drawn = runner_cmd()
        .args(["report", "tests/fixtures/report", "--plot"])
        .arg(&fresh)
        .output()
        .unwrap();
    expect_exit(&drawn, 0);
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine\n");
    assert!(std::fs::symlink_metadata(&fresh).unwrap().is_file());
    // A folder that is not there is found before the table is printed, not after it.
    let nowhere = out_dir.join("no-such-folder/plot.svg");
    // A folder no file can be made in: said before the table too (it failed after it).
    let proc = std::path::PathBuf::from("/proc/plot.svg");
    for (target, want) in [
        (&proc, "no file can be made in its folder /proc".to_string()),
        (&records, "give a name ending in .svg".to_string()),
        (&kept, "exists and is not a plot runner drew".to_string()),
        (&logo, "exists and is not a plot runner drew".to_string()),
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
    assert!(std::fs::read_to_string(&logo).unwrap().starts_with("<svg"));
    if has_pipe {
        let refused = runner_cmd()
            .args(["report", "tests/fixtures/report", "--plot"])
            .arg(&pipe)
            .output()
            .unwrap();
        expect_exit(&refused, 2);
        assert!(String::from_utf8_lossy(&refused.stderr).contains("is a named pipe, not a file"));
    }
    let bad = runner_cmd()
        .args(["report", "tests/fixtures/report", "--baseline", "nope"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("the rows here are: default gc_every_step tuned"));
    let none = runner_cmd()
        .args(["report", "tests/fixtures/invalid"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
}

/// A recipe named in CJK takes two columns a character: padding by chars set every
/// column after its name out of line with the rows above.
#[test]
fn report_columns_line_up_under_a_wide_name() {
    let base = tempdir("report-wide");
    let dir = base.join("runs");
    crate::common::copy_dir(&root().join("tests/fixtures/report"), &dir);
    let summary = dir.join("tuned/run1/summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    std::fs::write(
        &summary,
        text.replace("\"name\": \"tuned\"", "\"name\": \"チューニング済み\""),
    )
    .unwrap();
    let out = runner_cmd().arg("report").arg(&dir).output().unwrap();
    expect_exit(&out, 0);
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = table.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[3].starts_with("チューニング済み"), "{table}");
    // Every line is as wide on a terminal, and ms/iter's column ends at one column.
    let widths: Vec<usize> = lines.iter().map(|l| runner::columns::width(l)).collect();
    assert!(
        widths.iter().all(|w| *w == widths[0]),
        "{widths:?}\n{table}"
    );
    let end =
        |line: &str, of: &str| runner::columns::width(&line[..line.find(of).unwrap() + of.len()]);
    let ends = [
        end(lines[0], "ms/iter"),
        end(lines[1], "58.25"),
        end(lines[3], "58.45"),
    ];
    assert!(ends.iter().all(|e| *e == ends[0]), "{ends:?}\n{table}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_diverged_run_fails_at_that_step_and_report_keeps_it_apart() {
    let dir = tempdir("diverge");
    let recipe = tiny_recipe(&dir, "div", "[optim]\nlr = 1e6\n");
    let out = runner_cmd().arg(&recipe).arg("-q").output().unwrap();
    expect_exit(&out, 1);
    let run = only_run(&dir.join("runs/div"));
    let s = summary(&run);
    assert_eq!(s.status, RunStatus::Failed);
    let err = s.error.clone().unwrap_or_default();
    assert!(
        err.starts_with("diverged at step ") && err.contains("run.max_loss"),
        "{err}"
    );
    let recs = whole_lines(&run);
    let last = recs.last().unwrap();
    assert!(err.starts_with(&format!("diverged at step {}:", last.step)));
    assert!(!(last.loss.is_finite() && last.loss <= 1e4), "{last:?}");
    // A huge loss in a float's short form (it was written out in as many digits as it has).
    if last.loss.is_finite() && last.loss >= 1e6 {
        assert!(
            err.contains(&format!("the loss is {:.3e} ", last.loss)),
            "{err}"
        );
    }
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
    // Said when it happens and in the summary line, not only in summary.json.
    let went_on = std::fs::read_dir(dir.join("runs/div"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| *p != run)
        .unwrap();
    let at = summary(&went_on)
        .diverged_at_step
        .expect("diverged_at_step");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("warning: diverged at step {at}: the loss is "))
            && stderr.contains("going on, as run.stop_on_divergence = false asks"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("(diverged at step {at}), ")),
        "{stdout}"
    );
    // `runner report --format csv` of every run: one row (and the header), and what it
    // said on stderr.
    let one_row = || {
        let out = csv_report([dir.join("runs")]);
        expect_exit(&out, 0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().count(), 2, "header and one row: {stdout}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // report: only the completed one is in the table; the failed one is listed apart.
    let stderr = one_row();
    assert!(
        stderr.contains("note: in the table, 1 run(s) that diverged and went on")
            && stderr.contains(&format!("  {}: diverged at step {at}", went_on.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("not in the table (1 run(s); each with why)")
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
    let stderr = one_row();
    assert!(
        stderr.contains("(2 run(s); each with why)")
            && stderr.contains(&format!("{}: unreadable: ", broken.display()))
            && stderr.contains("not a summary"),
        "{stderr}"
    );
    // A completed run whose metrics.jsonl was emptied is listed too (it was a row of
    // nothing beside the others).
    let cut = tiny_recipe(&dir, "cut", "");
    expect_exit(&runner_cmd().arg(&cut).arg("-q").output().unwrap(), 0);
    let cut = only_run(&dir.join("runs/cut"));
    std::fs::write(cut.join("metrics.jsonl"), "").unwrap();
    let stderr = one_row();
    assert!(
        stderr.contains("(3 run(s); each with why)")
            && stderr
                .contains("metrics.jsonl: 0 lines for the 4 steps summary.json says the run took"),
        "{stderr}"
    );
    // One without it (a copy made in part), and one without its summary: listed with what
    // they lack (the first was left out without a word).
    let part = dir.join("runs/part");
    let copy = |name: &str, without: &str| {
        let to = part.join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in ["summary.json", "metrics.jsonl", "env.json", "recipe.toml"] {
            if f != without {
                std::fs::copy(cut.join(f), to.join(f)).unwrap();
            }
        }
        to
    };
    let (a, b) = (
        copy("20260101T000001", "metrics.jsonl"),
        copy("20260101T000002", "summary.json"),
    );
    let stderr = one_row();
    for lacks in [a.join("metrics.jsonl"), b.join("summary.json")] {
        assert!(
            stderr.contains("(5 run(s); each with why)")
                && stderr.contains(&format!(
                    "{} does not exist: a run directory holds it from the run's start",
                    lacks.display()
                )),
            "{stderr}"
        );
    }
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
        stderr.contains(
            "killed (kill -9, out of memory, a node lost, or a third Ctrl-C), or unable to write its summary"
        ) && stderr.contains("its process (pid 4000000) is gone"),
        "{stderr}"
    );
    // On another node: its run.lock's heartbeat tells a running run from a killed one
    // (before, both were "running, or killed"); without a lock (earlier versions) it
    // cannot be told.
    s["host"] = "node17".into();
    std::fs::write(run.join("summary.json"), s.to_string()).unwrap();
    let said = || {
        let out = runner_cmd().arg("report").arg(&run).output().unwrap();
        expect_exit(&out, 1);
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let stderr = said();
    assert!(
        stderr.contains("running, or killed, on node17 (pid 4000000)"),
        "{stderr}"
    );
    let lock = run.join("run.lock");
    std::fs::write(&lock, "node17 4000000 4026531836\n").unwrap();
    let stderr = said();
    assert!(
        stderr.contains("still running on node17 (pid 4000000; its run.lock was touched 0 s ago)"),
        "{stderr}"
    );
    std::fs::File::options()
        .append(true)
        .open(&lock)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(300))
        .unwrap();
    let stderr = said();
    assert!(
        stderr.contains("killed on node17 (pid 4000000; a node lost, kill -9, out of memory): its run.lock has had no heartbeat for 300 s"),
        "{stderr}"
    );
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
    let out = csv_report([dir.join("runs")]);
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
    // `runner report --format csv PATHS`: one row for both runs of `rl`; its stderr.
    let two_runs = |paths: &[&Path]| {
        let out = csv_report(paths);
        expect_exit(&out, 0);
        let (text, line) = csv(&out);
        assert!(line.starts_with("rl,2,"), "{text}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = two_runs(&[&runs]);
    assert!(
        stderr.contains(&format!(
            "{}: the same run as {} (a link to it, or named twice): counted once",
            runs.join("latest").display(),
            both[0].display()
        )),
        "{stderr}"
    );
    // A run reached only through a link is found (a folder of links to runs elsewhere
    // held "no run directories").
    let links = dir.join("links");
    std::fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(runs.join("rl"), links.join("rl")).unwrap();
    two_runs(&[&links]);
    // A copy of a run (a backup beside the runs) is that run, once, and said to be a copy.
    let backup = dir.join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    assert!(Command::new("cp")
        .arg("-a")
        .arg(&both[0])
        .arg(&backup)
        .status()
        .unwrap()
        .success());
    let stderr = two_runs(&[&runs, &backup]);
    let copy = backup.join(both[0].file_name().unwrap());
    assert!(
        stderr.contains(&format!(
            "{}: a copy of {}",
            copy.display(),
            both[0].display()
        )) && stderr.contains("counted once"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&backup).unwrap();

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
    // Once on CI (2026-12-05) this report, run as another user, wrote nothing to stdout
    // and the run passed when repeated: the status and stderr say why next time.
    assert!(
        line.starts_with("rl,1,"),
        "{text}\nstatus {:?}, stderr: {stderr}",
        out.status
    );
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
    let out = csv_report([&runs]);
    let (text, line) = csv(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(line.starts_with("rl,1,"), "{text}");
    assert!(
        stderr.contains(&format!("{}: not a regular file", piped.display())),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs of one name that ran different recipes (an A/B by `--set`) are two rows, each
/// labelled with the keys they differ in, not one row of "repeats" with their mean; runs
/// that differ only in `[log]` are repeats. Rows come in the order the paths are given, so
/// the first path given is the baseline.
#[test]
fn report_keeps_different_recipes_of_one_name_apart_in_the_order_given() {
    let dir = tempdir("report-ab");
    let recipe = tiny_recipe(&dir, "ab", "");
    for sets in [&[][..], &["log.csv=false"], &["optim.lr=0.5"]] {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        for s in sets {
            cmd.args(["--set", s]);
        }
        expect_exit(&cmd.output().unwrap(), 0);
    }
    let other = tiny_recipe(&dir, "zz", "");
    expect_exit(&runner_cmd().arg(&other).arg("-q").output().unwrap(), 0);
    let csv = |paths: &[&str]| {
        let out = csv_report(paths.iter().map(|p| dir.join("runs").join(p)));
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = csv(&["ab"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    // Each labelled by where it leaves what most of the runs ran.
    assert!(
        rows[0].starts_with("ab,2,"),
        "the first recipe, run twice (a [log] change is a repeat): {table}"
    );
    assert!(
        rows[1].starts_with("ab [optim.lr=0.5],1,"),
        "the A/B's other side: {table}"
    );
    // The order given, not the paths' alphabetical order: `zz` first is the baseline.
    let table = csv(&["zz", "ab"]);
    let first = table.lines().nth(1).unwrap();
    assert!(first.starts_with("zz,1,"), "{table}");
    // The same recipe on another device (another GPU model, another CPU) is no repeat.
    expect_exit(&runner_cmd().arg(&other).arg("-q").output().unwrap(), 0);
    assert!(csv(&["zz"]).lines().nth(1).unwrap().starts_with("zz,2,"));
    let moved = std::fs::read_dir(dir.join("runs/zz"))
        .unwrap()
        .map(|e| e.unwrap().path().join("summary.json"))
        .max()
        .unwrap();
    let mut s = json(&moved);
    let here = s["device"].as_str().unwrap().to_string();
    s["device"] = "Other CPU".into();
    std::fs::write(&moved, serde_json::to_string(&s).unwrap()).unwrap();
    let table = csv(&["zz"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    // One run each: the first run's device is the usual one.
    let _ = here;
    for label in ["zz,1,", "zz [device=Other CPU],1,"] {
        assert!(
            rows.iter().any(|r| r.starts_with(label)),
            "{label}: {table}"
        );
    }
    // --baseline by the recipe's name is its usual row's whole label, and needs no note;
    // the whole label of the other takes that one, without a note either.
    let out = runner_cmd()
        .args(["report", "--baseline", "zz"])
        .arg(dir.join("runs/zz"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let (first, second) = (
        rows[0].split(',').next().unwrap(),
        rows[1].split(',').next().unwrap(),
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
    let table = String::from_utf8_lossy(&out.stdout);
    let base = table
        .lines()
        .find(|l| l.starts_with("zz ") && !l.starts_with("zz ["))
        .unwrap();
    assert!(base.trim_end().ends_with("baseline"), "{table}");
    let out = runner_cmd()
        .args(["report", "--baseline", second])
        .arg(dir.join("runs/zz"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
    let table = String::from_utf8_lossy(&out.stdout);
    let base = table.lines().find(|l| l.starts_with(second)).unwrap();
    assert!(base.trim_end().ends_with("baseline"), "{table}");
    // The plot draws each row's runs in its own colour and keys them by the row's label
    // (the runs' name matched no label: both were drawn in the first's colour, keyed
    // `zz` once).
    let svg = dir.join("zz.svg");
    let out = runner_cmd()
        .arg("report")
        .arg(dir.join("runs/zz"))
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let picture = std::fs::read_to_string(&svg).unwrap();
    for (n, (label, colour)) in [(first, "#0072B2"), (second, "#E69F00")].iter().enumerate() {
        assert!(
            picture.contains(&format!("{}  {label}", n + 1)),
            "{label} not in the key"
        );
        // A step-time line (1 px) of that colour.
        assert!(
            picture.contains(&format!("stroke=\"{colour}\" stroke-width=\"1\"")),
            "no run drawn in {colour}"
        );
    }
    // So is the same CPU with another thread count (`threads = 0` is one per core).
    s["device"] = here.into();
    std::fs::write(&moved, serde_json::to_string(&s).unwrap()).unwrap();
    let env_path = moved.with_file_name("env.json");
    let mut env = json(&env_path);
    let threads = env["threads"].as_u64().unwrap();
    env["threads"] = (threads + 7).into();
    std::fs::write(&env_path, serde_json::to_string(&env).unwrap()).unwrap();
    let table = csv(&["zz"]);
    for label in [
        "zz,1,".to_string(),
        format!("zz [cpu threads={}],1,", threads + 7),
    ] {
        assert!(table.contains(&format!("\n{label}")), "{label}: {table}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recipe named as another row's label is a row of its own, numbered, not a repeat of
/// that row (they were merged: one row, the mean of two recipes' runs); a `--set` that
/// brings in keys of its own is labelled by the key set.
#[test]
fn report_never_merges_two_recipes_into_one_row() {
    let dir = tempdir("report-alike");
    let recipe = tiny_recipe(&dir, "q", "");
    for sets in [&["optim.lr=0.5"][..], &[], &["optim.schedule=\"step\""]] {
        let mut cmd = runner_cmd();
        cmd.arg(&recipe).arg("-q");
        for s in sets {
            cmd.args(["--set", s]);
        }
        expect_exit(&cmd.output().unwrap(), 0);
    }
    let evil = dir.join("evil.toml");
    std::fs::write(&evil, "extends = \"q.toml\"\nname = \"q [optim.lr=0.5]\"\n").unwrap();
    expect_exit(&runner_cmd().arg(&evil).arg("-q").output().unwrap(), 0);
    let out = csv_report([dir.join("runs")]);
    expect_exit(&out, 0);
    let table = String::from_utf8_lossy(&out.stdout);
    let mut rows: Vec<(&str, &str)> = table
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[0], cells[1])
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("q", "1"),
            ("q [optim.lr=0.5]", "1"),
            ("q [optim.lr=0.5] (2)", "1"),
            ("q [optim.schedule=step]", "1"),
        ],
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner report runs/` over two grids lists each grid's cells together, in its order
/// (the rows were sorted by cell index alone: cell 0 of every grid, then cell 1 of every
/// grid, with the baseline's ratios across grids).
#[test]
fn report_keeps_each_grids_cells_together() {
    let dir = tempdir("report-two-grids");
    for g in ["ga", "gb"] {
        let grid = tiny_recipe(&dir, g, "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
        expect_exit(&runner_cmd().arg(&grid).arg("-q").output().unwrap(), 0);
    }
    // The first column of `report --format csv`'s rows.
    let labels = |path: &Path| {
        let out = csv_report([path]);
        expect_exit(&out, 0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rows: Vec<String> = stdout
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect();
        (rows, stdout.into_owned())
    };
    let (rows, stdout) = labels(&dir.join("runs"));
    assert_eq!(
        rows,
        [
            "ga/optim.lr=0.1",
            "ga/optim.lr=0.2",
            "gb/optim.lr=0.1",
            "gb/optim.lr=0.2"
        ],
        "{stdout}"
    );
    // --baseline GRID takes the grid's first cell, and says how to name another (it found
    // "no run of that recipe").
    let out = runner_cmd()
        .args(["report", "--baseline", "gb"])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: --baseline gb: 2 rows are runs of that recipe; the first, `gb/optim.lr=0.1`, is the baseline")
            && err.contains("--baseline gb/optim.lr=0.2"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let base = stdout
        .lines()
        .find(|l| l.contains("gb/optim.lr=0.1"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(base.ends_with("baseline"), "{stdout}");
    // The sweep directory a grid names ("state in ...") reports that grid's cells, in
    // its order (it held "no run directories").
    let sweeps = dir.join("runs/gb/sweeps");
    let state = std::fs::read_dir(&sweeps)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (rows, stdout) = labels(&state);
    assert_eq!(rows, ["gb/optim.lr=0.1", "gb/optim.lr=0.2"], "{stdout}");
}

/// A run directory's name reaches the report's lines: a control char in it is shown
/// escaped, not acted on by the terminal (an ESC cleared the screen of whoever ran
/// `runner report` over a shared runs/ tree).
#[test]
fn a_control_char_in_a_run_directory_name_is_shown_escaped() {
    let dir = tempdir("report-escape");
    let run = dir.join("x\u{1b}[2Jy");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("metrics.jsonl"), "x\n").unwrap();
    let out = runner_cmd().arg("report").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\u{1b}') && stderr.contains("x\\u{1b}[2Jy"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One run's standard error is no spread between runs: with no recipe of the table run
/// twice, no ratio is said to be within the noise or past it (`?`); a row of one run beside
/// rows with repeats takes their pooled spread (five runs of one recipe read 0.97x to
/// 1.11x of each other, at ±0.8% each, and each difference read as real).
#[test]
fn a_verdict_on_noise_needs_a_recipe_run_twice() {
    let fixtures = root().join("tests/fixtures/report");
    let table = |paths: &[&str]| {
        let out = runner_cmd()
            .arg("report")
            .args(paths.iter().map(|p| fixtures.join(p)))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let row = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{text}"))
            .to_string()
    };
    let single = table(&["default/run1", "gc_every_step", "tuned"]);
    assert!(row(&single, "gc_every_step").ends_with("x ?"), "{single}");
    assert!(row(&single, "tuned").ends_with("x ?"), "{single}");
    let repeated = table(&["default", "gc_every_step", "tuned"]);
    assert!(
        row(&repeated, "gc_every_step").ends_with("1.93x"),
        "{repeated}"
    );
    assert!(row(&repeated, "tuned").ends_with("1.00x ≈"), "{repeated}");
}

/// `--repeat N` runs the recipes in rounds (a b, a b) and ends with the comparison of the
/// call's runs, each recipe's repeats in one row, so that a verdict on noise can be given
/// (a single round's rows are all `?`). It refuses 0, `--resume` (which would skip every
/// cell the first round did) and `--slurm` (whose tasks run each cell once).
#[test]
fn a_repeat_runs_the_recipes_in_rounds_and_compares_them() {
    let dir = tempdir("repeat-rounds");
    let a = tiny_recipe(&dir, "a", "");
    let b = tiny_recipe(&dir, "b", "[optim]\nlr = 0.05\n");
    let out = runner_cmd()
        .args([&a, &b])
        .args(["--repeat", "2", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ran: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once(": ").filter(|(_, r)| r.contains(" steps, ")))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(ran, ["a", "b", "a", "b"], "{stdout}");
    let (_, table) = stdout
        .split_once("2 rounds of 2 recipe(s): 4 run(s) completed:\n")
        .unwrap_or_else(|| panic!("{stdout}"));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!((rows[0][0], rows[0][1]), ("a", "2"), "{table}");
    assert_eq!((rows[1][0], rows[1][1]), ("b", "2"), "{table}");
    assert_ne!(rows[1].last(), Some(&"?"), "{table}");
    for name in ["a", "b"] {
        assert_eq!(
            std::fs::read_dir(dir.join("runs").join(name))
                .unwrap()
                .count(),
            2
        );
    }
    // One round: no table of its own (`runner report` makes it).
    let once = runner_cmd().arg(&a).arg("-q").output().unwrap();
    expect_exit(&once, 0);
    assert!(!String::from_utf8_lossy(&once.stdout).contains("rounds of"));
    let refused = |extra: &[&str], want: &str| {
        let out = runner_cmd().args(extra).arg(&a).output().unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
    };
    refused(&["--repeat", "0"], "--repeat");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let out = runner_cmd()
        .arg(&grid)
        .args(["--repeat", "2", "--resume"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error: --repeat 2 with --resume: a round would skip every cell the round before it did"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.join("runs/g").exists());
    let out = runner_cmd()
        .args(["sweep", "--slurm", "--repeat", "2"])
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("error: --repeat runs the recipes here, round after round; with --slurm"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.join("runs/g").exists());
}
