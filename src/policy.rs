//! The loop's policies: from plain numbers, whether a cleanup is due and which actions it
//! runs, and when checkpoints, validations and test evaluations are due (`Cadence`). They
//! perform nothing; the training loop carries out what they decide and times it
//! (burn-train's checkpoint strategies work the same way).

use crate::recipe::{CleanupAction, EvalWhen, Every};

/// The point in the loop being asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Right after optimizer step `step` (1-based) has been applied.
    AfterStep { step: u64 },
    /// After the last step of an epoch.
    EpochEnd,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CleanupPolicy {
    pub every: Every,
    pub actions: Vec<CleanupAction>,
}

impl CleanupPolicy {
    /// The actions to run at this point, in order; empty when none is due.
    pub fn decide(&self, at: Point) -> &[CleanupAction] {
        if due(self.every, at) {
            &self.actions
        } else {
            &[]
        }
    }
}

/// Whether something scheduled `every` is due at this point (cleanups, checkpoints).
pub fn due(every: Every, at: Point) -> bool {
    match (every, at) {
        (Every::Step, Point::AfterStep { .. }) => true,
        (Every::Steps(n), Point::AfterStep { step }) => step % n == 0,
        (Every::Epoch, Point::EpochEnd) => true,
        _ => false,
    }
}

/// When a run checkpoints, validates and scores its test set: the rules the training loop
/// asks at each step and at each epoch's end, in one place. A checkpoint or validation
/// due at an epoch's last step is made at the epoch's end (after its evaluation, so a
/// resume starts the next epoch), never twice; nothing is checkpointed after the run's
/// last step (the run's end saves the weights).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    /// `checkpoint.every`; `None` where the run keeps nothing (no run directory).
    pub checkpoint: Option<Every>,
    /// `run.validate` (asked only where there is a validation set).
    pub validate: Every,
    pub eval: EvalWhen,
    /// The run's optimizer steps, and its epochs.
    pub total_steps: u64,
    pub epochs: usize,
}

impl Cadence {
    /// A checkpoint right after step `step`, with `left` micro-batches of its epoch to go.
    pub fn checkpoint_in_epoch(&self, step: u64, left: usize) -> bool {
        left > 0
            && step < self.total_steps
            && self
                .checkpoint
                .is_some_and(|e| due(e, Point::AfterStep { step }))
    }

    /// A checkpoint at the end of the epoch whose last step is `step`: every N steps landing
    /// on it, or every epoch.
    pub fn checkpoint_at_epoch_end(&self, step: u64) -> bool {
        step < self.total_steps
            && self
                .checkpoint
                .is_some_and(|e| due(e, Point::AfterStep { step }) || due(e, Point::EpochEnd))
    }

    /// A validation right after step `step` inside its epoch (`left` > 0).
    pub fn validate_in_epoch(&self, step: u64, left: usize) -> bool {
        left > 0 && due(self.validate, Point::AfterStep { step })
    }

    /// A validation at the end of a whole epoch whose last step is `step`: every epoch, or
    /// every N steps where the N-th is that last step. An epoch `cut_short` by the run's
    /// last step (`run.max_steps`) is validated every epoch too, as the test set is scored
    /// there: a run shorter than its first epoch had no validation, no best weights and no
    /// early stopping, and said nothing of it.
    pub fn validate_at_epoch_end(&self, step: u64, cut_short: bool) -> bool {
        if cut_short {
            return step >= self.total_steps && due(self.validate, Point::EpochEnd);
        }
        due(self.validate, Point::EpochEnd)
            || (step > 0 && due(self.validate, Point::AfterStep { step }))
    }

    /// The test set scored at the end of epoch `epoch` (0-based), whose last step is
    /// `step`; `cut_short`: the epoch ended early (`run.max_steps`), `early`: early
    /// stopping ends the run here.
    pub fn evaluate_at_epoch_end(
        &self,
        epoch: usize,
        step: u64,
        cut_short: bool,
        early: bool,
    ) -> bool {
        let last = epoch + 1 == self.epochs || step >= self.total_steps || early;
        match self.eval {
            EvalWhen::Epoch => !cut_short || last,
            EvalWhen::End => last,
            EvalWhen::Never => false,
        }
    }
}

/// The name an action has in recipes.
pub fn action_name(a: CleanupAction) -> &'static str {
    match a {
        CleanupAction::Sync => "sync",
        CleanupAction::EmptyCache => "empty_cache",
        CleanupAction::TrimHost => "trim_host",
    }
}

/// Returns freed heap memory to the operating system (glibc `malloc_trim(0)`): the host-side
/// analogue of emptying a cache, with a real cost that grows with the heap.
pub fn trim_host() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only walks and releases glibc's free lists; it takes no
        // pointers from us and is safe to call from any thread.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CleanupAction::*;

    fn due(every: Every, at: Point) -> bool {
        !CleanupPolicy {
            every,
            actions: vec![Sync, EmptyCache],
        }
        .decide(at)
        .is_empty()
    }

    #[test]
    fn decides_by_step_and_epoch() {
        let step = |s| Point::AfterStep { step: s };
        assert!(!due(Every::Never, step(1)) && !due(Every::Never, Point::EpochEnd));
        assert!(due(Every::Step, step(1)) && due(Every::Step, step(7)));
        assert!(!due(Every::Step, Point::EpochEnd));
        assert!(due(Every::Epoch, Point::EpochEnd) && !due(Every::Epoch, step(3)));
        let every3: Vec<u64> = (1..=10)
            .filter(|&s| due(Every::Steps(3), step(s)))
            .collect();
        assert_eq!(every3, vec![3, 6, 9]);
    }

    #[test]
    fn actions_come_in_recipe_order() {
        let p = CleanupPolicy {
            every: Every::Step,
            actions: vec![TrimHost, Sync],
        };
        assert_eq!(p.decide(Point::AfterStep { step: 1 }), &[TrimHost, Sync]);
    }

    /// A run of 3 epochs of 4 steps (12 in all), walked as the training loop asks: what is
    /// due inside an epoch and at its end.
    fn walk(c: Cadence) -> (Vec<u64>, Vec<u64>, Vec<u64>, Vec<u64>) {
        let (mut ckpt_in, mut ckpt_end, mut val, mut val_end) = (vec![], vec![], vec![], vec![]);
        for step in 1..=12u64 {
            let left = (4 - (step - 1) % 4 - 1) as usize;
            if c.checkpoint_in_epoch(step, left) {
                ckpt_in.push(step);
            }
            if c.validate_in_epoch(step, left) {
                val.push(step);
            }
            if left == 0 {
                if c.validate_at_epoch_end(step, false) {
                    val_end.push(step);
                }
                if c.checkpoint_at_epoch_end(step) {
                    ckpt_end.push(step);
                }
            }
        }
        (ckpt_in, ckpt_end, val, val_end)
    }

    fn cadence(checkpoint: Option<Every>, validate: Every, eval: EvalWhen) -> Cadence {
        Cadence {
            checkpoint,
            validate,
            eval,
            total_steps: 12,
            epochs: 3,
        }
    }

    #[test]
    fn a_checkpoint_or_validation_due_at_an_epochs_last_step_comes_at_its_end_once() {
        // Every 2 steps: steps 2, 6, 10 inside; 4 and 8 at the epochs' ends; none after
        // the last step (12), whose weights the run's end saves.
        let c = cadence(Some(Every::Steps(2)), Every::Steps(2), EvalWhen::End);
        let (ckpt_in, ckpt_end, val, val_end) = walk(c);
        assert_eq!(ckpt_in, [2, 6, 10]);
        assert_eq!(ckpt_end, [4, 8]);
        assert_eq!(val, [2, 6, 10]);
        assert_eq!(
            val_end,
            [4, 8, 12],
            "validation is due after the last step too"
        );
        // Every epoch: at the ends alone.
        let (ckpt_in, ckpt_end, val, val_end) =
            walk(cadence(Some(Every::Epoch), Every::Epoch, EvalWhen::End));
        assert!(ckpt_in.is_empty() && val.is_empty());
        assert_eq!((ckpt_end, val_end), (vec![4, 8], vec![4, 8, 12]));
        // The run's last step inside an epoch (run.max_steps = 6): validated every epoch,
        // as the test set is scored there; every 4 steps, not (step 6 is no 4th).
        let short = |validate| Cadence {
            total_steps: 6,
            ..cadence(None, validate, EvalWhen::End)
        };
        assert!(short(Every::Epoch).validate_at_epoch_end(6, true));
        assert!(!short(Every::Steps(4)).validate_at_epoch_end(6, true));
        assert!(!short(Every::Never).validate_at_epoch_end(6, true));
        // An epoch cut short that is not the run's last (a resumed partial one) is not.
        assert!(!short(Every::Epoch).validate_at_epoch_end(3, true));
        // A run that keeps nothing checkpoints nothing.
        let (ckpt_in, ckpt_end, ..) = walk(cadence(None, Every::Never, EvalWhen::End));
        assert!(ckpt_in.is_empty() && ckpt_end.is_empty());
    }

    #[test]
    fn the_test_set_is_scored_as_run_eval_says() {
        let epoch = cadence(None, Every::Never, EvalWhen::Epoch);
        let end = cadence(None, Every::Never, EvalWhen::End);
        let never = cadence(None, Every::Never, EvalWhen::Never);
        // (epoch, its last step, cut short, early stop)
        let ends = [
            (0, 4, false, false),
            (1, 8, false, false),
            (2, 12, false, false),
        ];
        let scored = |c: Cadence| -> Vec<usize> {
            ends.iter()
                .filter(|&&(e, s, cut, early)| c.evaluate_at_epoch_end(e, s, cut, early))
                .map(|e| e.0)
                .collect()
        };
        assert_eq!(scored(epoch), [0, 1, 2]);
        assert_eq!(scored(end), [2]);
        assert!(scored(never).is_empty());
        // An epoch cut short by run.max_steps is the run's last: scored under both.
        assert!(end.evaluate_at_epoch_end(0, 12, true, false));
        assert!(epoch.evaluate_at_epoch_end(0, 12, true, false));
        // An epoch cut short that is not the last (a resume's partial epoch) is not.
        assert!(!epoch.evaluate_at_epoch_end(0, 3, true, false));
        // Early stopping ends the run: its epoch is the last one scored.
        assert!(end.evaluate_at_epoch_end(0, 4, false, true));
    }
}
