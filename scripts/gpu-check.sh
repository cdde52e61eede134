#!/usr/bin/env bash
# The GPU check, in one call of under 10 minutes on a lent GPU machine (one H200, python3 +
# torch + torchvision, no network). It measures:
#   1. start-up: for mlp, small_cnn, resnet18, resnet50 (batch 64, article/default's data and
#      loader), runner twice, first with an empty kernel cache (cold), then warm: the
#      summary's startup_s (process start to the first step), first_step_ms, median ms/iter
#      and kernel counts (`kernels`: compiled / from cache / tuned / tunings loaded).
#      Smallest models first.
#   2. side by side: article/{default,tuned_loader,cleanup_every_step,empty_cache_every_step}
#      and resnet50_accum, runner then scripts/torch_ref.py on the same resolved recipe,
#      alternating, REPEATS times: median ms/iter of each, their ratio, the runner's GPU
#      utilisation and memory, torch's memory, start-up of each. One extra torch run of
#      cleanup_every_step with --gc-collect: the article's own per-step gc.collect().
#
# With this project's device tool (the machine gets a copy of the work tree, and $OUT back):
#   here:    cargo build --release --features cuda
#            mkdir -p .device && strip -o .device/runner target/release/runner
#            xz -9 -f .device/runner                           # -> .device/runner.xz
#            .device/ (and .runner-cache/) must be listed in .gitignore, so the binary is
#            never committed; an ignored folder travels only when named: carry [".device"]
#   device:  run(command="bash scripts/gpu-check.sh .device/runner.xz",
#                carry=[".device"], timeout_s=600)
#   warm:    copy the cache.tar.gz an earlier call brought back into .device/, then
#            CACHE_IN=.device/cache.tar.gz bash scripts/gpu-check.sh .device/runner.xz
#            (phase 1's first runs are then warm too, and the log says so)
#
# Without a GPU (a dry run of the whole script on this machine's CPU):
#   DEVICE=cpu MAX_STEPS=3 WARMUP=1 STARTUP_STEPS=3 STARTUP_WARMUP=1 REPEATS=1 ARCHS=mlp \
#     RECIPES=article/default EXTRA_SETS=loader.batch_size=8 PYTHON=/tmp/torchenv/bin/python3 \
#     RUNNER_CACHE_DIR=/tmp/rc OUT=/tmp/gc-out bash scripts/gpu-check.sh target/release/runner
#
# Settings (environment): OUT (default ./gpu-check-out); BUDGET (540): seconds after which
# the remaining runs are skipped (each run's timeout is also cut to what is left); REPEATS
# (2); ARCHS and RECIPES (paths under recipes/ without .toml; "" skips that phase);
# STARTUP_STEPS (60) / STARTUP_WARMUP (20) for phase 1; MAX_STEPS (80) / WARMUP (20) for
# phase 2, which also sets run.eval=never; T_COLD (150), T_WARM (60), T_RUN (120): timeouts
# in seconds; DEVICE (cuda, or cpu: --set backend.kind=cpu, torch_ref --device cpu, no
# nvidia-smi); PYTHON (python3: the one with torch); GC_ROW (1: the extra gc.collect row);
# RUNNER_CACHE_DIR (default $PWD/.runner-cache); CACHE_IN (a cache.tar.gz unpacked into it
# first); FRESH_CACHE=1 (empty it first); EXTRA_SETS (more KEY=VALUE overrides for every
# run, space-separated, e.g. "loader.batch_size=8").
#
# $OUT (at most 8 files): log.txt (everything), env.txt (nvidia-smi, versions),
# results.tsv (a row per run, appended as each ends), gpu-table.md (both tables, rewritten
# after each run, printed at the end), nvidia-smi.csv (memory and utilisation every 500 ms
# during the first runner run of article/default: the cross-check of the runner's figures),
# runs.tar.gz (every run directory without its weights and checkpoints, which would make
# it hundreds of MiB, and torch_ref's JSON lines), cache.tar.gz (the kernel
# cache, if under 15 MiB). Exit 0 when every run completed, 1 otherwise; $OUT is packed
# either way.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
T0=$SECONDS

OUT=$(realpath -m "${OUT:-gpu-check-out}")
BUDGET=${BUDGET:-540}
REPEATS=${REPEATS:-2}
ARCHS=${ARCHS-mlp small_cnn resnet18 resnet50}
RECIPES=${RECIPES-article/default article/tuned_loader article/cleanup_every_step article/empty_cache_every_step resnet50_accum}
MAX_STEPS=${MAX_STEPS:-80}
WARMUP=${WARMUP:-20}
STARTUP_STEPS=${STARTUP_STEPS:-60}
STARTUP_WARMUP=${STARTUP_WARMUP:-20}
T_COLD=${T_COLD:-150}
T_WARM=${T_WARM:-60}
T_RUN=${T_RUN:-120}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
GC_ROW=${GC_ROW:-1}
RUNNER_CACHE_DIR=$(realpath -m "${RUNNER_CACHE_DIR:-$REPO/.runner-cache}")
export RUNNER_CACHE_DIR

mkdir -p "$OUT" "$RUNNER_CACHE_DIR"
SCRATCH=$(mktemp -d)
RUNS=$SCRATCH/runs
mkdir -p "$RUNS/torch" "$SCRATCH/resolved"
exec > >(tee "$OUT/log.txt") 2>&1
TEE_PID=$!
RESULTS=$OUT/results.tsv
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
        return ["-"] * 10
    if kind == "torch":
        return [fmt(s.get("startup_s")), "-", fmt(s.get("median_ms")), fmt(s.get("p95_ms")), "-",
                fmt(s.get("mem_in_use_after_step_bytes")),
                fmt(s.get("mem_reserved_after_step_bytes")), fmt(s.get("parameters")), "-",
                fmt(s.get("final_loss"), 4)]
    it = s.get("iter_ms") or {}
    if not it.get("count"):  # no timed step (a run cut short): no statistics
        it = {}
    if not s.get("parameters"):
        s["parameters"] = None
    k = s.get("kernels")  # CUDA only: what CubeCL compiled, loaded and tuned
    kernels = "/".join(str(k.get(f, "?")) for f in
                       ("compiled", "from_cache", "tuned", "tune_results_loaded")) if k else "-"
    return [fmt(s.get("startup_s")), fmt(s.get("first_step_ms"), 1), fmt(it.get("median")),
            fmt(it.get("p95")), fmt(s.get("gpu_util_pct"), 1), fmt(s.get("peak_mem_in_use_bytes")),
            fmt(s.get("peak_mem_reserved_bytes")), fmt(s.get("parameters")), kernels,
            fmt(s.get("final_loss"), 4)]

COLS = ["phase", "recipe", "which", "framework", "status", "wall_s", "startup_s",
        "first_step_ms", "median_ms", "p95_ms", "gpu_util_pct", "mem_in_use", "mem_reserved",
        "parameters", "kernels", "final_loss"]

def render(results, out):
    rows = []
    if os.path.exists(results):
        with open(results) as f:
            rows = [dict(zip(COLS, line.rstrip("\n").split("\t"))) for line in f if line.strip()]
    L = ["## Start-up: time to the first step, cold then warm kernel cache", "",
         "| model | run | status | startup s | first step ms | process s | median ms/iter "
         "| parameters | kernels compiled / from cache / shapes tuned / tunings loaded |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["phase"] == "startup":
            L.append(f"| {r['recipe']} | {r['which']} | {r['status']} | {r['startup_s']} | "
                     f"{r['first_step_ms']} | {r['wall_s']} | {r['median_ms']} | "
                     f"{r['parameters']} | {r['kernels']} |")
    L += ["", "## Side by side: runner vs PyTorch (same resolved recipe)", "",
          "| recipe | repeat | runner ms/iter | torch ms/iter | runner/torch | runner GPU util % "
          "| runner mem in use / reserved GiB | torch mem allocated / reserved GiB "
          "| startup s runner / torch | params runner / torch |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
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
                 f"{g(ru, 'startup_s')} / {g(to, 'startup_s')} | "
                 f"{g(ru, 'parameters')} / {g(to, 'parameters')} |")
    L += ["", "ms/iter: median over the steps after warm-up. Memory: the largest reading after "
          "a step (runner: Burn's pool; torch: memory_allocated / memory_reserved). "
          "startup: process start to the end of the first step; process s: the whole "
          "runner process as the script timed it.", ""]
    with open(out, "w") as f:
        f.write("\n".join(L))

cmd = sys.argv[1]
if cmd == "unxz":
    unxz(sys.argv[2], sys.argv[3])
elif cmd == "row":
    print("\t".join(row(sys.argv[2], sys.argv[3])))
elif cmd == "render":
    render(sys.argv[2], sys.argv[3])
PY
py() { python3 "$HELPER" "$@"; }

# --- the binary ---
BIN=${1:-target/release/runner}
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

# --- the kernel cache ---
[[ ${FRESH_CACHE:-0} == 1 ]] && find "$RUNNER_CACHE_DIR" -mindepth 1 -delete
if [[ -n ${CACHE_IN:-} ]]; then
  if tar -C "$RUNNER_CACHE_DIR" -xzf "$CACHE_IN"; then say "cache: unpacked $CACHE_IN"
  else say "cache: cannot unpack $CACHE_IN; going on"; fi
fi
cache_files=$(find "$RUNNER_CACHE_DIR" -type f | wc -l)
if [[ $cache_files -eq 0 ]]; then cache_state="empty: phase 1's first runs are cold"
else cache_state="$cache_files files at start: phase 1's first runs are NOT cold"; fi
say "cache: $RUNNER_CACHE_DIR, $cache_state"

# --- the machine ---
SETS_DEV=() # every runner and show call gets these
TORCH_DEV=(--device "$DEVICE")
if [[ $DEVICE == cpu ]]; then
  SETS_DEV=(--set backend.kind=cpu)
fi
for kv in ${EXTRA_SETS:-}; do SETS_DEV+=(--set "$kv"); done
{
  echo "date: $(date -u +%FT%TZ)"
  if [[ $DEVICE == cpu ]]; then echo "DEVICE=cpu: nvidia-smi skipped"
  else timeout 20 nvidia-smi || echo "nvidia-smi: failed or missing"; fi
  echo "runner: $("$BIN" --version 2>&1)"
  timeout 60 "$PYTHON" -c '
import sys, torch, torchvision
print("python", sys.version.split()[0], "torch", torch.__version__, "torchvision",
      torchvision.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1 ||
    echo "torch: not importable with $PYTHON"
  echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}'), $(uname -srm)"
  echo "cache: $RUNNER_CACHE_DIR ($cache_state)"
  echo "settings: BUDGET=$BUDGET REPEATS=$REPEATS ARCHS='$ARCHS' RECIPES='$RECIPES'" \
    "MAX_STEPS=$MAX_STEPS WARMUP=$WARMUP STARTUP_STEPS=$STARTUP_STEPS" \
    "STARTUP_WARMUP=$STARTUP_WARMUP T_COLD=$T_COLD T_WARM=$T_WARM T_RUN=$T_RUN" \
    "DEVICE=$DEVICE EXTRA_SETS='${EXTRA_SETS:-}' GC_ROW=$GC_ROW"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# --- running things ---
# Seconds a run may take: its own timeout, cut to what is left of the budget; 0 = skip.
allow() {
  local left=$((BUDGET - (SECONDS - T0)))
  if ((left < 10)); then echo 0; elif (($1 < left)); then echo "$1"; else echo "$left"; fi
}
skipped=()
record() { # phase recipe which framework status wall_s result-file kind
  local tail
  tail=$(py row "$8" "$7")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$tail" >> "$RESULTS"
  py render "$RESULTS" "$TABLE"
  say "$1 $2 $3 $4: $5 (${6}s) | startup s, first step ms, median, p95, util %, in use, reserved, params, kernels, loss: $(echo "$tail" | tr '\t' ' ')"
}
status_of() { # exit code -> word
  case $1 in 0) echo ok ;; 124 | 137) echo timeout ;; *) echo "failed($1)" ;; esac
}
# runner_run PHASE RECIPE WHICH TIMEOUT TAG FILE SETS...: trains, records the row.
runner_run() {
  local phase=$1 recipe=$2 which=$3 limit=$4 tag=$5 file=$6
  shift 6
  local t
  t=$(allow "$limit")
  if ((t == 0)); then
    skipped+=("runner $recipe $which")
    record "$phase" "$recipe" "$which" runner skipped 0 /nonexistent runner
    return
  fi
  local start rc
  start=$(stamp)
  say "runner $recipe $which (timeout ${t}s)"
  (cd "$SCRATCH" && timeout -k 5 "$t" "$BIN" -q "$file" "$@" "${SETS_DEV[@]}" --set "log.dir=$RUNS/$tag")
  rc=$?
  local st
  st=$(status_of $rc)
  [[ $st == ok ]] || status=1
  local summary
  summary=$(find "$RUNS/$tag" -name summary.json 2>/dev/null | head -n 1)
  record "$phase" "$recipe" "$which" runner "$st" "$(since "$start")" "${summary:-/nonexistent}" runner
}
# torch_run RECIPE WHICH TIMEOUT TAG FILE [--gc-collect] -- SETS...: resolves, trains, records.
torch_run() {
  local recipe=$1 which=$2 limit=$3 tag=$4 file=$5
  shift 5
  local extra=()
  while [[ $# -gt 0 && $1 != -- ]]; do extra+=("$1"); shift; done
  shift
  local t
  t=$(allow "$limit")
  if ((t == 0)); then
    skipped+=("torch $recipe $which")
    record compare "$recipe" "$which" torch skipped 0 /nonexistent torch
    return
  fi
  local start rc resolved=$SCRATCH/resolved/$tag.toml json=$RUNS/torch/$tag.json
  start=$(stamp)
  say "torch $recipe $which (timeout ${t}s)"
  if ! "$BIN" show "$file" "$@" "${SETS_DEV[@]}" > "$resolved"; then
    status=1
    record compare "$recipe" "$which" torch "failed(show)" 0 /nonexistent torch
    return
  fi
  timeout -k 5 "$t" "$PYTHON" "$REPO/scripts/torch_ref.py" "$resolved" "${TORCH_DEV[@]}" "${extra[@]}" > "$json"
  rc=$?
  local st
  st=$(status_of $rc)
  [[ $st == ok ]] || status=1
  record compare "$recipe" "$which" torch "$st" "$(since "$start")" "$json" torch
}

# --- phase 1: start-up, cold then warm ---
# mlp and small_cnn may not carry model.stem (a ResNet key): they get article/default
# without it, resolved by the runner itself (absolute data paths), in the scratch dir.
NOSTEM=$SCRATCH/resolved/article_default_nostem.toml
"$BIN" show "$REPO/recipes/article/default.toml" | sed '/^stem *=/d' > "$NOSTEM"
say "phase 1: start-up, archs: $ARCHS"
for arch in $ARCHS; do
  file=$REPO/recipes/article/default.toml
  [[ $arch == resnet* ]] || file=$NOSTEM
  for which in cold warm; do
    limit=$T_COLD
    [[ $which == warm ]] && limit=$T_WARM
    runner_run startup "$arch" "$which" "$limit" "p1-$arch-$which" "$file" \
      --set "model.arch=$arch" --set "name=startup_$arch" \
      --set "run.max_steps=$STARTUP_STEPS" --set "run.warmup_steps=$STARTUP_WARMUP"
  done
done

# --- phase 2: side by side ---
say "phase 2: side by side, $REPEATS repeats: $RECIPES"
SMI_PID=
for i in $(seq "$REPEATS"); do
  for r in $RECIPES; do
    file=$REPO/recipes/$r.toml
    sets=(--set "run.max_steps=$MAX_STEPS" --set "run.warmup_steps=$WARMUP" --set run.eval=never)
    tag=p2-${r//\//_}-$i
    if [[ $r == article/default && $i == 1 && $DEVICE != cpu ]] && command -v nvidia-smi > /dev/null; then
      nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -lms 500 \
        > "$OUT/nvidia-smi.csv" 2>&1 &
      SMI_PID=$!
    fi
    runner_run compare "$r" "$i" "$T_RUN" "$tag-runner" "$file" "${sets[@]}"
    if [[ -n $SMI_PID ]]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; SMI_PID=; fi
    torch_run "$r" "$i" "$T_RUN" "$tag-torch" "$file" -- "${sets[@]}"
  done
done
if [[ $GC_ROW == 1 && " $RECIPES " == *" article/cleanup_every_step "* ]]; then
  torch_run "article/cleanup_every_step (torch: gc.collect)" 1 "$T_RUN" p2-gc-torch \
    "$REPO/recipes/article/cleanup_every_step.toml" --gc-collect -- \
    --set "run.max_steps=$MAX_STEPS" --set "run.warmup_steps=$WARMUP" --set run.eval=never
fi

# --- pack ---
if ((${#skipped[@]})); then
  say "skipped for the budget (${BUDGET}s): ${skipped[*]}"
  status=1
fi
py render "$RESULTS" "$TABLE"
echo
cat "$TABLE"
tar -C "$SCRATCH" -czf "$OUT/runs.tar.gz" --exclude='*.safetensors' --exclude=checkpoints \
  runs resolved
say "runs.tar.gz: $(du -h "$OUT/runs.tar.gz" | cut -f1)"
tar -C "$RUNNER_CACHE_DIR" -czf "$SCRATCH/cache.tar.gz" .
size=$(stat -c %s "$SCRATCH/cache.tar.gz")
if ((size > 15 * 1024 * 1024)); then
  say "cache.tar.gz is $((size / 1024 / 1024)) MiB, over 15 MiB: not kept"
else
  mv "$SCRATCH/cache.tar.gz" "$OUT/cache.tar.gz"
  say "cache.tar.gz: $((size / 1024)) KiB ($(find "$RUNNER_CACHE_DIR" -type f | wc -l) files)"
fi
rm -rf "$SCRATCH"
say "done in $((SECONDS - T0))s, exit $status"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null # log.txt is whole before $OUT is collected
exit $status
