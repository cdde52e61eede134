//! `runner resume`: an interrupted run continued in its own directory from its latest
//! checkpoint.

use super::*;

/// Continues an interrupted run in its own directory from its latest checkpoint: the
/// remaining batches are those the uninterrupted run would have seen, `metrics.jsonl`
/// goes on after the checkpoint's last line, and the summary covers the whole run.
pub fn resume(
    run_dir: &Path,
    opts: &RunOptions,
    machine: &crate::plan::Machine,
) -> Result<Finished, RunError> {
    let input = |m: String| RunError::Input(m);
    let recipe_path = run_recipe(run_dir)?;
    let summary_path = run_dir.join("summary.json");
    let mut summary: Summary = std::fs::read_to_string(&summary_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            input(format!(
                "error: {}: missing or unreadable",
                summary_path.display()
            ))
        })?;
    if summary.status == "completed" {
        return Err(input(format!(
            "error: {}: the run already completed; nothing to resume",
            run_dir.display()
        )));
    }
    let plan = run_plan(&recipe_path, &[], machine)?;
    let sha = sha256_file(&recipe_path);
    let metrics_path = run_dir.join("metrics.jsonl");
    let (ckpt_dir, state) = latest_checkpoint(run_dir, &metrics_path)?;
    if state.recipe_sha256 != sha {
        return Err(input(format!(
            "error: {} was changed after {} was written; a checkpoint resumes only the recipe that wrote it",
            recipe_path.display(),
            ckpt_dir.display()
        )));
    }
    let prepared = prepare(&plan, opts)?;
    let fail = |message: String| RunError::Failed {
        dir: run_dir.to_path_buf(),
        message,
    };
    let (metrics, records) = JsonLines::reopen::<StepRecord>(&metrics_path, state.metrics_lines)
        .map_err(|e| fail(format!("{}: {e}", metrics_path.display())))?;
    let evals = rewind(&mut summary, &state);
    write_json_atomic(&summary_path, &summary).map_err(|e| fail(format!("summary.json: {e}")))?;
    let env = environment(&plan, &prepared);
    if !opts.quiet {
        crate::errln!(
            "{}: resuming from {} (step {}, epoch {}, batch {})",
            plan.name,
            ckpt_dir.display(),
            state.step,
            state.epoch + 1,
            state.batch
        );
    }
    let files = Files {
        dir: run_dir.to_path_buf(),
        env,
        summary,
        metrics,
        records,
        evals,
        resume: Some((ckpt_dir, state)),
    };
    drive(&plan, opts, prepared, files)
}

/// The latest checkpoint whose metrics lines are all there (a crash between writing a
/// checkpoint and its step's line leaves one line short: the one before is used).
fn latest_checkpoint(
    run_dir: &Path,
    metrics_path: &Path,
) -> Result<(PathBuf, crate::checkpoint::State), RunError> {
    let lines = std::fs::read_to_string(metrics_path)
        .map(|t| t.lines().count() as u64)
        .unwrap_or(0);
    crate::checkpoint::list(run_dir)
        .into_iter()
        .rev()
        .find(|(_, s)| s.metrics_lines <= lines)
        .ok_or_else(|| {
            RunError::Input(format!(
                "error: {} has no checkpoint to resume from\n  = help: checkpoints are written by [checkpoint] every = N (or \"epoch\"), and when SIGINT/SIGTERM stops a run",
                run_dir.display()
            ))
        })
}

/// The summary as it was at the checkpoint, marked running again in this process;
/// returns the test evaluations up to the checkpoint.
fn rewind(summary: &mut Summary, state: &crate::checkpoint::State) -> Vec<EvalRecord> {
    let evals = summary
        .evals
        .iter()
        .filter(|e| e.step <= state.step)
        .cloned()
        .collect();
    summary.validations.retain(|e| e.step <= state.step);
    summary.best_step = state.best.map(|b| b.0);
    summary.best_value = state.best.map(|b| b.1);
    summary.status = "running".into();
    summary.error = None;
    summary.pid = Some(std::process::id());
    summary.host = crate::clock::hostname();
    summary.resumes += 1;
    evals
}
