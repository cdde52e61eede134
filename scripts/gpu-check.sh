#!/usr/bin/env bash
# The GPU check, in one call of under 10 minutes on a lent GPU machine (one H200, python3 +
# torch + torchvision, no network). A session gets 15 minutes of device time, the machine's
# start included, so plan for this one call: it runs an ordered PLAN of steps, the most
# wanted first, writes each result as it ends, and skips what the budget has no room for.
#   startup:ARCH  start-up of ARCH (mlp, small_cnn, resnet18, resnet50) at batch 64 with
#                 article/default's data and loader: runner twice, first cold (an empty
#                 kernel cache of its own, .runner-cache/ARCH), then warm (the same cache):
#                 the summary's startup_s (process start to the first step), first_step_ms,
#                 median ms/iter and kernel counts (compiled / from cache / tuned / tunings
#                 loaded), and whether the cache was empty when the run began.
#   cold:ARCH     the cold run of startup:ARCH alone (for ResNet-50, the article recipes'
#                 runs that follow it are the warm start-ups, with their cache's file count).
#   compare:RECIPE  runner, then scripts/torch_ref.py, on the same resolved recipe (`runner
#                 show`): median ms/iter of each, their ratio, the runner's GPU utilisation
#                 and memory, torch's memory, start-up of each. The runner uses the kernel
#                 cache of the recipe's model.arch, so after cold:resnet50 the ResNet-50
#                 recipes start warm. A recipe named again is a further repeat.
#   runner:RECIPE the runner alone, as compare does it (e.g. with profile.sample_ms=0:
#                 the NVML sampler off, against compare's runs with it on).
#   gc            torch_ref on article/cleanup_every_step with --gc-collect: gc.collect()
#                 alone per step, without the empty_cache.
#   kernels:RECIPE  where a step's device time goes: the runner alone for KERNEL_STEPS
#                 steps with CubeCL's profiler on (a cubecl.toml in its working directory:
#                 every kernel launch waits for the device and is timed), into
#                 kernels-RECIPE.md: the kernels by total device time, with launches per
#                 step (and the raw log, gzipped). With the recipe's kernel cache, so after
#                 compare:RECIPE it neither compiles nor tunes.
#   A startup, cold, compare, runner or kernels step may name a variant, overrides after commas,
#   (a value may be an array or a table, its commas kept, written without spaces:
#   cold:mlp,model.hidden=[4096,4096]), e.g. startup:resnet50,backend.fusion=false or
#   compare:article/default,backend.autotune=minimal: a variant with backend.* settings has
#   its own kernel cache (other settings compile other kernels), so its first run is cold
#   too. This is how the backend.autotune / backend.fusion / backend.conv defaults are to
#   be chosen.
#   together:STEP+STEP+...  cold:/warm:/startup: steps at the same time, each its own
#                 process and cache, TOGETHER_STEPS steps each under one timeout (T_TOGETHER):
#                 a cold start compiles on one CPU thread with the GPU nearly idle, so six
#                 cost the call one cold start's time. Their ms/iter is not a steady state.
#   warm:ARCH     the warm run of startup:ARCH alone.
# The default PLAN (see PLAN= below): the cold starts together (those of three other
# backend.conv_kernel values, of backend.conv_split = "off", of backend.norm_sums =
# "reduce", and of the MLP and the small CNN with backend.matmul = "autotune" among them), then one at a time the headline ratio (article/default), the same
# without fusion, without the split weight gradients, then with the batch norm's sums by Burn's reductions,
# the article's other rows and resnet50_accum beside PyTorch,
# article/default with each of those conv kernels, article/default without the NVML sampler and then without the per-step pool
# reading (profile.memory=false: each one's cost per step, against the runs with both on),
# the kernels table, the warm starts (the MLP's with each backend.matmul), gc, tuned_loader without pinned memory,
# losses read every 10 steps, and a second repeat of the two headline rows. A step whose
# runner run fails outright (not a timeout) ends the plan when it is the plan's first runner
# run: the binary does not work there, and the device time left is better spent on a rerun
# with a fixed one. `nvidia-smi` samples memory and utilisation beside the first runner run
# of article/default (the cross-check of the runner's figures). Each runner row has the
# time its steps spent asking Burn's pool for memory figures (summary.phases).
#
# Measured with it on 2026-12-04 (BENCHMARKS.md, "GPU (CUDA)"): a whole call of the old
# serial plan could not get past the cold starts, hence together:.
#
# With this project's device tool (the machine gets a copy of the work tree, and $OUT back):
#   here:    cargo build --release --features cuda
#            mkdir -p .device && strip -o .device/runner target/release/runner
#            xz -9 -f .device/runner                           # -> .device/runner.xz
#            and, to check every backend.conv_kernel against the definition there:
#            cargo test --release --features cuda --lib --no-run   # prints its path
#            strip -o .device/runner-tests target/release/deps/runner-<hash>
#            xz -9 -f .device/runner-tests                     # -> .device/runner-tests.xz
#            .device/ (and .runner-cache/) must be listed in .gitignore, so the binary is
#            never committed; an ignored folder travels only when named: carry [".device"]
#   device:  run(command="BUDGET=550 bash scripts/gpu-check.sh .device/runner.xz",
#                carry=[".device"], timeout_s=600)
#            The machine stays warm 30 s after a call and keeps ignored folders
#            (.runner-cache/ among them), so a second call made at once finds the caches.
#   warm:    copy the cache.tar.gz an earlier call brought back into .device/, then
#            CACHE_IN=.device/cache.tar.gz bash scripts/gpu-check.sh .device/runner.xz
#            (every cache starts full, so no run is cold; the tables say so per run); a
#            second call would rather measure what the first had no time for, e.g.
#            PLAN="compare:article/tuned_loader compare:resnet50_accum ..."
#
# Without a GPU (a dry run of the whole script on this machine's CPU):
#   DEVICE=cpu MAX_STEPS=3 WARMUP=1 STARTUP_STEPS=3 STARTUP_WARMUP=1 \
#     PLAN="startup:mlp compare:article/default gc" EXTRA_SETS=loader.batch_size=8 \
#     PYTHON=/tmp/torchenv/bin/python3 RUNNER_CACHE_DIR=/tmp/rc OUT=/tmp/gc-out \
#     bash scripts/gpu-check.sh target/release/runner
#
# Settings (environment): OUT (default ./gpu-check-out); BUDGET (540): seconds after which
# the remaining runs are skipped (each run's timeout is also cut to what is left; with less
# than 600 s of device time left, give the tool's limit_s minus 60); PLAN (as
# above); STARTUP_STEPS (60) / STARTUP_WARMUP (20) for start-ups; MAX_STEPS (80) / WARMUP
# (20) for compares, which also set run.eval=never; KERNEL_STEPS (10) for kernels;
# TOGETHER_STEPS (8) / TOGETHER_WARMUP (3) for together:; timeouts in seconds: T_COLD (150;
# 330 for resnet50: T_COLD_BIG), T_WARM (60), T_RUN (120), T_TOGETHER (220); LIMIT
# (BUDGET + 50: when packing must be done); DEVICE (cuda; wgpu: a dry run
# through CubeCL on Mesa's software Vulkan with a `--features wgpu` runner; or cpu: --set
# backend.kind=cpu, torch_ref --device cpu, no nvidia-smi); PYTHON (python3: the one with
# torch); RUNNER_CACHE_DIR (default $PWD/.runner-cache: one kernel cache per model.arch
# below it); CACHE_IN (a cache.tar.gz unpacked into it first); FRESH_CACHE=1 (empty it
# first); EXTRA_SETS (more KEY=VALUE overrides for every run, space-separated, e.g.
# "loader.batch_size=8"); TESTS (the CUDA unit-test binary, default runner-tests.xz beside
# the runner: its conv-kernel, batch-norm, fixed-matmul and weight-layout checks run in the background on CUDA; T_SELFTEST, 300 s).
#
# $OUT (the device tool brings back 8 files at most; this makes 7 with one kernels step
# that ran, 8 with two): log.txt (everything, nvidia-smi and versions first),
# kernels-*.md (each kernels step that ran; its raw log is in runs.tar.gz),
# results.tsv (a row per run, appended as each ends), gpu-table.md (both tables, rewritten
# after each run, printed at the end, then every autotune result in the caches: each tuned
# key with every candidate's median time), nvidia-smi.csv (memory and utilisation every
# 500 ms beside the first runner run of article/default), runs.tar.gz (every run directory
# without its weights and checkpoints, which would make it hundreds of MiB, and torch_ref's
# JSON lines), cache.tar.gz (the autotune results, small, always; the compiled kernels too
# if packing them ends before LIMIT, default BUDGET + 50 s, and the whole is under
# 15 MiB). Exit 0 when every run completed, 1 otherwise; $OUT is packed either way.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
. scripts/split-sets.sh
T0=$SECONDS

OUT=$(realpath -m "${OUT:-gpu-check-out}")
BUDGET=${BUDGET:-540}
ROWS="article/default article/tuned_loader article/cleanup_every_step article/empty_cache_every_step resnet50_accum"
compares() { for r in $ROWS; do printf 'compare:%s ' "$r"; done; }
NVML_OFF=runner:article/default,profile.sample_ms=0
POOL_OFF=runner:article/default,profile.memory=false
# tuned_loader without pinned memory: on CubeCL each pinned batch is a blocking request to
# the device thread from a loader worker (cubecl-runtime's `staging`), which this isolates.
UNPINNED=compare:article/tuned_loader,loader.pin_memory=false
# Losses read back every 10 steps instead of every step (both frameworks): one host sync
# in ten, so the host queues the next steps while the device runs; what a sync costs.
FEWER_SYNCS=compare:article/default,log.every=10
# resnet50_accum stops early on its validation set (patience 3): both sides train the
# same steps with it left out of the comparison.
ACCUM=compare:resnet50_accum,run.early_stop.patience=1000
# Cold starts first, together (see together()): ResNet-50 with the defaults
# (backend.conv = "implicit_gemm"), with autotuned convolutions (which did not finish a
# cold start in 520 s on 2026-12-04: this adds its tunings to the cache that comes back,
# every candidate's time in them) and without fusion, and the three smaller models. Then,
# one at a time, what needs the GPU to itself: the headline ratio first, the article's
# other rows and resnet50_accum, the two A/Bs, the kernels, the warm starts, the rest.
# backend.conv_kernel: CubeCL's other implicit-GEMM convolutions (TMA loads, warp
# specialisation), which Burn's implicit GEMM (simple_sync_cyclic: 58% of a ResNet-50 step
# on 2026-12-04) leaves out: compiled cold beside the others, then a warm run of each on
# article/default (the rows to set against compare:article/default's runner row).
# backend.conv_split = "off": every weight gradient on the implicit GEMM, as before the
# split (25 launches a step over 1 ms, 74 of the step's 92 ms of convolution on
# 2026-12-04: the weight gradients of small weights, a few cubes each), against the
# default's split ones: compiled cold beside the others, then run right after the
# headline row.
SPLIT_OFF=runner:article/default,backend.conv_split=off
# backend.norm_sums = "reduce": the batch norm's per-channel sums by Burn's reductions (4
# launches and two reads of the activation each way; 427 reduce launches a step on
# 2026-12-04) and its normalisation, input gradient and running update by Burn's ops that
# fusion joins, against the default's kernels (the sums in 2 launches and one read; each
# of the others one launch, a custom operation in fusion's stream): compiled cold beside
# the others, then run right after the split's row (fused: "auto" on 16 CPUs).
SUMS_REDUCE=runner:article/default,backend.norm_sums=reduce
KERNELS="specialized_tma simple_async_tma specialized_async_cyclic"
kernel_colds() { for k in $KERNELS; do printf '+cold:resnet50,backend.conv_kernel=%s' "$k"; done; }
kernel_rows() { for k in $KERNELS; do printf 'runner:article/default,backend.conv_kernel=%s ' "$k"; done; }
# backend.matmul = "autotune": the fully connected layers on Burn's autotuned matmul (each
# new shape compiles and times about ten candidates; a layer has three shapes), against
# the default's one untuned kernel a shape: the MLP and the small CNN cold with it beside
# the others (behind the stand-in driver, 47 of the MLP's 95 cold compilations were its
# layers' matmul kernels), then the MLP's steady state with its tuned kernels (warm:mlp's row
# is the default's).
MATMUL_COLDS="+cold:mlp,backend.matmul=autotune+cold:small_cnn,backend.matmul=autotune"
MATMUL_WARM="warm:mlp,backend.matmul=autotune"
COLDS="cold:resnet50+cold:resnet50,backend.conv_split=off+cold:resnet50,backend.norm_sums=reduce+cold:resnet50,backend.conv=autotune+cold:resnet50,backend.fusion=false+cold:mlp+cold:small_cnn+cold:resnet18$(kernel_colds)$MATMUL_COLDS"
# Fusion off right after the headline row (which runs with fusion: backend.fusion =
# "auto" takes it from 4 CPUs, and this machine has 16). Without a GPU (the stand-in
# driver of scripts/cuda-compile-check.sh, BENCHMARKS.md), given a core per thread, a
# ResNet-50 step's host side is its busiest thread's work: 17-22 ms with fusion (fusion's
# thread), 10 ms without (the loop's, since SGD is one kernel); on the GPU fusion saves
# passes over memory: this row says which is faster there.
FUSION_OFF=runner:article/default,backend.fusion=false
PLAN=${PLAN-together:$COLDS compare:article/default $FUSION_OFF $SPLIT_OFF $SUMS_REDUCE compare:article/tuned_loader compare:article/cleanup_every_step compare:article/empty_cache_every_step $ACCUM $(kernel_rows)$NVML_OFF $POOL_OFF kernels:article/default warm:mlp $MATMUL_WARM warm:small_cnn warm:resnet18 gc $UNPINNED $FEWER_SYNCS compare:article/default compare:article/tuned_loader}
KERNEL_STEPS=${KERNEL_STEPS:-10}
MAX_STEPS=${MAX_STEPS:-80}
WARMUP=${WARMUP:-20}
STARTUP_STEPS=${STARTUP_STEPS:-60}
STARTUP_WARMUP=${STARTUP_WARMUP:-20}
T_COLD=${T_COLD:-150}
T_COLD_BIG=${T_COLD_BIG:-330}
T_WARM=${T_WARM:-60}
T_RUN=${T_RUN:-120}
T_TOGETHER=${T_TOGETHER:-220}
# The device call's own time limit: what is left after BUDGET goes to packing.
LIMIT=${LIMIT:-$((BUDGET + 50))}
TOGETHER_STEPS=${TOGETHER_STEPS:-8}
TOGETHER_WARMUP=${TOGETHER_WARMUP:-3}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
CACHE_ROOT=$(realpath -m "${RUNNER_CACHE_DIR:-$REPO/.runner-cache}")

mkdir -p "$OUT" "$CACHE_ROOT"
SCRATCH=$(mktemp -d)
RUNS=$SCRATCH/runs
mkdir -p "$RUNS/torch" "$SCRATCH/resolved"
exec > >(tee "$OUT/log.txt") 2>&1
TEE_PID=$!
RESULTS=$OUT/results.tsv
touch "$RESULTS"
TABLE=$OUT/gpu-table.md
status=0

say() { printf '[%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
stamp() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN { printf "%.2f", b - a }'; }

# --- helpers in Python (json, lzma and the tables; python3 is there wherever torch is) ---
HELPER=$SCRATCH/helper.py
cat > "$HELPER" <<'PY'
import json, lzma, os, shutil, sys

def unxz(src, dst):
    with lzma.open(src) as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    os.chmod(dst, 0o755)

def fmt(v, nd=2):
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)

def gib(v):
    return "-" if v in (None, "-") else f"{int(v) / 2**30:.2f}"

def row(kind, path):
    """One results.tsv tail: startup, first step, median, p95, util, mem in use, mem
    reserved, parameters, kernels, final loss, from a runner summary.json or a torch_ref
    JSON line."""
    try:
        with open(path) as f:
            text = f.read().strip()
        s = json.loads(text.splitlines()[-1] if kind == "torch" else text)
    except (OSError, ValueError, IndexError):
        return ["-"] * 11
    if kind == "torch":
        return [fmt(s.get("startup_s")), "-", fmt(s.get("median_ms")), fmt(s.get("p95_ms")), "-",
                fmt(s.get("mem_in_use_after_step_bytes")),
                fmt(s.get("mem_reserved_after_step_bytes")), fmt(s.get("parameters")), "-",
                fmt(s.get("final_loss"), 4), "-"]
    it = s.get("iter_ms") or {}
    if not it.get("count"):  # no timed step (a run cut short): no statistics
        it = {}
    if not s.get("parameters"):
        s["parameters"] = None
    k = s.get("kernels")  # CUDA only: what CubeCL compiled, loaded and tuned
    kernels = "/".join(str(k.get(f, "?")) for f in
                       ("compiled", "from_cache", "tuned", "tune_results_loaded")) if k else "-"
    if k and k.get("tuned"):
        kernels += f" (tuning {k.get('tune_ms', 0) / 1e3:.1f} s)"
    phases = s.get("phases") or {}  # host-side medians of the timed steps
    return [fmt(s.get("startup_s")), fmt(s.get("first_step_ms"), 1), fmt(it.get("median")),
            fmt(it.get("p95")), fmt(s.get("gpu_util_pct"), 1), fmt(s.get("peak_mem_in_use_bytes")),
            fmt(s.get("peak_mem_reserved_bytes")), fmt(s.get("parameters")), kernels,
            fmt(s.get("final_loss"), 4), fmt(phases.get("mem_query_ms"), 3)]

COLS = ["phase", "recipe", "which", "framework", "status", "wall_s", "cache_files", "startup_s",
        "first_step_ms", "median_ms", "p95_ms", "gpu_util_pct", "mem_in_use", "mem_reserved",
        "parameters", "kernels", "final_loss", "mem_query_ms"]

def render(results, out):
    rows = []
    if os.path.exists(results):
        with open(results) as f:
            rows = [dict(zip(COLS, line.rstrip("\n").split("\t"))) for line in f if line.strip()]
    L = ["## Start-up: time to the first step, cold then warm kernel cache", "",
         "| model | run | files in its cache at start | status | startup s | first step ms "
         "| process s | median ms/iter | parameters "
         "| kernels compiled / from cache / shapes tuned / tunings loaded |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["phase"] == "startup":
            L.append(f"| {r['recipe']} | {r['which']} | {r['cache_files']} | {r['status']} | "
                     f"{r['startup_s']} | "
                     f"{r['first_step_ms']} | {r['wall_s']} | {r['median_ms']} | "
                     f"{r['parameters']} | {r['kernels']} |")
    L += ["", "## Side by side: runner vs PyTorch (same resolved recipe)", "",
          "| recipe | repeat | runner ms/iter | torch ms/iter | runner/torch | runner GPU util % "
          "| runner mem in use / reserved GiB | torch mem allocated / reserved GiB "
          "| startup s runner / torch | runner cache files at start | params runner / torch "
          "| runner pool query ms/step |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    pairs = {}
    for r in rows:
        if r["phase"] == "compare":
            pairs.setdefault((r["recipe"], r["which"]), {})[r["framework"]] = r
    for (recipe, which), p in pairs.items():
        ru, to = p.get("runner"), p.get("torch")
        ms = lambda r: (r["median_ms"] if r["status"] == "ok" else r["status"]) if r else "-"
        try:
            ratio = f"{float(ru['median_ms']) / float(to['median_ms']):.2f}"
        except (TypeError, ValueError, ZeroDivisionError, KeyError):
            ratio = "-"
        mem = lambda r: f"{gib(r['mem_in_use'])} / {gib(r['mem_reserved'])}" if r else "-"
        g = lambda r, k: r[k] if r else "-"
        L.append(f"| {recipe} | {which} | {ms(ru)} | {ms(to)} | {ratio} | "
                 f"{g(ru, 'gpu_util_pct')} | {mem(ru)} | {mem(to)} | "
                 f"{g(ru, 'startup_s')} / {g(to, 'startup_s')} | {g(ru, 'cache_files')} | "
                 f"{g(ru, 'parameters')} / {g(to, 'parameters')} | {g(ru, 'mem_query_ms')} |")
    L += ["", "ms/iter: median over the steps after warm-up. Memory: the largest reading after "
          "a step (runner: Burn's pool; torch: memory_allocated / memory_reserved). Pool query: "
          "the median time per step the runner spent asking the pool for those figures. "
          "startup: process start to the end of the first step; process s: the whole "
          "runner process as the script timed it.", ""]
    with open(out, "w") as f:
        f.write("\n".join(L))

def kernels(log, out, title, steps):
    """CubeCL's profiling log (a line `| <duration> | <kernel>` per launch) -> the kernels
    by total device time."""
    import re
    unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
    total, count = {}, {}
    try:
        f = open(log, encoding="utf-8", errors="replace")
    except OSError:
        f = []
    for line in f:
        parts = line.rstrip("\n").split("|", 2)
        if len(parts) != 3 or parts[0].strip():
            continue
        m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", parts[1].strip())
        if not m:
            continue
        # CubeCL's name is the kernel's generic types joined by " | ": drop the argument
        # plumbing and the runtime, keep what tells kernels apart.
        words = [w.strip() for w in parts[2].split("|")]
        name = " · ".join(w for w in words if w and w not in ("DynamicScalar", "DynamicSize", "()")
                          and not w.startswith("__") and not w.endswith("Runtime")) or parts[2].strip()
        total[name] = total.get(name, 0.0) + float(m.group(1)) * unit[m.group(2)]
        count[name] = count.get(name, 0) + 1
    all_ms = sum(total.values())
    steps = max(int(steps), 1)
    L = [f"## Kernels of {title}: device time over {steps} steps, each launch timed", "",
         f"{sum(count.values())} launches of {len(total)} kernels, {all_ms:.1f} ms in all "
         f"({all_ms / steps:.2f} ms per step; the profiler waits for each launch, so this is "
         "device time without overlap, not the step time).", "",
         "| kernel | ms per step | share % | launches per step | mean µs |",
         "| --- | --- | --- | --- | --- |"]
    for name in sorted(total, key=total.get, reverse=True)[:30]:
        t, n = total[name], count[name]
        L.append(f"| {name} | {t / steps:.3f} | {100 * t / all_ms:.1f} | {n / steps:.1f} | "
                 f"{1e3 * t / n:.1f} |")
    if not total:
        L.append("| (no profiled launch in the log) | - | - | - | - |")
    with open(out, "w") as g:
        g.write("\n".join(L) + "\n")

def tunings(root, out):
    """Every autotune result under the kernel caches (CubeCL's `autotune/**.json.log`: JSON
    entries, each a key with every candidate's timing), as a table appended to `out`: for
    each cache and operation, the candidates' median times and the one kept. What a fixed
    `backend.conv` (or any other default) should name is read off this."""
    dec = json.JSONDecoder()
    def dur(d):
        return d["secs"] * 1e6 + d["nanos"] / 1e3 if isinstance(d, dict) else None
    def short(key):
        k = key.get("key", key)
        # Keys that are plain structs: named by what they hold.
        for field, op in (("matmul_key", "FusedMatmul"), ("reduce_key", "FusedReduce"),
                          ("definition", "Matmul"), ("elem_input", "Reduce")):
            if isinstance(k, dict) and field in k:
                inner = {"Matmul": lambda: k["definition"],
                         "FusedMatmul": lambda: k["matmul_key"].get("definition", {}),
                         "FusedReduce": lambda: k["reduce_key"]}.get(op, lambda: k)()
                keep = ("m", "n", "k", "axis_is_contiguous", "vector_size", "vector_count",
                        "reduce_axis_shape", "reduce_count")
                fields = ",".join(f"{a}={b}" for a, b in inner.items() if a in keep)
                return op, (fields or json.dumps(k, separators=(",", ":")))[:160]
        if isinstance(k, dict) and len(k) == 1:
            (op, v), = k.items()
            if isinstance(v, dict):
                skip = ("dtype", "groups", "dilation", "has_bias") + tuple(
                    a for a in v if a.endswith("_align"))
                fields = ",".join(f"{a}={json.dumps(b, separators=(',', ':'))}" for a, b in v.items()
                                  if a not in skip and b not in (None, [], {}))
                return op, fields[:160]
            return op, json.dumps(v)[:160]
        return "?", json.dumps(k)[:160]
    rows = []
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith(".json.log") or "autotune" not in dirpath:
                continue
            cache = os.path.relpath(dirpath, root).split(os.sep)[0]
            text = open(os.path.join(dirpath, name), encoding="utf-8", errors="replace").read()
            i = 0
            while True:
                j = text.find("{", i)
                if j < 0:
                    break
                try:
                    entry, i = dec.raw_decode(text, j)
                except ValueError:
                    i = j + 1
                    continue
                if not isinstance(entry, dict) or "value" not in entry:
                    continue
                op, fields = short(entry.get("key", {}))
                v = entry["value"]
                times = []
                for r in v.get("results", []):
                    o = r.get("outcome", {})
                    if "Ok" in o:
                        times.append((o["Ok"]["name"], dur(o["Ok"]["computation"]["median"])))
                    else:
                        times.append(("(refused)", None))
                best = next((n for n, _ in times[v.get("fastest_index", 0):][:1]), "?")
                for r in v.get("results", []):
                    o = r.get("outcome", {})
                    if "Ok" in o and o["Ok"].get("index") == v.get("fastest_index"):
                        best = o["Ok"]["name"]
                ok = sorted(((n, t) for n, t in times if t is not None), key=lambda x: x[1])
                cands = "; ".join(f"{n} {t:.0f}" for n, t in ok)
                rows.append(f"| {cache} | {op} | {fields} | **{best}** | {cands} | {len(times) - len(ok)} |")
    L = ["", "## Autotune results in the kernel caches", "",
         f"{len(rows)} tuned keys. Candidates by median µs (CubeCL's 10 timed launches), fastest first.", "",
         "| cache | operation | key | kept | candidates (median µs) | refused |",
         "| --- | --- | --- | --- | --- | --- |"] + rows
    with open(out, "a") as f:
        f.write("\n".join(L) + "\n")

cmd = sys.argv[1]
if cmd == "tunings":
    tunings(sys.argv[2], sys.argv[3])
elif cmd == "unxz":
    unxz(sys.argv[2], sys.argv[3])
elif cmd == "row":
    print("\t".join(row(sys.argv[2], sys.argv[3])))
elif cmd == "render":
    render(sys.argv[2], sys.argv[3])
elif cmd == "kernels":
    kernels(*sys.argv[2:6])
PY
py() { python3 "$HELPER" "$@"; }

# --- the binary ---
BIN=${1:-target/release/runner}
TESTS=${TESTS-$(dirname "$BIN")/runner-tests.xz}
if [[ ! -f $BIN ]]; then
  say "no runner binary at $BIN (see the header: build, strip, xz)"
  exit 2
fi
if [[ $BIN == *.xz ]]; then
  mkdir -p "$SCRATCH/bin"
  say "unpacking $BIN"
  py unxz "$BIN" "$SCRATCH/bin/runner" || { say "cannot unpack $BIN"; exit 2; }
  BIN=$SCRATCH/bin/runner
fi
BIN=$(realpath "$BIN")
chmod +x "$BIN" 2>/dev/null

# --- the named convolution kernels against the definition, in the background ---
# With the runner's CUDA unit-test binary beside the runner (TESTS; see the header), its
# check of every backend.conv_kernel (src/ops/conv_cube.rs) runs while the cold starts
# compile (the GPU is nearly idle then): which passes each kernel ran and its worst error,
# so a kernel that computes wrong is known before its speed is read.
SELFTEST_PID=
if [[ $DEVICE == cuda && -f $TESTS ]]; then
  mkdir -p "$SCRATCH/bin"
  if py unxz "$TESTS" "$SCRATCH/bin/runner-tests"; then
    chmod +x "$SCRATCH/bin/runner-tests"
    say "selftest: the conv kernels and the batch norm against the definition and the CPU, and the conv weights' layouts through three optimizer steps, in the background ($TESTS)"
    (cd "$SCRATCH" && timeout "${T_SELFTEST:-300}" "$SCRATCH/bin/runner-tests" \
      cuda_named --nocapture --test-threads=1 > "$SCRATCH/selftest.txt" 2>&1
     echo "exit $?" >> "$SCRATCH/selftest.txt") &
    SELFTEST_PID=$!
  else
    say "selftest: cannot unpack $TESTS; the conv kernels are not checked"
  fi
fi

# --- the kernel caches: one per model.arch under CACHE_ROOT ---
[[ ${FRESH_CACHE:-0} == 1 ]] && find "$CACHE_ROOT" -mindepth 1 -delete
if [[ -n ${CACHE_IN:-} ]]; then
  if tar -C "$CACHE_ROOT" -xzf "$CACHE_IN"; then say "cache: unpacked $CACHE_IN"
  else say "cache: cannot unpack $CACHE_IN; going on"; fi
fi
files_in() { find "$1" -type f 2> /dev/null | wc -l; }
cache_state="$(files_in "$CACHE_ROOT") files at start"
say "cache: $CACHE_ROOT, $cache_state (a run whose own cache is not empty is not cold: see the cache column)"

# --- the machine ---
SETS_DEV=() # every runner and show call gets these
TORCH_DEV=(--device "$DEVICE")
if [[ $DEVICE == cpu ]]; then
  SETS_DEV=(--set backend.kind=cpu)
elif [[ $DEVICE == wgpu ]]; then
  # A dry run through CubeCL on this machine (a runner built with --features wgpu, on
  # Mesa's software Vulkan): kernel counts, caches and start-up rows are real; torch on CPU.
  SETS_DEV=(--set backend.kind=wgpu)
  TORCH_DEV=(--device cpu)
fi
for kv in ${EXTRA_SETS:-}; do SETS_DEV+=(--set "$kv"); done
{
  echo "date: $(date -u +%FT%TZ)"
  if [[ $DEVICE != cuda ]]; then echo "DEVICE=$DEVICE: nvidia-smi skipped"
  else timeout 20 nvidia-smi || echo "nvidia-smi: failed or missing"; fi
  echo "runner: $("$BIN" --version 2>&1)"
  timeout 60 "$PYTHON" -c '
import sys, torch, torchvision
print("python", sys.version.split()[0], "torch", torch.__version__, "torchvision",
      torchvision.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1 ||
    echo "torch: not importable with $PYTHON"
  echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}'), $(uname -srm)"
  # The CPUs the runner may use (affinity and cgroup quota): backend.fusion = "auto" takes
  # fusion from 4, so below that the headline rows would run without it.
  echo "runner $(timeout 20 "$BIN" ls 2>/dev/null | grep -m1 -E '^ +cpu ' | sed 's/^ *//') (backend.fusion = \"auto\": fusion from 4)"
  echo "cache: $CACHE_ROOT ($cache_state)"
  echo "settings: BUDGET=$BUDGET PLAN='$PLAN'" \
    "MAX_STEPS=$MAX_STEPS WARMUP=$WARMUP STARTUP_STEPS=$STARTUP_STEPS" \
    "STARTUP_WARMUP=$STARTUP_WARMUP T_COLD=$T_COLD T_COLD_BIG=$T_COLD_BIG T_WARM=$T_WARM" \
    "T_RUN=$T_RUN DEVICE=$DEVICE EXTRA_SETS='${EXTRA_SETS:-}'"
} 2>&1

# --- CUDA answers? (seconds; without it every runner run would fail and torch's take the
# budget) ---
if [[ $DEVICE == cuda ]]; then
  if ! timeout 60 "$BIN" validate "$REPO/recipes/article/default.toml" --set backend.kind=cuda; then
    ABORT_AT_START="the runner cannot use CUDA here (its validation above says why): nothing was run"
  fi
fi

# --- running things ---
# Seconds a run may take: its own timeout, cut to what is left of the budget; 0 = skip.
allow() {
  local left=$((BUDGET - (SECONDS - T0)))
  if ((left < 10)); then echo 0; elif (($1 < left)); then echo "$1"; else echo "$left"; fi
}
skipped=()
LAST_STATUS= # of the latest runner_run: ok, timeout, failed(N), skipped
RUNNER_RUNS=0
ABORT=${ABORT_AT_START:-} # set when CUDA does not answer or the first runner run fails outright
record() { # phase recipe which framework status wall_s cache-files result-file kind
  local tail
  tail=$(py row "$9" "$8")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$tail" >> "$RESULTS"
  py render "$RESULTS" "$TABLE"
  say "$1 $2 $3 $4: $5 (${6}s, cache files at start: $7) | startup s, first step ms, median, p95, util %, in use, reserved, params, kernels, loss, pool query ms: $(echo "$tail" | tr '\t' ' ')"
}
status_of() { # exit code -> word
  case $1 in 0) echo ok ;; 124 | 137) echo timeout ;; *) echo "failed($1)" ;; esac
}
# resolve TAG FILE SETS...: `runner show` into $SCRATCH/resolved/TAG.toml (absolute data
# paths, every override applied), so runner and torch_ref read the very same recipe.
resolve() {
  local tag=$1 file=$2
  shift 2
  "$BIN" show "$file" "$@" "${SETS_DEV[@]}" > "$SCRATCH/resolved/$tag.toml"
}
arch_of() { sed -n 's/^arch *= *"\(.*\)"/\1/p' "$1" | head -n 1; }
# A plan step's variant ("backend.fusion=false,backend.autotune=minimal") as --set flags,
# and as a suffix naming its own kernel cache (other settings, other kernels).
variant_sets() { local kv; while IFS= read -r kv; do printf '%s\n' --set "$kv"; done < <(split_sets "$1"); }
variant_tag() { [[ -n $1 ]] && printf '+%s' "$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.=\n-' '_')"; }
# The cache suffix: the variant's backend.* settings alone (the others compile no other
# kernels, so their runs share the model's cache).
cache_tag() { variant_tag "$(split_sets "$1" | grep '^backend\.' | paste -sd, -)"; }
# runner_run PHASE RECIPE WHICH TIMEOUT TAG RESOLVED CACHE: trains with the kernel cache
# CACHE (the recipe's model.arch and the step's variant), records the row. The driver's cache of the PTX it compiled to
# machine code (CUDA_CACHE_PATH, else ~/.nv/ComputeCache) goes there too, so a cold run is
# cold for the driver as well, and a second call can carry it.
runner_run() {
  local phase=$1 recipe=$2 which=$3 limit=$4 tag=$5 file=$6 cache=$CACHE_ROOT/$7 t
  mkdir -p "$cache/driver"
  local files
  files=$(files_in "$cache")
  t=$(allow "$limit")
  if ((t == 0)); then
    skipped+=("runner $recipe $which")
    LAST_STATUS=skipped
    record "$phase" "$recipe" "$which" runner skipped 0 "$files" /nonexistent runner
    return
  fi
  local start rc
  start=$(stamp)
  say "runner $recipe $which (timeout ${t}s, cache $cache: $files files)"
  (cd "${RUN_CWD:-$SCRATCH}" && RUNNER_CACHE_DIR=$cache CUDA_CACHE_PATH=$cache/driver \
    timeout -k 5 "$t" "$BIN" -q "$file" --set "log.dir=$RUNS/$tag")
  rc=$?
  local st
  st=$(status_of $rc)
  [[ $st == ok ]] || status=1
  LAST_STATUS=$st
  RUNNER_RUNS=$((RUNNER_RUNS + 1))
  if ((RUNNER_RUNS == 1)) && [[ $st == failed* ]]; then
    ABORT="the first runner run ($recipe $which) ended $st: the binary does not work here (its stderr is above); the rest of the plan is skipped so that a fixed binary can be rerun in the device time left"
  fi
  local summary
  summary=$(find "$RUNS/$tag" -name summary.json 2> /dev/null | head -n 1)
  record "$phase" "$recipe" "$which" runner "$st" "$(since "$start")" "$files" \
    "${summary:-/nonexistent}" runner
}
# torch_run RECIPE WHICH TIMEOUT TAG RESOLVED [torch_ref flags]: trains, records the row.
torch_run() {
  local recipe=$1 which=$2 limit=$3 tag=$4 file=$5
  shift 5
  local t
  t=$(allow "$limit")
  if ((t == 0)); then
    skipped+=("torch $recipe $which")
    record compare "$recipe" "$which" torch skipped 0 - /nonexistent torch
    return
  fi
  local start rc json=$RUNS/torch/$tag.json
  start=$(stamp)
  say "torch $recipe $which (timeout ${t}s)"
  timeout -k 5 "$t" "$PYTHON" "$REPO/scripts/torch_ref.py" "$file" "${TORCH_DEV[@]}" "$@" > "$json"
  rc=$?
  local st
  st=$(status_of $rc)
  [[ $st == ok ]] || status=1
  record compare "$recipe" "$which" torch "$st" "$(since "$start")" - "$json" torch
}

# How many times a plan step has run so far (a step named again is a repeat: its own
# log directory, "#2" in its row).
declare -A repeat_of=()

# startup ARCH[,KEY=VALUE...]: cold (its own cache, empty unless CACHE_IN filled it),
# then warm. mlp and small_cnn may not carry model.stem (a ResNet key): they get
# article/default without it, resolved by the runner itself (absolute data paths).
startup() {
  local runs=${2:-cold warm} arch=${1%%,*} variant= which limit
  [[ $1 == *,* ]] && variant=${1#*,}
  local label=$arch${variant:+ ($variant)} name=$arch$(variant_tag "$variant")
  local cache=$arch$(cache_tag "$variant")
  local n=$((${repeat_of["startup $name"]:-0} + 1))
  repeat_of["startup $name"]=$n
  local file=$REPO/recipes/article/default.toml
  if [[ $arch != resnet* ]]; then
    # One file per step: the steps of a together: write theirs at the same time.
    file=$SCRATCH/resolved/nostem-$name-$runs-$n.toml
    file=${file// /_}
    "$BIN" show "$REPO/recipes/article/default.toml" | sed '/^stem *=/d' > "$file"
  fi
  local sets
  mapfile -t sets < <(variant_sets "$variant")
  if ! resolve "p1-$name" "$file" --set "model.arch=$arch" --set "name=startup_$arch" \
    --set "run.max_steps=${STEPS_NOW:-$STARTUP_STEPS}" \
    --set "run.warmup_steps=${WARMUP_NOW:-$STARTUP_WARMUP}" "${sets[@]}"; then
    status=1
    record startup "$label" - runner "failed(show)" 0 - /nonexistent runner
    return
  fi
  for which in $runs; do
    limit=$T_COLD
    [[ $arch == resnet50 ]] && limit=$T_COLD_BIG
    [[ $which == warm ]] && limit=$T_WARM
    [[ -n ${LIMIT_NOW:-} ]] && limit=$LIMIT_NOW
    runner_run startup "$label" "$which${LIMIT_NOW:+ (together)}$( ((n > 1)) && echo " #$n")" "$limit" \
      "p1-$name-$n-$which" "$SCRATCH/resolved/p1-$name.toml" "$cache"
  done
}

# together STEP+STEP+...: start-up steps (cold:, warm:, startup:) at the same time, each
# its own process with its own cache, so that cold starts, which compile on one CPU thread
# each and leave the GPU nearly idle, use the machine's other cores instead of running one
# after another. Each runs TOGETHER_STEPS steps (the first step is what is timed here; the
# steady state is measured alone, later), all under one timeout, T_TOGETHER. Autotune
# times each candidate as the median of 10 launches, so another process's launch now and
# then moves little; the rows say "together" so that no one reads them as runs alone.
together() {
  local s pids=() before
  before=$(wc -l < "$RESULTS" 2> /dev/null || echo 0)
  for s in ${1//+/ }; do
    (
      STEPS_NOW=$TOGETHER_STEPS WARMUP_NOW=$TOGETHER_WARMUP LIMIT_NOW=$T_TOGETHER
      case $s in
        cold:*) startup "${s#cold:}" cold ;;
        warm:*) startup "${s#warm:}" warm ;;
        startup:*) startup "${s#startup:}" ;;
        *) say "together: '$s' is not a cold:, warm: or startup: step; skipped" ;;
      esac
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  # What the subshells could not set here: the abort of a binary that fails.
  local rows
  rows=$(tail -n +"$((before + 1))" "$RESULTS" 2> /dev/null)
  RUNNER_RUNS=$((RUNNER_RUNS + $(grep -c . <<< "$rows")))
  if [[ -n $rows ]] && ! grep -qvP '^[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\tfailed' <<< "$rows"; then
    ABORT="every run of the first together: step failed outright: the binary does not work here (its stderr is above); the rest of the plan is skipped"
  fi
}

# compare RECIPE[,KEY=VALUE...] [--gc-collect | --runner-only]: runner then torch (or torch
# alone with --gc-collect, the runner alone with --runner-only). The variant's settings
# reach both (torch_ref ignores backend keys).
SMI_DONE=
compare() {
  local r=${1%%,*} variant= flag=${2:-} only=
  [[ $flag == --runner-only ]] && { only=runner; flag=; }
  [[ $1 == *,* ]] && variant=${1#*,}
  local label=$r${variant:+ ($variant)}
  [[ -n $flag ]] && label="$label (torch: gc.collect)"
  local i=$((${repeat_of[$label]:-0} + 1))
  repeat_of[$label]=$i
  local tag=p2-${r//\//_}$(variant_tag "$variant")${flag:+-gc}-$i
  local sets
  mapfile -t sets < <(variant_sets "$variant")
  if ! resolve "$tag" "$REPO/recipes/$r.toml" --set "run.max_steps=$MAX_STEPS" \
    --set "run.warmup_steps=$WARMUP" --set run.eval=never "${sets[@]}"; then
    status=1
    record compare "$label" "$i" runner "failed(show)" 0 - /nonexistent runner
    return
  fi
  local file=$SCRATCH/resolved/$tag.toml
  if [[ -z $flag ]]; then
    local smi=
    if [[ $r == article/default && -z $SMI_DONE && $DEVICE == cuda ]] && command -v nvidia-smi > /dev/null; then
      nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -lms 500 \
        > "$OUT/nvidia-smi.csv" 2>&1 &
      smi=$!
      SMI_DONE=1
    fi
    runner_run compare "$label" "$i" "$T_RUN" "$tag-runner" "$file" \
      "$(arch_of "$file")$(cache_tag "$variant")"
    if [[ -n $smi ]]; then kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null; fi
  fi
  [[ -n $only ]] || torch_run "$label" "$i" "$T_RUN" "$tag-torch" "$file" $flag
}

# kernels RECIPE[,KEY=VALUE...]: the runner alone, KERNEL_STEPS steps, CubeCL's profiler
# on through a cubecl.toml in its working directory; the kernels table into $OUT.
kernels() {
  local r=${1%%,*} variant=
  [[ $1 == *,* ]] && variant=${1#*,}
  local label=$r${variant:+ ($variant)}
  local tag=p3-${r//\//_}$(variant_tag "$variant")
  local sets
  mapfile -t sets < <(variant_sets "$variant")
  if ! resolve "$tag" "$REPO/recipes/$r.toml" --set "run.max_steps=$KERNEL_STEPS" \
    --set run.warmup_steps=0 --set run.eval=never "${sets[@]}"; then
    status=1
    record kernels "$label" - runner "failed(show)" 0 - /nonexistent runner
    return
  fi
  local file=$SCRATCH/resolved/$tag.toml dir=$SCRATCH/$tag
  local log=$dir/kernels.log name
  # $OUT's names may hold letters, digits, '.', '_' and '-' alone (the device tool).
  name=$(printf 'kernels-%s%s' "${r//\//_}" "$(variant_tag "$variant")" | tr -c 'A-Za-z0-9._-' '_')
  mkdir -p "$dir"
  printf '[profiling]\nlogger = { level = "basic", file = "%s", append = false }\n' "$log" \
    > "$dir/cubecl.toml"
  RUN_CWD=$dir runner_run kernels "$label" profiled "$T_RUN" "$tag" "$file" \
    "$(arch_of "$file")$(cache_tag "$variant")"
  # The table only for a run that ran (a skipped one would take one of $OUT's 8 files);
  # the raw log into runs.tar.gz.
  [[ $LAST_STATUS == skipped ]] && return
  py kernels "$log" "$OUT/$name.md" "$label" "$KERNEL_STEPS"
  [[ -f $log ]] && mkdir -p "$RUNS/$tag" && gzip -c "$log" > "$RUNS/$tag/kernels.log.gz"
  say "kernels $label: $OUT/$name.md"
  head -n 20 "$OUT/$name.md"
}

# --- the plan ---
say "plan: $PLAN"
for step in $PLAN; do
  if [[ -n $ABORT ]]; then
    skipped+=("$step")
    continue
  fi
  case $step in
    startup:*) startup "${step#startup:}" ;;
    cold:*) startup "${step#cold:}" cold ;;
    warm:*) startup "${step#warm:}" warm ;;
    together:*) together "${step#together:}" ;;
    compare:*) compare "${step#compare:}" ;;
    runner:*) compare "${step#runner:}" --runner-only ;;
    gc) compare article/cleanup_every_step --gc-collect ;;
    kernels:*) kernels "${step#kernels:}" ;;
    *)
      say "unknown plan step '$step' (startup:ARCH[,K=V...], cold:ARCH[,K=V...], compare:RECIPE[,K=V...], runner:RECIPE[,K=V...], kernels:RECIPE[,K=V...] or gc): skipped"
      status=1
      ;;
  esac
done

# --- pack ---
[[ -n $ABORT ]] && say "$ABORT"
if ((${#skipped[@]})); then
  say "skipped (for the budget of ${BUDGET}s${ABORT:+, or after the abort above}): ${skipped[*]}"
  status=1
fi
py render "$RESULTS" "$TABLE"
# Runs in a together: step ran in subshells, which could not set status here.
if grep -qvP '^[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\tok\t' "$RESULTS" 2> /dev/null; then status=1; fi
echo
cat "$TABLE"
tar -C "$SCRATCH" -czf "$OUT/runs.tar.gz" --exclude='*.safetensors' --exclude=checkpoints \
  runs resolved
say "runs.tar.gz: $(du -h "$OUT/runs.tar.gz" | cut -f1)"
# The caches for a warm second call. First the autotune results alone (small: one JSON
# line per tuned key, every candidate's time in it) with their table; then, in the time
# left before LIMIT (the device call's own limit), the compiled kernels too, if the whole
# fits in 15 MiB. Both calls of 2026-12-04 ran out of time packing ~5,000 kernel files
# with nothing sent back, which lost 150 tuned ResNet-50 shapes.
py tunings "$CACHE_ROOT" "$TABLE"
if [[ -n $SELFTEST_PID ]]; then
  wait "$SELFTEST_PID"
  {
    echo
    echo "## backend.conv_kernel against the definition, the batch norm (norm_sums), the fixed matmul (backend.matmul) and the conv weights' layout against the CPU (the CUDA unit tests, fused and plain)"
    echo
    echo '```'
    grep -E '^conv kernel|^batch norm|off by|panicked|^test |^test result|^exit' "$SCRATCH/selftest.txt" | head -n 80
    echo '```'
  } >> "$TABLE"
  say "selftest: $(grep -c '^conv kernel' "$SCRATCH/selftest.txt") kernels checked, $(tail -n 1 "$SCRATCH/selftest.txt")"
fi
tail -n +1 "$TABLE" | sed -n '/^## Autotune results/,$p' | head -n 60
(cd "$CACHE_ROOT" && find . -path '*autotune*' -type f -print0 |
  tar --null -T - -czf "$OUT/cache.tar.gz") 2> /dev/null &&
  say "cache.tar.gz: the autotune results, $(du -h "$OUT/cache.tar.gz" | cut -f1)"
left=$((LIMIT - (SECONDS - T0) - 10))
if ((left > 5)); then
  if timeout "$left" tar -C "$CACHE_ROOT" -czf "$SCRATCH/cache.tar.gz" . 2> /dev/null; then
    size=$(stat -c %s "$SCRATCH/cache.tar.gz")
    if ((size <= 15 * 1024 * 1024)); then
      mv "$SCRATCH/cache.tar.gz" "$OUT/cache.tar.gz"
      say "cache.tar.gz: every cache, compiled kernels included, $((size / 1024)) KiB"
    else
      say "the whole cache is $((size / 1024 / 1024)) MiB packed, over 15 MiB: only the autotune results came back"
    fi
  else
    say "packing the compiled kernels did not end in ${left}s: only the autotune results came back"
  fi
fi
rm -rf "$SCRATCH"
say "done in $((SECONDS - T0))s, exit $status"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null # log.txt is whole before $OUT is collected
exit $status
