//! The command line: load recipe (with `extends`, `--set`) → expand its grid → validate every
//! cell into a plan → run (or sweep) → report. Exit codes: 0 all runs ok, 1 a run failed,
//! 2 bad recipe, data or usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod cli {
    pub mod inspect;
    pub mod run;
}
use cli::inspect::{ls, report_cmd, schema, show, validate};
use cli::run::{eval, resume, run_all, slurm, warmup};

use runner::plan::Machine;
use runner::report;
use runner::sweep::{self, Checked};

#[derive(Parser)]
#[command(
    name = "runner",
    version,
    about = "Declarative experiment runner for deep-learning training on Burn",
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Train each recipe in turn; a recipe with [sweep] runs every cell of its grid, then
    /// prints the comparison (the default: `runner r.toml` is `runner run r.toml`).
    Run(RunArgs),
    /// As `run`, and with --slurm writes (and with --submit submits) a Slurm job array.
    Sweep(SweepArgs),
    /// Check recipes without training: syntax, keys, types, rules, data files, every cell
    /// of a grid. Exit 2 on any error; fit for a pre-commit hook.
    Validate(CheckArgs),
    /// Compile and tune, once, the kernels the recipes need (training step with
    /// accumulation, optimizer, cleanup, evaluation; each distinct shape of a grid) so that
    /// later runs start at full speed. Creates no run; only the kernel cache is written
    /// (backend.cache_dir). On the CPU backend it runs the same steps, with nothing to cache.
    Warmup {
        #[command(flatten)]
        check: CheckArgs,
        /// Only the summary line of each recipe.
        #[arg(short, long)]
        quiet: bool,
        /// Warm up to N kernel families at once, each in a process of its own (a family:
        /// the plans of one model, data and batch size, which share most kernels). A cold
        /// start keeps one CPU core busy and the GPU nearly idle, so families of a grid
        /// warm side by side in about the time of the slowest; each process holds its own
        /// GPU memory.
        #[arg(short, long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        jobs: u16,
        /// Grids: warm only if the grid is still the one with this id (its sweep
        /// directory's name), as `run --grid`: the warm-up job `sweep --slurm` writes is
        /// given it, so that after the recipe is edited it refuses rather than warm cells
        /// the array will not run.
        #[arg(long, value_name = "ID")]
        grid: Option<String>,
    },
    /// Continue an interrupted run in its own directory from its latest checkpoint: the
    /// same batches the uninterrupted run would have seen, metrics without a gap.
    Resume {
        /// The run directory (runs/<name>/<run-id>).
        run_dir: PathBuf,
        /// No progress bar or per-epoch lines (the summary line is still printed).
        #[arg(short, long)]
        quiet: bool,
    },
    /// Evaluate a run's saved weights (model.safetensors) on its test set, or on --data
    /// (a file of the recipe's data format); prints accuracy and loss and writes
    /// eval-<time>.json in the run directory. No training.
    Eval {
        /// The run directory (runs/<name>/<run-id>).
        run_dir: PathBuf,
        /// Evaluate on this file instead of the recipe's test set.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Evaluate model-best.safetensors (the best validation metric) instead of the
        /// final weights.
        #[arg(long)]
        best: bool,
    },
    /// Print the resolved recipe (after extends, --set and defaults); for a grid, its cells.
    Show {
        #[command(flatten)]
        check: CheckArgs,
        /// For a grid: the resolved recipe of this cell.
        #[arg(long)]
        cell: Option<usize>,
    },
    /// List the shipped recipes, the models, the data formats and the devices here.
    Ls,
    /// Print the JSON Schema of the recipe format (editors use it to check and complete).
    Schema {
        /// Write it to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Compare runs: one row per recipe (repeats aggregated; runs of one name that ran
    /// different recipes are rows of their own), recomputed from metrics.jsonl, in the
    /// order of the paths given.
    Report {
        /// Run directories, or folders holding them at any depth.
        #[arg(default_value = "runs")]
        paths: Vec<PathBuf>,
        /// The row the others are compared with, by its label as printed, or by its
        /// recipe's name: the first of that recipe's rows (default: the first row with a
        /// timed run).
        #[arg(long)]
        baseline: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: report::Format,
        /// Also draw per-step times and bars of the main columns to this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct CheckArgs {
    /// Recipe files (TOML).
    #[arg(required = true)]
    recipes: Vec<PathBuf>,
    /// Override a recipe key, typed by the format: --set loader.workers=4 (repeatable);
    /// --set '~KEY' removes a key the recipe sets, so it takes its default.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Refuse grids with more cells than this.
    #[arg(long, default_value_t = sweep::DEFAULT_MAX_CELLS)]
    max_cells: usize,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    check: CheckArgs,
    /// No progress bar or per-epoch lines (the summary lines are still printed).
    #[arg(short, long)]
    quiet: bool,
    /// Grids: skip cells already done (by this or an earlier sweep of the same grid), and
    /// continue interrupted ones from their checkpoints.
    #[arg(long)]
    resume: bool,
    /// Grids: run only shard I of N (cells I-1, I-1+N, ...), e.g. --shard 2/4.
    #[arg(long, value_name = "I/N", conflicts_with = "cell")]
    shard: Option<String>,
    /// Grids: run only the cell with this index (what each Slurm array task does).
    #[arg(long)]
    cell: Option<usize>,
    /// Grids: run only if the grid is still the one with this id (its sweep directory's
    /// name): a Slurm array's tasks are given it, so that after the recipe is edited they
    /// refuse rather than run other cells by the same indices.
    #[arg(long, value_name = "ID")]
    grid: Option<String>,
    /// Run the recipes N times, in rounds (a b, a b, ...: the machine's drift falls on
    /// each alike), then print the comparison of this call's runs, each recipe's repeats
    /// aggregated: a ratio is called within the noise or not only for recipes run twice.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    repeat: u16,
}

#[derive(Args)]
struct SweepArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Write a Slurm job-array script (one task per cell) into the sweep directory instead
    /// of running here.
    #[arg(long)]
    slurm: bool,
    /// With --slurm: submit the script with sbatch.
    #[arg(long, requires = "slurm")]
    submit: bool,
    /// With --slurm: one task per shard of the grid instead of one per cell.
    #[arg(long, requires = "slurm")]
    shards: Option<usize>,
}

fn main() -> ExitCode {
    runner::clock::mark_process_start();
    runner::plan::resources::fewer_arenas_under_a_limit();
    runner::kernels::observe_cubecl();
    let cli = Cli::parse();
    let trains = !matches!(
        cli.command,
        Some(
            Command::Validate(_)
                | Command::Show { .. }
                | Command::Ls
                | Command::Schema { .. }
                | Command::Report { .. }
        )
    );
    if trains {
        if let Err(e) = std::env::current_dir() {
            // CubeCL looks for its settings from there, and panicked at the first step.
            runner::errln!(
                "error: the working directory cannot be read ({e}): it was removed or moved away\n  = help: cd to a folder that exists, and run the command again"
            );
            return ExitCode::from(2);
        }
    }
    match cli.command {
        None if mistyped_command(&cli.run) => ExitCode::from(2),
        None => printed(run_all(&cli.run)),
        Some(Command::Run(args)) => printed(run_all(&args)),
        Some(Command::Sweep(args)) if args.slurm => printed(slurm(&args)),
        Some(Command::Sweep(args)) => printed(run_all(&args.run)),
        Some(Command::Validate(args)) => printed(validate(&args)),
        Some(Command::Warmup {
            check,
            quiet,
            jobs,
            grid,
        }) => warmup(&check, quiet, jobs.into(), grid.as_deref()),
        Some(Command::Resume { run_dir, quiet }) => printed(resume(&run_dir, quiet)),
        Some(Command::Eval {
            run_dir,
            data,
            best,
        }) => printed(eval(&run_dir, data.as_deref(), best)),
        Some(Command::Show { check, cell }) => printed(show(&check, cell)),
        Some(Command::Ls) => printed(ls()),
        Some(Command::Schema { output }) => printed(schema(output.as_deref())),
        Some(Command::Report {
            paths,
            baseline,
            format,
            plot,
        }) => printed(report_cmd(
            &paths,
            baseline.as_deref(),
            format,
            plot.as_deref(),
        )),
    }
}

/// `runner valdiate r.toml`: a first word that is no file and is close to a command's name
/// is said as a mistyped command (it read as a recipe that does not exist).
fn mistyped_command(args: &RunArgs) -> bool {
    const COMMANDS: [&str; 10] = [
        "run", "sweep", "validate", "warmup", "resume", "eval", "show", "ls", "schema", "report",
    ];
    let Some(first) = args.check.recipes.first() else {
        return false;
    };
    let word = first.to_string_lossy();
    // (Three letters at least: any short word was "did you mean `runner ls`?".)
    if first.symlink_metadata().is_ok() || word.contains(['/', '.']) || word.chars().count() < 3 {
        return false;
    }
    match runner::recipe::did_you_mean(&word, &COMMANDS) {
        Some(c) => {
            runner::errln!(
                "error: `{word}` is neither a recipe file nor a command\n  = help: did you mean `runner {c}`? (`runner --help` lists the commands)"
            );
            true
        }
        None => false,
    }
}

/// A command fails (exit 1) when standard output could not take what it printed
/// (`runner schema > s.json` on a full disk); the error was said when it happened. A run
/// goes on to its end regardless (its results are in its files), then exits 1 too: a
/// script saw exit 0 after "error: cannot write to standard output". A reader that left
/// (`| head`) is no failure.
fn printed(code: ExitCode) -> ExitCode {
    if code == ExitCode::SUCCESS && runner::output_error().is_some() {
        ExitCode::FAILURE
    } else {
        code
    }
}

/// Loads, expands and validates every recipe, printing every finding; `None` on any error.
fn check_all(args: &CheckArgs, machine: &Machine) -> Option<Vec<Checked>> {
    check_each(args, machine, true).and_then(|(out, failed)| failed.is_empty().then_some(out))
}

/// Each recipe checked, its findings said (its warnings where `warn`): those that
/// validate, and the paths of those that do not. `None` where the options themselves are
/// wrong (nothing was checked).
fn check_each(
    args: &CheckArgs,
    machine: &Machine,
    warn: bool,
) -> Option<(Vec<Checked>, Vec<PathBuf>)> {
    if args.max_cells == 0 {
        runner::errln!(
            "error: --max-cells 0 allows no cell\n  = help: use at least 1 (the default is {})",
            sweep::DEFAULT_MAX_CELLS
        );
        return None;
    }
    if args.max_cells > sweep::MAX_CELLS_LIMIT {
        // Each cell is expanded, resolved and validated up front: a cap of 2^64 let a grid
        // of 100^20 cells take all the memory there was.
        runner::errln!(
            "error: --max-cells {}: at most {} (every cell of a grid is resolved and checked before the first one runs)\n  = help: split the grid into several recipes",
            args.max_cells,
            sweep::MAX_CELLS_LIMIT
        );
        return None;
    }
    let (mut out, mut failed) = (vec![], vec![]);
    // Once per call: the recipes that extend one file share its findings (a warning of
    // spamassassin.toml was said three times, for it and the two that extend it); errors
    // alike, each recipe that met them named.
    let mut warned = vec![];
    let mut reported: Vec<String> = vec![];
    for path in &args.recipes {
        let result = sweep::check(path, &args.sets, machine, args.max_cells);
        match result {
            Ok(c) => {
                for w in c.warnings.iter().filter(|_| warn) {
                    let text = w.to_string();
                    if warned.contains(&text) {
                        continue;
                    }
                    warned.push(text);
                    // Found in a file the recipe extends: which recipe brought it here.
                    let mut shown = w.clone();
                    let elsewhere =
                        w.file != *path && w.file.extension().is_some_and(|e| e == "toml");
                    if elsewhere {
                        let by = format!("{} extends it", path.display());
                        shown.note = Some(match &w.note {
                            Some(n) => format!("{n}; {by}"),
                            None => by,
                        });
                    }
                    runner::errln!("{shown}");
                }
                out.push(c);
            }
            Err(report) => {
                let text = report.to_string();
                // Errors in a file this one extends: which recipe met them (each recipe
                // of a call that extends a broken base said the base's errors again, and
                // none named itself).
                let base = report
                    .errors()
                    .map(|e| e.file.as_path())
                    .find(|f| *f != path.as_path() && f.extension().is_some_and(|e| e == "toml"));
                if reported.contains(&text) {
                    runner::errln!(
                        "error: {}: does not validate: the errors said above{}",
                        path.display(),
                        base.map_or(String::new(), |b| format!(
                            ", in {} (which it extends)",
                            b.display()
                        ))
                    );
                } else if args.recipes.len() > 1
                    && report
                        .errors()
                        .any(|e| e.file == std::path::Path::new("--set"))
                {
                    // The --set options go to every recipe of the call: which one refused it.
                    runner::errln!("{text}, applied to {}", path.display());
                } else if base.is_some() {
                    runner::errln!("{text}, met by {} (it extends the file)", path.display());
                } else {
                    runner::errln!("{text}");
                }
                reported.push(text);
                failed.push(path.clone());
            }
        }
    }
    Some((out, failed))
}

/// Where a recipe is checked without this machine: a CUDA recipe is valid on a laptop.
fn any_machine() -> Machine {
    Machine {
        cuda_compiled: true,
        cuda_devices: Ok(usize::MAX),
        host_memory: None,
        gpu_memory: vec![],
        wgpu_compiled: true,
        wgpu_adapters: None,
        cuda_toolchain: None,
        cpus: None,
    }
}
