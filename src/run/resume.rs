//! `runner resume`: an interrupted run continued in its own directory from its latest
//! checkpoint.

use super::*;

/// Continues an interrupted run in its own directory from its latest checkpoint: the
/// remaining batches are those the uninterrupted run would have seen, `metrics.jsonl`
/// goes on after the checkpoint's last line, and the summary covers the whole run.
/// Everything that could refuse it is checked before anything in the directory changes.
pub fn resume(
    run_dir: &Path,
    opts: &RunOptions,
    machine: &crate::plan::Machine,
) -> Result<Finished, RunError> {
    let input = |m: String| RunError::Input(m);
    let recipe_path = run_recipe(run_dir)?;
    refuse_odd_files(run_dir)?;
    let read_summary = read_summary(run_dir)?;
    let _lock = take_run_lock(run_dir)?;
    let mut plan = resume_plan(&recipe_path, machine)?;
    let threads_at_start = pin_cpu_threads(run_dir, &mut plan);
    pin_fusion(run_dir, &mut plan);
    let plan = plan;
    super::on_its_threads(&plan, || {
        let metrics_path = run_dir.join("metrics.jsonl");
        let (ckpt_dir, state, passed_over) = latest_checkpoint(run_dir, &metrics_path)?;
        let moved = same_recipe(run_dir, &recipe_path, &plan, (&ckpt_dir, &state))?;
        refuse_unwritable(run_dir, &plan)?;
        // Nothing is changed while the data loads: a signal then ends the process at once.
        // The process exits without unwinding: the lock this resume took goes here (left, it
        // refused a resume from another node or container for a minute).
        let lock_path = run_dir.join(RUN_LOCK);
        let loading = crate::signals::exit_before_first_step(move |_| {
            let _ = std::fs::remove_file(&lock_path);
            "exiting now, before the resume started: the run is as it was, to resume again".into()
        });
        let prepared = prepare(&plan, opts)?;
        drop(loading);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match threads_at_start {
        Some(n) if n != prepared.threads => crate::errln!(
            "warning: {}: the run started on {n} CPU threads, this resume runs on {}: the CPU's sums are split per thread, so its steps will not be bitwise those of the uninterrupted run (no pool of {n} threads could be started)",
            run_dir.display(),
            prepared.threads,
        ),
        Some(n) if n > cores => crate::errln!(
            "note: {}: resuming on {n} CPU threads as the run started, on {cores} cores here (slower than one per core; the same bits)",
            run_dir.display()
        ),
        _ => {}
    }
        let fail = |message: String| RunError::Failed {
            dir: run_dir.to_path_buf(),
            message,
        };
        // The data the run started on (env.json's `data`; runs of earlier versions have none):
        // the checkpoint's epoch and batch mean nothing on other data.
        let env = environment(&plan, &prepared);
        if let Some(changed) = data_changed(run_dir, &env.data, &moved) {
            return Err(input(format!(
            "error: {changed}\n  = help: resume continues a run on the data it started on; put the data back as it was, or start a new run on this data"
        )));
        }
        // A checkpoint that would not load (another model layout under the same recipe hash,
        // e.g. written by another version of the runner) is found before anything is changed.
        let vocab = prepared
            .sets
            .tokenizer
            .as_ref()
            .map_or(0, |t| t.vocab_size());
        let shape = crate::train::Batcher::new(&plan, vocab).shape;
        if let Err(e) = crate::checkpoint::fits(&plan, shape, &ckpt_dir) {
            return Err(input(format!(
            "error: {e}\n  = help: the checkpoint does not fit the model this recipe builds (written by another version of the runner?); resume it with the runner that wrote it"
        )));
        }
        // The vocabulary is made again from the training data (its sums checked above):
        // one that is not what the run trained with (its sum in the summary) would feed
        // the weights other token ids.
        let tokenizer = prepared.sets.tokenizer.as_ref().map(|t| (t, t.sha256()));
        if let (Some((_, made)), Ok(Some(wrote))) = (
            &tokenizer,
            read_summary.as_ref().map(|s| s.tokenizer_sha256.as_ref()),
        ) {
            if made != wrote {
                return Err(input(format!(
                    "error: {}: the vocabulary made from the training data is not the one the run trained with (the sum summary.json records for tokenizer.json)\n  = help: resume it with the runner that started it",
                    run_dir.display()
                )));
            }
        }
        // Nothing is written yet: a metrics file that cannot be continued is bad input.
        let mut kept = super::Kept::new(plan.run.warmup_steps);
        let metrics = JsonLines::reopen(&metrics_path, state.metrics_lines, |r: StepRecord| {
            kept.push(&r)
        })
        .map_err(|e| {
            input(format!(
                "error: {}: {e}\n  = help: metrics.jsonl is written by runner; restore it (the run cannot continue without the lines up to its checkpoint)",
                metrics_path.display()
            ))
        })?;
        set_aside(&passed_over);
        // The utilisation samples go on from the checkpoint too (they are extra: a file
        // that cannot be cut is said, and the run goes on).
        let samples = run_dir.join("samples.jsonl");
        if let Err(e) = crate::sampler::cut_after(&samples, kept.t_ms) {
            crate::errln!(
                "warning: {}: {e}; its samples after the checkpoint's step are not cut, so the resumed run's follow them",
                samples.display()
            );
        }
        let mut summary =
            read_summary.unwrap_or_else(|why| rebuilt_summary(run_dir, &plan, &prepared, &why));
        let evals = rewind(&mut summary, &state, &kept);
        summary.best_weights_sha256 = best_weights_at(run_dir, &state);
        if let Some((t, made)) = tokenizer {
            restore_tokenizer(run_dir, t, made, &mut summary).map_err(fail)?;
        }
        write_json_keeping_room(&run_dir.join("summary.json"), &summary, KEPT_ROOM)
            .map_err(|e| fail(format!("summary.json: {e}")))?;
        update_env(run_dir, &env, &moved, state.step).map_err(fail)?;
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
            kept,
            evals,
            resume: Some((ckpt_dir, state)),
        };
        drive(&plan, opts, prepared, files)
    })
}

/// A text run's `tokenizer.json`, missing or not the file the run wrote, written again
/// from the vocabulary the resume made (the run's, checked against its sum): the run went
/// on without it, and `runner eval` of the finished run then had no vocabulary, or scored
/// with another's.
fn restore_tokenizer(
    run_dir: &Path,
    t: &crate::data::text::Tokenizer,
    made: String,
    summary: &mut Summary,
) -> Result<(), String> {
    let path = run_dir.join("tokenizer.json");
    let on_disk = crate::checkpoint::sha256_of(&path).ok();
    if on_disk.as_deref() != Some(made.as_str()) {
        t.save(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        crate::errln!(
            "note: {}: {}; written again from the training data (the vocabulary the run trains with)",
            path.display(),
            match on_disk {
                Some(_) => "not the file the run wrote",
                None => "missing",
            }
        );
    }
    summary.tokenizer_sha256 = Some(made);
    Ok(())
}

/// `summary.json`'s `best_weights_sha256` for a run resumed from the checkpoint of
/// `state`: the SHA-256 of `model-best.safetensors` as the checkpoint recorded it, the
/// best weights of the step the resumed run starts from. A file that is not those is said
/// and not vouched for (a resume took the sum of whatever file it found, so `runner eval
/// --best` of a damaged one found nothing wrong): it is damaged, or a later best that a
/// process killed outright saved after its checkpoint, which the resumed run saves again
/// when it gets there. Checkpoints of earlier versions have no sum: the file as it is.
fn best_weights_at(run_dir: &Path, state: &crate::checkpoint::State) -> Option<String> {
    let path = run_dir.join(crate::train::BEST_WEIGHTS);
    let on_disk = crate::checkpoint::sha256_of(&path).ok();
    let Some(recorded) = &state.recorded else {
        return on_disk;
    };
    let saved = match (&recorded.best_weights_sha256, state.best) {
        (Some(saved), _) => saved.clone(),
        // None saved by then: a file there is a later best, saved again on the way.
        (None, None) => return None,
        // A best but no sum: checkpoints of an earlier version that recorded no sum.
        (None, Some(_)) => return on_disk,
    };
    if on_disk.as_deref() != Some(saved.as_str()) {
        let first = |h: &str| h.chars().take(12).collect::<String>();
        let found = match &on_disk {
            Some(h) => format!("its SHA-256 is {}…", first(h)),
            None => "it is missing".to_string(),
        };
        let of_step = state
            .best
            .map_or(String::new(), |b| format!(" (step {})", b.0));
        crate::errln!(
            "warning: {} is not the best weights{of_step} that the checkpoint of step {} recorded ({found}, the checkpoint's {}…): a later best saved by the process that stopped, which this resume saves again when it gets there, or a damaged file; until a best is saved again, `runner eval --best` says so",
            path.display(),
            state.step,
            first(&saved),
        );
    }
    Some(saved)
}

/// On the CPU, the thread count the run started with (`env.json`'s `threads`), taken by
/// this resume whatever its recipe.toml says: the convolutions' weight gradients add one
/// partial sum per thread, so another count gives other bits, and a resume on a machine
/// with more cores (or under `taskset`) drifted from its uninterrupted twin in silence. (A
/// grid cell's recipe could say another count than it ran on, before each run got a pool
/// of its own count.) Returns that count, where the run recorded one.
fn pin_cpu_threads(run_dir: &Path, plan: &mut Plan) -> Option<usize> {
    if !matches!(plan.device, crate::plan::Device::Cpu) {
        return None;
    }
    let env: serde_json::Value =
        serde_json::from_str(&crate::metrics::read_text(run_dir.join("env.json")).ok()?).ok()?;
    let n = usize::try_from(env.get("threads")?.as_u64()?)
        .ok()
        .filter(|n| (1..=crate::plan::MAX_THREADS).contains(n))?;
    plan.threads = n;
    Some(n)
}

/// A resume on CUDA or WebGPU runs with fusion as the run started (env.json's
/// `kernels.fusion`), though `backend.fusion = "auto"` would decide otherwise here (a
/// requeued Slurm task on another node, a shell with another CPU affinity): its steps go on
/// with the same kernels. Said when it differs from what this machine would choose.
fn pin_fusion(run_dir: &Path, plan: &mut Plan) {
    if matches!(plan.device, crate::plan::Device::Cpu) {
        return;
    }
    let Some(at_start) = crate::metrics::read_text(run_dir.join("env.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|env| env.get("kernels")?.get("fusion")?.as_bool())
    else {
        return;
    };
    let k = &mut plan.kernels;
    if k.fusion != at_start {
        crate::errln!(
            "note: {}: the run started {} fusion; this resume keeps to that, where {} would have chosen {} ({})",
            run_dir.display(),
            if at_start { "with" } else { "without" },
            "backend.fusion here",
            if k.fusion { "fusion" } else { "none" },
            k.fusion_reason,
        );
        k.fusion = at_start;
        k.fusion_reason = format!(
            "{}, as the run started (env.json)",
            if at_start { "on" } else { "off" }
        );
    }
}

/// The run's own files are read, or opened to go on writing: one that is there but is not
/// a file (a pipe would block the resume for good) is refused first.
fn refuse_odd_files(run_dir: &Path) -> Result<(), RunError> {
    let own = [
        "summary.json",
        "metrics.jsonl",
        "metrics.csv",
        "samples.jsonl",
    ];
    if let Some(odd) = own
        .iter()
        .map(|f| run_dir.join(f))
        .find(|p| p.symlink_metadata().is_ok() && !p.is_file())
    {
        let what = match crate::recipe::odd_kind(&odd) {
            Some(kind) => format!("is {kind}, not a file"),
            None => crate::recipe::why_missing(&odd),
        };
        return Err(RunError::Input(format!(
            "error: {}: {what}\n  = help: the runner writes it as a regular file; move it away, then resume",
            odd.display(),
        )));
    }
    // The folder of the checkpoints: a file there said "none was written".
    let checkpoints = run_dir.join("checkpoints");
    if checkpoints.symlink_metadata().is_ok() && !checkpoints.is_dir() {
        let what = match crate::recipe::odd_kind(&checkpoints) {
            Some(kind) => format!("is {kind}, not a folder"),
            None if checkpoints.exists() => "is a file, not a folder".into(),
            None => crate::recipe::why_missing(&checkpoints),
        };
        return Err(RunError::Input(format!(
            "error: {}: {what}\n  = help: the runner keeps the run's checkpoints in this folder; put it back (a copy of the run has it), then resume",
            checkpoints.display(),
        )));
    }
    Ok(())
}

/// The run's summary, or why it cannot be read (written again later, from the checkpoint);
/// a run that completed, or whose process still runs on this host, is refused.
fn read_summary(run_dir: &Path) -> Result<Result<Summary, String>, RunError> {
    let input = |m: String| RunError::Input(m);
    let summary_path = run_dir.join("summary.json");
    // A summary cut short (a crash during its rewrite in place on a full disk) or gone is
    // written again (`rebuilt_summary`) from the checkpoint and the metrics lines.
    let read_summary: Result<Summary, String> = match crate::metrics::read_text(&summary_path) {
        // One without its name or run id (`{}`: every field has a default) is as
        // unreadable: the resumed run had none, and the report grouped such runs.
        Ok(text) => serde_json::from_str::<Summary>(&text)
            .map_err(|e| format!("unreadable ({e})"))
            .and_then(|s| match s.name.is_empty() || s.run_id.is_empty() {
                true => Err("unreadable (it names no run: no name or run_id)".to_string()),
                false => Ok(s),
            }),
        // There but not text (it said "exists").
        Err(e) if summary_path.is_file() => Err(format!("unreadable ({e})")),
        Err(_) => Err(crate::recipe::why_missing(&summary_path)),
    };
    if let Ok(summary) = &read_summary {
        if summary.status == RunStatus::Completed {
            return Err(input(format!(
                "error: {}: the run already completed; nothing to resume",
                run_dir.display()
            )));
        }
        // Stopped by its loss: resumed, the same steps from the same checkpoint diverge
        // again.
        if let Some(why) = summary
            .error
            .as_deref()
            .filter(|e| summary.status == RunStatus::Failed && e.starts_with("diverged at step"))
        {
            let why = why.split(';').next().unwrap_or(why);
            return Err(input(format!(
                "error: {}: the run {why}; resumed, it would take the same steps from its last checkpoint and diverge again\n  = help: start a new run with a lower optim.lr (or a higher run.max_loss, or run.stop_on_divergence = false)",
                run_dir.display()
            )));
        }
        // One process at a time continues a run: two would write the same metrics lines.
        if let (RunStatus::Running, Process::Alive(pid)) = (summary.status, summary.process()) {
            if pid != std::process::id() {
                return Err(input(format!(
                    "error: {}: the run is still going (pid {pid})\n  = help: stop it first (SIGINT, SIGTERM, SIGHUP or SIGUSR1/2 writes a checkpoint), then resume",
                    run_dir.display()
                )));
            }
        }
    }
    Ok(read_summary)
}

/// `run.lock`, held while this process writes the run.
fn take_run_lock(run_dir: &Path) -> Result<crate::sweep::CellLock, RunError> {
    let input = |m: String| RunError::Input(m);
    // One process writes a run: a run or a resume on another node or in a container
    // (which the summary's pid cannot tell) holds `run.lock` while it goes.
    let lock_path = run_dir.join(RUN_LOCK);
    match crate::sweep::CellLock::acquire(&lock_path) {
        Ok(Ok(lock)) => Ok(lock),
        Ok(Err(owner)) => {
            let touched = std::fs::metadata(&lock_path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or(String::new(), |a| {
                    format!(", its heartbeat {} s ago", a.as_secs())
                });
            Err(input(format!(
                "error: {}: {owner} is running or resuming it ({RUN_LOCK}{touched})\n  = help: stop it first (SIGINT, SIGTERM, SIGHUP or SIGUSR1/2 writes a checkpoint), then resume; if that process is gone (its node died), its lock goes stale {} s after the last heartbeat: resume then",
                run_dir.display(),
                crate::sweep::LOCK_STALE_AFTER.as_secs()
            )))
        }
        Err(e) => Err(input(format!(
            "error: {}: cannot take {RUN_LOCK}: {e}\n  = help: a resume writes in the run directory (its lock, then the steps); {}",
            run_dir.display(),
            match e.kind() {
                std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied =>
                    "copy the run to a place this user can write (cp -a) and resume the copy, or resume it as the user who ran it",
                _ => "check the run directory's disk and permissions",
            }
        ))),
    }
}

/// The plan of the run's own recipe; a data file not where it names it is said with what
/// to do.
fn resume_plan(recipe_path: &Path, machine: &crate::plan::Machine) -> Result<Plan, RunError> {
    run_plan(recipe_path, &[], machine).map_err(|mut d| {
        // A data file that is not where the run's recipe names it (the data moved).
        let data_missing = d.0.iter_mut().find(|e| {
            e.is_error()
                && matches!(
                    e.key.as_deref(),
                    Some("data.train" | "data.test" | "data.validation_file")
                )
                && e.message.contains("does not exist")
        });
        if let Some(e) = data_missing {
            e.note = Some(format!(
                "a run's recipe.toml names its data by absolute path: put the file back there, or, if the data moved, edit the path in {}; resume takes the same files (by size and CRC-32) at a new path",
                recipe_path.display()
            ));
        }
        RunError::Input(d.to_string())
    })
}

/// The recipe is the one that wrote the checkpoint, or differs from it only in the paths
/// of data files that moved (the same by content): those, old and new, said in notes.
fn same_recipe(
    run_dir: &Path,
    recipe_path: &Path,
    plan: &Plan,
    (ckpt_dir, state): (&Path, &crate::checkpoint::State),
) -> Result<Vec<(String, String)>, RunError> {
    let sha = sha256_file(recipe_path);
    // Data files moved (scratch restored elsewhere, another mount point), their paths
    // edited in recipe.toml: the same recipe, when the files are the same by content and
    // the paths are all that changed.
    let moved = match state.recipe_sha256 != sha {
        true => data_moved(run_dir, recipe_path, plan, &state.recipe_sha256),
        false => Some(vec![]),
    };
    if let Some(moved) = moved.as_ref().filter(|m| !m.is_empty()) {
        for (old, new) in moved {
            crate::errln!("note: {old} is now {new} (the same size and CRC-32): resuming on it");
        }
    }
    let Some(moved) = moved else {
        return Err(RunError::Input(format!(
            "error: {} was changed after {} was written; a checkpoint resumes only the recipe that wrote it\n  = help: put recipe.toml back as the run wrote it, or run the changed recipe as a new run: {} {}",
            recipe_path.display(),
            ckpt_dir.display(),
            crate::program(),
            crate::slurm::shell_word(&recipe_path.display().to_string())
        )));
    };
    Ok(moved)
}

/// Every file the run goes on writing is writable, before anything is changed: a resume
/// that could not write one would otherwise fail after marking the run as running again.
/// (Seen before: a `samples.jsonl` or a `checkpoints/` of another user's let a resume train
/// to its end, then fail.)
fn refuse_unwritable(run_dir: &Path, plan: &Plan) -> Result<(), RunError> {
    let input = |m: String| RunError::Input(m);
    let metrics_path = run_dir.join("metrics.jsonl");
    let mut outputs = vec![metrics_path.clone(), run_dir.join("samples.jsonl")];
    if plan.log.csv {
        outputs.push(run_dir.join("metrics.csv"));
    }
    let cannot = |path: &Path, e: std::io::Error| {
        input(format!(
            "error: cannot write {}: {e}
  = help: resume goes on writing in the run's directory: check the owner and permissions of its files",
            path.display()
        ))
    };
    for path in outputs.iter().filter(|p| p.exists()) {
        if let Err(e) = std::fs::OpenOptions::new().append(true).open(path) {
            return Err(cannot(path, e));
        }
    }
    // summary.json, env.json and model.safetensors are written whole to a new name, then
    // renamed over the old: a read-only one is replaced (an archived run's), an immutable
    // one (chattr +i) is not, and failed the resume at its first write, as a failed run.
    crate::metrics::takes_new_file(run_dir).map_err(|e| cannot(run_dir, e))?;
    for name in ["summary.json", "env.json", "model.safetensors"] {
        let path = run_dir.join(name);
        if crate::metrics::immutable(&path) {
            return Err(cannot(
                &path,
                std::io::Error::other("it is immutable or append-only (chattr +i / +a)"),
            ));
        }
    }
    let checkpoints = run_dir.join("checkpoints");
    if checkpoints.is_dir() {
        crate::metrics::takes_new_file(&checkpoints).map_err(|e| cannot(&checkpoints, e))?;
    }
    Ok(())
}

/// A summary for a run whose own is cut short or gone (`why`): the run's name and id, as
/// if its process had been killed, for `rewind` to fill in from the checkpoint.
fn rebuilt_summary(run_dir: &Path, plan: &Plan, prepared: &Prepared, why: &str) -> Summary {
    let summary_path = run_dir.join("summary.json");
    crate::errln!(
        "warning: {}: {why}; written again from the checkpoint and metrics.jsonl (a run cut short at its last checkpoint: the steps after it are trained again)",
        summary_path.display()
    );
    // (`runner resume .` names the run by its path's last part, which `.` has not.)
    let dir = std::fs::canonicalize(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    let mut summary = Summary {
        name: plan.name.clone(),
        run_id: dir
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned()),
        status: RunStatus::Running,
        backend: prepared.backend_name.clone(),
        device: prepared.device_name.clone(),
        ..Default::default()
    };
    // Its figures come from the lines when the run ends; null until then.
    summary.absorb(&[], plan.run.warmup_steps);
    summary
}

/// This resume added to `env.json`'s `resumes` (its machine, device, threads, command: the
/// top-level fields stay the first process's), with the data at its new paths where files
/// moved (a later resume compares with these). A file missing or unreadable is written
/// again from this machine (without it the data could not be checked, and the finished
/// run would have no versions, host or data checksums).
fn update_env(
    run_dir: &Path,
    env: &Environment,
    moved: &[(String, String)],
    from_step: u64,
) -> Result<(), String> {
    let env_path = run_dir.join("env.json");
    let start = crate::metrics::read_text(&env_path)
        .map_err(|e| match env_path.exists() {
            true => format!("unreadable ({e})"),
            false => "missing".to_string(),
        })
        .and_then(|t| {
            serde_json::from_str::<serde_json::Value>(&t)
                .ok()
                .filter(serde_json::Value::is_object)
                .ok_or_else(|| "unreadable (not a JSON object)".to_string())
        });
    let mut start = match start {
        Err(why) => {
            // (It was checked in silence: an env.json of junk let the run go on,
            // unchecked, on changed data.)
            crate::errln!(
                "warning: {}: {why}, so the data could not be checked against the run's start; written again from this machine and the data as they are now",
                env_path.display()
            );
            // Marked: its top level is this resume's, not the run's start's.
            let mut v = serde_json::to_value(env).map_err(|e| format!("env.json: {e}"))?;
            v["written_again_at_resume"] = serde_json::Value::from(from_step);
            v
        }
        Ok(mut start) => {
            // A `data` entry there but not a list of files (edited, damaged) was taken as
            // none, as in runs of earlier versions: the data went unchecked in silence,
            // at this resume and every later one.
            let damaged = start.get("data").and_then(|d| {
                serde_json::from_value::<Vec<super::env::DataFile>>(d.clone())
                    .err()
                    .map(|e| e.to_string())
            });
            if let Some(why) = &damaged {
                crate::errln!(
                    "warning: {}: `data` is unreadable ({why}), so the data could not be checked against the run's start; replaced by the data as it is now",
                    env_path.display()
                );
            }
            if !moved.is_empty() || damaged.is_some() {
                start["data"] = serde_json::to_value(&env.data).unwrap_or_default();
            }
            start
        }
    };
    let this = serde_json::to_value(super::env::Resumed::of(env, from_step))
        .map_err(|e| format!("env.json: {e}"))?;
    match start.get_mut("resumes") {
        Some(serde_json::Value::Array(resumes)) => resumes.push(this),
        None => start["resumes"] = serde_json::Value::Array(vec![this]),
        Some(other) => {
            crate::errln!(
                "warning: {}: `resumes` is {other}, not a list of resumes: replaced by this one",
                env_path.display()
            );
            *other = serde_json::Value::Array(vec![this]);
        }
    }
    write_json_keeping_room(&env_path, &start, KEPT_ROOM).map_err(|e| format!("env.json: {e}"))
}

/// The data files env.json says the run started on.
fn data_then(run_dir: &Path) -> Option<Vec<super::env::DataFile>> {
    let text = crate::metrics::read_text(run_dir.join("env.json")).ok()?;
    let env: serde_json::Value = serde_json::from_str(&text).ok()?;
    serde_json::from_value(env.get("data")?.clone()).ok()
}

/// Where the recipe differs from the one the checkpoint was written with (`want`, its
/// SHA-256) only in data paths, and the files at the new paths are those the run started
/// on (by size and CRC-32): each (old, new) path. `None` otherwise.
fn data_moved(
    run_dir: &Path,
    recipe_path: &Path,
    plan: &Plan,
    want: &str,
) -> Option<Vec<(String, String)>> {
    let then = data_then(run_dir)?;
    let now = super::env::data_files(plan);
    let mut pairs = vec![];
    for old in &then {
        let new = now
            .iter()
            .find(|f| f.bytes == old.bytes && f.crc32 == old.crc32)?;
        if new.path != old.path {
            pairs.push((old.path.clone(), new.path.clone()));
        }
    }
    let mut text = crate::metrics::read_text(recipe_path).ok()?;
    for (old, new) in &pairs {
        text = text.replace(new.as_str(), old.as_str());
    }
    (!pairs.is_empty() && super::env::sha256_bytes(text.as_bytes()) == want).then_some(pairs)
}

/// How the data files differ from those the run started on (env.json's `data`, each at
/// its new path where it `moved`), if they do; `None` where env.json does not say.
fn data_changed(
    run_dir: &Path,
    now: &[super::env::DataFile],
    moved: &[(String, String)],
) -> Option<String> {
    let then = data_then(run_dir)?;
    let show = |f: &super::env::DataFile| format!("{} bytes, CRC-32 {}", f.bytes, f.crc32);
    for old in &then {
        let at = moved
            .iter()
            .find(|(o, _)| *o == old.path)
            .map_or(&old.path, |(_, n)| n);
        match now.iter().find(|f| f.path == *at) {
            Some(new) if (new.bytes, &new.crc32) == (old.bytes, &old.crc32) => {}
            Some(new) => {
                return Some(format!(
                    "{}: changed since the run started ({} then, {} now)",
                    old.path,
                    show(old),
                    show(new)
                ))
            }
            None => {
                return Some(format!(
                    "{}: the run started on it, and the recipe reads it no more",
                    old.path
                ))
            }
        }
    }
    // One it reads now and did not start on: a file added to a data directory (the
    // resumed run trained its epochs on more data, without a word).
    let started_on = |path: &str| {
        then.iter().any(|old| {
            moved
                .iter()
                .find(|(o, _)| *o == old.path)
                .map_or(&old.path, |(_, n)| n)
                == path
        })
    };
    now.iter().find(|f| !started_on(&f.path)).map(|f| {
        format!(
            "{}: the recipe reads it now (added to a data directory?), and the run did not start on it",
            f.path
        )
    })
}

/// Whether `run_dir` holds a checkpoint `resume` would continue from (see
/// `latest_checkpoint`): a grid's `--resume` continues such a cell, and starts one without
/// over (a checkpoint killed before its metrics line, or damaged).
pub fn resumable(run_dir: &Path) -> bool {
    pick_checkpoint(run_dir, &run_dir.join("metrics.jsonl"))
        .0
        .is_some()
}

/// Whether a resume of `run_dir` that failed left it as its checkpoint had it (it failed
/// before its first step: its summary says `interrupted`), to resume again.
pub fn still_interrupted(run_dir: &Path) -> bool {
    crate::metrics::read_text(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Summary>(&t).ok())
        .is_some_and(|s| s.status == RunStatus::Interrupted)
}

/// A checkpoint that cannot be resumed from: (its step, its directory, why, which kind).
type Unusable = (u64, PathBuf, String, Kind);

/// Why a checkpoint is passed over: `Ahead`, whole but of steps whose metrics lines are not
/// on disk (killed between a checkpoint and its line); `Damaged`, anything else.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Ahead,
    Damaged,
}

/// The latest checkpoint that is whole (its files as its `state.json` says they were
/// written) and whose metrics lines are all there (a crash between writing a checkpoint
/// and its step's line leaves one line short). A later one that is not is said, with why,
/// and the one before it is used (what `checkpoint.keep` > 1 is for).
/// A checkpoint's directory and state, and the unusable checkpoints after it.
type Picked = (PathBuf, crate::checkpoint::State, Vec<(PathBuf, Kind)>);

/// The latest checkpoint a resume can use, and the unusable ones after it (which the
/// resume sets aside: see [`set_aside`]).
fn latest_checkpoint(run_dir: &Path, metrics_path: &Path) -> Result<Picked, RunError> {
    let (chosen, unusable) = pick_checkpoint(run_dir, metrics_path);
    let said = |u: &Unusable| format!("{}: {}", u.1.display(), u.2);
    match chosen {
        Some((dir, state)) => {
            let mut later = vec![];
            for u in unusable.iter().filter(|u| u.0 > state.step) {
                crate::errln!(
                    "warning: checkpoint {}; resuming from the one before it (step {})",
                    said(u),
                    state.step
                );
                later.push((u.1.clone(), u.3));
            }
            Ok((dir, state, later))
        }
        None => {
            let mut text = format!(
                "error: {} has no checkpoint to resume from",
                run_dir.display()
            );
            for u in &unusable {
                text += &format!("\n  = note: {}", said(u));
            }
            text += match unusable.is_empty() {
                // None was written: killed outright, or a second signal, before the first.
                true => "\n  = help: none was written: checkpoints are written by [checkpoint] every = N (or \"epoch\"), and when a first SIGINT, SIGTERM, SIGHUP or SIGUSR1/2 stops a run after its first step (not kill -9, nor a second signal, which exits at once); start the run again",
                false => "\n  = help: checkpoints are written by [checkpoint] every = N (or \"epoch\"), and when SIGINT, SIGTERM, SIGHUP or SIGUSR1/2 stops a run; the notes say why each one here cannot be used (restore what they name, or start the run again)",
            };
            Err(RunError::Input(text))
        }
    }
}

/// The unusable checkpoints after the one a resume starts from, out of the way: counted
/// as checkpoints, they took the place of good ones when the resumed run pruned (with
/// `keep = 2`, the step-100 it resumed from was removed and a damaged step-102 kept). The
/// resumed run writes its own steps after its checkpoint's. One that is whole but ahead of
/// the metrics lines is removed (the resumed run writes it again, bit for bit); a damaged
/// one is renamed `damaged-step-...` beside them, for a look at what damaged it.
fn set_aside(passed_over: &[(PathBuf, Kind)]) {
    for (dir, kind) in passed_over {
        if *kind == Kind::Ahead {
            let _ = std::fs::remove_dir_all(dir);
            continue;
        }
        let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let mut to = dir.with_file_name(format!("damaged-{name}"));
        let mut n = 1;
        while to.symlink_metadata().is_ok() {
            n += 1;
            to = dir.with_file_name(format!("damaged-{name}-{n}"));
        }
        match std::fs::rename(dir, &to) {
            Ok(()) => crate::errln!(
                "warning: {} set aside as {} (the resumed run writes its own steps after its checkpoint's; remove it when you have looked)",
                dir.display(),
                to.display()
            ),
            Err(e) => crate::errln!(
                "warning: {} could not be set aside ({e}): the run's pruning may count it as a checkpoint",
                dir.display()
            ),
        }
    }
}

/// `latest_checkpoint`'s choice, and every checkpoint it passed over or could not use, by
/// step.
fn pick_checkpoint(
    run_dir: &Path,
    metrics_path: &Path,
) -> (Option<(PathBuf, crate::checkpoint::State)>, Vec<Unusable>) {
    // Whole lines only: a last line cut short (a crash mid-write, a copy cut off) is not
    // one, so a checkpoint that needs it gives way to the one before it. Where each
    // starts (8 bytes a line; the file was read whole, hundreds of MB for a long run), to
    // read back the few the checkpoints name.
    let mut starts = vec![0u64];
    let _ = crate::metrics::whole_lines(metrics_path, u64::MAX, |l| {
        starts.push(starts.last().copied().unwrap_or(0) + l.len() as u64);
        true
    });
    let lines = starts.len() as u64 - 1;
    let file = crate::metrics::open_regular(metrics_path, false).ok();
    // The step of line `i` (0-based), if it is a metrics line.
    let step_at = |i: u64| -> Option<u64> {
        use std::os::unix::fs::FileExt as _;
        let i = usize::try_from(i).ok()?;
        let (from, to) = (*starts.get(i)?, *starts.get(i + 1)?);
        let mut line = vec![0; usize::try_from(to - from).ok()?];
        file.as_ref()?.read_exact_at(&mut line, from).ok()?;
        serde_json::from_slice::<serde_json::Value>(&line)
            .ok()?
            .get("step")?
            .as_u64()
    };
    let (good, bad) = crate::checkpoint::scan(run_dir);
    // (step from the directory name, directory, why it cannot be used)
    let step_of = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut unusable: Vec<Unusable> = bad
        .into_iter()
        .map(|(p, why)| (step_of(&p), p, why, Kind::Damaged))
        .collect();
    let mut chosen = None;
    for (dir, state) in good.into_iter().rev() {
        if state.metrics_lines > lines {
            let why = format!(
                "metrics.jsonl has {lines} whole lines, it follows line {}",
                state.metrics_lines
            );
            unusable.push((state.step, dir, why, Kind::Ahead));
            continue;
        }
        // Its last line is of its step or before it, the next one after it: otherwise a
        // line went missing before it, or its state was changed (it resumed with steps
        // duplicated or skipped).
        let n = state.metrics_lines;
        let last = n.checked_sub(1).map(step_at);
        let next = (n < lines).then(|| step_at(n));
        let out_of_line = match (last, next) {
            (Some(None), _) => Some(format!("line {n} of metrics.jsonl is not a metrics line")),
            (Some(Some(s)), _) if s > state.step => Some(format!(
                "line {n} of metrics.jsonl, its last, is step {s}, after its step {}",
                state.step
            )),
            (_, Some(Some(s))) if s <= state.step => Some(format!(
                "line {} of metrics.jsonl, after its last, is step {s}, not after its step {}",
                n + 1,
                state.step
            )),
            _ => None,
        };
        if let Some(why) = out_of_line {
            let why =
                format!("{why} (metrics.jsonl lost or gained a line, or state.json was changed)");
            unusable.push((state.step, dir, why, Kind::Damaged));
            continue;
        }
        match crate::checkpoint::verify(&dir, &state) {
            Ok(()) => {
                chosen = Some((dir, state));
                break;
            }
            Err(why) => unusable.push((state.step, dir, why, Kind::Damaged)),
        }
    }
    unusable.sort_by_key(|u| u.0);
    (chosen, unusable)
}

/// The checkpoints written up to `state`'s (it included) and their time, from what it
/// recorded and its own time on the line of its step (a signal's checkpoint has none);
/// `None` for a checkpoint of an earlier version, which recorded none.
/// `own_ms`: the `checkpoint_ms` of the line of its step (0 where there is none).
pub(super) fn checkpoints_up_to(
    state: &crate::checkpoint::State,
    own_ms: f64,
) -> Option<(usize, f64)> {
    let r = state.recorded.as_ref()?;
    Some((r.checkpoints_before + 1, r.checkpoint_ms_before + own_ms))
}

/// The summary as it was at the checkpoint, marked running again in this process;
/// returns the test evaluations up to the checkpoint. `kept`: the metrics lines kept (up
/// to the checkpoint).
fn rewind(
    summary: &mut Summary,
    state: &crate::checkpoint::State,
    kept: &super::Kept,
) -> Vec<EvalRecord> {
    if summary.status == RunStatus::Running {
        // The process died (kill -9, out of memory, a lost node) before its last summary,
        // which still reads as at its start: what it did is in the checkpoint's state and
        // the lines kept, the checkpoint's own time on the line of its step (a signal's
        // checkpoint has none).
        let own_ms = kept
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.0 == state.step)
            .map_or(0.0, |c| c.1);
        match checkpoints_up_to(state, own_ms) {
            Some((n, ms)) => {
                summary.checkpoints = n;
                summary.checkpoint_ms_total = ms;
            }
            // Checkpoints of earlier versions: the lines' checkpoint times.
            None => {
                let written: Vec<f64> = kept.checkpoints.iter().map(|c| c.1).collect();
                summary.checkpoints = written.len();
                summary.checkpoint_ms_total = written.iter().sum();
            }
        }
        let trained_s = kept.t_ms / 1e3;
        summary.wall_s = summary.wall_s.max(trained_s);
    }
    // The evaluations up to the checkpoint, from the checkpoint itself where it has them:
    // a summary not written since the last start (kill -9) lost those of that segment.
    let (evals, validations) = match &state.recorded {
        Some(r) => (r.evals.clone(), r.validations.clone()),
        None => (summary.evals.clone(), summary.validations.clone()),
    };
    // The run's start-up is its first process's: where the summary lost it (kill -9 before
    // it was written, a summary rebuilt), the checkpoint has it.
    if let Some(r) = &state.recorded {
        summary.startup_s = summary.startup_s.or(r.startup_s);
        summary.first_step_ms = summary.first_step_ms.or(r.first_step_ms);
        // A process that died without its summary did not add its workers to it.
        summary.loader_workers_started = summary
            .loader_workers_started
            .max(r.loader_workers_started.unwrap_or(0));
    }
    let evals = evals.into_iter().filter(|e| e.step <= state.step).collect();
    summary.validations = validations
        .into_iter()
        .filter(|e| e.step <= state.step)
        .collect();
    summary.best_step = state.best.map(|b| b.0);
    summary.best_value = state.best.map(|b| b.1);
    summary.status = RunStatus::Running;
    summary.error = None;
    summary.pid = Some(std::process::id());
    summary.pid_started = crate::clock::process_started(std::process::id());
    summary.host = crate::clock::hostname();
    summary.resumes += 1;
    evals
}
