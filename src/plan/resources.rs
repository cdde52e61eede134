//! The resource pre-flight: how much memory a plan will need, estimated from its parts
//! without building anything, so that validation can refuse a run that cannot fit instead
//! of letting the allocator abort the process. Owns the estimate and its documented
//! factors; the limits it is compared with come from `plan::Machine`.
//!
//! The estimate is meant as a floor, not a prediction: parameters (exact for the ResNets,
//! whose counts match torchvision's; counted layer by layer for the others), their
//! gradients and optimizer state, the dataset as held in memory, and the activations one
//! micro-batch keeps for its backward pass at a per-architecture rate per input element,
//! set well below what PyTorch keeps for the same layers (the article's ResNet-50 row,
//! 4.7 GB at batch 64 on 3×32×32 images, is about 5,600 floats per input element; the rate
//! here is 2,500). A run over the estimate cannot fit; one under it may still not.

use super::{DataPlan, DataSource, HostMemory, LoaderPlan, ModelPlan, NetPlan, OptimPlan};
use crate::recipe::{OptimizerKind, Stem, TokenizerKind};
use std::path::{Path, PathBuf};

/// Bytes, in parts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Footprint {
    pub parameters: u64,
    /// Weights, gradients and optimizer state, f32.
    pub model_bytes: u64,
    /// Training and test sets as held in host memory.
    pub data_bytes: u64,
    /// What one micro-batch keeps for its backward pass.
    pub activation_bytes: u64,
    /// Batches the loader holds ahead in host memory: each worker's `prefetch` finished
    /// batches and the one it is building (one batch without workers), at a byte per image
    /// element or four per token.
    pub loader_bytes: u64,
}

impl Footprint {
    /// What the device holds: model and activations (the data stays on the host).
    pub fn device_bytes(&self) -> u64 {
        self.model_bytes.saturating_add(self.activation_bytes)
    }

    /// What the host holds on the CPU backend: everything.
    pub fn host_bytes(&self) -> u64 {
        self.device_bytes().saturating_add(self.data_on_host())
    }

    /// What stays in host memory on any backend: the data and the batches loaded ahead.
    pub fn data_on_host(&self) -> u64 {
        self.data_bytes.saturating_add(self.loader_bytes)
    }
}

/// `12.3 GiB`; under 0.1 GiB, `40.2 MiB` (a tight `ulimit -v` was said as "0.0 GiB" left,
/// against a need of "0.0 GiB").
pub fn gib(bytes: u64) -> String {
    if bytes < (1u64 << 30) / 10 {
        return format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64);
    }
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The vocabulary a text plan can reach: the words the word tokenizer keeps of the training
/// texts (at most its cap, those seen `min_freq` times; plus its specials), or the byte
/// tokenizer's 256 (plus its specials). (The cap alone was taken: `max_vocab = 100000000` over a file of four
/// words was refused as a 6.4-billion-parameter model.)
fn vocab_bound(data: &DataPlan, pad_id: usize) -> u64 {
    let t = data.text();
    let v = match t.map(|t| t.tokenizer.kind) {
        Some(TokenizerKind::Word) => t.map_or(0, |t| t.seen.words) + 2,
        _ => 258,
    };
    (v.max(pad_id + 1)) as u64
}

fn linear(i: u64, o: u64) -> u64 {
    i * o + o
}

/// Trainable parameters of the plan's model.
pub fn parameters(m: &ModelPlan, data: &DataPlan) -> u64 {
    let classes = m.num_classes as u64;
    let (c, side) = data
        .image()
        .map_or((0, 0), |i| (i.channels as u64, i.height as u64));
    let embed = |e: usize| {
        let pad = data.text().map_or(0, |t| t.padding.pad_id as usize);
        vocab_bound(data, pad) * e as u64
    };
    let mlp = |first: u64, hidden: &[usize]| -> u64 {
        let mut sizes = vec![first];
        sizes.extend(hidden.iter().map(|&h| h as u64));
        sizes.push(classes);
        sizes.windows(2).map(|w| linear(w[0], w[1])).sum()
    };
    match &m.net {
        NetPlan::Resnet18 { stem } | NetPlan::Resnet34 { stem } | NetPlan::Resnet50 { stem } => {
            // torchvision's counts without conv1 and fc (10 classes, 3 channels: 11,173,962,
            // 21,282,122 and 23,520,842 with the CIFAR stem).
            let (body, features) = match m.net {
                NetPlan::Resnet18 { .. } => (11_167_104, 512),
                NetPlan::Resnet34 { .. } => (21_275_264, 512),
                _ => (23_498_624, 2048),
            };
            let k = if *stem == Stem::Imagenet { 49 } else { 9 };
            body + 64 * c * k + linear(features, classes)
        }
        NetPlan::SmallCnn { width } => {
            let w = *width as u64;
            let flat = 2 * w * (side / 4) * (side / 4);
            (c * w * 9 + w + 2 * w)
                + (w * 2 * w * 9 + 2 * w + 4 * w)
                + linear(flat, 128)
                + linear(128, classes)
        }
        NetPlan::Mlp { hidden } => mlp(c * side * side, hidden),
        NetPlan::Bag { embed_dim, hidden } => embed(*embed_dim) + mlp(*embed_dim as u64, hidden),
        NetPlan::Lstm {
            embed_dim,
            hidden_size,
            layers,
        } => {
            let (e, h) = (*embed_dim as u64, *hidden_size as u64);
            let first = 4 * (linear(e, h) + linear(h, h));
            let rest = 4 * (linear(h, h) + linear(h, h)) * (*layers as u64 - 1);
            embed(*embed_dim) + first + rest + linear(h, classes)
        }
        NetPlan::Transformer(t) => {
            let max_len = data.text().map_or(1, |t| t.padding.max_row_len()) as u64;
            let (e, ff) = (t.embed_dim as u64, t.ff_dim as u64);
            let layer = 4 * linear(e, e) + linear(e, ff) + linear(ff, e) + 4 * e;
            embed(t.embed_dim) + max_len * e + layer * t.layers as u64 + linear(e, classes)
        }
    }
}

/// f32 values one sample keeps for its backward pass, per element of its input (pixels ×
/// channels, or tokens), by architecture: the ResNets scaled from the article's figure
/// (see the module header), the others counted from their layers' outputs.
fn activations_per_input(m: &ModelPlan) -> u64 {
    match &m.net {
        NetPlan::Resnet18 { stem } | NetPlan::Resnet34 { stem } | NetPlan::Resnet50 { stem } => {
            let v = match m.net {
                NetPlan::Resnet18 { .. } => 600,
                NetPlan::Resnet34 { .. } => 1_000,
                _ => 2_500,
            };
            if *stem == Stem::Imagenet {
                v / 16
            } else {
                v
            }
        }
        NetPlan::SmallCnn { width } => 4 * *width as u64,
        NetPlan::Mlp { .. } => 2,
        NetPlan::Bag { embed_dim, .. } => 2 * *embed_dim as u64,
        NetPlan::Lstm {
            embed_dim,
            hidden_size,
            layers,
        } => 8 * (embed_dim + hidden_size * layers) as u64,
        NetPlan::Transformer(t) => (t.layers * (8 * t.embed_dim + 2 * t.ff_dim)) as u64,
    }
}

/// The rows of a training batch (see [`super::Plan::batch_rows`]).
pub fn batch_rows(loader: &LoaderPlan, data: &DataPlan) -> usize {
    loader.batch_size.min(data.train_len.max(1))
}

/// The plan's footprint. Text data is counted by its files' sizes (tokens take about as
/// much as the text they come from); images as the bytes of their pixels.
pub fn estimate(
    model: &ModelPlan,
    data: &DataPlan,
    loader: &LoaderPlan,
    optim: &OptimPlan,
    text_bytes: u64,
) -> Footprint {
    let params = parameters(model, data);
    // A batch_size past the training set is the set (20,000 of 2,000 samples was counted
    // as 29 GiB of activations, and refused, for a run that needs 3).
    let rows = batch_rows(loader, data) as u64;
    let states = match optim.optimizer {
        OptimizerKind::Sgd if optim.momentum > 0.0 => 1,
        OptimizerKind::Sgd => 0,
        OptimizerKind::Adamw => 2,
    };
    let model_bytes = params.saturating_mul(4 * (2 + states));
    // Bytes of an image sample, or tokens of a padded text row; bytes per element of a batch.
    let (data_bytes, per_input, element_bytes) = match &data.source {
        DataSource::Cifar { image: i, .. } | DataSource::Synthetic { image: i, .. } => {
            let sample = (i.channels * i.height * i.width) as u64;
            // The validation set is held too (held out of the training file, or a file).
            let samples = (data.train_len + data.test_len + data.validation_len) as u64;
            (sample.saturating_mul(samples), sample, 1)
        }
        // `max_length` pads every row to it; `dynamic` and `bucket` to the batch's longest
        // text, so no row is longer than the files' longest (a `max_length` of 4,096 over
        // 60-token texts was refused as 32.8 GiB of attention).
        DataSource::Jsonl { text: t, .. } => (
            text_bytes.saturating_mul(2),
            t.padding.row_len(t.seen.longest) as u64,
            4,
        ),
    };
    // No more than an epoch has: the workers are given an epoch's batches at its start
    // (a prefetch of 100 over 4 batches an epoch was counted as 500 batches, 25 GiB, and
    // refused a run that held 1 GiB).
    let epoch_batches = data.train_len.div_ceil(loader.batch_size.max(1)).max(1) as u64;
    let batches_ahead = match loader.workers {
        0 => 1,
        w => (w as u64)
            .saturating_mul((loader.prefetch as u64).saturating_add(1))
            .min(epoch_batches),
    };
    let loader_bytes = batches_ahead
        .saturating_mul(rows)
        .saturating_mul(per_input)
        .saturating_mul(element_bytes);
    // A Transformer's attention keeps, per layer, its score matrices (batch × heads × L ×
    // L, before and after the softmax) for the backward pass: quadratic in the row length
    // L, which the per-token count misses. (At 8,192 tokens, batch 32 and 4 heads, one
    // matrix is 32 GiB: such a run passed the check and aborted at its first allocation.)
    let attention_bytes = match &model.net {
        NetPlan::Transformer(t) => rows
            .saturating_mul(t.heads as u64)
            .saturating_mul(per_input)
            .saturating_mul(per_input)
            .saturating_mul(4 * 2)
            .saturating_mul(t.layers as u64),
        _ => 0,
    };
    let activation_bytes = rows
        .saturating_mul(per_input)
        .saturating_mul(activations_per_input(model))
        .saturating_mul(4)
        .saturating_add(attention_bytes);
    Footprint {
        parameters: params,
        model_bytes,
        data_bytes,
        activation_bytes,
        loader_bytes,
    }
}

/// Beyond this a footprint is refused on any machine (the check `runner validate` makes,
/// which knows no machine): 4 TiB.
pub const ABSOLUTE_CAP: u64 = 4 << 40;

/// The host memory this process may use, and what limits it (the cap of any machine where
/// nothing else does, or where that is less).
pub(super) fn host_room(machine: &super::Machine) -> (u64, &'static str) {
    match machine.host_memory {
        Some(h) if h.bytes > 0 => (h.bytes.min(ABSOLUTE_CAP), h.what),
        _ => (ABSOLUTE_CAP, "the cap of any machine"),
    }
}

/// The most host memory a run may count on (Linux): the least of the machine's memory
/// (`/proc/meminfo`), what is left of this process's address space under `ulimit -v`
/// (its limit less what is mapped already), and its cgroup's memory limit (a container's,
/// a Slurm job's). A recipe that fits the machine but not the limit was refused by
/// nothing, and the process was killed or aborted once it grew past it.
pub fn host_memory() -> Option<HostMemory> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_total(&t))
        .map(HostMemory::machine);
    let address_space = address_space_left().map(|bytes| HostMemory {
        bytes,
        what: ADDRESS_SPACE,
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_limit(&t, Path::new("/sys/fs/cgroup")))
        .map(|bytes| HostMemory {
            bytes,
            what: "its cgroup's memory limit (a container's or a job's)",
        });
    [machine, address_space, cgroup]
        .into_iter()
        .flatten()
        .min_by_key(|h| h.bytes)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What `HostMemory::what` says of a `ulimit -v` limit.
pub const ADDRESS_SPACE: &str = "the address space left under `ulimit -v`";

/// The address space the run's threads take for their stacks (2 MiB each, Rust's default):
/// the CPU backend's `threads` (0: one per core, or `RAYON_NUM_THREADS`), the loader's
/// workers, and four of the runner's own (signals, sampler, progress, run lock). Counted
/// against a `ulimit -v` alone: a stack is reserved, not used. Without it a run that the
/// check let through under `ulimit -v 40000` aborted (exit 134) at its first step.
pub fn thread_stacks(threads: usize, workers: usize) -> u64 {
    let threads = match threads {
        0 => std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
        n => n,
    };
    (threads + workers + 4) as u64 * (2 << 20)
}

/// Under `ulimit -v`, one malloc arena for the whole process (glibc's default, 8 per
/// core): each arena reserves 64 MiB of address space, counted against the limit though
/// never touched, so a run's threads took what its tensors needed, and an allocation
/// failed (an abort, exit 134, the summary left `running`) under a limit that a tighter
/// one (where the arenas could not be made) passed: 300 MB aborted a run that 100 MB ran.
/// Called once at the process's start, before any thread.
pub fn fewer_arenas_under_a_limit() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if address_space_limit().is_some() {
        // SAFETY: `mallopt` sets a malloc parameter; no thread allocates concurrently yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// `RLIMIT_AS`, where one is set.
fn address_space_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the limit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(limit.rlim_cur)
}

/// `RLIMIT_AS` less this process's virtual size now; `None` when unlimited.
fn address_space_left() -> Option<u64> {
    let limit = address_space_limit()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok();
    let pages: u64 = statm
        .as_deref()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Some(limit.saturating_sub(pages * 4096))
}

/// The least memory limit of this process's cgroup and those above it, from
/// `/proc/self/cgroup` (`text`) and the cgroup file system mounted at `root`: `memory.max`
/// (v2) or `memory.limit_in_bytes` (v1); `None` where none is set.
fn cgroup_limit(text: &str, root: &Path) -> Option<u64> {
    let read = |p: PathBuf| -> Option<u64> {
        // "max" (v2), or v1's "unlimited" (a page-rounded i64::MAX).
        let v: u64 = std::fs::read_to_string(p).ok()?.trim().parse().ok()?;
        (v < 1 << 60).then_some(v)
    };
    let mut least: Option<u64> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, file) = match controllers {
            "" => (root.to_path_buf(), "memory.max"),
            c if c.split(',').any(|c| c == "memory") => {
                (root.join("memory"), "memory.limit_in_bytes")
            }
            _ => continue,
        };
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            if let Some(v) = read(dir.join(file)) {
                least = Some(least.map_or(v, |l| l.min(v)));
            }
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    least
}

#[cfg(test)]
mod host_tests {
    use super::*;

    #[test]
    fn the_least_cgroup_limit_above_this_process_counts() {
        let root = crate::scratch::Scratch::new("cgroup");
        let job = root.join("slurm/uid_0/job_7");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(root.join("slurm/memory.max"), "4294967296\n").unwrap();
        std::fs::write(job.join("memory.max"), "max\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/slurm/uid_0/job_7\n", &root),
            Some(4 << 30)
        );
        std::fs::write(job.join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/slurm/uid_0/job_7\n", &root),
            Some(1 << 30)
        );
        // cgroup v1: the memory controller's hierarchy.
        let v1 = root.join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "536870912\n").unwrap();
        std::fs::write(
            root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(
            cgroup_limit("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", &root),
            Some(512 << 20)
        );
        assert_eq!(cgroup_limit("0::/\n", &root.join("none")), None);
        assert_eq!(meminfo_total("MemTotal:  1024 kB\n"), Some(1 << 20));
    }
}
