#!/usr/bin/env bash
# Two runner builds side by side on this machine's CPU: the same recipes run by each in
# turn, ROUNDS times (alternating, so a noisy machine slows both alike), then one Markdown
# table per recipe of each build's median step time and its phases (forward + backward,
# optimizer) over the rounds, and their ratio. What BENCHMARKS.md's before/after rows of a
# CPU change come from.
#
#   git worktree add /tmp/before <commit> && (cd /tmp/before && cargo build --release)
#   cargo build --release
#   scripts/ab-cpu.sh /tmp/before/target/release/runner target/release/runner
#
# Settings (environment): ROUNDS (3), CASES (names below: "quickstart resnet18
# rotten_tomatoes spamassassin"). About 2 minutes with the defaults on 2 cores.
# Each run's line goes to stderr as it ends; if a run fails, its directory is kept and
# named.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN" >&2; exit 2; }
# The binaries as given, from the caller's directory; the recipes from the repository's.
A=$(realpath "$1")
B=$(realpath "$2")
cd "$(dirname "$0")/.."
for bin in "$A" "$B"; do
  [ -x "$bin" ] || { echo "ab-cpu: $bin is not an executable" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-quickstart resnet18 rotten_tomatoes spamassassin}
SCRATCH=$(mktemp -d)
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$SCRATCH"; else echo "ab-cpu: failed; runs kept in $SCRATCH" >&2; fi' EXIT

args_of() {
  case $1 in
    quickstart) echo "recipes/quickstart.toml --set run.max_steps=150 --set run.warmup_steps=20 --set run.eval=\"never\"" ;;
    resnet18) echo "recipes/resnet18_cpu.toml --set run.max_steps=12 --set run.warmup_steps=3" ;;
    rotten_tomatoes) echo "recipes/text/rotten_tomatoes.toml --set run.max_steps=150 --set run.warmup_steps=20 --set run.eval=\"never\"" ;;
    spamassassin) echo "recipes/text/spamassassin.toml --set run.max_steps=150 --set run.warmup_steps=20 --set run.eval=\"never\"" ;;
    *) echo "ab-cpu: unknown case $1 (quickstart, resnet18, rotten_tomatoes, spamassassin)" >&2; exit 2 ;;
  esac
}

for round in $(seq "$ROUNDS"); do
  for case in $CASES; do
    args=$(args_of "$case")
    for side in before after; do
      bin=$A; [ "$side" = after ] && bin=$B
      dir="$SCRATCH/$case/$side/$round"
      # $args is the recipe and its --set words, split as a shell would.
      eval "set -- $args"
      "$bin" "$@" -q --set "log.dir=\"$dir\"" >&2
    done
  done
done

python3 - "$SCRATCH" $CASES <<'PY'
import glob, json, statistics, sys
scratch, cases = sys.argv[1], sys.argv[2:]
print("| case | build | iter ms (each round) | median iter ms | forward+backward ms | optimizer ms | after / before |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for case in cases:
    med = {}
    for side in ("before", "after"):
        rows = []
        files = glob.glob(f"{scratch}/{case}/{side}/*/*/*/summary.json")
        round_of = lambda f: int(f[len(f"{scratch}/{case}/{side}/"):].split("/")[0])
        for f in sorted(files, key=round_of):
            p = json.load(open(f)).get("phases")
            if not p:
                sys.exit(f"ab-cpu: {f} has no step phases (no step after the warm-up?)")
            rows.append((p["iter_ms"], p["forward_backward_ms"], p["optimizer_ms"]))
        if not rows:
            sys.exit(f"ab-cpu: no summary for {case} ({side})")
        m = [statistics.median(c) for c in zip(*rows)]
        med[side] = m[0]
        each = "/".join(f"{r[0]:.1f}" for r in rows)
        ratio = f"{med['after'] / med['before']:.2f}" if side == "after" else ""
        print(f"| {case} | {side} | {each} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.2f} | {ratio} |")
PY
