//! The `[loader]`, `[optim]` and `[cleanup]` rules.

use super::*;

impl<'a> Validator<'a> {
    pub(super) fn loader(&mut self, device: Device) -> LoaderPlan {
        let l = &self.recipe().loader;
        if l.batch_size == 0 {
            self.err("loader.batch_size", "0 samples per batch", "use at least 1");
        }
        if l.persistent_workers && l.workers == 0 {
            self.err(
                "loader.persistent_workers",
                "persistent workers need workers > 0 (PyTorch rejects this too)",
                "set loader.workers to 1 or more, or remove persistent_workers",
            );
        }
        // The default is written out in resolved recipes, so only another value is a
        // mistake.
        let default_prefetch = crate::recipe::LoaderSection::default().prefetch;
        if self.l.is_set("loader.prefetch") && l.workers == 0 && l.prefetch != default_prefetch {
            self.err(
                "loader.prefetch",
                "prefetch applies to worker threads, and loader.workers = 0 has none (PyTorch rejects this too)",
                "set loader.workers to 1 or more, or remove prefetch",
            );
        }
        if l.prefetch == 0 {
            self.err(
                "loader.prefetch",
                "0 batches ahead would stall every worker",
                "use at least 1",
            );
        } else if l.prefetch > MAX_PREFETCH {
            self.err(
                "loader.prefetch",
                format!("{} batches ahead per worker", l.prefetch),
                format!("use at most {MAX_PREFETCH} (PyTorch's default is 2)"),
            );
        }
        if l.workers > 256 {
            self.err(
                "loader.workers",
                format!("{} worker threads", l.workers),
                "use at most 256",
            );
        }
        match device {
            Device::Cpu if l.pin_memory => self.warn(
                "loader.pin_memory",
                "does nothing on the CPU backend: there is no host-to-device copy to speed up",
                "keep it for CUDA runs, or set it to false",
            ),
            Device::Wgpu(_) if l.pin_memory => self.warn(
                "loader.pin_memory",
                "does nothing on WebGPU: its runtime (cubecl-wgpu) has no page-locked staging memory",
                "keep it for CUDA runs, or set it to false",
            ),
            _ => {}
        }
        l.clone()
    }

    pub(super) fn optim(&mut self) -> Option<OptimPlan> {
        let o = &self.recipe().optim;
        let sgd = o.optimizer == OptimizerKind::Sgd;
        let momentum = o.momentum.unwrap_or(0.0);
        let nesterov = o.nesterov.unwrap_or(false);
        let betas = o.betas.unwrap_or([0.9, 0.999]);
        let eps = o.eps.unwrap_or(1e-8);
        let min_lr = o.min_lr.unwrap_or(0.0);
        let step_size = o.step_size.unwrap_or(1000);
        let gamma = o.gamma.unwrap_or(0.1);
        if !(o.lr.is_finite() && o.lr > 0.0) {
            self.err(
                "optim.lr",
                format!("{} is not a positive learning rate", o.lr),
                "e.g. 0.1 for SGD, 1e-3 for AdamW",
            );
        }
        self.optimizer_knobs(sgd, momentum, nesterov, betas, eps);
        let weight_decay = o.weight_decay.unwrap_or(if sgd { 0.0 } else { 0.01 });
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            self.err(
                "optim.weight_decay",
                format!("{weight_decay} is not a finite number of 0 or more"),
                "use 0 or more, e.g. 5e-4",
            );
        }
        if o.accumulation_steps == 0 {
            self.err(
                "optim.accumulation_steps",
                "0 accumulation steps would never step the optimizer",
                "use 1 for no accumulation, or N to average the gradients of N micro-batches per step",
            );
        }
        self.schedule_knobs(min_lr, step_size, gamma);
        if let Some(c) = o.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                self.err(
                    "optim.clip_grad_norm",
                    format!("{c} is not a positive norm"),
                    "e.g. 1.0; remove the key for no clipping",
                );
            }
        }
        if !(0.0..1.0).contains(&o.label_smoothing) {
            self.err(
                "optim.label_smoothing",
                format!("{} is outside [0, 1)", o.label_smoothing),
                "0.1 is usual",
            );
        }
        Some(OptimPlan {
            clip_grad_norm: o.clip_grad_norm,
            label_smoothing: o.label_smoothing,
            optimizer: o.optimizer,
            lr: o.lr,
            momentum,
            weight_decay,
            nesterov,
            betas,
            eps,
            accumulation_steps: o.accumulation_steps.max(1),
            schedule: crate::schedule::LrSchedule {
                kind: o.schedule,
                lr: o.lr,
                warmup_steps: o.lr_warmup_steps,
                min_lr,
                step_size: step_size.max(1),
                gamma,
                total_steps: 0,
            },
        })
    }

    /// SGD's or AdamW's own knobs, and the other's refused.
    fn optimizer_knobs(
        &mut self,
        sgd: bool,
        momentum: f64,
        nesterov: bool,
        betas: [f64; 2],
        eps: f64,
    ) {
        if sgd {
            self.only_for("optim.betas", "to optimizer = \"adamw\"");
            self.only_for("optim.eps", "to optimizer = \"adamw\"");
            if !(0.0..1.0).contains(&momentum) {
                self.err(
                    "optim.momentum",
                    format!("{momentum} is outside [0, 1)"),
                    "0.9 is usual",
                );
            }
            if nesterov && momentum == 0.0 {
                self.err(
                    "optim.nesterov",
                    "Nesterov momentum needs momentum > 0 (PyTorch rejects this too)",
                    "set optim.momentum, e.g. 0.9",
                );
            }
        } else {
            self.only_for("optim.momentum", "to optimizer = \"sgd\"");
            self.only_for("optim.nesterov", "to optimizer = \"sgd\"");
            for (i, b) in betas.iter().enumerate() {
                if !(0.0..1.0).contains(b) {
                    self.err(
                        "optim.betas",
                        format!("beta{} = {b} is outside [0, 1)", i + 1),
                        "PyTorch's default is [0.9, 0.999]",
                    );
                }
            }
            if !(eps.is_finite() && eps > 0.0) {
                self.err(
                    "optim.eps",
                    format!("{eps} is not positive"),
                    "PyTorch's default is 1e-8",
                );
            }
        }
    }

    /// The learning-rate schedule's knobs (`min_lr` for cosine, `step_size` and `gamma`
    /// for step), and the other schedules' refused.
    fn schedule_knobs(&mut self, min_lr: f64, step_size: u64, gamma: f64) {
        let o = &self.recipe().optim;
        if o.schedule != Schedule::Cosine {
            self.only_for("optim.min_lr", "to schedule = \"cosine\"");
        }
        if o.schedule != Schedule::Step {
            self.only_for("optim.step_size", "to schedule = \"step\"");
            self.only_for("optim.gamma", "to schedule = \"step\"");
        }
        // Against a bad lr, said at optim.lr already, not again at a min_lr never written.
        let lr_ok = o.lr.is_finite() && o.lr > 0.0;
        if o.schedule == Schedule::Cosine && lr_ok && !(min_lr >= 0.0 && min_lr < o.lr) {
            self.err(
                "optim.min_lr",
                format!("{min_lr} is not in [0, lr)"),
                "cosine decays from lr down to min_lr",
            );
        }
        if o.schedule == Schedule::Step {
            if step_size == 0 {
                self.err(
                    "optim.step_size",
                    "0 steps between decays",
                    "use at least 1",
                );
            }
            if !(gamma > 0.0 && gamma <= 1.0) {
                self.err(
                    "optim.gamma",
                    format!("{gamma} is outside (0, 1]"),
                    "0.1 is usual",
                );
            }
        }
    }

    pub(super) fn cleanup(&mut self, device: Device) -> CleanupPolicy {
        let c = &self.recipe().cleanup;
        if c.every != Every::Never && c.actions.is_empty() {
            self.err(
                "cleanup.actions",
                "empty, so a cleanup would do nothing",
                "list \"sync\", \"empty_cache\" or \"trim_host\", or set every = \"never\"",
            );
        }
        let mut seen = vec![];
        for a in &c.actions {
            if seen.contains(a) {
                self.err(
                    "cleanup.actions",
                    format!("\"{}\" is listed twice", crate::policy::action_name(*a)),
                    "list each action once",
                );
            }
            seen.push(*a);
        }
        if c.every == Every::Never
            && self.l.is_set("cleanup.actions")
            && !self.l.is_set("cleanup.every")
        {
            self.warn(
                "cleanup.actions",
                "never run: cleanup.every is \"never\"",
                "set cleanup.every to run them",
            );
        }
        // Of the actions written: not the defaults that stand in for a list refused above.
        if c.every != Every::Never
            && device == Device::Cpu
            && !self.l.was_dropped("cleanup.actions")
        {
            let noop: Vec<String> = c
                .actions
                .iter()
                .filter(|a| matches!(a, CleanupAction::Sync | CleanupAction::EmptyCache))
                .map(|a| format!("{:?}", crate::policy::action_name(*a)))
                .fold(vec![], |mut v: Vec<String>, a| {
                    if !v.contains(&a) {
                        v.push(a);
                    }
                    v
                });
            if !noop.is_empty() {
                self.warn(
                    "cleanup.actions",
                    format!(
                        "{} {} next to nothing on the CPU backend (it runs each op to completion and keeps no memory pool)",
                        noop.join(" and "),
                        if noop.len() == 1 { "costs" } else { "cost" }
                    ),
                    "\"trim_host\" has a real cost on the CPU; the device actions are for CUDA runs",
                );
            }
        }
        CleanupPolicy {
            every: c.every,
            actions: c.actions.clone(),
        }
    }
}
