//! The cleanup policy: decides, from plain numbers, whether a cleanup is due and which
//! actions it runs. It performs nothing; the training loop carries the actions out and
//! times them (burn-train's checkpoint strategies work the same way).

use crate::recipe::{CleanupAction, Every};

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
}
