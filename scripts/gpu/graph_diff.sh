#!/usr/bin/env bash
# A captured training step under the cap against plain, tensor by tensor (scripts/gpu/graph_diff.py):
# plain twice (the control), then liboffload without a budget, with an ample budget (BUDGET, 15 GiB:
# twice graphed_mlp's small peak), and with that budget for allocations of 64 MiB and up only.
# Extra arms: GRAPH_ARMS="tag:VAR=value,VAR=value ...". Needs .carry/bin from scripts/gpu/prepare.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
lib=$root/.carry/bin/liboffload.so
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONUNBUFFERED=1 OFFLOAD_DAEMON=off
probe() { timeout 300 python3 "$root/scripts/gpu/graph_diff.py" run "$out/$1.pt" > "$out/$1.log" 2>&1 || echo "$1 failed: $(tail -3 "$out/$1.log")"; }
probe plain
probe plain2
LD_PRELOAD=$lib probe observe
budget=${BUDGET:-15GiB}
OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=$lib probe cap
OFFLOAD_DEVICE_BUDGET=$budget OFFLOAD_CAP_MIN=64MiB LD_PRELOAD=$lib probe cap64m
for arm in ${GRAPH_ARMS:-}; do
  tag=${arm%%:*} vars=${arm#*:}
  (export ${vars//,/ }; OFFLOAD_DEVICE_BUDGET=$budget LD_PRELOAD=$lib probe "cap-$tag")
done
for r in plain2 observe cap cap64m $(for arm in ${GRAPH_ARMS:-}; do echo "cap-${arm%%:*}"; done); do
  [ -f "$out/$r.pt" ] || continue
  echo "== plain against $r"
  python3 "$root/scripts/gpu/graph_diff.py" diff "$out/plain.pt" "$out/$r.pt"
done 2>&1 | tee "$out/graph_diff.txt"

