//! Validation: turns a type-checked `Recipe` into a `Plan` the training loop can trust.
//! Owns every rule that spans keys, the defaults that depend on other keys or on the data,
//! and the cheap file checks (dataset files exist and hold whole records). It reports
//! every violation at once and touches no device: the backend probe's answer comes in as
//! plain data. It does not read the dataset's samples (`data` does).

use std::path::{Path, PathBuf};

use crate::data::cifar;
use crate::policy::CleanupPolicy;
use crate::recipe::{
    Arch, AutotuneLevel, BackendKind, CleanupAction, DataFormat, Diagnostic, Eval, Every, Loaded,
    NormalizeOn, Optimizer, Recipe, Report, Schedule, Stem,
};

/// Most CPU threads a recipe may ask for (rayon cannot start many more).
pub const MAX_THREADS: usize = 1024;
/// Longest padded row a text recipe may ask for.
pub const MAX_TOKENS: usize = 65_536;

/// What the machine offers, found before validation (see `backend::probe`).
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The binary was built with `--features cuda`.
    pub cuda_compiled: bool,
    /// CUDA devices found, or why none could be looked for.
    pub cuda_devices: Result<usize, String>,
    /// Total host memory, bytes; `None`: not checked (`runner validate` checks recipes
    /// against the format, not a machine).
    pub host_memory: Option<u64>,
    /// Total memory of each CUDA device, bytes, where known.
    pub gpu_memory: Vec<u64>,
}

impl Machine {
    pub fn cpu_only() -> Self {
        Self {
            host_memory: None,
            gpu_memory: vec![],
            cuda_compiled: false,
            cuda_devices: Err("this binary was built without the `cuda` feature".into()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
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
    pub fusion: bool,
    /// `backend.cache_dir`, absolute; `None`: the per-user default (see `kernels::cache_dir`).
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    pub arch: Arch,
    pub stem: Stem,
    pub num_classes: usize,
    pub width: usize,
    pub hidden: Vec<usize>,
    /// Text models.
    pub embed_dim: usize,
    pub hidden_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub ff_dim: usize,
    pub dropout: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// CIFAR-10 binary files, read in the order given.
    Cifar {
        train: Vec<PathBuf>,
        test: Vec<PathBuf>,
    },
    /// Text, one JSON object per line.
    Jsonl {
        train: PathBuf,
        test: Option<PathBuf>,
    },
    Synthetic {
        samples: usize,
        test_samples: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataPlan {
    pub source: Source,
    /// Image shape, channels × height × width.
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub classes: usize,
    /// Training samples used (after `limit`, without the validation samples).
    pub train_len: usize,
    pub test_len: usize,
    /// Samples held out of the training set for validation (`data.validation`); 0: none.
    pub validation_len: usize,
    /// Per-channel mean and std (one per channel) and where they are applied.
    pub normalize: Normalize,
    pub crop_padding: usize,
    pub hflip: bool,
    /// Text data: fields, tokenizer and padding.
    pub text: Option<TextPlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextPlan {
    pub text_field: String,
    pub label_field: String,
    pub tokenizer: crate::recipe::TokenizerSection,
    pub padding: crate::data::pad::Padding,
    /// `bucket`: the number of length buckets.
    pub buckets: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub on: NormalizeOn,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoaderPlan {
    pub batch_size: usize,
    pub workers: usize,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    pub prefetch: usize,
    pub shuffle: bool,
    pub drop_last: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OptimPlan {
    pub optimizer: Optimizer,
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
    pub eval: Eval,
    /// Losses above this, or not finite, are a divergence.
    pub max_loss: f64,
    pub stop_on_divergence: bool,
    /// When the validation set is evaluated (with `data.validation`).
    pub validate: Every,
    /// What counts as the best model, and when to stop (with `data.validation`).
    pub watch: Option<Watch>,
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
pub fn validate(loaded: &Loaded, machine: &Machine) -> Result<Plan, Report> {
    let mut v = Validator {
        l: loaded,
        report: loaded.findings.clone(),
    };
    let plan = v.run(machine);
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
    report: Report,
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

    /// `key` is set in the file although it has no effect for `why`.
    fn only_for(&mut self, key: &str, why: &str) {
        if self.l.is_set(key) {
            self.err(key, format!("only applies {why}"), "remove the key");
        }
    }

    fn run(&mut self, machine: &Machine) -> Option<Plan> {
        let r = self.recipe();
        let name = r.name.clone().unwrap_or_else(|| {
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
            self.err(
                "name",
                format!("{name:?} cannot name a run directory"),
                "use letters, digits, '-', '_', '=', ',' and '.', with '/' only between parts",
            );
        } else if name.split('/').any(|p| p.len() > 200) {
            self.err(
                "name",
                format!(
                    "a part of the name is {} bytes long; directory names must fit in 255",
                    name.split('/').map(str::len).max().unwrap_or(0)
                ),
                "use a shorter name",
            );
        }
        let (device, device_reason) = self.device(machine);
        let threads = r.backend.threads;
        if threads > MAX_THREADS {
            self.err(
                "backend.threads",
                format!("{threads} threads, over the cap of {MAX_THREADS}"),
                "use 0 for one per core",
            );
        }
        let kernels = self.kernels();
        let data = self.data();
        let model = self.model(data.as_ref());
        let loader = self.loader(device);
        let optim = self.optim();
        let cleanup = self.cleanup(device);
        let log = self.log();
        let run = self.run_section(data.as_ref(), &loader, optim.as_ref());
        let profile = self.profile(run.as_ref());
        let checkpoint = self.checkpoint();
        let (data, model, optim, run, log) = (data?, model?, optim?, run?, log?);
        // Only a plan that passed every other check is sized: a bad key's value would
        // make a meaningless (and doubled) finding.
        if !self.report.has_errors() {
            self.preflight(&model, &data, &loader, &optim, machine, device);
        }
        self.slurm();

        let mut resolved = r.clone();
        resolved.name = Some(name.clone());
        resolved.model.arch = Some(model.arch);
        resolved.model.num_classes = Some(model.num_classes);
        if model.arch.is_resnet() {
            resolved.model.stem = Some(model.stem);
        }
        let rm = &mut resolved.model;
        match model.arch {
            Arch::SmallCnn => rm.width = Some(model.width),
            Arch::Mlp => rm.hidden = Some(model.hidden.clone()),
            Arch::Bag => {
                rm.hidden = Some(model.hidden.clone());
                rm.embed_dim = Some(model.embed_dim);
            }
            Arch::Lstm => {
                rm.embed_dim = Some(model.embed_dim);
                rm.hidden_size = Some(model.hidden_size);
                rm.layers = Some(model.layers);
            }
            Arch::Transformer => {
                rm.embed_dim = Some(model.embed_dim);
                rm.layers = Some(model.layers);
                rm.heads = Some(model.heads);
                rm.ff_dim = Some(model.ff_dim);
                rm.dropout = Some(model.dropout);
            }
            _ => {}
        }
        if let Some(t) = &data.text {
            resolved.data.text_field = Some(t.text_field.clone());
            resolved.data.label_field = Some(t.label_field.clone());
            resolved.data.tokenizer = Some(t.tokenizer.clone());
            let p = resolved.padding.get_or_insert_with(Default::default);
            p.buckets = t.buckets;
        }
        // Every default that applies is written out; keys that do not apply stay out.
        let ro = &mut resolved.optim;
        ro.weight_decay = Some(optim.weight_decay);
        match optim.optimizer {
            Optimizer::Sgd => {
                ro.momentum = Some(optim.momentum);
                ro.nesterov = Some(optim.nesterov);
            }
            Optimizer::Adamw => {
                ro.betas = Some(optim.betas);
                ro.eps = Some(optim.eps);
            }
        }
        match optim.schedule.kind {
            Schedule::Cosine => ro.min_lr = Some(optim.schedule.min_lr),
            Schedule::Step => {
                ro.step_size = Some(optim.schedule.step_size);
                ro.gamma = Some(optim.schedule.gamma);
            }
            Schedule::Constant => {}
        }
        resolved.run.eval = run.eval;
        if let Some(dir) = &kernels.cache_dir {
            resolved.backend.cache_dir = Some(dir.display().to_string());
        }
        // Paths are relative to the file that wrote them (a parent recipe's stay its own).
        for (key, p) in [
            ("data.train", &mut resolved.data.train),
            ("data.test", &mut resolved.data.test),
        ] {
            if let Some(p) = p {
                *p = absolute(&self.l.dir_of(key).join(&*p))
                    .display()
                    .to_string();
            }
        }
        if resolved.data.format == Some(DataFormat::Synthetic) && resolved.data.synthetic.is_none()
        {
            resolved.data.synthetic = Some(Default::default());
        }

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
            sources: self
                .l
                .doc
                .sources
                .iter()
                .filter(|s| s.name.as_os_str() != "--set")
                .map(|s| s.name.clone())
                .collect(),
            overrides: self
                .l
                .doc
                .sources
                .iter()
                .filter(|s| s.name.as_os_str() == "--set")
                .map(|s| s.text.clone())
                .collect(),
            warnings: vec![],
        })
    }

    fn device(&mut self, m: &Machine) -> (Device, String) {
        let b = &self.recipe().backend;
        match b.kind {
            BackendKind::Cpu => (Device::Cpu, "backend.kind = \"cpu\"".into()),
            BackendKind::Auto => match (&m.cuda_devices, m.cuda_compiled) {
                (Ok(n), true) if b.device < *n => (
                    Device::Cuda(b.device),
                    format!("auto: CUDA device {} of {n} found", b.device),
                ),
                (Ok(n), true) if *n > 0 => {
                    self.err(
                        "backend.device",
                        format!("CUDA device {} does not exist: {n} found", b.device),
                        format!("use a device index below {n}"),
                    );
                    (Device::Cpu, String::new())
                }
                (Ok(_), _) => (
                    Device::Cpu,
                    "auto: no CUDA device found, using the CPU".into(),
                ),
                (Err(why), _) => (Device::Cpu, format!("auto: {why}; using the CPU")),
            },
            BackendKind::Cuda => {
                match (&m.cuda_devices, m.cuda_compiled) {
                    (_, false) => self.err(
                        "backend.kind",
                        "CUDA was asked for, but this binary was built without it",
                        "build with `cargo build --release --features cuda`, or set kind = \"auto\" or \"cpu\"",
                    ),
                    (Err(why), true) => self.err(
                        "backend.kind",
                        format!("CUDA was asked for, but no GPU can be used: {why}"),
                        "run on a machine with an NVIDIA driver, or set kind = \"auto\" or \"cpu\"",
                    ),
                    (Ok(n), true) if b.device >= *n => self.err(
                        "backend.device",
                        format!("CUDA device {} does not exist: {n} found", b.device),
                        if *n == 0 {
                            "run on a machine with a GPU, or set backend.kind = \"cpu\"".to_string()
                        } else {
                            format!("use a device index below {n}")
                        },
                    ),
                    _ => {}
                }
                (Device::Cuda(b.device), "backend.kind = \"cuda\"".into())
            }
        }
    }

    fn kernels(&mut self) -> KernelPlan {
        let b = self.recipe().backend.clone();
        let cache_dir = b.cache_dir.as_ref().and_then(|d| {
            if d.trim().is_empty() {
                self.err(
                    "backend.cache_dir",
                    "is empty",
                    "name a directory, or leave the key out for the per-user default",
                );
                return None;
            }
            let p = self.l.dir_of("backend.cache_dir").join(d);
            if p.exists() && !p.is_dir() {
                self.err(
                    "backend.cache_dir",
                    format!("{} exists and is not a directory", p.display()),
                    "name a directory (it is created if missing)",
                );
            }
            Some(crate::recipe::lexical(
                &std::path::absolute(&p).unwrap_or(p),
            ))
        });
        KernelPlan {
            autotune: b.autotune,
            fusion: b.fusion,
            cache_dir,
        }
    }

    /// Refuses a plan whose memory floor (`preflight`) exceeds the machine's memory (the
    /// GPU's on CUDA, the host's on the CPU), or `preflight::ABSOLUTE_CAP` anywhere. Blames
    /// the key behind the largest part.
    fn preflight(
        &mut self,
        model: &ModelPlan,
        data: &DataPlan,
        loader: &LoaderPlan,
        optim: &OptimPlan,
        machine: &Machine,
        device: Device,
    ) {
        use crate::preflight::{self, gib};
        let text_bytes = match &data.source {
            Source::Jsonl { train, test } => [Some(train), test.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum(),
            _ => 0,
        };
        let f = preflight::estimate(model, data, loader, optim, text_bytes);
        let cap = |limit: Option<u64>, what: &'static str| match limit {
            Some(l) if l > 0 => (l.min(preflight::ABSOLUTE_CAP), what),
            _ => (preflight::ABSOLUTE_CAP, "the cap of any machine"),
        };
        // The data stays in host memory on either backend; the model and activations are
        // where the backend computes.
        let (model_part, act_part, data_part) = (
            (f.model_bytes, "the model"),
            (f.activation_bytes, "one batch's activations"),
            (f.data_bytes, "the data"),
        );
        let host = cap(machine.host_memory, "this machine's memory");
        let checks = match device {
            Device::Cpu => vec![(f.host_bytes(), host, vec![model_part, act_part, data_part])],
            Device::Cuda(i) => vec![
                (f.data_bytes, host, vec![data_part]),
                (
                    f.device_bytes(),
                    cap(machine.gpu_memory.get(i).copied(), "the GPU's memory"),
                    vec![model_part, act_part],
                ),
            ],
        };
        let Some((need, (limit, what), parts)) = checks
            .into_iter()
            .find(|(need, (limit, _), _)| need > limit)
        else {
            return;
        };
        let (_, biggest) = parts
            .iter()
            .max_by_key(|(b, _)| *b)
            .copied()
            .unwrap_or_default();
        let (key, help) = match biggest {
            "one batch's activations" => (
                "loader.batch_size",
                "lower batch_size; optim.accumulation_steps keeps the effective batch",
            ),
            "the model" if model.num_classes > 10_000 => (
                "model.num_classes",
                "fewer classes (each is a row of the last layer)",
            ),
            "the model" => ("model.arch", "a smaller model"),
            _ if matches!(data.source, Source::Synthetic { .. }) => (
                "data.synthetic.samples",
                "fewer or smaller synthetic samples",
            ),
            _ => ("data.limit", "set data.limit to use part of the data"),
        };
        self.err(
            key,
            format!(
                "the run needs at least {} ({} parameters: {} with gradients and optimizer state; data {}; activations of one batch {}), more than {what} ({})",
                gib(need),
                f.parameters,
                gib(f.model_bytes),
                gib(f.data_bytes),
                gib(f.activation_bytes),
                gib(limit)
            ),
            help,
        );
    }

    /// `[slurm]` values go into `#SBATCH` lines of a shell script: a newline would start a
    /// shell command, so no control character is allowed, and `extra` must be options.
    fn slurm(&mut self) {
        let s = self.recipe().slurm.clone();
        let mut fields: Vec<(String, String)> = vec![("slurm.time".into(), s.time.clone())];
        for (key, v) in [
            ("slurm.partition", &s.partition),
            ("slurm.mem", &s.mem),
            ("slurm.account", &s.account),
        ] {
            if let Some(v) = v {
                fields.push((key.into(), v.clone()));
            }
        }
        for (i, e) in s.extra.iter().enumerate() {
            fields.push((format!("slurm.extra[{i}]"), e.clone()));
            if !e.starts_with('-') {
                self.err(
                    "slurm.extra",
                    format!("{e:?} is not an sbatch option"),
                    "write options as on sbatch's command line, e.g. \"--qos=high\"",
                );
            }
        }
        for (key, v) in fields {
            if v.chars().any(char::is_control) || v.trim().is_empty() {
                let shown: String = v.chars().take(40).collect();
                self.err(
                    key.split('[').next().unwrap_or(&key),
                    format!("{shown:?} is empty or holds a control character (a newline would become a shell command in the job script)"),
                    "write the value on one line",
                );
            }
        }
    }

    fn model(&mut self, data: Option<&DataPlan>) -> Option<ModelPlan> {
        let m = &self.recipe().model;
        let Some(arch) = m.arch else {
            self.err(
                "model.arch",
                "missing: every recipe names its model",
                "add `arch = \"small_cnn\"` (or resnet18, resnet34, resnet50, mlp; bag, lstm, transformer for text) under [model]",
            );
            return None;
        };
        let text_models = "to the text models bag, lstm and transformer";
        if !arch.is_text() {
            self.only_for("model.embed_dim", text_models);
        }
        if arch != Arch::Lstm {
            self.only_for("model.hidden_size", "to lstm");
        }
        if !matches!(arch, Arch::Lstm | Arch::Transformer) {
            self.only_for("model.layers", "to lstm and transformer");
        }
        if arch != Arch::Transformer {
            for k in ["model.heads", "model.ff_dim", "model.dropout"] {
                self.only_for(k, "to transformer");
            }
        }
        let embed_dim = m.embed_dim.unwrap_or(64);
        let heads = m.heads.unwrap_or(4);
        let layers = m
            .layers
            .unwrap_or(if arch == Arch::Transformer { 2 } else { 1 });
        let hidden_size = m.hidden_size.unwrap_or(128);
        let ff_dim = m.ff_dim.unwrap_or(4 * embed_dim);
        let dropout = m.dropout.unwrap_or(0.1);
        for (key, v, hi) in [
            ("model.embed_dim", embed_dim, 8192),
            ("model.hidden_size", hidden_size, 8192),
            ("model.layers", layers, 64),
            ("model.heads", heads, 256),
            ("model.ff_dim", ff_dim, 65536),
        ] {
            if !(1..=hi).contains(&v) {
                self.err(
                    key,
                    format!("{v} is out of range"),
                    format!("use 1 to {hi}"),
                );
            }
        }
        if arch == Arch::Transformer && heads > 0 && embed_dim % heads != 0 {
            self.err(
                "model.heads",
                format!("{heads} heads do not divide embed_dim = {embed_dim}"),
                "pick heads that divide the model width, e.g. 4 for 64",
            );
        }
        if !(0.0..1.0).contains(&dropout) {
            self.err(
                "model.dropout",
                format!("{dropout} is outside [0, 1)"),
                "0.1 is usual",
            );
        }
        if !arch.is_resnet() {
            self.only_for("model.stem", "to resnet18, resnet34 and resnet50");
        }
        if arch != Arch::SmallCnn {
            self.only_for("model.width", "to small_cnn");
        }
        if !matches!(arch, Arch::Mlp | Arch::Bag) {
            self.only_for("model.hidden", "to mlp and bag");
        }
        let width = m.width.unwrap_or(32);
        if !(1..=1024).contains(&width) {
            self.err(
                "model.width",
                format!("{width} is out of range"),
                "use 1 to 1024 channels",
            );
        }
        let hidden =
            m.hidden
                .clone()
                .unwrap_or_else(|| if arch == Arch::Bag { vec![] } else { vec![256] });
        if hidden.contains(&0) {
            self.err(
                "model.hidden",
                "a hidden layer of size 0",
                "every size must be at least 1",
            );
        }
        let data = data?;
        match (arch.is_text(), data.text.is_some()) {
            (true, false) => self.err(
                "model.arch",
                format!(
                    "{} reads token sequences, but the data are images",
                    arch.name()
                ),
                "use data.format = \"jsonl\", or an image model (small_cnn, resnet18, ...)",
            ),
            (false, true) => self.err(
                "model.arch",
                format!("{} reads images, but the data are text", arch.name()),
                "use bag, lstm or transformer for text",
            ),
            _ => {}
        }
        let num_classes = m.num_classes.unwrap_or(data.classes);
        if num_classes > crate::data::MAX_CLASSES {
            self.err(
                "model.num_classes",
                format!(
                    "{num_classes} classes, over the cap of {}",
                    crate::data::MAX_CLASSES
                ),
                "each class is a row of the last layer; remove the key to use the data's classes",
            );
        } else if num_classes < 2 {
            self.err(
                "model.num_classes",
                format!("{num_classes} class: too few"),
                "a classifier needs at least 2",
            );
        } else if num_classes < data.classes {
            self.err(
                "model.num_classes",
                format!(
                    "{num_classes} is fewer than the {} classes the data has",
                    data.classes
                ),
                format!("remove the key to use {}", data.classes),
            );
        }
        if arch.is_resnet()
            && m.stem != Some(Stem::Imagenet)
            && data.height < 8
            && data.text.is_none()
        {
            self.err(
                "model.arch",
                "images are too small for a ResNet",
                "use small_cnn or mlp",
            );
        }
        if arch == Arch::SmallCnn && data.height < 4 && data.text.is_none() {
            self.err(
                "model.arch",
                "images are too small for small_cnn (two 2×2 pools)",
                "use mlp",
            );
        }
        Some(ModelPlan {
            arch,
            stem: m.stem.unwrap_or(Stem::Cifar),
            num_classes,
            width,
            hidden,
            embed_dim,
            hidden_size,
            layers,
            heads,
            ff_dim,
            dropout,
        })
    }

    fn data(&mut self) -> Option<DataPlan> {
        let d = &self.recipe().data;
        let Some(format) = d.format else {
            self.err(
                "data.format",
                "missing: every recipe names its data",
                "add `format = \"cifar10-bin\"` (with train = \"...\") or `format = \"synthetic\"` under [data]",
            );
            return None;
        };
        let (source, channels, size, classes, train_total, test_total) = match format {
            DataFormat::Cifar10Bin => {
                self.only_for("data.synthetic", "to format = \"synthetic\"");
                let Some(train) = &d.train else {
                    self.err(
                        "data.train",
                        "missing: format \"cifar10-bin\" needs training data",
                        "set train = \"path/to/data_batch.bin\" (a file, or a directory of data_batch_*.bin), relative to the recipe",
                    );
                    return None;
                };
                let train = self.cifar_files("data.train", train, "data_batch")?;
                let test = match &d.test {
                    Some(t) => self.cifar_files("data.test", t, "test_batch")?,
                    None => vec![],
                };
                let train_n = self.count_records("data.train", &train)?;
                let test_n = self.count_records("data.test", &test)?;
                let classes = cifar::class_names(&train[0]).map_or(10, |n| n.len());
                // Labels are read now, so a bad byte is an error before anything runs.
                let allowed = self.recipe().model.num_classes.unwrap_or(0).max(classes);
                for (key, files) in [("data.train", &train), ("data.test", &test)] {
                    for f in files.iter() {
                        if let Err(e) = cifar::check_labels(f, allowed) {
                            self.data_err(key, &e);
                            return None;
                        }
                    }
                }
                if classes > crate::data::MAX_CLASSES {
                    self.err(
                        "data.train",
                        format!(
                            "{} names {classes} classes, over the cap of {}",
                            train[0].with_file_name("batches.meta.txt").display(),
                            crate::data::MAX_CLASSES
                        ),
                        "batches.meta.txt holds one class name per line",
                    );
                }
                (
                    Source::Cifar { train, test },
                    3,
                    32,
                    classes,
                    train_n,
                    test_n,
                )
            }
            DataFormat::Jsonl => {
                self.only_for("data.synthetic", "to format = \"synthetic\"");
                let Some(train) = &d.train else {
                    self.err(
                        "data.train",
                        "missing: format \"jsonl\" needs training data",
                        "set train = \"path/to/train.jsonl\", relative to the recipe",
                    );
                    return None;
                };
                let (tf, lf) = (
                    d.text_field.clone().unwrap_or("text".into()),
                    d.label_field.clone().unwrap_or("label".into()),
                );
                let train = self.jsonl_file("data.train", train)?;
                let test = match &d.test {
                    Some(t) => Some(self.jsonl_file("data.test", t)?),
                    None => None,
                };
                let named = crate::data::text::class_names(&train).map(|n| n.len());
                let limit = self.recipe().model.num_classes.or(named);
                let mut max_label = 0;
                let mut distinct = std::collections::BTreeSet::new();
                let mut counts = [0usize; 2];
                for (i, (key, path)) in [("data.train", Some(&train)), ("data.test", test.as_ref())]
                    .into_iter()
                    .enumerate()
                {
                    let Some(path) = path else { continue };
                    match crate::data::text::read_jsonl(path, &tf, &lf, limit, usize::MAX) {
                        Ok(rows) => {
                            counts[i] = rows.len();
                            max_label = rows
                                .iter()
                                .map(|(_, l)| *l as usize)
                                .fold(max_label, usize::max);
                            distinct.extend(rows.iter().map(|(_, l)| *l));
                        }
                        Err(e) => {
                            self.data_err(key, &e);
                            return None;
                        }
                    }
                }
                let classes = named.unwrap_or(max_label + 1).max(2);
                if named.is_none() && classes > 10 && distinct.len() * 2 < classes {
                    self.warn(
                        "data.train",
                        format!(
                            "labels run up to {max_label}, so the model gets {classes} classes, but only {} distinct labels occur",
                            distinct.len()
                        ),
                        "a stray label makes every other class empty: check the data, or name the classes in labels.txt beside the file",
                    );
                }
                (
                    Source::Jsonl { train, test },
                    0,
                    0,
                    classes,
                    counts[0],
                    counts[1],
                )
            }
            DataFormat::Synthetic => {
                self.only_for("data.train", "to format = \"cifar10-bin\" or \"jsonl\"");
                self.only_for("data.test", "to format = \"cifar10-bin\" or \"jsonl\"");
                let s = d.synthetic.clone().unwrap_or_default();
                for (key, v, lo, hi) in [
                    ("data.synthetic.samples", s.samples, 1, 10_000_000),
                    ("data.synthetic.test_samples", s.test_samples, 0, 10_000_000),
                    ("data.synthetic.classes", s.classes, 2, 100_000),
                    ("data.synthetic.image_size", s.image_size, 1, 1024),
                    ("data.synthetic.channels", s.channels, 1, 64),
                ] {
                    if !(lo..=hi).contains(&v) {
                        self.err(
                            key,
                            format!("{v} is out of range"),
                            format!("use {lo} to {hi}"),
                        );
                    }
                }
                (
                    Source::Synthetic {
                        samples: s.samples,
                        test_samples: s.test_samples,
                    },
                    s.channels,
                    s.image_size,
                    s.classes,
                    s.samples,
                    s.test_samples,
                )
            }
        };
        if train_total == 0 && d.limit != Some(0) {
            self.err(
                "data.train",
                "holds no training samples",
                "point it at a file with data (blank lines are skipped)",
            );
        }
        let train_len = match d.limit {
            Some(0) => {
                self.err(
                    "data.limit",
                    "0 samples leaves nothing to train on",
                    "remove the key to use all samples",
                );
                0
            }
            Some(n) => n.min(train_total),
            None => train_total,
        };
        if d.limit.is_some_and(|n| n > train_total) {
            self.warn(
                "data.limit",
                format!("the training data has only {train_total} samples; using all of them"),
                "lower the limit or remove it",
            );
        }
        // The validation samples come out of the (limited) training set.
        let validation_len = match d.validation {
            None => 0,
            Some(f) if !(f > 0.0 && f < 1.0) => {
                self.err(
                    "data.validation",
                    format!("{f} is not a fraction between 0 and 1"),
                    "0.1 holds out a tenth of the training set",
                );
                0
            }
            Some(f) => {
                let v = (f * train_len as f64).round() as usize;
                if train_len > 0 && (v == 0 || v >= train_len) {
                    self.err(
                        "data.validation",
                        format!(
                            "{f} of {train_len} training samples leaves {v} for validation and {} to train on",
                            train_len - v.min(train_len)
                        ),
                        "both sets need at least one sample",
                    );
                }
                v.min(train_len.saturating_sub(1))
            }
        };
        let train_len = train_len - validation_len;
        let test_len = d.test_limit.map_or(test_total, |n| n.min(test_total));
        if d.test_limit.is_some() && test_total == 0 {
            self.err(
                "data.test_limit",
                "there is no test data to limit",
                "set data.test, or remove the key",
            );
        }

        let normalize = match &d.normalize {
            None => Normalize {
                mean: vec![0.0; channels],
                std: vec![1.0; channels],
                on: NormalizeOn::Host,
            },
            Some(n) => {
                let mut widen = |key: &str, v: &[f32]| -> Vec<f32> {
                    if v.len() == 1 {
                        vec![v[0]; channels]
                    } else if v.len() == channels {
                        v.to_vec()
                    } else {
                        self.err(
                            key,
                            format!("{} values for {channels} channels", v.len()),
                            format!("give one value, or one per channel ({channels})"),
                        );
                        vec![1.0; channels]
                    }
                };
                let mean = widen("data.normalize.mean", &n.mean);
                let std = widen("data.normalize.std", &n.std);
                if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
                    self.err(
                        "data.normalize.std",
                        "every std must be a positive number",
                        "pixels are divided by it",
                    );
                }
                if mean.iter().any(|m| !m.is_finite()) {
                    self.err(
                        "data.normalize.mean",
                        "every mean must be a finite number",
                        "means are of pixels in 0..1",
                    );
                }
                Normalize {
                    mean,
                    std,
                    on: n.on,
                }
            }
        };
        let a = &d.augment;
        if size > 0 && a.crop_padding > size / 2 {
            self.err(
                "data.augment.crop_padding",
                format!(
                    "{} pixels of padding for {size}-pixel images",
                    a.crop_padding
                ),
                format!("use at most {}", size / 2),
            );
        }
        let text = self.text_plan(format);
        Some(DataPlan {
            text,
            source,
            channels,
            height: size,
            width: size,
            classes,
            train_len,
            test_len,
            validation_len,
            normalize,
            crop_padding: a.crop_padding,
            hflip: a.hflip,
        })
    }

    /// A `.jsonl` file that exists.
    fn jsonl_file(&mut self, key: &str, rel: &str) -> Option<PathBuf> {
        let path = self.l.dir_of(key).join(rel);
        if path.is_file() {
            Some(path)
        } else if path.exists() {
            self.err(
                key,
                format!(
                    "{} is not a regular file",
                    crate::recipe::lexical(&path).display()
                ),
                "name a .jsonl file",
            );
            None
        } else {
            self.err(
                key,
                format!("{} does not exist", crate::recipe::lexical(&path).display()),
                "paths are relative to the recipe file; the shipped data is under datasets/",
            );
            None
        }
    }

    /// Text keys on image data, image keys on text data, and the text plan.
    fn text_plan(&mut self, format: DataFormat) -> Option<TextPlan> {
        let r = self.recipe();
        let text = format == DataFormat::Jsonl;
        if !text {
            for k in ["data.text_field", "data.label_field", "data.tokenizer"] {
                self.only_for(k, "to text data (format = \"jsonl\")");
            }
            if self.l.is_set("padding") {
                self.err(
                    "padding",
                    "applies to text data (format = \"jsonl\"); images all have one size",
                    "remove the [padding] table",
                );
            }
            return None;
        }
        for k in ["data.normalize", "data.augment"] {
            self.only_for(k, "to image data");
        }
        let p = r.padding.clone().unwrap_or_default();
        let t = r.data.tokenizer.clone().unwrap_or_default();
        if p.max_length > MAX_TOKENS {
            self.err(
                "padding.max_length",
                format!("{} tokens, over the cap of {MAX_TOKENS}", p.max_length),
                "sequences are cut to this length; 512 is usual",
            );
        }
        if p.max_length == 0 {
            self.err(
                "padding.max_length",
                "0 tokens",
                "sequences are cut to this length; use at least 1",
            );
        }
        if p.multiple_of == 0 {
            self.err(
                "padding.multiple_of",
                "0 cannot be a multiple",
                "use 1 for no rounding, or e.g. 8",
            );
        }
        if p.strategy != crate::recipe::PaddingStrategy::Bucket {
            self.only_for("padding.buckets", "to strategy = \"bucket\"");
        } else if p.buckets == 0 {
            self.err(
                "padding.buckets",
                "0 buckets",
                "use at least 1 (8 is usual)",
            );
        }
        if t.kind == crate::recipe::TokenizerKind::Word && t.max_vocab == 0 {
            self.err(
                "data.tokenizer.max_vocab",
                "an empty vocabulary",
                "use e.g. 20000",
            );
        }
        if t.kind == crate::recipe::TokenizerKind::Byte {
            self.only_for("data.tokenizer.max_vocab", "to kind = \"word\"");
            self.only_for("data.tokenizer.min_freq", "to kind = \"word\"");
        }
        if p.pad_id > 1_000_000 {
            self.err(
                "padding.pad_id",
                format!("{} would need an embedding table that large", p.pad_id),
                "use a small id; 0 is usual",
            );
        }
        Some(TextPlan {
            text_field: r.data.text_field.clone().unwrap_or("text".into()),
            label_field: r.data.label_field.clone().unwrap_or("label".into()),
            tokenizer: t,
            padding: crate::data::pad::Padding {
                strategy: p.strategy,
                max_length: p.max_length.max(1),
                multiple_of: p.multiple_of.max(1),
                pad_id: p.pad_id,
            },
            buckets: p.buckets.max(1),
        })
    }

    /// A `.bin` file, or a directory: its `<stem>*.bin` files in name order.
    fn cifar_files(&mut self, key: &str, rel: &str, stem: &str) -> Option<Vec<PathBuf>> {
        let path = self.l.dir_of(key).join(rel);
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(stem) && n.ends_with(".bin"))
                })
                .collect();
            files.sort();
            if files.is_empty() {
                self.err(
                    key,
                    format!("directory {} holds no {stem}*.bin file", path.display()),
                    "point at the cifar-10-batches-bin directory or at one .bin file",
                );
                return None;
            }
            Some(files)
        } else if path.is_file() {
            Some(vec![path])
        } else if path.exists() {
            self.err(
                key,
                format!(
                    "{} is neither a regular file nor a directory",
                    crate::recipe::lexical(&path).display()
                ),
                "name a .bin file or the directory holding them",
            );
            None
        } else {
            self.err(
                key,
                format!("{} does not exist", crate::recipe::lexical(&path).display()),
                "paths are relative to the recipe file; the shipped data is under datasets/",
            );
            None
        }
    }

    fn count_records(&mut self, key: &str, files: &[PathBuf]) -> Option<usize> {
        let mut n = 0;
        for f in files {
            match cifar::count_records(f) {
                Ok(k) => n += k,
                Err(e) => {
                    self.data_err(key, &e);
                    return None;
                }
            }
        }
        Some(n)
    }

    fn loader(&mut self, device: Device) -> LoaderPlan {
        let l = &self.recipe().loader;
        if l.batch_size == 0 {
            self.err("loader.batch_size", "0 samples per batch", "use at least 1");
        }
        if l.persistent_workers && l.workers == 0 {
            self.err(
                "loader.persistent_workers",
                "persistent workers need workers > 0 (PyTorch rejects this too)",
                "set loader.workers to 1 or more, or remove persistent_workers",
            );
        }
        // The default is written out in resolved recipes, so only another value is a
        // mistake.
        let default_prefetch = crate::recipe::LoaderSection::default().prefetch;
        if self.l.is_set("loader.prefetch") && l.workers == 0 && l.prefetch != default_prefetch {
            self.err(
                "loader.prefetch",
                "prefetch applies to worker threads, and loader.workers = 0 has none (PyTorch rejects this too)",
                "set loader.workers to 1 or more, or remove prefetch",
            );
        }
        if l.prefetch == 0 {
            self.err(
                "loader.prefetch",
                "0 batches ahead would stall every worker",
                "use at least 1",
            );
        }
        if l.workers > 256 {
            self.err(
                "loader.workers",
                format!("{} worker threads", l.workers),
                "use at most 256",
            );
        }
        if l.pin_memory && device == Device::Cpu {
            self.warn(
                "loader.pin_memory",
                "does nothing on the CPU backend: there is no host-to-device copy to speed up",
                "keep it for CUDA runs, or set it to false",
            );
        }
        LoaderPlan {
            batch_size: l.batch_size,
            workers: l.workers,
            pin_memory: l.pin_memory,
            persistent_workers: l.persistent_workers,
            prefetch: l.prefetch,
            shuffle: l.shuffle,
            drop_last: l.drop_last,
        }
    }

    fn optim(&mut self) -> Option<OptimPlan> {
        let o = &self.recipe().optim;
        let sgd = o.optimizer == Optimizer::Sgd;
        let momentum = o.momentum.unwrap_or(0.0);
        let nesterov = o.nesterov.unwrap_or(false);
        let betas = o.betas.unwrap_or([0.9, 0.999]);
        let eps = o.eps.unwrap_or(1e-8);
        let min_lr = o.min_lr.unwrap_or(0.0);
        let step_size = o.step_size.unwrap_or(1000);
        let gamma = o.gamma.unwrap_or(0.1);
        if !(o.lr.is_finite() && o.lr > 0.0) {
            self.err(
                "optim.lr",
                format!("{} is not a positive learning rate", o.lr),
                "e.g. 0.1 for SGD, 1e-3 for AdamW",
            );
        }
        if sgd {
            self.only_for("optim.betas", "to optimizer = \"adamw\"");
            self.only_for("optim.eps", "to optimizer = \"adamw\"");
            if !(0.0..1.0).contains(&momentum) {
                self.err(
                    "optim.momentum",
                    format!("{momentum} is outside [0, 1)"),
                    "0.9 is usual",
                );
            }
            if nesterov && momentum == 0.0 {
                self.err(
                    "optim.nesterov",
                    "Nesterov momentum needs momentum > 0 (PyTorch rejects this too)",
                    "set optim.momentum, e.g. 0.9",
                );
            }
        } else {
            self.only_for("optim.momentum", "to optimizer = \"sgd\"");
            self.only_for("optim.nesterov", "to optimizer = \"sgd\"");
            for (i, b) in betas.iter().enumerate() {
                if !(0.0..1.0).contains(b) {
                    self.err(
                        "optim.betas",
                        format!("beta{} = {b} is outside [0, 1)", i + 1),
                        "PyTorch's default is [0.9, 0.999]",
                    );
                }
            }
            if !(eps.is_finite() && eps > 0.0) {
                self.err(
                    "optim.eps",
                    format!("{eps} is not positive"),
                    "PyTorch's default is 1e-8",
                );
            }
        }
        let weight_decay = o.weight_decay.unwrap_or(if sgd { 0.0 } else { 0.01 });
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            self.err(
                "optim.weight_decay",
                format!("{weight_decay} is not a finite number of 0 or more"),
                "use 0 or more, e.g. 5e-4",
            );
        }
        if o.accumulation_steps == 0 {
            self.err(
                "optim.accumulation_steps",
                "0 accumulation steps would never step the optimizer",
                "use 1 for no accumulation, or N to sum N micro-batches per step",
            );
        }
        if o.schedule != Schedule::Cosine {
            self.only_for("optim.min_lr", "to schedule = \"cosine\"");
        }
        if o.schedule != Schedule::Step {
            self.only_for("optim.step_size", "to schedule = \"step\"");
            self.only_for("optim.gamma", "to schedule = \"step\"");
        }
        if o.schedule == Schedule::Cosine && !(min_lr >= 0.0 && min_lr < o.lr) {
            self.err(
                "optim.min_lr",
                format!("{min_lr} is not in [0, lr)"),
                "cosine decays from lr down to min_lr",
            );
        }
        if o.schedule == Schedule::Step {
            if step_size == 0 {
                self.err(
                    "optim.step_size",
                    "0 steps between decays",
                    "use at least 1",
                );
            }
            if !(gamma > 0.0 && gamma <= 1.0) {
                self.err(
                    "optim.gamma",
                    format!("{gamma} is outside (0, 1]"),
                    "0.1 is usual",
                );
            }
        }
        if let Some(c) = o.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                self.err(
                    "optim.clip_grad_norm",
                    format!("{c} is not a positive norm"),
                    "e.g. 1.0; remove the key for no clipping",
                );
            }
        }
        if !(0.0..1.0).contains(&o.label_smoothing) {
            self.err(
                "optim.label_smoothing",
                format!("{} is outside [0, 1)", o.label_smoothing),
                "0.1 is usual",
            );
        }
        Some(OptimPlan {
            clip_grad_norm: o.clip_grad_norm,
            label_smoothing: o.label_smoothing,
            optimizer: o.optimizer,
            lr: o.lr,
            momentum,
            weight_decay,
            nesterov,
            betas,
            eps,
            accumulation_steps: o.accumulation_steps.max(1),
            schedule: crate::schedule::LrSchedule {
                kind: o.schedule,
                lr: o.lr,
                warmup_steps: o.lr_warmup_steps,
                min_lr,
                step_size: step_size.max(1),
                gamma,
                total_steps: 0,
            },
        })
    }

    fn cleanup(&mut self, device: Device) -> CleanupPolicy {
        let c = &self.recipe().cleanup;
        if c.every != Every::Never && c.actions.is_empty() {
            self.err(
                "cleanup.actions",
                "empty, so a cleanup would do nothing",
                "list \"sync\", \"empty_cache\" or \"trim_host\", or set every = \"never\"",
            );
        }
        let mut seen = vec![];
        for a in &c.actions {
            if seen.contains(a) {
                self.err(
                    "cleanup.actions",
                    format!("\"{}\" is listed twice", crate::policy::action_name(*a)),
                    "list each action once",
                );
            }
            seen.push(*a);
        }
        if c.every == Every::Never
            && self.l.is_set("cleanup.actions")
            && !self.l.is_set("cleanup.every")
        {
            self.warn(
                "cleanup.actions",
                "never run: cleanup.every is \"never\"",
                "set cleanup.every to run them",
            );
        }
        if c.every != Every::Never && device == Device::Cpu {
            let noop: Vec<String> = c
                .actions
                .iter()
                .filter(|a| matches!(a, CleanupAction::Sync | CleanupAction::EmptyCache))
                .map(|a| format!("{:?}", crate::policy::action_name(*a)))
                .fold(vec![], |mut v: Vec<String>, a| {
                    if !v.contains(&a) {
                        v.push(a);
                    }
                    v
                });
            if !noop.is_empty() {
                self.warn(
                    "cleanup.actions",
                    format!("{} cost next to nothing on the CPU backend (it runs each op to completion and keeps no memory pool)", noop.join(" and ")),
                    "\"trim_host\" has a real cost on the CPU; the device actions are for CUDA runs",
                );
            }
        }
        CleanupPolicy {
            every: c.every,
            actions: c.actions.clone(),
        }
    }

    fn profile(&mut self, run: Option<&RunPlan>) -> ProfilePlan {
        let p = &self.recipe().profile;
        let window = p.steps.as_deref().and_then(|text| {
            let parsed = parse_steps(text);
            match parsed {
                Some(w) => {
                    if let Some(run) = run {
                        if *w.start() > run.total_steps {
                            self.warn(
                                "profile.steps",
                                format!("starts after the run's last step ({})", run.total_steps),
                                "no step will be synced; move the window",
                            );
                        }
                    }
                    Some(w)
                }
                None => {
                    self.err(
                        "profile.steps",
                        format!("{text:?} is not a window of steps"),
                        "write \"A..B\" (steps A to B-1) or \"A..=B\", with 1 <= A < B, e.g. \"20..30\"",
                    );
                    None
                }
            }
        });
        ProfilePlan {
            window,
            sample_ms: p.sample_ms,
        }
    }

    fn checkpoint(&mut self) -> CheckpointPlan {
        let c = self.recipe().checkpoint.clone();
        if c.keep == 0 {
            self.err(
                "checkpoint.keep",
                "0 checkpoints kept: none could be resumed from",
                "keep at least 1 (2 is safer: the latest may be cut by a crash)",
            );
        }
        if c.every == Every::Step {
            self.warn(
                "checkpoint.every",
                "a checkpoint after every step writes the whole model each step",
                "use a number of steps, e.g. 500, or \"epoch\"",
            );
        }
        CheckpointPlan {
            every: c.every,
            keep: c.keep.max(1),
            save_final: c.save_final,
        }
    }

    fn log(&mut self) -> Option<LogPlan> {
        let g = &self.recipe().log;
        if g.every == 0 {
            self.err(
                "log.every",
                "0 steps between reads",
                "use 1 to log every step",
            );
        }
        if g.dir.is_empty() {
            self.err("log.dir", "empty", "use \"runs\" or another directory");
        }
        Some(LogPlan {
            dir: PathBuf::from(&g.dir),
            every: g.every.max(1),
            progress: g.progress,
            csv: g.csv,
            tensorboard: g.tensorboard,
        })
    }

    fn run_section(
        &mut self,
        data: Option<&DataPlan>,
        loader: &LoaderPlan,
        optim: Option<&OptimPlan>,
    ) -> Option<RunPlan> {
        let r = &self.recipe().run;
        if r.epochs == 0 {
            self.err("run.epochs", "0 epochs", "use at least 1");
        }
        if r.max_steps == Some(0) {
            self.err(
                "run.max_steps",
                "0 steps",
                "use at least 1, or remove the key for no limit",
            );
        }
        let has_test = data.is_some_and(|d| d.test_len > 0);
        let eval = if !has_test && r.eval != Eval::Never {
            if self.l.is_set("run.eval") {
                self.err(
                    "run.eval",
                    format!("\"{}\" needs test data", format!("{:?}", r.eval).to_lowercase()),
                    "set data.test (cifar10-bin) or data.synthetic.test_samples, or eval = \"never\"",
                );
            }
            Eval::Never
        } else {
            r.eval
        };
        let has_validation = data.is_some_and(|d| d.validation_len > 0);
        let watch = match (&r.early_stop, has_validation) {
            (Some(_), false) if data.is_some() => {
                self.err(
                    "run.early_stop",
                    "watches the validation set, and there is none",
                    "set data.validation = 0.1 (a tenth of the training set)",
                );
                None
            }
            (e, true) => {
                let e = e.clone().unwrap_or_default();
                use crate::recipe::{EarlyStopMetric, EarlyStopMode};
                if e.patience == 0 {
                    self.err(
                        "run.early_stop.patience",
                        "0 evaluations would stop at the first",
                        "use at least 1 (3 is usual)",
                    );
                }
                if !(e.min_delta.is_finite() && e.min_delta >= 0.0) {
                    self.err(
                        "run.early_stop.min_delta",
                        format!("{} is not 0 or more", e.min_delta),
                        "use 0, or a small positive change such as 1e-3",
                    );
                }
                let maximize = match e.mode {
                    Some(m) => m == EarlyStopMode::Max,
                    None => e.metric == EarlyStopMetric::ValAccuracy,
                };
                Some(Watch {
                    metric: e.metric,
                    maximize,
                    min_delta: e.min_delta,
                    patience: r.early_stop.as_ref().map(|_| e.patience),
                })
            }
            _ => None,
        };
        // The default is written out in resolved recipes: only another value is a mistake.
        if self.l.is_set("run.validate")
            && r.validate != crate::recipe::RunSection::default().validate
            && data.is_some()
            && !has_validation
        {
            self.err(
                "run.validate",
                "there is no validation set to evaluate",
                "set data.validation = 0.1, or remove the key",
            );
        }
        if !(r.max_loss > 0.0) {
            self.err(
                "run.max_loss",
                format!("{} is not a positive bound", r.max_loss),
                "use e.g. 1e4, or inf to catch only NaN",
            );
        }
        let (data, optim) = (data?, optim?);
        let bs = loader.batch_size.max(1);
        let n = data.train_len;
        if n == 0 {
            // Said where the data is counted (an empty file, data.limit = 0).
            return None;
        }
        let micro = if loader.drop_last {
            n / bs
        } else {
            n.div_ceil(bs)
        } as u64;
        if micro == 0 {
            self.err(
                "loader.drop_last",
                format!("drops every batch: {n} training samples are fewer than batch_size = {bs}"),
                "lower loader.batch_size, or set drop_last = false",
            );
            return None;
        }
        let steps_per_epoch = micro.div_ceil(optim.accumulation_steps as u64);
        let Some(mut total) = steps_per_epoch.checked_mul(r.epochs as u64) else {
            self.err(
                "run.epochs",
                format!(
                    "{} epochs of {steps_per_epoch} steps overflow a step counter",
                    r.epochs
                ),
                "use fewer epochs, or run.max_steps to bound the run",
            );
            return None;
        };
        if let Some(m) = r.max_steps {
            total = total.min(m);
        }
        if r.warmup_steps >= total && total > 0 {
            self.warn(
                "run.warmup_steps",
                format!("the run has only {total} optimizer steps, so none is timed"),
                format!("lower warmup_steps below {total}"),
            );
        }
        Some(RunPlan {
            epochs: r.epochs,
            total_steps: total,
            steps_per_epoch,
            micro_batches_per_epoch: micro,
            warmup_steps: r.warmup_steps,
            eval,
            max_loss: r.max_loss,
            stop_on_divergence: r.stop_on_divergence,
            validate: r.validate,
            watch,
        })
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
    /// The learning-rate schedule with the run's length filled in.
    pub fn lr_schedule(&self) -> crate::schedule::LrSchedule {
        crate::schedule::LrSchedule {
            total_steps: self.run.total_steps,
            ..self.optim.schedule.clone()
        }
    }
}
