#!/usr/bin/env bash
# CPU benchmarks for BENCHMARKS.md: the quickstart and ResNet-18 (batch 32) recipes,
# REPEATS times each, then the comparison table; and the runner's per-step overhead.
#
#   scripts/bench-cpu.sh            (about 8 minutes on 2 cores; REPEATS=1 for ~3; after the
#                                   release build it starts with: ~5 minutes from a cold target)
#
# Runs go to a scratch directory; the table is printed as Markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-2}
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/runner
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" >&2
for i in $(seq "$REPEATS"); do
  for r in quickstart resnet18_cpu; do
    (cd "$SCRATCH" && "$BIN" -q "$OLDPWD/recipes/$r.toml" >&2)
  done
done
"$BIN" report "$SCRATCH/runs" --format md
echo
cargo bench --quiet --bench overhead
