//! `runner eval`: a run's saved weights scored on its test set or another file.

use super::*;

/// `runner eval`: a run's saved weights evaluated on its test set, or another file.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub run_dir: PathBuf,
    pub weights: PathBuf,
    /// The data evaluated (the recipe's test set, or `--data`).
    pub data: Vec<PathBuf>,
    pub samples: usize,
    pub accuracy: f64,
    pub loss: f64,
    pub ms: f64,
    pub backend: String,
    pub at: String,
    /// The weights file's SHA-256, and whether it is the file the run saved (its
    /// summary's `weights_sha256`; absent where the summary does not say).
    pub weights_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_as_saved: Option<bool>,
    /// Where the report was saved, or why it could not be (a run directory that is not
    /// writable): the result is printed either way.
    #[serde(skip)]
    pub saved: Result<PathBuf, String>,
}

/// `model.safetensors` (or `model-best.safetensors`) of a run, which must exist.
fn saved_weights(run_dir: &Path, best: bool) -> Result<PathBuf, RunError> {
    let weights = run_dir.join(if best {
        train::BEST_WEIGHTS
    } else {
        train::WEIGHTS
    });
    if weights.is_file() {
        // Unreadable (another user's run) is not damaged: said before any work.
        return match std::fs::File::open(&weights) {
            Ok(_) => Ok(weights),
            Err(e) => Err(RunError::Input(format!(
                "error: cannot read {}: {e}\n  = help: check the file's permissions",
                weights.display()
            ))),
        };
    }
    let why = crate::recipe::why_missing(&weights);
    Err(RunError::Input(if why == "exists" {
        format!(
            "error: {} is not a regular file\n  = help: runner writes its weights as a regular safetensors file; restore it",
            weights.display()
        )
    } else if why != "does not exist" {
        format!(
            "error: {} {why}\n  = help: check the path, its links and the permissions of the folders on the way",
            weights.display()
        )
    } else {
        missing_weights(run_dir, &weights, best)
    }))
}

/// Why a run's weights file is not there, and what to do, from what its summary says: a
/// file the run saved and that was removed after is told from one it never saved.
fn missing_weights(run_dir: &Path, weights: &Path, best: bool) -> String {
    let summary: Option<crate::metrics::Summary> =
        crate::metrics::read_text(run_dir.join("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
    let removed = |what: String| {
        format!(
            "error: {} does not exist, though the run saved it ({what}): it was removed or moved since\n  = help: put it back from a copy of the run directory",
            weights.display()
        )
    };
    if best {
        return match summary.as_ref().and_then(|s| s.best_step) {
            Some(step) => removed(format!("its best validation, step {step}")),
            None => format!(
                "error: {} does not exist: the run saved none (it has no validation set, data.validation, or never evaluated it: run.validate)",
                weights.display()
            ),
        };
    }
    {
        // What the run's summary says of it: resuming is the way only for a run that
        // stopped (a live one is still going; a failed one resumes into the same failure).
        let first = |e: &str| e.split(';').next().unwrap_or(e).to_string();
        match summary.as_ref().map(|s| (s.status, s.process(), s.error.as_deref())) {
            Some((RunStatus::Running, Process::Alive(pid), _)) => format!(
                "error: {} does not exist yet: the run is still going (pid {pid}); its weights are written when it ends
  = help: evaluate it then; to stop it now and keep a checkpoint, send it SIGINT, SIGTERM, SIGHUP or SIGUSR1/2",
                weights.display()
            ),
            Some((RunStatus::Failed, _, Some(e))) if e.starts_with("diverged at step") => format!(
                "error: {} does not exist: the run {}, so it saved no weights
  = help: start a new run with a lower optim.lr (or a higher run.max_loss, or run.stop_on_divergence = false)",
                weights.display(),
                first(e)
            ),
            Some((RunStatus::Failed, _, e)) => format!(
                "error: {} does not exist: the run failed ({}), so it saved no weights
  = help: fix what its error names, then {}",
                weights.display(),
                e.map_or("no error recorded".to_string(), first),
                match resumable(run_dir) {
                    true => format!("resume it ({})", resume_command(run_dir)),
                    false => format!("run its recipe again (it has no checkpoint to resume from): {}", again_command(run_dir)),
                }
            ),
            Some((RunStatus::Completed, _, _)) => match saves_final(run_dir) {
                true => removed("after its last step".to_string()),
                false => format!(
                    "error: {} does not exist: the run completed with [checkpoint] save_final = false, so it saved no weights\n  = help: evaluate its best weights (--best), if it kept any, or run the recipe again with save_final = true",
                    weights.display()
                ),
            },
            // Stopped (interrupted, killed): resume it where it can be, else it can only
            // be run again (it said "resume it", and the resume said it had no checkpoint).
            _ if resumable(run_dir) => format!(
                "error: {} does not exist: the run has not completed\n  = help: resume it, then evaluate it: {}",
                weights.display(),
                resume_command(run_dir)
            ),
            _ => format!(
                "error: {} does not exist: the run stopped before its first checkpoint, so it saved no weights and cannot be resumed\n  = help: run its recipe again: {}",
                weights.display(),
                again_command(run_dir)
            ),
        }
    }
}

/// `runner resume RUN`, as this program was started.
fn resume_command(run_dir: &Path) -> String {
    format!(
        "{} resume {}",
        crate::program(),
        crate::slurm::shell_word(&run_dir.display().to_string())
    )
}

/// `runner RUN/recipe.toml`: the run's own resolved recipe, as this program was started.
fn again_command(run_dir: &Path) -> String {
    format!(
        "{} {}",
        crate::program(),
        crate::slurm::shell_word(&run_dir.join("recipe.toml").display().to_string())
    )
}

/// Whether the run's recipe (its `recipe.toml`) saved its weights after its last step:
/// `checkpoint.save_final`, true unless it says false.
fn saves_final(run_dir: &Path) -> bool {
    recipe_value(&run_dir.join("recipe.toml"), "checkpoint", "save_final")
        .and_then(|v| v.as_bool())
        .unwrap_or(true)
}

/// The evaluation, generic over the backend (`backend::dispatch` picks it).
struct Job<'a> {
    plan: &'a Plan,
    batcher: &'a train::Batcher,
    test: &'a Dataset,
    weights: &'a Path,
}

impl backend::Job for Job<'_> {
    type Output = Result<EvalRecord, String>;
    fn run<B: crate::ops::TrainBackend>(
        self,
        device: B::Device,
        _: backend::MemFn<B::Device>,
    ) -> Result<EvalRecord, String> {
        train::evaluate_weights::<B>(self.plan, self.batcher, self.test, self.weights, &device)
    }
}

/// `weights`' SHA-256, and whether it is the file the run saved (the summary's SHA-256):
/// `Err` saying how it differs; `None` where the summary does not say (runs of earlier
/// versions).
fn weights_changed(
    run_dir: &Path,
    weights: &Path,
    best: bool,
) -> (String, Option<Result<(), String>>) {
    let now = crate::checkpoint::sha256_of(weights).unwrap_or_default();
    let saved = crate::metrics::read_text(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<crate::metrics::Summary>(&t).ok())
        .and_then(|s| match best {
            true => s.best_weights_sha256,
            false => s.weights_sha256,
        });
    let first = |h: &str| h.chars().take(12).collect::<String>();
    let verdict = saved.map(|saved| match now == saved {
        true => Ok(()),
        false => Err(format!(
            "{} is not the file the run saved (SHA-256 {}…, the run's {}…)",
            weights.display(),
            first(&now),
            first(&saved)
        )),
    });
    (now, verdict)
}

/// Evaluates `run_dir/model.safetensors` without training. `data` replaces the recipe's
/// test set (it is checked as `data.test` would be: format, records, labels).
pub fn eval(
    run_dir: &Path,
    data_file: Option<&Path>,
    best: bool,
    machine: &crate::plan::Machine,
) -> Result<EvalReport, RunError> {
    let input = |m: String| RunError::Input(m);
    let recipe_path = run_recipe(run_dir)?;
    let weights = saved_weights(run_dir, best)?;
    let mut sets = vec![];
    if let Some(d) = data_file {
        let abs = std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf());
        sets.push(format!(
            "data.test={}",
            toml::Value::String(abs.display().to_string())
        ));
        // The whole file: the run's `data.test_limit` was about its own test set.
        sets.push(format!("data.test_limit={}", i64::MAX));
    }
    let said = |d: crate::recipe::Diagnostics| match data_file {
        Some(_) => input(as_data_flag(d, &recipe_path).to_string()),
        None if d.errors().any(|e| e.key.as_deref() == Some("data.test")) => input(format!(
            "{d}\n  = help: if the test data moved, give it with runner eval {} --data FILE",
            crate::slurm::shell_word(&run_dir.display().to_string())
        )),
        None => input(d.to_string()),
    };
    // Evaluation holds the weights and the set it scores, not the training data: the
    // memory check is not made against this machine (under `ulimit -v` eval of a run on
    // large training data was refused, with a --set it takes none of as the help).
    let machine = &crate::plan::Machine {
        host_memory: None,
        ..machine.clone()
    };
    // Where the test file stands in for training data that is gone, what compares the
    // two is of that stand-in, not the run.
    let mut stand_in = false;
    let plan = match run_plan(&recipe_path, &sets, machine) {
        Ok(plan) => plan,
        // The training data gone (a scratch disk cleaned, the run copied to another
        // machine): evaluation needs none of it, so the recipe is checked with the test
        // file in its place.
        Err(d) => match training_gone(&d).zip(test_file(&recipe_path, data_file)) {
            Some((gone, test)) => {
                crate::errln!(
                    "note: {gone} (data.train) is not there; evaluation does not need the training data: scoring without it"
                );
                sets.push(format!(
                    "data.train={}",
                    toml::Value::String(test.display().to_string())
                ));
                stand_in = true;
                run_plan(&recipe_path, &sets, machine).map_err(said)?
            }
            None => return Err(said(d)),
        },
    };
    // What the check found about the test data (other classes than the model's) is said:
    // the score alone would not tell.
    let about_test = plan
        .warnings
        .iter()
        .filter(|w| w.key.as_deref() == Some("data.test"))
        .filter(|w| !(stand_in && w.message.contains(crate::plan::SAME_AS_TRAINING)));
    let mut said = crate::recipe::Diagnostics(about_test.cloned().collect());
    if data_file.is_some() {
        said = as_data_flag(said, &recipe_path);
    }
    for w in &said.0 {
        crate::errln!("{w}");
    }
    if plan.data.test_len == 0 {
        return Err(input(format!(
            "error: {} has no test set\n  = help: give one with --data FILE",
            recipe_path.display()
        )));
    }
    let data = plan.data.test_files();
    // Text is tokenized as the run tokenized it, with its tokenizer.json: one built again
    // from a training file changed since (reordered, a line added) would give the words
    // other ids, and the score would mean nothing.
    let tokenizer = match plan.data.text() {
        Some(_) => Some(saved_tokenizer(run_dir)?),
        None => None,
    };
    // One that loads but is not the file the run wrote (a word, the case folding or a
    // reserved id edited) encodes the text otherwise: scored, and said (it was not).
    let tokenizer_replaced = tokenizer.as_ref().and_then(|_| tokenizer_changed(run_dir));
    if let Some(why) = &tokenizer_replaced {
        crate::errln!(
            "warning: {why}: damaged or replaced since\n  = help: this score is not of the text as the run encoded it; restore tokenizer.json from a copy of the run"
        );
    }
    let test = data::load_test(
        &plan.data,
        plan.model.num_classes,
        plan.seed,
        tokenizer.as_ref(),
    )
    .map_err(|e| input(format!("error: {e}\n  = help: {}", e.help_text())))?;
    // The run's own test set, changed since the run read it (cut short, replaced at its
    // path): the score is of other data, which it said nothing of.
    if data_file.is_none() {
        if let Some(why) = test_data_changed(run_dir, &data) {
            crate::errln!(
                "warning: {why}: this score is not on the data the run was scored on\n  = help: put the run's test file back to compare with its summary; --data FILE scores other data on purpose"
            );
        }
    }
    let vocab = tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    let batcher = train::Batcher::new(&plan, vocab);
    backend::set_cpu_threads(plan.threads);
    // On CUDA, CubeCL takes the run's kernel caches, as training did: evaluation then
    // compiles nothing the run (or its warm-up) already compiled.
    super::kernel_settings(&plan)?;
    let (backend_name, _) = backend::describe(plan.device, &plan.kernels);
    let job = Job {
        plan: &plan,
        batcher: &batcher,
        test: &test,
        weights: &weights,
    };
    let failed = |message: String| RunError::Failed {
        dir: run_dir.to_path_buf(),
        message,
    };
    // The device failing is the evaluation failing (exit 1); weights that cannot be loaded
    // (damaged, another recipe's) are bad input, as a directory in their place is (exit 2).
    let e = backend::dispatch(plan.device, &plan.kernels, job)
        .map_err(failed)?
        .map_err(|m| {
            // The tokenizer sizes the model's embedding: with it replaced, weights that no
            // longer fit are its doing (the weights were blamed, and training again was
            // the advice).
            let help = match &tokenizer_replaced {
                Some(_) => "tokenizer.json is not the run's (said above), and its vocabulary sizes the model's embedding: restore tokenizer.json from a copy of the run",
                None => "a damaged or replaced weights file cannot be scored; running the run's recipe.toml again writes new weights",
            };
            RunError::Input(format!(
                "error: cannot evaluate {}: {m}\n  = help: {help}",
                run_dir.display()
            ))
        })?;
    // Weights that load but are not those the run saved (a byte changed on disk, another
    // run's file copied in): scored, and said.
    let (weights_sha256, as_saved) = weights_changed(run_dir, &weights, best);
    if let Some(Err(why)) = &as_saved {
        crate::errln!(
            "warning: {why}: damaged or replaced since\n  = help: this score is not of the weights the run saved; restore them from a copy, or train again"
        );
    }
    // A summary that cannot be read cannot vouch for them either: said, not passed over.
    let summary_path = run_dir.join("summary.json");
    if as_saved.is_none() && summary_path.exists() {
        let unreadable = match crate::metrics::read_text(&summary_path) {
            Ok(t) => serde_json::from_str::<crate::metrics::Summary>(&t)
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = unreadable {
            crate::errln!(
                "warning: {}: {why}: the weights cannot be checked against the SHA-256 the run recorded\n  = help: `runner resume` writes a damaged summary again where the run has a checkpoint; this score is of {} as it is",
                summary_path.display(),
                weights.display()
            );
        }
    }
    // Absolute, as the resolved recipe's data paths: the working directory is not written.
    let whole = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut report = EvalReport {
        run_dir: whole(run_dir),
        weights: whole(&weights),
        data: data.iter().map(|d| whole(d)).collect(),
        samples: e.samples,
        accuracy: e.accuracy,
        loss: e.loss,
        ms: e.ms,
        backend: backend_name,
        at: utc_now(),
        weights_sha256,
        weights_as_saved: as_saved.map(|v| v.is_ok()),
        saved: Err(String::new()),
    };
    let stamp: String = report
        .at
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    report.saved = free_name(run_dir, &stamp).and_then(|path| {
        write_json_atomic(&path, &report).map_err(|e| {
            // Not an empty file left to trip whatever reads eval-*.json.
            let _ = std::fs::remove_file(&path);
            format!("cannot write {}: {e}", path.display())
        })?;
        Ok(path)
    });
    Ok(report)
}

/// The training data path a check found missing, when that is all it found wrong.
fn training_gone(d: &crate::recipe::Diagnostics) -> Option<String> {
    let mut errors = d.errors();
    let first = errors.next()?;
    let only_train = std::iter::once(first)
        .chain(errors)
        .all(|e| e.key.as_deref() == Some("data.train") && e.message.ends_with(" does not exist"));
    only_train.then(|| {
        first
            .message
            .trim_end_matches(" does not exist")
            .to_string()
    })
}

/// The file evaluation scores: `--data`, or the run's `data.test` (a file, not a directory
/// of batches), as an absolute path.
fn test_file(recipe_path: &Path, data_file: Option<&Path>) -> Option<PathBuf> {
    let path = match data_file {
        Some(d) => d.to_path_buf(),
        None => {
            let text = crate::metrics::read_text(recipe_path).ok()?;
            let table = text.parse::<toml::Table>().ok()?;
            PathBuf::from(table.get("data")?.get("test")?.as_str()?)
        }
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    path.is_file().then_some(path)
}

/// How `tokenizer.json` differs from the file the run wrote (the summary's
/// `tokenizer_sha256`), if it does; `None` where it does not or the summary does not say.
fn tokenizer_changed(run_dir: &Path) -> Option<String> {
    let path = run_dir.join("tokenizer.json");
    let saved = crate::metrics::read_text(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<crate::metrics::Summary>(&t).ok())?
        .tokenizer_sha256?;
    let now = crate::checkpoint::sha256_of(&path).unwrap_or_default();
    let first = |h: &str| h.chars().take(12).collect::<String>();
    (now != saved).then(|| {
        format!(
            "{} is not the file the run wrote (SHA-256 {}…, the run's {}…)",
            path.display(),
            first(&now),
            first(&saved)
        )
    })
}

/// The run's `tokenizer.json`, which text runs write when they start.
fn saved_tokenizer(run_dir: &Path) -> Result<crate::data::text::Tokenizer, RunError> {
    let path = run_dir.join("tokenizer.json");
    crate::data::text::Tokenizer::load(&path).map_err(|e| {
        RunError::Input(format!(
            "error: {}: {e}\n  = help: the run wrote its vocabulary there when it started, and evaluation encodes the text with it; restore it from a copy of the run (built again from the training file, the word ids would differ if the file changed)",
            path.display()
        ))
    })
}

/// The findings about the `--data` file, said of `--data` (the runner checks the file as
/// the run's `data.test` by overriding it, which the user did not write): without the
/// override's place and snippet, with the format the file must have.
fn as_data_flag(
    mut d: crate::recipe::Diagnostics,
    recipe_path: &Path,
) -> crate::recipe::Diagnostics {
    let format = recipe_key(recipe_path, "data", "format").unwrap_or_default();
    for e in &mut d.0 {
        if e.file != Path::new("--set") || e.key.as_deref() != Some("data.test") {
            continue;
        }
        e.file = "--data".into();
        (e.line, e.col, e.snippet, e.key) = (None, None, None, None);
        if e.is_error() && format == "synthetic" {
            // No file is of the generated data's format: the recipe's help (remove the
            // key, `--set '~data.test'`) names what `eval` has not.
            e.message = "the run trained on generated data (data.format = \"synthetic\"), which no file holds".into();
            e.note = Some("it is scored on its own generated test set only".into());
            e.help = Some("leave --data out".into());
            continue;
        }
        if e.is_error() {
            e.note = Some(format!(
                "the run's data.format is \"{format}\": --data must be a file of that format"
            ));
        }
        // A trained model's classes are fixed: raising num_classes is no help here.
        if e.help
            .as_deref()
            .is_some_and(|h| h.contains("raise model.num_classes"))
        {
            e.help = Some(
                "a trained model's classes are fixed: --data must label its samples with the run's classes"
                    .into(),
            );
        }
        if e.help
            .as_deref()
            .is_some_and(|h| h.starts_with("--set paths are relative to the working directory"))
        {
            e.help = Some("--data is a path from the working directory".into());
        }
        // The fields are the run's: eval takes no --set, so "set data.label_field" was
        // no help.
        for field in ["text_field", "label_field"] {
            if e.help
                .as_deref()
                .is_some_and(|h| h.starts_with(&format!("set data.{field} ")))
            {
                let name = recipe_key(recipe_path, "data", field).unwrap_or_else(|| {
                    if field == "text_field" {
                        "text"
                    } else {
                        "label"
                    }
                    .to_string()
                });
                e.help = Some(format!(
                    "the run reads each line's {} from the field \"{name}\" (its data.{field}): --data must have it on every line",
                    if field == "text_field" { "text" } else { "label" }
                ));
            }
        }
    }
    d
}

/// `[table] key`'s value in a recipe file, as a string.
fn recipe_key(recipe_path: &Path, table: &str, key: &str) -> Option<String> {
    recipe_value(recipe_path, table, key)?
        .as_str()
        .map(String::from)
}

/// `[table] key`'s value in a recipe file.
fn recipe_value(recipe_path: &Path, table: &str, key: &str) -> Option<toml::Value> {
    crate::metrics::read_text(recipe_path)
        .ok()?
        .parse::<toml::Table>()
        .ok()?
        .get(table)?
        .get(key)
        .cloned()
}

/// `eval-<stamp>.json`, or `eval-<stamp>-2.json`, ... when an evaluation in the same second
/// (a second `runner eval` with `--data`, or one run beside it) has the name: reserved by
/// creating it, so neither overwrites the other.
fn free_name(run_dir: &Path, stamp: &str) -> Result<PathBuf, String> {
    let mut n = 1;
    loop {
        let name = match n {
            1 => format!("eval-{stamp}.json"),
            n => format!("eval-{stamp}-{n}.json"),
        };
        let path = run_dir.join(&name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
    }
}

/// How a test file differs from every data file the run in `run_dir` read (env.json's
/// `data`, by size and CRC-32), if one does; `None` where they match or env.json does not
/// say.
fn test_data_changed(run_dir: &Path, files: &[std::path::PathBuf]) -> Option<String> {
    let env: serde_json::Value =
        serde_json::from_str(&crate::metrics::read_text(run_dir.join("env.json")).ok()?).ok()?;
    let then: Vec<super::env::DataFile> = serde_json::from_value(env.get("data")?.clone()).ok()?;
    for f in files {
        let sum = crate::data::sums::recorded(f).or_else(|| crate::data::sums::file_sum(f).ok())?;
        if !then
            .iter()
            .any(|d| d.bytes == sum.bytes && d.crc32 == sum.crc32)
        {
            return Some(format!(
                "{}: {} bytes, CRC-32 {}, is not a file the run read (env.json's data)",
                f.display(),
                sum.bytes,
                sum.crc32
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn evaluations_in_the_same_second_keep_both_files() {
        let dir = crate::scratch::Scratch::new("eval-name");
        let names: Vec<String> = (0..3)
            .map(|_| super::free_name(&dir, "20261201T070000").unwrap())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "eval-20261201T070000.json",
                "eval-20261201T070000-2.json",
                "eval-20261201T070000-3.json"
            ]
        );
    }
}
