//! The `[run]`, `[profile]`, `[checkpoint]`, `[log]` and `[slurm]` rules: length, divergence,
//! validation and early stopping, timing window, checkpoints, outputs, job-script values.

use super::*;

impl<'a> Validator<'a> {
    pub(super) fn run_section(
        &mut self,
        data: Option<&DataPlan>,
        loader: &LoaderPlan,
        optim: Option<&OptimPlan>,
    ) -> Option<RunPlan> {
        let r = &self.recipe().run;
        if r.epochs == 0 {
            self.err("run.epochs", "0 epochs", "use at least 1");
        }
        if r.max_steps == Some(0) {
            self.err(
                "run.max_steps",
                "0 steps",
                "use at least 1, or remove the key for no limit",
            );
        }
        let has_test = data.is_some_and(|d| d.test_len > 0);
        // With data that could not be read (its error is given) there is nothing to say
        // about the test set.
        let eval = if data.is_some() && !has_test && r.eval != EvalWhen::Never {
            let asked = self.l.is_set("run.eval");
            if asked && self.recipe().data.test_limit == Some(0) {
                self.err(
                    "data.test_limit",
                    format!(
                        "0 leaves no test sample, and run.eval = \"{}\" needs some",
                        r.eval.name()
                    ),
                    "remove test_limit for the whole test set, or set run.eval = \"never\"",
                );
            } else if asked {
                self.err(
                    "run.eval",
                    format!("\"{}\" needs test data", r.eval.name()),
                    "set data.test (a CIFAR-10 .bin or a .jsonl file) or data.synthetic.test_samples, or eval = \"never\"",
                );
            }
            EvalWhen::Never
        } else {
            r.eval
        };
        let has_validation = data.is_some_and(|d| d.validation_len > 0);
        let watch = self.early_stop(data.is_some(), has_validation);
        // The default is written out in resolved recipes: only another value is a mistake.
        if self.l.is_set("run.validate")
            && r.validate != crate::recipe::RunSection::default().validate
            && data.is_some()
            && !has_validation
        {
            self.err(
                "run.validate",
                "there is no validation set to evaluate",
                "set data.validation = 0.1, or remove the key",
            );
        }
        // NaN is refused too.
        if r.max_loss.is_nan() || r.max_loss <= 0.0 {
            self.err(
                "run.max_loss",
                format!("{} is not a positive bound", r.max_loss),
                "use e.g. 1e4, or inf to catch only NaN",
            );
        }
        let (steps_per_epoch, micro, total) = self.steps(data?, loader, optim?)?;
        // A cadence the run never reaches holds samples out of training for nothing, and
        // early stopping, which watches them, never acts.
        if let (true, crate::recipe::Every::Steps(n)) = (has_validation, r.validate) {
            if n > total && total > 0 {
                self.warn(
                    "run.validate",
                    format!(
                        "every {n} steps, but the run has {total}: the validation set is never evaluated{}",
                        if watch.as_ref().is_some_and(|w| w.patience.is_some()) {
                            ", so early stopping never acts"
                        } else {
                            ""
                        }
                    ),
                    format!("use at most {total}, or \"epoch\""),
                );
            }
        }
        if r.warmup_steps >= total && total > 0 {
            self.warn(
                "run.warmup_steps",
                format!(
                    "the run has only {total} optimizer step{}, so none is timed",
                    if total == 1 { "" } else { "s" }
                ),
                if total == 1 {
                    "set warmup_steps = 0 (the one step is then timed, start-up included)"
                        .to_string()
                } else {
                    format!("lower warmup_steps below {total}")
                },
            );
        }
        Some(RunPlan {
            epochs: r.epochs,
            total_steps: total,
            steps_per_epoch,
            micro_batches_per_epoch: micro,
            warmup_steps: r.warmup_steps,
            eval,
            max_loss: r.max_loss,
            stop_on_divergence: r.stop_on_divergence,
            validate: r.validate,
            watch,
        })
    }

    /// `run.early_stop`: what to watch on the validation set, and when to stop.
    fn early_stop(&mut self, has_data: bool, has_validation: bool) -> Option<Watch> {
        let r = &self.recipe().run;
        match (&r.early_stop, has_validation) {
            (Some(_), false) if has_data => {
                self.err(
                    "run.early_stop",
                    "watches the validation set, and there is none",
                    "set data.validation = 0.1 (a tenth of the training set)",
                );
                None
            }
            (e, true) => {
                let e = e.clone().unwrap_or_default();
                use crate::recipe::{EarlyStopMetric, EarlyStopMode};
                if e.patience == 0 {
                    self.err(
                        "run.early_stop.patience",
                        "0 evaluations would stop at the first",
                        "use at least 1 (3 is usual)",
                    );
                }
                if !(e.min_delta.is_finite() && e.min_delta >= 0.0) {
                    self.err(
                        "run.early_stop.min_delta",
                        format!("{} is not 0 or more", e.min_delta),
                        "use 0, or a small positive change such as 1e-3",
                    );
                }
                let natural = e.metric == EarlyStopMetric::ValAccuracy;
                let maximize = match e.mode {
                    Some(m) => m == EarlyStopMode::Max,
                    None => natural,
                };
                // An accuracy minimised (or a loss maximised) keeps the worst weights as
                // the best, and stops when the model stops getting worse.
                if maximize != natural {
                    let (metric, mode, worse) = match natural {
                        true => ("val_accuracy", "min", "lowest accuracy"),
                        false => ("val_loss", "max", "highest loss"),
                    };
                    self.warn(
                        "run.early_stop.mode",
                        format!("\"{mode}\" with metric = \"{metric}\": the best validation is the one of the {worse}, model-best.safetensors keeps its weights, and the run stops once the model stops getting worse"),
                        "leave mode out (val_accuracy is maximised, val_loss minimised), or set the other one",
                    );
                }
                Some(Watch {
                    metric: e.metric,
                    maximize,
                    min_delta: e.min_delta,
                    patience: r.early_stop.as_ref().map(|_| e.patience),
                })
            }
            _ => None,
        }
    }

    /// Optimizer steps: (per epoch, micro-batches per epoch, in the run).
    fn steps(
        &mut self,
        data: &DataPlan,
        loader: &LoaderPlan,
        optim: &OptimPlan,
    ) -> Option<(u64, u64, u64)> {
        let r = &self.recipe().run;
        let bs = loader.batch_size.max(1);
        let n = data.train_len;
        if n == 0 {
            // Said where the data is counted (an empty file, data.limit = 0).
            return None;
        }
        let mut micro = if loader.drop_last {
            n / bs
        } else {
            n.div_ceil(bs)
        } as u64;
        if n < bs && !loader.drop_last {
            self.warn(
                "loader.batch_size",
                format!(
                    "{bs} is more than the {n} training sample{}: each batch holds {n}",
                    if n == 1 { "" } else { "s" }
                ),
                format!("use a batch_size of at most {n}, or more data"),
            );
        }
        if micro == 0 {
            self.err(
                "loader.drop_last",
                format!("drops every batch: {n} training samples are fewer than batch_size = {bs}"),
                "lower loader.batch_size, or set drop_last = false",
            );
            return None;
        }
        let acc = optim.accumulation_steps as u64;
        // drop_last drops what does not make a whole optimizer step (see the loader).
        if loader.drop_last && acc > 1 {
            let whole = micro / acc * acc;
            if whole == 0 {
                self.err(
                    "loader.drop_last",
                    format!(
                        "drops every step: the {micro} batch{} of {bs} make no whole step of accumulation_steps = {acc} batches",
                        if micro == 1 { "" } else { "es" }
                    ),
                    format!("lower optim.accumulation_steps to at most {micro}, or set drop_last = false"),
                );
                return None;
            }
            micro = whole;
        }
        if acc > micro {
            // Steps do not span epochs: the step is the epoch, and the recipe's figure lies.
            self.warn(
                "optim.accumulation_steps",
                format!(
                    "{acc} is more than the {micro} micro-batch{} of an epoch: each optimizer step accumulates one epoch ({micro} micro-batch{}), as a step does not span epochs",
                    if micro == 1 { "" } else { "es" },
                    if micro == 1 { "" } else { "es" },
                ),
                format!("use at most {micro}, or a smaller loader.batch_size"),
            );
        }
        let steps_per_epoch = micro.div_ceil(acc);
        let Some(mut total) = steps_per_epoch.checked_mul(r.epochs as u64) else {
            self.err(
                "run.epochs",
                format!(
                    "{} epochs of {steps_per_epoch} steps overflow a step counter",
                    r.epochs
                ),
                "use fewer epochs, or run.max_steps to bound the run",
            );
            return None;
        };
        if let Some(m) = r.max_steps {
            total = total.min(m);
        }
        Some((steps_per_epoch, micro, total))
    }

    pub(super) fn profile(&mut self, run: Option<&RunPlan>) -> ProfilePlan {
        let p = &self.recipe().profile;
        let window = p.steps.as_deref().and_then(|text| {
            let parsed = parse_steps(text);
            match parsed {
                Some(w) => {
                    if let Some(run) = run {
                        if *w.start() > run.total_steps {
                            self.warn(
                                "profile.steps",
                                format!("starts after the run's last step ({})", run.total_steps),
                                "no step will be synced; move the window",
                            );
                        }
                    }
                    Some(w)
                }
                None => {
                    self.err(
                        "profile.steps",
                        format!("{text:?} is not a window of steps"),
                        "write \"A..B\" (steps A to B-1) or \"A..=B\", with 1 <= A < B, e.g. \"20..30\"",
                    );
                    None
                }
            }
        });
        ProfilePlan {
            window,
            sample_ms: p.sample_ms,
            memory: p.memory,
        }
    }

    /// Cadences set in the recipe that the run never reaches make their knob do nothing:
    /// said (as `run.validate`'s is), since a run that looks configured then is not.
    pub(super) fn unreached(
        &mut self,
        run: &RunPlan,
        cleanup: &CleanupPolicy,
        checkpoint: &CheckpointPlan,
        optim: &OptimPlan,
    ) {
        let total = run.total_steps;
        if total == 0 {
            return;
        }
        if let Every::Steps(n) = cleanup.every {
            if n > total && self.l.is_set("cleanup.every") {
                self.warn(
                    "cleanup.every",
                    format!("every {n} steps, but the run has {total}: no cleanup ever runs"),
                    format!("use at most {total} steps, \"step\" or \"epoch\"; or \"never\" to measure without cleanup"),
                );
            }
        }
        if let Every::Steps(n) = checkpoint.every {
            if n > total && self.l.is_set("checkpoint.every") {
                self.warn(
                    "checkpoint.every",
                    format!("every {n} steps, but the run has {total}: no checkpoint is written on the way (a signal that stops it, SIGINT, SIGTERM, SIGHUP or SIGUSR1/2, still writes one), so a run killed outright starts over"),
                    format!("use at most {total} steps, or \"epoch\""),
                );
            }
        }
        let w = optim.schedule.warmup_steps;
        if w > total && self.l.is_set("optim.lr_warmup_steps") {
            self.warn(
                "optim.lr_warmup_steps",
                format!(
                    "{w} warm-up steps, but the run has {total}: the learning rate never reaches optim.lr = {} (at most {:.3e})",
                    optim.lr,
                    optim.schedule.at(total - 1)
                ),
                format!("use at most {total}"),
            );
        }
        // The first decay comes `step_size` steps after the warm-up.
        let sched = &optim.schedule;
        if sched.kind == crate::recipe::Schedule::Step
            && sched.warmup_steps.saturating_add(sched.step_size) >= total
        {
            self.warn(
                "optim.step_size",
                format!(
                    "the first decay would come after {} optimizer steps, but the run has {total}: the learning rate stays optim.lr = {} (a constant schedule)",
                    sched.warmup_steps.saturating_add(sched.step_size),
                    optim.lr
                ),
                format!(
                    "use a step_size under {} for a decay, or schedule = \"constant\"",
                    total.saturating_sub(sched.warmup_steps).max(1)
                ),
            );
        }
        // Patience counts validations: the first sets the best, `patience` more without
        // improvement stop the run; so a stop before the run's own end needs more than
        // patience + 1 (with patience + 1, the stop would fall on the last validation).
        if let Some(patience) = run.watch.as_ref().and_then(|w| w.patience) {
            let validations = match run.validate {
                Every::Never => Some(0),
                Every::Steps(n) => Some(total / n.max(1)),
                Every::Step => Some(total),
                // One at each epoch's end, the last cut short by run.max_steps too.
                Every::Epoch => Some(total.div_ceil(run.steps_per_epoch.max(1))),
            };
            if validations.is_some_and(|v| v <= patience.saturating_add(1)) {
                // Pointed at the patience where the recipe sets it (a --set of another
                // run.early_stop key was shown).
                let key = if self.l.is_set("run.early_stop.patience") {
                    "run.early_stop.patience"
                } else {
                    "run.early_stop"
                };
                self.warn(
                    key,
                    format!(
                        "patience is {patience} validations, but run.validate = {} gives {}: the run never stops early (a stop needs the validation that sets the best, then {patience} without improvement, before the last)",
                        match run.validate {
                            Every::Never => "\"never\"".to_string(),
                            Every::Step => "\"step\"".into(),
                            Every::Epoch => "\"epoch\"".into(),
                            Every::Steps(n) => n.to_string(),
                        },
                        validations.unwrap_or(0)
                    ),
                    "validate more often (run.validate), or lower run.early_stop.patience",
                );
            }
        }
    }

    pub(super) fn checkpoint(&mut self) -> CheckpointPlan {
        let c = self.recipe().checkpoint.clone();
        if c.keep == 0 {
            self.err(
                "checkpoint.keep",
                "0 checkpoints kept: none could be resumed from",
                "keep at least 1 (2 is safer: the latest may be cut by a crash)",
            );
        }
        if c.every == Every::Step {
            self.warn(
                "checkpoint.every",
                "a checkpoint after every step writes the whole model each step",
                "use a number of steps, e.g. 500, or \"epoch\"",
            );
        }
        CheckpointPlan {
            every: c.every,
            keep: c.keep.max(1),
            save_final: c.save_final,
        }
    }

    pub(super) fn log(&mut self) -> Option<LogPlan> {
        let g = &self.recipe().log;
        // Relative to the working directory, as `--set log.dir=...` and a shell would have it.
        let dir = crate::recipe::home_path(&g.dir);
        if g.every == 0 {
            self.err(
                "log.every",
                "0 steps between reads",
                "use 1 to log every step",
            );
        }
        if g.dir.is_empty() {
            self.err("log.dir", "empty", "use \"runs\" or another directory");
        } else if g.dir.chars().any(char::is_control) {
            self.err(
                "log.dir",
                format!("{:?} holds a control character (a newline, a NUL)", g.dir),
                "a directory name of printable characters",
            );
        } else if let Err(e) = &dir {
            self.err("log.dir", e.clone(), "e.g. \"~/runs\" or \"/home/me/runs\"");
        } else if let Some(file) = dir.as_deref().ok().and_then(file_in_the_way) {
            self.err(
                "log.dir",
                format!(
                    "{} is a file, so no directory can be made there",
                    file.display()
                ),
                "point log.dir at a directory, or at a path to create",
            );
        }
        Some(LogPlan {
            dir: dir.unwrap_or_else(|_| PathBuf::from(&g.dir)),
            every: g.every.max(1),
            progress: g.progress,
            csv: g.csv,
            tensorboard: g.tensorboard,
        })
    }

    /// `[slurm]` values go into `#SBATCH` lines of a shell script: a newline would start a
    /// shell command, so no control character is allowed, and `extra` must be options.
    pub(super) fn slurm(&mut self) {
        let s = self.recipe().slurm.clone();
        let mut fields: Vec<(String, String)> = vec![("slurm.time".into(), s.time.clone())];
        for (key, v) in [
            ("slurm.partition", &s.partition),
            ("slurm.mem", &s.mem),
            ("slurm.account", &s.account),
        ] {
            if let Some(v) = v {
                fields.push((key.into(), v.clone()));
            }
        }
        for (i, e) in s.extra.iter().enumerate() {
            fields.push((format!("slurm.extra[{i}]"), e.clone()));
            if !e.starts_with('-') {
                self.err(
                    "slurm.extra",
                    format!("{e:?} is not an sbatch option"),
                    "write options as on sbatch's command line, e.g. \"--qos=high\"",
                );
            }
        }
        // A value with a control character is said once, by the check below.
        match slurm_time_s(&s.time) {
            None if !printable(&s.time) => {}
            None => self.err(
                "slurm.time",
                format!("{:?} is not a Slurm time limit", s.time),
                "write minutes (\"90\"), \"HH:MM:SS\", \"D-HH\", \"D-HH:MM\" or \"D-HH:MM:SS\" (e.g. \"2-00:00:00\"), or \"UNLIMITED\"",
            ),
            Some(t) if s.requeue && t > 0 && t <= u64::from(crate::slurm::REQUEUE_GRACE_S) => self.err(
                "slurm.time",
                format!(
                    "{:?} ({t} s) is within the {} s before the limit at which a requeueing task is told to stop, so each task would stop as it starts and requeue without end",
                    s.time,
                    crate::slurm::REQUEUE_GRACE_S
                ),
                "give each task more time (hours are \"H:MM:SS\"), or set slurm.requeue = false",
            ),
            // "2:30" meant as hours is 2 min 30 s to Slurm; "30:00" is plainly minutes.
            Some(t)
                if !s.time.contains('-') && s.time.matches(':').count() == 1 && t < 25 * 60 =>
            {
                let (m, sec) = (t / 60, t % 60);
                self.warn(
                    "slurm.time",
                    format!(
                        "{:?} is {m} min {sec} s: Slurm reads one colon as minutes:seconds",
                        s.time
                    ),
                    format!("for {m} h {sec} min write \"{m}:{sec:02}:00\""),
                )
            }
            Some(_) => {}
        }
        if s.cpus_per_task == Some(0) {
            self.err(
                "slurm.cpus_per_task",
                "0 cores: sbatch refuses --cpus-per-task=0",
                "give each task at least 1 core (the default is 4 for a task with a GPU, else 2)",
            );
        }
        // What a task's run would warn of on its machine (`backend.fusion`, `backend.kind`),
        // said where it is set, before the array is queued.
        let b = &self.recipe().backend;
        let (cubecl, fusion) = (!matches!(b.kind, crate::recipe::BackendKind::Cpu), b.fusion);
        let min = crate::recipe::Fusion::AUTO_MIN_CPUS;
        match s.cpus_per_task {
            Some(1) if cubecl && s.gpus_per_task > 0 => self.warn(
                "slurm.cpus_per_task",
                "1 core for a task with a GPU: CubeCL's device thread and the training loop each spin on a core while they wait for the other, so they take turns (on 1 CPU a warm ResNet-18 step's host side took 240 ms, on 2 CPUs 10 ms)",
                format!("give each task at least 2 cores ({min} for backend.fusion), or remove slurm.cpus_per_task for the default of 4"),
            ),
            Some(n)
                if cubecl
                    && s.gpus_per_task > 0
                    && (n as usize) < min
                    && fusion == crate::recipe::Fusion::On =>
            {
                self.warn(
                    "slurm.cpus_per_task",
                    format!("{n} cores for a task with a GPU and backend.fusion = true: fusion's thread spins on a core while it waits, beside CubeCL's device thread and the training loop, and with fewer than {min} cores they wait out each other's spins (on 2 CPUs a warm ResNet-50 step's host side took 260 ms with fusion and 21 ms without)"),
                    format!("give each task {min} cores (the default), or set backend.fusion = \"auto\" (off below {min} cores) or false"),
                )
            }
            _ => {}
        }
        // Empty or with a control character: said once, by the check below.
        if let Some(m) = s.mem.as_ref().filter(|m| printable(m) && !slurm_mem_ok(m)) {
            self.err(
                "slurm.mem",
                format!("{m:?} is not a Slurm memory size"),
                "write a whole number with an optional unit K, M, G or T, e.g. \"16G\" (no unit: megabytes; \"0\": all of the node's memory)",
            );
        }
        let written_here = crate::slurm::written_options(&s);
        for e in &s.extra {
            let Some(option) = sbatch_option(e) else {
                continue;
            };
            if let Some(&(written, key)) = written_option(&written_here, option) {
                let help = match key {
                    Some(key) => format!("set {key} instead, and remove {e:?} from slurm.extra"),
                    None => format!(
                        "remove {e:?} from slurm.extra: the runner writes --{written} itself"
                    ),
                };
                let read_as = match written == option {
                    true => format!("sets --{option}"),
                    // getopt takes a start of a long option's name that is not another's.
                    false => format!(
                        "may be read as --{written} (sbatch takes the start of an option's name for the option, or refuses it as ambiguous)"
                    ),
                };
                let clash = match written {
                    // Not written itself: it would undo the --requeue that is.
                    "no-requeue" => {
                        "which undoes the --requeue the job script writes for slurm.requeue = true"
                    }
                    _ => "which the job script already sets",
                };
                self.err(
                    "slurm.extra",
                    format!("{e:?} {read_as}, {clash}; the later line would win, silently"),
                    help,
                );
            } else if s.gpus_per_task > 0
                && [
                    "gres",
                    "gpus",
                    "gpus-per-node",
                    "gpus-per-socket",
                    "gpus-per-task",
                    "gpus-per-gpu",
                ]
                .contains(&option)
                && (option != "gres" || e.contains("gpu"))
            {
                // Another way to ask for GPUs beside the --gpus-per-task the script
                // writes: two requests that may disagree, and the job gets either or none.
                self.err(
                    "slurm.extra",
                    format!(
                        "{e:?} asks for GPUs beside slurm.gpus_per_task = {} (the job script's --gpus-per-task); the two requests may disagree",
                        s.gpus_per_task
                    ),
                    "give the GPUs by slurm.gpus_per_task alone (set it to 0 to ask for them in slurm.extra instead)",
                );
            } else if s.mem.is_some()
                && option.len() > "mem-".len()
                && ["mem-per-cpu", "mem-per-gpu"]
                    .iter()
                    .any(|o| o.starts_with(option))
            {
                self.err(
                    "slurm.extra",
                    format!(
                        "{e:?} and slurm.mem both give memory; sbatch refuses the two together"
                    ),
                    "keep one of them",
                );
            }
        }
        for (key, v) in fields {
            if !printable(&v) {
                let shown: String = v.chars().take(40).collect();
                self.err(
                    key.split('[').next().unwrap_or(&key),
                    format!("{shown:?} is empty or holds a control character (a newline would become a shell command in the job script)"),
                    "write the value on one line",
                );
            }
        }
    }
}

/// The option of `written` (what the job script writes) that sbatch takes `option` for:
/// the one of that name, or one it is the start of (`arr` for `array`; `tim`, the start of
/// `time` and of `time-min`, sbatch refuses as ambiguous, so it is refused here too).
/// `gpus` is an option of its own, not `gpus-per-task` abbreviated.
fn written_option<'w>(
    written: &'w [(&'static str, Option<&'static str>)],
    option: &str,
) -> Option<&'w (&'static str, Option<&'static str>)> {
    written.iter().find(|(o, _)| *o == option).or_else(|| {
        (!option.is_empty() && option != "gpus")
            .then(|| written.iter().find(|(o, _)| o.starts_with(option)))
            .flatten()
    })
}

/// A value that can stand on an `#SBATCH` line: not blank, and no control character (a
/// newline would become a shell command in the job script).
fn printable(v: &str) -> bool {
    !v.chars().any(char::is_control) && !v.trim().is_empty()
}

/// The long name of the sbatch option an `extra` entry gives (`--qos=high` → `qos`;
/// the short forms of the options the scripts write are named as their long ones:
/// `-a 0-3` → `array`).
fn sbatch_option(extra: &str) -> Option<&str> {
    if let Some(long) = extra.strip_prefix("--") {
        return long.split(['=', ' ', '\t']).next();
    }
    let short = extra.strip_prefix('-')?.chars().next()?;
    Some(match short {
        'J' => "job-name",
        'a' => "array",
        'o' => "output",
        't' => "time",
        'n' => "ntasks",
        'c' => "cpus-per-task",
        'p' => "partition",
        'A' => "account",
        'd' => "dependency",
        'G' => "gpus",
        _ => return None,
    })
}

/// A Slurm time limit in seconds (0: none), as sbatch reads `--time`: `M`, `M:S`,
/// `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, or `UNLIMITED` / `INFINITE`. `None`: not one.
pub(crate) fn slurm_time_s(t: &str) -> Option<u64> {
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Some(0);
    }
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(number(d)?), rest),
        None => (None, t),
    };
    let parts = rest.split(':').map(number).collect::<Option<Vec<u64>>>()?;
    let (d, h, m, s) = match (days, parts.as_slice()) {
        (None, [m]) => (0, 0, *m, 0),
        (None, [m, s]) => (0, 0, *m, *s),
        (None, [h, m, s]) => (0, *h, *m, *s),
        (Some(d), [h]) => (d, *h, 0, 0),
        (Some(d), [h, m]) => (d, *h, *m, 0),
        (Some(d), [h, m, s]) => (d, *h, *m, *s),
        _ => return None,
    };
    d.checked_mul(86400)?
        .checked_add(h.checked_mul(3600)?)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(s)
}

/// A `--mem` value sbatch takes: a whole number and an optional unit K, M, G or T (either
/// case), which may end in `B` (`16G`, `16GB`, `16000`).
fn slurm_mem_ok(m: &str) -> bool {
    let digits = m.bytes().take_while(u8::is_ascii_digit).count();
    let unit = m[digits..].to_ascii_uppercase();
    digits > 0 && ["", "K", "M", "G", "T", "KB", "MB", "GB", "TB"].contains(&unit.as_str())
}

/// The file (not a directory) at `dir` or at the nearest ancestor of it that exists, which
/// would make creating `dir` fail when the run starts. A path that cannot be looked at is
/// left to that moment, whose error says why.
fn file_in_the_way(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m.is_dir())))
        .and_then(|(a, is_dir)| (!is_dir).then(|| a.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_time_limits_read_as_sbatch_reads_them() {
        for (t, s) in [
            ("90", 5400),
            ("0", 0),
            ("10:30", 630),
            ("0:60", 60),
            ("01:00:00", 3600),
            ("100:00:00", 360_000),
            ("2-0", 172_800),
            ("2-3:04", 183_840),
            ("1-25:00:00", 176_400),
            ("UNLIMITED", 0),
            ("infinite", 0),
        ] {
            assert_eq!(slurm_time_s(t), Some(s), "{t}");
        }
        for t in [
            "abc",
            "",
            "1.5",
            "-5",
            "2-",
            "-1",
            "1:2:3:4",
            ":5",
            "1::2",
            "5:",
            "x-1",
            "01:00:00 ",
            "1-2:3:4:5",
            "99999999999999999999",
        ] {
            assert_eq!(slurm_time_s(t), None, "{t:?}");
        }
    }

    #[test]
    fn slurm_memory_sizes_and_extra_options() {
        for m in ["16G", "16GB", "16gb", "16000", "0", "1T", "16K", "016G"] {
            assert!(slurm_mem_ok(m), "{m}");
        }
        for m in [
            "abc", "16.5G", "16 G", "16GiB", "-1", "16X", "16B", "16P", "",
        ] {
            assert!(!slurm_mem_ok(m), "{m:?}");
        }
        assert_eq!(sbatch_option("--qos=high"), Some("qos"));
        assert_eq!(sbatch_option("--array 0-3"), Some("array"));
        assert_eq!(sbatch_option("--requeue"), Some("requeue"));
        assert_eq!(sbatch_option("-a0-3"), Some("array"));
        assert_eq!(sbatch_option("-t 1:00"), Some("time"));
        assert_eq!(sbatch_option("-q high"), None);
        let all = crate::slurm::written_options(&crate::recipe::schema::SlurmSection {
            partition: Some("p".into()),
            ..Default::default()
        });
        let written = |o: &str| written_option(&all, o).map(|(w, _)| *w);
        assert_eq!(written("array"), Some("array"));
        assert_eq!(written("arr"), Some("array"));
        assert_eq!(written("outp"), Some("output"));
        assert_eq!(written("tim"), Some("time"));
        assert_eq!(written("requ"), Some("requeue"));
        assert_eq!(written("no-req"), Some("no-requeue"));
        assert_eq!(written("cpus-per-t"), Some("cpus-per-task"));
        assert_eq!(written("part"), Some("partition"));
        for other in [
            "gpus",
            "qos",
            "time-min",
            "mem-per-cpu",
            "gres",
            "error",
            "dependency",
        ] {
            assert_eq!(written(other), None, "{other}");
        }
        // What the script does not write is the user's to give.
        let plain = crate::slurm::written_options(&crate::recipe::schema::SlurmSection {
            requeue: false,
            ..Default::default()
        });
        for free in [
            "signal",
            "partition",
            "mem",
            "account",
            "gpus-per-task",
            "requeue",
        ] {
            assert_eq!(written_option(&plain, free), None, "{free}");
        }
    }
}
