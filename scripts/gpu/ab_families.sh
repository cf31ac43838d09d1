#!/usr/bin/env bash
# scripts/gpu/ab_budget.sh over several workloads in one job, one after another on one GPU, each
# given as WORKLOAD:ROUNDS:STEPS:FRAC (SCALE=large; ENV_B, LIB_B and LIB_A as ab_budget.sh takes
# them, for every workload):
#   ENV_B="OFFLOAD_CAP_GATE=4MiB" scripts/gpu/ab_families.sh resnet50:2:8:0.5 lstm:1:8:0.7 \
#     hf_llama:1:10:0.5 reference:1:10:0.5
# WORKLOAD+ckpt: that workload with activation checkpointing (ab_budget.sh's CKPT=1), its files
# named WORKLOAD-ckpt.
# Leaves each workload's tables in $OUT/ab-WORKLOAD-FRAC.txt and its runs in $OUT/WORKLOAD-FRAC/,
# and prints each one's pooled line with the seconds it took. The LSTM at 50% is refused before
# its first step (a launch's ranges larger than the budget), so it runs at 70%.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
[ $# -gt 0 ] || { echo "usage: ab_families.sh WORKLOAD:ROUNDS:STEPS:FRAC ..." >&2; exit 2; }
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
for spec in "$@"; do
  IFS=: read -r w rounds steps frac <<< "$spec"
  [ -n "$w" ] && [ -n "$rounds" ] && [ -n "$steps" ] && [ -n "$frac" ] || {
    echo "ab_families.sh: '$spec' is not WORKLOAD:ROUNDS:STEPS:FRAC" >&2
    exit 2
  }
  t0=$SECONDS
  ckpt=0; [ "${w%+ckpt}" != "$w" ] && ckpt=1
  w=${w/+/-}  # the device machine's files come back only under plain names
  mkdir -p "$out/$w-$frac"
  OUT=$out/$w-$frac WORKLOAD=${w%-ckpt} CKPT=$ckpt SCALE=${SCALE:-large} FRAC=$frac STEPS=$steps ROUNDS=$rounds \
    RUN_TIMEOUT=${RUN_TIMEOUT:-150} bash "$root/scripts/gpu/ab_budget.sh" > "$out/ab-$w-$frac.txt" 2>&1
  echo "== $w at $frac, $rounds round(s) of $steps steps: $((SECONDS - t0)) s"
  grep '^Steady steps pooled' "$out/ab-$w-$frac.txt" || echo "no steady steps pooled: see ab-$w-$frac.txt"
done
