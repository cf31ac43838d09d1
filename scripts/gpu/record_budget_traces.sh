#!/usr/bin/env bash
# Steps of scripts/bench/budget.py's families recorded with GPU times (OFFLOAD_TRACE, no budget),
# for `offloadctl replay --cap` to count a residency policy's mappings and handles on them:
#   scripts/gpu/record_budget_traces.sh WORKLOAD...   ->  $OUT/traces/<workload>.trace (step 6)
# Env: SCALE (small|large), STEPS (8), CKPT=1 (the family's checkpointed form, --ckpt, recorded as
# <workload>-ckpt.trace). Needs .carry/bin from scripts/gpu/prepare.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; work=$(mktemp -d); mkdir -p "$out/traces"
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONUNBUFFERED=1 OFFLOAD_DAEMON=off
ckpt=(); sfx=
[ "${CKPT:-0}" = 1 ] && ckpt=(--ckpt) && sfx=-ckpt
for w0 in "$@"; do
  w=$w0$sfx
  OFFLOAD_TRACE=$work/$w OFFLOAD_TRACE_STEPS=${STEPS:-8} LD_PRELOAD=$root/.carry/bin/liboffload.so \
    timeout 600 python3 "$root/scripts/bench/budget.py" --workload "$w0" "${ckpt[@]}" --scale "${SCALE:-small}" --steps "${STEPS:-8}" \
    --sample-ms 0 --out "$work/$w.json" 2> "$work/$w.log" || { echo "$w failed:"; tail -5 "$work/$w.log"; continue; }
  step=$(ls "$work/$w"/step-*.trace | sed -n 7p)  # the seventh written: the allocator's pool is warm
  [ -n "$step" ] && cp "$step" "$out/traces/$w.trace" && echo "$w: $(basename "$step")"
done
