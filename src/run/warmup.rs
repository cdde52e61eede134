//! `runner warmup`: a plan's kernels compiled and tuned without creating a run.

use super::*;

/// What `warmup` did for one plan.
#[derive(Debug, Clone)]
pub struct Warmup {
    pub backend: String,
    pub device: String,
    pub warmed: train::Warmed,
    /// What CubeCL compiled, took from the cache and tuned (zero on the CPU).
    pub counts: KernelCounts,
    pub seconds: f64,
    pub settings: KernelSettings,
}

/// Compiles and tunes what a run of `plan` needs (see `train::warm_up`) without creating a
/// run: nothing is written but the kernel cache. A failure is the warm-up's own message.
pub fn warmup(plan: &Plan) -> Result<Warmup, RunError> {
    let settings = kernel_settings(plan)?;
    for note in &settings.notes {
        crate::errln!("warning: {note}");
    }
    let sets = data::load(&plan.data, plan.model.num_classes, plan.seed)
        .map_err(|e| RunError::Input(format!("error: {e}\n  = help: {}", e.help_text())))?;
    backend::set_cpu_threads(plan.threads);
    let (backend_name, device) = backend::describe(plan.device, &plan.kernels);
    let vocab = sets.tokenizer.as_ref().map_or(0, |t| t.vocab_size());
    let batcher = train::Batcher::new(plan, vocab);
    let before = kernels::counts();
    let t = Instant::now();
    struct Warm<'a> {
        plan: &'a Plan,
        batcher: &'a train::Batcher,
        sets: &'a data::Sets,
    }
    impl backend::Job for Warm<'_> {
        type Output = train::Warmed;
        fn run<B: crate::ops::TrainBackend>(
            self,
            device: B::Device,
            _: backend::MemFn<B::Device>,
        ) -> train::Warmed {
            train::warm_up::<B>(
                self.plan,
                self.batcher,
                &self.sets.train,
                &self.sets.test,
                self.sets.validation.as_ref(),
                &device,
            )
        }
    }
    let job = Warm {
        plan,
        batcher: &batcher,
        sets: &sets,
    };
    let failed = |message| RunError::Failed {
        dir: PathBuf::new(),
        message,
    };
    let warmed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        backend::dispatch(plan.device, &plan.kernels, job)
    }))
    .map_err(|p| failed(panic_message(p.as_ref())))?
    .map_err(failed)?;
    Ok(Warmup {
        backend: backend_name,
        device,
        warmed,
        counts: kernels::counts().since(before),
        seconds: t.elapsed().as_secs_f64(),
        settings,
    })
}
