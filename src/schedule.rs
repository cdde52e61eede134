//! Learning-rate schedules as plain functions of the optimizer step: constant, cosine and
//! step decay, each after an optional linear warm-up. No Burn types.

use crate::recipe::Schedule;

#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    pub kind: Schedule,
    pub lr: f64,
    pub warmup_steps: u64,
    pub min_lr: f64,
    pub step_size: u64,
    pub gamma: f64,
    /// Optimizer steps in the run; cosine reaches `min_lr` at the last one.
    pub total_steps: u64,
}

impl LrSchedule {
    /// The rate for optimizer step `step` (0-based).
    pub fn at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let t = step - self.warmup_steps;
        match self.kind {
            Schedule::Constant => self.lr,
            Schedule::Step => self.lr * self.gamma.powi((t / self.step_size.max(1)) as i32),
            Schedule::Cosine => {
                let span = self
                    .total_steps
                    .saturating_sub(self.warmup_steps)
                    .saturating_sub(1);
                let p = if span == 0 {
                    1.0
                } else {
                    (t as f64 / span as f64).min(1.0)
                };
                self.min_lr
                    + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f64::consts::PI * p).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(kind: Schedule, warmup: u64) -> LrSchedule {
        LrSchedule {
            kind,
            lr: 0.1,
            warmup_steps: warmup,
            min_lr: 0.001,
            step_size: 3,
            gamma: 0.5,
            total_steps: 12,
        }
    }

    #[test]
    fn warmup_then_schedule() {
        let c = s(Schedule::Constant, 4);
        let close = |got: Vec<f64>, want: &[f64]| {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        };
        close(
            (0..6).map(|i| c.at(i)).collect(),
            &[0.025, 0.05, 0.075, 0.1, 0.1, 0.1],
        );
        let st = s(Schedule::Step, 0);
        close(
            (0..7).map(|i| st.at(i)).collect(),
            &[0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025],
        );
    }

    #[test]
    fn cosine_runs_from_lr_to_min_lr() {
        let c = s(Schedule::Cosine, 1);
        assert!((c.at(1) - 0.1).abs() < 1e-12);
        assert!((c.at(11) - 0.001).abs() < 1e-12);
        assert!((c.at(6) - (0.001 + 0.5 * 0.099)).abs() < 1e-12, "midpoint");
        assert!((1..11).all(|i| c.at(i + 1) <= c.at(i)));
    }
}
