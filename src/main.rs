//! The command line: load recipe → validate into a plan → run → one-line summary.
//! Exit codes: 0 all runs ok, 1 a run failed, 2 bad recipe, data or usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use runner::plan::{self, Machine, Plan};
use runner::recipe;
use runner::report;
use runner::run::{self, RunError, RunOptions};

#[derive(Parser)]
#[command(
    name = "runner",
    version,
    about = "Declarative experiment runner for deep-learning training on Burn",
    args_conflicts_with_subcommands = true,
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
    /// Train each recipe in turn (the default: `runner recipe.toml` is `runner run recipe.toml`).
    Run(RunArgs),
    /// Check recipes without training: syntax, keys, types, rules, data files. Exit 2 on any error.
    Validate {
        #[arg(required = true)]
        recipes: Vec<PathBuf>,
    },
    /// Compare runs: one row per recipe (repeats aggregated), recomputed from metrics.jsonl.
    Report {
        /// Run directories, or folders holding them at any depth.
        #[arg(default_value = "runs")]
        paths: Vec<PathBuf>,
        /// The recipe the others are compared with (default: the first row).
        #[arg(long)]
        baseline: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: report::Format,
        /// Also draw per-step times and bars of the main columns to this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Recipe files (TOML).
    #[arg(required = true)]
    recipes: Vec<PathBuf>,
    /// No progress bar or per-epoch lines (the summary line is still printed).
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Validate { recipes }) => validate(&recipes),
        Some(Command::Run(args)) => run_all(&args),
        Some(Command::Report {
            paths,
            baseline,
            format,
            plot,
        }) => report_cmd(&paths, baseline.as_deref(), format, plot.as_deref()),
        None => run_all(&cli.run),
    }
}

/// Loads and validates every recipe, printing every finding; `None` if any has errors.
fn plans(paths: &[PathBuf], machine: &Machine) -> Option<Vec<Plan>> {
    let mut plans = vec![];
    let mut ok = true;
    for path in paths {
        let checked = recipe::load(path).and_then(|l| plan::validate(&l, machine));
        match checked {
            Ok(p) => {
                for w in &p.warnings {
                    eprintln!("{w}");
                }
                plans.push(p);
            }
            Err(report) => {
                eprintln!("{report}");
                ok = false;
            }
        }
    }
    ok.then_some(plans)
}

fn validate(paths: &[PathBuf]) -> ExitCode {
    // A recipe is checked against the format, not this machine: a CUDA recipe is valid on a
    // laptop without a GPU.
    let any = Machine {
        cuda_compiled: true,
        cuda_devices: Ok(usize::MAX),
    };
    match plans(paths, &any) {
        Some(ps) => {
            for p in ps {
                println!(
                    "ok: {} ({}: {} optimizer steps of {} × {} samples)",
                    p.recipe_path.display(),
                    p.name,
                    p.run.total_steps,
                    p.loader.batch_size,
                    p.optim.accumulation_steps
                );
            }
            ExitCode::SUCCESS
        }
        None => ExitCode::from(2),
    }
}

fn run_all(args: &RunArgs) -> ExitCode {
    let machine = runner::backend::probe();
    // Every recipe is checked before the first one runs.
    let Some(plans) = plans(&args.recipes, &machine) else {
        return ExitCode::from(2);
    };
    let opts = RunOptions { quiet: args.quiet };
    let mut code = ExitCode::SUCCESS;
    for p in &plans {
        if !args.quiet {
            eprintln!(
                "{}: {} ({})",
                p.name,
                runner::backend::describe(p.device).0,
                p.device_reason
            );
        }
        match run::execute(p, &opts) {
            Ok(f) => {
                let s = &f.summary;
                let acc = s.test_accuracy.map_or("no test set".into(), |a| {
                    format!("test accuracy {:.2}%", 100.0 * a)
                });
                println!(
                    "{}: {} steps, median {:.2} ms/iter (p95 {:.2}), {:.0} samples/s, {acc}, {}",
                    s.name,
                    s.steps,
                    s.iter_ms.median,
                    s.iter_ms.p95,
                    s.samples_per_s,
                    f.dir.display()
                );
            }
            Err(RunError::Input(msg)) => {
                eprintln!("{msg}");
                return ExitCode::from(2);
            }
            Err(RunError::Failed { dir, message }) => {
                eprintln!(
                    "error: run {} failed: {message}\n  = note: what was recorded is in {}",
                    p.name,
                    dir.display()
                );
                code = ExitCode::from(1);
            }
        }
    }
    code
}

fn report_cmd(
    paths: &[PathBuf],
    baseline: Option<&str>,
    format: report::Format,
    plot: Option<&std::path::Path>,
) -> ExitCode {
    let result = (|| {
        let dirs = report::find_runs(paths)?;
        let runs = dirs
            .iter()
            .map(|d| report::load_run(d))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = report::rows(&runs, baseline)?;
        print!("{}", report::render(&rows, format));
        if let Some(p) = plot {
            runner::plot::draw(p, &runs, &rows)
                .map_err(|e| report::ReportError(format!("error: cannot draw the plot: {e}")))?;
            eprintln!("plot: {}", p.display());
        }
        Ok::<_, report::ReportError>(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
