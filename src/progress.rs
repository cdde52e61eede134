//! What a person watching a run sees: a progress bar with loss and ms/iter on a terminal,
//! a line per epoch, and the evaluation results. Writes to stderr only; stdout carries the
//! final one-line summary.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::metrics::{Eval, Stats, StepRecord};
use crate::plan::Plan;

pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    epochs: usize,
}

impl Progress {
    pub fn new(plan: &Plan, quiet: bool) -> Self {
        let show_bar =
            !quiet && plan.log.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = show_bar.then(|| {
            let b = ProgressBar::with_draw_target(
                Some(plan.run.total_steps),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} steps  {msg}  eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_prefix(plan.name.clone());
            b
        });
        Self {
            bar,
            quiet,
            epochs: plan.run.epochs,
        }
    }

    pub fn step(&mut self, r: &StepRecord) {
        if let Some(b) = &self.bar {
            b.set_position(r.step);
            b.set_message(format!(
                "epoch {}  loss {:.4}  {:.1} ms/iter",
                r.epoch + 1,
                r.loss,
                r.iter_ms
            ));
        }
    }

    fn line(&self, s: String) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    pub fn epoch_end(&mut self, epoch: usize, records: &[StepRecord]) {
        let this: Vec<&StepRecord> = records.iter().filter(|r| r.epoch == epoch).collect();
        if this.is_empty() {
            return;
        }
        let loss = this.iter().map(|r| r.loss).sum::<f64>() / this.len() as f64;
        let iters: Vec<f64> = this.iter().map(|r| r.iter_ms).collect();
        self.line(format!(
            "epoch {}/{}: {} steps, mean loss {loss:.4}, median {:.1} ms/iter",
            epoch + 1,
            self.epochs,
            this.len(),
            Stats::of(&iters).median
        ));
    }

    pub fn eval(&mut self, e: &Eval) {
        self.line(format!(
            "  test: accuracy {:.2}% on {} samples, loss {:.4} ({:.1} s)",
            100.0 * e.accuracy,
            e.samples,
            e.loss,
            e.ms / 1e3
        ));
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
