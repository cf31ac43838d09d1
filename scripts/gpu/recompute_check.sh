#!/usr/bin/env bash
# Recompute on the GPU:
#   scripts/gpu/recompute_check.sh [reference] [llama]
# the reference at half its peak (FRACS, e.g. "0.75 0.5") and the large Llama at 70% free memory (each part about 4
# minutes on the H200; both by default), each plain, under the cap, and under the cap with
# OFFLOAD_CAP_RECOMPUTE=1 (arm "rc") and with OFFLOAD_CAP_DROP_FIRST=16 as well ("rcdrop"); then
# every "recompute:" line the runs logged (which kernels write besides their output and whether
# that is kept, which cannot be launched again, which were banned or refused) in
# $OUT/recompute-lines.txt, and budget_report.py's tables. Env as budget.sh (STEPS, default 6).
# Needs .carry/bin from scripts/gpu/prepare.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
arms="rc:OFFLOAD_CAP_RECOMPUTE=1 rcdrop:OFFLOAD_CAP_RECOMPUTE=1,OFFLOAD_CAP_DROP_FIRST=16"
# RUN_TIMEOUT: a run that hangs (a launch made again waiting for ever) is cut short within the
# device's ten minutes a command.
export STEPS=${STEPS:-6} MANAGED_STEPS=0 CAP_ALSO="${CAP_ALSO:-$arms}" RUN_TIMEOUT=${RUN_TIMEOUT:-240}
[ $# -gt 0 ] || set -- reference llama
for part in "$@"; do
  case $part in
    reference) FRACS=${FRACS:-0.5} SCALE=large OUT=$out/reference "$root/scripts/gpu/budget.sh" fracs reference ;;
    llama) MARGIN=268435456 SCALE=large OUT=$out/llama "$root/scripts/gpu/budget.sh" fit hf_llama ;;
    *) echo "recompute_check.sh: no part $part (reference, llama)" >&2; exit 2 ;;
  esac
done
for part in "$@"; do
  for tgz in "$out/$part"/budget-*.tgz; do
    [ -f "$tgz" ] || continue
    d=$(mktemp -d)
    tar -C "$d" -xzf "$tgz"
    for log in "$d"/*.log; do
      grep -h "recompute:" "$log" | sed "s|^|$part/$(basename "$log" .log): |" >> "$out/recompute-lines.txt"
    done
    python3 "$root/scripts/bench/budget_report.py" "$d"/*.json > "$out/report-$part.md" 2>&1 || true
    rm -rf "$d"
  done
done
wc -l "$out/recompute-lines.txt" 2> /dev/null
