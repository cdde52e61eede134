//! Ctrl-C, SIGTERM (what Slurm sends before a time limit, and `kill`), SIGHUP (the
//! terminal or ssh session closed; left ignored under `nohup`) and SIGUSR1/SIGUSR2 (a job's
//! own warning before its limit, `--signal=USR1@120`): the first one asks the run to stop at
//! its next step boundary (its metrics flushed, a checkpoint written, `status:
//! "interrupted"`, exit 130, 143, 129, 138 or 140), or, where the run has taken its last step, lets it finish its final
//! evaluation; a second one, half a second or more later, ends the process at once
//! with the same code (one sooner is the first delivered twice), after what the run
//! armed with [`exit_at_second_signal`] has marked its summary. Until a run's first
//! step is done there is no step boundary near (on CUDA the first step compiles and tunes
//! its kernels, minutes on a cold cache) and nothing to keep: a first signal then ends
//! the process at once, through what the run armed with [`exit_before_first_step`].
//! Owns the handlers and the flag the training loop polls; it decides nothing about runs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A second signal this soon after the first is the same one delivered twice, not a person
/// asking again: `timeout` sends its signal to the command and then to its own process
/// group, which holds the command too (and a job script that forwards signals to its group
/// does the same). Both usually merge into one, but where the first was handled before the
/// second arrived, a run under `timeout -s INT` exited at once with nothing said and its
/// `summary.json` left `running` (1 time in 6 here). A second Ctrl-C by hand comes later.
const SAME_SIGNAL: Duration = Duration::from_millis(500);

/// When the handlers were installed: the clock the handler measures with.
static BASE: OnceLock<Instant> = OnceLock::new();
/// When the first signal came, in microseconds after `BASE` plus one; 0 until then.
static FIRST_AT: AtomicU64 = AtomicU64::new(0);
/// The first signal's number, 0 until one arrives.
static RECEIVED: AtomicUsize = AtomicUsize::new(0);
/// The second signal's number, once the signals thread is to act on it (a run armed
/// [`exit_at_second_signal`]); 0 until then.
static SECOND: AtomicUsize = AtomicUsize::new(0);
/// Whether something is armed for a second signal: without, the handler exits itself.
static AT_SECOND_ARMED: AtomicBool = AtomicBool::new(false);
/// The run has written its own summary ([`AtSecond::disarm_while`]): what is left (its
/// result line, its lock's removal) takes moments, and a second signal lets it end.
static RESULTS_WRITTEN: AtomicBool = AtomicBool::new(false);

/// What ends the process at a signal while a run waits for its first step (see
/// [`exit_before_first_step`]): it records the stop and says how, on the signals thread.
type AtOnce = Box<dyn FnOnce(i32) -> String + Send>;

/// The run's [`AtOnce`], from its arming until its first step is done. The signals thread
/// holds this lock from taking it until the process ends, so the run, which takes the lock
/// to disarm, can write nothing more meanwhile.
static BEFORE_FIRST_STEP: Mutex<Option<AtOnce>> = Mutex::new(None);

/// What a second signal does before the process ends, from the run's start to its
/// summary written (see [`exit_at_second_signal`]); the same locking as above.
static AT_SECOND: Mutex<Option<AtOnce>> = Mutex::new(None);

/// Whether the run has taken its last step (it finishes its final evaluation and writes
/// its results, with no step boundary left to stop at). Set under the lock by
/// [`last_step_taken`], read under it by the signals thread to say what a signal does.
static FINISHING: Mutex<bool> = Mutex::new(false);

/// The run's trained weights are saved (after its last step, before its final evaluation):
/// a second signal then exits keeping them, and says so.
static FINAL_WEIGHTS: AtomicBool = AtomicBool::new(false);

/// The run's best validation so far, saved as `model-best.safetensors` (step, value, the
/// file's SHA-256): a second signal's summary says it where no checkpoint does.
type Best = (u64, f64, Option<String>);
static BEST_SAVED: Mutex<Option<Best>> = Mutex::new(None);

/// What a signal arriving at `now` does, the first having come at `first` and the
/// second at `second` (all in microseconds on one clock; 0: none yet).
#[derive(Debug, PartialEq)]
enum Action {
    /// The first: stop at the next step boundary.
    Stop,
    /// The first or the second one again, delivered twice.
    Ignore,
    /// A second one (or a third, later): exit now.
    Exit,
}

fn action(first: u64, second: u64, now: u64) -> Action {
    let soon_after = |at: u64| now.saturating_sub(at) < SAME_SIGNAL.as_micros() as u64;
    if first == 0 {
        Action::Stop
    } else if soon_after(first) || (second != 0 && soon_after(second)) {
        // The second one delivered twice too (a wrapper that signals the process and then
        // its group): it was taken for a third, which exits from the handler at once, and
        // the summary was left `running`, its lock behind and nothing said.
        Action::Ignore
    } else {
        Action::Exit
    }
}

/// When the second signal came, as `FIRST_AT`; 0 until then.
static SECOND_AT: AtomicU64 = AtomicU64::new(0);

/// The handler: only atomics, the monotonic clock (`clock_gettime`) and `_exit`, all
/// async-signal-safe.
fn on_signal(sig: i32) {
    let Some(base) = BASE.get() else { return };
    let now = base.elapsed().as_micros() as u64 + 1;
    let first = match FIRST_AT.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => 0,
        Err(first) => first,
    };
    // The first signal that is not the first one again is the second: its time is kept.
    let second = match action(first, 0, now) {
        Action::Exit => {
            match SECOND_AT.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => 0,
                Err(second) => second,
            }
        }
        _ => 0,
    };
    match action(first, second, now) {
        Action::Stop => RECEIVED.store(sig as usize, Ordering::SeqCst),
        Action::Ignore => {}
        // The signals thread marks the run's summary and exits; a third signal (or a
        // second with nothing armed) exits from here, whatever that thread is doing.
        // Once the run has written its own results, the signals thread lets it end by
        // itself (see `watch`): a second signal there exited at once, leaving a completed
        // run with exit 130, nothing said and its run.lock behind.
        Action::Exit
            if (AT_SECOND_ARMED.load(Ordering::SeqCst)
                || RESULTS_WRITTEN.load(Ordering::SeqCst))
                && SECOND
                    .compare_exchange(0, sig as usize, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() => {}
        Action::Exit => signal_hook::low_level::exit(128 + sig),
    }
}

/// Installs the handlers (once per process). Failure leaves the default behaviour.
pub fn install() {
    if BASE.set(Instant::now()).is_err() {
        return;
    }
    // A file grown past `ulimit -f` raises SIGXFSZ, whose default ends the process where
    // it stands (exit 153, a metrics line cut, the summary left `running`). Ignored, the
    // write fails with EFBIG ("File too large") instead and the run stops as on a full
    // disk: whole lines, `status: "failed"`, the file named.
    // SAFETY: setting a signal's disposition to "ignore" runs no code in the handler.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // SIGHUP too: by default it killed the run where it stood, with no checkpoint and its
    // summary left `running`, when the terminal that started it closed. Unless it was
    // ignored when the runner started: `nohup runner ...` keeps running without its
    // terminal. (SIGINT and SIGTERM are always taken, as before: a shell starts a
    // background job with SIGINT ignored, and `kill -INT` must still stop it cleanly.)
    // SIGUSR1 and SIGUSR2 as SIGTERM: what a Slurm job asks for with
    // `--signal=USR1@120` to be warned before its time limit (PyTorch Lightning's
    // checkpoint-and-requeue signal), which by default killed the run where it stood,
    // its summary left `running` and its run.lock behind. Left ignored where they were.
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
        signal_hook::consts::SIGUSR2,
    ] {
        let optional = [
            signal_hook::consts::SIGHUP,
            signal_hook::consts::SIGUSR1,
            signal_hook::consts::SIGUSR2,
        ];
        if optional.contains(&sig) && ignored(sig) {
            continue;
        }
        // SAFETY: `on_signal` does only what a signal handler may (see there).
        let _ = unsafe { signal_hook::low_level::register(sig, move || on_signal(sig)) };
    }
    // Say at once that the signal was seen: the loop may be inside a long step before it
    // can act on it. Before a run's first step, end the process from here.
    let _ = std::thread::Builder::new()
        .name("runner-signals".into())
        .spawn(watch);
}

/// The signals thread: waits for the first signal, then says what it does, or, while a
/// run waits for its first step (armed now or later, as a run that was starting when the
/// signal came arms once its files are written), ends the process.
fn watch() {
    let sig = loop {
        match RECEIVED.load(Ordering::Relaxed) {
            0 => std::thread::sleep(Duration::from_millis(100)),
            s => break s as i32,
        }
    };
    loop {
        let mut armed = BEFORE_FIRST_STEP.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at_once) = armed.take() {
            // Held to the end: the run cannot disarm and go on writing meanwhile.
            let how = at_once(sig);
            crate::errln!("\n{}: {how}", name(sig));
            signal_hook::low_level::exit(128 + sig);
        }
        drop(armed);
        say_received();
        let second = SECOND.load(Ordering::SeqCst);
        if second != 0 {
            let sig = second as i32;
            // Held to the end, as above: the run writes no summary meanwhile.
            let mut armed = AT_SECOND.lock().unwrap_or_else(|e| e.into_inner());
            match armed.take() {
                Some(at_once) => {
                    let how = at_once(sig);
                    crate::errln!("\n{} again: {how}", name(sig));
                    signal_hook::low_level::exit(128 + sig);
                }
                // The run had disarmed: its own summary is written (the lock was held
                // while it wrote it), and what is left, its result line and its lock's
                // removal, takes moments. Exiting here left a `completed` run with exit
                // 130, nothing said, and its run.lock behind. A further signal still
                // exits from the handler at once.
                None => {
                    drop(armed);
                    let done = match RESULTS_WRITTEN.load(Ordering::SeqCst) {
                        true => "the run's results are already written",
                        false => "the run has stopped",
                    };
                    crate::errln!("\n{} again: {done}; it ends in a moment", name(sig));
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the first signal's notice has been said; held while it is said.
static NOTICE_SAID: Mutex<bool> = Mutex::new(false);

/// Says, once, what the first signal does: on the signals thread as soon as it sees the
/// signal (the loop may be inside a long step), and on the run's thread when the loop acts
/// on it first (a short step), so that the notice comes before what the stop prints. The
/// loop's thread used to leave it to the signals thread, which wakes every 100 ms: the run
/// then printed its "interrupted" line first, or exited before the notice (2 times in 5
/// with steps of a few ms).
pub fn say_received() {
    let Some(sig) = received() else { return };
    let mut said = NOTICE_SAID.lock().unwrap_or_else(|e| e.into_inner());
    if *said {
        return;
    }
    *said = true;
    let finishing = *FINISHING.lock().unwrap_or_else(|e| e.into_inner());
    if finishing {
        crate::errln!(
            "\n{}: the last step is done: the run finishes its final evaluation and writes its results; send it again to exit at once (the run is then marked interrupted, keeping its weights once they are saved and its checkpoints)",
            name(sig)
        );
    } else {
        crate::errln!(
            "\n{}: stopping at the next step boundary (metrics are kept, a checkpoint is written); send it again to exit at once",
            name(sig)
        );
    }
}

/// Arms `at_once` until the guard is dropped or [`first_step_done`] is called: a signal
/// meanwhile (or one that came before, not yet acted on) runs it on the signals thread,
/// which then ends the process with 128 + the signal. `at_once` records the stop (the
/// run's summary) and returns the line that says it. The run must write nothing that
/// `at_once` also writes while armed.
pub fn exit_before_first_step(at_once: impl FnOnce(i32) -> String + Send + 'static) -> Armed {
    *FINISHING.lock().unwrap_or_else(|e| e.into_inner()) = false;
    FINAL_WEIGHTS.store(false, Ordering::SeqCst);
    *BEST_SAVED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    *BEFORE_FIRST_STEP.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(at_once));
    // One that came before (while the data loaded) is acted on now, on this thread: the
    // loop would otherwise meet it at its first step boundary first and checkpoint step 0.
    exit_if_armed();
    Armed
}

/// Where a signal has come and something is armed: runs it here and ends the process.
/// The loop calls this at a step boundary before it would stop there, so that a signal
/// before the first step never becomes a checkpoint of step 0.
pub fn exit_if_armed() {
    let Some(sig) = received() else { return };
    let mut armed = BEFORE_FIRST_STEP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at_once) = armed.take() {
        let how = at_once(sig);
        crate::errln!("\n{}: {how}", name(sig));
        signal_hook::low_level::exit(128 + sig);
    }
}

/// Disarms what [`exit_before_first_step`] armed: from here a signal stops the run at a
/// step boundary. Waits for a signal being acted on, which ends the process.
pub fn first_step_done() {
    BEFORE_FIRST_STEP
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
}

/// Disarms on drop (the run ended before its first step, by an error).
#[must_use = "dropping it disarms at once"]
pub struct Armed;

impl Drop for Armed {
    fn drop(&mut self) {
        first_step_done();
    }
}

/// Arms `at_once` for a second signal, until the guard writes the run's own summary
/// ([`AtSecond::disarm_while`]) or is dropped: the signals thread runs it (it marks the
/// summary interrupted and returns the line that says so) and ends the process with
/// 128 + the signal. Before, a second Ctrl-C left the summary `running`, as `kill -9` does.
pub fn exit_at_second_signal(at_once: impl FnOnce(i32) -> String + Send + 'static) -> AtSecond {
    *AT_SECOND.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(at_once));
    RESULTS_WRITTEN.store(false, Ordering::SeqCst);
    AT_SECOND_ARMED.store(true, Ordering::SeqCst);
    AtSecond(())
}

/// What [`exit_at_second_signal`] armed; disarms on drop.
#[must_use = "dropping it disarms at once"]
pub struct AtSecond(());

impl AtSecond {
    /// Disarms and runs `write` (the run writing its own summary) with nothing else
    /// writing it meanwhile: a second signal being acted on ends the process first; one
    /// that comes during `write` ends it right after.
    pub fn disarm_while<T>(self, write: impl FnOnce() -> T) -> T {
        let mut armed = AT_SECOND.lock().unwrap_or_else(|e| e.into_inner());
        armed.take();
        let written = write();
        RESULTS_WRITTEN.store(true, Ordering::SeqCst);
        AT_SECOND_ARMED.store(false, Ordering::SeqCst);
        written
    }
}

impl Drop for AtSecond {
    fn drop(&mut self) {
        AT_SECOND.lock().unwrap_or_else(|e| e.into_inner()).take();
        AT_SECOND_ARMED.store(false, Ordering::SeqCst);
    }
}

/// The run has taken its last step: a signal from here lets it finish (its final
/// evaluation, its weights) and says so. Returns the signal that came before, which
/// stops the run at this, its last, step boundary.
pub fn last_step_taken() -> Option<i32> {
    let mut finishing = FINISHING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sig) = received() {
        return Some(sig);
    }
    *finishing = true;
    None
}

/// A new best validation, its weights saved (their SHA-256): see [`best_saved`].
pub fn best_saved_now(step: u64, value: f64, sha256: Option<&str>) {
    *BEST_SAVED.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((step, value, sha256.map(String::from)));
}

/// This process's latest best validation (step, value, the SHA-256 of its weights).
pub fn best_saved() -> Option<Best> {
    BEST_SAVED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The run's trained weights are saved: see [`final_weights`].
pub fn final_weights_saved() {
    FINAL_WEIGHTS.store(true, Ordering::SeqCst);
}

/// Whether this run's trained weights are saved (a file of the same name from an earlier
/// process of it is not counted).
pub fn final_weights() -> bool {
    FINAL_WEIGHTS.load(Ordering::SeqCst)
}

/// Whether `sig` is ignored in this process (as its parent left it).
fn ignored(sig: i32) -> bool {
    // SAFETY: with a null new action, `sigaction` only reads the current one into `old`,
    // a plain C struct for which all zeros is a valid value.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The signal that asked the run to stop, if one did.
pub fn received() -> Option<i32> {
    let s = RECEIVED.load(Ordering::Relaxed);
    (s != 0).then_some(s as i32)
}

/// `SIGINT`, `SIGTERM`, ...
pub fn name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGHUP => "SIGHUP",
        signal_hook::consts::SIGUSR1 => "SIGUSR1",
        signal_hook::consts::SIGUSR2 => "SIGUSR2",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signal_within_half_a_second_is_the_first_delivered_twice() {
        assert_eq!(action(0, 0, 5), Action::Stop);
        assert_eq!(action(1_000, 0, 1_000), Action::Ignore);
        assert_eq!(action(1_000, 0, 1_000 + 499_999), Action::Ignore);
        assert_eq!(action(1_000, 0, 1_000 + 500_000), Action::Exit);
        assert_eq!(action(1_000, 0, 9_000_000), Action::Exit);
    }

    /// The second signal delivered twice (5 ms apart) is one second signal, not a third
    /// that exits at once; a third later still exits.
    #[test]
    fn a_second_signal_delivered_twice_is_one() {
        let (first, second) = (1_000, 700_000);
        assert_eq!(action(first, second, second), Action::Ignore);
        assert_eq!(action(first, second, second + 5_000), Action::Ignore);
        assert_eq!(action(first, second, second + 500_000), Action::Exit);
    }
}
