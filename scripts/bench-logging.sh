#!/usr/bin/env bash
# What metrics.csv and the TensorBoard event file cost per step: a 53 µs MLP step on
# synthetic data (where any per-step cost would show), with both on and both off,
# alternating, 3 pairs. Prints each run's median step time and wall time.
#
#   cargo build --release && scripts/bench-logging.sh [path/to/runner]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/runner}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/o.toml" <<'TOML'
name = "o"
[backend]
kind = "cpu"
[model]
arch = "mlp"
hidden = [64]
[data]
format = "synthetic"
synthetic = { samples = 8192, test_samples = 64, image_size = 8, channels = 1 }
[loader]
batch_size = 32
[run]
epochs = 2
warmup_steps = 20
eval = "never"
TOML
cd "$WORK"
for i in 1 2 3; do
  for mode in on off; do
    sets=()
    [ "$mode" = off ] && sets=(--set log.csv=false --set log.tensorboard=false)
    rm -rf runs
    "$BIN" o.toml -q "${sets[@]}" > /dev/null
    python3 - "$mode" <<'PY'
import glob, json, sys
s = json.load(open(glob.glob("runs/o/*/summary.json")[0]))
print(f"{sys.argv[1]:>3}: median {s['iter_ms']['median']*1000:.1f} us/step, {s['steps']} steps, wall {s['wall_s']:.3f} s")
PY
  done
done
