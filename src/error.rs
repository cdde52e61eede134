//! The one error type of the run, sweep and report layers, with its exit code (0 all
//! well, 1 a run failed, 2 bad input, 128 + signal interrupted). Recipe findings are
//! `recipe::Diagnostics` (every diagnostic at once) until the command line renders them.

use std::path::PathBuf;

/// Why a command could not do its work: bad input found before anything was written, a
/// run that failed or was interrupted (its directory says more), or the runner's own
/// files. Each has its exit code; the command line renders them.
#[derive(Debug)]
pub enum Error {
    /// Bad input found before anything was written: exit code 2.
    Input(String),
    /// The run started and failed; its directory holds what was recorded: exit code 1.
    Failed { dir: PathBuf, message: String },
    /// SIGINT, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2 stopped the run at a step boundary: exit code 128 + signal.
    Interrupted { dir: PathBuf, signal: i32 },
    /// The runner's own files (sweep state) could not be written: exit code 1.
    Io(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Error::Input(m) | Error::Io(m) => f.write_str(m),
            Error::Failed { message, .. } => f.write_str(message),
            Error::Interrupted { signal, .. } => {
                write!(f, "interrupted by {}", crate::signals::name(*signal))
            }
        }
    }
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) => 2,
            Error::Failed { .. } | Error::Io(_) => 1,
            Error::Interrupted { signal, .. } => (128 + signal) as u8,
        }
    }
}
