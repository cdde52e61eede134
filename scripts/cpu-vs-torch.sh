#!/usr/bin/env bash
# The CPU side by side: the same recipes trained by runner (Flex backend) and by PyTorch on
# the CPU (scripts/torch_ref.py), alternating, REPEATS times each, on THREADS threads; prints
# one Markdown table with each one's median ms/iter and their ratio (runner / PyTorch).
# Not part of CI (about 6 minutes on 2 cores with the defaults, after the release build it
# starts with: ~5 minutes from a cold target folder).
#
#   python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision
#   PYTHON=/tmp/torchenv/bin/python scripts/cpu-vs-torch.sh
#
# Cases: ResNet-18 (CIFAR stem) batch 32 = recipes/resnet18_cpu.toml; ResNet-50 batch 16 =
# the same with model.arch=resnet50, loader.batch_size=16; the quickstart (small_cnn,
# batch 32). Each: MAX_STEPS steps (20), the first WARMUP (5) left out, no evaluation.
# Settings (environment): PYTHON (python3), REPEATS (3), THREADS (2), MAX_STEPS, WARMUP,
# CASES (names from the list above: "resnet18 resnet50 quickstart").
# Each run's line (median ms/iter, p95, first losses) goes to stderr as it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-2}
MAX_STEPS=${MAX_STEPS:-20}
WARMUP=${WARMUP:-5}
CASES=${CASES:-resnet18 resnet50 quickstart}

"$PYTHON" -c "import torch, torchvision" || {
  echo "cpu-vs-torch: $PYTHON has no torch/torchvision; see the install line in this script's header" >&2
  exit 2
}
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/runner
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

recipe_of() {
  case $1 in
    resnet18) echo "recipes/resnet18_cpu.toml" ;;
    resnet50) echo "recipes/resnet18_cpu.toml --set model.arch=resnet50 --set loader.batch_size=16" ;;
    quickstart) echo "recipes/quickstart.toml" ;;
    *) echo "cpu-vs-torch: unknown case $1 (resnet18, resnet50, quickstart)" >&2; exit 2 ;;
  esac
}

median() { sort -g | awk '{a[NR]=$1} END {m=(NR+1)/2; print (NR%2 ? a[m] : (a[m-0.5]+a[m+0.5])/2)}'; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads" >&2
echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__)')" >&2
rows=()
for case in $CASES; do
  # shellcheck disable=SC2046 # the recipe line is a path and --set words
  "$BIN" show $(recipe_of "$case") --set run.max_steps="$MAX_STEPS" --set run.warmup_steps="$WARMUP" \
    --set run.eval=never --set backend.threads="$THREADS" --set log.dir="$SCRATCH/runs" \
    > "$SCRATCH/$case.toml"
  : > "$SCRATCH/$case.runner"
  : > "$SCRATCH/$case.torch"
  for i in $(seq "$REPEATS"); do
    line=$("$BIN" -q "$SCRATCH/$case.toml" 2>&1 | tail -1)
    echo "runner $case #$i: $line" >&2
    summary=$(ls -td "$SCRATCH"/runs/*/*/ | head -1)summary.json
    "$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['iter_ms']['median'])" "$summary" \
      >> "$SCRATCH/$case.runner"
    json=$("$PYTHON" scripts/torch_ref.py "$SCRATCH/$case.toml" --device cpu --threads "$THREADS" 2>/dev/null)
    echo "torch  $case #$i: $json" | cut -c1-220 >&2
    "$PYTHON" -c "import json,sys; print(json.loads(sys.argv[1])['median_ms'])" "$json" >> "$SCRATCH/$case.torch"
  done
  r=$(median < "$SCRATCH/$case.runner")
  t=$(median < "$SCRATCH/$case.torch")
  each_r=$(paste -sd/ "$SCRATCH/$case.runner" | sed 's/\.[0-9]*//g')
  each_t=$(paste -sd/ "$SCRATCH/$case.torch" | sed 's/\.[0-9]*//g')
  rows+=("| $case | $each_r | $each_t | $(printf '%.0f' "$r") | $(printf '%.0f' "$t") | $(awk -v r="$r" -v t="$t" 'BEGIN {printf "%.2f", r/t}') |")
done
echo "| case | runner ms/iter (each run) | PyTorch ms/iter (each run) | runner median | PyTorch median | ratio |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
