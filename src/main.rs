//! The command line: load recipe (with `extends`, `--set`) → expand its grid → validate every
//! cell into a plan → run (or sweep) → report. Exit codes: 0 all runs ok, 1 a run failed,
//! 2 bad recipe, data or usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use runner::plan::{Machine, Plan};
use runner::recipe;
use runner::report;
use runner::run::{self, RunError, RunOptions};
use runner::slurm;
use runner::sweep::{self, CellEnd, Checked, Selection, State, SweepDir};

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
    },
    /// Continue an interrupted run in its own directory from its latest checkpoint: the
    /// same batches the uninterrupted run would have seen, metrics without a gap.
    Resume {
        /// The run directory (runs/<name>/<run-id>).
        run_dir: PathBuf,
        #[arg(short, long)]
        quiet: bool,
    },
    /// Evaluate a run's saved weights (model.safetensors) on its test set, or on --data
    /// (a file of the recipe's data format); prints accuracy and loss and writes
    /// eval-<time>.json in the run directory. No training.
    Eval {
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
    /// List the shipped recipes, the models and the data formats.
    Ls,
    /// Print the JSON Schema of the recipe format (editors use it to check and complete).
    Schema {
        /// Write it to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
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

#[derive(Args, Clone)]
struct CheckArgs {
    /// Recipe files (TOML).
    #[arg(required = true)]
    recipes: Vec<PathBuf>,
    /// Override a recipe key, typed by the format: --set loader.workers=4 (repeatable).
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
    /// Grids: skip cells already done (by this or an earlier sweep of the same grid).
    #[arg(long)]
    resume: bool,
    /// Grids: run only shard I of N (cells I-1, I-1+N, ...), e.g. --shard 2/4.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Grids: run only the cell with this index (what each Slurm array task does).
    #[arg(long)]
    cell: Option<usize>,
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
    runner::kernels::observe_cubecl();
    let cli = Cli::parse();
    match cli.command {
        None => run_all(&cli.run),
        Some(Command::Run(args)) => run_all(&args),
        Some(Command::Sweep(args)) if args.slurm => slurm(&args),
        Some(Command::Sweep(args)) => run_all(&args.run),
        Some(Command::Validate(args)) => validate(&args),
        Some(Command::Warmup { check, quiet }) => warmup(&check, quiet),
        Some(Command::Resume { run_dir, quiet }) => resume(&run_dir, quiet),
        Some(Command::Eval {
            run_dir,
            data,
            best,
        }) => eval(&run_dir, data.as_deref(), best),
        Some(Command::Show { check, cell }) => show(&check, cell),
        Some(Command::Ls) => ls(),
        Some(Command::Schema { output }) => schema(output.as_deref()),
        Some(Command::Report {
            paths,
            baseline,
            format,
            plot,
        }) => report_cmd(&paths, baseline.as_deref(), format, plot.as_deref()),
    }
}

/// Loads, expands and validates every recipe, printing every finding; `None` on any error.
fn check_all(args: &CheckArgs, machine: &Machine) -> Option<Vec<Checked>> {
    if args.max_cells == 0 {
        eprintln!(
            "error: --max-cells 0 allows no cell\n  = help: use at least 1 (the default is {})",
            sweep::DEFAULT_MAX_CELLS
        );
        return None;
    }
    let mut out = vec![];
    let mut ok = true;
    for path in &args.recipes {
        let result = sweep::check(path, &args.sets, machine, args.max_cells);
        match result {
            Ok(c) => {
                let mut warned = vec![];
                for w in c.plans.iter().flat_map(|p| &p.warnings) {
                    let text = w.to_string();
                    if !warned.contains(&text) {
                        eprintln!("{text}");
                        warned.push(text);
                    }
                }
                out.push(c);
            }
            Err(report) => {
                eprintln!("{report}");
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// Where a recipe is checked without this machine: a CUDA recipe is valid on a laptop.
fn any_machine() -> Machine {
    Machine {
        cuda_compiled: true,
        cuda_devices: Ok(usize::MAX),
        host_memory: None,
        gpu_memory: vec![],
    }
}

fn validate(args: &CheckArgs) -> ExitCode {
    let Some(all) = check_all(args, &any_machine()) else {
        return ExitCode::from(2);
    };
    for c in all {
        if c.grid {
            println!(
                "ok: {} (grid of {} cells: {})",
                c.path.display(),
                c.cells.len(),
                c.cells
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        } else {
            let p = &c.plans[0];
            println!(
                "ok: {} ({}: {} optimizer steps of {} × {} samples)",
                c.path.display(),
                p.name,
                p.run.total_steps,
                p.loader.batch_size,
                p.optim.accumulation_steps
            );
        }
    }
    ExitCode::SUCCESS
}

fn show(args: &CheckArgs, cell: Option<usize>) -> ExitCode {
    let Some(all) = check_all(args, &any_machine()) else {
        return ExitCode::from(2);
    };
    for c in all {
        match (c.grid, cell) {
            (true, None) => {
                println!(
                    "# {}: a grid of {} cells (runner show --cell N for one)",
                    c.path.display(),
                    c.cells.len()
                );
                for cell in &c.cells {
                    println!("{:>4}  {}  {}", cell.index, cell.id, cell.name);
                }
            }
            (_, Some(i)) if i >= c.cells.len() => {
                eprintln!(
                    "error: --cell {i}: {} has {} cell(s), 0 to {}",
                    c.path.display(),
                    c.cells.len(),
                    c.cells.len() - 1
                );
                return ExitCode::from(2);
            }
            (_, i) => {
                let p = &c.plans[i.unwrap_or(0)];
                print!(
                    "# {} (cell {}, id {})\n{}",
                    c.path.display(),
                    i.unwrap_or(0),
                    c.cells[i.unwrap_or(0)].id,
                    toml::to_string(&p.resolved).unwrap_or_default()
                );
            }
        }
    }
    ExitCode::SUCCESS
}

fn run_all(args: &RunArgs) -> ExitCode {
    let machine = runner::backend::probe();
    // Every recipe, every cell, is checked before the first one runs.
    let Some(all) = check_all(&args.check, &machine) else {
        return ExitCode::from(2);
    };
    let shard = match args.shard.as_deref().map(sweep::parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for c in &all {
        if !c.grid && (shard.is_some() || args.cell.is_some() || args.resume) {
            eprintln!(
                "error: {}: --shard, --cell and --resume apply to recipes with a [sweep] table",
                c.path.display()
            );
            return ExitCode::from(2);
        }
        if let Some(i) = args.cell.filter(|&i| i >= c.cells.len()) {
            eprintln!(
                "error: --cell {i}: {} has {} cells, 0 to {}",
                c.path.display(),
                c.cells.len(),
                c.cells.len() - 1
            );
            return ExitCode::from(2);
        }
    }
    let opts = RunOptions { quiet: args.quiet };
    runner::signals::install();
    let mut code = ExitCode::SUCCESS;
    for c in &all {
        let outcome = if c.grid {
            run_grid(
                c,
                Selection {
                    shard,
                    only: args.cell,
                    resume: args.resume,
                },
                &opts,
            )
        } else {
            run_one(&c.plans[0], &opts).map(|_| ())
        };
        match outcome {
            Ok(()) => {}
            // Already said where it happened (run_one, run_grid).
            Err(RunError::Failed { .. }) => code = ExitCode::from(1),
            Err(e @ RunError::Interrupted { .. }) => return ExitCode::from(e.exit_code()),
            Err(e @ (RunError::Input(_) | RunError::Io(_))) => {
                eprintln!("{e}");
                return ExitCode::from(e.exit_code());
            }
        }
    }
    code
}

fn resume(run_dir: &Path, quiet: bool) -> ExitCode {
    runner::signals::install();
    let opts = RunOptions { quiet };
    match run::resume(run_dir, &opts, &runner::backend::probe()) {
        Ok(f) => {
            let s = &f.summary;
            println!(
                "{}: completed, {} steps in all ({} resume(s)), final loss {:.4}, {}",
                s.name,
                s.steps,
                s.resumes,
                s.final_loss.unwrap_or(f64::NAN),
                f.dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            match &e {
                RunError::Failed { dir, message } => eprintln!(
                    "error: the resumed run failed: {message}\n  = note: what was recorded is in {}",
                    dir.display()
                ),
                RunError::Interrupted { dir, .. } => {
                    eprintln!("{e}; resume it again with: runner resume {}", dir.display())
                }
                _ => eprintln!("{e}"),
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn eval(run_dir: &Path, data: Option<&Path>, best: bool) -> ExitCode {
    match run::eval(run_dir, data, best, &runner::backend::probe()) {
        Ok(r) => {
            println!(
                "accuracy {:.2}% on {} samples, loss {:.4} ({}, {:.1} s)",
                100.0 * r.accuracy,
                r.samples,
                r.loss,
                r.weights.display(),
                r.ms / 1e3
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// What decides the kernels a plan compiles and tunes: plans equal in this warm up once.
fn kernel_key(p: &Plan) -> String {
    let o = &p.optim;
    let text_order = p.data.text.as_ref().map(|_| (p.seed, p.loader.shuffle));
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{}|{}|{}|{}|{:?}|{:?}|{:?}",
        p.device,
        p.kernels,
        p.model,
        p.data,
        p.loader.batch_size,
        p.loader.drop_last,
        text_order,
        o.momentum > 0.0,
        o.nesterov,
        o.weight_decay > 0.0,
        o.accumulation_steps,
        o.optimizer,
        p.cleanup.actions,
        p.run.eval,
    )
}

fn warmup(args: &CheckArgs, quiet: bool) -> ExitCode {
    let machine = runner::backend::probe();
    let Some(checked) = check_all(args, &machine) else {
        return ExitCode::from(2);
    };
    let mut seen = std::collections::HashSet::new();
    let mut code = ExitCode::SUCCESS;
    for p in checked.iter().flat_map(|c| &c.plans) {
        if !seen.insert(kernel_key(p)) {
            continue;
        }
        let (backend, _) = runner::backend::describe(p.device, &p.kernels);
        if !quiet {
            eprintln!("{}: warming up on {backend} ({})", p.name, p.device_reason);
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
                println!(
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
                eprintln!("error: the warm-up of {} failed: {message}", p.name);
                code = ExitCode::from(1);
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(e.exit_code());
            }
        }
    }
    code
}

fn run_one(p: &Plan, opts: &RunOptions) -> Result<PathBuf, RunError> {
    if !opts.quiet {
        eprintln!(
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
    match result {
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
            Ok(f.dir)
        }
        Err(RunError::Failed { dir, message }) => {
            eprintln!(
                "error: run {} failed: {message}\n  = note: what was recorded is in {}",
                p.name,
                dir.display()
            );
            Err(RunError::Failed { dir, message })
        }
        Err(RunError::Interrupted { dir, signal }) => {
            eprintln!(
                "{}: interrupted by {}; what was recorded is in {} (status \"interrupted\")",
                p.name,
                runner::signals::name(signal),
                dir.display()
            );
            Err(RunError::Interrupted { dir, signal })
        }
        Err(e) => Err(e),
    }
}

fn run_grid(c: &Checked, sel: Selection, opts: &RunOptions) -> Result<(), RunError> {
    let root = &c.plans[0].log.dir;
    let dir = SweepDir::open(root, &c.base, &c.path, &c.cells).map_err(|e| {
        RunError::Input(format!(
            "error: cannot create the sweep directory under {}: {e}\n  = help: check log.dir",
            root.display()
        ))
    })?;
    eprintln!(
        "sweep {}: {} cells, state in {}",
        c.base,
        c.cells.len(),
        dir.dir.display()
    );
    let mut stop: Option<RunError> = None;
    let resuming = sel.resume;
    let outcome = sweep::execute(&dir, &c.cells, sel, |cell, previous| {
        let end = |dir, message, state, stop_sweep| CellEnd {
            dir,
            message,
            state,
            stop_sweep,
        };
        // With --resume, a cell whose run stopped (a signal, a killed process: this process
        // holds its lock now) continues from its checkpoint rather than starting over.
        let stopped_run = previous
            .filter(|s| resuming && matches!(s.state, State::Interrupted | State::Running))
            .and_then(|s| s.run_dir)
            .filter(|d| runner::checkpoint::latest(d).is_some());
        let result = match stopped_run {
            Some(run_dir) => {
                if !opts.quiet {
                    eprintln!("{}: resuming {}", cell.name, run_dir.display());
                }
                run::resume(&run_dir, opts, &runner::backend::probe()).map(|f| f.dir)
            }
            None => run_one(&c.plans[cell.index], opts),
        };
        match result {
            Ok(d) => Ok(d),
            Err(RunError::Failed { dir, message }) => {
                Err(end(Some(dir), message, State::Failed, false))
            }
            Err(RunError::Interrupted { dir, signal }) => {
                let message = format!("interrupted by {}", runner::signals::name(signal));
                stop = Some(RunError::Interrupted {
                    dir: dir.clone(),
                    signal,
                });
                Err(end(Some(dir), message, State::Interrupted, true))
            }
            // Input every cell shares (a data file) is bad: the rest would fail the same.
            Err(e @ (RunError::Input(_) | RunError::Io(_))) => {
                let msg = e.to_string();
                stop = Some(e);
                Err(end(None, msg, State::Failed, true))
            }
        }
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
    for (i, owner) in &outcome.busy {
        eprintln!("cell {i}: left to {owner}, which holds its lock");
    }
    if !outcome.skipped.is_empty() {
        eprintln!(
            "resumed: {} cell(s) already done were skipped",
            outcome.skipped.len()
        );
    }
    // The comparison over every cell done so far, by this process or any other shard.
    let done: Vec<PathBuf> = c
        .cells
        .iter()
        .filter(|cell| dir.is_done(cell))
        .filter_map(|cell| dir.status(cell)?.run_dir)
        .collect();
    if !done.is_empty() {
        match done
            .iter()
            .map(|d| report::load_run(d))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|runs| report::rows(&runs, None))
        {
            Ok(rows) => {
                println!("\n{} of {} cells done:", done.len(), c.cells.len());
                print!("{}", report::render(&rows, report::Format::Table));
            }
            Err(e) => eprintln!("{e}"),
        }
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

fn slurm(args: &SweepArgs) -> ExitCode {
    let Some(all) = check_all(&args.run.check, &any_machine()) else {
        return ExitCode::from(2);
    };
    // Refused before anything is written.
    if args.shards == Some(0) {
        eprintln!("error: --shards must be at least 1");
        return ExitCode::from(2);
    }
    if let Some(c) = all.iter().find(|c| !c.grid) {
        eprintln!(
            "error: {}: has no [sweep] table, so there is no grid to split into array tasks\n  = help: run it with `runner {}` (in an sbatch script of your own), or add a [sweep] table",
            c.path.display(),
            c.path.display()
        );
        return ExitCode::from(2);
    }
    for c in &all {
        let (script, tasks) = match slurm::write(c, &args.run.check.sets, args.shards) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        };
        println!(
            "{}: {} array task(s) in {}",
            c.path.display(),
            tasks,
            script.display()
        );
        if args.submit {
            if let Err((code, e)) = slurm::submit(&script) {
                eprintln!("{e}");
                return ExitCode::from(code);
            }
        }
    }
    ExitCode::SUCCESS
}

fn ls() -> ExitCode {
    let dir = [
        PathBuf::from("recipes"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes"),
    ]
    .into_iter()
    .find(|d| d.is_dir());
    println!("recipes:");
    match dir {
        Some(d) => {
            let mut files = vec![];
            let mut stack = vec![d.clone()];
            while let Some(x) = stack.pop() {
                for e in std::fs::read_dir(&x).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|e| e == "toml") {
                        files.push(p);
                    }
                }
            }
            files.sort();
            for f in files {
                let about = recipe::load(&f)
                    .map(|l| l.recipe.description)
                    .unwrap_or_else(|_| "(does not validate)".into());
                println!("  {:<45} {about}", f.display());
            }
        }
        None => println!("  (no recipes/ directory here)"),
    }
    println!("models (model.arch):");
    for a in runner::recipe::Arch::ALL {
        println!("  {:<12} {}", a.name(), a.about());
    }
    println!("data formats (data.format):");
    for f in runner::recipe::DataFormat::ALL {
        println!("  {:<12} {}", f.name(), f.about());
    }
    ExitCode::SUCCESS
}

fn schema(output: Option<&Path>) -> ExitCode {
    let text = serde_json::to_string_pretty(&recipe::schema::json_schema()).expect("schema") + "\n";
    match output {
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(p) => match std::fs::write(p, text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {}: {e}", p.display());
                ExitCode::from(2)
            }
        },
    }
}

fn report_cmd(
    paths: &[PathBuf],
    baseline: Option<&str>,
    format: report::Format,
    plot: Option<&Path>,
) -> ExitCode {
    let result = (|| {
        let dirs = report::find_runs(paths)?;
        let runs = dirs
            .iter()
            .map(|d| report::load_run(d))
            .collect::<Result<Vec<_>, _>>()?;
        // Only completed runs are averaged; the others are listed with what became of them.
        let (runs, excluded) = report::split_completed(runs);
        if !excluded.is_empty() {
            eprintln!(
                "not in the table ({} run(s) did not complete):",
                excluded.len()
            );
            for x in &excluded {
                eprintln!("  {}: {}", x.dir.display(), x.why);
            }
        }
        if runs.is_empty() {
            eprintln!("error: no completed run to compare");
            return Ok(false);
        }
        let rows = report::rows(&runs, baseline)?;
        print!("{}", report::render(&rows, format));
        if let Some(p) = plot {
            runner::plot::draw(p, &runs, &rows)
                .map_err(|e| report::ReportError(format!("error: cannot draw the plot: {e}")))?;
            eprintln!("plot: {}", p.display());
        }
        Ok::<_, report::ReportError>(true)
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // Nothing to compare is not bad input: the runs failed.
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
