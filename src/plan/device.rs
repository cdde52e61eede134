//! Where a plan runs and whether it fits: the device (`backend.kind`, `backend.device`), the
//! CUDA kernel settings, and the resource pre-flight against the machine's memory.

use super::*;

impl<'a> Validator<'a> {
    pub(super) fn device(&mut self, m: &Machine) -> (Device, String) {
        let b = &self.recipe().backend;
        match b.kind {
            BackendKind::Cpu => (Device::Cpu, "backend.kind = \"cpu\"".into()),
            BackendKind::Auto => match (&m.cuda_devices, m.cuda_compiled) {
                (Ok(n), true) if b.device < *n => {
                    let toolchain = m.cuda_toolchain.as_ref();
                    if let Some((why, help)) = toolchain.and_then(|t| t.problem()) {
                        let d = b.device;
                        self.warn(
                            "backend.kind",
                            format!("CUDA device {d} found, but {why}; running on the CPU"),
                            format!("to run on the GPU: {help}"),
                        );
                        let reason =
                            format!("auto: CUDA device {d} of {n} found, but {why}; using the CPU");
                        return (Device::Cpu, reason);
                    }
                    let found = toolchain.map_or(String::new(), |t| format!(" ({})", t.describe()));
                    (
                        Device::Cuda(b.device),
                        format!("auto: CUDA device {} of {n} found{found}", b.device),
                    )
                }
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
                    _ => {
                        if let Some((why, help)) =
                            m.cuda_toolchain.as_ref().and_then(|t| t.problem())
                        {
                            self.err(
                                "backend.kind",
                                format!("CUDA was asked for, but {why}"),
                                format!("{help}, or set kind = \"auto\" or \"cpu\""),
                            );
                        }
                    }
                }
                let found = m.cuda_toolchain.as_ref();
                (
                    Device::Cuda(b.device),
                    format!(
                        "backend.kind = \"cuda\"{}",
                        found.map_or(String::new(), |t| format!(" ({})", t.describe()))
                    ),
                )
            }
            BackendKind::Wgpu => self.wgpu_adapter(m),
        }
    }

    /// `backend.kind = "wgpu"`: the adapter `backend.device` names, among those found.
    fn wgpu_adapter(&mut self, m: &Machine) -> (Device, String) {
        let d = self.recipe().backend.device;
        let unchecked = WgpuTarget {
            index: d,
            kind: AdapterKind::Other,
            nth: d,
        };
        let reason = "backend.kind = \"wgpu\"".to_string();
        if !m.wgpu_compiled {
            self.err(
                "backend.kind",
                "WebGPU was asked for, but this binary was built without it",
                "build with `cargo build --release --features wgpu`, or set kind = \"auto\" or \"cpu\"",
            );
            return (Device::Wgpu(unchecked), reason);
        }
        let Some(list_adapters) = m.wgpu_adapters else {
            return (Device::Wgpu(unchecked), reason);
        };
        let adapters = &list_adapters();
        let list = || {
            adapters
                .iter()
                .enumerate()
                .map(|(i, a)| format!("{i}: {} ({})", a.name, a.target.kind.name()))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let Some(a) = adapters.get(d) else {
            if adapters.is_empty() {
                self.err(
                    "backend.kind",
                    "WebGPU was asked for, but no adapter was found (no Vulkan driver answers)",
                    "install a Vulkan driver (on Debian, mesa-vulkan-drivers gives a software one), or set backend.kind = \"cpu\"",
                );
            } else {
                self.err(
                    "backend.device",
                    format!(
                        "WebGPU adapter {d} does not exist: {} found ({})",
                        adapters.len(),
                        list()
                    ),
                    format!("use a device index below {}", adapters.len()),
                );
            }
            return (Device::Wgpu(unchecked), reason);
        };
        if std::env::var_os("CUBECL_WGPU_DEFAULT_DEVICE").is_some() {
            self.warn(
                "backend.device",
                "CUBECL_WGPU_DEFAULT_DEVICE is ignored: backend.device selects the adapter",
                "set backend.device (--set backend.device=N) instead",
            );
        }
        // CubeCL selects an adapter by kind and position; it cannot name an adapter of
        // unknown kind, nor a software one after the first.
        let first_software = adapters
            .iter()
            .position(|a| a.target.kind == AdapterKind::Cpu);
        match a.target.kind {
            AdapterKind::Other => self.err(
                "backend.device",
                format!(
                    "WebGPU adapter {d} ({}) is of a kind CubeCL cannot select reliably",
                    a.name
                ),
                format!("use another adapter ({})", list()),
            ),
            AdapterKind::Cpu if a.target.nth > 0 => self.err(
                "backend.device",
                format!(
                    "WebGPU adapter {d} ({}) is a second software adapter; CubeCL selects only the first",
                    a.name
                ),
                format!("use device {}", first_software.unwrap_or(0)),
            ),
            _ => {}
        }
        (
            Device::Wgpu(a.target),
            format!(
                "{reason}: adapter {d} of {}, {} ({})",
                adapters.len(),
                a.name,
                a.target.kind.name()
            ),
        )
    }

    pub(super) fn kernels(&mut self, device: Device, m: &Machine) -> KernelPlan {
        let b = self.recipe().backend.clone();
        let (fusion, fusion_reason) = self.fusion(b.fusion, device, m.cpus);
        self.kernel_keys_unused(device);
        // (On the CPU, or for a model without convolutions, where these keys do nothing,
        // that is said above.)
        if b.conv == ConvAlgo::Autotune
            && device != Device::Cpu
            && convolutions(self.recipe().model.arch)
        {
            let set = [
                (
                    "backend.conv_kernel",
                    b.conv_kernel != ConvKernel::SimpleSyncCyclic,
                ),
                ("backend.conv_tile", b.conv_tile != ConvTile::Cmma),
                ("backend.conv_split", b.conv_split != ConvSplit::Auto),
            ];
            if let Some((key, _)) = set.into_iter().find(|(_, set)| *set) {
                self.warn(
                    key,
                    "is used only with backend.conv = \"implicit_gemm\"; with \"autotune\" each convolution shape runs the kernel tuned for it",
                    "set backend.conv = \"implicit_gemm\" to run the kernel named, or leave the key out",
                );
            }
        }
        let cache_dir = b.cache_dir.as_ref().and_then(|d| {
            if d.trim().is_empty() {
                self.err(
                    "backend.cache_dir",
                    "is empty",
                    "name a directory, or leave the key out for the per-user default",
                );
                return None;
            }
            let p = self.path_of("backend.cache_dir", d)?;
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
            fusion,
            fusion_reason,
            conv: b.conv,
            conv_kernel: b.conv_kernel,
            conv_tile: b.conv_tile,
            conv_split: b.conv_split,
            norm_sums: b.norm_sums,
            matmul: b.matmul,
            cache_dir,
        }
    }

    /// The keys that choose CubeCL's kernels, set to other than their defaults where they
    /// choose nothing: on the CPU backend (it compiles no kernel), or, the convolution and
    /// batch norm keys, for a model that has neither. Said, as `loader.pin_memory` on the
    /// CPU is: a grid over `backend.autotune` on the CPU compared one run with itself, as if
    /// the knob worked. (A resolved recipe, a run's recipe.toml, writes every key with its
    /// default: that sets nothing.)
    fn kernel_keys_unused(&mut self, device: Device) {
        use crate::recipe::BackendSection;
        let (b, d) = (&self.recipe().backend, BackendSection::default());
        let kernel_keys: [(&str, bool); 8] = [
            ("backend.autotune", b.autotune != d.autotune),
            ("backend.fusion", b.fusion != d.fusion),
            ("backend.matmul", b.matmul != d.matmul),
            ("backend.conv", b.conv != d.conv),
            ("backend.conv_kernel", b.conv_kernel != d.conv_kernel),
            ("backend.conv_tile", b.conv_tile != d.conv_tile),
            ("backend.conv_split", b.conv_split != d.conv_split),
            ("backend.norm_sums", b.norm_sums != d.norm_sums),
        ];
        let arch = self.recipe().model.arch;
        let (keys, why, help): (&[(&str, bool)], String, &str) = match device {
            Device::Cpu => (
                &kernel_keys,
                "the CPU backend, which this run uses, compiles no kernels: they choose CubeCL's (CUDA, WebGPU)".into(),
                "keep them for GPU runs; on the CPU every value runs the same code",
            ),
            _ if !convolutions(arch) => (
                &kernel_keys[3..],
                format!(
                    "model.arch = \"{}\" has no convolution or batch norm, which they choose kernels for",
                    arch.map_or("", |a| a.name())
                ),
                "leave them out for this model",
            ),
            _ => return,
        };
        let set: Vec<&str> = keys
            .iter()
            .filter(|(k, other)| *other && self.l.is_set(k))
            .map(|(k, _)| *k)
            .collect();
        if let Some((first, others)) = set.split_first() {
            let also = match others {
                [] => String::new(),
                _ => format!(", nor do {}", others.join(", ")),
            };
            self.warn(first, format!("does nothing here{also}: {why}"), help);
        }
    }

    /// `backend.fusion` decided: `"auto"` turns fusion on where this process may use
    /// `Fusion::AUTO_MIN_CPUS` CPUs or more (or where that is not known). CubeCL 0.10's
    /// threads wait for work by spinning (`cubecl_common`'s device channel: up to 2^19
    /// `pause`s before they yield): the training loop's, CubeCL's device thread and, with
    /// fusion, fusion's. Fewer cores than spinning threads and each waits out the others'
    /// spins: on 2 CPUs a warm ResNet-50 step's host side took 260 ms with fusion and 21 ms
    /// without, on 1 CPU ResNet-18's 240 ms without it against 10 ms on 2 (BENCHMARKS.md,
    /// "The host side of a warm step"). A recipe's explicit `true` is kept, and warned about.
    fn fusion(&mut self, asked: Fusion, device: Device, cpus: Option<usize>) -> (bool, String) {
        let cubecl = !matches!(device, Device::Cpu);
        let min = Fusion::AUTO_MIN_CPUS;
        if cubecl && cpus == Some(1) {
            self.warn(
                "backend.kind",
                "this process may use 1 CPU: CubeCL's device thread and the training loop each spin on a core while they wait for the other, so they take turns (on 1 CPU a warm ResNet-18 step's host side took 240 ms, on 2 CPUs 10 ms)",
                format!("give the process at least 2 CPUs ({min} for backend.fusion; Slurm: slurm.cpus_per_task)"),
            );
        }
        match (asked, cpus) {
            (Fusion::On, Some(n)) if cubecl && n < min => {
                self.warn(
                    "backend.fusion",
                    format!("fusion with {n} CPU{} for this process: fusion's thread spins on a core while it waits, beside CubeCL's device thread and the training loop, and with fewer than {min} CPUs they wait out each other's spins (on 2 CPUs a warm ResNet-50 step's host side took 260 ms with fusion and 21 ms without)", if n == 1 { "" } else { "s" }),
                    format!("give the process at least {min} CPUs (Slurm: slurm.cpus_per_task), or set backend.fusion = \"auto\" or false"),
                );
                (true, "backend.fusion = true".into())
            }
            (Fusion::On, _) => (true, "backend.fusion = true".into()),
            (Fusion::Off, _) => (false, "backend.fusion = false".into()),
            (Fusion::Auto, None) => (true, "auto: the CPUs were not looked at".into()),
            (Fusion::Auto, Some(n)) if n >= min => (
                true,
                format!("auto: {n} CPUs for this process, fusion from {min}"),
            ),
            (Fusion::Auto, Some(n)) => (
                false,
                format!(
                    "auto: {n} CPU{} for this process, fusion from {min} (its thread spins on a core while it waits)",
                    if n == 1 { "" } else { "s" }
                ),
            ),
        }
    }

    /// Refuses a plan whose memory floor (`preflight`) exceeds the machine's memory (the
    /// GPU's on CUDA, the host's on the CPU and on a software WebGPU adapter), or
    /// `preflight::ABSOLUTE_CAP` anywhere. Blames the key behind the largest part.
    pub(super) fn preflight(
        &mut self,
        model: &ModelPlan,
        data: &DataPlan,
        loader: &LoaderPlan,
        optim: &OptimPlan,
        machine: &Machine,
        (device, threads): (Device, usize),
    ) {
        use super::resources::{self as preflight, gib};
        let text_bytes = match &data.source {
            DataSource::Jsonl { train, test, .. } => [Some(train), test.as_ref()]
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
        let (model_part, act_part, data_part, ahead_part) = (
            (f.model_bytes, "the model"),
            (f.activation_bytes, "one batch's activations"),
            (f.data_bytes, "the data"),
            (f.loader_bytes, "the batches loaded ahead"),
        );
        let host = preflight::host_room(machine);
        // Under `ulimit -v`, the threads' stacks count too (reserved address space).
        let stacks = match host.1 == preflight::ADDRESS_SPACE {
            true => preflight::thread_stacks(threads, loader.workers),
            false => 0,
        };
        let checks = match device {
            Device::Cpu => vec![(
                f.host_bytes() + stacks,
                host,
                vec![model_part, act_part, data_part, ahead_part],
            )],
            Device::Cuda(i) => vec![
                (f.data_on_host() + stacks, host, vec![data_part, ahead_part]),
                (
                    f.device_bytes(),
                    cap(machine.gpu_memory.get(i).copied(), "the GPU's memory"),
                    vec![model_part, act_part],
                ),
            ],
            // A software adapter computes in host memory, like the CPU backend.
            Device::Wgpu(t) if t.kind == AdapterKind::Cpu => vec![(
                f.host_bytes() + stacks,
                host,
                vec![model_part, act_part, data_part, ahead_part],
            )],
            // A GPU adapter's memory is not known before it starts: the data against the
            // host, the rest against the cap.
            Device::Wgpu(_) => vec![
                (f.data_on_host() + stacks, host, vec![data_part, ahead_part]),
                (f.device_bytes(), cap(None, ""), vec![model_part, act_part]),
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
        let (key, help) = blame(biggest, model, data);
        self.err(
            key,
            format!(
                "the run needs at least {} ({} parameters: {} with gradients and optimizer state; data {}; activations of one batch {}{}), more than {what} ({})",
                gib(need),
                f.parameters,
                gib(f.model_bytes),
                gib(f.data_bytes),
                gib(f.activation_bytes),
                if f.loader_bytes >= (1 << 30) / 20 {
                    format!("; batches loaded ahead {}", gib(f.loader_bytes))
                } else {
                    String::new()
                } + &match what == preflight::ADDRESS_SPACE && stacks > 0 {
                    true => format!("; the threads' stacks {}", gib(stacks)),
                    false => String::new(),
                },
                gib(limit)
            ),
            help,
        );
    }
}

/// The key to change, and how, when `biggest` (a part of the footprint) is too large.
fn blame(biggest: &str, model: &ModelPlan, data: &DataPlan) -> (&'static str, &'static str) {
    match biggest {
        "the batches loaded ahead" => (
            "loader.prefetch",
            "each worker holds prefetch finished batches: lower prefetch (PyTorch's default is 2) or workers",
        ),
        "one batch's activations" if data.text().is_some_and(|t| {
            t.padding.strategy == crate::recipe::PaddingStrategy::MaxLength
                && t.seen.longest < t.padding.max_length
        }) => (
            "loader.batch_size",
            "lower batch_size (optim.accumulation_steps keeps the effective batch), or pad each batch only to its longest text: padding.strategy = \"dynamic\" (padding.max_length pads every row to its length, longer than any text here)",
        ),
        "one batch's activations" => (
            "loader.batch_size",
            "lower batch_size; optim.accumulation_steps keeps the effective batch",
        ),
        "the model" if model.num_classes > 10_000 => (
            "model.num_classes",
            "fewer classes (each is a row of the last layer)",
        ),
        "the model" => ("model.arch", "a smaller model"),
        _ if matches!(data.source, DataSource::Synthetic { .. }) => (
            "data.synthetic.samples",
            "fewer or smaller synthetic samples",
        ),
        _ => ("data.limit", "set data.limit to use part of the data"),
    }
}

/// Whether the model has convolutions and batch norm, which the `backend.conv*` and
/// `backend.norm_sums` keys choose kernels for (a model not named yet counts as having).
fn convolutions(arch: Option<crate::recipe::Arch>) -> bool {
    use crate::recipe::Arch;
    matches!(
        arch,
        None | Some(Arch::Resnet18 | Arch::Resnet34 | Arch::Resnet50 | Arch::SmallCnn)
    )
}
