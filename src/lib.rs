//! `runner`: a declarative experiment runner for deep-learning training on Burn.
//!
//! The pipeline, in the order `main` calls it: `recipe` (read and type-check the TOML) →
//! `plan` (every rule across keys, defaults resolved) → `run` (data, run directory,
//! backend) → `train` (the loop) → `metrics` (what is written). Only `backend`, `model`,
//! `train` and `checkpoint` know Burn; `plan`, `recipe`, `sweep`, `slurm` and `report` build
//! and test without a device.

/// `println!` that carries on when standard output is gone (a reader that left:
/// `runner ls | head -1`, a `tee` that died): what the runner prints is also in its files,
/// so a run must not stop over it, and `println!` would panic. Any other failure (a full
/// disk under `runner schema > s.json`) is kept for `output_error`.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_to(false, format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that carries on when standard output is gone (see `outln!`).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::print_to(false, format!($($arg)*))
    };
}

/// `eprintln!` that carries on when standard error is gone (`runner r.toml 2>&1 | head`).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::print_to(true, format!("{}\n", format_args!($($arg)*)))
    };
}

static OUTPUT_ERROR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Writes `text` (already formatted: nothing runs under the stream's lock) to stderr or
/// stdout. A closed pipe drops it; the first other failure of stdout is kept, and said
/// once on stderr.
#[doc(hidden)]
pub fn print_to(stderr: bool, text: String) {
    use std::io::Write as _;
    // Names from files and folders (a run directory's, a path given) reach these lines: a
    // control char in one is shown escaped, not acted on by the terminal.
    let text = columns::escaped(&text, true);
    let written = if stderr {
        std::io::stderr().lock().write_all(text.as_bytes())
    } else {
        let mut o = std::io::stdout().lock();
        o.write_all(text.as_bytes()).and_then(|()| o.flush())
    };
    if let Err(e) = written {
        let first = !stderr
            && e.kind() != std::io::ErrorKind::BrokenPipe
            && OUTPUT_ERROR.set(e.to_string()).is_ok();
        if first {
            let _ = writeln!(
                std::io::stderr().lock(),
                "error: cannot write to standard output: {e}"
            );
        }
    }
}

/// Why standard output could not be written (other than a reader that left), if it
/// could not: a command whose output is its result fails with it.
pub fn output_error() -> Option<&'static str> {
    OUTPUT_ERROR.get().map(String::as_str)
}

/// This program as it was started, for a command line to copy from a message: `runner`
/// where the shell found it on `PATH` by that name, else the path it was started by
/// (`./target/release/runner`, `/opt/runner/bin/runner`), as a shell word. Said as
/// `runner resume ...`, a hint failed where no `runner` is on `PATH` (a build run from its
/// checkout), while the grid's "continue" line, from the start, worked.
pub fn program() -> String {
    let exe = std::env::args_os()
        .next()
        .map_or_else(|| "runner".into(), |a| a.to_string_lossy().into_owned());
    slurm::shell_word(if exe.is_empty() { "runner" } else { &exe })
}

pub mod backend;
pub mod clock;
pub mod columns;
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
pub mod rundir;
pub mod sampler;
pub mod schedule;
#[cfg(test)]
pub(crate) mod scratch;
pub mod signals;
pub mod slurm;
pub mod sweep;
pub mod tensorboard;
pub mod train;

/// Checkpoints and weights on disk (Burn records and safetensors); lives with the loop.
pub use train::checkpoint;
