//! `runner`: a declarative experiment runner for deep-learning training on Burn.
//!
//! The pipeline, in the order `main` calls it: `recipe` (read and type-check the TOML) →
//! `plan` (every rule across keys, defaults resolved) → `run` (data, run directory,
//! backend) → `train` (the loop) → `metrics` (what is written). Only `backend`, `model`,
//! `train` and `checkpoint` know Burn; `plan`, `recipe`, `sweep`, `slurm` and `report` build
//! and test without a device.

/// `println!` that carries on when standard output is gone (a reader that left:
/// `runner ls | head -1`, a `tee` that died). What the runner prints is also in its files,
/// so a run must not stop over it, and `println!` would panic.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` that carries on when standard output is gone (see `outln!`).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        let _ = write!(o, $($arg)*).and_then(|()| o.flush());
    }};
}

/// `eprintln!` that carries on when standard error is gone (`runner r.toml 2>&1 | head`).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub mod backend;
pub mod clock;
pub mod data;
pub mod error;
pub mod kernels;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod plan;
pub mod plot;
pub mod policy;
pub mod progress;
pub mod recipe;
pub mod report;
pub mod rng;
pub mod run;
pub mod sampler;
pub mod schedule;
pub mod signals;
pub mod slurm;
pub mod sweep;
pub mod tensorboard;
pub mod train;

/// Checkpoints and weights on disk (Burn records and safetensors); lives with the loop.
pub use train::checkpoint;
