//! The commands that train: `run` (recipes and grids, with --resume, --shard, --cell),
//! `resume`, `eval`, `warmup`, and `sweep --slurm`. Each renders its outcome and exit code.

use runner::metrics::Summary;
use runner::plan::Plan;
use runner::report;
use runner::run::{self, RunError, RunOptions};
use runner::slurm;
use runner::sweep::{self, CellEnd, Checked, Selection, State, SweepDir};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::*;

pub(crate) fn run_all(args: &RunArgs) -> ExitCode {
    let machine = runner::backend::probe();
    // Every recipe, every cell, is checked before the first one runs.
    let Some(all) = check_all(&args.check, &machine) else {
        return ExitCode::from(2);
    };
    let shard = match args.shard.as_deref().map(sweep::parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            runner::errln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for c in &all {
        if !c.grid && (shard.is_some() || args.cell.is_some() || args.resume || args.grid.is_some())
        {
            runner::errln!(
                "error: {}: --shard, --cell, --grid and --resume apply to recipes with a [sweep] table",
                c.path.display()
            );
            return ExitCode::from(2);
        }
        if let Some(e) = other_grid(c, args.grid.as_deref()) {
            runner::errln!("{e}");
            return ExitCode::from(2);
        }
        // Not an error: a script may start more workers than a grid has cells.
        if let Some((i, n)) = shard.filter(|&(i, _)| c.grid && i > c.cells.len()) {
            runner::errln!(
                "warning: {}: --shard {i}/{n} holds no cell: the grid has {} ({}), and shard {i} would start at cell {}",
                c.path.display(),
                c.cells.len(),
                match c.cells.len() {
                    1 => "cell 0".to_string(),
                    k => format!("cells 0 to {}", k - 1),
                },
                i - 1
            );
        }
        if let Some(i) = args.cell.filter(|&i| i >= c.cells.len()) {
            runner::errln!(
                "error: --cell {i}: {} has {} cells, 0 to {}",
                c.path.display(),
                c.cells.len(),
                c.cells.len() - 1
            );
            return ExitCode::from(2);
        }
    }
    // (After the check that --resume is for grids.)
    if args.repeat > 1 && args.resume {
        runner::errln!(
            "error: --repeat {} with --resume: a round would skip every cell the round before it did\n  = help: finish the grid with --resume first, then run it with --repeat",
            args.repeat
        );
        return ExitCode::from(2);
    }
    let sel = Selection {
        shard,
        only: args.cell,
        resume: args.resume,
    };
    if let Some(e) = autotune_conflict(&all, sel) {
        runner::errln!("{e}");
        return ExitCode::from(2);
    }
    // Where every run will be written, before the first one trains: with several recipes,
    // a later one's log.dir that cannot be written was found only after the earlier ones
    // had run.
    for (recipe, dir, runs) in log_dirs(&all) {
        if let Some(why) = log_dir_problem(&runs) {
            runner::errln!(
                "error: {}: log.dir: {} {why}\n  = help: point log.dir (or --set log.dir=...) at a folder this user can write; nothing was run",
                recipe.display(),
                dir.display()
            );
            return ExitCode::from(2);
        }
    }
    let opts = RunOptions {
        quiet: args.quiet,
        ..Default::default()
    };
    runner::signals::install();
    let mut code = ExitCode::SUCCESS;
    // With --repeat, the recipes in rounds: a b, a b, ...
    let rounds = usize::from(args.repeat);
    let order: Vec<&Checked> = (0..rounds).flat_map(|_| all.iter()).collect();
    // The runs this call completed and failed, for the comparison after the last round
    // (or the last run, where the call ends before it).
    let mut made = Made::default();
    // The runs from the `k`th of the order on, a grid's cells each, as words.
    let runs = |k: usize| {
        let n: usize = order[k.min(order.len())..]
            .iter()
            .map(|c| match c.grid {
                true => c.cells.iter().filter(|cell| sel.takes(cell.index)).count(),
                false => 1,
            })
            .sum();
        match (rounds, order[k.min(order.len())..].iter().any(|c| c.grid)) {
            (1, false) => format!("{n} recipe(s)"),
            _ => format!("{n} run(s)"),
        }
    };
    for (k, c) in order.iter().copied().enumerate() {
        // A signal that came as the previous recipe's run finished: the rest are not
        // started (the next one said "exiting now, before the run started").
        if let Some(signal) = runner::signals::received().filter(|_| k > 0) {
            runner::errln!(
                "{}{}: not run: {} came as the run before it finished{}",
                c.path.display(),
                match order.len() - k - 1 {
                    0 => String::new(),
                    _ => format!(" (and the {} after it)", runs(k + 1)),
                },
                runner::signals::name(signal),
                rest_command(&all, k, args).map_or(String::new(), |r| format!(
                    "; run {} with: {r}",
                    if k + 1 == order.len() { "it" } else { "them" }
                ))
            );
            made.print_so_far(rounds, all.len());
            // 128 + the signal, as for a run it stops.
            return ExitCode::from(u8::try_from(128 + signal).unwrap_or(130));
        }
        // What is not started if a signal ends the process before this run's first step.
        let rest = rest_command(&all, k + 1, args)
            .map(|r| format!("{} after it not started; run them with: {r}", runs(k + 1)));
        let outcome = if c.grid {
            let opts = RunOptions {
                again: Some(grid_again(c, args)),
                rest,
                ..opts.clone()
            };
            // With --repeat, one table after the last round (each round's said `?`); a
            // round after the first runs every cell again (the cells done are taken as
            // not done, so that an interrupted round goes on with `--resume`).
            let round = Round {
                again: k >= all.len(),
                table: rounds == 1,
            };
            run_grid(c, sel, &opts, &mut made, round)
        } else {
            let opts = RunOptions {
                rest,
                ..opts.clone()
            };
            run_one(&c.plans[0], &opts).map(|dir| made.done.push(dir))
        };
        match outcome {
            Ok(()) => {}
            // A grid's failed cells are said once more after its table: each cell's own
            // error has scrolled away by then.
            Err(RunError::Failed { message, .. }) if c.grid => {
                runner::errln!("error: {}: {message}", c.path.display());
                code = ExitCode::from(1);
            }
            // Already said where it happened (run_one).
            Err(RunError::Failed { .. }) => {
                made.failed += 1;
                code = ExitCode::from(1);
            }
            Err(e @ RunError::Interrupted { .. }) => {
                // The recipes after it, not started, and how to run them (the command to go
                // on named only the interrupted one, and they were left out in silence).
                if let Some(rest) = rest_command(&all, k + 1, args) {
                    runner::errln!(
                        "note: {} after it not started; run them with: {rest}",
                        runs(k + 1)
                    );
                }
                made.print_so_far(rounds, all.len());
                return ExitCode::from(e.exit_code());
            }
            Err(e @ (RunError::Input(_) | RunError::Io(_))) => {
                runner::errln!("{e}");
                if let Some(rest) = rest_command(&all, k + 1, args) {
                    runner::errln!(
                        "note: {}: the call stops here, {} after it not started; once that is put right, run them with: {rest}",
                        c.path.display(),
                        runs(k + 1)
                    );
                }
                made.print_so_far(rounds, all.len());
                return ExitCode::from(e.exit_code());
            }
        }
    }
    made.print_so_far(rounds, all.len());
    code
}

/// The runs a call made, for `--repeat`'s comparison.
#[derive(Default)]
pub(crate) struct Made {
    /// The completed runs' directories, in the order they ran.
    pub(crate) done: Vec<PathBuf>,
    /// How many failed.
    pub(crate) failed: usize,
}

impl Made {
    /// With more than one round: the comparison of the runs completed so far (a call that
    /// ends early, by a signal or bad input, keeps the table of what it did).
    fn print_so_far(&self, rounds: usize, recipes: usize) {
        if rounds < 2 {
            return;
        }
        let failed = match self.failed {
            0 => String::new(),
            n => format!(", {n} failed (said above, and not in the table)"),
        };
        runner::outln!(
            "\n{rounds} rounds of {recipes} recipe(s): {} run(s) completed{failed}{}",
            self.done.len(),
            if self.done.is_empty() { "" } else { ":" }
        );
        if !self.done.is_empty() {
            print_table(&self.done);
        }
    }
}

/// Where a grid stands in a `--repeat` call.
#[derive(Clone, Copy)]
pub(crate) struct Round {
    /// A round after the first: the cells done (by the first) are run again.
    again: bool,
    /// Print the grid's comparison after it (one round only).
    table: bool,
}

pub(crate) fn run_one(p: &Plan, opts: &RunOptions) -> Result<PathBuf, RunError> {
    if !opts.quiet {
        runner::errln!(
            "{}: {} ({})",
            p.name,
            runner::backend::describe(p.device, &p.kernels).0,
            p.device_reason
        );
    }
    // The loop's panics are caught inside; anything else that panics still ends only this
    // run (a grid goes on to its next cell).
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run::execute(p, opts)))
        .unwrap_or_else(|panic| {
            Err(RunError::Failed {
                dir: p.log.dir.join(&p.name),
                message: format!(
                    "the runner panicked: {}",
                    run::panic_message(panic.as_ref())
                ),
            })
        });
    // A signal that came as the run ended is said before the run's own last line.
    runner::signals::say_received();
    match result {
        Ok(f) => {
            runner::outln!("{}", summary_line(&f.summary, &f.dir));
            Ok(f.dir)
        }
        Err(RunError::Failed { dir, message }) => {
            // A run directory removed while the run ran holds nothing to point at, nor
            // one that failed before its summary could be written (a full disk, a write
            // limit): it was pointed at as if it held the run's record.
            // One left empty (a full disk from the start) is removed, with its recipe's
            // folder if that is empty too: `report` saw nothing there, and a listing of
            // runs showed a run that was none. Not a grid cell's, whose status names it.
            let emptied = !dir.join("summary.json").is_file()
                && opts.cell.is_none()
                && std::fs::remove_dir(&dir).is_ok();
            if emptied {
                if let Some(up) = dir.parent() {
                    let _ = std::fs::remove_dir(up);
                }
            }
            let note = match (dir.exists(), dir.join("summary.json").is_file()) {
                (true, true) => format!("\n  = note: what was recorded is in {}", dir.display()),
                (true, false) => format!(
                    "\n  = note: the run directory {} holds no summary: the run failed before it could write one",
                    dir.display()
                ),
                (false, _) if emptied => format!(
                    "\n  = note: nothing was kept: the run directory {} held nothing, and was removed",
                    dir.display()
                ),
                (false, _) => String::new(),
            };
            runner::errln!(
                "error: run {} failed: {message}{note}{}",
                p.name,
                space_help(&message).map_or(String::new(), |h| format!("\n  = help: {h}"))
            );
            Err(RunError::Failed { dir, message })
        }
        Err(RunError::Interrupted { dir, signal }) => {
            say_interrupted(&p.name, &dir, signal, opts);
            Err(RunError::Interrupted { dir, signal })
        }
        Err(e) => Err(e),
    }
}

/// The line a run stopped by a signal ends with: where it is, and how to go on.
fn say_interrupted(name: &str, dir: &Path, signal: i32, opts: &RunOptions) {
    let again = match &opts.again {
        Some(cmd) => format!("continue the grid with: {cmd}"),
        None => format!(
            "continue it with: {} resume {}",
            runner::program(),
            slurm::shell_word(&dir.display().to_string())
        ),
    };
    runner::errln!(
        "{name}: interrupted by {}; what was recorded is in {} (status \"interrupted\"); {again}",
        runner::signals::name(signal),
        dir.display()
    );
}

/// The help after a resume that failed: the space (or limit) to free, and where it
/// failed before its first step, that the run is as its checkpoint left it.
fn resume_help(dir: &Path, message: &str) -> String {
    let mut help = space_help(message).map_or(String::new(), |h| format!("\n  = help: {h}"));
    if run::still_interrupted(dir) {
        help.push_str("\n  = help: it failed before its first step, and the run is as its checkpoint left it: resume it again once that is put right");
    }
    help
}

/// What to do about a write that failed for want of space, by the error's words.
fn space_help(message: &str) -> Option<&'static str> {
    if message.contains("File too large") {
        Some("a file reached this shell's file-size limit (`ulimit -f`): raise it (`ulimit -f unlimited`) and run again (or `runner resume` the run, if it wrote a checkpoint)")
    } else if message.contains("No space left on device") || message.contains("Disk quota exceeded")
    {
        Some("free space on the disk of log.dir, or files where it is out of inodes (`df -h` and `df -i` show which), or point log.dir elsewhere; then run again (or `runner resume` the run, if it wrote a checkpoint)")
    } else if message.contains("Too many open files") {
        Some("this shell's limit on open files (`ulimit -n`) is too low for a run: raise it (`ulimit -n 1024`) and run again")
    } else {
        None
    }
}

/// The line a completed run prints on stdout: steps, speed, test accuracy, directory.
fn summary_line(s: &Summary, dir: &Path) -> String {
    format!("{}: {}, {}", s.name, s.headline(), dir.display())
}

/// The command that runs the call's order (`all`, `--repeat` times) from its `k`th run
/// on: this one for the rest of that round, then, where whole rounds are left, this one
/// with `--repeat` that many (`;` between them: a run that fails does not stop the rest).
fn rest_command(all: &[Checked], k: usize, args: &RunArgs) -> Option<String> {
    let total = usize::from(args.repeat) * all.len();
    if k >= total {
        return None;
    }
    let rest = match k % all.len() {
        0 => &all[..0],
        i => &all[i..],
    };
    let rounds = (total - k - rest.len()) / all.len();
    let commands: Vec<String> = [
        (!rest.is_empty()).then(|| command_for(rest, args, args.resume, 1)),
        (rounds > 0).then(|| command_for(all, args, args.resume, rounds)),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!commands.is_empty()).then(|| commands.join("; "))
}

/// The command that continues a grid after an interruption: this one, for this grid alone,
/// with `--resume`.
fn grid_again(c: &Checked, args: &RunArgs) -> String {
    command_for(std::slice::from_ref(c), args, true, 1)
}

/// This command for `recipes` alone, as a shell line: its `--set`s, `--max-cells` and
/// `--cell`/`--shard` are kept (without the sets, `--resume` expanded another grid and
/// trained its cells from the start), `-q` too, `--resume` where `resume`, and `--repeat`
/// where `repeat` is more than one.
fn command_for(recipes: &[Checked], args: &RunArgs, resume: bool, repeat: usize) -> String {
    let mut words: Vec<String> = recipes
        .iter()
        .map(|c| c.path.display().to_string())
        .collect();
    words.extend(sweep::check_args(&args.check.sets, args.check.max_cells));
    if let Some(shard) = &args.shard {
        words.extend(["--shard".into(), shard.clone()]);
    }
    if let Some(cell) = args.cell {
        words.extend(["--cell".into(), cell.to_string()]);
    }
    if let Some(grid) = &args.grid {
        words.extend(["--grid".into(), grid.clone()]);
    }
    if args.quiet {
        words.push("-q".into());
    }
    if resume {
        words.push("--resume".into());
    }
    if repeat > 1 {
        words.extend(["--repeat".into(), repeat.to_string()]);
    }
    let words: Vec<String> = words.iter().map(|w| slurm::shell_word(w)).collect();
    format!("{} {}", runner::program(), words.join(" "))
}

/// Runs the cells `sel` takes; each completed cell's run directory is added to `made`.
/// Then, where `round.table`, prints the comparison of every cell done.
pub(crate) fn run_grid(
    c: &Checked,
    sel: Selection,
    opts: &RunOptions,
    made: &mut Made,
    round: Round,
) -> Result<(), RunError> {
    let root = &c.plans[0].log.dir;
    // --resume where no sweep of this grid ran (log.dir is relative to the working
    // directory: from another one, it started the grid over in silence).
    if sel.resume && !root.join(&c.base).join("sweeps").is_dir() {
        runner::errln!(
            "warning: --resume: no earlier sweep of {} under {} (log.dir; a relative one is relative to the working directory{}): the cells asked for run from their start\n  = help: to continue a grid started elsewhere, run from the folder it was started in, or --set log.dir to the folder its runs are in",
            c.base,
            root.display(),
            std::env::current_dir().map_or(String::new(), |d| format!(", here {}", d.display()))
        );
    }
    let dir = SweepDir::open(root, &c.base, &c.path, &c.cells).map_err(|e| {
        RunError::Input(format!(
            "error: cannot create the sweep directory under {}: {e}\n  = help: check log.dir; the runner makes the sweep directory's files and folders itself: move aside what is in their way",
            root.display()
        ))
    })?;
    runner::errln!(
        "sweep {}: {} cells, state in {}",
        c.base,
        c.cells.len(),
        dir.dir.display()
    );
    if round.again {
        for cell in c.cells.iter().filter(|cell| sel.takes(cell.index)) {
            dir.forget_done(cell).map_err(|e| {
                RunError::Io(format!(
                    "error: cannot write the sweep state in {}: {e}",
                    dir.dir.display()
                ))
            })?;
        }
    }
    let mut stop: Option<RunError> = None;
    let resuming = sel.resume;
    // A cell's id names its data by path: a done cell whose run trained on other files at
    // those paths (a git pull, a --set path from another working directory) is not this
    // grid's cell done, and runs again (it was skipped as done).
    let stale = |cell: &sweep::Cell, run_dir: &Path| run::other_data(run_dir, &c.plans[cell.index]);
    let outcome = sweep::execute(&dir, &c.cells, sel, stale, |cell, previous| {
        // The cell's status names its run directory from the start.
        let mark = |state: State, message: Option<&'static str>| {
            let (sweep_dir, this) = (dir.dir.clone(), cell.clone());
            let hook: run::RunDirHook = std::sync::Arc::new(move |run_dir: &Path| {
                let sweep = SweepDir {
                    dir: sweep_dir.clone(),
                };
                let _ = sweep.mark(&this, state, Some(run_dir), message.map(String::from));
            });
            Some(hook)
        };
        // Ended at once by a signal (before its first step, or by a second one): the
        // cell is marked with the summary's own words, and, as the process exits without
        // unwinding, its lock let go of here.
        let interrupted: run::RunDirHook = {
            let (sweep_dir, this) = (dir.dir.clone(), cell.clone());
            std::sync::Arc::new(move |run_dir: &Path| {
                let sweep = SweepDir {
                    dir: sweep_dir.clone(),
                };
                let error = runner::metrics::read_text(run_dir.join("summary.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Summary>(&t).ok())
                    .and_then(|s| s.error)
                    .unwrap_or_else(|| "interrupted".into());
                let _ = sweep.mark(&this, State::Interrupted, Some(run_dir), Some(error));
                let _ = std::fs::remove_file(sweep.lock_path(&this));
            })
        };
        let unstarted: std::sync::Arc<dyn Fn() + Send + Sync> = {
            let (sweep_dir, this) = (dir.dir.clone(), cell.clone());
            std::sync::Arc::new(move || {
                let sweep = SweepDir {
                    dir: sweep_dir.clone(),
                };
                let _ = sweep.mark(
                    &this,
                    State::Interrupted,
                    None,
                    Some("interrupted while its data loaded, before its run started".into()),
                );
                let _ = std::fs::remove_file(sweep.lock_path(&this));
            })
        };
        let opts = &RunOptions {
            quiet: opts.quiet,
            started: mark(State::Running, None),
            interrupted: Some(interrupted),
            unstarted: Some(unstarted),
            again: opts.again.clone(),
            rest: opts.rest.clone(),
            cell: Some(sweep::GridCell {
                index: cell.index,
                id: cell.id.clone(),
            }),
        };
        // With --resume, a cell whose run stopped (a signal, a killed process: this process
        // holds its lock now) continues from its checkpoint rather than starting over.
        let stopped_run = previous
            .filter(|s| resuming && matches!(s.state, State::Interrupted | State::Running))
            .and_then(|s| s.run_dir);
        // `runner resume` may have finished that run since: the cell is done.
        let completed = stopped_run.as_deref().and_then(Summary::completed_in);
        let result = match (stopped_run, completed) {
            (Some(run_dir), Some(s)) => {
                if !opts.quiet {
                    runner::errln!("{}: {} completed since", cell.name, run_dir.display());
                }
                runner::outln!("{}", summary_line(&s, &run_dir));
                Ok(run_dir)
            }
            (Some(run_dir), None) if run::resumable(&run_dir) => {
                if !opts.quiet {
                    runner::errln!("{}: resuming {}", cell.name, run_dir.display());
                }
                match run::resume(&run_dir, opts, &runner::backend::probe()) {
                    Ok(f) => {
                        runner::outln!("{}", summary_line(&f.summary, &f.dir));
                        Ok(f.dir)
                    }
                    // What keeps this cell's run from going on (its data not where its
                    // recipe.toml names it, another process resuming it) is the cell's,
                    // not every cell's, and changed nothing: the sweep goes on, and the
                    // cell stays interrupted with its run, so a later --resume continues
                    // it once that is put right (marked failed, the next --resume started
                    // it over and left its checkpoint behind).
                    // Data whose content changed since the run started cannot be put right
                    // by every user (a git pull): such a cell fails as before, and the next
                    // --resume starts it over on the data as it is.
                    Err(RunError::Input(message))
                        if !message.contains("changed since the run started") =>
                    {
                        runner::errln!("{message}");
                        return Err(CellEnd {
                            dir: Some(run_dir.clone()),
                            message: format!(
                                "its run {} could not be resumed (said above); it is kept, with its checkpoint, for the next --resume once that is put right (to start the cell over instead: move that run directory away, then --resume)",
                                run_dir.display()
                            ),
                            state: State::Interrupted,
                            stop_sweep: false,
                        });
                    }
                    Err(RunError::Input(message)) => Err(RunError::Failed {
                        dir: run_dir.clone(),
                        message,
                    }),
                    Err(RunError::Failed { dir, message }) => {
                        runner::errln!(
                            "error: {}: the resumed run failed: {message}\n  = note: what was recorded is in {}{}",
                            cell.name,
                            dir.display(),
                            resume_help(&dir, &message)
                        );
                        // Before its first step: the run is as its checkpoint had it, and
                        // the cell stays interrupted with it for the next --resume (marked
                        // failed, the next --resume started it over).
                        if run::still_interrupted(&dir) {
                            return Err(CellEnd {
                                dir: Some(dir),
                                message,
                                state: State::Interrupted,
                                stop_sweep: false,
                            });
                        }
                        Err(RunError::Failed { dir, message })
                    }
                    // Said as a cell run from its start says it (a resumed cell stopped
                    // again ended with nothing said, nor how to go on).
                    Err(RunError::Interrupted { dir, signal }) => {
                        say_interrupted(&cell.name, &dir, signal, opts);
                        Err(RunError::Interrupted { dir, signal })
                    }
                    Err(e) => Err(e),
                }
            }
            (Some(run_dir), None) => {
                // Stopped before any checkpoint it can continue from (killed before its
                // first one, or before that one's metrics line): trained again, in a new
                // run directory.
                if !runner::checkpoint::list(&run_dir).is_empty() || !opts.quiet {
                    runner::errln!(
                        "{}: {} has no checkpoint to resume from (`{} resume {}` says why); the cell starts over",
                        cell.name,
                        run_dir.display(),
                        runner::program(),
                        slurm::shell_word(&run_dir.display().to_string())
                    );
                }
                run_one(&c.plans[cell.index], opts)
            }
            _ => run_one(&c.plans[cell.index], opts),
        };
        match &result {
            Ok(dir) => made.done.push(dir.clone()),
            Err(RunError::Failed { .. }) => made.failed += 1,
            Err(_) => {}
        }
        cell_end(result, &mut stop)
    })
    .map_err(|e| {
        RunError::Io(format!(
            "error: cannot write the sweep state in {}: {e}",
            dir.dir.display()
        ))
    })?;
    if let Some(e) = stop {
        return Err(e);
    }
    if let Some((signal, next)) = outcome.stopped_by {
        runner::errln!(
            "{}: {}: stopped before cell {next} ({}); continue the grid with: {}",
            c.path.display(),
            runner::signals::name(signal),
            c.cells[next].name,
            opts.again
                .as_deref()
                .unwrap_or("the same command with --resume")
        );
        return Err(RunError::Interrupted {
            dir: dir.dir.clone(),
            signal,
        });
    }
    for (i, owner) in &outcome.busy {
        runner::errln!("cell {i}: left to {owner}, which holds its lock");
    }
    if !outcome.skipped.is_empty() {
        let elsewhere = match outcome.adopted {
            0 => String::new(),
            n => format!(
                " ({n} of them done in an earlier sweep of this grid, whose axes had other values)"
            ),
        };
        runner::errln!(
            "resumed: {} cell(s) already done were skipped{elsewhere}",
            outcome.skipped.len()
        );
    }
    if round.table {
        print_comparison(c, &dir);
    }
    match outcome.failed.first() {
        Some((i, msg)) => Err(RunError::Failed {
            dir: dir.dir.clone(),
            message: format!(
                "{} cell(s) failed, the first (cell {i}): {msg}",
                outcome.failed.len()
            ),
        }),
        None => Ok(()),
    }
}

/// How a cell's run ended, for the sweep state; a stop of the whole sweep (a signal, or
/// input every cell shares) is kept in `stop`.
fn cell_end(
    result: Result<PathBuf, RunError>,
    stop: &mut Option<RunError>,
) -> Result<PathBuf, CellEnd> {
    let end = |dir, message, state, stop_sweep| CellEnd {
        dir,
        message,
        state,
        stop_sweep,
    };
    match result {
        Ok(d) => Ok(d),
        Err(RunError::Failed { dir, message }) => {
            Err(end(Some(dir), message, State::Failed, false))
        }
        Err(RunError::Interrupted { dir, signal }) => {
            let message = format!("interrupted by {}", runner::signals::name(signal));
            *stop = Some(RunError::Interrupted {
                dir: dir.clone(),
                signal,
            });
            Err(end(Some(dir), message, State::Interrupted, true))
        }
        // Input every cell shares (a data file) is bad: the rest would fail the same.
        Err(e @ (RunError::Input(_) | RunError::Io(_))) => {
            let msg = e.to_string();
            *stop = Some(e);
            Err(end(None, msg, State::Failed, true))
        }
    }
}

/// The comparison over every cell done so far, by this process or any other shard.
fn print_comparison(c: &Checked, dir: &SweepDir) {
    let done: Vec<PathBuf> = c
        .cells
        .iter()
        .filter(|cell| dir.is_done(cell))
        .filter_map(|cell| dir.status(cell)?.run_dir)
        .collect();
    if !done.is_empty() {
        runner::outln!("\n{} of {} cells done:", done.len(), c.cells.len());
        print_table(&done);
    }
}

/// `report`'s table of these completed runs, in their order.
fn print_table(dirs: &[PathBuf]) {
    match dirs
        .iter()
        .map(|d| report::load_run(d))
        .collect::<Result<Vec<_>, _>>()
        .and_then(|runs| report::rows(&runs, None))
    {
        Ok(rows) => runner::out!("{}", report::render(&rows, report::Format::Table)),
        Err(e) => runner::errln!("{e}"),
    }
}

pub(crate) fn resume(run_dir: &Path, quiet: bool) -> ExitCode {
    runner::signals::install();
    let opts = RunOptions {
        quiet,
        ..Default::default()
    };
    let result = run::resume(run_dir, &opts, &runner::backend::probe());
    runner::signals::say_received();
    match result {
        Ok(f) => {
            // The line a run prints (its figures over all its segments), and the resumes.
            let s = &f.summary;
            runner::outln!(
                "{}: {} ({} resume(s), final loss {:.4}), {}",
                s.name,
                s.headline(),
                s.resumes,
                s.final_loss.unwrap_or(f64::NAN),
                f.dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            match &e {
                RunError::Failed { dir, message } => runner::errln!(
                    "error: the resumed run failed: {message}\n  = note: what was recorded is in {}{}",
                    dir.display(),
                    resume_help(dir, message)
                ),
                RunError::Interrupted { dir, .. } => {
                    runner::errln!(
                        "{e}; resume it again with: {} resume {}",
                        runner::program(),
                        slurm::shell_word(&dir.display().to_string())
                    )
                }
                _ => runner::errln!("{e}"),
            }
            ExitCode::from(e.exit_code())
        }
    }
}

pub(crate) fn eval(run_dir: &Path, data: Option<&Path>, best: bool) -> ExitCode {
    match run::eval(run_dir, data, best, &runner::backend::probe()) {
        Ok(r) => {
            runner::outln!(
                "accuracy {:.2}% on {} samples, loss {:.4} ({}, {:.1} s)",
                100.0 * r.accuracy,
                r.samples,
                r.loss,
                r.weights.display(),
                r.ms / 1e3
            );
            match r.saved {
                Ok(_) => ExitCode::SUCCESS,
                Err(why) => {
                    runner::errln!(
                        "error: the result above was not saved: {why}\n  = help: evaluations are saved in the run's directory as eval-<time>.json: make it writable, or evaluate a copy of it"
                    );
                    ExitCode::from(1)
                }
            }
        }
        Err(RunError::Failed { message, .. }) => {
            runner::errln!("error: cannot evaluate {}: {message}", run_dir.display());
            ExitCode::from(1)
        }
        Err(e) => {
            runner::errln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// CubeCL takes its autotune level once per process (`Plan::cubecl_once`): runs of one
/// process that differ in it would all run with the first one's, each recorded with its
/// own (a grid over `backend.autotune` measured one level under several names). The
/// runs this process would run (`cell`, `shard`) that differ, said as an error.
fn autotune_conflict(all: &[Checked], sel: Selection) -> Option<String> {
    let mut first = None;
    for c in all {
        for (i, p) in c.plans.iter().enumerate() {
            if c.grid && !sel.takes(i) {
                continue;
            }
            let Some((level, _)) = p.cubecl_once() else {
                continue;
            };
            let which = |c: &Checked, i: usize| match c.grid {
                true => format!("{} cell {i}", c.path.display()),
                false => c.path.display().to_string(),
            };
            match first {
                None => first = Some((which(c, i), level)),
                Some((ref at, had)) if had != level => {
                    return Some(format!(
                        "error: {at} asks for backend.autotune = \"{}\" and {} for \"{}\": CubeCL takes its autotune level once per process, so both would run with \"{}\"\n  = help: run each level in a process of its own: a grid's cells one at a time (--cell N), or as a Slurm array (runner sweep GRID --slurm); runner warmup warms them all",
                        had.name(),
                        which(c, i),
                        level.name(),
                        had.name()
                    ));
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// Set in the processes `warmup` starts, one for each of the recipes' CubeCL settings:
/// the index of the one that process warms.
const WARMUP_GROUP: &str = "RUNNER_WARMUP_GROUP";
/// Set in the processes `warmup --jobs` starts beside each other: `K/N`, the process warms
/// the kernel families (`train::kernel_family`) of its group whose index is K modulo N.
const WARMUP_PART: &str = "RUNNER_WARMUP_PART";

/// One process `warmup` starts: the CubeCL group it warms (`None`: the only one) and its
/// part of that group's kernel families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WarmupTask {
    group: Option<usize>,
    part: (usize, usize),
}

pub(crate) fn warmup(args: &CheckArgs, quiet: bool, jobs: usize, grid: Option<&str>) -> ExitCode {
    let machine = runner::backend::probe();
    // A process `warmup` started: the recipes' warnings were said by the one that started
    // it (each of `--jobs N` said them again).
    let started =
        std::env::var_os(WARMUP_PART).is_some() || std::env::var_os(WARMUP_GROUP).is_some();
    let Some(checked) = check_each(args, &machine, !started)
        .and_then(|(out, failed)| failed.is_empty().then_some(out))
    else {
        return ExitCode::from(2);
    };
    if let Some(e) = checked.iter().find_map(|c| other_grid(c, grid)) {
        runner::errln!("{e}");
        return ExitCode::from(2);
    }
    let plans: Vec<&Plan> = checked.iter().flat_map(|c| &c.plans).collect();
    // What CubeCL takes once per process: one process for each setting the plans ask for
    // (cells warmed under another cell's level or into its cache directory would compile
    // again when they run).
    let mut groups = vec![];
    for p in &plans {
        if let Some(g) = p.cubecl_once() {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    // The group of each plan: CPU plans go with the first.
    let group_of = |p: &Plan| {
        p.cubecl_once()
            .and_then(|g| groups.iter().position(|h| *h == g))
            .unwrap_or(0)
    };
    // Each group's kernel families, in the order the recipes give them: plans of one
    // family share most kernels, so they are warmed in one process, one after another.
    let mut families: Vec<Vec<String>> = vec![vec![]; groups.len().max(1)];
    for p in &plans {
        let f = runner::train::kernel_family(p);
        let list = &mut families[group_of(p)];
        if !list.contains(&f) {
            list.push(f);
        }
    }
    let env = |k: &str| std::env::var(k).ok();
    let only = env(WARMUP_GROUP).and_then(|g| g.parse::<usize>().ok());
    let part = env(WARMUP_PART).and_then(|p| {
        let (k, n) = p.split_once('/')?;
        Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?))
    });
    if only.is_none() && part.is_none() {
        let tasks = warmup_tasks(&families, groups.len() > 1, jobs);
        if tasks.len() > 1 {
            return warmup_in_processes(&tasks, families.iter().map(Vec::len).sum(), jobs, quiet);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut code = ExitCode::SUCCESS;
    for p in plans {
        // In a process warming one group, that group's plans (and the CPU ones in the
        // first); in one warming a part, that part's families.
        let g = group_of(p);
        let in_group = only.is_none_or(|k| k == g);
        let in_part = part.is_none_or(|(k, n)| {
            let f = runner::train::kernel_family(p);
            families[g].iter().position(|x| *x == f).unwrap_or(0) % n.max(1) == k
        });
        if !in_group || !in_part || !seen.insert(runner::train::kernel_signature(p)) {
            continue;
        }
        let (backend, _) = runner::backend::describe(p.device, &p.kernels);
        if !quiet {
            runner::errln!("{}: warming up on {backend} ({})", p.name, p.device_reason);
        }
        match run::warmup(p) {
            Ok(w) => {
                let cache = if w.settings.used {
                    format!(
                        "{}; cached in {}",
                        w.counts.describe(),
                        w.settings.cache.dir.display()
                    )
                } else {
                    "nothing to compile on the CPU backend".into()
                };
                runner::outln!(
                    "{}: warmed up on {} ({}) in {:.1} s: {} training and {} evaluation batch shape(s), {} micro-batches; {cache}",
                    p.name,
                    w.backend,
                    w.device,
                    w.seconds,
                    w.warmed.train_shapes,
                    w.warmed.eval_shapes,
                    w.warmed.micro_batches,
                );
            }
            Err(RunError::Failed { message, .. }) => {
                runner::errln!("error: the warm-up of {} failed: {message}", p.name);
                code = ExitCode::from(1);
            }
            Err(e) => {
                runner::errln!("{e}");
                return ExitCode::from(e.exit_code());
            }
        }
    }
    code
}

/// The processes a warm-up needs: one per CubeCL group where there are several
/// (`separate_groups`), each group's kernel families split over up to `jobs` processes.
/// A single task is this process's own work.
fn warmup_tasks(families: &[Vec<String>], separate_groups: bool, jobs: usize) -> Vec<WarmupTask> {
    let mut tasks = vec![];
    for (g, list) in families.iter().enumerate() {
        let n = jobs.min(list.len()).max(1);
        for k in 0..n {
            tasks.push(WarmupTask {
                group: separate_groups.then_some(g),
                part: (k, n),
            });
        }
    }
    tasks
}

/// `runner warmup` again, once per task, up to `jobs` at a time; the worst exit code.
/// With one at a time a task's output is its own (the terminal's progress display
/// included); with several, every line goes through this process whole, so lines of
/// different processes never mix, and each child, writing to a pipe, reports its start-up
/// a line at a time.
fn warmup_in_processes(
    tasks: &[WarmupTask],
    families: usize,
    jobs: usize,
    quiet: bool,
) -> ExitCode {
    let groups = tasks
        .iter()
        .filter_map(|t| t.group)
        .max()
        .map_or(1, |g| g + 1);
    if !quiet {
        if groups > 1 {
            runner::errln!(
                "note: the recipes ask for {groups} different CubeCL settings (backend.autotune, backend.cache_dir), which CubeCL takes once per process: each is warmed in a process of its own"
            );
        }
        if jobs > 1 {
            runner::errln!(
                "note: {families} kernel families (model, data and batch size; the plans of one share most kernels) in {} processes, up to {jobs} at a time",
                tasks.len()
            );
        }
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            runner::errln!("error: cannot find this runner's own binary to start it again: {e}");
            return ExitCode::FAILURE;
        }
    };
    let start = |t: &WarmupTask| {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env(WARMUP_PART, format!("{}/{}", t.part.0, t.part.1));
        if let Some(g) = t.group {
            cmd.env(WARMUP_GROUP, g.to_string());
        }
        if jobs > 1 {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
        }
        cmd.spawn().map_err(|e| {
            runner::errln!("error: cannot start {}: {e}", exe.display());
        })
    };
    let code_of = |status: std::io::Result<std::process::ExitStatus>| match status {
        Ok(s) => s.code().map_or(1, |c| c.clamp(0, 255) as u8),
        Err(e) => {
            runner::errln!("error: waiting for a warm-up process: {e}");
            1
        }
    };
    let mut worst = 0u8;
    let mut queue = tasks.iter();
    let mut running = vec![];
    loop {
        while running.len() < jobs.max(1) {
            let Some(t) = queue.next() else { break };
            match start(t) {
                Ok(mut child) => {
                    let forward = [
                        child.stdout.take().map(|o| forward_lines(o, false)),
                        child.stderr.take().map(|e| forward_lines(e, true)),
                    ];
                    running.push((child, forward));
                }
                Err(()) => worst = worst.max(1),
            }
        }
        if running.is_empty() {
            break;
        }
        let mut i = 0;
        while i < running.len() {
            let (child, _) = &mut running[i];
            match child.try_wait() {
                Ok(None) => i += 1,
                done => {
                    let (mut child, forward) = running.swap_remove(i);
                    let status = match done {
                        Ok(Some(s)) => Ok(s),
                        _ => child.wait(),
                    };
                    for f in forward.into_iter().flatten() {
                        let _ = f.join();
                    }
                    worst = worst.max(code_of(status));
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    ExitCode::from(worst)
}

/// A thread that copies `from` to this process's stdout (or stderr), a whole line at a time.
fn forward_lines(
    from: impl std::io::Read + Send + 'static,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                runner::errln!("{line}");
            } else {
                runner::outln!("{line}");
            }
        }
    })
}

/// `--grid ID` of a grid whose id is no longer `ID`: its cells by index are another grid's,
/// so an array task would train a cell it was not written for, and the cells it was
/// written for would never run.
fn other_grid(c: &sweep::Checked, want: Option<&str>) -> Option<String> {
    let now = sweep::grid_id(&c.cells);
    let want = want.filter(|w| *w != now)?;
    Some(format!(
        "error: {}: the grid is not the one this command was written for (grid {want}; it is grid {now} now: the recipe, a file it extends or a --set changed its cells since), so no cell is run or warmed\n  = help: a Slurm array: write it again with `{} sweep --slurm {}` (with the same --set) and submit that; the cells already done are kept",
        c.path.display(),
        runner::program(),
        slurm::shell_word(&c.path.display().to_string())
    ))
}

pub(crate) fn slurm(args: &SweepArgs) -> ExitCode {
    let Some(all) = check_all(&args.run.check, &any_machine()) else {
        return ExitCode::from(2);
    };
    if let Some(e) = all
        .iter()
        .find_map(|c| other_grid(c, args.run.grid.as_deref()))
    {
        runner::errln!("{e}");
        return ExitCode::from(2);
    }
    // Refused before anything is written.
    if args.run.repeat > 1 {
        runner::errln!(
            "error: --repeat runs the recipes here, round after round; with --slurm each cell is an array task that runs once (resubmitting the script resumes the grid, it does not repeat it)\n  = help: leave --repeat out; to repeat a grid's runs, run it without --slurm, with --repeat"
        );
        return ExitCode::from(2);
    }
    if let Some(flag) = [
        args.run.cell.map(|_| "--cell"),
        args.run.shard.as_ref().map(|_| "--shard"),
    ]
    .into_iter()
    .flatten()
    .next()
    {
        runner::errln!(
            "error: {flag} chooses the cells this process runs; with --slurm every cell is an array task\n  = help: leave {flag} out (--shards K makes K tasks of several cells each); to run one cell, run the grid without --slurm"
        );
        return ExitCode::from(2);
    }
    if args.shards == Some(0) {
        runner::errln!("error: --shards must be at least 1");
        return ExitCode::from(2);
    }
    if let Some(c) = all.iter().find(|c| !c.grid) {
        runner::errln!(
            "error: {}: has no [sweep] table, so there is no grid to split into array tasks\n  = help: run it with `{} {}` (in an sbatch script of your own), or add a [sweep] table",
            c.path.display(),
            runner::program(),
            slurm::shell_word(&c.path.display().to_string())
        );
        return ExitCode::from(2);
    }
    // More tasks than cells would leave array tasks with nothing to run.
    if let Some((k, c)) = args
        .shards
        .and_then(|k| all.iter().find(|c| k > c.cells.len()).map(|c| (k, c)))
    {
        runner::errln!(
            "error: --shards {k}: {} has {} cells, so at most {} shards\n  = help: leave --shards out for one task per cell",
            c.path.display(),
            c.cells.len(),
            c.cells.len()
        );
        return ExitCode::from(2);
    }
    // A task of several cells runs them in one process, which takes one autotune level:
    // `--shard` refuses cells of different levels, so every such task would fail.
    if let Some(k) = args.shards {
        for c in &all {
            if let Some(e) = (1..=k).find_map(|i| {
                let sel = Selection {
                    shard: Some((i, k)),
                    ..Selection::default()
                };
                autotune_conflict(std::slice::from_ref(c), sel)
            }) {
                runner::errln!(
                    "{}
  = note: with --shards {k}, each array task runs several cells in one process
  = help: leave --shards out (one task per cell), or sweep backend.autotune in a grid of its own",
                    e.lines().next().unwrap_or_default()
                );
                return ExitCode::from(2);
            }
        }
    }
    // sbatch reads a `\` in `--output` as "expand no `%A`/`%a`" and drops it: the tasks'
    // logs went to a path that does not exist, so no task had a log.
    if let Some((c, logs)) = all
        .iter()
        .map(|c| (c, c.plans[0].log.dir.join(&c.base)))
        .find(|(_, logs)| logs.to_string_lossy().contains('\\'))
    {
        runner::errln!(
            "error: {}: the array's logs would go under {}, and sbatch cannot write a log to a path with a backslash\n  = help: set `log.dir` (and the recipe's `name`) to a path without `\\`",
            c.path.display(),
            logs.display()
        );
        return ExitCode::from(2);
    }
    // The script names the binary, the working directory and the recipe as text.
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    let named = all.iter().map(|c| Some(c.path.clone())).chain([exe, cwd]);
    if let Some(p) = named.flatten().find(|p| p.to_str().is_none()) {
        runner::errln!(
            "error: {}: the path is not valid UTF-8, so the sbatch script cannot name it\n  = help: rename it (or run from a folder whose path is UTF-8)",
            p.display()
        );
        return ExitCode::from(2);
    }
    for c in &all {
        let scripts = match slurm::write(
            c,
            &args.run.check.sets,
            args.run.check.max_cells,
            args.shards,
        ) {
            Ok(x) => x,
            Err(e) => {
                runner::errln!("{e}");
                return ExitCode::from(2);
            }
        };
        runner::outln!(
            "{}: {} array task(s) in {}",
            c.path.display(),
            scripts.tasks,
            scripts.array.display()
        );
        // Slurm's default MaxArraySize: indices up to 1000 (it was written without a word,
        // and sbatch refused it at submit time on a cluster with the default).
        if scripts.tasks > slurm::DEFAULT_MAX_ARRAY_SIZE {
            runner::errln!(
                "warning: {}: {} array tasks, more than Slurm's default MaxArraySize of {} allows (indices 0 to {}): a cluster with the default refuses the array\n  = help: write it with --shards K (K tasks of several cells each, e.g. --shards {}); `scontrol show config | grep MaxArraySize` says this cluster's",
                c.path.display(),
                scripts.tasks,
                slurm::DEFAULT_MAX_ARRAY_SIZE,
                slurm::DEFAULT_MAX_ARRAY_SIZE - 1,
                slurm::DEFAULT_MAX_ARRAY_SIZE - 1
            );
        }
        if let Some(w) = &scripts.warmup {
            runner::outln!(
                "{}: a warm-up job before them (slurm.warmup) in {}{}",
                c.path.display(),
                w.display(),
                if args.submit {
                    String::new()
                } else {
                    format!(
                        "; submit it first (sbatch --parsable), then sbatch --dependency=afterany:ID {}",
                        runner::slurm::shell_word(&scripts.array.display().to_string())
                    )
                }
            );
        }
        if args.submit {
            if let Err((code, e)) = slurm::submit(&scripts) {
                runner::errln!("{e}");
                return ExitCode::from(code);
            }
        }
    }
    ExitCode::SUCCESS
}

/// Each recipe's `log.dir`s (a grid's cells may have several), with the recipe and the
/// folder its runs go in (`<log.dir>/<name>`, which may exist already: a file there, or a
/// read-only mount, was found only when the run was to start, after its data had loaded),
/// once each where consecutive.
pub(crate) fn log_dirs(all: &[Checked]) -> Vec<(&Path, &Path, PathBuf)> {
    let mut dirs: Vec<(&Path, &Path, PathBuf)> = all
        .iter()
        .flat_map(|c| {
            c.plans.iter().map(|p| {
                // A grid's cells are `<base>/<cell>`: their base is checked, once (each
                // cell's folder was probed: one file made per cell, a Slurm task each).
                let name = if c.grid {
                    c.base.as_str()
                } else {
                    p.name.as_str()
                };
                (c.path.as_path(), p.log.dir.as_path(), p.log.dir.join(name))
            })
        })
        .collect();
    dirs.dedup_by(|a, b| a.2 == b.2);
    dirs
}

/// Why runs cannot be written under `dir`, if they cannot: it, or the nearest folder above
/// it that exists (it is created then), must be a folder this process can create files in.
pub(crate) fn log_dir_problem(dir: &Path) -> Option<String> {
    let mut at = dir;
    loop {
        match std::fs::symlink_metadata(at) {
            Ok(m) if m.file_type().is_symlink() && !at.exists() => {
                return Some(format!(
                    "cannot be created: {} is a symbolic link to a folder that does not exist",
                    at.display()
                ));
            }
            Ok(_) if !at.is_dir() => {
                return Some(format!(
                    "cannot be created: {} is not a folder",
                    at.display()
                ));
            }
            Ok(_) => {
                return runner::metrics::takes_new_file(at).err().map(|e| {
                    format!("cannot be written: {} takes no new file: {e}", at.display())
                });
            }
            // A file on the way (ENOTDIR): the walk goes up to it, and names it.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::NotADirectory =>
            {
                match at.parent() {
                    Some(up) if !up.as_os_str().is_empty() => at = up,
                    // A relative path with nothing above it: the working directory.
                    _ if at != Path::new(".") => at = Path::new("."),
                    _ => return Some("cannot be created: the working directory is gone".into()),
                }
            }
            Err(e) => return Some(format!("cannot be reached: {e}")),
        }
    }
}
