#!/usr/bin/env bash
# The device budget as a user meets it, on a GPU machine with PyTorch (scripts/bench/budget.py):
#   scripts/gpu/budget.sh fit  WORKLOAD...   plain; plain and liboffload with the GPU's free memory
#                                            held at 70% of plain's peak; managed memory there
#   scripts/gpu/budget.sh fracs WORKLOAD...  plain, the model with activation checkpointing (where the
#                                            family has a form of it), then liboffload at 90/75/50%
#                                            of plain's peak
#   scripts/gpu/budget.sh ckpt WORKLOAD...   plain, the model with activation checkpointing, then that
#                                            checkpointed model under liboffload at 50% and 35%
#                                            (CKPT_FRACS) of the checkpointed model's peak
#   scripts/gpu/budget.sh exits             the exit paths of a process under the shim with a budget
#                                            (scripts/bench/exit_paths.py): status and no abort
# Env: SCALE (small|large), STEPS (20), MANAGED_STEPS (3), MARGIN (bytes subtracted from the free
# memory for what never passes through the allocator, 1 GiB), FRACS ("0.9 0.75 0.5"), CAP_ALSO
# (more liboffload runs beside each, "tag:VAR=value,VAR=value ...", e.g. "piece0:OFFLOAD_CAP_PIECE=0";
# their results are named cap<fraction>-<tag>; ARM_LIB=path in an arm's variables runs that
# arm with another build of liboffload.so, e.g. the previous commit's, side by side; CAP_AGAIN=1 runs
# the first one again after the arms, named <name>-again, so that each order is measured).
# DAEMON_POOL=SIZE starts offloadd with a host pool of SIZE first and waits until it is faulted in,
# as a node's daemon started before the job would be: an arm with OFFLOAD_DAEMON=connect in its
# variables then puts its evicted bytes there (e.g. CAP_ALSO="pool:OFFLOAD_DAEMON=connect").
# Needs .carry/bin from scripts/gpu/prepare.sh. Leaves $OUT/budget-<plan>.tgz (brought up to date
# after every run) and prints a table.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
plan=$1; shift
out=${OUT:-/tmp/out}; work=$(mktemp -d); mkdir -p "$out"
lib=$root/.carry/bin/liboffload.so
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONUNBUFFERED=1 OFFLOAD_DAEMON=off
# Each run's files are archived as soon as it ends: a job cut short keeps the runs that finished.
py() {
  timeout "${RUN_TIMEOUT:-900}" python3 "$root/scripts/bench/budget.py" --scale "${SCALE:-small}" --workdir "$work" "$@"
  local rc=$?
  tar -C "$work" -czf "$out/budget-$plan.tgz" . 2> /dev/null
  return $rc
}
# cap NAME BUDGET ARGS...: liboffload at BUDGET, then once more for each CAP_ALSO arm.
cap() {
  local name=$1 budget=$2; shift 2
  OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=$lib py "$@" --out "$work/$name.json" 2> "$work/$name.log"
  local arm
  for arm in ${CAP_ALSO:-}; do
    local tag=${arm%%:*} vars=${arm#*:}
    (export ${vars//,/ }; OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=${ARM_LIB:-$lib} py "$@" --out "$work/$name-$tag.json" \
      2> "$work/$name-$tag.log")
  done
  # CAP_AGAIN=1: the first run once more after the arms (NAME-again), so that a comparison has
  # each order: the run that comes first in a job has been up to 2 s slower over its first step.
  if [ "${CAP_AGAIN:-0}" = 1 ] && [ -n "${CAP_ALSO:-}" ]; then
    OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=$lib py "$@" --out "$work/$name-again.json" 2> "$work/$name-again.log"
  fi
}
peak_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_rise'])" "$1"; }
if [ "$plan" = exits ]; then
  for m in normal oom raise sysexit child; do
    OFFLOAD_DEVICE_BUDGET=8GiB LD_PRELOAD=$lib timeout 300 python3 "$root/scripts/bench/exit_paths.py" $m \
      > "$work/exit-$m.log" 2>&1
    rc=$?
    grep -q "terminate called" "$work/exit-$m.log" && verdict=ABORT || verdict=clean
    echo "exit $m: status $rc, $verdict" | tee -a "$work/exits.txt"
  done
  tar -C "$work" -czf "$out/budget-$plan.tgz" .
  exit 0
fi
if [ -n "${DAEMON_POOL:-}" ]; then
  "$root/.carry/bin/offloadd" --pool-size "$DAEMON_POOL" > "$work/offloadd.log" 2>&1 &
  daemon_pid=$!
  trap 'kill $daemon_pid 2> /dev/null' EXIT
  for _ in $(seq 600); do grep -q "pool faulted in" "$work/offloadd.log" && break; sleep 0.5; done
  grep "pool faulted in" "$work/offloadd.log" || echo "offloadd: the pool was not faulted in within 300 s"
fi
python3 "$root/scripts/bench/link.py" > "$work/link.json" 2> "$work/link.log" || rm -f "$work/link.json"
for w in "$@"; do
  py --workload "$w" --steps "${STEPS:-20}" --out "$work/$w-plain.json" 2> "$work/$w-plain.log"
  peak=$(peak_of "$work/$w-plain.json")
  if [ "$plan" = fit ]; then
    free=$((peak * 7 / 10)); budget=$((free - ${MARGIN:-1073741824}))
    py --workload "$w" --steps 2 --hog-to "$free" --out "$work/$w-plain-hog.json" 2> "$work/$w-plain-hog.log"
    cap "$w-cap" "$budget" --workload "$w" --steps "${STEPS:-20}" --hog-to "$free"
    [ "${MANAGED_STEPS:-3}" = 0 ] || PYTORCH_CUDA_ALLOC_CONF= py --workload "$w" --steps "${MANAGED_STEPS:-3}" \
      --hog-to "$free" --managed --out "$work/$w-managed.json" 2> "$work/$w-managed.log"
  elif [ "$plan" = ckpt ]; then
    py --workload "$w" --steps "${STEPS:-20}" --ckpt --out "$work/$w-ckpt.json" 2> "$work/$w-ckpt.log"
    ckpt_peak=$(peak_of "$work/$w-ckpt.json")
    for f in ${CKPT_FRACS:-0.5 0.35}; do
      budget=$(python3 -c "print(int($ckpt_peak * $f))")
      cap "$w-ckpt-cap$f" "$budget" --workload "$w" --steps "${STEPS:-20}" --ckpt
    done
  else
    py --workload "$w" --steps "${STEPS:-20}" --ckpt --out "$work/$w-ckpt.json" 2> "$work/$w-ckpt.log"
    for f in ${FRACS:-0.9 0.75 0.5}; do
      budget=$(python3 -c "print(int($peak * $f))")
      cap "$w-cap$f" "$budget" --workload "$w" --steps "${STEPS:-20}"
    done
  fi
done
python3 "$root/scripts/bench/budget_report.py" "$work"/*.json | tee "$work/table.md"
tar -C "$work" -czf "$out/budget-$plan.tgz" .
