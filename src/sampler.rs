//! The utilisation sampler: a thread that reads, at a fixed interval, GPU utilisation,
//! memory, SM clock and power from NVML (libnvidia-ml, loaded at run time) or, on the CPU
//! backend, this process's CPU utilisation from /proc. Each sample is written to the run's
//! `samples.jsonl` as it is taken, and kept with its time until no step still to come can
//! take it, so that each step can be given the mean of the samples taken while it ran. Where NVML cannot be
//! loaded the sampler says "unavailable: <why>" and the run goes on. No Burn here.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::metrics::JsonLines;

/// One reading. GPU fields come from NVML, `cpu_util_pct` from /proc.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the run's start.
    pub t_ms: f64,
    /// Percent of the last sample period in which a kernel ran (NVML `utilization.gpu`).
    pub gpu_util_pct: Option<f64>,
    /// Device memory in use as the driver sees it (all processes), bytes.
    pub gpu_mem_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    /// This process's CPU time over wall time since the last sample, in percent of all
    /// cores (100 = every core busy).
    pub cpu_util_pct: Option<f64>,
}

impl Sample {
    /// The field-wise mean of `samples` (fields absent in all stay absent).
    pub fn mean(samples: &[&Sample]) -> Option<Sample> {
        if samples.is_empty() {
            return None;
        }
        fn avg(v: impl Iterator<Item = f64>) -> Option<f64> {
            let (n, s) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
            (n > 0).then(|| s / n as f64)
        }
        Some(Sample {
            t_ms: samples.last().map_or(0.0, |s| s.t_ms),
            gpu_util_pct: avg(samples.iter().filter_map(|s| s.gpu_util_pct)),
            gpu_mem_used_bytes: avg(samples
                .iter()
                .filter_map(|s| s.gpu_mem_used_bytes.map(|b| b as f64)))
            .map(|b| b as u64),
            sm_clock_mhz: avg(samples.iter().filter_map(|s| s.sm_clock_mhz)),
            power_w: avg(samples.iter().filter_map(|s| s.power_w)),
            cpu_util_pct: avg(samples.iter().filter_map(|s| s.cpu_util_pct)),
        })
    }
}

/// Cuts the samples file at `path` before its first sample after `t_ms` (a resumed run
/// goes on from its checkpoint's step, at that time on its clock, as its metrics lines
/// do: the samples after it, of the steps trained again, went with them). A file that is
/// not there is left so.
pub fn cut_after(path: &Path, t_ms: f64) -> std::io::Result<()> {
    use std::io::BufRead as _;
    let file = match crate::metrics::open_regular(path, true) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        f => f?,
    };
    let mut reader = std::io::BufReader::new(&file);
    let (mut kept, mut line) = (0u64, vec![]);
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        // A line cut short by a kill (no newline) goes too.
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        if serde_json::from_slice::<Sample>(&line).is_ok_and(|s| s.t_ms > t_ms) {
            break;
        }
        kept += n as u64;
    }
    if kept < file.metadata()?.len() {
        file.set_len(kept)?;
    }
    Ok(())
}

/// What to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UtilSource {
    /// NVML, for the GPU with this index.
    Nvml(u32),
    /// /proc/self/stat: this process's CPU time.
    Proc,
}

/// A reading function: `Err` means the source cannot be used.
type Reader = Box<dyn FnMut() -> Result<Sample, String> + Send>;

pub struct Sampler {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    /// `nvml: <device>`, `proc`, `off` or `unavailable: <why>`.
    pub status: String,
}

/// What the sampler thread and the steps share.
#[derive(Default)]
struct Shared {
    /// The samples a later step's window can still take: those after the start of the
    /// latest step asked for, and the latest sample (see [`Sampler::window`]). All of
    /// them were kept, and every step's window scanned them all: a day's run at the
    /// default 100 ms held 864,000 samples, scanned at each step.
    recent: VecDeque<Sample>,
    /// Samples taken, and the first error writing them to their file.
    taken: usize,
    error: Option<String>,
}

/// The sampler's clock and file: a sample's `t_ms` is `offset_ms` plus the time since
/// `t0` (a resumed run's clock goes on from its checkpoint's step, as its metrics lines'
/// do), and each sample is appended to `file` as it is taken: the file of that name in
/// the run directory, wherever the directory is by the first sample (one moved before it
/// lost them all: the file was opened at the path the directory had).
pub struct SampleTo {
    pub t0: Instant,
    pub offset_ms: f64,
    pub file: Option<(crate::rundir::RunDir, &'static str)>,
}

/// How sampling ended: samples taken, and the first error writing them, if any.
#[derive(Debug, Default, PartialEq)]
pub struct Finished {
    pub taken: usize,
    pub error: Option<String>,
}

impl Sampler {
    /// Starts sampling every `interval` (zero: no sampling).
    pub fn start(source: UtilSource, interval: Duration, to: SampleTo) -> Self {
        if interval.is_zero() {
            return Self::off("off");
        }
        let (status_tx, status_rx) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (Arc::clone(&shared), Arc::clone(&stop));
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || {
                // The reader is made on this thread: NVML handles stay where they were opened.
                let (reader, status) = match open(source) {
                    Ok(pair) => pair,
                    Err(why) => {
                        let _ = status_tx.send(format!("unavailable: {why}"));
                        return;
                    }
                };
                let _ = status_tx.send(status);
                run(reader, interval, to, s, st);
            })
            .expect("spawning the sampler thread");
        let status = status_rx
            .recv()
            .unwrap_or_else(|_| "unavailable: the sampler thread ended".into());
        Self {
            shared,
            stop,
            handle: Some(handle),
            status,
        }
    }

    fn off(status: &str) -> Self {
        Self {
            shared: Arc::default(),
            stop: Arc::new(AtomicBool::new(true)),
            handle: None,
            status: status.into(),
        }
    }

    /// The mean of the samples taken in `(from_ms, to_ms]`. When none fell inside (a step
    /// shorter than the interval): the first sample after it, which covers it, if it has
    /// been taken; else (the usual case when a step is written as it ends) the latest
    /// sample, which covers the interval just before.
    ///
    /// Steps are asked for in order, so `from_ms` never goes back: the samples at or
    /// before it (but the latest) are let go.
    pub fn window(&self, from_ms: f64, to_ms: f64) -> Option<Sample> {
        let mut shared = self.shared.lock().ok()?;
        let recent = &mut shared.recent;
        let behind = recent.partition_point(|s| s.t_ms <= from_ms);
        recent.drain(..behind.min(recent.len().saturating_sub(1)));
        let first = recent.partition_point(|s| s.t_ms <= from_ms);
        let end = recent.partition_point(|s| s.t_ms <= to_ms);
        if first < end {
            let inside: Vec<&Sample> = recent.range(first..end).collect();
            return Sample::mean(&inside);
        }
        recent.get(end).or_else(|| recent.back()).cloned()
    }

    /// Stops the thread (the samples are in their file as they were taken).
    pub fn finish(mut self) -> Finished {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        Finished {
            taken: shared.taken,
            error: shared.error.take(),
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
    }
}

fn run(
    mut reader: Reader,
    interval: Duration,
    to: SampleTo,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
) {
    // Opened at the first sample: a run shorter than one interval has no file.
    let mut file: Option<JsonLines> = None;
    let mut failed = false;
    let mut next = Instant::now() + interval;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            // Asleep until the next sample is due; `finish` unparks it. (It once napped
            // 20 ms at a time, waking 50 times a second beside a training that keeps
            // every core busy.)
            std::thread::park_timeout(next - now);
            continue;
        }
        next += interval;
        let Ok(mut s) = reader() else { continue };
        s.t_ms = to.offset_ms + to.t0.elapsed().as_secs_f64() * 1e3;
        // For the steps first: a step that ends now asks for it.
        if let Ok(mut shared) = shared.lock() {
            shared.recent.push_back(s.clone());
            shared.taken += 1;
        }
        // Written as taken (they were kept for the run's end, and a run killed outright
        // lost them all); the first error ends the writing, and `finish` says it.
        if let (Some((dir, name)), false) = (&to.file, failed) {
            let written = match &mut file {
                Some(f) => f
                    .write(&s)
                    .map_err(|e| format!("{}: {e}", f.path().display())),
                None => dir.now().and_then(|d| {
                    let path = d.join(name);
                    JsonLines::append(&path)
                        .and_then(|mut f| {
                            f.write(&s)?;
                            file = Some(f);
                            Ok(())
                        })
                        .map_err(|e| format!("{}: {e}", path.display()))
                }),
            };
            if let Err(e) = written {
                failed = true;
                if let Ok(mut shared) = shared.lock() {
                    shared.error = Some(e);
                }
            }
        }
    }
}

fn open(source: UtilSource) -> Result<(Reader, String), String> {
    match source {
        UtilSource::Proc => {
            let mut last = process_cpu_seconds().ok_or("the process's CPU clock cannot be read")?;
            let mut last_t = Instant::now();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let reader: Reader = Box::new(move || {
                let cpu = process_cpu_seconds().ok_or("the process's CPU clock cannot be read")?;
                let now = Instant::now();
                let wall = (now - last_t).as_secs_f64();
                let pct = if wall > 0.0 {
                    100.0 * (cpu - last) / (wall * cores)
                } else {
                    0.0
                };
                (last, last_t) = (cpu, now);
                Ok(Sample {
                    cpu_util_pct: Some(pct.clamp(0.0, 100.0)),
                    ..Default::default()
                })
            });
            Ok((reader, "cpu_clock".into()))
        }
        UtilSource::Nvml(index) => nvml::open(index),
    }
}

/// User plus system CPU time of all this process's threads, in seconds, to the
/// nanosecond (`CLOCK_PROCESS_CPUTIME_ID`). `/proc/self/stat` counts 10 ms clock ticks, so
/// a 5 ms sample read 0% or 100% of a core while training flat out.
fn process_cpu_seconds() -> Option<f64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through a pointer to a local one.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0;
    ok.then_some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

mod nvml {
    use super::{Reader, Sample};
    use nvml_wrapper::enum_wrappers::device::Clock;
    use nvml_wrapper::Nvml;

    pub fn open(index: u32) -> Result<(Reader, String), String> {
        // Drivers install libnvidia-ml.so.1; the unversioned name comes only with dev packages.
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| Nvml::init())
            .map_err(|e| format!("NVML cannot be loaded ({e})"))?;
        let name = nvml
            .device_by_index(index)
            .and_then(|d| d.name())
            .map_err(|e| format!("NVML has no device {index} ({e})"))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
        let reader: Reader = Box::new(move || {
            let util = device.utilization_rates().map_err(|e| e.to_string())?;
            Ok(Sample {
                gpu_util_pct: Some(util.gpu as f64),
                gpu_mem_used_bytes: device.memory_info().ok().map(|m| m.used),
                sm_clock_mhz: device.clock_info(Clock::SM).ok().map(f64::from),
                power_w: device.power_usage().ok().map(|mw| mw as f64 / 1e3),
                ..Default::default()
            })
        });
        Ok((reader, format!("nvml: {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn at(t0: Instant, file: Option<PathBuf>) -> SampleTo {
        SampleTo {
            t0,
            offset_ms: 0.0,
            file: file.map(in_dir),
        }
    }

    fn in_dir(file: PathBuf) -> (crate::rundir::RunDir, &'static str) {
        let dir = crate::rundir::RunDir::open(file.parent().unwrap()).unwrap();
        assert_eq!(file.file_name().unwrap(), "samples.jsonl");
        (dir, "samples.jsonl")
    }

    #[test]
    fn without_nvml_the_sampler_says_unavailable() {
        // CI machines have no NVIDIA driver; on a GPU machine index 9999 does not exist.
        let dir = crate::scratch::Scratch::new("sampler-nvml");
        let file = dir.join("samples.jsonl");
        let s = Sampler::start(
            UtilSource::Nvml(9999),
            Duration::from_millis(10),
            at(Instant::now(), Some(file.clone())),
        );
        assert!(s.status.starts_with("unavailable: NVML"), "{}", s.status);
        assert!(s.window(0.0, 1e9).is_none());
        assert_eq!(s.finish(), Finished::default());
        assert!(!file.exists(), "no sample, no file");
    }

    #[test]
    fn proc_sampler_sees_a_busy_thread_and_writes_each_sample_as_taken() {
        let dir = crate::scratch::Scratch::new("sampler-proc");
        let file = dir.join("samples.jsonl");
        let t0 = Instant::now();
        let s = Sampler::start(
            UtilSource::Proc,
            Duration::from_millis(20),
            SampleTo {
                t0,
                offset_ms: 5000.0,
                file: Some(in_dir(file.clone())),
            },
        );
        assert_eq!(s.status, "cpu_clock");
        let until = Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        // Before the sampler stops: the file holds what it has taken.
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert!(lines >= 5, "{lines} samples written in 300 ms at 20 ms");
        let w = s
            .window(5000.0, 5000.0 + t0.elapsed().as_secs_f64() * 1e3)
            .expect("samples");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // One busy thread is 100/cores percent of the machine; allow for tick granularity.
        let util = w.cpu_util_pct.unwrap();
        assert!(util > 40.0 / cores && util <= 100.0, "cpu util {util}");
        let done = s.finish();
        assert_eq!(done.error, None);
        let all: Vec<Sample> =
            JsonLines::records(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(all.len(), done.taken);
        assert!(all.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert!(all[0].t_ms > 5000.0, "on the run's clock: {}", all[0].t_ms);
    }

    #[test]
    fn a_sample_file_that_cannot_be_written_is_said_at_the_end() {
        let dir = crate::scratch::Scratch::new("sampler-unwritable");
        let file = dir.join("samples.jsonl");
        std::fs::create_dir(&file).unwrap();
        let s = Sampler::start(
            UtilSource::Proc,
            Duration::from_millis(5),
            at(Instant::now(), Some(file.clone())),
        );
        std::thread::sleep(Duration::from_millis(60));
        let done = s.finish();
        assert!(done.taken > 0);
        let error = done.error.expect("the write error");
        assert!(error.starts_with(&file.display().to_string()), "{error}");
    }

    fn with(samples: &[f64]) -> Sampler {
        let s = Sampler::off("test");
        s.shared
            .lock()
            .unwrap()
            .recent
            .extend(samples.iter().map(|&t| Sample {
                t_ms: t,
                cpu_util_pct: Some(t),
                ..Default::default()
            }));
        s
    }

    #[test]
    fn window_means_and_falls_back_to_the_next_or_latest_sample() {
        let s = with(&[10.0, 20.0, 30.0]);
        assert_eq!(s.window(5.0, 20.0).unwrap().cpu_util_pct, Some(15.0));
        assert_eq!(
            s.window(21.0, 25.0).unwrap().t_ms,
            30.0,
            "short step: the next sample"
        );
        assert_eq!(
            s.window(31.0, 40.0).unwrap().t_ms,
            30.0,
            "short step, next sample not taken yet: the latest"
        );
        assert!(Sampler::off("empty").window(0.0, 1.0).is_none());
    }

    #[test]
    fn samples_behind_the_steps_are_let_go_and_the_answers_stay_the_same() {
        let times: Vec<f64> = (1..=100).map(|i| i as f64 * 10.0).collect();
        let s = with(&times);
        // Steps of 25 ms from 0 on, asked for in order: the mean of what each covered.
        for k in 0..40 {
            let (from, to) = (k as f64 * 25.0, (k + 1) as f64 * 25.0);
            let inside: Vec<f64> = times
                .iter()
                .copied()
                .filter(|&t| t > from && t <= to)
                .collect();
            let want = inside.iter().sum::<f64>() / inside.len() as f64;
            assert_eq!(s.window(from, to).unwrap().cpu_util_pct, Some(want), "{k}");
        }
        let kept = s.shared.lock().unwrap().recent.len();
        assert_eq!(kept, 100 - 97, "up to the last step's start (975 ms)");
        // Past the last sample: the latest, still.
        assert_eq!(s.window(5000.0, 5010.0).unwrap().t_ms, 1000.0);
        assert_eq!(s.shared.lock().unwrap().recent.len(), 1);
    }
}
