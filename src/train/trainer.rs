//! The training step and what surrounds it, in burn-train's shape: a `Trainer` owns the
//! model, the optimizer and the run's bookkeeping (step, pending losses, divergence, the
//! watched validation metric) and does one thing per call: an optimizer step with its
//! micro-batches, cleanup, checkpoint and validation; the end of an epoch; a stop; the end
//! of the run. The epoch loop in `train` drives it. Phase timing goes through `phase`.

use super::*;

/// What the trainer reads and writes around the model: the plan, the device, the run
/// directory.
pub(crate) struct Io<'a, B: TrainBackend> {
    pub plan: &'a Plan,
    pub batcher: &'a Batcher,
    pub device: B::Device,
    pub mem: MemFn<B::Device>,
    pub t0: Instant,
    pub persist: Option<&'a Persist>,
}

/// Where the run starts: an epoch and the micro-batches of it already consumed.
pub(crate) struct Start {
    pub epoch: usize,
    pub batch: usize,
}

/// The epoch in progress: micro-batches left and consumed.
pub(crate) struct Position {
    pub epoch: usize,
    pub left: usize,
    pub consumed: usize,
}

/// What the loop does next.
pub(crate) enum Next {
    Continue,
    /// Early stopping decided the run is done.
    EarlyStop,
}

pub(crate) struct Trainer<'a, B: TrainBackend> {
    pub io: Io<'a, B>,
    model: Net<B>,
    optim: Optim<B>,
    loss_fn: CrossEntropyLoss<B>,
    schedule: crate::schedule::LrSchedule,
    policy: CleanupPolicy,
    validation: Option<Arc<Dataset>>,
    parameters: usize,
    /// Optimizer steps done.
    pub step: u64,
    epochs_completed: usize,
    /// Records whose loss is still on the device, read back every `log.every` steps.
    pending: Vec<(StepRecord, Tensor<B::InnerBackend, 1>)>,
    /// The epoch's last step, its loss read back, whose line waits for the checkpoint due
    /// at the epoch's end (after its evaluations) to record what writing it took.
    held: Option<StepRecord>,
    /// The step of the last checkpoint this process wrote.
    checkpointed_at: Option<u64>,
    diverged: Option<(u64, f64)>,
    watching: Watching,
    /// This process's first step (a resumed run's is not step 1).
    first_step: u64,
    /// Dropout draws from Burn's process-wide generator: reseeded from the step, so a
    /// resumed run draws what the uninterrupted one would have.
    reseed: bool,
    early: bool,
    /// The trained weights, saved after the last step (before the final evaluation, so
    /// that a second signal during it keeps them): not tried yet, saved, or why not.
    final_weights: Option<Result<(), Stop>>,
    /// The loader's counts (its workers started), for the checkpoints to record.
    pub loader_stats: Option<Arc<crate::loader::LoaderStats>>,
}

/// Times `f` as a phase: in the profile window the phase ends with a device sync, so its
/// time is the device's.
fn phase<B: Backend, T>(sync: bool, device: &B::Device, f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    if sync {
        let _ = B::sync(device);
    }
    (out, ms(t))
}

impl<'a, B: TrainBackend> Trainer<'a, B> {
    /// The model and optimizer, fresh or from the checkpoint `io.persist` resumes; the
    /// outcome to return at once if the checkpoint cannot be loaded.
    pub fn new(
        io: Io<'a, B>,
        validation: Option<Arc<Dataset>>,
        sink: &mut dyn Sink,
    ) -> Result<(Self, Start), Box<TrainOutcome>> {
        let plan = io.plan;
        sink.phase("building the model");
        let mut model: Net<B> = Net::new(&plan.model, io.batcher.shape, plan.seed, &io.device);
        let parameters = model.parameters();
        let mut optim = Optim::<B>::new(&plan.optim);
        let mut watching = Watching::default();
        let mut diverged = None;
        let (step, epochs_completed, start) = match io.persist.and_then(|p| p.resume.as_ref()) {
            None => (0, 0, Start { epoch: 0, batch: 0 }),
            Some((dir, state)) => {
                // Its loss is on its metrics line; only the step is kept. (A run that
                // stops on divergence writes no checkpoint after one.)
                diverged = state.diverged_at_step.map(|s| (s, f64::NAN));
                watching = Watching {
                    best: state.best,
                    since_best: state.since_best,
                };
                sink.phase("loading the checkpoint");
                (model, optim) =
                    checkpoint::load::<B>(dir, model, optim, &io.device).map_err(|e| {
                        Box::new(TrainOutcome {
                            parameters,
                            stopped: Some(Stop::Failed(e)),
                            ..Default::default()
                        })
                    })?;
                let start = Start {
                    epoch: state.epoch,
                    batch: state.batch,
                };
                (state.step, state.epochs_completed, start)
            }
        };
        sink.started(parameters);
        sink.phase(plan.device.first_step_work());
        let trainer = Self {
            loss_fn: loss_config(plan).init(&io.device),
            schedule: plan.lr_schedule(),
            policy: CleanupPolicy {
                every: plan.cleanup.every,
                actions: plan.cleanup.actions.clone(),
            },
            reseed: matches!(&plan.model.net, crate::plan::NetPlan::Transformer(t) if t.dropout > 0.0),
            io,
            model,
            optim,
            validation,
            parameters,
            step,
            epochs_completed,
            pending: vec![],
            held: None,
            checkpointed_at: None,
            diverged,
            watching,
            first_step: step + 1,
            early: false,
            final_weights: None,
            loader_stats: None,
        };
        Ok((trainer, start))
    }

    /// Writes every line not yet written (a held one first, without a checkpoint time).
    fn flush(&mut self, sink: &mut dyn Sink) -> Result<(), Stop> {
        self.release(sink, 0.0);
        flush(
            &mut self.pending,
            sink,
            self.io.plan,
            &mut self.diverged,
            false,
        )
        .map(|_| ())
    }

    /// Writes the held line of the epoch's last step, with its checkpoint's time.
    fn release(&mut self, sink: &mut dyn Sink, checkpoint_ms: f64) {
        if let Some(mut r) = self.held.take() {
            r.checkpoint_ms = checkpoint_ms;
            sink.step(&r);
        }
    }

    /// When checkpoints, validations and evaluations are due.
    fn cadence(&self) -> policy::Cadence {
        let plan = self.io.plan;
        policy::Cadence {
            checkpoint: self.io.persist.map(|_| plan.checkpoint.every),
            validate: plan.run.validate,
            eval: plan.run.eval,
            total_steps: plan.run.total_steps,
            epochs: plan.run.epochs,
        }
    }

    /// Writes a checkpoint at `epoch`, `batch` (the step is the trainer's), covering
    /// `metrics_lines` lines; returns how long it took.
    fn checkpoint(
        &mut self,
        sink: &mut dyn Sink,
        (epoch, batch): (usize, usize),
        metrics_lines: u64,
        reason: String,
    ) -> Result<f64, Stop> {
        let Some(p) = self.io.persist else {
            return Ok(0.0);
        };
        let state = checkpoint::State {
            step: self.step,
            epoch,
            batch,
            epochs_completed: self.epochs_completed,
            metrics_lines,
            recipe_sha256: p.recipe_sha256.clone(),
            reason,
            written_at: crate::clock::utc_now(),
            best: self.watching.best,
            since_best: self.watching.since_best,
            diverged_at_step: self.diverged.map(|d| d.0),
            files: Default::default(),
            recorded: Some({
                // The run's loader workers so far: earlier processes' and this one's (a
                // process killed outright lost its count).
                let mut r = sink.recorded();
                let here = self.loader_stats.as_ref().map_or(0, |s| {
                    s.workers_started.load(std::sync::atomic::Ordering::Relaxed)
                });
                r.loader_workers_started = r.loader_workers_started.map(|before| before + here);
                r
            }),
            state_crc32: None,
        };
        let t = Instant::now();
        let dir = checkpoint::save::<B>(
            &p.dir(sink)?,
            &self.model,
            &self.optim,
            &state,
            (self.io.plan.checkpoint.keep, sink.lines_written()),
        )
        .map_err(Stop::Failed)?;
        let took = ms(t);
        self.checkpointed_at = Some(self.step);
        sink.checkpointed(&dir, took);
        Ok(took)
    }

    /// A reason to stop at this step boundary: a signal keeps the work (a Slurm time
    /// limit, a preempted node) in a checkpoint first. Returns why the run stops.
    pub fn stop_at(&mut self, stop: Stop, pos: &Position, sink: &mut dyn Sink) -> Stop {
        if matches!(stop, Stop::Signal(_)) && self.io.persist.is_some() {
            // One written at this step already (the step's own, every N steps) is the one
            // to resume from: writing it again cost its time twice, in Slurm's grace period.
            let saved = self.flush(sink).and_then(|_| {
                if self.checkpointed_at == Some(self.step) {
                    return Ok(0.0);
                }
                let lines = sink.lines_written();
                self.checkpoint(sink, (pos.epoch, pos.consumed), lines, format!("{stop}"))
            });
            if let Err(e) = saved {
                return e;
            }
        }
        stop
    }

    /// One optimizer step: its micro-batches (forward, backward, accumulation), clipping,
    /// the update, the cleanup due, the validation due inside the epoch, a checkpoint due
    /// inside the epoch, and its record.
    pub fn step(
        &mut self,
        batches: &mut crate::loader::EpochIter<'_, HostBatch>,
        pos: &mut Position,
        sink: &mut dyn Sink,
    ) -> Result<Next, Stop> {
        let plan = self.io.plan;
        let device = self.io.device.clone();
        if self.reseed {
            B::seed(
                &device,
                plan.seed ^ (self.step + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
        }
        let synced = plan
            .profile
            .window
            .as_ref()
            .is_some_and(|w| w.contains(&(self.step + 1)));
        // In the profile window work queued by earlier steps is drained first, outside
        // the timing.
        if synced {
            let _ = B::sync(&device);
        }
        let started = Instant::now();
        let group = plan.optim.accumulation_steps.min(pos.left);
        pos.left -= group;
        pos.consumed += group;
        let mut rec = StepRecord {
            step: self.step + 1,
            epoch: pos.epoch,
            lr: self.schedule.at(self.step),
            micro_batches: group,
            synced,
            rewarm: self.first_step > 1 && self.step + 1 < self.first_step + plan.run.warmup_steps,
            ..Default::default()
        };
        let acc = self.micro_batches(batches, group, &mut rec);
        let loss = acc.mean_loss();
        self.update(&mut rec, acc);
        self.step += 1;
        let step = self.step;
        let epoch_done = pos.left == 0 || step == plan.run.total_steps;
        self.cleanup(epoch_done, &mut rec);
        if step == self.first_step {
            // The first step ends when the device has run it: on a GPU that is when its
            // kernels are compiled and tuned, which is the start-up users wait for.
            let _ = B::sync(&device);
            sink.first_step(ms(started));
        }
        // Validation every N steps (inside the epoch; at its end it follows the epoch),
        // before the checkpoint of the same step, which then carries its result (the best
        // value, the evaluations since, the validations recorded): resumed from it, a run
        // neither skips that validation nor stops early elsewhere. A validation that stops
        // the run early leaves the checkpoint out: the run ends here.
        let cadence = self.cadence();
        let validating = Instant::now();
        let (validated, validation_ms) = if cadence.validate_in_epoch(step, pos.left) {
            (self.validate(pos.epoch, sink), ms(validating))
        } else {
            (Ok(Next::Continue), 0.0)
        };
        // A checkpoint inside the epoch; one due at its last step is written at its end,
        // after the evaluation (resuming then starts the next epoch).
        let checkpoint_now =
            matches!(validated, Ok(Next::Continue)) && cadence.checkpoint_in_epoch(step, pos.left);
        // The step's time leaves out its checkpoint's (one due at an epoch's end is
        // written after the step's time is taken) and its validation's (the validation's
        // own record has it): ms/iter stays the same whatever their cadence (a validation
        // every 3 steps made those steps 10 times as long, and the run's p95 theirs).
        rec.iter_ms = ms(started) - validation_ms;
        rec.t_ms = self.io.t0.elapsed().as_secs_f64() * 1e3;
        self.pending.push((rec, loss));
        if checkpoint_now || (pos.left == 0 && cadence.checkpoint_at_epoch_end(step)) {
            // Every loss up to this step's read back first: a step whose loss diverged is
            // never checkpointed (a run that stops on it ends before; its weights are what
            // diverged, and `keep` let go of the last good checkpoint for them). This
            // step's line waits for the checkpoint, to carry its time; it is the
            // checkpoint's last line.
            self.held = flush(&mut self.pending, sink, plan, &mut self.diverged, true)?;
            if checkpoint_now {
                let lines = sink.lines_written() + 1;
                let reason = format!("every {}", every_words(plan.checkpoint.every));
                let took = self.checkpoint(sink, (pos.epoch, pos.consumed), lines, reason)?;
                // Its line's time is taken after it (the time since the line before
                // holds the step and its checkpoint).
                if let Some(r) = self.held.as_mut() {
                    r.t_ms = self.io.t0.elapsed().as_secs_f64() * 1e3;
                }
                self.release(sink, took);
            }
        } else if self.pending.len() as u64 >= plan.log.every || epoch_done {
            self.flush(sink)?;
        }
        validated
    }

    /// A step's micro-batches: each one's forward, loss and backward into the accumulated
    /// gradients, timed, with what each brought (samples, tokens, the wait for it).
    fn micro_batches(
        &mut self,
        batches: &mut crate::loader::EpochIter<'_, HostBatch>,
        group: usize,
        rec: &mut StepRecord,
    ) -> Accumulation<B> {
        let device = self.io.device.clone();
        let synced = rec.synced;
        let mut acc = Accumulation::<B>::new(group, batches.samples_ahead(group));
        for _ in 0..group {
            let b = batches.next().expect("the epoch has this many batches");
            rec.data_wait_ms += b.wait.as_secs_f64() * 1e3;
            rec.samples += b.samples;
            if let Some((real, padded)) = b.value.tokens {
                *rec.real_tokens.get_or_insert(0) += real as u64;
                *rec.padded_tokens.get_or_insert(0) += padded as u64;
            }
            let batcher = self.io.batcher;
            let samples = b.samples;
            let (xy, h2d) =
                phase::<B, _>(synced, &device, || batcher.to_device::<B>(b.value, &device));
            rec.h2d_ms += h2d;
            let ((), fb) = phase::<B, _>(synced, &device, || {
                acc.micro_batch(&self.model, &self.loss_fn, xy, samples)
            });
            rec.forward_backward_ms += fb;
        }
        acc
    }

    /// Clipping and the optimizer update. The optimizer takes the model by value (so Burn
    /// can update parameters in place); a cheap stand-in holds its place meanwhile.
    fn update(&mut self, rec: &mut StepRecord, acc: Accumulation<B>) {
        let plan = self.io.plan;
        let device = self.io.device.clone();
        let (model, opt_ms) = phase::<B, _>(rec.synced, &device, || {
            let model = std::mem::replace(&mut self.model, Net::placeholder());
            self.optim.update(&plan.optim, rec.lr, model, acc)
        });
        self.model = model;
        rec.optimizer_ms = opt_ms;
    }

    /// The cleanup actions due after this step (and at the epoch's end), timed, with the
    /// memory they freed; then the memory in use.
    fn cleanup(&mut self, epoch_done: bool, rec: &mut StepRecord) {
        let device = self.io.device.clone();
        let mut actions = self
            .policy
            .decide(Point::AfterStep { step: self.step })
            .to_vec();
        if epoch_done {
            actions.extend_from_slice(self.policy.decide(Point::EpochEnd));
        }
        // The pool's figures, the time asking for them took added to the step's record.
        let mem = |rec: &mut StepRecord| {
            let t = Instant::now();
            let m = (self.io.mem)(&device);
            rec.mem_query_ms += ms(t);
            m
        };
        // The memory as the step left it, before its cleanup: the step's own figures, and
        // so the run's peaks (read after a cleanup they were the memory between steps: a
        // cleanup every step read as a smaller peak).
        let pool = match self.io.plan.profile.memory || !actions.is_empty() {
            true => mem(rec),
            false => None,
        };
        rec.rss_bytes = rss_bytes();
        if self.io.plan.profile.memory {
            rec.mem_in_use_bytes = pool.map(|(in_use, _)| in_use);
            rec.mem_reserved_bytes = pool.map(|(_, reserved)| reserved);
        }
        if !actions.is_empty() {
            // What a cleanup frees: the pool's reserved bytes on a device with one, else RSS.
            rec.cleanup_mem_before_bytes = pool.map(|(_, reserved)| reserved).or(rec.rss_bytes);
            let run = || run_cleanup::<B>(&actions, &device);
            let ((), took) = phase::<B, _>(rec.synced, &device, run);
            rec.cleanup_ms = took;
            rec.cleanup_mem_after_bytes = mem(rec).map(|(_, reserved)| reserved).or_else(rss_bytes);
        }
    }

    fn validate(&mut self, epoch: usize, sink: &mut dyn Sink) -> Result<Next, Stop> {
        let Some(v) = self.validation.clone() else {
            return Ok(Next::Continue);
        };
        let ctx = (
            self.io.plan,
            self.io.batcher,
            &self.io.device,
            self.io.persist,
        );
        if validate(
            ctx,
            &self.model,
            &v,
            epoch,
            self.step,
            &mut self.watching,
            sink,
        )? {
            self.early = true;
            return Ok(Next::EarlyStop);
        }
        Ok(Next::Continue)
    }

    /// The end of an epoch (or of the part of it the run takes): its line, the validation
    /// and test evaluations due, early stopping, the checkpoint due. `EarlyStop` also when
    /// the run has taken its last step.
    pub fn end_epoch(
        &mut self,
        epoch: usize,
        cut_short: bool,
        test: &Dataset,
        sink: &mut dyn Sink,
    ) -> Result<Next, Stop> {
        let plan = self.io.plan;
        if !cut_short {
            self.epochs_completed = epoch + 1;
        }
        // Inside the epoch, the run ends: by early stopping (its last step's validation)
        // or at `run.max_steps`.
        let by = match (cut_short, self.early) {
            (false, _) => None,
            (true, true) => Some("early stopping"),
            (true, false) => Some("run.max_steps"),
        };
        sink.epoch_end(epoch, self.held.as_ref(), by);
        // Validation every epoch (and at the run's last step inside one), or every N steps
        // where the N-th is the epoch's last (the step itself leaves that one to the
        // epoch's end, which comes next).
        let cadence = self.cadence();
        if !self.early && cadence.validate_at_epoch_end(self.step, cut_short) {
            self.validate(epoch, sink)?;
        }
        if self.early {
            // Flush what is pending before the run's last evaluation.
            self.flush(sink)?;
            sink.early_stopped(self.step);
            // Its last step was taken: a signal that came during the validation that
            // stopped it finds no step boundary left, and the run finishes.
            if let Some(Stop::Signal(s)) = sink.last_step_taken() {
                sink.note(&format!(
                    "{}: the run stopped early at this step boundary: it finishes its final evaluation and writes its results",
                    crate::signals::name(s)
                ));
            }
        }
        if self.step >= plan.run.total_steps || self.early {
            // The last step's lines and the weights are written before the final
            // evaluation, which can take long: they are not lost with it (a second signal
            // during it exits at once).
            self.flush(sink)?;
            self.save_final_weights(sink);
        }
        if cadence.evaluate_at_epoch_end(epoch, self.step, cut_short, self.early) {
            let all: Vec<usize> = (0..test.len()).collect();
            let e = evaluate(
                &self.model.valid(),
                test,
                &all,
                self.io.batcher,
                plan,
                &self.io.device,
            );
            sink.eval(&EvalRecord {
                epoch,
                step: self.step,
                ..e
            });
        }
        if self.step >= plan.run.total_steps || self.early {
            self.flush(sink)?;
            return Ok(Next::EarlyStop);
        }
        if !cut_short && cadence.checkpoint_at_epoch_end(self.step) {
            // The held line is the checkpoint's last, written right after it.
            let lines = sink.lines_written() + self.held.is_some() as u64;
            let took = self.checkpoint(sink, (epoch + 1, 0), lines, "epoch end".into())?;
            self.release(sink, took);
        }
        Ok(Next::Continue)
    }

    /// Saves the trained weights once (`checkpoint.save_final`), keeping why it failed for
    /// the run's end: the final evaluation still runs and is recorded.
    fn save_final_weights(&mut self, sink: &mut dyn Sink) {
        let Some(p) = self.io.persist else { return };
        if !self.io.plan.checkpoint.save_final || self.final_weights.is_some() {
            return;
        }
        sink.phase("saving the weights");
        let saved = p.dir(sink).and_then(|dir| {
            checkpoint::save_weights(&self.model.valid(), &dir.join(WEIGHTS)).map_err(Stop::Failed)
        });
        if let Ok(sum) = &saved {
            sink.weights_saved(sum);
        }
        self.final_weights = Some(saved.map(|_| ()));
    }

    /// The run's end: what is pending is written whatever stopped the loop, and a
    /// completed run has its weights saved (at its last step's end, or here).
    pub fn finish(
        mut self,
        mut stopped: Option<Stop>,
        workers: usize,
        sink: &mut dyn Sink,
    ) -> TrainOutcome {
        if let Err(stop) = self.flush(sink) {
            stopped.get_or_insert(stop);
        }
        // Every line is written now: the checkpoint kept for want of its line goes.
        if let Some(p) = self.io.persist {
            if let Ok(dir) = p.dir(sink) {
                checkpoint::prune(&dir, self.io.plan.checkpoint.keep, sink.lines_written());
            }
        }
        if stopped.is_none() {
            self.save_final_weights(sink);
            if let Some(Err(stop)) = self.final_weights.take() {
                stopped = Some(stop);
            }
        }
        TrainOutcome {
            parameters: self.parameters,
            loader_workers_started: workers,
            epochs_completed: self.epochs_completed,
            stopped,
            diverged: self.diverged,
        }
    }
}
