#!/usr/bin/env bash
# A real Slurm test: install Debian's Slurm (slurm-wlm, munge), start a one-node cluster on
# localhost, submit a small CPU grid as a job array with `runner sweep --slurm --submit`
# (after its warm-up job), wait for it, and check that every cell completed and `runner
# report` covers them all.
#
#   .ci/slurm-test.sh path/to/runner          (as root; CI calls it after the tests)
set -euo pipefail
RUNNER=$(realpath "$1")
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge >/dev/null
fi

WORK=$(mktemp -d /tmp/runner-slurm.XXXXXX)
chmod 755 "$WORK"
cleanup() {
  local rc=$?
  scancel --quiet --user=root 2>/dev/null || true
  [ -f "$WORK/slurmd.pid" ] && kill "$(cat "$WORK/slurmd.pid")" 2>/dev/null || true
  [ -f "$WORK/slurmctld.pid" ] && kill "$(cat "$WORK/slurmctld.pid")" 2>/dev/null || true
  [ -f "$WORK/munge/munged.pid" ] && kill "$(cat "$WORK/munge/munged.pid")" 2>/dev/null || true
  # Kept after a failure (its logs say why), removed after a pass.
  if [ "$rc" -eq 0 ]; then sleep 1; rm -rf "$WORK"; else echo "slurm test files kept in $WORK"; fi
}
trap cleanup EXIT

# munge: a key and a daemon of our own, on our own socket.
mkdir -p "$WORK/munge"
dd if=/dev/urandom bs=1 count=1024 of="$WORK/munge/munge.key" status=none
chmod 700 "$WORK/munge"; chmod 400 "$WORK/munge/munge.key"
munged --force --socket="$WORK/munge/munge.socket" --key-file="$WORK/munge/munge.key" \
  --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/seed"

# One node, this machine, as `localhost`; no cgroups (containers rarely allow them).
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
mkdir -p "$WORK/spool" "$WORK/state"
cat > "$WORK/slurm.conf" <<CONF
ClusterName=runnerci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$WORK/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmdSpoolDir=$WORK/spool
StateSaveLocation=$WORK/state
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$WORK/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 60); do
  sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && break
  sleep 1
done
sinfo

# A small CPU grid, its sweep state and runs in the work directory. slurm.warmup = true
# (on by default only when tasks get a GPU): a warm-up job first, the array after it.
GRID=tests/fixtures/sweep/tiny_grid.toml
# A space and a `%j` in the path: sbatch splits `#SBATCH` lines at spaces and expands `%`.
LOGS="$WORK/runs 100%j"
"$RUNNER" sweep --slurm --submit "$GRID" --set "log.dir=\"$LOGS\"" --set slurm.warmup=true |
  tee "$WORK/submit.txt"
grep -q '^warm-up job [0-9]*: the array starts when it ends' "$WORK/submit.txt"
JOB=$(awk '/Submitted batch job/ {print $4}' "$WORK/submit.txt")
[ -n "$JOB" ] || { echo "no job id"; exit 1; }
for _ in $(seq 300); do
  [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] && break
  sleep 2
done
if [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ]; then
  squeue; echo "the array did not finish in 10 minutes"; exit 1
fi

SWEEP=$(ls -d "$LOGS"/tiny_grid/sweeps/*/)
CELLS=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cells']))" "$SWEEP/manifest.json")
DONE=$(grep -l '"state": "done"' "$SWEEP"/cells/*.json | wc -l)
echo "cells: $CELLS, done: $DONE"
for f in "$SWEEP"/slurm-*.out; do echo "== $f"; cat "$f"; done
[ "$DONE" -eq "$CELLS" ] || { echo "not every cell completed"; cat "$WORK"/slurmd.log | tail -30; exit 1; }
# The warm-up job ran (the array depended on it, so it ran first) and warmed the grid up.
for f in "$SWEEP"/warmup-*.out; do echo "== $f"; cat "$f"; done
grep -q 'warmed up on' "$SWEEP"/warmup-*.out || { echo "the warm-up job did not run"; exit 1; }
ROWS=$("$RUNNER" report "$LOGS/tiny_grid" --format csv | tail -n +2 | wc -l)
"$RUNNER" report "$LOGS/tiny_grid"
[ "$ROWS" -eq "$CELLS" ] || { echo "the report has $ROWS rows for $CELLS cells"; exit 1; }
echo "slurm: all $CELLS cells of the job array completed and are in the report"

# Preemption: one long cell (tests/fixtures/sweep/long_grid.toml, ~20 s) gets SIGTERM on its
# batch script as the time limit's --signal=B:TERM@120 would send it. The script passes it
# on, the runner checkpoints and exits 143, the task requeues itself and resumes the cell
# from its checkpoint: it must complete with every step once.
LONG=tests/fixtures/sweep/long_grid.toml
"$RUNNER" sweep --slurm --submit "$LONG" --set "log.dir=\"$LOGS\"" | tee "$WORK/submit-long.txt"
JOB=$(awk '/Submitted batch job/ {print $4}' "$WORK/submit-long.txt")
grep -q -- '--signal=B:TERM@' "$LOGS"/long_grid/sweeps/*/slurm.sbatch
for _ in $(seq 240); do
  LINES=$( (cat "$LOGS"/long_grid/*/*/metrics.jsonl 2>/dev/null || true) | wc -l)
  [ "$LINES" -ge 60 ] && break
  sleep 0.5
done
echo "signalling the running task after $LINES steps"
scancel --signal=TERM --batch "$JOB"
for _ in $(seq 300); do
  DONE_LONG=$( (grep -l '"state": "done"' "$LOGS"/long_grid/sweeps/*/cells/*.json 2>/dev/null || true) | wc -l)
  [ "$DONE_LONG" -eq 1 ] && [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] && break
  sleep 1
done
for f in "$LOGS"/long_grid/sweeps/*/slurm-*.out; do echo "== $f"; cat "$f"; done
RUN=$(ls -d "$LOGS"/long_grid/optim.lr=0.05/*/)
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/summary.json"))
steps = [json.loads(l)["step"] for l in open(run + "/metrics.jsonl")]
print("status", s["status"], "resumes", s["resumes"], "steps", s["steps"], "lines", len(steps))
assert s["status"] == "completed", s["status"]
assert s["resumes"] >= 1, "the cell was not resumed"
assert steps == list(range(1, 961)), "steps missing or repeated"
PY
echo "slurm: a signalled task checkpointed, requeued itself and resumed to the end"
