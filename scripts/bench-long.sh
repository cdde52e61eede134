#!/usr/bin/env bash
# What a long run costs the runner itself, by its length: a tiny MLP on synthetic data
# (~60 µs a step on the CPU, so 200,000 steps take ~15 s), where the runner's own
# bookkeeping is all that grows. For each binary given (the first is the one under test,
# e.g. a second built from an earlier commit to compare), prints:
#   - the run's resident memory (its metrics lines' rss_bytes) at step 1,000 and at its
#     end, and its wall time;
#   - the same run stopped by SIGINT three quarters in, then `runner resume`: the
#     resume's peak resident memory and wall time (/usr/bin/time -v);
#   - `runner report` of the long run: peak resident memory and wall time.
#
#   cargo build --release && scripts/bench-long.sh [STEPS] [runner [other-runner ...]]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200000}
shift || true
BINS=("$@")
[ ${#BINS[@]} -eq 0 ] && BINS=(target/release/runner)
command -v /usr/bin/time > /dev/null || { echo "needs /usr/bin/time (GNU time)"; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# 32 steps an epoch.
cat > "$WORK/long.toml" <<TOML
name = "long"
seed = 1
[backend]
kind = "cpu"
threads = 1
[model]
arch = "mlp"
hidden = [8]
[data]
format = "synthetic"
synthetic = { samples = 64, test_samples = 16, image_size = 4, channels = 1 }
[loader]
batch_size = 2
[run]
epochs = $(( (STEPS + 31) / 32 ))
warmup_steps = 5
eval = "end"
TOML
peak() { grep "Maximum resident" "$1" | awk '{printf "%.0f MB", $NF/1024}'; }
wall() { grep "Elapsed (wall" "$1" | awk '{print $NF}'; }
echo "| binary | steps | rss at step 1,000 | rss at the end | run wall | resume peak RSS | resume wall | report peak RSS | report wall |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for bin in "${BINS[@]}"; do
  BIN=$(realpath "$bin")
  cd "$WORK"
  rm -rf runs stop
  /usr/bin/time -v "$BIN" -q long.toml > /dev/null 2> run.time
  run=$(ls -d runs/long/*)
  rss=$(python3 - "$run" <<'PY'
import json, sys
lines = open(sys.argv[1] + "/metrics.jsonl").readlines()
at = lambda i: json.loads(lines[i])["rss_bytes"] / 1e6
print(f"{len(lines)} | {at(999):.1f} MB | {at(-1):.1f} MB")
PY
)
  /usr/bin/time -v "$BIN" report "$run" > /dev/null 2> report.time
  # The same run stopped three quarters in, then resumed.
  "$BIN" -q long.toml --set 'log.dir="stop"' > /dev/null 2>&1 &
  pid=$!
  until [ -f stop/long/*/metrics.jsonl ] && [ "$(wc -l < stop/long/*/metrics.jsonl)" -ge $(( STEPS * 3 / 4 )) ]; do
    sleep 0.2
  done
  kill -INT $pid
  wait $pid || true
  stopped=$(ls -d stop/long/*)
  /usr/bin/time -v "$BIN" resume -q "$stopped" > /dev/null 2> resume.time
  echo "| $(basename "$bin") | $rss | $(wall run.time) | $(peak resume.time) | $(wall resume.time) | $(peak report.time) | $(wall report.time) |"
  cd - > /dev/null
done
