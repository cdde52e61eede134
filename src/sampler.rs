//! The utilisation sampler: a thread that reads, at a fixed interval, GPU utilisation,
//! memory, SM clock and power from NVML (libnvidia-ml, loaded at run time) or, on the CPU
//! backend, this process's CPU utilisation from /proc. Samples are kept with their time so
//! each step can be given the mean of the samples taken while it ran. Where NVML cannot be
//! loaded the sampler says "unavailable: <why>" and the run goes on. No Burn here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    /// `nvml: <device>`, `proc`, `off` or `unavailable: <why>`.
    pub status: String,
}

impl Sampler {
    /// Starts sampling every `interval` (zero: no sampling), times relative to `t0`.
    pub fn start(source: UtilSource, interval: Duration, t0: Instant) -> Self {
        if interval.is_zero() {
            return Self::off("off");
        }
        let (status_tx, status_rx) = mpsc::channel();
        let samples = Arc::new(Mutex::new(vec![]));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (Arc::clone(&samples), Arc::clone(&stop));
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
                run(reader, interval, t0, s, st);
            })
            .expect("spawning the sampler thread");
        let status = status_rx
            .recv()
            .unwrap_or_else(|_| "unavailable: the sampler thread ended".into());
        Self {
            samples,
            stop,
            handle: Some(handle),
            status,
        }
    }

    fn off(status: &str) -> Self {
        Self {
            samples: Arc::new(Mutex::new(vec![])),
            stop: Arc::new(AtomicBool::new(true)),
            handle: None,
            status: status.into(),
        }
    }

    /// The mean of the samples taken in `(from_ms, to_ms]`. When none fell inside (a step
    /// shorter than the interval): the first sample after it, which covers it, if it has
    /// been taken; else (the usual case when a step is written as it ends) the latest
    /// sample, which covers the interval just before.
    pub fn window(&self, from_ms: f64, to_ms: f64) -> Option<Sample> {
        let all = self.samples.lock().ok()?;
        let inside: Vec<&Sample> = all
            .iter()
            .filter(|s| s.t_ms > from_ms && s.t_ms <= to_ms)
            .collect();
        if !inside.is_empty() {
            return Sample::mean(&inside);
        }
        all.iter()
            .find(|s| s.t_ms > to_ms)
            .or_else(|| all.last())
            .cloned()
    }

    /// Stops the thread and returns every sample.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
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
    t0: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
) {
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
        if let Ok(mut s) = reader() {
            s.t_ms = t0.elapsed().as_secs_f64() * 1e3;
            if let Ok(mut v) = samples.lock() {
                v.push(s);
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

    #[test]
    fn without_nvml_the_sampler_says_unavailable() {
        // CI machines have no NVIDIA driver; on a GPU machine index 9999 does not exist.
        let s = Sampler::start(
            UtilSource::Nvml(9999),
            Duration::from_millis(10),
            Instant::now(),
        );
        assert!(s.status.starts_with("unavailable: NVML"), "{}", s.status);
        assert!(s.window(0.0, 1e9).is_none());
        assert!(s.finish().is_empty());
    }

    #[test]
    fn proc_sampler_sees_a_busy_thread() {
        let t0 = Instant::now();
        let s = Sampler::start(UtilSource::Proc, Duration::from_millis(20), t0);
        assert_eq!(s.status, "cpu_clock");
        let until = Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let w = s
            .window(0.0, t0.elapsed().as_secs_f64() * 1e3)
            .expect("samples");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // One busy thread is 100/cores percent of the machine; allow for tick granularity.
        let util = w.cpu_util_pct.unwrap();
        assert!(util > 40.0 / cores && util <= 100.0, "cpu util {util}");
        let all = s.finish();
        assert!(all.len() >= 5, "{} samples in 300 ms at 20 ms", all.len());
        assert!(all.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
    }

    #[test]
    fn window_means_and_falls_back_to_the_next_or_latest_sample() {
        let s = Sampler::off("test");
        s.samples
            .lock()
            .unwrap()
            .extend([10.0, 20.0, 30.0].map(|t| Sample {
                t_ms: t,
                cpu_util_pct: Some(t),
                ..Default::default()
            }));
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
}
