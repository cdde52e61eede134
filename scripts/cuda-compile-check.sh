#!/usr/bin/env bash
# Compiles, on a machine without a GPU, every CUDA kernel a `--features cuda` runner needs
# for each CASE, with the real NVRTC of CUDA 13.0 (the H200 machine's driver version), and
# says which fail to compile and how long NVRTC took. Nothing is measured on a GPU here.
#
#   scripts/cuda-compile-check.sh RUNNER [CASE...]
#
# RUNNER: a `cargo build --release --features cuda` binary. CASE: RECIPE[,KEY=VALUE...],
# the recipe run for STEPS steps with those overrides (default: the cases below; a value
# may be an array or a table, its commas kept: "r.toml,model.hidden=[64,64]"). How:
# - NVRTC, the CUDA headers and ptxas come from NVIDIA's pip wheels (nvidia-cuda-nvrtc,
#   -runtime, -crt, -cccl, -nvcc, all 13.0), downloaded once into CUDA_TOOLKIT (default
#   ~/.cache/runner-cuda13, about 120 MB; pip needs PyPI or a mirror the first time).
# - scripts/fake-cuda/libcuda.c, built here, stands in for the driver: one device that
#   says it is compute capability 9.0 (an H100/H200: sm_90a, TMA, tensor cores), memory in
#   host memory, kernel launches that run nothing. CubeCL generates each kernel and NVRTC
#   compiles it as on the GPU machine; the PTX then goes to `ptxas -arch=sm_90a` (what the
#   driver would do with it when it loads it). Every number a run prints (loss, accuracy,
#   ms/iter) is meaningless: no kernel ran.
# - scripts/fake-cuda/libnvrtc.c, built here, sits in front of the real NVRTC and records
#   each compilation (time, ok or FAILED, entry point): CubeCL drops a candidate that fails
#   inside an autotune without a word, and the runner falls back from a convolution kernel
#   that fails (said once), so a failure on the GPU machine would cost speed, not an error.
#
# Out (OUT, default ./cuda-compile-check-out): compile-check.md (a row per case: the run's
# status, NVRTC compilations ok / failed and their total seconds, the slowest kernel,
# PTX files assembled by ptxas ok / failed and the seconds ptxas took for them all, one
# at a time: about what the driver spends loading them on a cold start; the process's
# first step), and per case its NVRTC log, the failed
# kernels' sources and NVRTC's messages, ptxas's messages, the runner's output. Exit 0 when
# every case completed, compiled at least one kernel, and had no compilation or assembly
# failure; 1 otherwise; 2 on bad use or what the script needs missing (python3 with pip,
# cc); 3 when pip could not fetch the wheels (no index reachable: nothing was checked).
# Paths (RUNNER, OUT, CUDA_TOOLKIT, a CASE's recipe) are relative to where it is run.
# Settings (environment): STEPS (2), T_CASE (seconds per case, 900), PTXAS (1: assemble
# every PTX; 0: skip), WARM_STEPS (0; N: run each case again on the kernels just cached,
# N timed steps after 10: the median time of a step's host side, since no launch does any
# work, and the kernel launches a step makes, by kernel in launches-by-kernel.txt), THREADS (with WARM_STEPS, 1: each thread's
# CPU time a warm step, its work apart from its waiting, by `perf record`; see below),
# FUSION (true: `backend.fusion` of a case that does not set it, as `"auto"` chooses on the
# GPU machine's 16 cores; empty: the recipe's, so `"auto"` by this machine's CPUs), CPUS
# (a CPU list for `taskset -c`: the runner runs on those alone), CUDA_TOOLKIT, OUT.
# THREADS: CubeCL 0.10's threads wait for work by spinning (`cubecl_common`'s device
# channel), so a thread's CPU time is its work plus its waiting, and where the threads
# outnumber the cores the waiting is most of the step. `perf record -F 1000` samples the
# warm run and one of 10 steps; a sample in the channel's wait loops (`submit_inner`,
# `Server::start`: not their closures, which are tasks run), the scheduler or the return
# from an interrupt (the timer's, mostly, while spinning) counts as waiting, any other
# as work, and the
# difference of the two runs over N is each thread's ms a step: `runner` (the training
# loop), `DSU-*` (fusion's thread), `DSD-*` (CubeCL's device thread), `loader-*`.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: scripts/cuda-compile-check.sh RUNNER [CASE...]" >&2
  exit 2
fi
for tool in python3 cc; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed" >&2; exit 2; }
done
python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3's pip is needed (python3 -m pip)" >&2; exit 2; }
# Everything the caller names, from where it was run, before moving to the checkout.
BIN=$(realpath -e "$1") || { echo "error: no runner at $1" >&2; exit 2; }
shift
OUT=$(realpath -m "${OUT:-cuda-compile-check-out}")
CUDA_TOOLKIT=$(realpath -m "${CUDA_TOOLKIT:-$HOME/.cache/runner-cuda13}")
CASES=()
for case in "$@"; do
  recipe=${case%%,*}
  rest=${case#"$recipe"}
  CASES+=("$(realpath -m "$recipe")$rest")
done
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
. scripts/split-sets.sh
if [ ${#CASES[@]} -eq 0 ]; then
  A=$REPO/recipes/article/default.toml
  CASES=(
    "$A,model.arch=mlp,~model.stem"
    "$A,model.arch=small_cnn,~model.stem"
    "$A,model.arch=resnet18"
    "$A"
    "$A,backend.conv_split=off"
    "$A,backend.norm_sums=reduce"
    "$A,backend.matmul=autotune"
    "$A,backend.fusion=false"
    "$A,backend.conv_kernel=specialized_tma"
    "$A,backend.conv_kernel=simple_async_tma"
    "$A,backend.conv_kernel=specialized_async_cyclic"
    "$REPO/recipes/resnet50_accum.toml,backend.kind=cuda,run.early_stop.patience=1000"
    "$REPO/recipes/text/rotten_tomatoes_transformer.toml,backend.kind=cuda"
    "$REPO/recipes/text/rotten_tomatoes_lstm.toml,backend.kind=cuda"
  )
fi
STEPS=${STEPS:-2}
FUSION=${FUSION-true}
RUN=()
if [ -n "${CPUS:-}" ]; then
  command -v taskset >/dev/null || { echo "error: CPUS needs taskset (util-linux)" >&2; exit 2; }
  RUN=(taskset -c "$CPUS")
fi
if [ "${THREADS:-0}" = 1 ]; then
  command -v perf >/dev/null || { echo "error: THREADS=1 needs perf" >&2; exit 2; }
fi
T_CASE=${T_CASE:-900}
PTXAS=${PTXAS:-1}
VERSION=13.0.88
CCCL_VERSION=13.0.85
mkdir -p "$OUT" || exit 2

# --- the toolkit: NVIDIA's wheels, unpacked once ---
CU=$CUDA_TOOLKIT/nvidia/cu13
STAMP=$CUDA_TOOLKIT/version
if [ "$(cat "$STAMP" 2>/dev/null)" != "$VERSION $CCCL_VERSION" ] || [ ! -e "$CU/lib/libnvrtc.so.13" ] \
  || [ ! -e "$CU/include/crt/mma.h" ] || [ ! -x "$CU/bin/ptxas" ]; then
  echo "fetching NVRTC, the CUDA headers and ptxas $VERSION (pip wheels) into $CUDA_TOOLKIT"
  rm -rf "$CUDA_TOOLKIT/wheels" "$CUDA_TOOLKIT/nvidia" "$STAMP"
  mkdir -p "$CUDA_TOOLKIT/wheels" || exit 2
  python3 -m pip download -q --no-deps -d "$CUDA_TOOLKIT/wheels" \
    "nvidia-cuda-nvrtc==$VERSION" "nvidia-cuda-runtime==$VERSION" "nvidia-cuda-crt==$VERSION" \
    "nvidia-cuda-nvcc==$VERSION" "nvidia-cuda-cccl==$CCCL_VERSION" || {
    echo "error: pip could not fetch the wheels (is PyPI reachable?)" >&2
    exit 3
  }
  for w in "$CUDA_TOOLKIT"/wheels/*.whl; do
    python3 -m zipfile -e "$w" "$CUDA_TOOLKIT" || exit 2
  done
  chmod +x "$CU"/bin/* 2>/dev/null
  echo "$VERSION $CCCL_VERSION" > "$STAMP"
fi

# --- the stand-in driver and the recording NVRTC ---
LIBS=$OUT/.libs
mkdir -p "$LIBS" || exit 2
cc -shared -fPIC -O1 -I"$CU/include" -o "$LIBS/libcuda.so.1" scripts/fake-cuda/libcuda.c || exit 2
cc -shared -fPIC -O1 -Wl,-soname,libnvrtc.so.13 -o "$LIBS/libnvrtc.so.13" scripts/fake-cuda/libnvrtc.c -ldl -lpthread || exit 2
# cudarc tries the plain names first: a toolkit's libnvrtc.so or a driver's libcuda.so on
# the loader's path would be taken instead of these (and nothing recorded).
ln -sf libnvrtc.so.13 "$LIBS/libnvrtc.so"
ln -sf libcuda.so.1 "$LIBS/libcuda.so"

row() { printf '| %s |\n' "$(IFS='|'; echo "$*" | sed 's/|/ | /g')"; }
TABLE=$OUT/compile-check.md
{
  echo "# CUDA kernels compiled without a GPU ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "runner: \`$("$BIN" --version 2>/dev/null)\` ($BIN); NVRTC $VERSION for sm_90a through the stand-in driver; $STEPS steps per case, each with an empty kernel cache; $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
  echo
  row "case" "status" "NVRTC ok" "NVRTC failed" "NVRTC s" "slowest kernel (s)" "ptxas ok / failed (s)" "first step done (s)" "warm step: host ms/iter, launches"
  row "---" "---" "---" "---" "---" "---" "---" "---" "---"
} > "$TABLE"

BAD=0
n=0
for case in "${CASES[@]}"; do
  n=$((n + 1))
  IFS=',' read -r recipe overrides <<< "$case,"
  overrides=${overrides%,}
  tag=$(printf '%02d' "$n")
  dir=$OUT/case-$tag
  rm -rf "$dir"
  mkdir -p "$dir/ptx" "$dir/failed" "$dir/cache" "$dir/runs"
  sets=(--set run.max_steps="$STEPS" --set run.warmup_steps=0 --set "log.dir=\"$dir/runs\"")
  mapfile -t extra < <(split_sets "$overrides")
  for kv in ${extra[@]+"${extra[@]}"}; do
    [ -n "$kv" ] && sets+=(--set "$kv")
  done
  case ",$overrides," in
    *,backend.fusion=*) ;;
    *) [ -n "$FUSION" ] && sets+=(--set "backend.fusion=$FUSION") ;;
  esac
  echo "== case $tag: ${case#"$REPO/"}"
  start=$SECONDS
  LD_LIBRARY_PATH=$LIBS:$CU/lib REAL_NVRTC=$CU/lib/libnvrtc.so.13 CUDA_PATH=$CU \
    FAKE_CUDA_DRIVER=13000 FAKE_CUDA_PTX_DIR=$dir/ptx NVRTC_LOG=$dir/nvrtc.tsv \
    NVRTC_FAILED_DIR=$dir/failed RUNNER_CACHE_DIR=$dir/cache \
    timeout -k 10 "$T_CASE" ${RUN[@]+"${RUN[@]}"} "$BIN" "$recipe" -q "${sets[@]}" > "$dir/runner.txt" 2>&1
  rc=$?
  summary=$(find "$dir/runs" -name summary.json | head -1)
  status=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['status'])" "$summary" 2>/dev/null || echo "no run")
  [ $rc -eq 124 ] && status="timeout ($T_CASE s)"
  startup=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['startup_s']; print(f'{s:.1f}' if s is not None else '-')" "$summary" 2>/dev/null || echo -)
  read -r ok failed secs slowest <<< "$(awk -F'\t' '
    { if ($2 == "ok") ok++; else failed++; t += $1; if ($1 > m) { m = $1; k = $3 } }
    END { printf "%d %d %.1f %s(%.1f)\n", ok, failed, t / 1000, (k == "" ? "-" : k), m / 1000 }' "$dir/nvrtc.tsv" 2>/dev/null)"
  pok=0; pbad=0; pstart=$(date +%s.%N)
  if [ "$PTXAS" = 1 ]; then
    for p in "$dir"/ptx/*.ptx; do
      [ -e "$p" ] || continue
      if "$CU/bin/ptxas" -arch=sm_90a "$p" -o /dev/null > "${p%.ptx}.ptxas.txt" 2>&1; then
        pok=$((pok + 1)); rm -f "${p%.ptx}.ptxas.txt"
      else
        pbad=$((pbad + 1))
      fi
    done
    ptxas="$pok / $pbad ($(awk -v a="$pstart" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
  else
    ptxas="(not run)"
  fi
  # The PTX itself is bulky: only that of kernels ptxas refused is kept.
  find "$dir/ptx" -name '*.ptx' | while read -r p; do [ -e "${p%.ptx}.ptxas.txt" ] || rm -f "$p"; done
  # WARM_STEPS: the same recipe again on the cache just filled, its steps' host side
  # alone (launches run nothing): median ms/iter after 10 untimed steps, launches a step.
  warm="-"
  if [ "${WARM_STEPS:-0}" -gt 0 ] && [ "$status" = completed ]; then
    wsets=("${sets[@]}" --set run.max_steps="$((WARM_STEPS + 10))" --set run.warmup_steps=10 --set "log.dir=\"$dir/warm\"")
    LD_LIBRARY_PATH=$LIBS:$CU/lib REAL_NVRTC=$CU/lib/libnvrtc.so.13 CUDA_PATH=$CU \
      FAKE_CUDA_DRIVER=13000 FAKE_CUDA_LOG=$dir/launches.txt RUNNER_CACHE_DIR=$dir/cache \
      timeout -k 10 "$T_CASE" ${RUN[@]+"${RUN[@]}"} "$BIN" "$recipe" -q "${wsets[@]}" > "$dir/warm.txt" 2>&1
    wsummary=$(find "$dir/warm" -name summary.json | head -1)
    warm=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('%.1f ms, %d launches' % (s['iter_ms']['median'], int(sys.argv[2]) // s['steps']))" \
      "$wsummary" "$(wc -l < "$dir/launches.txt" 2>/dev/null || echo 0)" 2>/dev/null || echo "failed")
    # Which kernels those launches were (entry points as CubeCL names them), per step.
    if [ -s "$dir/launches.txt" ] && [ -n "$wsummary" ]; then
      python3 - "$wsummary" "$dir/launches.txt" > "$dir/launches-by-kernel.txt" <<'PY' || true
import collections, json, sys
steps = json.load(open(sys.argv[1]))["steps"]
counts = collections.Counter(l.strip() for l in open(sys.argv[2], errors="replace"))
total = sum(counts.values())
print(f"# {total} launches over {steps} steps (warm-up and evaluation included): per step")
for name, n in counts.most_common():
    print(f"{n / steps:9.1f}  {name}")
PY
    fi
    rm -f "$dir/launches.txt"
    if [ "${THREADS:-0}" = 1 ] && [ "$warm" != failed ]; then
      # Per thread: samples (1 ms each) of work and of waiting, a run of 10 steps and one
      # of 10 + WARM_STEPS; their difference over WARM_STEPS is a step's.
      for n_steps in 10 "$((WARM_STEPS + 10))"; do
        LD_LIBRARY_PATH=$LIBS:$CU/lib REAL_NVRTC=$CU/lib/libnvrtc.so.13 CUDA_PATH=$CU \
          FAKE_CUDA_DRIVER=13000 RUNNER_CACHE_DIR=$dir/cache \
          timeout -k 10 "$T_CASE" perf record -q -F 1000 -o "$dir/perf.data" \
          ${RUN[@]+"${RUN[@]}"} "$BIN" "$recipe" -q "${sets[@]}" --set run.max_steps="$n_steps" \
          --set run.warmup_steps=5 --set "log.dir=\"$dir/perf-runs\"" > /dev/null 2>&1
        perf script -i "$dir/perf.data" -F comm,ip,sym 2>/dev/null | awk '
          { t = $1; n[t]++
            if ($0 ~ /submit_inner$|Server::start$|sched_yield|nanosleep|finish_task_switch|futex|schedule|irqentry_exit_to_user_mode|_raw_spin_unlock_irqrestore/) w[t]++ }
          END { for (t in n) printf "%s %d %d\n", t, n[t] - w[t], w[t] }' | sort > "$dir/threads-$n_steps.txt"
      done
      join "$dir/threads-10.txt" "$dir/threads-$((WARM_STEPS + 10)).txt" | awk -v n="$WARM_STEPS" '
        { work = ($4 - $2) / n; wait = ($5 - $3) / n
          if (work + wait >= 0.05) printf "%s %.1f ms work, %.1f ms waiting\n", $1, work, wait }' > "$dir/threads.txt"
      rm -rf "$dir/perf.data" "$dir/perf-runs" "$dir"/threads-*.txt
      warm="$warm; a step's work by thread: $(awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }' "$dir/threads.txt") ms"
    fi
  fi
  rm -rf "$dir/cache"
  row "\`${case#"$REPO/"}\`" "$status" "${ok:-0}" "${failed:-0}" "${secs:-0}" "${slowest:--}" "$ptxas" "$startup" "$warm" >> "$TABLE"
  echo "   $status in $((SECONDS - start)) s: NVRTC ${ok:-0} ok, ${failed:-0} failed, ${secs:-0} s; ptxas $ptxas; warm step $warm"
  # None compiled: the recording NVRTC was not the one loaded (or nothing ran).
  if [ "$status" != completed ] || [ "${failed:-0}" != 0 ] || [ "$pbad" != 0 ] || [ "${ok:-0}" = 0 ]; then
    BAD=1
    for f in "$dir"/failed/*.log; do
      [ -e "$f" ] && { echo "   NVRTC failed: $(grep -m1 -i error "$f")"; }
    done
    [ "$status" != completed ] && tail -5 "$dir/runner.txt" | sed 's/^/   runner: /'
  fi
done
echo
cat "$TABLE"
exit $BAD
