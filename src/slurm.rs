//! Slurm job arrays for grids: the `sbatch` script (one array task per cell or shard,
//! resources from `[slurm]`, the values checked by validation and quoted here), the
//! command each task runs, the preemption plumbing (`--signal`, forwarding SIGTERM,
//! `scontrol requeue`), the warm-up job that compiles the grid's kernels before the array
//! starts, and submission. The grid itself is `sweep`'s.

use std::path::{Path, PathBuf};

use crate::recipe::schema;
use crate::sweep::{Checked, SweepDir};

/// What [`write`] wrote for a grid.
pub struct Scripts {
    /// The job array's script.
    pub array: PathBuf,
    pub tasks: usize,
    /// The warm-up job's script (`slurm.warmup`), to run before the array.
    pub warmup: Option<PathBuf>,
}

/// Slurm's default `MaxArraySize`: array indices 0 to 1000.
pub const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;

/// Writes `<sweep dir>/slurm.sbatch` for a grid: every task runs this binary on the grid
/// with `--resume` and its `--cell` (or `--shard` with `shards`); and, where `[slurm]
/// warmup` asks for it (by default when tasks get a GPU), `<sweep dir>/warmup.sbatch`: one
/// task of the same resources running `runner warmup --jobs <cpus_per_task>` on the whole grid. The tasks get the
/// same `--set` overrides and `--max-cells` as this command.
pub fn write(
    c: &Checked,
    sets: &[String],
    max_cells: usize,
    shards: Option<usize>,
) -> Result<Scripts, String> {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("runner"));
    let workdir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let root = &c.plans[0].log.dir;
    let dir = SweepDir::open(root, &c.base, &c.path, &c.cells).map_err(|e| {
        format!(
            "error: cannot create the sweep directory under {}: {e}",
            root.display()
        )
    })?;
    let recipe_abs = std::fs::canonicalize(&c.path).unwrap_or_else(|_| c.path.clone());
    // What the grid was checked with: without them, each task would expand another grid,
    // or refuse one over the default cap.
    let with_sets = |mut command: Vec<String>| {
        command.extend(crate::sweep::check_args(sets, max_cells));
        command
    };
    let (exe, recipe_abs) = (exe.display().to_string(), recipe_abs.display().to_string());
    // The grid's id too: each task refuses another grid (the recipe edited while the array
    // waited in the queue, or before a requeue), whose cells its index would name.
    let mut command = with_sets(vec![
        exe.clone(),
        "sweep".into(),
        recipe_abs.clone(),
        "--resume".into(),
        "--quiet".into(),
        "--grid".into(),
        crate::sweep::grid_id(&c.cells),
    ]);
    let tasks = match shards {
        Some(k) if k >= 1 => {
            command.extend(["--shard".into(), format!("$((SLURM_ARRAY_TASK_ID+1))/{k}")]);
            k
        }
        _ => {
            command.extend(["--cell".into(), "$SLURM_ARRAY_TASK_ID".into()]);
            c.cells.len()
        }
    };
    let slurm = &c.cells[0].loaded.recipe.slurm;
    let job = format!("runner-{}", c.base.replace('/', "-"));
    // sbatch takes a relative `--output` from the directory it is run in (the script's `cd`
    // comes later): with the default log.dir, the script resubmitted from elsewhere sent
    // its tasks' logs to a folder that does not exist.
    let logs = workdir.join(&dir.dir);
    let save = |name: &str, text: String| {
        let path = dir.dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("error: {}: {e}", path.display()))?;
        Ok::<_, String>(path)
    };
    let array = save(
        "slurm.sbatch",
        script(slurm, &job, tasks, &logs, &workdir, &command),
    )?;
    let warmup = if slurm.warmup.unwrap_or(slurm.gpus_per_task > 0) {
        // The task's cores warm that many kernel families at once (compiling is a core's
        // work per process; the families of a grid share few kernels).
        let jobs = slurm.cpus().max(1).to_string();
        let command = with_sets(vec![
            exe,
            "warmup".into(),
            "--jobs".into(),
            jobs,
            "--grid".into(),
            crate::sweep::grid_id(&c.cells),
            recipe_abs,
        ]);
        let text = warmup_script(slurm, &job, &logs, &workdir, &command);
        Some(save("warmup.sbatch", text)?)
    } else {
        None
    };
    Ok(Scripts {
        array,
        tasks,
        warmup,
    })
}

/// Submits the scripts: the warm-up job first (`sbatch --parsable`, for its id), then the
/// array with `--dependency=afterany:<id>` (it starts when the warm-up ends, whether or
/// not it succeeded: a task compiles what is missing itself). sbatch's output is printed;
/// the error comes with its exit code (1: sbatch refused a job, 2: there is no sbatch).
pub fn submit(scripts: &Scripts) -> Result<(), (u8, String)> {
    let mut after = vec![];
    if let Some(w) = &scripts.warmup {
        let out = sbatch(&["--parsable".into()], w)?;
        // `ID` or `ID;CLUSTER`.
        let id = out.trim().split(';').next().unwrap_or_default().to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err((
                1,
                format!(
                    "error: sbatch --parsable {} printed {:?}, not a job id",
                    w.display(),
                    out.trim()
                ),
            ));
        }
        crate::outln!("warm-up job {id}: the array starts when it ends");
        after.push(format!("--dependency=afterany:{id}"));
    }
    crate::out!("{}", sbatch(&after, &scripts.array)?);
    Ok(())
}

/// `sbatch ARGS SCRIPT`: its standard output, or the error with its exit code.
fn sbatch(args: &[String], script: &Path) -> Result<String, (u8, String)> {
    match std::process::Command::new("sbatch")
        .args(args)
        .arg(script)
        .output()
    {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err((
            1,
            format!(
                "error: sbatch {} failed: {}",
                script.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        )),
        Err(e) => Err((
            2,
            format!(
                "error: cannot run sbatch ({e})\n  = help: submit from a Slurm login node: sbatch {}",
                script.display()
            ),
        )),
    }
}

/// The `#SBATCH` lines of `[slurm]`'s resources, after the job's own `first` lines. The
/// job (each array task) is one task, said explicitly: Slurm 23.11 refuses
/// `--gpus-per-task` without a task count.
fn resources(s: &schema::SlurmSection, first: Vec<String>) -> Vec<String> {
    let mut lines = vec!["#!/bin/bash".to_string()];
    lines.extend(first);
    lines.extend([
        format!("#SBATCH --time={}", s.time),
        "#SBATCH --ntasks=1".into(),
        format!("#SBATCH --cpus-per-task={}", s.cpus()),
    ]);
    if let Some(p) = &s.partition {
        lines.push(format!("#SBATCH --partition={}", sbatch_word(p)));
    }
    if s.gpus_per_task > 0 {
        lines.push(format!("#SBATCH --gpus-per-task={}", s.gpus_per_task));
    }
    if let Some(m) = &s.mem {
        lines.push(format!("#SBATCH --mem={m}"));
    }
    if let Some(a) = &s.account {
        lines.push(format!("#SBATCH --account={}", sbatch_word(a)));
    }
    for extra in &s.extra {
        lines.push(format!("#SBATCH {extra}"));
    }
    lines
}

/// The options [`resources`] and [`script`] write for `s`, each with the `[slurm]` key that
/// sets it (if any): in `slurm.extra`, a second line for one of them would override the
/// first without a word (`--array` would break the cell each task runs; `--output`, its
/// log). Kept beside the code that writes the lines, so the two agree.
pub fn written_options(s: &schema::SlurmSection) -> Vec<(&'static str, Option<&'static str>)> {
    let mut written = vec![
        ("job-name", None),
        ("array", None),
        ("output", None),
        ("open-mode", None),
        ("time", Some("slurm.time")),
        ("ntasks", None),
        ("cpus-per-task", Some("slurm.cpus_per_task")),
    ];
    if s.partition.is_some() {
        written.push(("partition", Some("slurm.partition")));
    }
    if s.gpus_per_task > 0 {
        written.push(("gpus-per-task", Some("slurm.gpus_per_task")));
    }
    if s.mem.is_some() {
        written.push(("mem", Some("slurm.mem")));
    }
    if s.account.is_some() {
        written.push(("account", Some("slurm.account")));
    }
    if s.requeue {
        written.extend([
            ("signal", Some("slurm.requeue")),
            ("requeue", Some("slurm.requeue")),
            // Not written, but it would undo the --requeue that is.
            ("no-requeue", Some("slurm.requeue")),
        ]);
    }
    written
}

/// The warm-up job: one task with an array task's resources, `runner warmup` on the grid.
fn warmup_script(
    s: &schema::SlurmSection,
    job_name: &str,
    sweep_dir: &Path,
    workdir: &Path,
    command: &[String],
) -> String {
    let mut lines = resources(
        s,
        vec![
            format!(
                "#SBATCH --job-name={}",
                sbatch_word(&format!("{job_name}-warmup"))
            ),
            format!(
                "#SBATCH --output={}",
                output_pattern(sweep_dir, "warmup-%j.out")
            ),
        ],
    );
    let quoted: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
    lines.extend([
        String::new(),
        "# Generated by `runner sweep --slurm`: compiles and tunes every kernel the grid's".into(),
        "# cells need, once, into the shared kernel cache; the array starts after it.".into(),
        format!(
            "cd {} || exit 2",
            shell_quote(&workdir.display().to_string())
        ),
        format!("exec {}", quoted.join(" ")),
    ]);
    lines.join("\n") + "\n"
}

/// `[slurm]` resources for the job-array script.
pub fn script(
    s: &schema::SlurmSection,
    job_name: &str,
    tasks: usize,
    sweep_dir: &Path,
    workdir: &Path,
    command: &[String],
) -> String {
    let mut lines = resources(
        s,
        vec![
            format!("#SBATCH --job-name={}", sbatch_word(job_name)),
            format!("#SBATCH --array=0-{}", tasks.saturating_sub(1)),
            format!(
                "#SBATCH --output={}",
                output_pattern(sweep_dir, "slurm-%A_%a.out")
            ),
            // A requeued task writes the same file: appended to, not truncated (the log of
            // its run before the requeue was lost with Slurm's default).
            "#SBATCH --open-mode=append".into(),
        ],
    );
    if s.requeue {
        lines.push(format!("#SBATCH --signal=B:TERM@{REQUEUE_GRACE_S}"));
        lines.push("#SBATCH --requeue".into());
    }
    let quoted: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
    lines.push(String::new());
    lines.push(
        "# Generated by `runner sweep --slurm`: one array task per cell (or shard); each".into(),
    );
    lines.push(
        "# task skips what is already done, so resubmitting the script resumes the sweep.".into(),
    );
    lines.push("set -uo pipefail".into());
    lines.push(format!(
        "cd {} || exit 2",
        shell_quote(&workdir.display().to_string())
    ));
    if !s.requeue {
        lines.push(format!("exec {}", quoted.join(" ")));
        return lines.join("\n") + "\n";
    }
    lines.extend([
        "# Slurm signals this script (not the runner) before the time limit: pass it on; the"
            .into(),
        "# runner checkpoints at its next step and exits 143, and the task requeues itself.".into(),
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM".into(),
        format!("{} &", quoted.join(" ")),
        "child=$!".into(),
        "wait \"$child\"; status=$?".into(),
        "# `wait` returns when the trap runs: wait again for the runner to finish.".into(),
        "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; status=$?; done".into(),
        "if [ \"$status\" -eq 143 ]; then".into(),
        "  echo \"runner stopped for the time limit; requeueing to resume from its checkpoint\""
            .into(),
        "  scontrol requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"".into(),
        "fi".into(),
        "exit \"$status\"".into(),
    ]);
    lines.join("\n") + "\n"
}

/// A value on an `#SBATCH` line as sbatch reads it back: it splits the line at white space
/// (outside double quotes) and, in newer versions, ends it at a `#` even within quotes; a
/// backslash escapes the next character. (A recipe named `a b` gave `--output=runs/a` and
/// a stray word sbatch refused.) Checked against sbatch 22.05.
fn sbatch_word(s: &str) -> String {
    if !s
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '"' | '\\' | '#'))
    {
        return s.to_string();
    }
    let mut out = String::from('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '#') {
            out.push('\\');
        }
        out.push(c);
    }
    out + "\""
}

/// `--output`'s value: `file` (with its own `%A`, `%j`...) in `dir`, whose `%` are doubled,
/// since sbatch expands `%j`, `%u`... anywhere in the pattern (`runs/a%jb` became
/// `runs/a<job id>b/`, a folder that does not exist, and the task had no log).
fn output_pattern(dir: &Path, file: &str) -> String {
    let dir = dir.display().to_string().replace('%', "%%");
    sbatch_word(&format!("{dir}/{file}"))
}

/// Seconds before the time limit at which Slurm signals a requeueing task.
pub const REQUEUE_GRACE_S: u32 = 120;

fn shell_quote(s: &str) -> String {
    // `$SLURM_ARRAY_TASK_ID` and `$((...))/N` must reach the shell unquoted to expand.
    if s.starts_with('$') {
        return s.to_string();
    }
    shell_word(s)
}

/// `s` as one word of a shell command a user can paste: as written where nothing in it is
/// special to the shell, else in single quotes.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbatch_lines_keep_spaces_quotes_hashes_and_percents_of_names_and_paths() {
        assert_eq!(sbatch_word("runner-tiny_grid"), "runner-tiny_grid");
        assert_eq!(sbatch_word("a b"), r#""a b""#);
        assert_eq!(sbatch_word(r#"a"b#c"#), r#""a\"b\#c""#);
        assert_eq!(
            output_pattern(Path::new("/runs/100% a"), "slurm-%A_%a.out"),
            r#""/runs/100%% a/slurm-%A_%a.out""#
        );
    }

    /// What the job script's shell makes of each quoted argument is the argument: a `$`
    /// inside a bare `--set` value (`name=cost$5`) was left unquoted, and the task ran
    /// another name. Only the task-id words start with `$` and are left to expand.
    #[test]
    fn the_shell_reads_every_quoted_argument_back_as_written() {
        let args = [
            "name=cost$5",
            "name=a$HOME",
            "~model.width",
            "sweep.\"loader.workers\"=[0]",
            "it's",
            "a b",
            "log.dir=/runs/100%",
            "",
        ];
        let line: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf '%s\\n' {}", line.join(" ")))
            .output()
            .unwrap();
        let back = String::from_utf8(out.stdout).unwrap();
        assert_eq!(back.lines().collect::<Vec<_>>(), args, "{line:?}");
        assert_eq!(shell_quote("$SLURM_ARRAY_TASK_ID"), "$SLURM_ARRAY_TASK_ID");
    }
}
