#!/usr/bin/env bash
# The GPU check: the article's four recipes (twice each, for a spread) and resnet50_accum
# on CUDA, then the comparison table (Markdown and CSV) and the plot.
#
#   cargo build --release --features cuda          (on any x86-64 machine; builds offline)
#   scripts/gpu-check.sh [path/to/runner]          (on the GPU machine; ~5 minutes on one GPU)
#
# Results go to $OUT (default ./gpu-check-out): report.md, report.csv, article.svg,
# resnet50_accum.md, runs.tar.gz (every run directory), env.txt (driver, GPU), log.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/runner}")
OUT=$(realpath -m "${OUT:-gpu-check-out}")
REPEATS=${REPEATS:-2}
mkdir -p "$OUT"
SCRATCH=$(mktemp -d)
exec > >(tee "$OUT/log.txt") 2>&1

{ nvidia-smi || echo "nvidia-smi: not found"; "$BIN" --version; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
status=0
run() { (cd "$SCRATCH" && "$BIN" -q "$OLDPWD/$1") || { echo "FAILED: $1"; status=1; }; }
for i in $(seq "$REPEATS"); do
  for r in default cleanup_every_step empty_cache_every_step tuned_loader; do
    run "recipes/article/$r.toml"
  done
done
run recipes/resnet50_accum.toml

"$BIN" report "$SCRATCH/runs/article_"* --baseline article_default --format md --plot "$OUT/article.svg" | tee "$OUT/report.md"
"$BIN" report "$SCRATCH/runs/article_"* --baseline article_default --format csv > "$OUT/report.csv"
"$BIN" report "$SCRATCH/runs/resnet50_accum" --format md | tee "$OUT/resnet50_accum.md"
tar -C "$SCRATCH" -czf "$OUT/runs.tar.gz" runs
rm -rf "$SCRATCH"
exit $status
