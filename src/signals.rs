//! Ctrl-C and SIGTERM (what Slurm sends before a time limit, and `kill`): the first one asks
//! the run to stop at its next step boundary (its metrics flushed, `status: "interrupted"`,
//! exit 130 or 143); a second one ends the process at once with the same code. Owns the
//! handlers and the flag the training loop polls; it decides nothing about runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

struct Flags {
    /// The first signal's number, 0 until one arrives.
    received: Arc<AtomicUsize>,
}

static FLAGS: OnceLock<Flags> = OnceLock::new();

/// Installs the handlers (once per process). Failure leaves the default behaviour.
pub fn install() {
    FLAGS.get_or_init(|| {
        let received = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Registration order matters: the exit checks `seen` before the first signal
            // sets it, so only a second signal exits.
            let _ =
                signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen));
            let _ = signal_hook::flag::register(sig, Arc::clone(&seen));
            let _ = signal_hook::flag::register_usize(sig, Arc::clone(&received), sig as usize);
        }
        // Say at once that the signal was seen: the loop may be inside a long step (or
        // compiling kernels) before it can act on it.
        let watch = Arc::clone(&received);
        let _ = std::thread::Builder::new()
            .name("runner-signals".into())
            .spawn(move || loop {
                let s = watch.load(Ordering::Relaxed);
                if s != 0 {
                    crate::errln!(
                        "\n{}: stopping at the next step boundary (metrics are kept); send it again to exit at once",
                        name(s as i32)
                    );
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            });
        Flags { received }
    });
}

/// The signal that asked the run to stop, if one did.
pub fn received() -> Option<i32> {
    let s = FLAGS.get()?.received.load(Ordering::Relaxed);
    (s != 0).then_some(s as i32)
}

/// `SIGINT`, `SIGTERM`, ...
pub fn name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
