//! Facts about this process with no dependencies: UTC timestamps for run ids and records,
//! the process's start (from which a run's start-up time is counted), the host name
//! records carry, and caught panics (their text; one caught without a report).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Marks the process start; `main` calls it first. Later calls change nothing.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

/// When the process started (when `mark_process_start` was first called, or failing that,
/// the first call of this).
pub fn process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// This machine's name, for records that say where a process ran.
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// When process `pid` started, in clock ticks after boot (`/proc/<pid>/stat`'s 22nd
/// field); `None` where it is not running (or there is no `/proc`). With the pid it names
/// one process: pids are reused (and a runner that was pid 1 in a container is, seen from
/// the host, init).
pub fn process_started(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process recorded as `pid` (started at `started`, where that was recorded:
/// summaries of older versions have only the pid) is still running on this machine.
pub fn still_running(pid: u32, started: Option<u64>) -> bool {
    let now = process_started(pid);
    match started {
        Some(when) => now == Some(when),
        None => now.is_some(),
    }
}

/// Runs `f`, catching a panic without the default hook's report on stderr: for a library
/// call whose panic the caller turns into an error of its own. The error is the text of
/// every panic meanwhile, in order, the caught one last: a library may panic on a worker
/// thread of its own, where the cause is, so that `f` only sees a closed channel. The hook
/// is process-wide, so a panic of another thread meanwhile is collected too instead of
/// reported; keep `f` short, and call this from one thread at a time.
pub fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, Vec<String>> {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let hook = std::panic::take_hook();
    let record = Arc::clone(&seen);
    std::panic::set_hook(Box::new(move |info| {
        if let Ok(mut all) = record.lock() {
            all.push(panic_message(info.payload()));
        }
    }));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    out.map_err(|caught| {
        let mut all = seen.lock().map(|a| a.clone()).unwrap_or_default();
        let last = panic_message(caught.as_ref());
        if all.last() != Some(&last) {
            all.push(last);
        }
        all
    })
}

/// The text of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "the training loop panicked".into()
    }
}

/// UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_its_pid_and_its_start() {
        let me = std::process::id();
        let started = process_started(me).expect("this process is running");
        assert!(still_running(me, Some(started)) && still_running(me, None));
        assert!(!still_running(me, Some(started + 1)), "a reused pid");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(process_started(pid), None, "reaped");
        assert!(!still_running(pid, None));
    }

    #[test]
    fn quietly_returns_the_panics_of_other_threads_before_its_own() {
        let out = quietly(|| {
            let worker = std::thread::spawn(|| panic!("no adapter on the worker"));
            let _ = worker.join();
            panic!("the channel closed")
        });
        // Tests run side by side: another test's panic meanwhile may be collected too.
        let panics = out.unwrap_err();
        let at = |m: &str| panics.iter().position(|p| p == m);
        assert!(
            at("no adapter on the worker") < at("the channel closed")
                && panics.last().map(String::as_str) == Some("the channel closed"),
            "{panics:?}"
        );
        assert_eq!(quietly(|| 7).unwrap(), 7);
    }

    #[test]
    fn utc_stamp_has_the_iso_shape() {
        let s = utc_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z') && &s[10..11] == "T");
    }
}
