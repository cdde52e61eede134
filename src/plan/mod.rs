//! Validation: turns a type-checked `Recipe` into a `Plan` the training loop can trust.
//! Owns every rule that spans keys, the defaults that depend on other keys or on the data,
//! and the cheap file checks (dataset files exist and hold whole records). It reports
//! every violation at once and touches no device: the backend probe's answer comes in as
//! plain data. It does not read the dataset's samples (`data` does).

mod data;
mod device;
mod model;
mod optim;
mod resolve;
pub mod resources;
mod run;

pub use crate::data::spec::{DataPlan, DataSource, ImagePlan, Normalize, TextPlan, TextSeen};

use std::path::{Path, PathBuf};

use crate::data::cifar;
use crate::policy::CleanupPolicy;
use crate::recipe::{
    Arch, AutotuneLevel, BackendKind, CleanupAction, ConvAlgo, ConvKernel, ConvSplit, ConvTile,
    DataFormat, Diagnostic, Diagnostics, EvalWhen, Every, Fusion, Loaded, MatmulAlgo, NormSums,
    OptimizerKind, Recipe, Schedule, Stem,
};

/// Most CPU threads a recipe may ask for (rayon cannot start many more).
pub const MAX_THREADS: usize = 1024;
/// Most finished batches a loader worker may hold ahead: more only waits in memory.
pub const MAX_PREFETCH: usize = 1024;
/// Longest padded row a text recipe may ask for.
pub const MAX_TOKENS: usize = 65_536;
/// The words of the warning that a test or validation file is a training file's bytes
/// (`runner eval` leaves it out where the test file stands in for training data gone).
pub const SAME_AS_TRAINING: &str = "holds the same bytes as the training file";

/// What the machine offers, found before validation (see `backend::probe`).
#[derive(Debug, Clone)]
pub struct Machine {
    /// The binary was built with `--features cuda`.
    pub cuda_compiled: bool,
    /// CUDA devices found, or why none could be looked for.
    pub cuda_devices: Result<usize, String>,
    /// The host memory this process may use; `None`: not checked (`runner validate`
    /// checks recipes against the format, not a machine).
    pub host_memory: Option<HostMemory>,
    /// Total memory of each CUDA device, bytes, where known.
    pub gpu_memory: Vec<u64>,
    /// The binary was built with `--features wgpu`.
    pub wgpu_compiled: bool,
    /// Lists the WebGPU adapters, in `backend.device` order; called only for a recipe that
    /// asks for WebGPU (starting Vulkan costs time and can print driver warnings). `None`:
    /// not looked for (a binary without `wgpu`, or `runner validate`, which checks
    /// against no machine).
    pub wgpu_adapters: Option<fn() -> Vec<WgpuAdapter>>,
    /// What CUDA kernels are compiled with here (`backend::cuda_toolchain`); `None`: not
    /// looked for (no CUDA device, a binary without it, or `runner validate`).
    pub cuda_toolchain: Option<CudaToolchain>,
    /// The CPUs this process may use (`available_parallelism`: its affinity and cgroup
    /// quota); `None`: not looked at (`runner validate`). Decides `backend.fusion = "auto"`.
    pub cpus: Option<usize>,
}

/// What CubeCL needs on a CUDA machine besides the driver and a device: NVRTC, which
/// compiles its kernels at run time (a kernel the cache does not hold), and a CUDA
/// toolkit's headers, which it passes to NVRTC. Missing either, CubeCL 0.10 panics at the
/// run's first kernel, after the data is loaded and the run directory made; with NVRTC
/// newer than the driver, the driver refuses to load what NVRTC wrote (PTX is compiled by
/// the driver at load time, and a driver loads no PTX newer than its own CUDA version).
#[derive(Debug, Clone, PartialEq)]
pub struct CudaToolchain {
    /// The CUDA version the driver supports (`cuDriverGetVersion`), as (major, minor).
    pub driver: Option<(u32, u32)>,
    /// The NVRTC library loaded (its file name, as found on the library path) and its
    /// CUDA version, or why none could be.
    pub nvrtc: Result<(String, (u32, u32)), String>,
    /// The toolkit directory CubeCL takes its headers from (`$CUDA_PATH`, else
    /// `/usr/local/cuda`, `/opt/cuda`, or `/usr` where `/usr/bin/nvcc` is), or `None`.
    pub toolkit: Option<std::path::PathBuf>,
}

impl CudaToolchain {
    /// Why CUDA kernels cannot be compiled and loaded here, and how to make them (the
    /// caller adds its own alternatives); `None` when nothing is missing.
    pub fn problem(&self) -> Option<(String, String)> {
        let v = |(a, b): (u32, u32)| format!("{a}.{b}");
        match (&self.nvrtc, &self.toolkit, self.driver) {
            (Err(why), _, _) => Some((
                format!("NVRTC, which compiles the GPU kernels at run time, cannot be loaded ({why})"),
                "install the CUDA toolkit (its NVRTC, libnvrtc.so) and put its lib64/ on LD_LIBRARY_PATH".into(),
            )),
            (_, None, _) => Some((
                "no CUDA toolkit found: CubeCL gives NVRTC the toolkit's include/ and looks for it in $CUDA_PATH, /usr/local/cuda, /opt/cuda, or /usr (with /usr/bin/nvcc)".into(),
                "install the CUDA toolkit, or set CUDA_PATH to its directory".into(),
            )),
            (Ok((lib, n)), Some(_), Some(d)) if *n > d => Some((
                format!(
                    "NVRTC ({lib}) is CUDA {}'s, newer than the CUDA {} the NVIDIA driver supports: the driver cannot load the kernels it compiles",
                    v(*n),
                    v(d)
                ),
                format!(
                    "update the NVIDIA driver, or put a CUDA toolkit of version {} or older first on LD_LIBRARY_PATH (and CUDA_PATH)",
                    v(d)
                ),
            )),
            _ => None,
        }
    }

    /// One line for `runner ls` and the run's device reason: what was found.
    pub fn describe(&self) -> String {
        let v = |(a, b): (u32, u32)| format!("{a}.{b}");
        let driver = self.driver.map_or("driver version unknown".into(), |d| {
            format!("driver CUDA {}", v(d))
        });
        let nvrtc = match &self.nvrtc {
            Ok((lib, n)) => format!("NVRTC {} ({lib})", v(*n)),
            Err(_) => "no NVRTC".into(),
        };
        let toolkit = self
            .toolkit
            .as_ref()
            .map_or("no toolkit".into(), |t| format!("toolkit {}", t.display()));
        format!("{driver}, {nvrtc}, {toolkit}")
    }
}

/// The most host memory a run may count on, and what sets it (`resources::host_memory`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostMemory {
    pub bytes: u64,
    /// In words, for the error: "this machine's memory", "its cgroup's memory limit"...
    pub what: &'static str,
}

impl HostMemory {
    /// The machine's memory, where nothing less is set.
    pub fn machine(bytes: u64) -> Self {
        HostMemory {
            bytes,
            what: "this machine's memory",
        }
    }
}

/// A WebGPU adapter as the runner lists it: discrete GPUs first, then integrated, virtual,
/// software (CPU) and unknown ones, each kind in the driver's order.
#[derive(Debug, Clone, PartialEq)]
pub struct WgpuAdapter {
    /// The driver's name for it, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// How CubeCL selects it.
    pub target: WgpuTarget,
}

/// The kind of a WebGPU adapter, as wgpu reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    /// A software implementation (Mesa's lavapipe, SwiftShader): it computes on the CPU.
    Cpu,
    Other,
}

impl AdapterKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::DiscreteGpu => "discrete GPU",
            Self::IntegratedGpu => "integrated GPU",
            Self::VirtualGpu => "virtual GPU",
            Self::Cpu => "software, on the CPU",
            Self::Other => "unknown kind",
        }
    }
}

/// The adapter a WebGPU run uses: its `backend.device` index, and the `nth` adapter of its
/// `kind` (what CubeCL's `WgpuDevice` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgpuTarget {
    pub index: usize,
    pub kind: AdapterKind,
    pub nth: usize,
}

impl Machine {
    pub fn cpu_only() -> Self {
        Self {
            host_memory: None,
            gpu_memory: vec![],
            cuda_compiled: false,
            cuda_devices: Err("this binary was built without the `cuda` feature".into()),
            wgpu_compiled: false,
            wgpu_adapters: None,
            cuda_toolchain: None,
            cpus: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    /// Burn's WebGPU backend (`--features wgpu`), on this adapter.
    Wgpu(WgpuTarget),
}

impl Device {
    /// What the first step's wait is spent on, for the start-up display: the CPU compiles
    /// nothing at run time; CubeCL compiles and tunes, on a GPU or, on a software adapter,
    /// on this machine's CPU.
    pub fn first_step_work(self) -> &'static str {
        match self {
            Device::Cpu => "first step",
            Device::Wgpu(WgpuTarget {
                kind: AdapterKind::Cpu,
                ..
            }) => "first step (compiling and tuning kernels for the software adapter)",
            Device::Cuda(_) | Device::Wgpu(_) => {
                "first step (compiling and tuning kernels for the GPU)"
            }
        }
    }
}

/// A recipe that passed every check, with every default resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub seed: u64,
    pub recipe_path: PathBuf,
    /// The recipe with every default filled in and paths made absolute: runs on its own.
    pub resolved: Recipe,
    pub device: Device,
    /// Why this device (for `auto`, what was found).
    pub device_reason: String,
    pub threads: usize,
    /// CUDA kernel compilation and autotuning (ignored on the CPU).
    pub kernels: KernelPlan,
    pub model: ModelPlan,
    pub data: DataPlan,
    pub loader: LoaderPlan,
    pub optim: OptimPlan,
    pub cleanup: CleanupPolicy,
    pub run: RunPlan,
    pub log: LogPlan,
    pub profile: ProfilePlan,
    pub checkpoint: CheckpointPlan,
    /// The recipe files that made this plan (the recipe, then each file it extends).
    pub sources: Vec<PathBuf>,
    /// `--set` overrides, as given.
    pub overrides: Vec<String>,
    /// Warnings found on the way (shown before the run, kept in the run directory).
    pub warnings: Vec<Diagnostic>,
}

/// How CUDA kernels are compiled, tuned and cached (`[backend]`).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelPlan {
    pub autotune: AutotuneLevel,
    /// `backend.fusion`, decided (`"auto"` by the CPUs this process may use).
    pub fusion: bool,
    /// Why `fusion` is what it is: `backend.fusion = true`, or `auto: ...`.
    pub fusion_reason: String,
    pub conv: ConvAlgo,
    pub conv_kernel: ConvKernel,
    pub conv_tile: ConvTile,
    pub conv_split: ConvSplit,
    pub norm_sums: NormSums,
    pub matmul: MatmulAlgo,
    /// `backend.cache_dir`, absolute; `None`: the per-user default (see `kernels::cache_dir`).
    pub cache_dir: Option<PathBuf>,
}

impl KernelPlan {
    /// `backend.conv` as the run records it: `autotune`, `implicit_gemm` (with Burn's own
    /// kernel), or `implicit_gemm <kernel>_<tile>` for another `conv_kernel`/`conv_tile`;
    /// `, conv_split off` after an implicit GEMM that takes every weight gradient.
    pub fn conv_name(&self) -> String {
        let name = match (self.conv, self.conv_kernel, self.conv_tile) {
            (ConvAlgo::ImplicitGemm, ConvKernel::SimpleSyncCyclic, ConvTile::Cmma)
            | (ConvAlgo::Autotune, _, _) => self.conv.name().into(),
            (c, k, t) => format!("{} {}_{}", c.name(), k.name(), t.name()),
        };
        match (self.conv, self.conv_split) {
            (ConvAlgo::ImplicitGemm, ConvSplit::Off) => format!("{name}, conv_split off"),
            _ => name,
        }
    }
}

impl Plan {
    /// What CubeCL takes once per process, when its first device starts (the autotune level
    /// and the cache directory); `None` on the CPU backend, which has no CubeCL. Plans of
    /// one process that differ in it run with the first one's (see `kernels`).
    pub fn cubecl_once(&self) -> Option<(AutotuneLevel, Option<&Path>)> {
        (!matches!(self.device, Device::Cpu))
            .then_some((self.kernels.autotune, self.kernels.cache_dir.as_deref()))
    }
}

/// The network: its class count and its architecture with the knobs that architecture
/// has (and no others). Serialised, it is the resolved recipe's `[model]` table: `arch`
/// from the variant, then its knobs (see `plan/resolve.rs`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelPlan {
    pub num_classes: usize,
    #[serde(flatten)]
    pub net: NetPlan,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "arch", rename_all = "snake_case")]
pub enum NetPlan {
    Resnet18 {
        stem: Stem,
    },
    Resnet34 {
        stem: Stem,
    },
    Resnet50 {
        stem: Stem,
    },
    SmallCnn {
        width: usize,
    },
    Mlp {
        hidden: Vec<usize>,
    },
    Bag {
        embed_dim: usize,
        hidden: Vec<usize>,
    },
    Lstm {
        embed_dim: usize,
        hidden_size: usize,
        layers: usize,
    },
    Transformer(TransformerPlan),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TransformerPlan {
    pub embed_dim: usize,
    pub heads: usize,
    pub layers: usize,
    pub ff_dim: usize,
    pub dropout: f64,
}

impl ModelPlan {
    /// The recipe's name for the architecture.
    pub fn arch(&self) -> Arch {
        match &self.net {
            NetPlan::Resnet18 { .. } => Arch::Resnet18,
            NetPlan::Resnet34 { .. } => Arch::Resnet34,
            NetPlan::Resnet50 { .. } => Arch::Resnet50,
            NetPlan::SmallCnn { .. } => Arch::SmallCnn,
            NetPlan::Mlp { .. } => Arch::Mlp,
            NetPlan::Bag { .. } => Arch::Bag,
            NetPlan::Lstm { .. } => Arch::Lstm,
            NetPlan::Transformer(_) => Arch::Transformer,
        }
    }
}

/// The loader needs nothing resolved: once validated, the recipe's `[loader]` is the plan.
pub type LoaderPlan = crate::recipe::LoaderSection;

#[derive(Debug, Clone, PartialEq)]
pub struct OptimPlan {
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub betas: [f64; 2],
    pub eps: f64,
    pub accumulation_steps: usize,
    pub schedule: crate::schedule::LrSchedule,
    /// Global gradient-norm bound, as `clip_grad_norm_`.
    pub clip_grad_norm: Option<f64>,
    pub label_smoothing: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub epochs: usize,
    /// Optimizer steps the run will take (epochs × steps per epoch, capped by `max_steps`).
    pub total_steps: u64,
    pub steps_per_epoch: u64,
    pub micro_batches_per_epoch: u64,
    pub warmup_steps: u64,
    pub eval: EvalWhen,
    /// Losses above this, or not finite, are a divergence.
    pub max_loss: f64,
    pub stop_on_divergence: bool,
    /// When the validation set is evaluated (with `data.validation`).
    pub validate: Every,
    /// What counts as the best model, and when to stop (with `data.validation`).
    pub watch: Option<Watch>,
}

impl RunPlan {
    /// The epochs the run reaches: `epochs`, or fewer where `max_steps` ends it sooner (at
    /// least one; the last may be cut short).
    pub fn epochs_reached(&self) -> usize {
        let reached = self.total_steps.div_ceil(self.steps_per_epoch.max(1)) as usize;
        self.epochs.min(reached).max(1)
    }
}

/// The validation metric a run watches: the best model is kept (`model-best.safetensors`)
/// and, with `patience`, the run stops when it no longer improves.
#[derive(Debug, Clone, PartialEq)]
pub struct Watch {
    pub metric: crate::recipe::EarlyStopMetric,
    pub maximize: bool,
    pub min_delta: f64,
    /// `None`: keep the best, never stop early.
    pub patience: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProfilePlan {
    /// 1-based optimizer steps timed with a device sync after each phase.
    pub window: Option<std::ops::RangeInclusive<u64>>,
    pub sample_ms: u64,
    /// Read the pool's memory figures after every step.
    pub memory: bool,
}

/// When a run writes checkpoints, how many it keeps, and whether it saves its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointPlan {
    pub every: Every,
    pub keep: usize,
    pub save_final: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LogPlan {
    pub dir: PathBuf,
    pub every: u64,
    pub progress: bool,
    pub csv: bool,
    pub tensorboard: bool,
}

/// Checks a loaded recipe against every rule; all violations come back together.
pub fn validate(loaded: &Loaded, machine: &Machine) -> Result<Plan, Diagnostics> {
    let mut v = Validator {
        l: loaded,
        report: loaded.findings.clone(),
    };
    let plan = v.run(machine);
    if plan.is_none() && !v.report.has_errors() {
        // Every check that gives up says why; one that did not must not pass as valid.
        v.report.push(
            Diagnostic::error(
                &loaded.path,
                "the recipe could not be checked, and no check said why",
            )
            .help("this is a bug in runner: please report it with the recipe"),
        );
    }
    match plan {
        Some(p) if !v.report.has_errors() => Ok(Plan {
            warnings: v.report.0,
            ..p
        }),
        _ => Err(v.report.sorted()),
    }
}

struct Validator<'a> {
    l: &'a Loaded,
    report: Diagnostics,
}

impl<'a> Validator<'a> {
    /// The recipe, borrowed for `'a` rather than from `self`, so checks can report.
    fn recipe(&self) -> &'a Recipe {
        &self.l.recipe
    }

    fn err(&mut self, key: &str, msg: impl Into<String>, help: impl Into<String>) {
        if self.l.was_dropped(key) {
            return;
        }
        let d = self.l.error(key, msg).help(help);
        self.report.push(d);
    }

    /// The path a path-valued key names ([`Loaded::path_of`]); `None` after an error.
    fn path_of(&mut self, key: &str, value: &str) -> Option<PathBuf> {
        match self.l.path_of(key, value) {
            // The run's recipe.toml names it by its absolute path, in TOML: UTF-8 only. A
            // folder name that is not UTF-8 was written with U+FFFD in place of its bytes,
            // and the run could not be resumed, evaluated or run again from it.
            Ok(p) if absolute(&p).to_str().is_none() => {
                self.err(
                    key,
                    format!(
                        "{} is not valid UTF-8 (a byte of a folder or file name on the way): the run's recipe.toml, which names it by its absolute path, could not, and the run could not be resumed or run again",
                        absolute(&p).display()
                    ),
                    "rename the folder (or file) to a UTF-8 name, or copy the data to a folder that has one",
                );
                None
            }
            Ok(p) => Some(p),
            Err(e) => {
                self.err(
                    key,
                    e,
                    "e.g. \"~/data/train.jsonl\" or \"/home/me/data/train.jsonl\"",
                );
                None
            }
        }
    }

    fn warn(&mut self, key: &str, msg: impl Into<String>, help: impl Into<String>) {
        let d = self.l.warning(key, msg).help(help);
        self.report.push(d);
    }

    /// A data file the key names cannot be used.
    fn data_err(&mut self, key: &str, e: &crate::data::DataError) {
        let path = crate::recipe::lexical(&e.path);
        self.err(
            key,
            format!("{} {}", path.display(), e.message),
            e.help_text().to_string(),
        );
    }

    /// `key` is set in the file although it has no effect for `why`. In a grid cell, where
    /// a swept key decides it (the base recipe's `padding.buckets` in the cells of a sweep
    /// over `padding.strategy`), it is a warning: the other cells use it. Sweeping the
    /// key itself where it has no effect stays an error.
    fn only_for(&mut self, key: &str, why: &str) {
        if !self.l.is_set(key) {
            return;
        }
        let swept = self.l.sweep.as_ref().map(crate::sweep::swept_keys);
        // Swept itself, or a key under it (`"data.tokenizer.kind" = [...]` on images).
        let under = format!("{key}.");
        if swept
            .as_ref()
            .is_some_and(|axes| !axes.iter().any(|a| a == key || a.starts_with(&under)))
        {
            self.warn(
                key,
                format!("ignored in the cells it does not apply to (it only applies {why})"),
                "nothing to do if other cells use it",
            );
        } else if self.l.set_on_command_line(key) {
            // ('~KEY' would take back the user's own --set.)
            self.err(
                key,
                format!("only applies {why}"),
                "leave this --set out, or give it only with the recipes it applies to (a --set goes to every recipe of the command)",
            );
        } else if swept.is_some() {
            // Swept itself: `--set '~KEY'` takes nothing back (the recipe sets it only
            // through [sweep]), which the help offered.
            self.err(
                key,
                format!("only applies {why}"),
                "sweep it only in a grid whose every cell uses it: take it out of [sweep], or split the grid into recipes where it applies and where it does not",
            );
        } else {
            self.err(
                key,
                format!("only applies {why}"),
                format!("remove the key, or leave it out of this run with --set '~{key}'"),
            );
        }
    }

    fn run(&mut self, machine: &Machine) -> Option<Plan> {
        let r = self.recipe();
        let name = self.name();
        let (device, device_reason) = self.device(machine);
        let threads = r.backend.threads;
        if threads > MAX_THREADS {
            self.err(
                "backend.threads",
                format!("{threads} threads, over the cap of {MAX_THREADS}"),
                "use 0 for one per core",
            );
        }
        // 0 takes rayon's count, which `RAYON_NUM_THREADS` sets: past the cap it passed
        // unchecked (100000 spun for minutes making threads, then aborted).
        let from_env = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        if let Some(n) = from_env.filter(|&n| threads == 0 && n > MAX_THREADS) {
            self.err(
                "backend.threads",
                format!("0 takes RAYON_NUM_THREADS from the environment: {n} threads, over the cap of {MAX_THREADS}"),
                format!("unset RAYON_NUM_THREADS (0 is then one thread per core), set it to {MAX_THREADS} or fewer, or set backend.threads"),
            );
        }
        let kernels = self.kernels(device, machine);
        let data = self.data(machine);
        let model = self.model(data.as_ref());
        let loader = self.loader(device);
        let optim = self.optim();
        let cleanup = self.cleanup(device);
        let log = self.log();
        let run = self.run_section(data.as_ref(), &loader, optim.as_ref());
        let profile = self.profile(run.as_ref());
        let checkpoint = self.checkpoint();
        let (data, model, optim, run, log) = (data?, model?, optim?, run?, log?);
        self.unreached(&run, &cleanup, &checkpoint, &optim);
        // Only a plan that passed every other check is sized: a bad key's value would
        // make a meaningless (and doubled) finding.
        if !self.report.has_errors() {
            self.preflight(&model, &data, &loader, &optim, machine, (device, threads));
        }
        self.slurm();

        let resolved = self.resolve(&name, &model, &data, &optim, &run, &kernels);

        Some(Plan {
            name,
            seed: r.seed,
            recipe_path: self.l.path.clone(),
            resolved,
            device,
            device_reason,
            threads,
            kernels,
            model,
            data,
            loader,
            optim,
            cleanup,
            run,
            log,
            profile,
            checkpoint,
            sources: self.sources(|s| (s.name.as_os_str() != "--set").then(|| s.name.clone())),
            overrides: self.sources(|s| (s.name.as_os_str() == "--set").then(|| s.text.clone())),
            warnings: vec![],
        })
    }

    /// The run's name (default: the recipe file's stem), checked as a directory name.
    fn name(&mut self) -> String {
        let name = self.recipe().name.clone().unwrap_or_else(|| {
            self.l
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "recipe".into())
        });
        // Sweep cells are named `base/key=value,...`: one directory level per '/'.
        let bad_part = |p: &str| p.is_empty() || p == "." || p == ".." || p.starts_with('.');
        if name.contains(['\\', '\0'])
            || name.chars().any(char::is_control)
            || name.split('/').any(bad_part)
        {
            // A grid cell's name is `base/<cell>`: the user wrote the base, which every
            // cell would repeat (said once per cell, each with its own name).
            let written = match &self.l.sweep {
                Some(_) => name
                    .rsplit_once('/')
                    .map_or(name.as_str(), |(base, _)| base),
                None => name.as_str(),
            };
            self.err(
                "name",
                format!("{written:?} cannot name a run directory"),
                "any printable characters but '\\' will do, with '/' only between parts and no part empty or starting with '.'",
            );
        } else if name.split('/').any(|p| p.len() > 200) {
            self.err(
                "name",
                format!(
                    "a part of the name is {} bytes long, over the 200 a part may have (a directory's name must fit in 255 bytes, with room kept for the runner's suffixes)",
                    name.split('/').map(str::len).max().unwrap_or(0)
                ),
                "use a shorter name",
            );
        }
        name
    }

    /// The recipe's files in order (`--set` overrides are sources too), mapped by `f`.
    fn sources<T>(&self, f: impl Fn(&crate::recipe::SourceFile) -> Option<T>) -> Vec<T> {
        self.l.doc.sources.iter().filter_map(f).collect()
    }
}

/// `"20..30"` → steps 20 to 29; `"20..=30"` → 20 to 30. 1-based, non-empty.
pub fn parse_steps(text: &str) -> Option<std::ops::RangeInclusive<u64>> {
    let (a, b, inclusive) = match text.split_once("..=") {
        Some((a, b)) => (a, b, true),
        None => {
            let (a, b) = text.split_once("..")?;
            (a, b, false)
        }
    };
    let a: u64 = a.trim().parse().ok()?;
    let b: u64 = b.trim().parse().ok()?;
    let end = if inclusive { b } else { b.checked_sub(1)? };
    (a >= 1 && end >= a).then_some(a..=end)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Plan {
    /// The rows of a training batch: `loader.batch_size`, or the training set where that
    /// is smaller (its one batch holds it all). Evaluation batches take the same shape.
    pub fn batch_rows(&self) -> usize {
        resources::batch_rows(&self.loader, &self.data)
    }

    /// The learning-rate schedule with the run's length filled in.
    pub fn lr_schedule(&self) -> crate::schedule::LrSchedule {
        crate::schedule::LrSchedule {
            total_steps: self.run.total_steps,
            ..self.optim.schedule.clone()
        }
    }
}
