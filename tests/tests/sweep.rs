//! Grids, shards, resumable sweeps, cell locks and Slurm arrays.

use std::path::{Path, PathBuf};
use std::process::Command;

use runner::metrics::RunStatus;
use runner::plan::Machine;
use runner::recipe;

use crate::common::{
    as_other, copy_dir, cut_records, expect_exit, has_a_line, invalid_quickstart_grid, json,
    long_recipe, losses, mlp_over_a_copy, only_run, records, resume_grid_quietly, resume_quietly,
    root, runner_cmd, runner_logged, says_running, send, spawn_until, statuses, summary, tempdir,
    tiny_recipe, walk_files, with_sets, writable_by_other, SLOW_FIRST_STEP,
};

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
    let tag = |n: &str| n.strip_prefix("g/cache_dir=x_y,cell=").map(str::to_string);
    let (a, b) = (tag(names[0]).unwrap(), tag(names[1]).unwrap());
    assert!(a != b && [&a, &b].iter().all(|t| t.len() == 8), "{names:?}");
    assert_eq!(names[2], "g/cache_dir=z");
    assert_eq!(cells[1].loaded.recipe.name.as_deref(), Some(names[1]));
    // The tag is the values', not the index: a value added before them changes neither.
    let grown = grid_cells(
        "extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"backend.cache_dir\" = [\"w\", \"x/y\", \"x_y\", \"z\"]\n",
    );
    let again: Vec<&str> = grown.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(again[1..], names[..], "{again:?}");
}

#[test]
fn cell_ids_are_stable_and_follow_the_resolved_recipe() {
    let dir = root().join("tests/fixtures/sweep");
    let ids = |src: &str| -> Vec<String> {
        let path = dir.join("inline_grid.toml");
        let l = recipe::parse(&path, src.into()).unwrap_or_else(|r| panic!("{r}"));
        runner::sweep::check_loaded(&path, &l, &Machine::cpu_only(), 256)
            .unwrap_or_else(|r| panic!("{r}"))
            .cells
            .into_iter()
            .map(|c| c.id)
            .collect()
    };
    let grid = "extends = \"base.toml\"\nname = \"g\"\n[sweep]\n\"loader.workers\" = [0, 2]\n";
    let a = ids(grid);
    assert_eq!(a, ids(grid));
    assert_ne!(a[0], a[1]);
    assert_eq!(a[0].len(), 12);
    // The same cell written out by hand, without extends or a grid, has the same id...
    let inline = std::fs::read_to_string(dir.join("base.toml"))
        .unwrap()
        .replace("name = \"tiny\"", "name = \"g/workers=2\"")
        .replace("batch_size = 32", "batch_size = 32\nworkers = 2");
    assert_eq!(ids(&inline), [a[1].clone()]);
    // ...where the logs go does not change what runs...
    let logged = ids(&grid.replace("[sweep]", "[log]\ndir = \"elsewhere\"\n[sweep]"));
    assert_eq!(logged, a);
    // ...and neither does a default written out (the grid was another, its cells run
    // again): SGD's momentum 0, no Nesterov, no flip.
    for default in [
        "[optim]\nmomentum = 0.0\nnesterov = false",
        "[data.augment]\nhflip = false",
    ] {
        let explicit = ids(&grid.replace("[sweep]", &format!("{default}\n[sweep]")));
        assert_eq!(explicit, a, "{default}");
    }
    // A value that is not the default does.
    assert_ne!(
        ids(&grid.replace("[sweep]", "[optim]\nmomentum = 0.5\n[sweep]")),
        a
    );
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
    // A value twice is one run twice, also written once as an integer and once as a float.
    let e = err("extends = \"base.toml\"\n[sweep]\n\"optim.lr\" = [0.1, 0.2, 0.1]\n");
    assert!(
        e.contains("0.1 is listed twice: the two cells would be the same run"),
        "{e}"
    );
    let e = err("extends = \"base.toml\"\n[sweep]\n\"optim.lr\" = [1, 0.5, 1.0]\n");
    assert!(
        e.contains("1.0 is listed twice: the two cells would be the same run"),
        "{e}"
    );
    let e = err("extends = \"base.toml\"\n[sweep]\n\"loader.workers\" = [0, 1, 2]\n\"optim.lr\" = [0.1, 0.2]\n");
    assert!(
        e.contains("bad.toml:2:1: sweep: the grid has 6 cells (3 × 2), over the cap of 4")
            && e.contains("raise the cap with --max-cells (up to 10000)"),
        "{e}"
    );
    // Past the most --max-cells allows, raising it is not offered.
    let values = |n: usize| {
        (0..n)
            .map(|i| format!("{}", i + 1))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let e = err(&format!(
        "extends = \"base.toml\"\n[sweep]\n\"seed\" = [{}]\n\"loader.workers\" = [{}]\n",
        values(200),
        values(60)
    ));
    assert!(
        e.contains("the grid has 12000 cells (200 × 60), over the cap of 4")
            && e.contains("split the grid into recipes of at most 10000 cells")
            && !e.contains("raise the cap"),
        "{e}"
    );
}

fn sweep_dir(logs: &Path) -> PathBuf {
    let sweeps = logs.join("tiny_grid/sweeps");
    only_run(&sweeps)
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
    let grid = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        script.contains("#SBATCH --array=0-3")
            && script.contains("--cell $SLURM_ARRAY_TASK_ID")
            && script.contains("--resume")
            && script.contains(&format!("--grid {grid}"))
            && script.contains("#SBATCH --open-mode=append")
            && !script.contains("--max-cells"),
        "{script}"
    );
    // A task of that array after the grid changed (here a --set; an edited recipe alike)
    // refuses, running nothing: by its index it ran a cell of the new grid, and the cells
    // it was written for never ran. The same grid goes on (its cell is done).
    let task = |extra: &[&str]| {
        let mut args = vec![
            "sweep",
            "tests/fixtures/sweep/tiny_grid.toml",
            "--resume",
            "--quiet",
            "--cell",
            "3",
            "--grid",
            &grid,
        ];
        args.extend(extra);
        runner_logged(&logs, &args, &[])
    };
    let out = task(&["--set", "run.max_steps=3"]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "tiny_grid.toml: the grid is not the one this command was written for (grid {grid}; it is grid "
        )) && err.contains(&format!(
            "write it again with `{} sweep --slurm",
            env!("CARGO_BIN_EXE_runner")
        )),
        "{err}"
    );
    assert_eq!(sweep_dir(&logs), dir, "a sweep directory was made");
    expect_exit(&task(&[]), 0);
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

/// An array of more tasks than Slurm's default MaxArraySize (1001) is written with a
/// warning that names --shards: it was written without a word, and refused at submit time.
#[test]
fn an_array_past_slurm_s_default_size_is_said() {
    let logs = tempdir("slurm-big");
    let recipe = logs.join("big.toml");
    let seeds: Vec<String> = (0..1002).map(|i| i.to_string()).collect();
    std::fs::write(
        &recipe,
        format!(
            "extends = \"{}\"\nname = \"big\"\n[sweep]\nseed = [{}]\n",
            root().join("tests/fixtures/sweep/base.toml").display(),
            seeds.join(", ")
        ),
    )
    .unwrap();
    let path = recipe.display().to_string();
    let out = runner_logged(
        &logs,
        &["sweep", "--slurm", &path, "--max-cells", "2000"],
        &[],
    );
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1002 array tasks, more than Slurm's default MaxArraySize of 1001 allows")
            && err.contains("write it with --shards K"),
        "{err}"
    );
    let out = runner_logged(
        &logs,
        &[
            "sweep",
            "--slurm",
            &path,
            "--max-cells",
            "2000",
            "--shards",
            "1000",
        ],
        &[],
    );
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("MaxArraySize"));
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
    // Slurm 23.11 refuses --gpus-per-task without a task count. A task with a GPU gets 4
    // cores unless told (fusion's threads spin on 3), and its warm-up as many processes.
    let array = std::fs::read_to_string(sweep.join("slurm.sbatch")).unwrap();
    assert!(
        array.contains("#SBATCH --ntasks=1\n") && array.contains("#SBATCH --cpus-per-task=4\n"),
        "{array}"
    );
    let warmup = std::fs::read_to_string(sweep.join("warmup.sbatch")).unwrap();
    assert!(
        warmup.contains("#SBATCH --gpus-per-task=1")
            && warmup.contains("#SBATCH --ntasks=1")
            && warmup.contains("#SBATCH --cpus-per-task=4\n")
            && !warmup.contains("--array")
            && warmup.contains(&format!(
                " warmup --jobs 4 --grid {} ",
                sweep.file_name().unwrap().to_string_lossy()
            ))
            && warmup.contains("tiny_grid.toml --set ")
            && warmup.contains(" --set slurm.gpus_per_task=1"),
        "{warmup}"
    );

    // On the CPU (no GPU asked for) there is nothing to compile: the array alone, unless
    // slurm.warmup asks for it.
    let (_, calls) = submit(&[]);
    assert_eq!(calls.lines().count(), 1, "{calls}");
    assert!(!calls.contains("--dependency"), "{calls}");
    let array = std::fs::read_to_string(dir(&calls).join("slurm.sbatch")).unwrap();
    assert!(array.contains("#SBATCH --cpus-per-task=2\n"), "{array}");
    let (_, calls) = submit(&["slurm.gpus_per_task=1", "slurm.cpus_per_task=8"]);
    let warmup = std::fs::read_to_string(dir(&calls).join("warmup.sbatch")).unwrap();
    assert!(
        warmup.contains("#SBATCH --cpus-per-task=8\n") && warmup.contains(" warmup --jobs 8 "),
        "{warmup}"
    );
    let (_, calls) = submit(&["slurm.gpus_per_task=1", "slurm.warmup=false"]);
    assert_eq!(calls.lines().count(), 1, "{calls}");
    let (_, calls) = submit(&["slurm.warmup=true"]);
    assert_eq!(calls.lines().count(), 2, "{calls}");
}

/// What a GPU task's run would warn of on too few cores is said by `validate` (and so by
/// `sweep --slurm`) at `slurm.cpus_per_task`, before an array is queued: 1 core, or fewer
/// than 4 with `backend.fusion = true`. Nothing for `"auto"` (fusion off, said on each
/// run's backend line), without a GPU, or on the CPU backend.
#[test]
fn slurm_cores_too_few_for_a_gpu_task_are_said_at_the_key() {
    let validate = |sets: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.args(["validate", "recipes/quickstart.toml"]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let gpu = ["backend.kind=\"cuda\"", "slurm.gpus_per_task=1"];
    let with =
        |more: &[&'static str]| -> Vec<&'static str> { gpu.iter().chain(more).copied().collect() };
    let err = validate(&with(&["slurm.cpus_per_task=2", "backend.fusion=true"]));
    assert!(
        err.contains(
            "slurm.cpus_per_task: 2 cores for a task with a GPU and backend.fusion = true"
        ) && err.contains("give each task 4 cores (the default)"),
        "{err}"
    );
    let err = validate(&with(&["slurm.cpus_per_task=1"]));
    assert!(
        err.contains("slurm.cpus_per_task: 1 core for a task with a GPU")
            && err.contains("give each task at least 2 cores"),
        "{err}"
    );
    for sets in [
        with(&["slurm.cpus_per_task=2"]),
        with(&["slurm.cpus_per_task=4", "backend.fusion=true"]),
        with(&[]),
        vec![
            "backend.kind=\"cuda\"",
            "slurm.cpus_per_task=1",
            "backend.fusion=true",
        ],
        vec![
            "backend.kind=\"cpu\"",
            "slurm.gpus_per_task=1",
            "slurm.cpus_per_task=1",
        ],
    ] {
        let err = validate(&sets);
        assert!(!err.contains("slurm.cpus_per_task"), "{sets:?}: {err}");
    }
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
    // Simulate a kill during cell 2: its status says running, and so does its run's
    // summary (a run whose summary says completed is done, whatever the status file says:
    // its process was killed after the run, before marking the cell); cell 3 never started.
    let p2 = dir.join("cells").join(&files[2]);
    let text = std::fs::read_to_string(&p2)
        .unwrap()
        .replace("\"done\"", "\"running\"");
    std::fs::write(&p2, &text).unwrap();
    let run2 = PathBuf::from(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["run_dir"]
            .as_str()
            .unwrap(),
    );
    let summary2 = run2.join("summary.json");
    let text = std::fs::read_to_string(&summary2)
        .unwrap()
        .replace("\"completed\"", "\"running\"");
    std::fs::write(&summary2, text).unwrap();
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2 cell(s) already done were skipped"));
    assert!(!stderr.contains("no earlier sweep"), "{stderr}");
    assert!(statuses(&dir).iter().all(|(_, s)| s == "done"));
    // --resume where no sweep of the grid ran (another log.dir, or from another working
    // directory with a relative one) says so: it started the grid over in silence.
    let elsewhere = tempdir("resume-elsewhere");
    let out = runner_logged(
        &elsewhere,
        &["tests/fixtures/sweep/tiny_grid.toml", "--quiet"],
        &["--resume"],
    );
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: --resume: no earlier sweep of tiny_grid under"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&elsewhere);
    // A status file that cannot be read is said, with the cell it leaves to run again
    // (it ran again without a word).
    let p0 = dir.join("cells").join(&files[0]);
    std::fs::write(&p0, "junk").unwrap();
    let out = run(&["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {}: unreadable (expected value at line 1 column 1); cell 0 (tiny_grid/workers=0,optim.lr=0.1) is taken as not done and runs again",
            p0.display()
        )),
        "{stderr}"
    );
}

/// Each cell's run names its cell in env.json (`cell`: index and id); a status file that
/// points at another cell's run (copied or edited by hand) is not taken as this cell done,
/// nor resumed as this cell's: the cell runs again, and why is said.
#[test]
fn a_status_naming_another_cells_run_is_not_that_cell_done() {
    let logs = tempdir("other-cells-run");
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
    let status = |i: usize| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("cells").join(&files[i])).unwrap())
            .unwrap()
    };
    let run_of = |i: usize| PathBuf::from(status(i)["run_dir"].as_str().unwrap());
    // Each run says which cell it is: its index and the id its status file ends in.
    assert_eq!(files.len(), 4);
    for (i, file) in files.iter().enumerate() {
        let env: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run_of(i).join("env.json")).unwrap())
                .unwrap();
        let id = file.trim_end_matches(".json").split_once('-').unwrap().1;
        assert_eq!(
            env["cell"],
            serde_json::json!({ "index": i, "id": id }),
            "{i}"
        );
    }
    // Cell 1's status copied over cell 3's: it names cell 1's run, done.
    let (run1, run3) = (run_of(1), run_of(3));
    std::fs::copy(
        dir.join("cells").join(&files[1]),
        dir.join("cells").join(&files[3]),
    )
    .unwrap();
    let out = run(&["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let id1 = files[1]
        .trim_end_matches(".json")
        .split_once('-')
        .unwrap()
        .1;
    assert!(
        stderr.contains(&format!(
            "tiny_grid/workers=1,optim.lr=0.01: its run {} is cell 1's (id {id1}, its env.json says), not this cell's",
            run1.display()
        )) && stderr.contains("the cell runs again")
            && stderr.contains("3 cell(s) already done were skipped"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ran: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" steps, median "))
        .collect();
    assert!(
        ran.len() == 1 && ran[0].starts_with("tiny_grid/workers=1,optim.lr=0.01:"),
        "{stdout}"
    );
    // Its status now names a run of its own; cell 1's run and cell 3's first are untouched.
    let now3 = run_of(3);
    assert!(now3 != run1 && now3 != run3, "{}", now3.display());
    assert_eq!(
        status(1)["run_dir"].as_str().unwrap(),
        run1.display().to_string()
    );
    assert!(run3.join("summary.json").is_file());
    // Marked interrupted, pointing at another cell's run (running, as a killed run's
    // summary says): not resumed as this cell's.
    let summary1 = run1.join("summary.json");
    let done1 = std::fs::read_to_string(&summary1).unwrap();
    std::fs::write(&summary1, done1.replace("\"completed\"", "\"running\"")).unwrap();
    let mut copied = status(1);
    copied["state"] = "interrupted".into();
    std::fs::write(dir.join("cells").join(&files[3]), copied.to_string()).unwrap();
    let out = run(&["--resume", "--cell", "3"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "tiny_grid/workers=1,optim.lr=0.01: its status names the run {}, which is cell 1's (id {id1}, its env.json says): not resumed here; the cell starts over",
            run1.display()
        )) && !stderr.contains("resuming"),
        "{stderr}"
    );
    std::fs::write(&summary1, done1).unwrap();
    assert!(statuses(&dir).iter().all(|(_, s)| s == "done"));
    assert!(![run1.clone(), now3].contains(&run_of(3)));
    let _ = std::fs::remove_dir_all(&logs);
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
        runner::sweep::execute(
            &dir,
            &cells,
            Default::default(),
            |_, _| None,
            |c, _| {
                if c.index == 1 {
                    panic!("killed while running cell 1");
                }
                Err(runner::sweep::CellEnd {
                    dir: None,
                    message: "failed on purpose".into(),
                    state: runner::sweep::State::Failed,
                    stop_sweep: false,
                })
            },
        )
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

#[test]
fn an_interrupted_grid_cell_is_rerun_by_resume() {
    // By the grid's --resume; and after `runner resume` finished the cell's run by hand,
    // when --resume must take the cell as done (it stopped the grid, marked the cell
    // failed, and the next --resume trained it again from step 1).
    for by_hand in [false, true] {
        interrupted_cell_resumed(by_hand, "-INT", false);
    }
    // kill -9 (out of memory, a lost node): the cell's status already names its run
    // directory, so --resume continues it from its checkpoint (it had no run directory
    // until the run ended, and the cell was trained again from step 1 in a new one).
    interrupted_cell_resumed(false, "-KILL", false);
}

/// A cell continued by `--resume` and stopped again says so, with how to go on, as a cell
/// run from its start does (it ended with nothing said).
#[test]
fn a_resumed_cell_stopped_again_says_how_to_go_on() {
    let dir = tempdir("resumed-cell-again");
    let grid = tiny_recipe(
        &dir,
        "g",
        "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n[checkpoint]\nevery = 50\n",
    );
    let long = [
        "-q",
        "--set",
        "run.epochs=40",
        "--set",
        "data.synthetic.samples=4000",
    ];
    let lines = |run: &Path| {
        std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
    };
    let mut first = runner_cmd();
    first.arg(&grid).args(long);
    let (child, metrics) = crate::common::spawn_until(first, &dir.join("runs"), has_a_line);
    crate::common::send("-TERM", &child);
    expect_exit(&child.wait_with_output().unwrap(), 143);
    let run0 = metrics.parent().unwrap().to_path_buf();
    let at_stop = lines(&run0);
    let mut again = runner_cmd();
    again.arg(&grid).args(long).arg("--resume");
    // Resumed: the run has gone on past its stop.
    let (child, _) = crate::common::spawn_until(again, &dir.join("runs"), |p| {
        p.ends_with("metrics.jsonl")
            && p.parent() == Some(run0.as_path())
            && lines(&run0) > at_stop + 2
    });
    crate::common::send("-TERM", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 143);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "g/optim.lr=0.1: interrupted by SIGTERM; what was recorded is in {}",
            run0.display()
        )) && stderr.contains("continue the grid with:"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same where the grid gained a value before `--resume`: the interrupted cell
/// continues its run, found in the grid's earlier sweep directory (only done cells were
/// found there, and it was trained again from its first step).
#[test]
fn an_interrupted_cell_is_continued_after_the_grid_grew() {
    interrupted_cell_resumed(false, "-INT", true);
    interrupted_cell_resumed(false, "-KILL", true);
}

/// A 2-cell grid stopped by `signal` in its first cell, resumed by `--resume` (with
/// `by_hand`, after `runner resume` finished the cell's run; with `grow`, as a 3-cell grid).
fn interrupted_cell_resumed(by_hand: bool, signal: &str, grow: bool) {
    let dir = tempdir(&format!("sigint-grid-{by_hand}{signal}{grow}"));
    let grid = tiny_recipe(
        &dir,
        "g",
        "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n[checkpoint]\nevery = 50\n",
    );
    let killed = signal == "-KILL";
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
    // Started; killed outright, once it has a checkpoint.
    let ready = |p: &PathBuf| match killed {
        true => p.ends_with("state.json"),
        false => p.ends_with("metrics.jsonl") && std::fs::metadata(p).is_ok_and(|m| m.len() > 0),
    };
    while !walk_files(&dir.join("runs")).iter().any(ready) {
        assert!(
            std::time::Instant::now() < deadline,
            "the grid never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    let cell0 = dir.join("runs/g/optim.lr=0.1");
    let run0 = only_run(&cell0);
    if killed {
        assert_eq!(out.status.code(), None, "killed");
        assert_eq!(states, ["running"], "cell 0 running, cell 1 never started");
        let status = walk_files(&sweep.join("cells"));
        let status = json(&status[0]);
        assert_eq!(
            status["run_dir"].as_str(),
            Some(run0.to_str().unwrap()),
            "{status}"
        );
    } else {
        expect_exit(&out, 130);
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
    }
    if by_hand {
        let out = resume_quietly(&run0);
        expect_exit(&out, 0);
    }
    let (grid, cells) = match grow {
        true => (grown(&grid, "g3.toml", "[0.1, 0.2]", "[0.1, 0.2, 0.3]"), 3),
        false => (grid, 2),
    };
    // --resume continues the interrupted cell (or finds it done), and runs the ones never
    // started; each cell's line is printed.
    let out = runner_cmd()
        .arg(&grid)
        .args(long)
        .arg("--resume")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let sweeps = std::fs::read_dir(dir.join("runs/g/sweeps")).unwrap();
    let sweep = sweeps
        .map(|d| d.unwrap().path())
        .find(|d| *d != sweep || !grow)
        .unwrap();
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, vec!["done"; cells]);
    assert_eq!(only_run(&cell0), run0, "cell 0 trained again");
    assert_eq!(summary(&run0).resumes, 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if by_hand {
        // Finished by hand: done, skipped and said so (it was resumed again, to no end,
        // and counted as run).
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("resumed: 1 cell(s) already done were skipped"),
            "{stderr}"
        );
        assert_eq!(stdout.matches(" steps, ").count(), cells - 1, "{stdout}");
    } else {
        assert!(stdout.contains(&format!("{}", run0.display())), "{stdout}");
        assert_eq!(stdout.matches(" steps, ").count(), cells, "{stdout}");
    }
}

/// A cell stopped with no checkpoint its run can continue from (here every checkpoint is
/// ahead of `metrics.jsonl`, as after a kill between a checkpoint and its metrics line) is
/// started over by `--resume`, and the grid goes on. Before, the grid chose to resume it
/// (a checkpoint was there), `runner resume` refused it as bad input, and that stopped
/// the whole grid with exit 2, every later `--resume` the same.
#[test]
fn a_cell_without_a_usable_checkpoint_starts_over_on_resume() {
    let dir = tempdir("grid-unusable-ckpt");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let long = [
        "-q",
        "--set",
        "run.epochs=20",
        "--set",
        "data.synthetic.samples=4000",
    ];
    let mut cmd = runner_cmd();
    cmd.arg(&grid).args(long);
    let (child, _) = spawn_until(cmd, &dir.join("runs"), has_a_line);
    send("-INT", &child);
    expect_exit(&child.wait_with_output().unwrap(), 130);
    let cell0 = dir.join("runs/g/optim.lr=0.1");
    let run0 = only_run(&cell0);
    assert!(!runner::checkpoint::list(&run0).is_empty(), "no checkpoint");
    std::fs::write(run0.join("metrics.jsonl"), "").unwrap();
    let out = runner_cmd()
        .arg(&grid)
        .args(long)
        .arg("--resume")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["done", "done"]);
    let runs: Vec<PathBuf> = std::fs::read_dir(&cell0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 2, "cell 0 trained again in a new run directory");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has no checkpoint to resume from")
            && stderr.contains("the cell starts over"),
        "{stderr}"
    );
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cell 0: left to process"), "{stderr}");
    // That process is on this host: the cells this one ran meanwhile shared its cores.
    assert!(
        stderr.contains(&format!(
            "warning: process {} pid {} on this host runs a cell of this grid at the same time (locks/0000-{}.lock)",
            host.trim(),
            std::process::id(),
            cells[0].id
        )),
        "{stderr}"
    );
    let states: Vec<(String, String)> = statuses(&sweep.dir);
    assert_eq!(states.len(), 1, "only cell 1 ran: {states:?}");
    assert!(states[0].0.starts_with("0001-"));
    // A lock whose process is gone is stale: --resume takes it over and runs cell 0.
    std::fs::write(&lock, format!("{} 4000000\n", host.trim())).unwrap();
    let out = resume_grid_quietly(&grid);
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

/// "2:30" meant as hours is 2 min 30 s to Slurm: said, though sbatch takes it. A good limit
/// writes the script; an `extra` that overrides one of its lines writes nothing.
#[test]
fn slurm_time_read_as_minutes_is_warned_and_overriding_extras_are_refused() {
    let dir = tempdir("slurm-time");
    let grid = |name: &str, slurm: &str| {
        tiny_recipe(
            &dir,
            name,
            &format!("[sweep]\n\"optim.lr\" = [0.1, 0.2]\n[slurm]\n{slurm}\n"),
        )
    };
    let short = grid(
        "short",
        "time = \"2:30\"\npartition = \"gpu a\"\naccount = \"x#y\"",
    );
    let out = runner_cmd()
        .args(["sweep", "--slurm"])
        .arg(&short)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "slurm.time: \"2:30\" is 2 min 30 s: Slurm reads one colon as minutes:seconds"
        ) && err.contains("for 2 h 30 min write \"2:30:00\""),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let script = stdout
        .lines()
        .find_map(|l| l.split_once(" array task(s) in "))
        .map(|(_, p)| std::fs::read_to_string(p).unwrap())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(script.contains("#SBATCH --time=2:30\n"), "{script}");
    // Quoted as sbatch reads a directive's value: a space split it, a `#` cut it.
    assert!(
        script.contains("#SBATCH --partition=\"gpu a\"\n")
            && script.contains("#SBATCH --account=\"x\\#y\"\n"),
        "{script}"
    );

    let array = grid(
        "array",
        "extra = [\"-a 0-99\", \"--outp=/dev/null\", \"--no-requeue\"]",
    );
    let out = runner_cmd()
        .args(["sweep", "--slurm"])
        .arg(&array)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("slurm.extra: \"-a 0-99\" sets --array, which the job script already sets")
            && err.contains("\"--outp=/dev/null\" may be read as --output")
            // Never written by the script: it undoes the --requeue that is.
            && err.contains("\"--no-requeue\" sets --no-requeue, which undoes the --requeue the job script writes for slurm.requeue = true"),
        "{err}"
    );
    assert!(
        !dir.join("runs/array").exists(),
        "written for a refused recipe"
    );
    // What the script does not write is the user's to give: a signal of its own without
    // requeueing, a dependency on another job.
    let own = grid(
        "own",
        "requeue = false\nextra = [\"--signal=B:USR1@300\", \"--dependency=afterok:1234\"]",
    );
    let out = runner_cmd()
        .args(["sweep", "--slurm"])
        .arg(&own)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let _ = std::fs::remove_dir_all(&dir);
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
    // --cell and --shard choose what this process runs, not what an array runs.
    for flag in [["--cell", "1"], ["--shard", "1/2"]] {
        let out = runner_cmd()
            .args(["sweep", "--slurm"])
            .args(flag)
            .arg(&grid)
            .output()
            .unwrap();
        expect_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("with --slurm every cell is an array task"),
            "{err}"
        );
    }
    // --cell and --shard choose cells two ways: refused, not an empty selection.
    let out = runner_cmd()
        .arg(&grid)
        .args(["--cell", "1", "--shard", "1/2"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    assert!(!dir.join("runs").exists(), "state written before the error");
    // A shard past the cells holds none: said (a script may start more workers than
    // there are cells, so not an error), where it ran nothing without a word.
    let out = runner_cmd()
        .arg(&grid)
        .args(["--shard", "3/3", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "--shard 3/3 holds no cell: the grid has 2 (cells 0 to 1), and shard 3 would start at cell 2"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir.join("runs"));
    // sbatch writes no log to a path with a backslash: refused before anything is written.
    let odd = dir.join("a\\b");
    let grid = tiny_recipe(&dir, "g2", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let out = runner_cmd()
        .args(["sweep", "--slurm", "--set"])
        .arg(format!("log.dir='{}'", odd.display()))
        .arg(&grid)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a path with a backslash") && err.contains("`log.dir`"),
        "{err}"
    );
    assert!(!odd.exists(), "state written before the error");
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
    let tag = cells[0].name.strip_prefix("g/cell-").unwrap_or_default();
    assert!(
        tag.len() == 8 && tag.chars().all(|c| c.is_ascii_hexdigit()),
        "{}",
        cells[0].name
    );
}

/// A value added to an axis changes the grid's id (a new sweep directory) but not the
/// ids of the cells it had: `--resume` finds those done in the earlier sweep directory
/// and runs only the new ones (it ran them all again, without a word).
#[test]
fn resume_after_an_axis_gained_a_value_runs_only_the_new_cells() {
    let dir = tempdir("axis-gained");
    let two = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let out = runner_cmd().arg(&two).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    let three = grown(&two, "g3.toml", "[0.1, 0.2]", "[0.1, 0.2, 0.3]");
    resume_finds_two_cells_done_elsewhere(&three, "a third value");
    for lr in ["0.1", "0.2", "0.3"] {
        only_run(&dir.join(format!("runs/g/optim.lr={lr}")));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--resume` finds the done cells of a grid whose `log.dir` is relative from another
/// working directory, and after the log directory was moved: status files held the run
/// directory as the first process named it (relative to its working directory), so
/// both re-ran every done cell. A status file of that older kind is still read.
#[test]
fn resume_finds_done_cells_from_another_directory_and_after_a_move() {
    let dir = tempdir("resume-elsewhere");
    let recipe = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let grid = |cwd: &Path, logs: &str, resume: bool| {
        let mut c = runner_cmd();
        c.current_dir(cwd)
            .arg(&recipe)
            .args(["-q", "--set", &format!("log.dir=\"{logs}\"")]);
        if resume {
            c.arg("--resume");
        }
        let out = c.output().unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let skipped = "resumed: 2 cell(s) already done were skipped";
    grid(&dir, "logs", false);
    let stderr = grid(&sub, "../logs", true);
    assert!(stderr.contains(skipped), "from another directory: {stderr}");
    std::fs::rename(dir.join("logs"), dir.join("moved")).unwrap();
    let stderr = grid(&dir, "moved", true);
    assert!(stderr.contains(skipped), "after a move: {stderr}");
    // As an older runner wrote them: relative to the directory it ran in.
    let cells = only_run(&dir.join("moved/g/sweeps")).join("cells");
    for f in std::fs::read_dir(&cells).unwrap() {
        let f = f.unwrap().path();
        let text = std::fs::read_to_string(&f).unwrap();
        let abs = format!("{}/", dir.join("logs").display());
        assert!(text.contains(&abs), "not absolute: {text}");
        std::fs::write(&f, text.replace(&abs, "logs/")).unwrap();
    }
    let stderr = grid(&sub, "../moved", true);
    assert!(
        stderr.contains(skipped),
        "relative, from another directory: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same where the cells' `key=value` names are too long for a directory and the
/// cells are named by a tag of their values (`cell-1a2b3c4d`): the index moves when a value
/// is added before theirs, their ids do not, so `--resume` still skips the cells done (it
/// ran them all again: the id hashed the index-named name). Nor do their names move: named
/// by index, the new cell took the name `cell-0000` of a done one, and one directory held
/// the runs of two cells.
#[test]
fn resume_after_an_axis_gained_a_value_skips_done_cells_named_by_index() {
    let dir = tempdir("axis-gained-long");
    let long = "\"run.max_loss\" = [10000.0]\n\"run.stop_on_divergence\" = [true]\n\"loader.shuffle\" = [true]\n\"optim.weight_decay\" = [0.0]\n\"run.warmup_steps\" = [1]\n\"run.epochs\" = [1]\n\"loader.drop_last\" = [false]\n\"optim.momentum\" = [0.0]\n\"optim.nesterov\" = [false]\n";
    let two = tiny_recipe(
        &dir,
        "g",
        &format!("[sweep]\n\"optim.lr\" = [0.1, 0.2]\n{long}"),
    );
    let out = runner_cmd().arg(&two).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    let cell_dirs = || -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = std::fs::read_dir(dir.join("runs/g"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("cell-")
            })
            .map(|p| {
                let runs = std::fs::read_dir(&p).unwrap().count();
                (p.file_name().unwrap().to_string_lossy().into_owned(), runs)
            })
            .collect();
        v.sort();
        v
    };
    let before = cell_dirs();
    assert_eq!(before.len(), 2, "{before:?}");
    // A grid run before the tags (2026-12-06) named these cells by index, and their ids
    // hashed that name: each cell still knows that id, so --resume finds them done.
    let checked = runner::sweep::check(&two, &[], &Machine::cpu_only(), 256).unwrap();
    for (i, (cell, plan)) in checked.cells.iter().zip(&checked.plans).enumerate() {
        let mut named = plan.resolved.clone();
        named.name = Some(format!("g/cell-{i:04}"));
        let old = runner::sweep::cell_id(&named, &cell.loaded.recipe);
        assert!(
            cell.earlier_ids.contains(&old),
            "cell {i}: {old} not among {:?}",
            cell.earlier_ids
        );
    }
    let three = grown(&two, "g3.toml", "[0.1, 0.2]", "[0.05, 0.1, 0.2]");
    resume_finds_two_cells_done_elsewhere(&three, "a value before the others");
    let after = cell_dirs();
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(after.iter().all(|(_, runs)| *runs == 1), "{after:?}");
    assert!(
        before.iter().all(|b| after.contains(b)),
        "{before:?} {after:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runner report` orders a grid that grew as the grid's own table does: the newest
/// version's cells in its order (the baseline its first), where it had followed whichever
/// sweep directory's name sorted first, so a value added before the others came last and
/// the baseline changed.
#[test]
fn report_orders_a_grown_grid_as_the_grids_own_table() {
    let dir = tempdir("grown-order");
    let one = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.2]\n");
    expect_exit(&runner_cmd().arg(&one).arg("-q").output().unwrap(), 0);
    // (The sweep directories are ordered by when each was made.)
    std::thread::sleep(std::time::Duration::from_millis(50));
    let two = grown(&one, "g2.toml", "[0.2]", "[0.1, 0.2]");
    let grid = resume_grid_quietly(&two);
    expect_exit(&grid, 0);
    let report = runner_cmd()
        .arg("report")
        .arg(dir.join("runs/g"))
        .output()
        .unwrap();
    expect_exit(&report, 0);
    // Each table's rows: the name and the last column.
    let rows = |out: &std::process::Output| -> Vec<(String, String)> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            // (Not the runs' summary lines, `g/...: 4 steps, ...`.)
            .filter(|l| l.starts_with("g/") && !l.split_whitespace().next().unwrap().ends_with(':'))
            .map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                (cols[0].to_string(), cols[cols.len() - 1].to_string())
            })
            .collect()
    };
    let want = rows(&grid);
    assert_eq!(
        want.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["g/optim.lr=0.1", "g/optim.lr=0.2"],
        "{}",
        String::from_utf8_lossy(&grid.stdout)
    );
    assert_eq!(want[0].1, "baseline");
    assert_eq!(
        rows(&report),
        want,
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid's later cells count their start-up from their own start: `startup_s` counted from
/// the process's start gave the third cell of a grid the two before it as its start-up,
/// more than its whole run, where the report shows a cold kernel cache.
#[test]
fn a_later_cells_start_up_is_its_own() {
    let dir = tempdir("grid-startup");
    let grid = tiny_recipe(&dir, "su", "[sweep]\n\"optim.lr\" = [0.1, 0.2, 0.3]\n");
    let out = runner_cmd()
        .arg(&grid)
        .args(["-q", "--set", "data.synthetic.samples=2000"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    for lr in ["0.2", "0.3"] {
        let run = only_run(&dir.join(format!("runs/su/optim.lr={lr}")));
        let s = summary(&run);
        let startup = s.startup_s.unwrap();
        assert!(
            startup < s.wall_s,
            "cell lr={lr}: start-up {startup} s, its whole run {} s",
            s.wall_s
        );
    }
}

/// A grid stopped by a signal before its cell's first step is done marks the cell
/// interrupted (it stayed `running`) and says how to go on: the grid with `--resume`, not
/// "run the recipe again".
#[test]
fn a_grid_stopped_before_its_first_step_marks_the_cell_and_says_resume() {
    let dir = tempdir("grid-sigint-start");
    let grid = tiny_recipe(&dir, "gs", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let mut cmd = runner_cmd();
    cmd.arg(&grid).arg("-q").args(SLOW_FIRST_STEP);
    let (child, _) = spawn_until(cmd, &dir.join("runs"), says_running);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    send("-INT", &child);
    let out = child.wait_with_output().unwrap();
    expect_exit(&out, 130);
    let sweep = only_run(&dir.join("runs/gs/sweeps"));
    let states: Vec<String> = statuses(&sweep).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        states,
        ["interrupted"],
        "cell 0 interrupted, cell 1 never started"
    );
    // Exiting without unwinding, it lets go of the cell's lock itself.
    let locks: Vec<_> = std::fs::read_dir(sweep.join("locks")).unwrap().collect();
    assert!(locks.is_empty(), "left behind: {locks:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("before the first step was done"),
        "{stderr}"
    );
    // The command given is this one, with its --set overrides (without them, --resume
    // expanded another grid and trained its cells from the start), as a shell reads it.
    let command = stderr
        .lines()
        .find_map(|l| l.split_once("it starts over with: "))
        .map(|(_, c)| c.to_string())
        .unwrap_or_else(|| panic!("{stderr}"));
    let words = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf '%s\\n' {command}"))
        .output()
        .unwrap();
    let words: Vec<String> = String::from_utf8_lossy(&words.stdout)
        .lines()
        .map(String::from)
        .collect();
    let mut expected = vec![
        env!("CARGO_BIN_EXE_runner").to_string(),
        grid.display().to_string(),
    ];
    expected.extend(SLOW_FIRST_STEP.iter().map(|s| s.to_string()));
    expected.extend(["-q".into(), "--resume".into()]);
    assert_eq!(words, expected, "{command}");
}

/// Every finding of a grid at once: a misspelt sweep key does not hide a bad value on
/// another axis (it did: fixing the key brought the next error, a run later).
#[test]
fn a_bad_axis_does_not_hide_the_other_axes_findings() {
    let dir = tempdir("grid-all-findings");
    let stderr = invalid_quickstart_grid(
        &dir,
        "\"loader.batch_size\" = [0, 16]\n\"optim.lrr\" = [0.1]",
    );
    assert!(
        stderr.contains("g.toml:3:24: loader.batch_size: 0 samples per batch")
            && stderr.contains("sweep.optim.lrr: `optim.lrr` is not a recipe key")
            && stderr.contains("2 errors in"),
        "{stderr}"
    );
}

/// `--set` narrows a grid's axis whichever way the recipe writes it: the shipped grids
/// write their axes quoted (`"loader.workers" = [0, 2]`), and `--set
/// 'sweep."loader.workers"=[0]'` (or `sweep.loader.workers`) was refused as "the same key
/// is swept twice". The axis keeps its place, so the cells keep their order.
#[test]
fn set_narrows_a_grid_axis_written_quoted() {
    let grid = root().join("recipes/article_grid.toml");
    let show = |sets: &[&str]| {
        let out = with_sets("show", &grid, sets);
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let cells = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("article_grid/"))
            .map(|l| l.split("article_grid/").nth(1).unwrap().to_string())
            .collect()
    };
    let all = cells(&show(&[]));
    assert_eq!(all.len(), 8, "{all:?}");
    for set in ["sweep.\"loader.workers\"=[0]", "sweep.loader.workers=[0]"] {
        let narrowed = cells(&show(&[set]));
        let expected: Vec<String> = all
            .iter()
            .filter(|c| c.contains(",workers=0,"))
            .cloned()
            .collect();
        assert_eq!(narrowed, expected, "{set}");
    }
    // A value set there that is refused is found in the `--set`, not at the place of the
    // file's value it replaced (which the error pointed at, caret and all).
    for set in [
        "sweep.\"loader.workers\"=[0, 5000]",
        "sweep.loader.workers=[0, 5000]",
    ] {
        let out = with_sets("validate", &grid, &[set]);
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("error: --set:")
                && stderr.contains("5000")
                && stderr
                    .lines()
                    .filter(|l| l.starts_with("error:"))
                    .all(|l| l.starts_with("error: --set:")),
            "{set}: {stderr}"
        );
    }
    // An axis the recipe does not sweep is added, as before.
    let added = cells(&show(&["sweep.optim.lr=[0.1, 0.2]"]));
    assert_eq!(added.len(), 16, "{added:?}");
    // As a table, in each of its forms, the axis is replaced where it stands too.
    for set in [
        "sweep={\"loader.workers\"=[0]}",
        "sweep={loader={workers=[0]}}",
        "sweep.loader={workers=[0]}",
    ] {
        let narrowed = cells(&show(&[set]));
        assert_eq!(narrowed.len(), 4, "{set}: {narrowed:?}");
        assert!(
            narrowed.iter().all(|c| c.contains(",workers=0,")),
            "{set}: {narrowed:?}"
        );
    }
    // `~` removes the quoted axis: half the cells, none of them named by workers.
    let removed = cells(&show(&["~sweep.\"loader.workers\""]));
    assert_eq!(removed.len(), 4, "{removed:?}");
    assert!(
        !removed.iter().any(|c| c.contains("workers=")),
        "{removed:?}"
    );
}

/// A copy of the grid `recipe` beside it, named `name`, with its axis values `from`
/// written as `to` (the grid grown).
fn grown(recipe: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(recipe).unwrap();
    assert!(text.contains(from), "{from} is not in {}", recipe.display());
    let grown = recipe.with_file_name(name);
    std::fs::write(&grown, text.replace(from, to)).unwrap();
    grown
}

/// `runner GRID -q --resume` skips the grid's two cells, found done in another sweep
/// directory of the grid (`what` says which case, in a failure).
fn resume_finds_two_cells_done_elsewhere(grid: &Path, what: &str) {
    let out = runner_cmd()
        .arg(grid)
        .args(["-q", "--resume"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "resumed: 2 cell(s) already done were skipped (2 of them done in an earlier sweep"
        ),
        "{what}: {stderr}"
    );
}

/// A cell's ids are pinned: the current one, the one of `c72e435` (2026-12-07, before
/// `backend.matmul`), the one of `8ea179d` (2026-12-06, before
/// `backend.fusion` took `"auto"` for its default), the one of `f9d7070` (2026-12-05,
/// before `backend.norm_sums`), and the one the runner of `04422a2` (before
/// `backend.conv_split`) made for the same recipe, read from the sweep directory that
/// binary wrote. A key added to the format changes every current id (the resolved recipe
/// has one more line), and so does a default changed; `CHANGES` in `src/sweep/mod.rs`
/// must then name it, so that `--resume` still finds the cells done
/// before the upgrade.
#[test]
fn cell_ids_of_earlier_versions_are_the_ids_those_made() {
    let dir = tempdir("earlier-ids");
    let grid = dir.join("g.toml");
    std::fs::write(
        &grid,
        "name = \"g\"\nseed = 1\n[backend]\nkind = \"cpu\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n[loader]\nbatch_size = 8\n[run]\nmax_steps = 2\neval = \"never\"\n[sweep]\n\"optim.lr\" = [0.1, 0.2]\n",
    )
    .unwrap();
    let cells = runner::sweep::check(&grid, &[], &Machine::cpu_only(), 256)
        .unwrap()
        .cells;
    let ids: Vec<(&str, Vec<&str>)> = cells
        .iter()
        .map(|c| {
            let earlier = c.earlier_ids.iter().map(String::as_str).collect();
            (c.id.as_str(), earlier)
        })
        .collect();
    // The last: before 2026-12-03, with `[slurm]` (its `cpus_per_task = 2` written out).
    assert_eq!(
        ids,
        [
            (
                "1135a9379c1d",
                vec![
                    "baba62cee031",
                    "66b6d824fb4b",
                    "131e76f37e67",
                    "5cfe3076a149",
                    "c1af72c340fd"
                ]
            ),
            (
                "674cb2568618",
                vec![
                    "3ad7febc0801",
                    "6a092957126b",
                    "cf3827f80486",
                    "c0dfae561365",
                    "c17c67318d50"
                ]
            )
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What changes nothing that runs (`[slurm]`, `description`, `backend.cache_dir`) is not
/// part of a cell's id: a grid resubmitted with more time (`slurm.time`) finds its cells
/// done. Before, each such change was a new grid, and `--resume` trained every cell
/// again. Cells recorded under the ids of earlier versions are found done too.
#[test]
fn resume_with_other_job_resources_trains_no_done_cell_again() {
    let dir = tempdir("slurm-resume");
    let grid = tiny_recipe(
        &dir,
        "g",
        "[slurm]\ntime = \"04:00:00\"\n[sweep]\n\"optim.lr\" = [0.1, 0.2]\n",
    );
    let out = runner_cmd().arg(&grid).arg("-q").output().unwrap();
    expect_exit(&out, 0);
    for set in [
        "slurm.time=\"02:00:00\"",
        "description=\"longer jobs\"",
        "backend.cache_dir=\"kernels\"",
    ] {
        let out = runner_cmd()
            .arg(&grid)
            .args(["-q", "--resume", "--set", set])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("resumed: 2 cell(s) already done were skipped"),
            "{set}: {stderr}"
        );
    }
    // A sweep directory of an earlier version: its cells' statuses under their old ids.
    // The newest earlier ids are those before `backend.matmul` existed, before
    // `backend.fusion` took `"auto"` for `true`, and before `backend.norm_sums` and
    // `backend.conv_split` existed (every cell here has
    // their defaults); the oldest held `[slurm]` (a recipe without it, description or
    // cache_dir keeps its ids), and none of the keys added since.
    let cells = runner::sweep::check(&grid, &[], &Machine::cpu_only(), 256)
        .unwrap()
        .cells;
    let sweeps = dir.join("runs/g/sweeps");
    for (version, pick) in [
        ("before matmul", 0),
        ("before fusion = \"auto\"", 1),
        ("before norm_sums", 2),
        ("before conv_split", 3),
        ("before 2026-12-03", 5),
    ] {
        let current = only_run(&sweeps);
        let old = sweeps.join("from-an-earlier-version");
        std::fs::rename(&current, &old).unwrap();
        for c in &cells {
            assert_eq!(c.earlier_ids.len(), 6, "{:?}", c.earlier_ids);
            assert!(!c.earlier_ids.contains(&c.id));
            std::fs::rename(
                old.join(format!("cells/{:04}-{}.json", c.index, c.id)),
                old.join(format!("cells/{:04}-{}.json", c.index, c.earlier_ids[pick])),
            )
            .unwrap();
        }
        resume_finds_two_cells_done_elsewhere(&grid, version);
        std::fs::remove_dir_all(&old).unwrap();
    }
    for lr in ["0.1", "0.2"] {
        only_run(&dir.join(format!("runs/g/optim.lr={lr}")));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid whose cell failed says so after its table, with the first failure: the cell's own
/// error had scrolled away above the other cells' output, and only the exit code told.
#[test]
fn a_grid_with_a_failed_cell_says_so_after_its_table() {
    let dir = tempdir("grid-failed-cell");
    let grid = tiny_recipe(&dir, "g", "[sweep]\n\"optim.lr\" = [0.1, 1e9]\n");
    let out = runner_cmd().arg(&grid).arg("-q").output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rfind(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        last.contains("g.toml: 1 cell(s) failed, the first (cell 1): ")
            && last.contains("diverged at step"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A two-cell grid `g` over the long Fashion-MNIST recipe (a checkpoint every 5 steps) in
/// `dir`, its cell 0 run with `env` and stopped by SIGINT after 12 steps; the grid.
fn cell0_interrupted(dir: &Path, env: &[(&str, &str)]) -> PathBuf {
    let grid = long_recipe(
        dir,
        "g",
        "[checkpoint]\nevery = 5\n[sweep]\n\"optim.lr\" = [0.05, 0.1]\n",
    );
    let mut cmd = runner_cmd();
    cmd.arg(&grid)
        .args(["-q", "--cell", "0"])
        .envs(env.iter().copied());
    let (child, _) = spawn_until(cmd, &dir.join("runs"), |p| {
        p.ends_with("metrics.jsonl")
            && std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() >= 12)
    });
    send("-INT", &child);
    expect_exit(&child.wait_with_output().unwrap(), 130);
    grid
}

/// A cell whose run cannot be resumed (here its recipe.toml was edited) is said, and kept
/// interrupted with its run: the next --resume, once that is put right, continues it from
/// its checkpoint. Marked failed, the next --resume started it over in a new run directory
/// and left the checkpoint behind (a grid continued from another clone, whose run named
/// the first clone's data by absolute path).
#[test]
fn a_cell_whose_resume_is_refused_keeps_its_run_for_the_next_resume() {
    let dir = tempdir("cell-refused");
    let grid = cell0_interrupted(&dir, &[]);
    let cell0 = |extra: &[&str]| {
        let mut c = runner_cmd();
        c.arg(&grid).args(["-q", "--cell", "0"]).args(extra);
        c
    };
    let runs: Vec<PathBuf> = walk_files(&dir.join("runs"))
        .into_iter()
        .filter(|p| p.ends_with("recipe.toml"))
        .collect();
    let [recipe] = &runs[..] else {
        panic!("one run: {runs:?}")
    };
    let run = recipe.parent().unwrap().to_path_buf();
    let text = std::fs::read_to_string(recipe).unwrap();
    std::fs::write(recipe, format!("{text}# edited\n")).unwrap();
    let out = cell0(&["--resume"]).output().unwrap();
    expect_exit(&out, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("was changed after") && stderr.contains("kept, with its checkpoint"),
        "{stderr}"
    );
    let sweep = only_run(&dir.join("runs/g/sweeps"));
    let states = statuses(&sweep);
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0].1, "interrupted", "{states:?}");
    // Put right: continued from its checkpoint, in its own directory.
    std::fs::write(recipe, &text).unwrap();
    let out = cell0(&["--resume"]).output().unwrap();
    expect_exit(&out, 0);
    assert_eq!(statuses(&sweep)[0].1, "done");
    let s = summary(&run);
    assert_eq!((s.resumes, s.status), (1, RunStatus::Completed), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid cell's id names its data by path: `--resume` after the file at that path
/// changed (a git pull, another clone's file) runs the cells again, saying why, rather
/// than skip them as done on other data.
#[test]
fn resume_runs_again_the_cells_done_on_other_data() {
    let dir = tempdir("resume-other-data");
    let (grid, train) = mlp_over_a_copy(&dir, "g", "train", "[sweep]\n\"optim.lr\" = [0.1, 0.2]\n");
    let run = |extra: &[&str]| {
        runner_cmd()
            .arg(&grid)
            .arg("-q")
            .args(extra)
            .output()
            .unwrap()
    };
    expect_exit(&run(&[]), 0);
    let out = run(&["--resume"]);
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 cell(s) already done were skipped"));
    // The same path, other records: the first 100 images.
    cut_records(&train, 100);
    let out = run(&["--resume"]);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("trained on other data").count(),
        2,
        "{stderr}"
    );
    assert!(!stderr.contains("already done were skipped"), "{stderr}");
    let ran = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" steps, median "))
        .count();
    assert_eq!(ran, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid's `--resume` runs its cells in one process: a resumed cell takes the thread
/// count its run started with, and a later cell its own (rayon's global pool is built
/// once, so the pinned count was every later cell's, or a resumed cell ran on the
/// process's count and drifted from its uninterrupted twin).
#[test]
fn a_grid_resume_runs_each_cell_on_its_own_thread_count() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        return;
    }
    let dir = tempdir("grid-threads");
    let grid = cell0_interrupted(&dir, &[("RAYON_NUM_THREADS", "1")]);
    let out = resume_grid_quietly(&grid);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("CPU threads"), "{stderr}");
    let cell0 = json(&only_run(&dir.join("runs/g/optim.lr=0.05")).join("env.json"));
    assert_eq!(cell0["threads"].as_u64(), Some(1), "{cell0}");
    assert_eq!(cell0["resumes"][0]["threads"].as_u64(), Some(1), "{cell0}");
    let cell1 = json(&only_run(&dir.join("runs/g/optim.lr=0.1")).join("env.json"));
    assert_eq!(cell1["threads"].as_u64(), Some(cores as u64), "{cell1}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid's folder copied to another log directory (a colleague's clone, on the same file
/// system) and resumed there continues the copy's runs: it resumed the original's, in the
/// other folder, whose cell files name them by absolute path, and left the copy's cell
/// interrupted.
#[test]
fn a_copied_grid_resumes_its_own_runs_not_the_original_s() {
    let dir = tempdir("copied-grid");
    let grid = cell0_interrupted(&dir, &[]);
    copy_dir(&dir.join("runs"), &dir.join("copy"));
    let out = runner_cmd()
        .arg(&grid)
        .args(["-q", "--resume", "--set"])
        .arg(format!("log.dir=\"{}\"", dir.join("copy").display()))
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let original = only_run(&dir.join("runs/g/optim.lr=0.05"));
    let copy = only_run(&dir.join("copy/g/optim.lr=0.05"));
    assert_eq!(summary(&original).status, RunStatus::Interrupted);
    assert_eq!(summary(&copy).status, RunStatus::Completed);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains(&*dir.join("runs").to_string_lossy()),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid over `backend.threads` runs each cell on its count, bitwise as the same recipe
/// run alone with that count. Every cell ran on the first cell's count (rayon's global
/// pool is built once per process) and recorded its own: the `threads=2` cell was the
/// `threads=1` one, bit for bit, under another label.
#[test]
fn a_grid_over_cpu_threads_runs_each_cell_on_its_count() {
    let dir = tempdir("grid-over-threads");
    let grid = long_recipe(&dir, "g", "[sweep]\n\"backend.threads\" = [1, 2]\n");
    let sets = ["--set", "run.max_steps=12"];
    let out = runner_cmd()
        .arg(&grid)
        .arg("-q")
        .args(sets)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let alone = runner_cmd()
        .arg(&grid)
        .args(["-q", "--cell", "1", "--set"])
        .arg(format!("log.dir=\"{}\"", dir.join("alone").display()))
        .args(sets)
        .output()
        .unwrap();
    expect_exit(&alone, 0);
    for (cell, threads) in [("threads=1", 1), ("threads=2", 2)] {
        let env = json(&only_run(&dir.join("runs/g").join(cell)).join("env.json"));
        assert_eq!(env["threads"].as_u64(), Some(threads), "{cell}: {env}");
    }
    let in_grid = only_run(&dir.join("runs/g/threads=2"));
    let on_its_own = only_run(&dir.join("alone/g/threads=2"));
    assert_eq!(losses(&in_grid), losses(&on_its_own));
    assert_eq!(
        json(&in_grid.join("summary.json"))["weights_sha256"],
        json(&on_its_own.join("summary.json"))["weights_sha256"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A done cell of an earlier version of the grid (an axis has gained a value since) is
/// taken over by `--resume` only where its run trained on the data the recipe names now:
/// adopted on other data, it was skipped as done.
#[test]
fn resume_adopts_an_earlier_sweep_s_done_cell_only_on_the_same_data() {
    let dir = tempdir("adopt-other-data");
    let (grid, train) = mlp_over_a_copy(&dir, "g", "train", "[sweep]\n\"optim.lr\" = [0.1]\n");
    let run = || resume_grid_quietly(&grid);
    expect_exit(&run(), 0);
    // Another value on the axis: a new sweep directory, which adopts the done cell...
    let text = std::fs::read_to_string(&grid).unwrap();
    let wider = text.replace("[0.1]", "[0.1, 0.2]");
    assert_ne!(wider, text);
    std::fs::write(&grid, &wider).unwrap();
    // ...unless the data changed meanwhile.
    cut_records(&train, 100);
    let out = run();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("trained on other data").count(),
        1,
        "{stderr}"
    );
    let ran = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" steps, median "))
        .count();
    assert_eq!(ran, 2, "{stderr}");
    // Both done now, on this data: nothing runs again.
    let out = run();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 cell(s) already done were skipped"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An axis of more values than any grid may have cells is refused at once: its values were
/// compared pair by pair first (100,000 took minutes, under the default cap of 256 cells).
#[test]
fn an_axis_longer_than_any_grid_is_refused_before_its_values_are_compared() {
    let dir = tempdir("sweep-long-axis");
    let grid = dir.join("g.toml");
    let seeds: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    std::fs::write(
        &grid,
        format!(
            "extends = {:?}\n[sweep]\nseed = [{}]\n",
            root().join("recipes/quickstart.toml").display().to_string(),
            seeds.join(", ")
        ),
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&grid).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sweep.seed: 100000 values: more than any grid may have cells (10000)"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A warning of some cells of a grid names those cells, whether or not other cells fail
/// (it named the cells that also failed, or, with none failing, no cells at all, as if of
/// every cell); `show --cell N` says that cell's warnings alone.
#[test]
fn a_grid_warning_names_the_cells_it_holds_in() {
    let grid = root().join("recipes/article_grid.toml");
    let of_step_cells = "note: in 4 of the 8 cells: 4 (cleanup.every=step,workers=0,normalize.on=host), 5 (cleanup.every=step,workers=0,normalize.on=device), 6 (cleanup.every=step,workers=2,normalize.on=host) and 1 more";
    let ok = runner_cmd().arg("validate").arg(&grid).output().unwrap();
    expect_exit(&ok, 0);
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains(of_step_cells), "{err}");
    let failing = runner_cmd()
        .arg("validate")
        .arg(&grid)
        .args(["--set", "loader.persistent_workers=true"])
        .output()
        .unwrap();
    expect_exit(&failing, 2);
    let err = String::from_utf8_lossy(&failing.stderr);
    assert!(err.contains(of_step_cells), "{err}");
    let show = |cell: &str| {
        let out = runner_cmd()
            .arg("show")
            .arg(&grid)
            .args(["--cell", cell])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(
        !show("0").contains("cleanup.actions"),
        "cell 0 cleans nothing up"
    );
    let five = show("5");
    assert!(
        five.contains("warning:") && five.contains("cleanup.actions") && !five.contains("note: in"),
        "{five}"
    );
}
