#!/usr/bin/env bash
# torch.profiler under the shim, on a GPU machine with PyTorch: the CUDA kernels it records in one
# step (scripts/bench/profiler_kernels.py) without the shim, with it, with its telemetry off, with
# OFFLOAD_DISABLE=1 and with a device budget. Every count must equal the first. nsys too, if present.
# Needs .carry/bin from scripts/gpu/prepare.sh. Leaves $OUT/profiler.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
lib=$root/.carry/bin/liboffload.so
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync OFFLOAD_DAEMON=off
# arm TAG [VAR=value...]: one profiled step with those variables; its JSON line.
arm() {
  local tag=$1; shift
  env "$@" timeout 300 python3 "$root/scripts/bench/profiler_kernels.py" 2> "$out/profiler-$tag.log" | tail -1
}
kernels() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['kernels'])" "$1" 2> /dev/null; }
base=$(arm plain)
echo "plain: $base" | tee "$out/profiler.txt"
ok=1
check() {
  local tag=$1 got; got=$(arm "$@")
  echo "$tag: $got" | tee -a "$out/profiler.txt"
  [ -n "$(kernels "$base")" ] && [ "$(kernels "$base")" = "$(kernels "$got")" ] || ok=0
}
check shim LD_PRELOAD="$lib"
check shim-telemetry-off LD_PRELOAD="$lib" OFFLOAD_TELEMETRY=off
check shim-disabled LD_PRELOAD="$lib" OFFLOAD_DISABLE=1
check shim-budget LD_PRELOAD="$lib" OFFLOAD_DEVICE_BUDGET=8GiB
if [ $ok = 1 ]; then echo "kernel counts: equal"; else echo "kernel counts: DIFFER"; fi | tee -a "$out/profiler.txt"
if command -v nsys > /dev/null; then
  LD_PRELOAD="$lib" nsys profile -o "$out/nsys-shim" --force-overwrite true python3 "$root/scripts/bench/profiler_kernels.py" \
    > "$out/nsys.log" 2>&1
  echo "nsys under the shim: status $?" | tee -a "$out/profiler.txt"
else
  echo "nsys: not on this machine" | tee -a "$out/profiler.txt"
fi
