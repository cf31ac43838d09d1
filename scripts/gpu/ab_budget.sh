#!/usr/bin/env bash
# Two builds of liboffload.so under one device budget, alternated on one GPU (A B B A A B ...: each
# round reverses the order of the one before), so that neither has the job's first place or the
# place after the other: scripts/bench/budget.py's runs of one workload, a plain run first
# (the budget is FRAC of its peak rise, and its losses and parameters the bitwise reference), then
# budget_report.py's tables and the two arms' steady steps (from the fourth) pooled:
#   LIB_B=.carry/prev/liboffload.so WORKLOAD=reference SCALE=large FRAC=0.5 STEPS=10 ROUNDS=2 \
#     scripts/gpu/ab_budget.sh
# LIB_A defaults to .carry/bin/liboffload.so (scripts/gpu/prepare.sh). ENV_B="VAR=value ..." sets
# variables in arm B alone; LIB_B then defaults to LIB_A (one build, two settings):
#   ENV_B="OFFLOAD_CAP_AHEAD_HORIZON=ceiling" WORKLOAD=reference SCALE=large scripts/gpu/ab_budget.sh
# CKPT=1: the model with activation checkpointing in every run (budget.py --ckpt), the budget a
# FRAC of that run's peak rise. Leaves $OUT/ab-budget-WORKLOAD-FRAC.tgz.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; work=$(mktemp -d); mkdir -p "$out"
w=${WORKLOAD:-reference}; frac=${FRAC:-0.5}
lib_a=${LIB_A:-$root/.carry/bin/liboffload.so}; env_b=${ENV_B:-}
[ -n "${LIB_B:-}$env_b" ] || { echo "ab_budget.sh: LIB_B (the other build of liboffload.so) or ENV_B (arm B's variables) is needed" >&2; exit 2; }
lib_b=${LIB_B:-$lib_a}
ckpt=(); [ "${CKPT:-0}" = 1 ] && ckpt=(--ckpt)
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONUNBUFFERED=1 OFFLOAD_DAEMON=off
py() {
  timeout "${RUN_TIMEOUT:-300}" python3 "$root/scripts/bench/budget.py" --workload "$w" --scale "${SCALE:-small}" \
    --steps "${STEPS:-10}" --workdir "$work" "${ckpt[@]}" "$@"
  tar -C "$work" -czf "$out/ab-budget-$w-$frac.tgz" . 2> /dev/null
}
python3 "$root/scripts/bench/link.py" > "$work/link.json" 2> "$work/link.log" || rm -f "$work/link.json"
py --out "$work/$w-plain.json" 2> "$work/$w-plain.log"
budget=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['peak_rise'] * $frac))" "$work/$w-plain.json")
for r in $(seq "${ROUNDS:-2}"); do
  arms="a b"; [ $((r % 2)) = 0 ] && arms="b a"
  for arm in $arms; do
    lib=$lib_a vars=""; [ $arm = b ] && lib=$lib_b vars=$env_b
    (for v in $vars; do export "$v"; done
     OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=$lib py --out "$work/$w-cap$frac-$arm$r.json" 2> "$work/$w-cap$frac-$arm$r.log")
  done
done
python3 "$root/scripts/bench/budget_report.py" "$work"/*.json | tee "$work/table.md"
python3 - "$work" "$w" "$frac" <<'PY' | tee -a "$work/table.md"
import glob, json, math, statistics, sys
work, w, frac = sys.argv[1:]
steps = {}
for arm in "ab":
    steps[arm] = [ms for f in sorted(glob.glob(f"{work}/{w}-cap{frac}-{arm}*.json"))
                  for ms in json.load(open(f))["step_ms"][3:]]
a, b = steps["a"], steps["b"]
if len(a) > 1 and len(b) > 1:
    d = statistics.mean(b) - statistics.mean(a)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    print(f"\nSteady steps pooled: A {statistics.median(a):.1f} ms (median of {len(a)}), "
          f"B {statistics.median(b):.1f} ms (median of {len(b)}); mean B - A {d:+.1f} ms, "
          f"about +-{1.96 * se:.1f} (95%)")
PY
tar -C "$work" -czf "$out/ab-budget-$w-$frac.tgz" .
