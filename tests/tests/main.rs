//! The integration tests, in one binary (Burn links slowly). They run real training steps on
//! the CPU backend with the shipped data, and the `runner` binary itself for exit codes and
//! files. `UPDATE_EXPECT=1 cargo test --release` rewrites the `.expected` snapshots.

mod backend;
mod cli;
mod common;
#[cfg(feature = "cuda")]
mod cuda_toolchain;
mod faults;
mod logging;
mod recipes;
mod report;
mod resume;
mod startup;
mod sweep;
mod text;
mod training;
#[cfg(feature = "wgpu")]
mod wgpu;
