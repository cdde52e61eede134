//! The resolved recipe: what validation decided, written back in the recipe's own form
//! (every default that applies filled in, keys that do not apply left out, paths made
//! absolute), so a run directory's `recipe.toml` runs on its own and says exactly what ran.

use super::*;

impl<'a> Validator<'a> {
    pub(super) fn resolve(
        &self,
        name: &str,
        model: &ModelPlan,
        data: &DataPlan,
        optim: &OptimPlan,
        run: &RunPlan,
        kernels: &KernelPlan,
    ) -> Recipe {
        let mut resolved = self.recipe().clone();
        resolved.name = Some(name.to_string());
        // The model section is the plan serialised: `arch`, `num_classes` and exactly the
        // knobs of that architecture.
        match toml::Value::try_from(model).map(toml::Value::try_into) {
            Ok(Ok(m)) => resolved.model = m,
            // A plan with errors is never run; its values may be past what TOML holds.
            _ if self.report.has_errors() => {}
            Ok(Err(e)) => panic!("a serialised ModelPlan is a [model] table: {e}"),
            Err(e) => panic!("a ModelPlan serialises to TOML: {e}"),
        }
        if let Some(t) = data.text() {
            resolved.data.text_field = Some(t.text_field.clone());
            resolved.data.label_field = Some(t.label_field.clone());
            resolved.data.tokenizer = Some(t.tokenizer.clone());
            let p = resolved.padding.get_or_insert_with(Default::default);
            p.buckets =
                (t.padding.strategy == crate::recipe::PaddingStrategy::Bucket).then_some(t.buckets);
        } else {
            resolved.data.augment.get_or_insert_with(Default::default);
            resolved.data.normalize.get_or_insert_with(Default::default);
        }
        // Every default that applies is written out; keys that do not apply stay out.
        let ro = &mut resolved.optim;
        ro.weight_decay = Some(optim.weight_decay);
        match optim.optimizer {
            OptimizerKind::Sgd => {
                ro.momentum = Some(optim.momentum);
                ro.nesterov = Some(optim.nesterov);
            }
            OptimizerKind::Adamw => {
                ro.betas = Some(optim.betas);
                ro.eps = Some(optim.eps);
            }
        }
        match optim.schedule.kind {
            Schedule::Cosine => ro.min_lr = Some(optim.schedule.min_lr),
            Schedule::Step => {
                ro.step_size = Some(optim.schedule.step_size);
                ro.gamma = Some(optim.schedule.gamma);
            }
            Schedule::Constant => {}
        }
        resolved.run.eval = run.eval;
        if let (Some(e), Some(w)) = (&mut resolved.run.early_stop, &run.watch) {
            e.mode = Some(if w.maximize {
                crate::recipe::EarlyStopMode::Max
            } else {
                crate::recipe::EarlyStopMode::Min
            });
        }
        if let Some(dir) = &kernels.cache_dir {
            resolved.backend.cache_dir = Some(dir.display().to_string());
        }
        // Paths are relative to the file that wrote them (a parent recipe's stay its own).
        for (key, p) in [
            ("data.train", &mut resolved.data.train),
            ("data.test", &mut resolved.data.test),
            ("data.validation_file", &mut resolved.data.validation_file),
        ] {
            if let Some(p) = p {
                let path = self
                    .l
                    .path_of(key, p)
                    .unwrap_or_else(|_| PathBuf::from(&*p));
                *p = absolute(&path).display().to_string();
            }
        }
        if resolved.data.format == Some(DataFormat::Synthetic) && resolved.data.synthetic.is_none()
        {
            resolved.data.synthetic = Some(Default::default());
        }
        resolved
    }
}
