#!/usr/bin/env bash
# The hard-cap measurements in one command on the GPU machine, each part leaving its own archive
# under $OUT as soon as it ends (a run cut short keeps what finished):
#   scripts/gpu/budget_suite.sh fit           the three families at SCALE=large (budget.sh fit)
#   scripts/gpu/budget_suite.sh fracs W...    budget.sh fracs, one workload at a time
# Env as budget.sh; DEADLINE (seconds from the start) skips a part that would start after it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; start=$SECONDS; part=$1; shift
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
if [ "$part" = fit ]; then
  [ $# -gt 0 ] || set -- hf_llama resnet50 lstm
  OUT=$out/fit SCALE=large "$root/scripts/gpu/budget.sh" fit "$@"
  exit
fi
for w in "$@"; do
  if [ $((SECONDS - start)) -gt "${DEADLINE:-480}" ]; then echo "skipped $w: past the deadline"; continue; fi
  OUT=$out/$w "$root/scripts/gpu/budget.sh" fracs "$w"
done
