#!/usr/bin/env python3
"""torch_ref.py: a runner image recipe, trained in PyTorch, for a side-by-side ms/iter.

What it is
    The PyTorch reference for `runner`'s image recipes: it reads a *resolved* recipe (the
    output of `runner show RECIPE [--set k=v ...]`: every default filled in, data paths
    absolute), builds the same model, data pipeline, optimizer, schedule and cleanup
    policy in PyTorch, times its steps the way `runner` does (src/train/trainer.rs) and prints ONE
    JSON line on stdout. Everything else goes to stderr.

Install (any machine; PyPI's wheel is the CUDA build and also runs on a CPU-only host)
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision

Run
    runner show recipes/quickstart.toml --set run.max_steps=20 > /tmp/q.toml
    python3 scripts/torch_ref.py /tmp/q.toml [--device cuda|cpu] [--threads N] [--max-steps N]
    runner show recipes/article/default.toml | python3 scripts/torch_ref.py -
  Exit codes: 0 done, 1 the run failed, 2 a recipe or option it does not support (the
  message names the key).

What it matches
    - Models, layer for layer and parameter for parameter (src/model.rs): resnet18/34/50
      are torchvision's (`stem = "cifar"`: conv1 is 3x3 stride 1 padding 1 and the max-pool
      is dropped; the stem takes the data's channels); `small_cnn` is two
      conv(3x3, no bias)-BN-ReLU-maxpool(2) blocks (width, 2*width) then Linear(->128)-ReLU-
      Linear(->classes); `mlp` is Linear layers over the flattened image with ReLU between.
    - Data: `cifar10-bin` files (1 label byte + 3x32x32 planar bytes a record; a directory
      means its data_batch*.bin / test_batch*.bin in name order), `data.limit` and
      `data.test_limit`; `data.validation` (the same number held out of each class as the
      runner's stratified split, picked by numpy's generator, evaluated every
      `run.validate`, with `run.early_stop` applied to it); augmentation as torchvision's RandomCrop(side, padding) and
      RandomHorizontalFlip per sample; normalisation (x/255 - mean)/std, `on = "host"` as
      float32 in the loader workers, `on = "device"` as uint8 copied then normalised on the
      device. No [data.normalize] table: pixels scaled to 0..1.
    - Loader: torch DataLoader with batch_size, workers -> num_workers, pin_memory (CUDA
      only), persistent_workers, prefetch -> prefetch_factor (workers > 0), shuffle,
      drop_last, a generator seeded with `seed`; a pinned batch is copied non_blocking.
    - Optimizer: SGD (momentum, dampening 0, nesterov, weight_decay as L2 on the gradient)
      or AdamW (betas, eps, decoupled weight_decay); `accumulation_steps` k: each micro-batch
      loss weighted by its share of the step's samples (1/k when they are alike; an epoch's
      last, shorter step by its own), one optimizer step per k micro-batches, and with
      drop_last the micro-batches too few for a whole step dropped too; every schedule of src/schedule.rs (constant, cosine, step, each
      after the linear lr_warmup_steps), set per optimizer step; `label_smoothing` as
      F.cross_entropy's, `clip_grad_norm` as torch.nn.utils.clip_grad_norm_ before the step.
    - Cleanup ([cleanup] every = "never" | "step" | "epoch" | N, in recipe order):
      sync -> torch.cuda.synchronize(), empty_cache -> torch.cuda.empty_cache(),
      trim_host -> gc.collect(); on the CPU sync and empty_cache do nothing. The runner's
      article/cleanup_every_step asks for ["trim_host", "empty_cache"]: here gc.collect()
      and torch.cuda.empty_cache(), the article's cleanup; `--gc-collect` runs gc.collect()
      alone in place of the recipe's actions whenever a cleanup is due.
    - Timing, as src/train/trainer.rs: a step runs from asking for its first batch to the end of
      its logging; no device sync per step except inside `[profile] steps` (each phase then
      ends with one) and in `sync` cleanups; the losses are read back every `log.every`
      steps and at an epoch's end, and that wait lands on the step that reads. Median and
      p95 over the steps after `run.warmup_steps`, linear interpolation (numpy's default,
      like the runner). Test accuracy as `run.eval` says, outside the step times.

What it does not match
    - Initial weights and random draws (shuffle order, crops, flips) come from PyTorch's
      generators, not the runner's SplitMix64: losses agree in magnitude, not digit for digit.
    - Kernels: cuDNN / cuBLAS with PyTorch's defaults (cudnn.benchmark off unless
      `--cudnn-benchmark`; TF32 for convolutions on, for matmuls off: reported in the
      output) against Burn's CubeCL kernels with autotune. Both train in float32.
    - `synthetic` data is generated the same way (a 4x4-grid class pattern plus noise) but
      from numpy's generator, so its pixels differ.
    - Refused (exit 2): text data (`jsonl`) and the text models (bag, lstm, transformer), and
      `data.validation_file`.
      Ignored: [backend] autotune / fusion / cache_dir (Burn's), [profile] sample_ms (no
      utilisation sampler here), [log] dir / progress, [slurm], [sweep].

Output (one JSON line): name, framework, device, device_name, torch, torchvision, python,
threads, parameters, steps, timed_steps, median_ms, p95_ms, mean_ms, samples_per_s,
startup_s (process start to the end of the first step), wall_s, mem_allocated_bytes /
mem_reserved_bytes (torch.cuda.max_memory_allocated / max_memory_reserved: true peaks),
mem_in_use_after_step_bytes / mem_reserved_after_step_bytes (largest reading after a step,
before its cleanup: what the runner's peak_mem_in_use_bytes / peak_mem_reserved_bytes measure), peak_rss_bytes,
data_wait_pct, cleanup_ms_total, cleanup_pct, first_losses, final_loss, test_accuracy, and
the settings that shape the kernels.
"""

import argparse
import gc
import json
import math
import os
import platform
import resource
import sys
import time


def _process_start() -> float:
    """When this process started, in seconds since boot (CLOCK_BOOTTIME, the clock of
    /proc/self/stat's starttime), so start-up includes the interpreter and `import torch`."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, counted after the ")"-ended comm
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.clock_gettime(time.CLOCK_BOOTTIME)


PROCESS_START = _process_start()
if not 0 <= time.clock_gettime(time.CLOCK_BOOTTIME) - PROCESS_START < 60:
    PROCESS_START = time.clock_gettime(time.CLOCK_BOOTTIME)  # a clock we cannot trust: from here


def since_start() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) - PROCESS_START


def log(*a):
    print("torch_ref:", *a, file=sys.stderr, flush=True)


class Unsupported(Exception):
    """A recipe key or value this reference does not implement (exit 2)."""


def refuse(key, value, why):
    raise Unsupported(f"{key} = {value!r}: {why}")


def load_toml(path):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            sys.exit("torch_ref: needs Python 3.11+ (tomllib) or `pip install tomli`")
    if path == "-":
        return tomllib.loads(sys.stdin.read())
    with open(path, "rb") as f:
        return tomllib.load(f)


# ---------------------------------------------------------------------------------------
# The recipe: what this script reads, checked before torch is imported.


class Recipe:
    """The keys torch_ref uses, with the runner's defaults for any a hand-written file
    leaves out; unsupported values raise Unsupported naming the key."""

    def __init__(self, r, args):
        self.name = r.get("name", "recipe")
        self.seed = int(r.get("seed", 0))
        if "padding" in r:
            refuse("padding", "...", "text data is not supported (image recipes only)")
        b = r.get("backend", {})
        self.backend_kind = b.get("kind", "auto")
        self.cuda_index = int(b.get("device", 0))
        self.threads = int(b.get("threads", 0))

        m = r.get("model", {})
        self.arch = m.get("arch")
        if self.arch is None:
            refuse("model.arch", None, "missing; give a resolved recipe (`runner show RECIPE`)")
        if self.arch not in ("resnet18", "resnet34", "resnet50", "small_cnn", "mlp"):
            refuse("model.arch", self.arch,
                   "not supported: resnet18, resnet34, resnet50, small_cnn and mlp are")
        self.stem = m.get("stem", "cifar")
        if self.stem not in ("cifar", "imagenet"):
            refuse("model.stem", self.stem, "must be cifar or imagenet")
        self.num_classes = m.get("num_classes")
        self.width = int(m.get("width", 32))
        self.hidden = [int(h) for h in m.get("hidden", [256])]

        d = r.get("data", {})
        self.format = d.get("format")
        if self.format not in ("cifar10-bin", "synthetic"):
            refuse("data.format", self.format,
                   "not supported: cifar10-bin and synthetic are (text data is not)")
        self.train_path = d.get("train")
        self.test_path = d.get("test")
        if self.format == "cifar10-bin" and not self.train_path:
            refuse("data.train", None, "missing")
        for key, p in (("data.train", self.train_path), ("data.test", self.test_path)):
            if p and not os.path.isabs(p):
                refuse(key, p, "a relative path: give the resolved recipe (`runner show`), "
                       "whose paths are absolute")
        self.limit = d.get("limit")
        self.test_limit = d.get("test_limit")
        if d.get("validation_file"):
            refuse("data.validation_file", d["validation_file"],
                   "not supported; data.validation (a fraction held out) is")
        self.validation = d.get("validation")
        if self.validation is not None and not 0.0 < float(self.validation) < 1.0:
            refuse("data.validation", self.validation, "must be a fraction between 0 and 1")
        n = d.get("normalize")
        if n is None:
            self.mean, self.std, self.norm_on = [0.0], [1.0], "host"
        else:
            self.mean = [float(v) for v in n.get("mean", [0.5])]
            self.std = [float(v) for v in n.get("std", [0.5])]
            self.norm_on = n.get("on", "host")
            if self.norm_on not in ("host", "device"):
                refuse("data.normalize.on", self.norm_on, "must be host or device")
        a = d.get("augment", {})
        self.crop_padding = int(a.get("crop_padding", 0))
        self.hflip = bool(a.get("hflip", False))
        s = d.get("synthetic", {})
        self.syn = dict(samples=int(s.get("samples", 1024)),
                        test_samples=int(s.get("test_samples", 256)),
                        classes=int(s.get("classes", 10)),
                        image_size=int(s.get("image_size", 32)),
                        channels=int(s.get("channels", 3)))

        lo = r.get("loader", {})
        self.batch_size = int(lo.get("batch_size", 64))
        self.workers = int(lo.get("workers", 0))
        self.pin_memory = bool(lo.get("pin_memory", False))
        self.persistent_workers = bool(lo.get("persistent_workers", False))
        self.prefetch = int(lo.get("prefetch", 2))
        self.shuffle = bool(lo.get("shuffle", True))
        self.drop_last = bool(lo.get("drop_last", False))

        o = r.get("optim", {})
        self.optimizer = o.get("optimizer", "sgd")
        if self.optimizer not in ("sgd", "adamw"):
            refuse("optim.optimizer", self.optimizer, "must be sgd or adamw")
        self.lr = float(o.get("lr", 0.01))
        self.momentum = float(o.get("momentum", 0.0))
        self.weight_decay = float(o.get("weight_decay", 0.01 if self.optimizer == "adamw" else 0.0))
        self.nesterov = bool(o.get("nesterov", False))
        self.betas = tuple(float(v) for v in o.get("betas", [0.9, 0.999]))
        self.eps = float(o.get("eps", 1e-8))
        self.accum = int(o.get("accumulation_steps", 1))
        self.schedule = o.get("schedule", "constant")
        if self.schedule not in ("constant", "cosine", "step"):
            refuse("optim.schedule", self.schedule, "must be constant, cosine or step")
        self.lr_warmup = int(o.get("lr_warmup_steps", 0))
        self.min_lr = float(o.get("min_lr", 0.0))
        self.step_size = int(o.get("step_size", 1000))
        self.gamma = float(o.get("gamma", 0.1))
        self.label_smoothing = float(o.get("label_smoothing", 0.0))
        clip = o.get("clip_grad_norm")
        self.clip_grad_norm = None if clip is None else float(clip)

        c = r.get("cleanup", {})
        every = c.get("every", "never")
        if isinstance(every, bool) or not (
            every in ("never", "step", "epoch") or (isinstance(every, int) and every >= 1)
        ):
            refuse("cleanup.every", every, 'must be "never", "step", "epoch" or a positive integer')
        self.every = every
        self.actions = list(c.get("actions", ["sync", "empty_cache"]))
        for act in self.actions:
            if act not in ("sync", "empty_cache", "trim_host"):
                refuse("cleanup.actions", act, "must be sync, empty_cache or trim_host")

        ru = r.get("run", {})
        self.epochs = int(ru.get("epochs", 1))
        self.max_steps = ru.get("max_steps")
        if args.max_steps is not None:
            self.max_steps = args.max_steps
        self.warmup_steps = int(ru.get("warmup_steps", 5))
        if args.warmup_steps is not None:
            self.warmup_steps = args.warmup_steps
        self.eval = ru.get("eval", "end")
        if self.eval not in ("epoch", "end", "never"):
            refuse("run.eval", self.eval, "must be epoch, end or never")
        self.validate = ru.get("validate", "epoch")
        if isinstance(self.validate, bool) or not (
            self.validate == "epoch" or (isinstance(self.validate, int) and self.validate >= 1)
        ):
            refuse("run.validate", self.validate, 'must be "epoch" or a positive integer')
        es = ru.get("early_stop", {})
        self.es_metric = es.get("metric", "val_loss")
        if self.es_metric not in ("val_loss", "val_accuracy"):
            refuse("run.early_stop.metric", self.es_metric, "must be val_loss or val_accuracy")
        self.es_patience = int(es.get("patience", 3))
        self.es_min_delta = float(es.get("min_delta", 0.0))
        self.es_mode = es.get("mode", "min" if self.es_metric == "val_loss" else "max")
        if self.es_mode not in ("min", "max"):
            refuse("run.early_stop.mode", self.es_mode, "must be min or max")

        self.profile_window = None
        steps = r.get("profile", {}).get("steps")
        if steps:
            self.profile_window = parse_steps(steps)
            if self.profile_window is None:
                refuse("profile.steps", steps, 'must be "A..B" or "A..=B", 1-based')
        self.log_every = max(1, int(r.get("log", {}).get("every", 1)))


def parse_steps(text):
    """"20..30" -> range 20..=29; "20..=30" -> 20..=30 (as src/plan/mod.rs parse_steps)."""
    inclusive = "..=" in text
    a, _, b = text.partition("..=" if inclusive else "..")
    try:
        a, b = int(a), int(b)
    except ValueError:
        return None
    end = b if inclusive else b - 1
    return (a, end) if a >= 1 and end >= a else None


def lr_at(rc, step, total):
    """src/schedule.rs: the rate of optimizer step `step` (0-based)."""
    if step < rc.lr_warmup:
        return rc.lr * (step + 1) / rc.lr_warmup
    t = step - rc.lr_warmup
    if rc.schedule == "constant":
        return rc.lr
    if rc.schedule == "step":
        return rc.lr * rc.gamma ** (t // max(rc.step_size, 1))
    span = max(total - rc.lr_warmup - 1, 0)
    p = 1.0 if span == 0 else min(t / span, 1.0)
    return rc.min_lr + 0.5 * (rc.lr - rc.min_lr) * (1.0 + math.cos(math.pi * p))


def quantile(sorted_v, q):
    """Linear interpolation between closest ranks (src/metrics.rs quantile)."""
    pos = q * (len(sorted_v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_v[lo] + (sorted_v[hi] - sorted_v[lo]) * (pos - lo)


# ---------------------------------------------------------------------------------------
# Data (numpy only here, so loader workers do not need more than torch + numpy).

RECORD = 1 + 3 * 32 * 32


def cifar_files(path, stem):
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.startswith(stem) and f.endswith(".bin"))
        if not files:
            raise FileNotFoundError(f"{path}: no {stem}*.bin file")
        return files
    return [path]


def read_cifar(path, stem, limit):
    """(pixels uint8 [N, 3, 32, 32], labels int64 [N]) of the first `limit` records."""
    import numpy as np

    parts = []
    have = 0
    for f in cifar_files(path, stem):
        if limit is not None and have >= limit:
            break
        raw = np.fromfile(f, dtype=np.uint8)
        if raw.size == 0 or raw.size % RECORD:
            raise ValueError(f"{f}: {raw.size} bytes is not a whole number of {RECORD}-byte records")
        recs = raw.reshape(-1, RECORD)
        if limit is not None:
            recs = recs[: limit - have]
        parts.append(recs)
        have += len(recs)
    recs = np.concatenate(parts)
    pixels = np.ascontiguousarray(recs[:, 1:]).reshape(-1, 3, 32, 32)
    labels = recs[:, 0].astype(np.int64)
    return pixels, labels


def stratified_split(labels, held, seed):
    """(kept, held) index arrays: `held` samples, each class giving its share by largest
    remainder, as the runner's data::stratified_split (the samples themselves are numpy's
    picks, not the runner's: the same counts, so the same batches and steps)."""
    import numpy as np
    n = len(labels)
    classes = sorted(set(int(l) for l in labels))
    members = {c: np.flatnonzero(labels == c) for c in classes}
    exact = {c: held * len(members[c]) / max(n, 1) for c in classes}
    quota = {c: math.floor(exact[c]) for c in classes}
    left = held - sum(quota.values())
    for c in sorted(classes, key=lambda c: (-(exact[c] - quota[c]), classes.index(c))):
        if left == 0:
            break
        if quota[c] < len(members[c]):
            quota[c] += 1
            left -= 1
    rng = np.random.default_rng(seed)
    is_held = np.zeros(n, dtype=bool)
    for c in classes:
        is_held[rng.permutation(members[c])[: quota[c]]] = True
    return np.flatnonzero(~is_held), np.flatnonzero(is_held)


def class_count(path):
    """Lines of batches.meta.txt beside the (first) file, else 10 (src/data/cifar.rs)."""
    first = cifar_files(path, "data_batch")[0]
    meta = os.path.join(os.path.dirname(first), "batches.meta.txt")
    try:
        with open(meta) as f:
            names = [line for line in f.read().splitlines() if line.strip()]
        return len(names) or 10
    except OSError:
        return 10


def synthetic(s, seed, split):
    """Class patterns (a 4x4 grid per channel, upsampled, 40..215) plus uniform noise of
    +-60, clamped; labels cycle through the classes (src/data/synthetic.rs, numpy's draws)."""
    import numpy as np

    c, side, k = s["channels"], s["image_size"], s["classes"]
    n = s["samples"] if split == 0 else s["test_samples"]
    root = np.random.default_rng([seed, 0x5EED])
    grids = 40.0 + 175.0 * root.random((k, c, 4, 4))
    idx = np.arange(side) * 4 // side
    patterns = grids[:, :, idx][:, :, :, idx]  # [k, c, side, side]
    labels = np.arange(n) % k
    noise = (np.random.default_rng([seed, 1 + split]).random((n, c, side, side)) - 0.5) * 120.0
    pixels = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
    return pixels, labels.astype(np.int64)


class ImageSet:
    """A map-style dataset over uint8 images: per-sample torchvision transforms in the
    loader workers, as a PyTorch training script has them."""

    def __init__(self, pixels, labels, transform):
        self.pixels = pixels
        self.labels = labels
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        import torch

        x = torch.from_numpy(self.pixels[i])
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[i])


def make_transform(rc, side, channels, train):
    import torch
    from torchvision.transforms import v2

    steps = []
    if train and rc.crop_padding > 0:
        steps.append(v2.RandomCrop(side, padding=rc.crop_padding))
    if train and rc.hflip:
        steps.append(v2.RandomHorizontalFlip())
    if rc.norm_on == "host":
        steps.append(v2.ToDtype(torch.float32, scale=True))
        steps.append(v2.Normalize(widen(rc.mean, channels), widen(rc.std, channels)))
    elif not steps:
        return None
    return v2.Compose(steps)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def widen(v, channels):
    if len(v) == 1:
        return v * channels
    if len(v) != channels:
        raise Unsupported(f"data.normalize: {len(v)} values for {channels} channels")
    return list(v)


# ---------------------------------------------------------------------------------------
# Models, as src/model.rs builds them.


def build_model(rc, channels, side, classes):
    import torch.nn as nn

    if rc.arch.startswith("resnet"):
        import torchvision

        net = getattr(torchvision.models, rc.arch)(num_classes=classes)
        if rc.stem == "cifar":
            net.conv1 = nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        elif channels != 3:
            net.conv1 = nn.Conv2d(channels, 64, 7, stride=2, padding=3, bias=False)
        return net
    if rc.arch == "small_cnn":
        w = rc.width
        return nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * w * (side // 4) * (side // 4), 128), nn.ReLU(),
            nn.Linear(128, classes),
        )
    sizes = [channels * side * side] + rc.hidden + [classes]
    layers = [nn.Flatten()]
    for i in range(len(sizes) - 1):
        if i > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Train a resolved runner image recipe in PyTorch; print one JSON line.")
    p.add_argument("recipe", help="resolved recipe TOML (`runner show RECIPE`), or - for stdin")
    p.add_argument("--device", choices=["cuda", "cpu"],
                   help="default: from backend.kind (auto: cuda when available)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: backend.threads, "
                   "0 = torch's default)")
    p.add_argument("--max-steps", type=int, help="override run.max_steps")
    p.add_argument("--warmup-steps", type=int, help="override run.warmup_steps")
    p.add_argument("--gc-collect", action="store_true",
                   help="run gc.collect() in place of the recipe's cleanup actions when one is due "
                   "(the article's PyTorch loop)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True (default off, PyTorch's default)")
    args = p.parse_args(argv)

    try:
        rc = Recipe(load_toml(args.recipe), args)
    except Unsupported as e:
        print(f"torch_ref: unsupported recipe: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"torch_ref: cannot read {args.recipe}: {e}", file=sys.stderr)
        return 2

    import torch
    import torch.nn.functional as F
    import numpy as np
    import torchvision

    if args.device:
        device_kind = args.device
    elif rc.backend_kind == "cpu":
        device_kind = "cpu"
    elif rc.backend_kind == "cuda":
        device_kind = "cuda"
    else:
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    if device_kind == "cuda" and not torch.cuda.is_available():
        print("torch_ref: backend.kind / --device is cuda, but torch sees no GPU "
              "(pass --device cpu)", file=sys.stderr)
        return 2
    cuda = device_kind == "cuda"
    device = torch.device(f"cuda:{rc.cuda_index}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    threads = args.threads if args.threads is not None else rc.threads
    if threads > 0:
        torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    torch.manual_seed(rc.seed)

    # Data.
    if rc.format == "cifar10-bin":
        train_px, train_y = read_cifar(rc.train_path, "data_batch", rc.limit)
        test_px = test_y = None
        if rc.test_path and rc.eval != "never":
            test_px, test_y = read_cifar(rc.test_path, "test_batch", rc.test_limit)
        classes = rc.num_classes or class_count(rc.train_path)
    else:
        train_px, train_y = synthetic(rc.syn, rc.seed, 0)
        if rc.limit is not None:
            train_px, train_y = train_px[: rc.limit], train_y[: rc.limit]
        test_px, test_y = synthetic(rc.syn, rc.seed, 1)
        if rc.test_limit is not None:
            test_px, test_y = test_px[: rc.test_limit], test_y[: rc.test_limit]
        classes = rc.num_classes or rc.syn["classes"]
    val_px = val_y = None
    if rc.validation is not None:
        # As plan/data.rs: round(fraction x training samples), at least one left to train on.
        held = min(round(float(rc.validation) * len(train_y)), max(len(train_y) - 1, 0))
        kept, held_idx = stratified_split(train_y, held, rc.seed)
        val_px, val_y = train_px[held_idx], train_y[held_idx]
        train_px, train_y = train_px[kept], train_y[kept]
    channels, side = train_px.shape[1], train_px.shape[2]
    if test_px is not None and len(test_y) == 0:
        test_px = test_y = None
    eval_mode = rc.eval if test_px is not None else "never"

    pin = rc.pin_memory and cuda
    loader_kw = dict(batch_size=rc.batch_size, shuffle=rc.shuffle, num_workers=rc.workers,
                     pin_memory=pin, drop_last=rc.drop_last,
                     generator=torch.Generator().manual_seed(rc.seed))
    if rc.workers > 0:
        loader_kw.update(persistent_workers=rc.persistent_workers, prefetch_factor=rc.prefetch)
    loader = torch.utils.data.DataLoader(
        ImageSet(train_px, train_y, make_transform(rc, side, channels, True)), **loader_kw)
    micro_per_epoch = len(loader)
    if rc.drop_last:
        # As the runner: what does not make a whole optimizer step is dropped too.
        micro_per_epoch -= micro_per_epoch % rc.accum
    if micro_per_epoch == 0:
        print("torch_ref: loader.drop_last drops every batch (or every step)", file=sys.stderr)
        return 2
    steps_per_epoch = -(-micro_per_epoch // rc.accum)
    total = steps_per_epoch * rc.epochs
    if rc.max_steps is not None:
        total = min(total, int(rc.max_steps))

    # Device-side normalisation: (x/255 - mean)/std as one multiply-add per channel.
    scale = shift = None
    if rc.norm_on == "device":
        m, s = widen(rc.mean, channels), widen(rc.std, channels)
        scale = torch.tensor([1.0 / (255.0 * v) for v in s], device=device).view(1, -1, 1, 1)
        shift = torch.tensor([-a / b for a, b in zip(m, s)], device=device).view(1, -1, 1, 1)

    def to_device(x, y):
        x = x.to(device, non_blocking=pin)
        y = y.to(device, non_blocking=pin)
        if scale is not None:
            x = x.float() * scale + shift
        return x, y

    model = build_model(rc, channels, side, classes).to(device)
    parameters = sum(t.numel() for t in model.parameters() if t.requires_grad)
    if rc.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=rc.lr, momentum=rc.momentum, dampening=0.0,
                              weight_decay=rc.weight_decay, nesterov=rc.nesterov)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=rc.lr, betas=rc.betas, eps=rc.eps,
                                weight_decay=rc.weight_decay)
    model.train()
    device_name = torch.cuda.get_device_name(device) if cuda else cpu_name()
    log(f"{rc.name}: {rc.arch} on {device_name}, {parameters} parameters, {total} steps "
        f"({steps_per_epoch}/epoch), batch {rc.batch_size} x {rc.accum}, workers {rc.workers}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def cleanup(actions):
        if args.gc_collect:
            gc.collect()
            return
        for act in actions:
            if act == "sync":
                sync()
            elif act == "empty_cache":
                if cuda:
                    torch.cuda.empty_cache()
            else:  # trim_host
                gc.collect()

    def due(point, step):
        if point == "step":
            return rc.every == "step" or (isinstance(rc.every, int) and step % rc.every == 0)
        return rc.every == "epoch"

    def evaluate(pixels=None, labels=None):
        if pixels is None:
            pixels, labels = test_px, test_y
        t = time.perf_counter()
        model.eval()
        tf = make_transform(rc, side, channels, False)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        loss_total = torch.zeros((), device=device)
        with torch.no_grad():
            for i in range(0, len(labels), rc.batch_size):
                xs = torch.from_numpy(pixels[i:i + rc.batch_size])
                x = tf(xs) if tf is not None else xs
                x, y = to_device(x, torch.from_numpy(labels[i:i + rc.batch_size]))
                out = model(x)
                loss_total += F.cross_entropy(out, y, reduction="sum")
                correct += (out.argmax(1) == y).sum()
        model.train()
        n = len(labels)
        return dict(accuracy=correct.item() / n, loss=loss_total.item() / n,
                    ms=(time.perf_counter() - t) * 1e3)

    validations = []
    watch = dict(best=None, since=0, stopped_at=None)

    def validate(epoch):
        """Evaluates the held-out set (outside the step times); True when early stopping
        says the run ends here (no better metric for `patience` validations)."""
        v = evaluate(val_px, val_y)
        v.update(epoch=epoch, step=step)
        validations.append(v)
        value = v["loss"] if rc.es_metric == "val_loss" else v["accuracy"]
        best = watch["best"]
        better = best is None or (value < best - rc.es_min_delta if rc.es_mode == "min"
                                  else value > best + rc.es_min_delta)
        if better:
            watch["best"], watch["since"] = value, 0
        else:
            watch["since"] += 1
        log(f"validation after step {step}: accuracy {100 * v['accuracy']:.2f}%, "
            f"loss {v['loss']:.4f}")
        if watch["since"] >= rc.es_patience:
            watch["stopped_at"] = step
            log(f"early stop after step {step}: no better {rc.es_metric} for "
                f"{rc.es_patience} validations")
            return True
        return False

    records = []  # per step: iter_ms, samples, data_wait_ms, cleanup_ms, loss
    pending = []  # (record, loss tensor) whose loss is still on the device
    evals = []
    mem_after = [0, 0]
    startup_s = None

    def flush():
        if not pending:
            return
        t = time.perf_counter()
        values = torch.stack([l for _, l in pending]).tolist()
        log_ms = (time.perf_counter() - t) * 1e3
        pending[-1][0]["iter_ms"] += log_ms
        for (r, _), v in zip(pending, values):
            r["loss"] = v
        pending.clear()

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    step = 0
    try:
        for epoch in range(rc.epochs):
            batches = iter(loader)
            left = micro_per_epoch
            while left > 0 and step < total:
                synced = rc.profile_window is not None and (
                    rc.profile_window[0] <= step + 1 <= rc.profile_window[1])
                if synced:
                    sync()
                started = time.perf_counter()
                group = min(rc.accum, left)
                left -= group
                lr = lr_at(rc, step, total)
                for g in opt.param_groups:
                    g["lr"] = lr
                rec = dict(step=step + 1, samples=0, data_wait_ms=0.0, cleanup_ms=0.0)
                loss_sum = None
                # The step's batches first: each micro-batch's loss is weighted by its share
                # of the step's samples, as the runner's (a short one weighs less).
                drawn = []
                for _ in range(group):
                    t = time.perf_counter()
                    drawn.append(next(batches))
                    rec["data_wait_ms"] += (time.perf_counter() - t) * 1e3
                total_samples = sum(len(y) for _, y in drawn)
                for x, y in drawn:
                    rec["samples"] += len(y)
                    parts = float(np.float32(total_samples) / np.float32(len(y)))
                    x, y = to_device(x, y)
                    if synced:
                        sync()
                    loss = F.cross_entropy(model(x), y, label_smoothing=rc.label_smoothing)
                    (loss / parts if group > 1 else loss).backward()
                    weighted = loss.detach() / parts if group > 1 else loss.detach()
                    loss_sum = weighted if loss_sum is None else loss_sum + weighted
                    if synced:
                        sync()
                if rc.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), rc.clip_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if synced:
                    sync()
                step += 1
                actions = list(rc.actions) if due("step", step) else []
                epoch_done = left == 0 or step == total
                if epoch_done and due("epoch", step):
                    actions += rc.actions
                # As the runner reads a step's memory: after it, before its cleanup.
                if cuda:
                    mem_after[0] = max(mem_after[0], torch.cuda.memory_allocated(device))
                    mem_after[1] = max(mem_after[1], torch.cuda.memory_reserved(device))
                if actions:
                    t = time.perf_counter()
                    cleanup(actions)
                    if synced:
                        sync()
                    rec["cleanup_ms"] = (time.perf_counter() - t) * 1e3
                rec["iter_ms"] = (time.perf_counter() - started) * 1e3
                records.append(rec)
                pending.append((rec, loss_sum))
                if len(pending) >= rc.log_every or epoch_done:
                    flush()
                if startup_s is None:
                    startup_s = since_start()
                if (val_y is not None and isinstance(rc.validate, int)
                        and step % rc.validate == 0 and validate(epoch)):
                    break
            del batches  # non-persistent workers stop here, as the runner's do per epoch
            if (val_y is not None and rc.validate == "epoch" and watch["stopped_at"] is None
                    and left == 0):
                validate(epoch)
            cut_short = left > 0 and watch["stopped_at"] is None
            last = epoch + 1 == rc.epochs or step >= total or watch["stopped_at"] is not None
            if (eval_mode == "epoch" and (not cut_short or last)) or (eval_mode == "end" and last):
                e = evaluate()
                e.update(epoch=epoch, step=step)
                evals.append(e)
                log(f"eval after step {step}: accuracy {100 * e['accuracy']:.2f}%, "
                    f"loss {e['loss']:.4f}")
            if step >= total or watch["stopped_at"] is not None:
                break
        flush()
    except Exception as e:  # a failed run still says what it is, on stderr, and exits 1
        log(f"run failed at step {step + 1}: {type(e).__name__}: {e}")
        return 1
    wall_s = since_start()

    timed = [r for r in records if r["step"] > rc.warmup_steps]
    iters = sorted(r["iter_ms"] for r in timed)
    timed_ms = sum(iters)
    med = quantile(iters, 0.5) if iters else None
    p95 = quantile(iters, 0.95) if iters else None

    def pct(key):  # share of the timed steps' time
        return 100.0 * sum(r[key] for r in timed) / timed_ms if timed_ms > 0 else None

    def rnd(v, k=3):
        return None if v is None else round(v, k)

    out = dict(
        name=rc.name,
        framework="pytorch",
        arch=rc.arch,
        device=str(device),
        device_name=device_name,
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        python=platform.python_version(),
        threads=torch.get_num_threads(),
        parameters=parameters,
        batch_size=rc.batch_size,
        accumulation_steps=rc.accum,
        workers=rc.workers,
        mp_start_method=(torch.multiprocessing.get_start_method(allow_none=True) or
                         torch.multiprocessing.get_context().get_start_method()) if rc.workers else None,
        steps=len(records),
        warmup_steps=rc.warmup_steps,
        timed_steps=len(timed),
        median_ms=rnd(med),
        p95_ms=rnd(p95),
        mean_ms=rnd(timed_ms / len(iters)) if iters else None,
        samples_per_s=rnd(sum(r["samples"] for r in timed) / (timed_ms / 1e3), 1) if timed_ms > 0 else None,
        startup_s=rnd(startup_s),
        wall_s=rnd(wall_s),
        mem_allocated_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
        mem_reserved_bytes=torch.cuda.max_memory_reserved(device) if cuda else None,
        mem_in_use_after_step_bytes=mem_after[0] if cuda else None,
        mem_reserved_after_step_bytes=mem_after[1] if cuda else None,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        data_wait_pct=rnd(pct("data_wait_ms"), 2),
        cleanup_ms_total=rnd(sum(r["cleanup_ms"] for r in records)),
        cleanup_pct=rnd(pct("cleanup_ms"), 2),
        cleanup=dict(every=rc.every, actions=["gc_collect"] if args.gc_collect else rc.actions),
        first_losses=[rnd(r.get("loss"), 4) for r in records[:5]],
        final_loss=rnd(records[-1].get("loss"), 5) if records else None,
        test_accuracy=rnd(evals[-1]["accuracy"], 4) if evals else None,
        validation_samples=len(val_y) if val_y is not None else None,
        validations=len(validations),
        early_stopped_at_step=watch["stopped_at"],
        schedule=rc.schedule,
        normalize_on=rc.norm_on,
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        tf32_conv=torch.backends.cudnn.allow_tf32 if cuda else None,
        tf32_matmul=torch.backends.cuda.matmul.allow_tf32 if cuda else None,
    )
    log(f"{rc.name}: {len(records)} steps, median {med if med is None else round(med, 2)} ms/iter "
        f"(p95 {p95 if p95 is None else round(p95, 2)}), final loss {out['final_loss']}, "
        f"start-up {out['startup_s']} s")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
