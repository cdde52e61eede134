//! CUDA kernels between runs: where compiled kernels and autotune results are cached, how
//! hard the autotuner searches, and counters of what CubeCL compiled and tuned (read from
//! its `log` records, which is all CubeCL 0.10 exposes). Owns CubeCL's process-wide
//! configuration; it does not run kernels (`train` does) and knows nothing of recipes
//! beyond the `[backend]` keys in `KernelPlan`.
//!
//! Why it exists: on a cold machine CubeCL compiles every kernel through NVRTC and
//! benchmarks several matmul/convolution variants per new shape, one at a time, before
//! the first step. CubeCL can keep both on disk but keeps compiled kernels only when
//! asked, and puts autotune results under the nearest `target/` directory. The runner
//! asks for both, in one per-user directory, so a second run starts in seconds.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::Serialize;

pub use crate::metrics::KernelCounts;
use crate::plan::KernelPlan;
use crate::recipe::AutotuneLevel;

/// The environment variable that moves the cache (below the recipe key, above the default).
pub const CACHE_ENV: &str = "RUNNER_CACHE_DIR";

/// The cache directory and what chose it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheDir {
    /// (Written lossily: a `$HOME` or `$RUNNER_CACHE_DIR` that is not UTF-8 failed every
    /// run's env.json, CPU runs included, which use no cache.)
    #[serde(serialize_with = "lossy_path")]
    pub dir: PathBuf,
    /// `backend.cache_dir`, `$RUNNER_CACHE_DIR`, `$XDG_CACHE_HOME`, `$HOME` or `working directory`.
    pub chosen_by: String,
    /// The directory chosen, where it could not be written and `dir` is this user's
    /// fallback for it (see [`usable_cache`]).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "lossy_optional_path"
    )]
    pub instead_of: Option<PathBuf>,
}

fn lossy_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

fn lossy_optional_path<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => lossy_path(p, s),
        None => s.serialize_none(),
    }
}

impl CacheDir {
    /// The directory the settings asked for (`dir`, unless it is a fallback).
    pub fn requested(&self) -> &Path {
        self.instead_of.as_deref().unwrap_or(&self.dir)
    }
}

/// Where kernels are cached: `backend.cache_dir` (already absolute), else
/// `$RUNNER_CACHE_DIR`, else `$XDG_CACHE_HOME/runner`, else `$HOME/.cache/runner`, else
/// `.runner-cache` in the working directory. `env` is `std::env::var_os` outside tests.
pub fn cache_dir(key: Option<&Path>, env: impl Fn(&str) -> Option<OsString>) -> CacheDir {
    let set = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    // `RUNNER_CACHE_DIR='~/k'` (quoted, so no shell expanded it) is the home's `k`, as
    // in the recipe key; `~user` stays as written.
    let home = |d: PathBuf| match (d.to_str(), set("HOME")) {
        (Some(s), Some(h)) if s == "~" || s.starts_with("~/") => {
            h.join(s[1..].trim_start_matches('/'))
        }
        _ => d,
    };
    let (dir, chosen_by) = if let Some(k) = key {
        (k.to_path_buf(), "backend.cache_dir".to_string())
    } else if let Some(d) = set(CACHE_ENV) {
        (home(d), format!("${CACHE_ENV}"))
    } else if let Some(d) = set("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        // The XDG spec: a relative value is invalid and is ignored.
        (d.join("runner"), "$XDG_CACHE_HOME".into())
    } else if let Some(d) = set("HOME") {
        (d.join(".cache").join("runner"), "$HOME".into())
    } else {
        (PathBuf::from(".runner-cache"), "working directory".into())
    };
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    CacheDir {
        dir,
        chosen_by,
        instead_of: None,
    }
}

/// Where under `dir` this process cannot write, if anywhere: every directory must take a
/// new file and every file an append. CubeCL 0.10 creates a lock file beside each of its
/// cache files before it reads the file, retries for 30 s where it cannot, and then neither
/// reads nor writes that file; so a cache another user made (directories `rwxr-xr-x`), a
/// read-only home, or a read-only file system cost 30 s a file and were not read at all
/// (seen on WebGPU over software Vulkan: a warm cache owned by another user, 371 s to the
/// quickstart's first step; 23 s through the fallback, as long as its owner's run takes
/// without Mesa's own shader cache). On CUDA it is worse: cubecl-common 0.10's compiled-kernel
/// cache opens its chunk file for appending with `expect("Failed to open write chunk")`, so
/// an unwritable cache panics the device thread at start (read in its source,
/// `compilation_cache.rs`; not run here). Lock files themselves are not checked; the walk
/// stops after 10,000 entries.
pub fn unwritable(dir: &Path) -> Option<String> {
    let probe = crate::metrics::takes_new_file;
    let mut dirs = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = dirs.pop() {
        if let Err(e) = probe(&d) {
            return Some(format!("{} takes no new file: {e}", d.display()));
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) => return Some(format!("{} cannot be listed: {e}", d.display())),
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 10_000 {
                return None;
            }
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => dirs.push(path),
                Ok(t) if t.is_file() && path.extension().is_none_or(|x| x != "lock") => {
                    if let Err(e) = std::fs::OpenOptions::new().append(true).open(&path) {
                        return Some(format!("{} cannot be appended to: {e}", path.display()));
                    }
                }
                _ => {}
            }
        }
    }
    None
}

/// The cache to give CubeCL for `wanted`: `wanted` itself where this process can write all
/// of it ([`unwritable`]); else this user's own directory `runner-kernels-<uid>` under
/// `temp`, with the files of `wanted` it lacks copied in (so a cache shared read-only still
/// saves the compiling and tuning), and a warning that says why, where, and what to do.
/// `Err` only where no fallback can be made either.
pub fn usable_cache(wanted: CacheDir, temp: &Path) -> Result<(CacheDir, Option<String>), String> {
    let why = match std::fs::create_dir_all(&wanted.dir) {
        Err(e) => format!("it cannot be created: {e}"),
        Ok(()) => match unwritable(&wanted.dir) {
            None => return Ok((wanted, None)),
            Some(why) => why,
        },
    };
    let user = user_id();
    let own = |d: &Path| -> bool {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let ours =
            |m: std::fs::Metadata| m.is_dir() && Some(m.uid()) == user && unwritable(d).is_none();
        match std::fs::symlink_metadata(d) {
            Ok(m) => ours(m),
            Err(_) => match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => true,
                // Another run of this user's made it meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::symlink_metadata(d).is_ok_and(ours)
                }
                Err(_) => false,
            },
        }
    };
    let tag = user.map_or_else(|| "user".to_string(), |u| u.to_string());
    let mut fallback = temp.join(format!("runner-kernels-{tag}"));
    if !own(&fallback) {
        // Taken by someone else (or not a directory): one of this process's own.
        fallback = temp.join(format!("runner-kernels-{tag}-{}", std::process::id()));
        if !own(&fallback) {
            return Err(format!(
                "the kernel cache {} (chosen by {}) cannot be used: {why}; and no directory of this user's could be made under {} instead",
                wanted.dir.display(),
                wanted.chosen_by,
                temp.display()
            ));
        }
    }
    let (copied, failed) = if wanted.dir.is_dir() {
        copy_missing(&wanted.dir, &fallback)
    } else {
        (0, 0)
    };
    let failed = match failed {
        0 => String::new(),
        n => format!(", {n} could not be read"),
    };
    let note = format!(
        "the kernel cache {} (chosen by {}) is not writable by this process ({why}): CubeCL would wait 30 s on each of its files and then neither read nor keep them. This run caches in {} instead ({copied} files copied from it{failed}), which lasts as long as {} keeps it. To share one cache between users, make it writable by all of them (group-writable directories, umask 002); else set ${CACHE_ENV} or backend.cache_dir to a writable directory",
        wanted.dir.display(),
        wanted.chosen_by,
        fallback.display(),
        temp.display(),
    );
    let used = CacheDir {
        dir: fallback,
        chosen_by: format!("fallback for {}", wanted.chosen_by),
        instead_of: Some(wanted.dir),
    };
    Ok((used, Some(note)))
}

/// This process's user id (the owner of `/proc/self`), where Linux tells it.
fn user_id() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Copies the files under `from` that `to` lacks (lock files aside), keeping their
/// relative paths; what `to` already has is its own, newer record, and is kept. Each file
/// is copied to a temporary name and linked into place only where none is there yet, so a
/// concurrent run of the same user's, already appending to it, loses nothing. Returns the
/// files copied and those that could not be.
fn copy_missing(from: &Path, to: &Path) -> (usize, usize) {
    let (mut copied, mut failed) = (0, 0);
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(from.join(&rel)) else {
            failed += 1;
            continue;
        };
        for entry in entries.flatten() {
            let rel = rel.join(entry.file_name());
            match entry.file_type() {
                Ok(t) if t.is_dir() => dirs.push(rel),
                Ok(t) if t.is_file() && rel.extension().is_none_or(|x| x != "lock") => {
                    let dest = to.join(&rel);
                    if dest.exists() {
                        continue;
                    }
                    let part = dest.with_extension(format!("part-{}", std::process::id()));
                    let done = dest
                        .parent()
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|()| std::fs::copy(entry.path(), &part))
                        .and_then(|_| std::fs::hard_link(&part, &dest));
                    let _ = std::fs::remove_file(&part);
                    match done {
                        Ok(()) => copied += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(_) => failed += 1,
                    }
                }
                _ => {}
            }
        }
    }
    (copied, failed)
}

/// What CubeCL was configured with in this process (it can be configured once).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelSettings {
    #[serde(flatten)]
    pub cache: CacheDir,
    pub autotune: String,
    pub fusion: bool,
    /// Why: `backend.fusion = true` or `false`, or what `"auto"` found (the CPUs this
    /// process may use).
    pub fusion_reason: String,
    /// `backend.conv`: `autotune` or `implicit_gemm`, with `backend.conv_kernel` and
    /// `conv_tile` where they are not Burn's own (`KernelPlan::conv_name`).
    pub conv: String,
    /// `backend.norm_sums`: `one_pass` or `reduce`.
    pub norm_sums: String,
    /// `backend.matmul`: `fixed` or `autotune`.
    pub matmul: String,
    /// False on the CPU backend, which compiles nothing at run time.
    pub used: bool,
    /// Anything that kept the recipe's settings from applying.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

static APPLIED: OnceLock<KernelSettings> = OnceLock::new();

/// Configures CubeCL for a CUDA (or WebGPU) run (once per process: CubeCL reads its
/// configuration when the first device starts and never again). A later call with other settings gets
/// the first ones back, with a note saying so. `cubecl.toml` and `CUBECL_DEBUG_LOG` still
/// apply; the cache locations and the autotune level are the recipe's.
pub fn configure_cubecl(plan: &KernelPlan) -> Result<KernelSettings, String> {
    let wanted = KernelSettings {
        cache: cache_dir(plan.cache_dir.as_deref(), |k| std::env::var_os(k)),
        autotune: plan.autotune.name().into(),
        fusion: plan.fusion,
        fusion_reason: plan.fusion_reason.clone(),
        conv: plan.conv_name(),
        norm_sums: plan.norm_sums.name().into(),
        matmul: plan.matmul.name().into(),
        used: true,
        notes: vec![],
    };
    if let Some(first) = APPLIED.get() {
        let mut s = first.clone();
        s.fusion = plan.fusion;
        s.fusion_reason.clone_from(&plan.fusion_reason);
        s.conv = plan.conv_name();
        s.norm_sums = plan.norm_sums.name().into();
        s.matmul = plan.matmul.name().into();
        if (s.cache.requested(), &s.autotune) != (wanted.cache.requested(), &wanted.autotune) {
            s.notes.push(format!(
                "CubeCL was already configured in this process (cache {}, autotune {}); run cells that differ in backend.cache_dir or backend.autotune as separate processes (--cell N)",
                s.cache.dir.display(),
                s.autotune
            ));
        }
        return Ok(s);
    }
    let mut settings = wanted;
    let (cache, note) = usable_cache(settings.cache, &std::env::temp_dir())?;
    settings.cache = cache;
    settings.notes.extend(note);
    if let Ok(env) = std::env::var("CUBECL_AUTOTUNE_LEVEL") {
        settings.notes.push(format!(
            "CUBECL_AUTOTUNE_LEVEL={env} is ignored: the recipe's backend.autotune = \"{}\" applies (--set backend.autotune=... to change it)",
            settings.autotune
        ));
    }
    apply_cubecl(&settings.cache.dir, plan.autotune)?;
    Ok(APPLIED.get_or_init(|| settings).clone())
}

/// The settings a CPU run records: nothing is compiled, the directory is where a CUDA run
/// of the same recipe would cache.
pub fn cpu_settings(plan: &KernelPlan) -> KernelSettings {
    KernelSettings {
        cache: cache_dir(plan.cache_dir.as_deref(), |k| std::env::var_os(k)),
        autotune: plan.autotune.name().into(),
        fusion: plan.fusion,
        fusion_reason: plan.fusion_reason.clone(),
        conv: plan.conv_name(),
        norm_sums: plan.norm_sums.name().into(),
        matmul: plan.matmul.name().into(),
        used: false,
        notes: vec![],
    }
}

#[cfg(feature = "cube")]
fn apply_cubecl(dir: &Path, level: AutotuneLevel) -> Result<(), String> {
    use cubecl::config::autotune::{AutotuneLevel as Level, AutotuneLogLevel};
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    // CubeCL panics on a malformed cubecl.toml; turn that into an error naming the file.
    let base = std::panic::catch_unwind(|| {
        CubeClRuntimeConfig::from_current_dir().override_from_env()
    })
    .map_err(|p| {
        format!(
            "CubeCL's configuration (cubecl.toml, or [cubecl] in burn.toml, in this directory or above) cannot be read: {}",
            crate::clock::panic_message(p.as_ref())
        )
    })?;
    let mut config = base;
    // Both caches in one directory: `<dir>/cuda/<cubecl version>/ptx.json.log` and
    // `<dir>/autotune/<cubecl version>/<device>/...`. CubeCL's cache files take a lock file
    // for each write, so concurrent processes (a Slurm array) can share them.
    config.compilation.cache = Some(CacheConfig::File(dir.to_path_buf()));
    config.autotune.cache = CacheConfig::File(dir.to_path_buf());
    // Each tuning's end as a `log` record ("Fastest result ..."), so its time can be
    // measured (the start is CubeCL's "Tuning ..." record): the autotune logger at its
    // least level, forwarded to the `log` crate, beside whatever cubecl.toml asks for.
    if matches!(config.autotune.logger.level, AutotuneLogLevel::Disabled) {
        config.autotune.logger.level = AutotuneLogLevel::Minimal;
    }
    config.autotune.logger.log = Some(Default::default());
    config.autotune.level = match level {
        AutotuneLevel::Minimal => Level::Minimal,
        AutotuneLevel::Balanced => Level::Balanced,
        AutotuneLevel::Extensive => Level::Extensive,
        AutotuneLevel::Full => Level::Full,
    };
    std::panic::catch_unwind(move || CubeClRuntimeConfig::set(config)).map_err(|_| {
        "CubeCL was configured before the runner could set its caches (a CUDA device was used earlier in this process)".to_string()
    })
}

#[cfg(not(feature = "cube"))]
fn apply_cubecl(_: &Path, _: AutotuneLevel) -> Result<(), String> {
    Err("this binary was built without the `cuda` or `wgpu` feature".into())
}

static COMPILED: AtomicU64 = AtomicU64::new(0);
static FROM_CACHE: AtomicU64 = AtomicU64::new(0);
static TUNED: AtomicU64 = AtomicU64::new(0);
static TUNE_LOADED: AtomicU64 = AtomicU64::new(0);
static TUNE_MICROS: AtomicU64 = AtomicU64::new(0);

/// The tunings under way: per thread, the keys being tuned (a candidate's own kernels may
/// tune inside, inline on the device thread or on a second thread); and since when at
/// least one has been. The time counted is the wall time during which any tuning is under
/// way, not a sum per tuning, so nested and overlapping ones count once.
///
/// A tuning whose end line never comes (CubeCL panics inside it; a set of one candidate is
/// taken without timing and without the line, though Burn 0.21 has none) is dropped when a
/// tuning begun before it on its thread ends; one with nothing open below it keeps the
/// count from closing, so later tunings are missed: the figure errs low, never high.
struct Tunings<T> {
    open: std::collections::HashMap<T, Vec<String>>,
    since: Option<std::time::Instant>,
}

impl<T: std::hash::Hash + Eq> Tunings<T> {
    fn new() -> Self {
        Self {
            open: std::collections::HashMap::new(),
            since: None,
        }
    }

    /// A tuning of `key` began on `thread`.
    fn began(&mut self, thread: T, key: &str, now: std::time::Instant) {
        self.since.get_or_insert(now);
        self.open.entry(thread).or_default().push(key.to_string());
    }

    /// CubeCL's line at the end of a tuning on `thread` (`Fastest result <kernel>-<key>.
    /// ...`): that tuning ends, with any begun after it there that never said so. When no
    /// tuning is under way any more: the time since the first of them began.
    fn ended(
        &mut self,
        thread: T,
        msg: &str,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let keys = self.open.get_mut(&thread)?;
        let at = keys
            .iter()
            .rposition(|key| msg.contains(&format!("-{key}.")))?;
        keys.truncate(at);
        if keys.is_empty() {
            self.open.remove(&thread);
        }
        if !self.open.is_empty() {
            return None;
        }
        self.since.take().map(|since| now - since)
    }

    /// How long the tuning under way now has been (none: nothing is being tuned).
    fn running(&self, now: std::time::Instant) -> std::time::Duration {
        self.since
            .map_or(std::time::Duration::ZERO, |since| now - since)
    }
}

static TUNINGS: std::sync::Mutex<Option<Tunings<std::thread::ThreadId>>> =
    std::sync::Mutex::new(None);

pub fn counts() -> KernelCounts {
    KernelCounts {
        compiled: COMPILED.load(Ordering::Relaxed),
        from_cache: FROM_CACHE.load(Ordering::Relaxed),
        tuned: TUNED.load(Ordering::Relaxed),
        tune_results_loaded: TUNE_LOADED.load(Ordering::Relaxed),
        tune_ms: TUNE_MICROS.load(Ordering::Relaxed) / 1000,
    }
}

/// `counts()` with the tuning under way now counted up to now, for a display that must not
/// stand still through a long tuning (the figure stays monotonic: a stretch that ends
/// moves from here into `tune_ms`). A tuning whose end line never comes keeps this
/// growing, so records keep `counts()`.
pub fn counts_live() -> KernelCounts {
    // Under the lock a tuning's end takes to add its stretch, so no stretch is counted in
    // neither or both.
    let Ok(t) = TUNINGS.lock() else {
        return counts();
    };
    let mut c = counts();
    if let Some(t) = t.as_ref() {
        c.tune_ms = (TUNE_MICROS.load(Ordering::Relaxed)
            + t.running(std::time::Instant::now()).as_micros() as u64)
            / 1000;
    }
    c
}

fn tuning_began(key: &str) {
    if let Ok(mut t) = TUNINGS.lock() {
        let now = std::time::Instant::now();
        t.get_or_insert_with(Tunings::new)
            .began(std::thread::current().id(), key, now);
    }
}

fn tuning_ended(msg: &str) {
    let Ok(mut t) = TUNINGS.lock() else { return };
    let now = std::time::Instant::now();
    if let Some(took) = t
        .as_mut()
        .and_then(|t| t.ended(std::thread::current().id(), msg, now))
    {
        TUNE_MICROS.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Counts CubeCL's compile and tune events from its `log` records (trace level, target
/// `cubecl_*`); CubeCL's and Burn's errors go to stderr. Records of other crates are
/// dropped unformatted, so the cost outside CubeCL is one call per record.
struct Observer;

impl log::Log for Observer {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.target().starts_with("cubecl") || m.level() <= log::Level::Error
    }

    fn log(&self, r: &log::Record) {
        if !r.target().starts_with("cubecl") {
            if r.level() <= log::Level::Error && r.target().starts_with("burn") {
                crate::errln!("{}: {}", r.target(), r.args());
            }
            return;
        }
        observe(r.level(), &r.args().to_string());
    }

    fn flush(&self) {}
}

/// One CubeCL log message → the counters (the messages of cubecl-cuda, cubecl-wgpu and
/// cubecl-runtime 0.10; a test pins them).
pub(crate) fn observe(level: log::Level, msg: &str) {
    match msg {
        "Compiling kernel" => {
            COMPILED.fetch_add(1, Ordering::Relaxed);
        }
        "Using PTX cache" => {
            FROM_CACHE.fetch_add(1, Ordering::Relaxed);
        }
        // cubecl-wgpu's WGSL path (no compiled-kernel cache there).
        m if m.starts_with("[cubecl-wgpu] compiling WGSL module") => {
            COMPILED.fetch_add(1, Ordering::Relaxed);
        }
        m if m.starts_with("Tuning ") => {
            TUNED.fetch_add(1, Ordering::Relaxed);
            tuning_began(&m["Tuning ".len()..]);
        }
        // The autotune logger's line at the end of a tuning (at any of its levels).
        m if m.starts_with("Fastest result ") => tuning_ended(m),
        m if m.starts_with("Loaded ") && m.ends_with(" autotune cached entries") => {
            let n = m
                .trim_start_matches("Loaded ")
                .split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            TUNE_LOADED.fetch_add(n, Ordering::Relaxed);
        }
        m if level <= log::Level::Error => crate::errln!("cubecl: {m}"),
        _ => {}
    }
}

/// Installs the observer (once per process; later calls and other loggers are left alone).
pub fn observe_cubecl() {
    static OBSERVER: Observer = Observer;
    if log::set_logger(&OBSERVER).is_ok() {
        log::set_max_level(log::LevelFilter::Trace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn cache_dir_precedence_key_then_env_then_xdg_then_home() {
        let all = [
            ("RUNNER_CACHE_DIR", "/scratch/kernels"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        let d = cache_dir(Some(Path::new("/from/recipe")), env(&all));
        assert_eq!(d.dir, PathBuf::from("/from/recipe"));
        assert_eq!(d.chosen_by, "backend.cache_dir");
        let d = cache_dir(None, env(&all));
        assert_eq!(
            (d.dir, d.chosen_by.as_str()),
            (PathBuf::from("/scratch/kernels"), "$RUNNER_CACHE_DIR")
        );
        let d = cache_dir(None, env(&all[1..]));
        assert_eq!(d.dir, PathBuf::from("/xdg/runner"));
        let d = cache_dir(None, env(&all[2..]));
        assert_eq!(d.dir, PathBuf::from("/home/u/.cache/runner"));
        // An empty variable counts as unset, as XDG says.
        let d = cache_dir(None, env(&[("RUNNER_CACHE_DIR", ""), ("HOME", "/h")]));
        assert_eq!(d.dir, PathBuf::from("/h/.cache/runner"));
        let d = cache_dir(None, env(&[]));
        assert!(d.dir.is_absolute() && d.dir.ends_with(".runner-cache"));
        // A relative XDG_CACHE_HOME is ignored, as XDG says; a quoted `~` is the home.
        let d = cache_dir(None, env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]));
        assert_eq!(d.dir, PathBuf::from("/h/.cache/runner"));
        let d = cache_dir(None, env(&[("RUNNER_CACHE_DIR", "~/k"), ("HOME", "/h")]));
        assert_eq!(d.dir, PathBuf::from("/h/k"));
    }

    fn scratch(tag: &str) -> crate::scratch::Scratch {
        crate::scratch::Scratch::new(&format!("unit-{tag}"))
    }

    fn wanted(dir: &Path) -> CacheDir {
        CacheDir {
            dir: dir.to_path_buf(),
            chosen_by: "$RUNNER_CACHE_DIR".into(),
            instead_of: None,
        }
    }

    /// A cache this process can write is used as it is; one it cannot (here: one that
    /// cannot be created, under /proc, which even root cannot write) is replaced by this
    /// user's own directory under the temporary one, the same on the next run, with a
    /// warning naming both and what to do. Permissions proper (another user's cache) are
    /// checked through the binary, as another user (tests/tests/wgpu.rs).
    #[test]
    fn an_unwritable_cache_falls_back_to_this_users_own() {
        let tmp = scratch("cache-fallback");
        let good = tmp.join("kc");
        std::fs::create_dir_all(good.join("autotune/0.10.0")).unwrap();
        std::fs::write(good.join("autotune/0.10.0/matmul.json.log"), "{}\n").unwrap();
        assert_eq!(unwritable(&good), None);
        let (used, note) = usable_cache(wanted(&good), &tmp).unwrap();
        assert_eq!((used, note), (wanted(&good), None));

        let bad = Path::new("/proc/runner-no-such-cache");
        let why = unwritable(Path::new("/proc")).expect("/proc takes no file");
        assert!(why.starts_with("/proc takes no new file"), "{why}");
        let (used, note) = usable_cache(wanted(bad), &tmp).unwrap();
        let uid = user_id().unwrap();
        assert_eq!(used.dir, tmp.join(format!("runner-kernels-{uid}")));
        assert_eq!(used.requested(), bad);
        assert_eq!(used.chosen_by, "fallback for $RUNNER_CACHE_DIR");
        let note = note.unwrap();
        for part in [
            "the kernel cache /proc/runner-no-such-cache (chosen by $RUNNER_CACHE_DIR) is not writable",
            "it cannot be created",
            "wait 30 s",
            "(0 files copied from it)",
            "set $RUNNER_CACHE_DIR or backend.cache_dir to a writable directory",
        ] {
            assert!(note.contains(part), "{part:?} not in {note}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&used.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        let (again, _) = usable_cache(wanted(bad), &tmp).unwrap();
        assert_eq!(again.dir, used.dir);

        // A fallback path someone else took (here a file) is not used: one of this
        // process's own is.
        let tmp2 = scratch("cache-fallback-taken");
        std::fs::write(tmp2.join(format!("runner-kernels-{uid}")), "").unwrap();
        let (used, _) = usable_cache(wanted(bad), &tmp2).unwrap();
        let pid = std::process::id();
        assert_eq!(used.dir, tmp2.join(format!("runner-kernels-{uid}-{pid}")));
    }

    /// The files a fallback lacks are copied in with their paths; lock files are not, and
    /// what it has already (its own later record) is kept.
    #[test]
    fn copy_missing_fills_in_without_overwriting() {
        let tmp = scratch("copy-missing");
        let (from, to) = (tmp.join("from"), tmp.join("to"));
        for (rel, text) in [
            ("cuda/0.10.0/ptx.json.log", "shared ptx"),
            ("autotune/0.10.0/dev/matmul.json.log", "shared matmul"),
            ("autotune/0.10.0/dev/conv.json.log", "shared conv"),
            ("autotune/0.10.0/dev/conv.json.log.lock", "stale"),
        ] {
            let p = from.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        std::fs::create_dir_all(to.join("autotune/0.10.0/dev")).unwrap();
        std::fs::write(to.join("autotune/0.10.0/dev/conv.json.log"), "mine").unwrap();
        assert_eq!(copy_missing(&from, &to), (2, 0));
        let read = |rel: &str| std::fs::read_to_string(to.join(rel)).unwrap();
        assert_eq!(read("cuda/0.10.0/ptx.json.log"), "shared ptx");
        assert_eq!(read("autotune/0.10.0/dev/matmul.json.log"), "shared matmul");
        assert_eq!(read("autotune/0.10.0/dev/conv.json.log"), "mine");
        assert!(!to.join("autotune/0.10.0/dev/conv.json.log.lock").exists());
    }

    #[test]
    fn observer_counts_cubecl_messages() {
        let before = counts();
        observe(log::Level::Trace, "Compiling kernel");
        observe(log::Level::Trace, "Compiling kernel");
        observe(log::Level::Trace, "Using PTX cache");
        observe(
            log::Level::Trace,
            "[cubecl-wgpu] compiling WGSL module `main`\n@compute fn main() {}",
        );
        observe(log::Level::Info, "Tuning MatmulAutotuneKey { m: 64 }");
        observe(
            log::Level::Info,
            "Fastest result matmul-MatmulAutotuneKey { m: 64 }. \n Top 3 times: []",
        );
        observe(log::Level::Info, "Loaded 17 autotune cached entries");
        observe(log::Level::Info, "Load autotune cache ...");
        let d = counts().since(before);
        // Other tests may count concurrently; these are lower bounds that cannot all hold
        // by accident (nothing else in the suite logs through CubeCL).
        assert!(
            d.compiled >= 3 && d.from_cache >= 1 && d.tuned >= 1,
            "{d:?}"
        );
        assert!(d.tune_results_loaded >= 17, "{d:?}");
    }

    /// Tunings that overlap on two threads, or nest on one, count their wall time once;
    /// one that never says it ended is dropped when an enclosing one ends, and otherwise
    /// makes the figure miss later tunings rather than count the time between them.
    #[test]
    fn tuning_time_is_the_wall_time_any_tuning_is_under_way() {
        let t0 = std::time::Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let ms = std::time::Duration::from_millis;
        let end = |key: &str| format!("Fastest result k-{key}. \n Top 3 times: []");
        let mut t = Tunings::new();

        // Across two threads: 0..60 holds 10..50. While it runs, the display's figure
        // grows from its start.
        assert_eq!(t.running(at(0)), ms(0), "nothing under way");
        t.began(1, "OuterKey(1)", at(0));
        t.began(2, "InnerKey(2)", at(10));
        assert_eq!(t.running(at(40)), ms(40));
        assert_eq!(
            t.ended(2, &end("InnerKey(2)"), at(50)),
            None,
            "the outer one is open"
        );
        assert_eq!(t.running(at(52)), ms(52), "still under way");
        assert_eq!(
            t.ended(1, &end("InnerKey(2)"), at(55)),
            None,
            "not open on thread 1"
        );
        assert_eq!(
            t.ended(1, &end("OuterKey(1)"), at(60)),
            Some(ms(60)),
            "not 60 + 40"
        );
        assert_eq!(t.running(at(70)), ms(0), "its time moved into the total");

        // Nested on one thread: 100..200 holds 120..150.
        t.began(1, "OuterKey(3)", at(100));
        t.began(1, "InnerKey(4)", at(120));
        assert_eq!(t.ended(1, &end("InnerKey(4)"), at(150)), None);
        assert_eq!(t.ended(1, &end("OuterKey(3)"), at(200)), Some(ms(100)));

        // A tuning that never ends, inside one that does: dropped with it.
        t.began(1, "OuterKey(5)", at(300));
        t.began(1, "LostKey(6)", at(310));
        assert_eq!(t.ended(1, &end("OuterKey(5)"), at(330)), Some(ms(30)));

        // One with nothing enclosing it: later tunings are missed, and the time between
        // them is not counted either.
        t.began(1, "LostKey(7)", at(400));
        t.began(1, "RealKey(8)", at(500));
        assert_eq!(t.ended(1, &end("RealKey(8)"), at(510)), None, "not 110 ms");
    }

    /// The messages counted are CubeCL 0.10's own: if an upgrade changes them, this fails
    /// instead of the counters silently staying at zero.
    #[test]
    fn counted_messages_exist_in_the_pinned_cubecl() {
        let registry = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .map(|h| h.join("registry").join("src"));
        let Some(src) = registry.filter(|p| p.is_dir()) else {
            return;
        };
        let find = |krate: &str, file: &str| -> Option<String> {
            std::fs::read_dir(&src)
                .ok()?
                .flatten()
                .map(|d| d.path().join(krate).join(file))
                .find(|p| p.is_file())
                .and_then(|p| std::fs::read_to_string(p).ok())
        };
        if let Some(ctx) = find("cubecl-cuda-0.10.0", "src/compute/context.rs") {
            assert!(ctx.contains("log::trace!(\"Compiling kernel\")"));
            assert!(ctx.contains("log::trace!(\"Using PTX cache\")"));
        }
        if let Some(tuner) = find("cubecl-runtime-0.10.0", "src/tune/tuner.rs") {
            assert!(tuner.contains("log::info!(\"Tuning {key}\")"));
            // Both of the autotune logger's levels end a tuning with this line.
            assert_eq!(tuner.matches("\"Fastest result {}-{key}.").count(), 2);
        }
        if let Some(backend) = find("cubecl-wgpu-0.10.0", "src/backend/base.rs") {
            assert!(backend.contains("log::trace!(\"[cubecl-wgpu] compiling WGSL module `"));
        }
        if let Some(cache) = find("cubecl-runtime-0.10.0", "src/tune/tune_cache.rs") {
            assert!(cache.contains("log::info!(\"Loaded {loaded} autotune cached entries\")"));
        }
    }
}
