//! The commands that only read: `validate`, `show`, `ls`, `schema` and `report`.

use runner::recipe;
use runner::report;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::*;

pub(crate) fn validate(args: &CheckArgs) -> ExitCode {
    // Each file's verdict: those that validate are said too when others do not (a call
    // with one bad file printed no `ok:` line, and no count).
    let Some((all, failed)) = check_each(args, &any_machine(), true) else {
        return ExitCode::from(2);
    };
    // On this machine, as a run would find it: said, not refused, since the recipe may be
    // meant for another machine (a cluster's scratch folder linked from here).
    for (recipe, dir, runs) in crate::cli::run::log_dirs(&all) {
        if let Some(why) = crate::cli::run::log_dir_problem(&runs) {
            runner::errln!(
                "warning: {}: log.dir: {} {why}\n  = help: a run of it on this machine is refused; point log.dir (or --set log.dir=...) at a folder this user can write",
                recipe.display(),
                dir.display()
            );
        }
    }
    for c in all {
        if c.grid {
            // The first cells by name; `runner show` lists them all (a 100 × 100 grid's
            // line was 377 KB).
            let mut names: Vec<&str> = c.cells.iter().take(8).map(|c| c.name.as_str()).collect();
            let more = c.cells.len().saturating_sub(names.len());
            let rest = format!("{more} more: runner show lists them");
            if more > 0 {
                names.push(&rest);
            }
            runner::outln!(
                "ok: {} (grid of {} cell{}: {})",
                c.path.display(),
                c.cells.len(),
                if c.cells.len() == 1 { "" } else { "s" },
                names.join(" | ")
            );
        } else {
            let p = &c.plans[0];
            // What a step holds, not what the recipe asks (a batch larger than the data
            // holds the data; accumulation stops at the epoch's end).
            let batch = p.batch_rows();
            let acc = (p.optim.accumulation_steps as u64).min(p.run.micro_batches_per_epoch.max(1));
            runner::outln!(
                "ok: {} ({}: {} optimizer step{} of {} × {} samples)",
                c.path.display(),
                p.name,
                p.run.total_steps,
                if p.run.total_steps == 1 { "" } else { "s" },
                batch,
                acc
            );
        }
    }
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    if args.recipes.len() > 1 {
        let names: Vec<String> = failed.iter().map(|p| p.display().to_string()).collect();
        runner::errln!(
            "{} of {} recipes do not validate: {}",
            failed.len(),
            args.recipes.len(),
            names.join(", ")
        );
    }
    ExitCode::from(2)
}

pub(crate) fn show(args: &CheckArgs, cell: Option<usize>) -> ExitCode {
    // One cell's warnings are its own, said below (every cell's were said of cell 0).
    let checked = check_each(args, &any_machine(), cell.is_none());
    let Some(all) = checked.and_then(|(out, failed)| failed.is_empty().then_some(out)) else {
        return ExitCode::from(2);
    };
    for c in all {
        match (c.grid, cell) {
            (true, None) => {
                runner::outln!(
                    "# {}: a grid of {} cells ({} show {} --cell N for one)",
                    c.path.display(),
                    c.cells.len(),
                    runner::program(),
                    runner::slurm::shell_word(&c.path.display().to_string()),
                );
                for cell in &c.cells {
                    runner::outln!("{:>4}  {}  {}", cell.index, cell.id, cell.name);
                }
            }
            // As `runner run --cell` refuses it: a recipe without [sweep] has no cells.
            (false, Some(i)) => {
                runner::errln!(
                    "error: --cell {i}: {} has no [sweep] table, so no cells\n  = help: `runner show {}` prints it",
                    c.path.display(),
                    c.path.display()
                );
                return ExitCode::from(2);
            }
            (true, Some(i)) if i >= c.cells.len() => {
                runner::errln!(
                    "error: --cell {i}: {} has {} cells, 0 to {}",
                    c.path.display(),
                    c.cells.len(),
                    c.cells.len() - 1
                );
                return ExitCode::from(2);
            }
            (grid, i) => {
                let at = i.unwrap_or(0);
                if i.is_some() {
                    for w in &c.plans[at].warnings {
                        runner::errln!("{w}");
                    }
                }
                // A recipe that is not a grid is not a cell (it said "cell 0").
                let which = match grid {
                    true => format!("cell {at}, id {}", c.cells[at].id),
                    false => format!("id {}", c.cells[at].id),
                };
                runner::out!(
                    "# {} ({which})\n{}",
                    c.path.display(),
                    toml::to_string(&c.plans[at].resolved).unwrap_or_default()
                );
            }
        }
    }
    ExitCode::SUCCESS
}

pub(crate) fn ls() -> ExitCode {
    // The current directory's only: the checkout the binary was built from listed its
    // own recipes anywhere, paths that do not resolve from where the user stands.
    let dir = Some(PathBuf::from("recipes")).filter(|d| d.is_dir());
    runner::outln!("recipes:");
    match dir {
        Some(d) => {
            let mut files = vec![];
            let mut stack = vec![d.clone()];
            // Each folder once, by where it really is: a linked folder is followed (a
            // team's recipes linked in, which run and validate took, were not listed), a
            // link back up (`up -> ..`, which listed the tree 800 times over) is not.
            let mut seen = std::collections::HashSet::new();
            while let Some(x) = stack.pop() {
                if !seen.insert(std::fs::canonicalize(&x).unwrap_or_else(|_| x.clone())) {
                    continue;
                }
                for e in std::fs::read_dir(&x).into_iter().flatten().flatten() {
                    // Only regular files are read (a pipe named `*.toml` blocked the
                    // listing).
                    let Ok(kind) = e.file_type() else { continue };
                    let p = e.path();
                    if kind.is_dir() || (kind.is_symlink() && p.is_dir()) {
                        stack.push(p);
                    } else if p.extension().is_some_and(|e| e == "toml") && p.is_file() {
                        files.push(p);
                    } else if kind.is_symlink()
                        && p.extension().is_some_and(|e| e == "toml")
                        && !p.exists()
                    {
                        // Listed, not left out in silence.
                        files.push(p);
                    }
                }
            }
            files.sort();
            let width = files.iter().map(|f| runner::columns::width(&f.display().to_string()));
            let width = width.max().unwrap_or(0);
            // Checked as `runner validate` checks (it said "does not validate" only of a
            // file that was not TOML, and listed one missing model.arch as fine).
            for f in files {
                let (description, note) = if !f.exists() {
                    (String::new(), "(a link to nothing)")
                } else {
                    let checked = runner::sweep::check(&f, &[], &any_machine(), runner::sweep::DEFAULT_MAX_CELLS);
                    let invalid = "(does not validate: runner validate says why)";
                    match (recipe::load(&f), checked) {
                        (Ok(l), Ok(_)) => (l.recipe.description, ""),
                        (Ok(l), Err(_)) => (l.recipe.description, invalid),
                        _ => (String::new(), invalid),
                    }
                };
                let about = [about_line(&description), note.to_string()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                let name = runner::columns::pad_right(&f.display().to_string(), width);
                runner::outln!("  {name}  {about}");
            }
        }
        None => runner::outln!(
            "  (no recipes/ directory here: run `runner ls` in a checkout of runner, whose recipes/ holds the shipped ones)"
        ),
    }
    runner::outln!("models (model.arch):");
    for a in runner::recipe::Arch::ALL {
        runner::outln!("  {:<12} {}", a.name(), a.about());
    }
    runner::outln!("data formats (data.format):");
    for f in runner::recipe::DataFormat::ALL {
        runner::outln!("  {:<12} {}", f.name(), f.about());
    }
    runner::outln!("devices (backend.kind, backend.device):");
    for line in devices() {
        runner::outln!("  {line}");
    }
    ExitCode::SUCCESS
}

/// The columns of a recipe's description in `runner ls`.
const ABOUT_COLUMNS: usize = 100;

/// A recipe's description as `ls` lists it: its first line, cut to `ABOUT_COLUMNS` (a
/// 200 KB description filled the screen, and one of several lines broke the listing),
/// control characters escaped (an ESC in a shared recipe's description reached the
/// terminal as it was).
fn about_line(description: &str) -> String {
    let description = description.trim();
    let first = description.lines().next().unwrap_or("").trim();
    let shown = runner::columns::head(&runner::columns::escaped(first, false), ABOUT_COLUMNS);
    if first.len() < description.len() && !shown.ends_with('…') {
        shown + " …"
    } else {
        shown
    }
}

/// What each backend would run on here: the CPU, the CUDA devices the driver reports and
/// the WebGPU adapters, each with the `backend.device` index that names it, or why none.
fn devices() -> Vec<String> {
    let mut out = vec![format!(
        "{:<12} {} ({} CPUs available)",
        "cpu",
        runner::backend::cpu_name(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )];
    match runner::backend::cuda_gpus() {
        Ok(gpus) if gpus.is_empty() => out.push(format!("{:<12} none found", "cuda")),
        Ok(gpus) => {
            for (i, (name, memory)) in gpus.iter().enumerate() {
                let memory = runner::plan::resources::gib(*memory);
                out.push(format!("{:<12} {i}: {name}, {memory}", "cuda"));
            }
            // What compiles its kernels: a device is no use to a run without it.
            if let Some(t) = runner::backend::cuda_toolchain() {
                out.push(format!("{:<12} kernels: {}", "cuda", t.describe()));
                if let Some((why, help)) = t.problem() {
                    out.push(format!("{:<12} cannot run: {why}; {help}", "cuda"));
                }
            }
        }
        Err(why) => out.push(format!("{:<12} {why}", "cuda")),
    }
    if !cfg!(feature = "wgpu") {
        out.push(format!(
            "{:<12} this binary was built without the `wgpu` feature",
            "wgpu"
        ));
    } else {
        let adapters = runner::backend::wgpu_adapters();
        if adapters.is_empty() {
            out.push(format!(
                "{:<12} no adapter found (no Vulkan driver answers)",
                "wgpu"
            ));
        }
        for a in adapters {
            out.push(format!(
                "{:<12} {}: {} ({})",
                "wgpu",
                a.target.index,
                a.name,
                a.target.kind.name()
            ));
        }
    }
    out
}

pub(crate) fn schema(output: Option<&Path>) -> ExitCode {
    let text = serde_json::to_string_pretty(&recipe::schema::json_schema()).expect("schema") + "\n";
    match output {
        None => {
            runner::out!("{text}");
            ExitCode::SUCCESS
        }
        // A file there that is not a JSON Schema (a recipe, a dataset, a typo'd name) is
        // not overwritten: it was, with exit 0.
        Some(p) if p.is_dir() => {
            runner::errln!(
                "error: {}: is a directory\n  = help: give a file name, e.g. -o recipe.schema.json",
                p.display()
            );
            ExitCode::from(2)
        }
        // A pipe there would block the check's read (and the write); a device (`/dev/null`,
        // a terminal's `/dev/stdout`) is written as it is, unchecked.
        Some(p)
            if p.exists() && !p.is_file() && runner::recipe::odd_kind(p) != Some("a device") =>
        {
            runner::errln!(
                "error: {}: is not a regular file (a pipe or a device?): not written\n  = help: give a file name, e.g. -o recipe.schema.json",
                p.display()
            );
            ExitCode::from(2)
        }
        Some(p) if p.is_file() && !is_recipe_schema(p) => {
            runner::errln!(
                "error: {}: exists and is not runner's recipe schema: not overwritten\n  = help: remove it, or choose another name",
                p.display()
            );
            ExitCode::from(2)
        }
        Some(p) => match std::fs::write(p, text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                runner::errln!(
                    "error: {}: {e}\n  = help: write it into a folder that exists and you may write to",
                    p.display()
                );
                ExitCode::from(2)
            }
        },
    }
}

/// Whether the file at `p` is empty or is runner's recipe schema (an earlier `runner
/// schema -o`, however reformatted): a JSON object with a `$schema` and the title "runner
/// recipe" (any JSON Schema was taken, and a tsconfig or renovate.json naming its `$schema`
/// was overwritten). Read only up to a few MiB, so a large dataset there is not read whole.
fn is_recipe_schema(p: &Path) -> bool {
    use std::io::Read;
    let mut text = vec![];
    let read = std::fs::File::open(p).and_then(|f| f.take(4 << 20).read_to_end(&mut text));
    if read.is_err() {
        return false;
    }
    text.is_empty()
        || serde_json::from_slice::<serde_json::Value>(&text).is_ok_and(|v| {
            v.get("$schema").is_some()
                && v.get("title").and_then(|t| t.as_str()) == Some(recipe::schema::TITLE)
        })
}

pub(crate) fn report_cmd(
    paths: &[PathBuf],
    baseline: Option<&str>,
    format: report::Format,
    plot: Option<&Path>,
) -> ExitCode {
    if let Some(Err(e)) = plot.map(runner::plot::check_target) {
        runner::errln!(
            "error: --plot {}: {e}",
            plot.unwrap_or(Path::new("")).display()
        );
        return ExitCode::from(2);
    }
    let result = (|| {
        let (dirs, reached_again) = report::find_runs_said(paths)?;
        // A run whose files cannot be read is listed, not the end of the report.
        let mut unreadable = reached_again;
        let runs = dirs
            .iter()
            .filter_map(|d| match report::load_run(d) {
                Ok(run) => Some(run),
                Err(e) => {
                    let why = e.to_string();
                    let why = why.strip_prefix("error: ").unwrap_or(&why);
                    unreadable.push(report::Excluded {
                        dir: d.clone(),
                        why: format!("unreadable: {}", why.lines().next().unwrap_or_default()),
                    });
                    None
                }
            })
            .collect();
        // Only completed runs are averaged; the others are listed with what became of them.
        let (runs, mut excluded) = report::split_completed(runs);
        excluded.extend(unreadable);
        if !excluded.is_empty() {
            runner::errln!(
                "not in the table ({} run(s); each with why):",
                excluded.len()
            );
            for x in &excluded {
                runner::errln!("  {}: {}", x.dir.display(), x.why);
            }
        }
        if runs.is_empty() {
            runner::errln!("error: no completed run to compare");
            return Ok(false);
        }
        // In the table, and said: runs that went on past a divergence (`run.stop_on_divergence
        // = false`) read like any other (its NaN losses and chance accuracy unmarked).
        let diverged: Vec<_> = runs
            .iter()
            .filter_map(|r| Some((r, r.summary.diverged_at_step?)))
            .collect();
        if !diverged.is_empty() {
            runner::errln!(
                "note: in the table, {} run(s) that diverged and went on (run.stop_on_divergence = false): their figures are of a diverged model",
                diverged.len()
            );
            for (r, step) in &diverged {
                runner::errln!("  {}: diverged at step {step}", r.dir.display());
            }
        }
        let rows = report::rows(&runs, baseline)?;
        if let Some(note) = baseline.and_then(|b| report::baseline_note(&rows, b)) {
            runner::errln!("{note}");
        }
        runner::out!("{}", report::render(&rows, format));
        if let Some(p) = plot {
            runner::plot::draw(p, &runs, &rows).map_err(|e| {
                runner::error::Error::Input(format!("error: cannot draw the plot: {e}"))
            })?;
            runner::errln!("plot: {}", p.display());
        }
        Ok::<_, runner::error::Error>(true)
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // Nothing to compare is not bad input: the runs failed.
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            runner::errln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}
