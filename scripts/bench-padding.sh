#!/usr/bin/env bash
# The padding benchmark for BENCHMARKS.md: SpamAssassin (long length tail) with the three
# padding strategies, same model, data, seed and schedule, REPEATS times each; then the
# comparison (Markdown): padding tokens, waste, real tokens/s, ms/iter, test accuracy.
#
#   scripts/bench-padding.sh          (about 10 seconds on 2 cores, after the release build
#                                     it starts with: ~5 minutes from a cold target folder)
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-2}
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/runner
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
for i in $(seq "$REPEATS"); do
  for r in spamassassin spamassassin_max_length spamassassin_bucket; do
    "$BIN" -q "recipes/text/$r.toml" --set "log.dir=\"$SCRATCH/runs\"" >&2
  done
done
"$BIN" report "$SCRATCH/runs/spamassassin" "$SCRATCH/runs/spamassassin_max_length" "$SCRATCH/runs/spamassassin_bucket" --baseline spamassassin --format md
